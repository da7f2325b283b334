//! Starting and stopping the reactors, and sending them work from any thread.

use super::turn::run_reactor;
use super::{spawn_local, Shared, CURRENT};
use io_uring::IoUring;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
