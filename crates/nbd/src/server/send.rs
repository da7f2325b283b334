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
                    let batch: Vec<OutPart> = c.queue.borrow_mut().drain(..).collect();
                    if c.broken.get() {
                        break;
                    }
                    let n: usize = batch.iter().map(OutPart::len).sum();
                    let batch = match &c.tls {
                        None => batch,
                        Some(t) => match t.seal(&batch) {
                            Ok(ct) if ct.is_empty() => Vec::new(),
                            Ok(ct) => vec![OutPart::Bytes(ct)],
                            Err(e) => {
                                tracing::debug!("{e}");
                                c.broken.set(true);
                                c.queue.borrow_mut().clear();
                                c.queued.set(0);
                                break;
                            }
                        },
                    };
                    if batch.is_empty() {
                        break;
                    }
                    if let Err(e) = net::send_all(c.fd, batch).await {
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
