//! The executor: each reactor's tasks (a slab, polled from the ready queue), their wakers,
//! and the `coop` budget that makes a task which never waits yield now and then.

use super::{local, Local, Shared, COOP_BUDGET};
use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

pub(super) type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

thread_local! {
    /// What is left of the running task's `COOP_BUDGET` (unlimited outside a reactor's task
    /// poll: a thread blocking on a future has nobody to yield to).
    static BUDGET: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// A task's waker: queues the task on its reactor's ready queue.
pub(super) struct TaskWaker {
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
    pub(super) fn spawn(&self, fut: LocalTask) {
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

    /// Polls task `id` once (nothing if it is being polled or has finished), with a fresh
    /// `coop` budget.
    pub(super) fn poll_task(&self, id: usize) {
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
