//! The receive side of a connection: a buffered reader over the socket (handshake
//! options, request headers) that hands write payloads over in aligned buffers. After
//! STARTTLS it reads through the connection's TLS session: ciphertext is received into its
//! own buffer and fed to the session, and plaintext is copied out where plaintext would
//! have been received.

use super::send::Conn;
use super::tlslink::TlsLink;
use crate::tls::Plain;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use uraid_engine::net::{self, OutPart};
use uraid_engine::{buf, IoBuf};

/// Receive buffer per connection.
const RECV_BUF: usize = 256 << 10;
/// Ciphertext receive buffer of a TLS connection (a few records)...
const TLS_RECV_BUF: usize = 64 << 10;
/// ...grown to this once it receives a large write payload (kept for the connection): the
/// receives between payloads take whatever the client has queued.
const TLS_RECV_BUF_LARGE: usize = 1 << 20;
/// What a TLS session may hold back of the payload: the plaintext of one partial record
/// (at most 16 KiB), rounded up.
const RECORD_SLACK: usize = 20 << 10;
/// The rest of a write payload from this size on is received as a bulk transfer
/// (`net::recv_bulk`: its arrival is no reason for the reactor to busy-poll). Compared with
/// the plaintext still to come (`take_buf`), or with that less `RECORD_SLACK` (TLS).
const BULK_MIN: usize = 32 << 10;

/// Buffered reader over a socket.
pub(super) struct Reader {
    pub(super) fd: RawFd,
    buf: Option<Vec<u8>>,
    start: usize,
    end: usize,
    tls: Option<Tls>,
}

/// A TLS connection's ciphertext buffer (received, not yet fed) and session.
struct Tls {
    link: Rc<TlsLink>,
    /// In transmission: the reply sender, started when the client's records ask for an
    /// answer (a key update) and nothing is being sent.
    conn: Option<Rc<Conn>>,
    ct: Option<Vec<u8>>,
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
            tls: None,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Drops what is buffered (plaintext sent after STARTTLS, before the reply); returns
    /// how many bytes that was.
    pub(super) fn discard_buffered(&mut self) -> usize {
        let n = self.buffered();
        self.start = 0;
        self.end = 0;
        n
    }

    /// From now on, reads go through `link` (after STARTTLS's reply).
    pub(super) fn start_tls(&mut self, link: Rc<TlsLink>) {
        self.tls = Some(Tls {
            link,
            conn: None,
            ct: Some(vec![0u8; TLS_RECV_BUF]),
            start: 0,
            end: 0,
        });
    }

    /// Sends a handshake reply (sealed once TLS is on; nothing else sends then).
    pub(super) async fn send(&self, v: Vec<u8>) -> io::Result<()> {
        let v = match &self.tls {
            Some(t) => t.link.seal(&[OutPart::Bytes(v)])?,
            None => v,
        };
        super::send::send_now(self.fd, v).await
    }

    /// Transmission starts: what the session has to send goes through `conn`'s sender.
    pub(super) fn set_conn(&mut self, conn: Rc<Conn>) {
        if let Some(t) = self.tls.as_mut() {
            t.conn = Some(conn);
        }
    }

    pub(super) fn tls(&self) -> Option<&Rc<TlsLink>> {
        self.tls.as_ref().map(|t| &t.link)
    }

    /// Feeds the session more ciphertext (received now if none is waiting). `need`:
    /// plaintext bytes the caller knows the client is sending (the rest of a write's
    /// payload; 0 when unknown): when that much ciphertext, less what the session may hold
    /// of a partial record, is at least `BULK_MIN`, the receive is a bulk one (and the
    /// buffer grown to take a large part of it at once).
    async fn feed_tls(fd: RawFd, t: &mut Tls, need: usize) -> io::Result<()> {
        if t.start == t.end {
            let mut ct = t.ct.take().expect("ciphertext buffer present");
            let sure = need.saturating_sub(RECORD_SLACK);
            if sure > ct.len() && ct.len() < TLS_RECV_BUF_LARGE {
                ct = vec![0u8; TLS_RECV_BUF_LARGE];
            }
            // Whatever has arrived, opened at once: waiting for more (MSG_WAITALL) let the
            // client's socket buffer fill (a Unix socket holds a few records) and the two
            // sides took turns instead of overlapping.
            let (r, ct) = net::recv_bulk(fd, ct, 0, sure >= BULK_MIN).await;
            t.ct = Some(ct);
            t.start = 0;
            t.end = match r? {
                0 => return Err(eof()),
                n => n,
            };
        }
        let ct = t.ct.as_ref().expect("ciphertext buffer present");
        let n = t.link.feed(&ct[t.start..t.end])?;
        t.start += n;
        if let Some(c) = &t.conn {
            if !c.sending.get() && t.link.wants_write() {
                c.kick();
            }
        }
        Ok(())
    }

    /// Decrypted bytes into `out` (non-empty): at least one, receiving as needed. `need`:
    /// as for `feed_tls`.
    async fn pull_tls(fd: RawFd, t: &mut Tls, out: &mut [u8], need: usize) -> io::Result<usize> {
        loop {
            match t.link.read(out)? {
                Plain::Data(n) => return Ok(n),
                Plain::Closed => return Err(eof()),
                Plain::NeedMore => Self::feed_tls(fd, t, need).await?,
            }
        }
    }

    /// Drives a server-side TLS handshake to its end: sends what the session has to send,
    /// feeds it what the client sends. On an error, the session's alert is sent first.
    pub(super) async fn tls_handshake(&mut self) -> io::Result<()> {
        let fd = self.fd;
        let t = self.tls.as_mut().expect("start_tls first");
        loop {
            let out = t.link.take_output();
            if !out.is_empty() {
                super::send::send_now(fd, out).await?;
            }
            if !t.link.handshaking() {
                return Ok(());
            }
            if let Err(e) = Self::feed_tls(fd, t, 0).await {
                let alert = t.link.take_output();
                if !alert.is_empty() {
                    let _ = super::send::send_now(fd, alert).await;
                }
                return Err(e);
            }
        }
    }

    /// Receives at least once more into the free tail (compacting first).
    async fn fill(&mut self) -> io::Result<()> {
        let mut buf = self.buf.take().expect("reader buffer present");
        if self.start > 0 {
            buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let (r, buf) = match self.tls.as_mut() {
            Some(t) => (
                Self::pull_tls(self.fd, t, &mut buf[self.end..], 0).await,
                buf,
            ),
            None => net::recv(self.fd, buf, self.end).await,
        };
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
            if let Some(t) = self.tls.as_mut() {
                let need = n - got;
                got += Self::pull_tls(self.fd, t, &mut v[got..], need).await?;
                continue;
            }
            let (r, back) = net::recv_bulk(self.fd, v, got, n - got >= BULK_MIN).await;
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
