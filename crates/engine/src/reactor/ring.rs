//! Ring operations: pushing a submission (and getting room in a full ring), reaping
//! completions, the futures that wait for them (`RingOp`), member I/O, and busy-polling
//! the completion queue.

use super::{local, Local, Shared};
use crate::buf::IoBuf;
use io_uring::{opcode, types, IoUring};
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

/// The user data of the eventfd read (the cross-thread wake-up) on the ring.
pub(super) const EVENTFD_TOKEN: u64 = u64::MAX;

/// An in-flight ring operation. The buffer lives here, not in the future, so that a dropped
/// future can never let the kernel write into freed memory.
pub(super) struct OpSlot {
    result: Option<i32>,
    waker: Option<Waker>,
    buf: Option<IoBuf>,
    /// Anything else the kernel points into (socket buffers, iovec arrays, msghdr).
    keep: Option<Box<dyn std::any::Any>>,
    orphaned: bool,
    /// A timer (`timer::sleep`): orphaned, it is no device's I/O left behind, and it
    /// completes by itself.
    timer: bool,
    /// See `Local::mark_bulk`.
    bulk: bool,
}

impl Local {
    pub(crate) fn has_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// Queues one SQE; the returned future resolves with the CQE result and the buffer.
    pub(crate) fn push(
        &self,
        build: impl FnOnce(u64) -> io_uring::squeue::Entry,
        buf: Option<IoBuf>,
    ) -> RingOp {
        self.push_keep(build, buf, None)
    }

    /// Like `push`, also holding `keep` (memory the SQE points into) until the completion.
    pub(crate) fn push_keep(
        &self,
        build: impl FnOnce(u64) -> io_uring::squeue::Entry,
        buf: Option<IoBuf>,
        keep: Option<Box<dyn std::any::Any>>,
    ) -> RingOp {
        self.push_op(build, buf, keep, false)
    }

    /// Queues a timer's SQE (`timer::sleep`), the timespec it points to kept until the
    /// completion.
    pub(super) fn push_timer(
        &self,
        build: impl FnOnce(u64) -> io_uring::squeue::Entry,
        keep: Box<dyn std::any::Any>,
    ) -> RingOp {
        self.push_op(build, None, Some(keep), true)
    }

    fn push_op(
        &self,
        build: impl FnOnce(u64) -> io_uring::squeue::Entry,
        buf: Option<IoBuf>,
        keep: Option<Box<dyn std::any::Any>>,
        timer: bool,
    ) -> RingOp {
        let ring = self.ring.as_ref().expect("push needs a ring");
        let id = self.ops.borrow_mut().insert(OpSlot {
            result: None,
            waker: None,
            buf,
            keep,
            orphaned: false,
            timer,
            bulk: false,
        });
        let sqe = build(id as u64);
        let mut ring = ring.borrow_mut();
        let mut backoff = std::time::Duration::from_micros(50);
        let mut warned = false;
        loop {
            // SAFETY: every pointer in the SQE refers to a buffer now owned by ops[id] (heap
            // memory that does not move when the slot moves) or to an fd the caller keeps open
            // until the completion; the slot is only freed after its CQE arrives.
            if unsafe { ring.submission().push(&sqe) }.is_ok() {
                break;
            }
            // Submission queue full: hand what we have to the kernel.
            self.shared.count_enter();
            let submitted = submit(&mut ring);
            if !ring.submission().is_full() {
                continue;
            }
            // The kernel took nothing. It refuses new work while completions it could not
            // post are backlogged (EBUSY) or while it is short of memory (EAGAIN), so reap
            // what the completion queue holds (that makes room for the backlog) and retry.
            if self.reap(&mut ring) > 0 {
                continue;
            }
            // Nothing to reap either: back off instead of spinning on the syscall.
            if !warned {
                warned = true;
                tracing::warn!(
                    "io_uring submission queue full and not draining ({:?}); retrying",
                    submitted.err()
                );
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(std::time::Duration::from_millis(10));
        }
        self.inflight.set(self.inflight.get() + 1);
        RingOp { id }
    }

    /// Marks `op` as the rest of a bulk transfer (a large write payload still arriving):
    /// an idle turn that ends in its completion, and nothing else's, is no reason to
    /// busy-poll in the next one (`turn::IdlePolicy`). The peer sends it at its own pace and
    /// nothing is answered until the whole of it is in, so a spin would save one wake-up in
    /// a transfer that takes many, at the price of a core spinning between its segments
    /// (with a 1 MiB TLS write stream: about a third more server CPU per byte, for the same
    /// rate).
    pub(crate) fn mark_bulk(&self, op: &RingOp) {
        if let Some(slot) = self.ops.borrow_mut().get_mut(op.id) {
            slot.bulk = true;
        }
    }

    /// Forgets what completed so far (an idle turn begins).
    pub(super) fn clear_done(&self) {
        self.done_bulk.set(false);
        self.done_other.set(false);
    }

    /// Whether what completed since `clear_done` was bulk ops only (at least one).
    pub(super) fn done_bulk_only(&self) -> bool {
        self.done_bulk.get() && !self.done_other.get()
    }

    /// Handles every completion the completion queue holds (the run loop after each
    /// `io_uring_enter` and idle turn, `run_ready` between passes, and `push_op` when a full
    /// ring needs room). Returns the count.
    pub(super) fn reap(&self, ring: &mut IoUring) -> usize {
        let mut n = 0;
        for cqe in ring.completion() {
            n += 1;
            if cqe.user_data() == EVENTFD_TOKEN {
                self.done_other.set(true);
                self.efd_armed.set(false);
                self.shared.notified.store(false, Ordering::Release);
            } else {
                // Wakers only queue tasks (nothing here re-enters the ring).
                self.complete(cqe.user_data() as usize, cqe.result());
            }
        }
        n
    }

    fn complete(&self, id: usize, res: i32) {
        let mut ops = self.ops.borrow_mut();
        let Some(slot) = ops.get_mut(id) else { return };
        self.inflight.set(self.inflight.get() - 1);
        if slot.bulk {
            self.done_bulk.set(true);
        } else {
            self.done_other.set(true);
        }
        if slot.orphaned {
            self.orphans.set(self.orphans.get() - 1);
            if slot.timer {
                self.timer_orphans.set(self.timer_orphans.get() - 1);
            }
            ops.remove(id);
            return;
        }
        slot.result = Some(res);
        if let Some(w) = slot.waker.take() {
            drop(ops);
            w.wake();
        }
    }
}

/// `io_uring_enter` for everything queued, without waiting.
pub(super) fn submit(ring: &mut IoUring) -> io::Result<usize> {
    submit_and_wait(ring, 0)
}

/// `io_uring_enter` for everything queued, waiting for `want` completions. In unit tests a
/// reactor thread can make it act like kernels that refuse submissions with EBUSY while the
/// completion queue is full (the condition `push_keep` must get out of by reaping).
pub(super) fn submit_and_wait(ring: &mut IoUring, want: usize) -> io::Result<usize> {
    #[cfg(test)]
    if super::tests::REFUSE_WHEN_CQ_FULL.with(|r| r.get()) && ring.completion().is_full() {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    ring.submit_and_wait(want)
}

/// Spins until a completion is posted (a member I/O, a socket receive, or the eventfd read
/// another thread's wake-up completes; stopping the runtime is one), the thread's ready or
/// job queue fills, or `budget_ns` passes. Completions reach the queue without this thread
/// entering the kernel: the ring is set up without COOP_TASKRUN, so the kernel interrupts the
/// spinning thread to run its task work. Returns whether work arrived.
pub(super) fn busy_poll(ring: &mut IoUring, shared: &Shared, budget_ns: u64) -> bool {
    let t0 = std::time::Instant::now();
    let budget = std::time::Duration::from_nanos(budget_ns);
    let mut n = 0u32;
    loop {
        if !ring.completion().is_empty() {
            return true;
        }
        n = n.wrapping_add(1);
        // The ready queue is filled by this thread only while it runs tasks, and by other
        // threads together with the eventfd, whose completion the check above sees; the
        // lock is looked at now and then in case the eventfd write was skipped.
        if n.is_multiple_of(64) {
            // (The stop flag needs no check: stopping notifies through the eventfd.)
            if shared.has_work() {
                return true;
            }
            if t0.elapsed() >= budget {
                return false;
            }
        }
        std::hint::spin_loop();
    }
}

/// A submitted ring operation.
pub(crate) struct RingOp {
    id: usize,
}

impl RingOp {
    /// Waits for the completion and also returns what was kept alive for the kernel.
    pub(crate) async fn with_keep(mut self) -> (i32, Option<Box<dyn std::any::Any>>) {
        std::future::poll_fn(|cx| {
            let l = local().expect("RingOp polled off its reactor");
            let mut ops = l.ops.borrow_mut();
            let slot = ops
                .get_mut(self.id)
                .expect("RingOp slot exists until taken");
            if let Some(res) = slot.result {
                let slot = ops.remove(self.id);
                self.id = usize::MAX;
                Poll::Ready((res, slot.keep))
            } else {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

impl Future for RingOp {
    type Output = (i32, Option<IoBuf>);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let l = local().expect("RingOp polled off its reactor");
        let mut ops = l.ops.borrow_mut();
        let slot = ops
            .get_mut(self.id)
            .expect("RingOp slot exists until taken");
        if let Some(res) = slot.result {
            let slot = ops.remove(self.id);
            // Mark as taken so Drop does not touch the slab again.
            drop(ops);
            let this = self.get_mut();
            this.id = usize::MAX;
            Poll::Ready((res, slot.buf))
        } else {
            slot.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

impl Drop for RingOp {
    fn drop(&mut self) {
        if self.id == usize::MAX {
            return;
        }
        if let Some(l) = local() {
            let mut ops = l.ops.borrow_mut();
            if let Some(slot) = ops.get_mut(self.id) {
                if slot.result.is_some() {
                    ops.remove(self.id);
                } else {
                    // The kernel still owns the buffer; free it when the CQE arrives.
                    slot.orphaned = true;
                    l.orphans.set(l.orphans.get() + 1);
                    if slot.timer {
                        l.timer_orphans.set(l.timer_orphans.get() + 1);
                    }
                }
            }
        }
    }
}

/// Submission flags for member I/O: `punt` sends it straight to the ring's io-wq workers
/// (IOSQE_ASYNC), for files whose filesystem may block the submitting thread instead of
/// answering a non-blocking attempt (FUSE, network filesystems): a hung device there must
/// stall its worker, never the reactor.
fn member_flags(punt: bool) -> io_uring::squeue::Flags {
    if punt {
        io_uring::squeue::Flags::ASYNC
    } else {
        io_uring::squeue::Flags::empty()
    }
}

pub(crate) fn ring_read(l: &Local, fd: RawFd, off: u64, mut buf: IoBuf, punt: bool) -> RingOp {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len() as u32);
    l.push(
        move |ud| {
            opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(off)
                .build()
                .flags(member_flags(punt))
                .user_data(ud)
        },
        Some(buf),
    )
}

pub(crate) fn ring_write(l: &Local, fd: RawFd, off: u64, buf: IoBuf, punt: bool) -> RingOp {
    let (ptr, len) = (buf.as_ptr(), buf.len() as u32);
    l.push(
        move |ud| {
            opcode::Write::new(types::Fd(fd), ptr, len)
                .offset(off)
                .build()
                .flags(member_flags(punt))
                .user_data(ud)
        },
        Some(buf),
    )
}

/// What a gather write points into: the pieces and their iovecs, kept in the op's slot
/// until the completion.
struct WritevState {
    _segs: crate::buf::Segments,
    iov: Vec<libc::iovec>,
}

/// A gather write of `segs` at `off` (one Writev; at most IOV_MAX pieces, which the array's
/// runs never exceed — more are rejected by the kernel with EINVAL, an I/O error).
pub(crate) fn ring_writev(
    l: &Local,
    fd: RawFd,
    off: u64,
    segs: crate::buf::Segments,
    punt: bool,
) -> RingOp {
    let iov: Vec<libc::iovec> = segs
        .iter()
        .map(|s| libc::iovec {
            iov_base: s.as_ptr() as *mut libc::c_void,
            iov_len: s.len(),
        })
        .collect();
    let st = Box::new(WritevState { _segs: segs, iov });
    let (ptr, n) = (st.iov.as_ptr(), st.iov.len() as u32);
    l.push_keep(
        move |ud| {
            opcode::Writev::new(types::Fd(fd), ptr, n)
                .offset(off)
                .build()
                .flags(member_flags(punt))
                .user_data(ud)
        },
        None,
        Some(st),
    )
}

/// `fallocate(fd, mode, off, len)` (hole punching: `FileDev::discard`).
pub(crate) fn ring_fallocate(
    l: &Local,
    fd: RawFd,
    off: u64,
    len: u64,
    mode: i32,
    punt: bool,
) -> RingOp {
    l.push(
        move |ud| {
            opcode::Fallocate::new(types::Fd(fd), len)
                .offset(off)
                .mode(mode)
                .build()
                .flags(member_flags(punt))
                .user_data(ud)
        },
        None,
    )
}

pub(crate) fn ring_fdatasync(l: &Local, fd: RawFd, punt: bool) -> RingOp {
    l.push(
        move |ud| {
            opcode::Fsync::new(types::Fd(fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .flags(member_flags(punt))
                .user_data(ud)
        },
        None,
    )
}
