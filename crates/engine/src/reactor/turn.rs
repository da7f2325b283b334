//! The reactor thread: a loop of turns. Each turn runs the jobs other threads sent, polls
//! the ready tasks, then enters the ring once: to hand over submissions while work is left,
//! or, with nothing to do, to sleep until a completion (or the eventfd) arrives, after a
//! busy-poll when `IdlePolicy` says one pays. Without io_uring the idle reactor sleeps on
//! the eventfd instead.

use super::ring::{busy_poll, submit, submit_and_wait, EVENTFD_TOKEN};
use super::{bump, Local, Shared, CURRENT, LOCAL};
use io_uring::{opcode, types, IoUring};
use slab::Slab;
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Passes over the ready queue per loop turn before the ring is entered anyway (so a task
/// that keeps waking itself cannot hold back submissions forever).
const MAX_PASSES: usize = 16;

/// How an idle turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdleEnd {
    /// A busy-poll found work.
    Found,
    /// The reactor slept in `io_uring_enter` for `nanos`, after a busy-poll that ran out of
    /// budget (`polled`) or without one.
    Slept { polled: bool, nanos: u128 },
}

/// Whether an idle reactor busy-polls before it sleeps, decided from how the last idle turn
/// ended: poll again after a poll that found work, or after a sleep short enough that a poll
/// might have caught it (under two budgets: the sleep includes the wake-up a poll saves). A
/// poll that ran out stops polling until such a sleep is seen, so work arriving a little too
/// far apart costs at most every other idle turn a wasted budget, and an idle reactor sleeps
/// after one. A budget of 0 never polls. A turn woken by nothing but bulk transfers
/// (`Local::mark_bulk`: the rest of a write payload) does not poll next either: the client
/// streams those at its own pace, and a reactor spinning between the segments of one
/// request costs a core for a wake-up saved now and then.
#[derive(Debug, Default)]
pub(super) struct IdlePolicy {
    poll_pays: bool,
}

impl IdlePolicy {
    /// Whether this idle turn busy-polls, with a budget of `budget_ns`.
    pub(super) fn should_poll(&self, budget_ns: u64) -> bool {
        budget_ns > 0 && self.poll_pays
    }

    /// Records how an idle turn with a budget of `budget_ns` ended, and whether what it
    /// found (or woke to) was bulk transfers only.
    pub(super) fn ended(&mut self, end: IdleEnd, budget_ns: u64, bulk_only: bool) {
        self.poll_pays = match end {
            _ if bulk_only => false,
            IdleEnd::Found => true,
            IdleEnd::Slept { polled, nanos } => {
                !polled && budget_ns > 0 && nanos < u128::from(budget_ns.saturating_mul(2))
            }
        };
    }
}

/// The body of reactor thread `index`: runs turns until the runtime stops and every task
/// has finished (ops orphaned on a hung device aside).
pub(super) fn run_reactor(peers: Arc<Vec<Arc<Shared>>>, index: usize, entries: u32, uring: bool) {
    let shared = peers[index].clone();
    let ring = if uring {
        open_ring(index, entries)
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
        timer_orphans: Cell::new(0),
        done_bulk: Cell::new(false),
        done_other: Cell::new(false),
        efd_armed: Cell::new(false),
    });
    LOCAL.with(|l| *l.borrow_mut() = Some(local.clone()));
    CURRENT.with(|c| c.set(Arc::as_ptr(&shared)));

    // The eventfd read targets this word. It is leaked (8 bytes per reactor) so that a read
    // still queued when the ring is torn down can never write into freed memory.
    let efd_buf: *mut u64 = Box::into_raw(Box::new(0u64));
    let mut idle = IdlePolicy::default();
    loop {
        let spinning = run_ready(&shared, &local);
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
            Some(ring) => ring_turn(&shared, &local, ring, efd_buf, more, spinning, &mut idle),
            None if !more => eventfd_wait(&shared, efd_buf),
            None => {}
        }
    }
    if local.orphans.get() > 0 {
        // Ops of a hung device are still in the kernel: their buffers must outlive the ring
        // (the kernel may complete them after it is closed), so they are leaked, never freed.
        // (Timers dropped early are leaked with them, silently: a few bytes each.)
        let hung = local.orphans.get() - local.timer_orphans.get();
        if hung > 0 {
            tracing::warn!(
                "reactor {index}: {hung} I/O(s) on a hung device still outstanding at \
                 shutdown; leaking their buffers"
            );
        }
        std::mem::forget(local.ops.replace(Slab::new()));
    }
    LOCAL.with(|l| *l.borrow_mut() = None);
    CURRENT.with(|c| c.set(std::ptr::null()));
}

/// The ring of reactor `index`, or None (pread/pwrite) if io_uring refuses.
fn open_ring(index: usize, entries: u32) -> Option<RefCell<IoUring>> {
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
}

/// Runs the jobs sent to this reactor, then polls until no task is ready (tasks spawned or
/// woken by this pass run in the next), reaping completions already posted in between: the
/// ring is entered only when there is nothing left to do but submit and wait, so one
/// request at queue depth 1 costs one io_uring_enter (its member I/O and reply submitted,
/// the next receive awaited). Returns whether tasks were still ready after `MAX_PASSES`.
fn run_ready(shared: &Shared, local: &Local) -> bool {
    let jobs = std::mem::take(&mut *shared.jobs.lock().unwrap_or_else(|e| e.into_inner()));
    for j in jobs {
        j();
    }
    for _ in 0..MAX_PASSES {
        let ready = std::mem::take(&mut *shared.ready.lock().unwrap_or_else(|e| e.into_inner()));
        if ready.is_empty() {
            return false;
        }
        for id in ready {
            local.poll_task(id);
        }
        if let Some(ring) = &local.ring {
            local.reap(&mut ring.borrow_mut());
        }
    }
    true
}

/// Queues the eventfd read (how other threads wake this one) unless it is queued already.
fn arm_eventfd(shared: &Shared, local: &Local, ring: &RefCell<IoUring>, efd_buf: *mut u64) {
    if local.efd_armed.get() {
        return;
    }
    let sqe = opcode::Read::new(types::Fd(shared.efd), efd_buf as *mut u8, 8)
        .build()
        .user_data(EVENTFD_TOKEN);
    let mut r = ring.borrow_mut();
    // SAFETY: efd_buf is a leaked, never-freed u64, and the eventfd stays open until Shared
    // drops, after this ring is gone.
    let mut pushed = unsafe { r.submission().push(&sqe) }.is_ok();
    if !pushed {
        // A full submission queue: hand it over and try again. Sleeping with the eventfd
        // unarmed would miss other threads' wake-ups.
        shared.count_enter();
        let _ = submit(&mut r);
        // SAFETY: as for the first push.
        pushed = unsafe { r.submission().push(&sqe) }.is_ok();
    }
    local.efd_armed.set(pushed);
}

/// The ring's part of a turn. Still work to do (`more`): enter only to hand over queued
/// submissions (completions are read from the shared queue without a syscall), or when
/// tasks kept waking for `MAX_PASSES` passes (`spinning`: a task yielding until an I/O
/// completes; the kernel finishes some completions only when this thread enters it).
/// Nothing to do: `idle_turn`, reap, and `idle.ended` with what was reaped. Then reap.
fn ring_turn(
    shared: &Shared,
    local: &Local,
    ring: &RefCell<IoUring>,
    efd_buf: *mut u64,
    more: bool,
    spinning: bool,
    idle: &mut IdlePolicy,
) {
    arm_eventfd(shared, local, ring, efd_buf);
    // Never sleep without the eventfd read queued (it is how other threads wake this one);
    // if it could not be queued, go round again without waiting.
    let more = more || !local.efd_armed.get();
    let mut ring = ring.borrow_mut();
    let r = if !more {
        local.clear_done();
        let (r, end, budget) = idle_turn(shared, &mut ring, idle);
        local.reap(&mut ring);
        idle.ended(end, budget, local.done_bulk_only());
        r
    } else if spinning || !ring.submission().is_empty() || ring.submission().cq_overflow() {
        shared.count_enter();
        submit(&mut ring)
    } else {
        Ok(0)
    };
    if let Err(e) = r {
        if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
            tracing::error!("reactor {}: io_uring_enter failed: {e}", shared.index);
        }
    }
    local.reap(&mut ring);
}

/// A turn with nothing to do: busy-poll if `idle` says it pays (submitting what is queued
/// first), else, or if the poll runs out, submit and sleep until a completion (or the
/// eventfd) arrives. Returns how it ended and the budget, for `idle` to learn from once
/// the completions are reaped.
fn idle_turn(
    shared: &Shared,
    ring: &mut IoUring,
    idle: &IdlePolicy,
) -> (io::Result<usize>, IdleEnd, u64) {
    let budget = shared.busy_poll_ns.load(Ordering::Relaxed);
    let poll = idle.should_poll(budget);
    let mut r = Ok(0);
    if poll {
        if !ring.submission().is_empty() {
            shared.count_enter();
            r = submit(ring);
        }
        if busy_poll(ring, shared, budget) {
            bump(&shared.polled);
            return (r, IdleEnd::Found, budget);
        }
    }
    bump(&shared.slept);
    shared.count_enter();
    let t0 = std::time::Instant::now();
    let r = submit_and_wait(ring, 1);
    let nanos = t0.elapsed().as_nanos();
    let end = IdleEnd::Slept {
        polled: poll,
        nanos,
    };
    (r, end, budget)
}

/// An idle reactor without a ring: waits (at most 100 ms) for the eventfd, then consumes it.
fn eventfd_wait(shared: &Shared, efd_buf: *mut u64) {
    let mut pfd = libc::pollfd {
        fd: shared.efd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: pfd is a valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, 100) };
    // SAFETY: reading 8 bytes into the leaked u64 from our own non-blocking eventfd.
    unsafe { libc::read(shared.efd, efd_buf as *mut libc::c_void, 8) };
    shared.notified.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: u64 = 50_000;

    fn slept(polled: bool, nanos: u128) -> IdleEnd {
        IdleEnd::Slept { polled, nanos }
    }

    #[test]
    fn an_idle_reactor_polls_only_after_a_short_sleep_or_a_poll_that_found_work() {
        let mut p = IdlePolicy::default();
        assert!(!p.should_poll(BUDGET), "the first idle turn sleeps");
        // A sleep shorter than two budgets: a poll might have caught it.
        p.ended(slept(false, 2 * u128::from(BUDGET) - 1), BUDGET, false);
        assert!(p.should_poll(BUDGET));
        p.ended(IdleEnd::Found, BUDGET, false);
        assert!(p.should_poll(BUDGET), "a poll that found work polls again");
        // A poll that ran out: the next idle turn sleeps, however short that sleep was.
        p.ended(slept(true, 1), BUDGET, false);
        assert!(!p.should_poll(BUDGET));
        p.ended(slept(false, 1), BUDGET, false);
        assert!(p.should_poll(BUDGET));
        // A long sleep (an idle reactor) stops polling.
        p.ended(slept(false, 2 * u128::from(BUDGET)), BUDGET, false);
        assert!(!p.should_poll(BUDGET));
    }

    #[test]
    fn busy_polling_with_no_budget_never_starts() {
        let mut p = IdlePolicy::default();
        p.ended(IdleEnd::Found, BUDGET, false);
        assert!(p.should_poll(BUDGET));
        assert!(!p.should_poll(0), "budget 0 turns polling off at once");
        p.ended(slept(false, 0), 0, false);
        assert!(
            !p.should_poll(BUDGET),
            "no sleep is short against a zero budget"
        );
    }

    #[test]
    fn a_turn_woken_by_bulk_transfers_only_does_not_poll_next() {
        let mut p = IdlePolicy::default();
        p.ended(IdleEnd::Found, BUDGET, false);
        assert!(p.should_poll(BUDGET));
        // A poll that found the next segment of a write payload, and nothing else.
        p.ended(IdleEnd::Found, BUDGET, true);
        assert!(
            !p.should_poll(BUDGET),
            "a bulk segment found by a poll stops polling"
        );
        // A short sleep woken by a segment alone: still no poll.
        p.ended(slept(false, 1), BUDGET, true);
        assert!(
            !p.should_poll(BUDGET),
            "a short sleep woken by bulk only keeps sleeping"
        );
        // Anything else among the completions (a request): the usual rule.
        p.ended(slept(false, 1), BUDGET, false);
        assert!(p.should_poll(BUDGET));
    }
}
