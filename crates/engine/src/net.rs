//! Socket I/O on the calling reactor's io_uring: accept, receive, and vectored send of whole
//! replies (header and payload pieces in one sendmsg, no copy of read data; tried inline
//! first, through the ring when the socket is full).
//!
//! Every buffer and iovec the kernel points into is moved into the ring operation's slot, so
//! it stays alive until the completion even if the awaiting task is dropped.

use crate::buf::IoBuf;
use crate::reactor::{self, Local};
use io_uring::{opcode, types};
use std::io;
use std::ops::Range;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;

/// One piece of outgoing bytes.
pub enum OutPart {
    Bytes(Vec<u8>),
    Shared(Arc<IoBuf>, Range<usize>),
}

impl OutPart {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            OutPart::Bytes(v) => v,
            OutPart::Shared(b, r) => &b[r.clone()],
        }
    }

    /// Bytes this part sends.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn ring() -> io::Result<Rc<Local>> {
    reactor::local()
        .filter(|l| l.has_ring())
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "network I/O needs io_uring"))
}

fn cqe(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// Accepts one connection on a listening socket.
pub async fn accept(listener: RawFd) -> io::Result<OwnedFd> {
    let l = ring()?;
    let op = l.push(
        move |ud| {
            opcode::Accept::new(
                types::Fd(listener),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ud)
        },
        None,
    );
    let (res, _) = op.await;
    let fd = cqe(res)? as RawFd;
    // SAFETY: a successful accept CQE carries a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A buffer whose bytes stay where they are when the buffer value moves (its bytes are on the
/// heap), so the kernel may write into them after it moved into a ring operation's slot.
///
/// # Safety
/// `deref_mut` must return the same heap memory, of `len()` bytes, however the value is
/// moved, until dropped; and the value must own that memory exclusively (nothing else reads
/// or writes it while the kernel does).
pub unsafe trait StableBuf: std::ops::DerefMut<Target = [u8]> + 'static {}

// SAFETY: a Vec's bytes are one heap block that moving the Vec does not move.
unsafe impl StableBuf for Vec<u8> {}
// SAFETY: an IoBuf owns one heap allocation (buf.rs) that moving it does not move.
unsafe impl StableBuf for IoBuf {}

/// Receives into `buf[start..]` (up to its length). Returns the byte count (0 = peer closed)
/// and the buffer: a `Vec` or an aligned `IoBuf` (write payloads, received where the member
/// writes will take them from).
pub async fn recv<B: StableBuf>(fd: RawFd, buf: B, start: usize) -> (io::Result<usize>, B) {
    recv_bulk(fd, buf, start, false).await
}

/// `recv`, as part of a large transfer the peer is known to be sending (the rest of a write
/// payload) when `bulk`: its completion alone is then no reason for the reactor to busy-poll
/// in its next idle turn (`reactor::Local::mark_bulk`).
pub async fn recv_bulk<B: StableBuf>(
    fd: RawFd,
    mut buf: B,
    start: usize,
    bulk: bool,
) -> (io::Result<usize>, B) {
    let l = match ring() {
        Ok(l) => l,
        Err(e) => return (Err(e), buf),
    };
    let end = buf.len();
    let start = start.min(end);
    let len = (end - start) as u32;
    // SAFETY: start <= buf.len(); the pointer stays valid because the buffer (a Vec or an
    // IoBuf, whose heap block does not move with it) is moved into the op slot until the
    // completion.
    let ptr = unsafe { buf.as_mut_ptr().add(start) };
    let op = l.push_keep(
        move |ud| {
            opcode::Recv::new(types::Fd(fd), ptr, len)
                .build()
                .user_data(ud)
        },
        None,
        Some(Box::new(buf)),
    );
    if bulk {
        l.mark_bulk(&op);
    }
    let (res, keep) = op.with_keep().await;
    let buf = *keep
        .and_then(|k| k.downcast::<B>().ok())
        .expect("recv op keeps its buffer");
    (cqe(res), buf)
}

/// What a sendmsg points into.
struct SendState {
    parts: Vec<OutPart>,
    iov: Vec<libc::iovec>,
    msg: libc::msghdr,
}

/// Sends every byte of `parts`, in order, with as few sendmsg calls as the socket allows.
pub async fn send_all(fd: RawFd, parts: Vec<OutPart>) -> io::Result<()> {
    send_all_back(fd, parts).await.0
}

/// `send_all`, handing the parts back (so their buffers can be used again).
pub async fn send_all_back(fd: RawFd, parts: Vec<OutPart>) -> (io::Result<()>, Vec<OutPart>) {
    let l = match ring() {
        Ok(l) => l,
        Err(e) => return (Err(e), parts),
    };
    let total: usize = parts.iter().map(|p| p.as_slice().len()).sum();
    let mut st = Box::new(SendState {
        parts,
        iov: Vec::new(),
        // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
        msg: unsafe { std::mem::zeroed() },
    });
    let mut sent = 0usize;
    let mut first = true;
    while sent < total {
        // Rebuild the iovecs from the first unsent byte (at most IOV_MAX per call).
        st.iov.clear();
        let mut skip = sent;
        for p in &st.parts {
            let s = p.as_slice();
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            st.iov.push(libc::iovec {
                iov_base: s[skip..].as_ptr() as *mut libc::c_void,
                iov_len: s.len() - skip,
            });
            skip = 0;
            if st.iov.len() == 1024 {
                break;
            }
        }
        st.msg.msg_iov = st.iov.as_mut_ptr();
        st.msg.msg_iovlen = st.iov.len();
        let msg_ptr = &st.msg as *const libc::msghdr;
        if first {
            // First try the send inline: a socket with room takes the whole reply now, and
            // the reactor's next io_uring_enter is only the one that waits for the next
            // request. A full socket (EAGAIN) or a short send goes through the ring.
            first = false;
            // SAFETY: msg points at iovecs over `st.parts`, all alive for this call.
            let n = unsafe { libc::sendmsg(fd, msg_ptr, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
            if n >= 0 {
                sent += n as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EAGAIN) {
                return (Err(e), st.parts);
            }
        }
        let op = l.push_keep(
            move |ud| {
                opcode::SendMsg::new(types::Fd(fd), msg_ptr)
                    .flags(libc::MSG_NOSIGNAL as u32)
                    .build()
                    .user_data(ud)
            },
            None,
            Some(st),
        );
        let (res, keep) = op.with_keep().await;
        st = keep
            .and_then(|k| k.downcast::<SendState>().ok())
            .expect("send op keeps its state");
        let n = match cqe(res) {
            Ok(0) => {
                let e = io::Error::new(io::ErrorKind::WriteZero, "socket closed");
                return (Err(e), st.parts);
            }
            Ok(n) => n,
            Err(e) => return (Err(e), st.parts),
        };
        sent += n;
    }
    (Ok(()), st.parts)
}
