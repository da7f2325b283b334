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
//!
//! The parts: `executor` (tasks, wakers, the `coop` budget), `ring` (submitting ring
//! operations, reaping their completions, busy-polling), `turn` (the reactor thread's loop
//! and the `IdlePolicy` that decides when an idle reactor busy-polls), `runtime` (starting
//! and stopping the reactors, sending them work). Here: the state they share.

mod executor;
mod ring;
mod runtime;
mod timer;
mod turn;

pub(crate) use executor::{coop, park};
pub use executor::{spawn_local, spawn_local_output, yield_now};
pub(crate) use ring::{ring_fallocate, ring_fdatasync, ring_read, ring_write, ring_writev};
pub use runtime::{Runtime, RuntimeHandle};
pub use timer::sleep;

use executor::{LocalTask, TaskWaker};
use io_uring::IoUring;
use ring::OpSlot;
use slab::Slab;
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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

type Job = Box<dyn FnOnce() + Send>;

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

/// Per-thread reactor state, reachable through the `LOCAL` thread-local.
pub(crate) struct Local {
    shared: Arc<Shared>,
    peers: Arc<Vec<Arc<Shared>>>,
    /// None: io_uring is unavailable (devices use pread/pwrite).
    ring: Option<RefCell<IoUring>>,
    /// Ring operations in flight (`ring`).
    ops: RefCell<Slab<OpSlot>>,
    /// Tasks (`executor`): the future (None while it is being polled) and its waker.
    tasks: RefCell<Slab<(Option<LocalTask>, Arc<TaskWaker>)>>,
    /// Ring operations submitted and not yet completed.
    inflight: Cell<usize>,
    /// In-flight ops whose future was dropped (a request gave up on a hung member). The
    /// reactor does not wait for them at shutdown: their buffers are leaked instead.
    orphans: Cell<usize>,
    /// Of those, timers (`timer::sleep` dropped early): they complete by themselves.
    timer_orphans: Cell<usize>,
    /// Whether the completions reaped since the last idle turn began include a bulk op's
    /// (`Local::mark_bulk`), and anything else (another op, the eventfd).
    done_bulk: Cell<bool>,
    done_other: Cell<bool>,
    /// Whether the eventfd read (the cross-thread wake-up) is queued on the ring.
    efd_armed: Cell<bool>,
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
    static CURRENT: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
}

/// This thread's reactor state, if it is a reactor thread.
pub(crate) fn local() -> Option<Rc<Local>> {
    LOCAL.with(|l| l.borrow().clone())
}

/// Index of the reactor this thread runs, if any, and the number of reactors in its runtime.
pub fn current() -> Option<(usize, usize)> {
    local().map(|l| (l.shared.index, l.peers.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::IoBuf;
    use crate::dev::{BlockDev, FileDev};
    use std::path::PathBuf;
    use std::task::{Poll, Waker};
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
