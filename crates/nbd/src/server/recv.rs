//! The receive side of a connection: a buffered reader over the socket (handshake
//! options, request headers) that hands write payloads over in aligned buffers.

use std::io;
use std::os::fd::RawFd;
use uraid_engine::net;
use uraid_engine::{buf, IoBuf};

/// Receive buffer per connection.
const RECV_BUF: usize = 256 << 10;

/// Buffered reader over a socket.
pub(super) struct Reader {
    pub(super) fd: RawFd,
    buf: Option<Vec<u8>>,
    start: usize,
    end: usize,
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "client closed the connection")
}

impl Reader {
    pub(super) fn new(fd: RawFd) -> Reader {
        Reader {
            fd,
            buf: Some(vec![0u8; RECV_BUF]),
            start: 0,
            end: 0,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Receives at least once more into the free tail (compacting first).
    async fn fill(&mut self) -> io::Result<()> {
        let mut buf = self.buf.take().expect("reader buffer present");
        if self.start > 0 {
            buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let (r, buf) = net::recv(self.fd, buf, self.end).await;
        self.buf = Some(buf);
        match r? {
            0 => Err(eof()),
            n => {
                self.end += n;
                Ok(())
            }
        }
    }

    /// The next `n` bytes (n <= RECV_BUF).
    pub(super) async fn exact(&mut self, n: usize) -> io::Result<&[u8]> {
        while self.buffered() < n {
            self.fill().await?;
        }
        let s = self.start;
        self.start += n;
        let b = self.buf.as_ref().expect("reader buffer present");
        Ok(&b[s..s + n])
    }

    /// The next `n` bytes (payloads of any size up to MAX_PAYLOAD) in an aligned buffer that
    /// the array writes to the members as it is (no zeroing, no copy after the receive).
    pub(super) async fn take_buf(&mut self, n: usize) -> io::Result<IoBuf> {
        let have = self.buffered().min(n);
        let mut v = buf::alloc(n);
        {
            let b = self.buf.as_ref().expect("reader buffer present");
            v[..have].copy_from_slice(&b[self.start..self.start + have]);
        }
        self.start += have;
        let mut got = have;
        while got < n {
            let (r, back) = net::recv(self.fd, v, got).await;
            v = back;
            match r? {
                0 => return Err(eof()),
                k => got += k,
            }
        }
        Ok(v)
    }

    /// Reads and drops `n` bytes without holding more than the receive buffer.
    pub(super) async fn skip(&mut self, mut n: usize) -> io::Result<()> {
        while n > 0 {
            if self.buffered() == 0 {
                self.fill().await?;
            }
            let k = self.buffered().min(n);
            self.start += k;
            n -= k;
        }
        Ok(())
    }
}
