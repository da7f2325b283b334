//! The reactor: one thread per core, each with its own io_uring and a tiny single-threaded
//! executor for the array's request futures.
//!
//! Why hand-written: the data path needs (a) futures that own their buffers until the kernel
//! completes them, (b) one ring per thread polled in the same loop as the tasks, and (c)
//! cross-thread wake-ups that interrupt a thread sleeping in `io_uring_enter`. General-purpose
//! runtimes either own the event loop (tokio) or do not drive io_uring (futures' LocalPool).
//! The executor here is small: a slab of tasks, a ready queue, and an eventfd that the
//! ring polls so that a wake from another thread ends the thread's wait.
//!
//! When io_uring is unavailable (old kernel, seccomp), `Runtime::new` still starts reactors;
//! devices then fall back to blocking pread/pwrite (see `dev`), and idle reactors sleep on the
//! eventfd instead of the ring.

use crate::buf::IoBuf;
use io_uring::{opcode, types, IoUring};
use slab::Slab;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;

const EVENTFD_TOKEN: u64 = u64::MAX;

/// Member I/Os a task may run per poll before `coop` makes it yield. I/O to memory (tmpfs
/// members copy inline) completes without ever returning Pending, so without a budget one task
/// looping over such I/O (a benchmark's request loop, a rebuild) would run inside a single poll
/// for as long as it has work: every other task on its reactor, and any task elsewhere waiting
/// for a lock that a task of this reactor was woken to take, would wait the whole time.
/// 16 (measured with `uraid bench` on tmpfs members, 2 reactors, 8 and 16 loops each): the
/// same throughput as 8 to 128 within noise, while the p99 grows with the budget (1M
/// sequential write 4.1–4.9 ms at 16, 7.5 ms at 64, 13 ms at 128; 4k random read 0.33 ms at
/// 16, 1.2 ms at 64). A request served over NBD (its own task) rarely spends it.
pub const COOP_BUDGET: u32 = 16;

/// Passes over the ready queue per loop turn before the ring is entered anyway (so a task
/// that keeps waking itself cannot hold back submissions forever).
const MAX_PASSES: usize = 16;

type Job = Box<dyn FnOnce() + Send>;
type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// State of one reactor that other threads may touch.
struct Shared {
    index: usize,
    jobs: Mutex<Vec<Job>>,
    ready: Mutex<Vec<usize>>,
    efd: RawFd,
    /// Set by a remote waker that wrote the eventfd; cleared when the reactor consumes it.
    notified: AtomicBool,
    stop: AtomicBool,
    tasks_live: AtomicUsize,
    /// io_uring_enter calls made by this reactor (written by its own thread only).
    enters: AtomicU64,
    /// Busy-poll budget in nanoseconds (0: off); see `RuntimeHandle::set_busy_poll`.
    busy_poll_ns: AtomicU64,
    /// Idle turns that found work while busy-polling, and turns that slept (own thread only).
    polled: AtomicU64,
    slept: AtomicU64,
}

impl Shared {
    /// Counts one io_uring_enter; only the reactor's own thread calls it, so a plain load and
    /// store (no locked instruction) is exact.
    fn count_enter(&self) {
        bump(&self.enters);
    }

    /// Tasks ready to poll or jobs sent to this reactor.
    fn has_work(&self) -> bool {
        !self
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
            || !self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
    }

    fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let one: u64 = 1;
            // SAFETY: efd is an eventfd owned by this Shared for its whole life (closed in
            // Drop); writing 8 bytes from a valid u64 is the eventfd protocol.
            let _ = unsafe { libc::write(self.efd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    fn push_ready(self: &Arc<Self>, id: usize) {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id);
        if !CURRENT.with(|c| c.get() == Arc::as_ptr(self)) {
            self.notify();
        }
    }
}

/// Adds one to a counter only its owner thread writes (a plain load and store, exact).
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the eventfd was created in Runtime::new and is closed exactly once, here.
        unsafe { libc::close(self.efd) };
    }
}

struct TaskWaker {
    id: usize,
    shared: Arc<Shared>,
    /// The task is in the ready queue (set by the wake that queued it, cleared just before
    /// the task is polled). Further wakes meanwhile queue nothing (only a stale waker of a
    /// finished task whose slot a new task took can add one spurious poll): a task woken by many
    /// sources at once (the member I/Os of one request completing together, every
    /// sub-future of a join yielding to `coop`) is polled once, not once per wake: the
    /// duplicates were real polls, each with a fresh budget, and they multiplied, so one
    /// busy task could keep a woken one waiting for hundreds of milliseconds.
    queued: AtomicBool,
}

impl TaskWaker {
    fn queue(&self) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.shared.push_ready(self.id);
        }
    }
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.queue();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.queue();
    }
}

/// An in-flight ring operation. The buffer lives here, not in the future, so that a dropped
/// future can never let the kernel write into freed memory.
struct OpSlot {
    result: Option<i32>,
    waker: Option<Waker>,
    buf: Option<IoBuf>,
    /// Anything else the kernel points into (socket buffers, iovec arrays, msghdr).
    keep: Option<Box<dyn std::any::Any>>,
    orphaned: bool,
}

/// Per-thread reactor state, reachable through the `LOCAL` thread-local.
pub(crate) struct Local {
    shared: Arc<Shared>,
    peers: Arc<Vec<Arc<Shared>>>,
    ring: Option<RefCell<IoUring>>,
    ops: RefCell<Slab<OpSlot>>,
    tasks: RefCell<Slab<(Option<LocalTask>, Arc<TaskWaker>)>>,
    inflight: Cell<usize>,
    /// In-flight ops whose future was dropped (a request gave up on a hung member). The
    /// reactor does not wait for them at shutdown: their buffers are leaked instead.
    orphans: Cell<usize>,
    /// Whether the eventfd read (the cross-thread wake-up) is queued on the ring.
    efd_armed: Cell<bool>,
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
    static CURRENT: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    /// What is left of the running task's `COOP_BUDGET` (unlimited outside a reactor's task
    /// poll: a thread blocking on a future has nobody to yield to).
    static BUDGET: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// Spends one unit of the running task's budget; once it is spent, yields (the task is woken
/// at once and polled again, with a fresh budget, after the tasks already ready; the ring's
/// completions are reaped before that, and the tasks they wake queue behind it). Called by
/// every member and journal I/O before it starts, so a task whose I/O completes inline still
/// lets the rest of its reactor run. Only for futures polled by a reactor task or off the
/// reactors: an executor nested inside a task's poll (none exists) would see a spent budget
/// and spin.
pub(crate) async fn coop() {
    std::future::poll_fn(|cx| {
        BUDGET.with(|b| match b.get() {
            0 => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            n => {
                b.set(n - 1);
                Poll::Ready(())
            }
        })
    })
    .await
}

pub(crate) fn local() -> Option<Rc<Local>> {
    LOCAL.with(|l| l.borrow().clone())
}

/// Index of the reactor this thread runs, if any, and the number of reactors in its runtime.
pub fn current() -> Option<(usize, usize)> {
    local().map(|l| (l.shared.index, l.peers.len()))
}

/// Spawns a task on this thread's reactor. Panics if called off a reactor thread.
pub fn spawn_local(fut: impl Future<Output = ()> + 'static) {
    let l = local().expect("spawn_local called outside a reactor thread");
    l.spawn(Box::pin(fut));
}

/// `spawn_local` for a future with an output, which arrives through the channel (cancelled if
/// the task ends without one: a panic, or the reactor stopping first).
pub fn spawn_local_output<T: 'static>(
    fut: impl Future<Output = T> + 'static,
) -> futures::channel::oneshot::Receiver<T> {
    let (tx, rx) = futures::channel::oneshot::channel();
    spawn_local(async move {
        let _ = tx.send(fut.await);
    });
    rx
}

/// Registers a waiter's waker once: a task re-polled while it waits (a join is polled
/// whenever any of its parts is woken) would otherwise add a copy on every poll, and a long
/// wait turns the copies into a wake-up storm.
pub(crate) fn park(waiters: &mut VecDeque<Waker>, w: &Waker) {
    if !waiters.iter().any(|x| x.will_wake(w)) {
        waiters.push_back(w.clone());
    }
}

impl Local {
    fn spawn(&self, fut: LocalTask) {
        let mut tasks = self.tasks.borrow_mut();
        let entry = tasks.vacant_entry();
        let id = entry.key();
        let waker = Arc::new(TaskWaker {
            id,
            shared: self.shared.clone(),
            queued: AtomicBool::new(true),
        });
        entry.insert((Some(fut), waker));
        self.shared.tasks_live.fetch_add(1, Ordering::Relaxed);
        self.shared
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id);
    }

    fn poll_task(&self, id: usize) {
        let (fut, waker) = {
            let mut tasks = self.tasks.borrow_mut();
            match tasks.get_mut(id) {
                Some((f, w)) => match f.take() {
                    Some(f) => {
                        // Cleared before the poll: a wake from now on queues the task again.
                        w.queued.swap(false, Ordering::AcqRel);
                        (f, Waker::from(w.clone()))
                    }
                    None => return, // already being polled (re-entrant wake) or finished
                },
                None => return, // stale wake of a finished task
            }
        };
        let mut fut = fut;
        let mut cx = Context::from_waker(&waker);
        BUDGET.with(|b| b.set(COOP_BUDGET));
        let polled = fut.as_mut().poll(&mut cx);
        BUDGET.with(|b| b.set(u32::MAX));
        match polled {
            Poll::Ready(()) => {
                self.tasks.borrow_mut().remove(id);
                self.shared.tasks_live.fetch_sub(1, Ordering::Relaxed);
            }
            Poll::Pending => {
                if let Some(slot) = self.tasks.borrow_mut().get_mut(id) {
                    slot.0 = Some(fut);
                }
            }
        }
    }

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
        let ring = self.ring.as_ref().expect("push needs a ring");
        let id = self.ops.borrow_mut().insert(OpSlot {
            result: None,
            waker: None,
            buf,
            keep,
            orphaned: false,
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

    /// Handles every completion the completion queue holds (the run loop after each
    /// `io_uring_enter`, and `push_keep` when a full ring needs room). Returns the count.
    fn reap(&self, ring: &mut IoUring) -> usize {
        let mut n = 0;
        for cqe in ring.completion() {
            n += 1;
            if cqe.user_data() == EVENTFD_TOKEN {
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
        if slot.orphaned {
            self.orphans.set(self.orphans.get() - 1);
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
fn submit(ring: &mut IoUring) -> io::Result<usize> {
    submit_and_wait(ring, 0)
}

/// `io_uring_enter` for everything queued, waiting for `want` completions. In unit tests a
/// reactor thread can make it act like kernels that refuse submissions with EBUSY while the
/// completion queue is full (the condition `push_keep` must get out of by reaping).
fn submit_and_wait(ring: &mut IoUring, want: usize) -> io::Result<usize> {
    #[cfg(test)]
    if tests::REFUSE_WHEN_CQ_FULL.with(|r| r.get()) && ring.completion().is_full() {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    ring.submit_and_wait(want)
}

/// Spins until a completion is posted (a member I/O, a socket receive, or the eventfd read
/// another thread's wake-up completes; stopping the runtime is one), the thread's ready or
/// job queue fills, or `budget_ns` passes. Completions reach the queue without this thread
/// entering the kernel: the ring is set up without COOP_TASKRUN, so the kernel interrupts the
/// spinning thread to run its task work. Returns whether work arrived.
fn busy_poll(ring: &mut IoUring, shared: &Shared, budget_ns: u64) -> bool {
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

/// Yields once so other ready tasks (for example writes to the same stripe) can run first.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// A set of reactor threads.
pub struct Runtime {
    peers: Arc<Vec<Arc<Shared>>>,
    threads: Vec<JoinHandle<()>>,
    uring: bool,
}

#[derive(Clone)]
pub struct RuntimeHandle {
    peers: Arc<Vec<Arc<Shared>>>,
}

impl RuntimeHandle {
    pub fn reactors(&self) -> usize {
        self.peers.len()
    }

    /// io_uring_enter calls made by all reactors so far (the cost the run loop keeps to one
    /// per request at queue depth 1; `uraid_reactor_ring_enters_total` in the metrics).
    pub fn ring_enters(&self) -> u64 {
        self.peers
            .iter()
            .map(|s| s.enters.load(Ordering::Relaxed))
            .sum()
    }

    /// Idle turns of all reactors that found work while busy-polling, and turns that slept
    /// in the kernel (`uraid_reactor_idle_turns_total{how}` in the metrics).
    pub fn idle_turns(&self) -> (u64, u64) {
        self.peers.iter().fold((0, 0), |(p, s), r| {
            (
                p + r.polled.load(Ordering::Relaxed),
                s + r.slept.load(Ordering::Relaxed),
            )
        })
    }

    /// Busy-poll budget: a reactor with nothing to do spins this long on its completion
    /// queue before it sleeps in `io_uring_enter`, while its recent sleeps were short (work
    /// arriving back to back, as at queue depth 1). Zero turns it off.
    pub fn set_busy_poll(&self, budget: std::time::Duration) {
        let ns = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        for s in self.peers.iter() {
            s.busy_poll_ns.store(ns, Ordering::Relaxed);
        }
    }

    /// Runs `f` on reactor `index`; `f` typically spawns a local task there.
    pub fn run_on(&self, index: usize, f: impl FnOnce() + Send + 'static) {
        let s = &self.peers[index];
        s.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(f));
        if !CURRENT.with(|c| c.get() == Arc::as_ptr(s)) {
            s.notify();
        }
    }

    /// Spawns the future built by `f` on reactor `index` and returns its output through a
    /// channel, from any thread.
    pub fn spawn_on<T, F, Fut>(&self, index: usize, f: F) -> futures::channel::oneshot::Receiver<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.run_on(index, move || {
            spawn_local(async move {
                let _ = tx.send(f().await);
            })
        });
        rx
    }

    /// Blocks this (non-reactor) thread until the future built on reactor `index` finishes.
    pub fn block_on<T, F, Fut>(&self, index: usize, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        futures::executor::block_on(self.spawn_on(index, f))
            .expect("reactor stopped before finishing a task")
    }
}

impl Runtime {
    /// Starts `n` reactors with `ring_entries` submission slots each. `use_uring = false`
    /// forces the pread/pwrite fallback.
    pub fn new(n: usize, ring_entries: u32, use_uring: bool) -> io::Result<Runtime> {
        let n = n.max(1);
        let mut shared = Vec::with_capacity(n);
        for index in 0..n {
            // SAFETY: plain syscall; the returned fd is checked and then owned by Shared.
            let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if efd < 0 {
                return Err(io::Error::last_os_error());
            }
            shared.push(Arc::new(Shared {
                index,
                jobs: Mutex::new(Vec::new()),
                ready: Mutex::new(Vec::new()),
                efd,
                notified: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                tasks_live: AtomicUsize::new(0),
                enters: AtomicU64::new(0),
                busy_poll_ns: AtomicU64::new(0),
                polled: AtomicU64::new(0),
                slept: AtomicU64::new(0),
            }));
        }
        let peers = Arc::new(shared);
        // Probe once so every reactor agrees on the mode.
        let uring = use_uring && IoUring::new(8).is_ok();
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            let peers2 = peers.clone();
            let t = std::thread::Builder::new()
                .name(format!("uraid-reactor-{index}"))
                .spawn(move || run_reactor(peers2, index, ring_entries, uring))?;
            threads.push(t);
        }
        Ok(Runtime {
            peers,
            threads,
            uring,
        })
    }

    pub fn handle(&self) -> RuntimeHandle {
        RuntimeHandle {
            peers: self.peers.clone(),
        }
    }

    pub fn uses_uring(&self) -> bool {
        self.uring
    }

    /// Stops the reactors once every task they run has finished, and joins them.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        for s in self.peers.iter() {
            s.stop.store(true, Ordering::Release);
            s.notify();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn run_reactor(peers: Arc<Vec<Arc<Shared>>>, index: usize, entries: u32, uring: bool) {
    let shared = peers[index].clone();
    let ring = if uring {
        match IoUring::new(entries) {
            Ok(r) => {
                // File I/O the kernel cannot do asynchronously (FUSE, some filesystems) runs
                // on the ring's io-wq workers, by default at most 4 per CPU. A hung member
                // would hold them all and stall every other member's I/O behind it (seen
                // with a stopped nbdfuse member: the healthy members timed out too), so
                // allow one worker per ring entry; workers are only created when needed.
                let mut max = [entries, 0];
                if let Err(e) = r.submitter().register_iowq_max_workers(&mut max) {
                    tracing::debug!("reactor {index}: cannot raise io-wq workers: {e}");
                }
                Some(RefCell::new(r))
            }
            Err(e) => {
                tracing::warn!("reactor {index}: io_uring unavailable ({e}); using pread/pwrite");
                None
            }
        }
    } else {
        None
    };
    let local = Rc::new(Local {
        shared: shared.clone(),
        peers,
        ring,
        ops: RefCell::new(Slab::new()),
        tasks: RefCell::new(Slab::new()),
        inflight: Cell::new(0),
        orphans: Cell::new(0),
        efd_armed: Cell::new(false),
    });
    LOCAL.with(|l| *l.borrow_mut() = Some(local.clone()));
    CURRENT.with(|c| c.set(Arc::as_ptr(&shared)));

    // The eventfd read targets this word. It is leaked (8 bytes per reactor) so that a read
    // still queued when the ring is torn down can never write into freed memory.
    let efd_buf: &'static mut u64 = Box::leak(Box::new(0u64));
    // Whether the last idle wait was short enough that busy-polling would have caught it.
    let mut poll_pays = false;
    loop {
        let jobs = std::mem::take(&mut *shared.jobs.lock().unwrap_or_else(|e| e.into_inner()));
        for j in jobs {
            j();
        }
        // Poll until no task is ready (tasks spawned or woken by this pass run in the next),
        // reaping completions already posted in between: the ring is entered only when there
        // is nothing left to do but submit and wait, so one request at queue depth 1 costs one
        // io_uring_enter (its member I/O and reply submitted, the next receive awaited).
        let mut spinning = true;
        for _ in 0..MAX_PASSES {
            let ready =
                std::mem::take(&mut *shared.ready.lock().unwrap_or_else(|e| e.into_inner()));
            if ready.is_empty() {
                spinning = false;
                break;
            }
            for id in ready {
                local.poll_task(id);
            }
            if let Some(ring) = &local.ring {
                local.reap(&mut ring.borrow_mut());
            }
        }
        // Work queued meanwhile (tasks woken by completions or other threads, jobs sent).
        let more = shared.has_work();
        if !more
            && shared.stop.load(Ordering::Acquire)
            && shared.tasks_live.load(Ordering::Relaxed) == 0
            && local.inflight.get() == local.orphans.get()
        {
            break;
        }
        match &local.ring {
            Some(ring) => {
                if !local.efd_armed.get() {
                    let ptr = &mut *efd_buf as *mut u64 as *mut u8;
                    let sqe = opcode::Read::new(types::Fd(shared.efd), ptr, 8)
                        .build()
                        .user_data(EVENTFD_TOKEN);
                    let mut r = ring.borrow_mut();
                    // SAFETY: efd_buf is a leaked, never-freed u64, and the eventfd stays open
                    // until Shared drops, after this ring is gone.
                    let mut pushed = unsafe { r.submission().push(&sqe) }.is_ok();
                    if !pushed {
                        // A full submission queue: hand it over and try again. Sleeping with
                        // the eventfd unarmed would miss other threads' wake-ups.
                        shared.count_enter();
                        let _ = submit(&mut r);
                        // SAFETY: as for the first push.
                        pushed = unsafe { r.submission().push(&sqe) }.is_ok();
                    }
                    local.efd_armed.set(pushed);
                }
                // Never sleep without the eventfd read queued (it is how other threads wake
                // this one); if it could not be queued, go round again without waiting.
                let more = more || !local.efd_armed.get();
                let mut ring = ring.borrow_mut();
                // Still work to do: enter only to hand over queued submissions (completions
                // are read from the shared queue without a syscall), or when tasks kept
                // waking for MAX_PASSES passes (a task yielding until an I/O completes: the
                // kernel finishes some completions only when this thread enters it). Nothing
                // to do: submit and sleep until a completion (or the eventfd) arrives.
                let r = if !more {
                    let budget = shared.busy_poll_ns.load(Ordering::Relaxed);
                    let poll = budget > 0 && poll_pays;
                    let mut r = Ok(0);
                    let mut found = false;
                    if poll {
                        if !ring.submission().is_empty() {
                            shared.count_enter();
                            r = submit(&mut ring);
                        }
                        found = busy_poll(&mut ring, &shared, budget);
                    }
                    // Poll again after a poll that found work, or after a sleep short
                    // enough that a poll might have caught it (under two budgets: the sleep
                    // includes the wake-up a poll saves). A poll that ran out stops polling
                    // until such a sleep is seen, so work arriving a little too far apart
                    // costs at most every other idle turn a wasted budget, and an idle
                    // reactor sleeps after one.
                    poll_pays = if found {
                        bump(&shared.polled);
                        true
                    } else {
                        bump(&shared.slept);
                        shared.count_enter();
                        let t0 = std::time::Instant::now();
                        r = submit_and_wait(&mut ring, 1);
                        !poll
                            && budget > 0
                            && t0.elapsed().as_nanos() < u128::from(budget.saturating_mul(2))
                    };
                    r
                } else if spinning
                    || !ring.submission().is_empty()
                    || ring.submission().cq_overflow()
                {
                    shared.count_enter();
                    submit(&mut ring)
                } else {
                    Ok(0)
                };
                if let Err(e) = r {
                    if e.raw_os_error() != Some(libc::EINTR)
                        && e.raw_os_error() != Some(libc::EBUSY)
                    {
                        tracing::error!("reactor {index}: io_uring_enter failed: {e}");
                    }
                }
                local.reap(&mut ring);
            }
            None => {
                if !more {
                    let mut pfd = libc::pollfd {
                        fd: shared.efd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: pfd is a valid pollfd for the duration of the call.
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                    // SAFETY: reading 8 bytes into a u64 from our own non-blocking eventfd.
                    unsafe {
                        libc::read(
                            shared.efd,
                            &mut *efd_buf as *mut u64 as *mut libc::c_void,
                            8,
                        )
                    };
                    shared.notified.store(false, Ordering::Release);
                }
            }
        }
    }
    if local.orphans.get() > 0 {
        // Ops of a hung device are still in the kernel: their buffers must outlive the ring
        // (the kernel may complete them after it is closed), so they are leaked, never freed.
        tracing::warn!(
            "reactor {index}: {} I/O(s) on a hung device still outstanding at shutdown; \
             leaking their buffers",
            local.orphans.get()
        );
        std::mem::forget(local.ops.replace(Slab::new()));
    }
    LOCAL.with(|l| *l.borrow_mut() = None);
    CURRENT.with(|c| c.set(std::ptr::null()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{BlockDev, FileDev};
    use std::path::PathBuf;
    use std::time::Duration;

    thread_local! {
        /// See `submit_and_wait`.
        pub(super) static REFUSE_WHEN_CQ_FULL: Cell<bool> = const { Cell::new(false) };
    }

    /// A directory whose files go through the ring (not tmpfs, where FileDev copies inline).
    fn disk_dir() -> PathBuf {
        let candidates = [
            PathBuf::from("/var/tmp"),
            std::env::temp_dir(),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ];
        for d in candidates {
            let probe = d.join(format!("uraid-reactor-probe-{}", std::process::id()));
            if std::fs::write(&probe, [0u8; 4096]).is_err() {
                continue;
            }
            let on_disk = FileDev::open(&probe).is_ok_and(|f| !f.memory);
            let _ = std::fs::remove_file(&probe);
            if on_disk {
                return d;
            }
        }
        panic!("no writable directory off tmpfs that supports O_DIRECT");
    }

    /// On a reactor with a 4-entry ring (8 completion slots), one task pushes 512 reads and
    /// writes of a file within a single poll (join_all polls every future before anything is
    /// reaped), so `push_keep` finds the submission queue full over a hundred times, and
    /// (after a pause that lets the first operations complete) with the completion queue
    /// full. Everything must complete with the right bytes, within a deadline (a stuck reactor
    /// fails the test instead of hanging it).
    fn many_more_ops_than_ring_entries(tag: &str, refuse_when_cq_full: bool) {
        const BLOCK: usize = 4096;
        const BLOCKS: usize = 256;
        let path = disk_dir().join(format!("uraid-reactor-{tag}-{}", std::process::id()));
        let pattern: Vec<u8> = (0..BLOCKS * BLOCK)
            .map(|i| (i / BLOCK) as u8 ^ i as u8)
            .collect();
        let mut image = pattern.clone();
        image.resize(2 * BLOCKS * BLOCK, 0);
        {
            // On disk before O_DIRECT I/O starts (no writeback of dirty pages in between).
            let mut f = std::fs::File::create(&path).unwrap();
            std::io::Write::write_all(&mut f, &image).unwrap();
            f.sync_all().unwrap();
        }
        let dev = Arc::new(FileDev::open(&path).unwrap());
        assert!(!dev.memory, "the test file must not be on tmpfs");
        let rt = Runtime::new(1, 4, true).unwrap();
        if !rt.uses_uring() {
            eprintln!("io_uring unavailable: nothing to test");
            let _ = std::fs::remove_file(&path);
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dev.clone();
        rt.handle().run_on(0, move || {
            REFUSE_WHEN_CQ_FULL.with(|r| r.set(refuse_when_cq_full));
            spawn_local(async move {
                let reads = (0..BLOCKS).map(|i| {
                    let d = d.clone();
                    async move {
                        if i == 16 {
                            // Blocks the reactor (inside the one poll) while the operations
                            // pushed so far complete: from here on the completion queue is
                            // full and only reaping makes room.
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        let (r, b) = d.read((i * BLOCK) as u64, IoBuf::with_len(BLOCK)).await;
                        r.map(|()| b.to_vec())
                    }
                });
                let writes = (0..BLOCKS).map(|i| {
                    let d = d.clone();
                    async move {
                        let b = IoBuf::copy_of(&[i as u8; BLOCK]);
                        d.write(((BLOCKS + i) * BLOCK) as u64, b).await.0
                    }
                });
                let (r, w) = futures::future::join(
                    futures::future::join_all(reads),
                    futures::future::join_all(writes),
                )
                .await;
                let _ = tx.send((r, w));
            })
        });
        let Ok((reads, writes)) = rx.recv_timeout(Duration::from_secs(20)) else {
            // The reactor thread is stuck; joining it would hang the test too.
            std::mem::forget(rt);
            panic!("ring operations did not complete within 20 s (push_keep stuck on a full ring)");
        };
        rt.shutdown();
        for (i, r) in reads.into_iter().enumerate() {
            let got = r.unwrap_or_else(|e| panic!("read {i}: {e}"));
            assert!(got[..] == pattern[i * BLOCK..(i + 1) * BLOCK], "read {i}");
        }
        for (i, w) in writes.into_iter().enumerate() {
            w.unwrap_or_else(|e| panic!("write {i}: {e}"));
        }
        let back = std::fs::read(&path).unwrap();
        for i in 0..BLOCKS {
            let blk = &back[(BLOCKS + i) * BLOCK..(BLOCKS + i + 1) * BLOCK];
            assert!(blk.iter().all(|&b| b == i as u8), "write {i} on disk");
        }
        let _ = std::fs::remove_file(&path);
    }

    /// Current kernels accept submissions while the completion queue overflows (they keep
    /// the extra completions in kernel memory), so this passes even with a `push_keep` that
    /// never reaps; it checks that reaping from inside `push_keep` loses nothing.
    #[test]
    fn a_tiny_ring_takes_far_more_ops_than_entries_in_one_poll() {
        many_more_ops_than_ring_entries("tiny", false);
    }

    /// With submissions refused while the completion queue is full (EBUSY, as kernels with a
    /// backlog of unposted completions answer), only reaping makes room: a `push_keep` that
    /// just calls submit again spins forever.
    #[test]
    fn a_full_ring_makes_progress_when_the_kernel_refuses_submissions() {
        many_more_ops_than_ring_entries("ebusy", true);
    }

    /// A task woken many times before it runs is polled once: each duplicate poll would get
    /// a fresh `coop` budget, so a join of many sub-futures that all yield multiplied its own
    /// polls and kept the reactor's other tasks waiting.
    #[test]
    fn a_task_woken_many_times_at_once_is_polled_once() {
        let rt = Runtime::new(1, 8, false).unwrap();
        let polls = rt.handle().block_on(0, || async {
            let polls = Rc::new(Cell::new(0u32));
            let done = Rc::new(Cell::new(false));
            let waker: Rc<RefCell<Option<Waker>>> = Rc::default();
            let (p, d, w) = (polls.clone(), done.clone(), waker.clone());
            spawn_local(std::future::poll_fn(move |cx| {
                p.set(p.get() + 1);
                if d.get() {
                    return Poll::Ready(());
                }
                if p.get() == 1 {
                    for _ in 0..10 {
                        cx.waker().wake_by_ref();
                    }
                }
                *w.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }));
            // A few turns of the reactor: the task's wakes are all handled by then.
            for _ in 0..4 {
                yield_now().await;
            }
            let seen = polls.get();
            done.set(true);
            if let Some(w) = waker.borrow_mut().take() {
                w.wake();
            }
            seen
        });
        rt.shutdown();
        assert_eq!(polls, 2, "first poll, then one poll for ten wakes");
    }

    /// A task whose work never returns Pending (member I/O to memory completes inline) yields
    /// once its budget is spent, so the other tasks on its reactor run long before it is done.
    #[test]
    fn a_task_that_never_waits_still_lets_its_reactor_run_others() {
        const STEPS: u32 = 10_000;
        let rt = Runtime::new(1, 8, false).unwrap();
        let seen = rt.handle().block_on(0, || async {
            let steps = Rc::new(Cell::new(0u32));
            let seen = Rc::new(Cell::new(None));
            let s = steps.clone();
            let (tx, rx) = futures::channel::oneshot::channel();
            spawn_local(async move {
                for _ in 0..STEPS {
                    coop().await;
                    s.set(s.get() + 1);
                }
                let _ = tx.send(());
            });
            let (st, se) = (steps.clone(), seen.clone());
            spawn_local(async move { se.set(Some(st.get())) });
            let _ = rx.await;
            seen.get()
        });
        rt.shutdown();
        let seen = seen.expect("the second task ran");
        assert!(
            seen <= COOP_BUDGET,
            "the second task ran only after {seen} steps of the first (budget {COOP_BUDGET})"
        );
    }
}
