//! The send side of a connection: its reply queue (whoever finds the socket idle sends
//! everything queued in one sendmsg), the reader's accounting of what is in flight, and
//! the replies themselves. On a TLS connection the sender seals each batch into records
//! and sends the ciphertext.

use super::handshake::Session;
use super::tlslink::TlsLink;
use super::{op_index, Inner, ServerStats};
use crate::proto::{self, Errno, Request};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Poll, Waker};
use uraid_engine::net::{self, OutPart};
use uraid_engine::reactor;
use uraid_engine::{ArrayError, BlockDev};

/// Per-connection reply queue and the reader's accounting.
pub(super) struct Conn {
    fd: RawFd,
    queue: RefCell<VecDeque<OutPart>>,
    /// A sender task is draining `queue`.
    pub(super) sending: Cell<bool>,
    /// A send failed: nothing more is sent, the reader stops.
    pub(super) broken: Cell<bool>,
    /// Requests taken off the socket and not yet answered.
    pub(super) inflight: Cell<usize>,
    /// Payload bytes of the requests in flight (write data held, read data requested).
    pub(super) payload: Cell<usize>,
    /// Reply bytes queued or in the sendmsg under way.
    pub(super) queued: Cell<usize>,
    stats: Arc<ServerStats>,
    /// The reader (waiting for room) or the closer (waiting for the end).
    waiter: RefCell<Option<Waker>>,
    tls: Option<Rc<TlsLink>>,
}

impl Conn {
    pub(super) fn new(fd: RawFd, stats: Arc<ServerStats>, tls: Option<Rc<TlsLink>>) -> Conn {
        Conn {
            tls,
            fd,
            queue: RefCell::new(VecDeque::new()),
            sending: Cell::new(false),
            broken: Cell::new(false),
            inflight: Cell::new(0),
            payload: Cell::new(0),
            queued: Cell::new(0),
            stats,
            waiter: RefCell::new(None),
        }
    }

    pub(super) fn wake(&self) {
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    pub(super) fn add_payload(&self, n: usize) {
        let p = self.payload.get() + n;
        self.payload.set(p);
        self.stats
            .payload_high_water
            .fetch_max(p as u64, Ordering::Relaxed);
    }

    /// Sends what the TLS session has waiting (its answer to a key update), if the sender
    /// is not about to.
    pub(super) fn kick(self: &Rc<Self>) {
        self.send(Vec::new());
    }

    /// Queues one whole reply; starts a sender if the socket is idle.
    pub(super) fn send(self: &Rc<Self>, parts: Vec<OutPart>) {
        if self.broken.get() {
            return;
        }
        let bytes: usize = parts.iter().map(OutPart::len).sum();
        let q = self.queued.get() + bytes;
        self.queued.set(q);
        self.stats
            .reply_queue_high_water
            .fetch_max(q as u64, Ordering::Relaxed);
        self.queue.borrow_mut().extend(parts);
        if !self.sending.get() {
            self.sending.set(true);
            let c = self.clone();
            reactor::spawn_local(async move {
                loop {
                    if c.broken.get() {
                        break;
                    }
                    let batch: Vec<OutPart> = c.queue.borrow_mut().drain(..).collect();
                    let n: usize = batch.iter().map(OutPart::len).sum();
                    let sent = match &c.tls {
                        None if batch.is_empty() => break,
                        None => net::send_all(c.fd, batch).await,
                        Some(t) => match send_sealed(c.fd, t, batch).await {
                            // Nothing queued and nothing the session had to send.
                            Ok(false) => break,
                            Ok(true) => Ok(()),
                            Err(e) => Err(e),
                        },
                    };
                    if let Err(e) = sent {
                        tracing::debug!("send failed: {e}");
                        c.broken.set(true);
                        c.queue.borrow_mut().clear();
                        c.queued.set(0);
                        break;
                    }
                    c.queued.set(c.queued.get() - n);
                    // The reader may be waiting for the queue to shrink.
                    c.wake();
                }
                c.sending.set(false);
                c.wake();
            });
        }
    }

    pub(super) async fn wait_until(&self, cond: impl Fn(&Conn) -> bool) {
        std::future::poll_fn(|cx| {
            if cond(self) {
                Poll::Ready(())
            } else {
                *self.waiter.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// Plaintext sealed at a time on a TLS connection: its ciphertext is what the connection holds
/// beyond the replies themselves (a batch may be tens of MiB of reads), and the next piece is
/// sealed while the client drains this one (a Unix socket holds about 200 KiB: with 1 MiB
/// pieces sealing and sending took turns, 0.9 GB/s of 1M reads against 1.2–1.3 here).
const SEAL_PIECE: usize = 128 << 10;

/// `parts` cut into pieces of at most `max` bytes, in order: read data by range (no copy),
/// a byte part moved whole when it fits, else copied piece by piece (each byte once).
fn pieces(parts: Vec<OutPart>, max: usize) -> Vec<Vec<OutPart>> {
    let mut out = vec![Vec::new()];
    let mut room = max;
    for p in parts {
        let len = p.len();
        if len <= room {
            room -= len;
            out.last_mut().expect("a piece").push(p);
            continue;
        }
        let mut at = 0;
        while at < len {
            if room == 0 {
                out.push(Vec::new());
                room = max;
            }
            let n = room.min(len - at);
            let piece = match &p {
                OutPart::Bytes(v) => OutPart::Bytes(v[at..at + n].to_vec()),
                OutPart::Shared(b, r) => OutPart::Shared(b.clone(), r.start + at..r.start + at + n),
            };
            out.last_mut().expect("a piece").push(piece);
            room -= n;
            at += n;
        }
    }
    out
}

/// Seals `batch` piece by piece and sends each piece's records (and whatever the session
/// had to send: with an empty batch, only that). False if there was nothing to send.
async fn send_sealed(fd: RawFd, t: &TlsLink, batch: Vec<OutPart>) -> io::Result<bool> {
    let mut sent = false;
    let groups = if batch.is_empty() {
        vec![Vec::new()]
    } else {
        pieces(batch, SEAL_PIECE)
    };
    for piece in groups {
        let ct = t.seal(&piece)?;
        // The plaintext (read buffers) goes before the wait for the socket.
        drop(piece);
        if ct.is_empty() {
            t.give_back(ct);
            continue;
        }
        let (r, back) = net::send_all_back(fd, vec![OutPart::Bytes(ct)]).await;
        r?;
        if let Some(OutPart::Bytes(v)) = back.into_iter().next() {
            t.give_back(v);
        }
        sent = true;
    }
    Ok(sent)
}

/// Sends bytes during the handshake (nothing else is in flight then).
pub(super) async fn send_now(fd: RawFd, v: Vec<u8>) -> io::Result<()> {
    net::send_all(fd, vec![OutPart::Bytes(v)]).await
}

/// The NBD error for an array error.
pub(super) fn errno_of(e: &ArrayError) -> Errno {
    match e {
        ArrayError::OutOfRange { .. } | ArrayError::Misaligned { .. } => Errno::Inval,
        ArrayError::Failed { .. } | ArrayError::Unreadable { .. } | ArrayError::Refused(_) => {
            Errno::Io
        }
        ArrayError::Shutdown => Errno::Shutdown,
    }
}

/// Error reply: structured for commands that negotiated it (READ, BLOCK_STATUS), else simple.
pub(super) fn reply_error<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: &Request,
    err: Errno,
    msg: &str,
) {
    inner.stats.errors.fetch_add(1, Ordering::Relaxed);
    if let Some(i) = op_index(req.typ) {
        inner.stats.ops[i]
            .local()
            .errors
            .fetch_add(1, Ordering::Relaxed);
    }
    tracing::debug!(
        "request type {} at {} len {}: {:?} ({msg})",
        req.typ,
        req.offset,
        req.length,
        err
    );
    // Extended headers: never a simple reply.
    let structured = sess.extended
        || sess.structured && matches!(req.typ, proto::CMD_READ | proto::CMD_BLOCK_STATUS);
    if structured {
        conn.send(vec![OutPart::Bytes(proto::error_chunk(
            &proto::ReplyTo::of(req, sess.extended),
            err,
            msg,
        ))]);
    } else {
        conn.send(vec![OutPart::Bytes(
            proto::simple_reply(err as u32, req.handle).to_vec(),
        )]);
    }
}

/// The reply of a request that succeeded with no data: simple, or with extended headers
/// a done chunk.
pub(super) fn reply_ok(sess: &Session, conn: &Rc<Conn>, req: &Request) {
    let v = if sess.extended {
        proto::done_chunk(&proto::ReplyTo::of(req, true))
    } else {
        proto::simple_reply(0, req.handle).to_vec()
    };
    conn.send(vec![OutPart::Bytes(v)]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use uraid_engine::buf;

    #[test]
    fn pieces_keep_every_byte_in_order_within_the_bound() {
        let mut big = buf::alloc(3000);
        for (i, b) in big.iter_mut().enumerate() {
            *b = i as u8;
        }
        let big = Arc::new(big);
        let parts = [
            OutPart::Bytes(vec![1; 10]),
            OutPart::Shared(big.clone(), 5..2505),
            OutPart::Bytes((0..700u32).map(|i| i as u8).collect()),
            OutPart::Shared(big.clone(), 0..1),
        ];
        let want: Vec<u8> = parts.iter().flat_map(|p| p.as_slice().to_vec()).collect();
        for max in [1, 7, 1000, 4096] {
            let ps = pieces(
                parts
                    .iter()
                    .map(|p| match p {
                        OutPart::Bytes(v) => OutPart::Bytes(v.clone()),
                        OutPart::Shared(b, r) => OutPart::Shared(b.clone(), r.clone()),
                    })
                    .collect(),
                max,
            );
            let got: Vec<u8> = ps
                .iter()
                .flat_map(|g| g.iter().flat_map(|p| p.as_slice().to_vec()))
                .collect();
            assert_eq!(got, want, "max {max}");
            assert!(ps
                .iter()
                .all(|g| g.iter().map(OutPart::len).sum::<usize>() <= max));
            assert_eq!(ps.len(), want.len().div_ceil(max), "max {max}");
        }
    }
}
