//! The stripe lock table, and what a stripe operation queues on it (the array runs the
//! operations: array/stripe_io.rs reads and decodes, array/stripe_write.rs writes).
//!
//! The lock table is sharded (`shard()`: runs of 8 stripes, one mutex-guarded map per shard,
//! held only for a few instructions); waiters park with their wakers, which may belong to any
//! reactor. Writes queue on their stripe's slot; whoever takes the lock runs *one* batch of
//! everything queued (write merging) and releases it, waking every waiter: a degraded reader
//! or another writer then competes for the next turn, so nobody is held behind a holder that
//! keeps finding new work (the first writer returns as soon as its batch is done).
//!
//! Rules:
//! * A stripe is held through a `StripeGuard`; dropping it releases the stripe, on every
//!   path. Write-back's deferred member writes carry the hold to their task
//!   (`StripeGuard::detach`, `StripeLocks::resume`).
//! * A queued write whose writer's future was dropped before a holder took it is discarded
//!   (`StripeSlot::live_pending`): turns never go to writers that no longer exist.
//! * Only a held stripe is released, and the count of waiting lockers never goes below
//!   zero: `assert!`, also in release (O(1) under the shard mutex already taken; a violation
//!   would let two holders write one stripe).

pub(crate) mod plug;

use crate::buf::WriteBuf;
use crate::error::ArrayError;
use futures::channel::oneshot;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::task::{Poll, Waker};

/// Outcome of one attempt at a stripe operation.
pub(crate) enum Attempt<T> {
    Done(T),
    /// A member read failed; the member was failed or excluded for this operation. Plan
    /// again.
    Retry,
}

/// Stripes are assigned to lock-table shards in runs of this many.
const SHARD_RUN_SHIFT: u32 = 3;

/// One piece of a write inside a stripe.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    /// Data chunk index within the stripe.
    pub index: usize,
    /// Offset within the chunk.
    pub chunk_off: u64,
    pub len: u64,
    /// Offset of the bytes in the write's buffer.
    pub src_off: usize,
}

/// A write (or part of one) waiting for its stripe.
pub(crate) struct PendingWrite {
    pub src: WriteBuf,
    pub pieces: Vec<Piece>,
    /// Ends a plugged holder's wait (FUA, zeroing: plug.rs).
    pub urgent: bool,
    pub done: oneshot::Sender<Result<(), ArrayError>>,
}

#[derive(Default)]
struct StripeSlot {
    locked: bool,
    waiters: VecDeque<Waker>,
    pending: Vec<PendingWrite>,
    /// Tasks waiting in `lock` (degraded readers, repairs, mirror rows).
    lockers: usize,
    /// Set by a writer's `unlock` when lockers wait: the lock stays taken and passes to one
    /// of them, so a stream of writers cannot keep a reader out.
    handoff: bool,
    /// Set by a locker's `unlock` when writes are queued: the next turn is theirs, so a
    /// stream of readers cannot keep writers out either.
    writer_turn: bool,
    /// The holder waiting for the rest of the stripe's writes (plug.rs): woken when a write
    /// queues.
    plugged: Option<Waker>,
}

impl StripeSlot {
    /// Drops queued writes whose writer is gone (its future dropped before any holder took
    /// the write: nobody waits for it, so it is not run) and says whether any remain. Else
    /// a locker's release would give the next turn to writers that no longer exist and
    /// every later locker would wait for them.
    fn live_pending(&mut self) -> bool {
        if self.pending.iter().any(|p| p.done.is_canceled()) {
            self.pending.retain(|p| !p.done.is_canceled());
        }
        !self.pending.is_empty()
    }

    /// Registers a waiter's waker once (`reactor::park`; a long hold, a write-back journal's
    /// deferred member writes, once turned the copies into a wake-up storm).
    fn park(&mut self, w: &Waker) {
        crate::reactor::park(&mut self.waiters, w);
    }
}

pub(crate) struct StripeLocks {
    shards: Vec<Mutex<HashMap<u64, StripeSlot>>>,
}

/// What a queued writer found when it woke.
pub(crate) enum Turn<'a> {
    /// Another holder ran our write: its result.
    Done(Result<(), ArrayError>),
    /// We hold the stripe and must run the queued batch.
    Lead(StripeGuard<'a>),
}

/// A held stripe lock (`StripeLocks::lock`, or a writer's `Turn::Lead`): dropping it
/// releases the stripe (`StripeLocks::unlock`), on every path out of the holder, also when
/// its future is dropped.
#[must_use = "dropping the guard releases the stripe at once"]
pub(crate) struct StripeGuard<'a> {
    locks: &'a StripeLocks,
    stripe: u64,
    /// Taken by a writer to run a queued batch (else by a locker).
    by_writer: bool,
}

impl StripeGuard<'_> {
    /// Hands the hold to a task that outlives this borrow (write-back's deferred member
    /// writes): the stripe stays locked until the task turns it back into a guard
    /// (`StripeLocks::resume`) and drops that.
    pub(crate) fn detach(self) -> HeldStripe {
        let held = HeldStripe {
            stripe: self.stripe,
            by_writer: self.by_writer,
        };
        std::mem::forget(self);
        held
    }
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        self.locks.unlock(self.stripe, self.by_writer);
    }
}

/// A stripe hold detached from its guard (`StripeGuard::detach`): the stripe stays locked
/// until `StripeLocks::resume` makes a guard of it again and that guard is dropped.
#[must_use = "the stripe stays locked until this is resumed and the guard dropped"]
pub(crate) struct HeldStripe {
    stripe: u64,
    by_writer: bool,
}

impl StripeLocks {
    pub(crate) fn new(shards: usize) -> StripeLocks {
        StripeLocks {
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn shard(&self, stripe: u64) -> usize {
        ((stripe >> SHARD_RUN_SHIFT) % self.shards.len() as u64) as usize
    }

    fn with_slot<R>(&self, stripe: u64, f: impl FnOnce(&mut StripeSlot) -> R) -> R {
        let mut t = self.shards[self.shard(stripe)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let slot = t.entry(stripe).or_default();
        let r = f(slot);
        if !slot.locked && slot.waiters.is_empty() && !slot.live_pending() && slot.lockers == 0 {
            t.remove(&stripe);
        }
        r
    }

    /// Whether the stripe is locked now (a writer's batch or a locker holds it).
    pub(crate) fn is_locked(&self, stripe: u64) -> bool {
        self.shards[self.shard(stripe)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&stripe)
            .is_some_and(|s| s.locked)
    }

    /// Takes the stripe's lock, held until the guard is dropped. A locker that waits gets
    /// the lock before queued writers the next time it is released.
    pub(crate) async fn lock(&self, stripe: u64) -> StripeGuard<'_> {
        let mut guard = LockerGuard {
            locks: self,
            stripe,
            counted: false,
        };
        std::future::poll_fn(|cx| {
            self.with_slot(stripe, |s| {
                let writers_next = s.writer_turn && s.live_pending();
                if (!s.locked && !writers_next) || (s.handoff && guard.counted) {
                    if guard.counted {
                        assert!(s.lockers > 0, "stripe {stripe}: locker count below zero");
                        s.lockers -= 1;
                        guard.counted = false;
                    }
                    s.handoff = false;
                    s.locked = true;
                    Poll::Ready(StripeGuard {
                        locks: self,
                        stripe,
                        by_writer: false,
                    })
                } else {
                    if !guard.counted {
                        s.lockers += 1;
                        guard.counted = true;
                        // A plugged holder stops waiting for more writes (plug.rs).
                        if let Some(w) = s.plugged.take() {
                            w.wake();
                        }
                    }
                    s.park(cx.waker());
                    Poll::Pending
                }
            })
        })
        .await
    }

    /// A detached hold (`StripeGuard::detach`) as a guard again.
    pub(crate) fn resume(&self, held: HeldStripe) -> StripeGuard<'_> {
        StripeGuard {
            locks: self,
            stripe: held.stripe,
            by_writer: held.by_writer,
        }
    }

    /// Releases the stripe and wakes every waiter (the guard's drop calls it). Every waiter, not just the first: a task
    /// polled again while waiting registers its waker twice, and a stale entry must never
    /// swallow the only wake-up a real waiter gets. Waiters re-check the lock (and queued
    /// writers whether their write was already done).
    /// `by_writer`: the holder ran a write batch (else it took the lock with `lock`). Turns
    /// alternate: after a batch a waiting locker goes first, after a locker queued writes do.
    fn unlock(&self, stripe: u64, by_writer: bool) {
        let waiters = self.with_slot(stripe, |s| {
            assert!(s.locked, "unlock of stripe {stripe}, which is not locked");
            if by_writer && s.lockers > 0 {
                s.handoff = true;
            } else {
                s.writer_turn = !by_writer && s.live_pending();
                s.locked = false;
            }
            std::mem::take(&mut s.waiters)
        });
        for w in waiters {
            w.wake();
        }
    }

    /// Queues a write part on its stripe and waits until either another holder ran it or
    /// this task holds the stripe (then it must `take_batch`, run it and drop the guard).
    pub(crate) async fn queue(
        &self,
        stripe: u64,
        src: WriteBuf,
        pieces: Vec<Piece>,
        urgent: bool,
    ) -> (Turn<'_>, oneshot::Receiver<Result<(), ArrayError>>) {
        let (tx, mut rx) = oneshot::channel();
        // Queue, and take the stripe at once if it is idle (one trip through the table).
        let (lead, plugged) = self.with_slot(stripe, |s| {
            s.pending.push(PendingWrite {
                src,
                pieces,
                urgent,
                done: tx,
            });
            let lead = !s.locked && {
                s.locked = true;
                s.writer_turn = false;
                true
            };
            (lead, s.plugged.take())
        });
        if let Some(w) = plugged {
            w.wake();
        }
        let guard = || {
            Turn::Lead(StripeGuard {
                locks: self,
                stripe,
                by_writer: true,
            })
        };
        if lead {
            return (guard(), rx);
        }
        let turn = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = std::pin::Pin::new(&mut rx).poll(cx) {
                return Poll::Ready(Turn::Done(r.unwrap_or(Err(ArrayError::Shutdown))));
            }
            self.with_slot(stripe, |s| {
                if s.locked {
                    s.park(cx.waker());
                    Poll::Pending
                } else {
                    s.locked = true;
                    s.writer_turn = false;
                    Poll::Ready(guard())
                }
            })
        })
        .await;
        (turn, rx)
    }

    /// Everything queued on the stripe (the holder runs it as one stripe operation).
    pub(crate) fn take_batch(&self, stripe: u64) -> Vec<PendingWrite> {
        self.with_slot(stripe, |s| {
            s.live_pending();
            s.plugged = None;
            std::mem::take(&mut s.pending)
        })
    }

    /// For the holder of `stripe` waiting for the rest of its writes (plug.rs): whether the
    /// writes queued on it fill it from their first byte to its end (its `k` data chunks of
    /// `chunk` bytes in order: a stream that enters the stripe part-way fills it as far as
    /// it can), or an urgent write or a locker waits for it; else `w` is woken when another
    /// write or a locker comes.
    pub(crate) fn plug_check(&self, stripe: u64, k: usize, chunk: u64, w: &Waker) -> PlugCheck {
        self.with_slot(stripe, |s| {
            s.live_pending();
            if s.lockers > 0 || s.pending.iter().any(|p| p.urgent) {
                return PlugCheck::Interrupted;
            }
            let mut runs: Vec<(u64, u64)> = s
                .pending
                .iter()
                .flat_map(|p| p.pieces.iter())
                .map(|p| {
                    let at = p.index as u64 * chunk + p.chunk_off;
                    (at, at + p.len)
                })
                .collect();
            runs.sort_unstable();
            let mut reach = runs.first().map_or(0, |r| r.0);
            for (lo, hi) in runs {
                if lo > reach {
                    break;
                }
                reach = reach.max(hi);
            }
            if !s.pending.is_empty() && reach >= k as u64 * chunk {
                return PlugCheck::Filled;
            }
            match &mut s.plugged {
                Some(old) => old.clone_from(w),
                None => s.plugged = Some(w.clone()),
            }
            PlugCheck::Open
        })
    }
}

/// What a plugged holder found (`StripeLocks::plug_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlugCheck {
    Filled,
    /// Not yet: wait on.
    Open,
    /// An urgent write or a locker waits for the stripe: stop waiting.
    Interrupted,
}

use std::future::Future;

/// Un-counts a locker whose `lock` future is dropped while waiting, releasing a hand-off
/// that was meant for it.
struct LockerGuard<'a> {
    locks: &'a StripeLocks,
    stripe: u64,
    counted: bool,
}

impl Drop for LockerGuard<'_> {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let release = self.locks.with_slot(self.stripe, |s| {
            assert!(
                s.lockers > 0,
                "stripe {}: locker count below zero",
                self.stripe
            );
            s.lockers -= 1;
            s.handoff && s.lockers == 0
        });
        if release {
            self.locks.with_slot(self.stripe, |s| s.handoff = false);
            self.locks.unlock(self.stripe, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut std::task::Context::from_waker(
            futures::task::noop_waker_ref(),
        ))
    }

    /// A writer whose future is dropped while its write is queued behind a locker: when the
    /// locker releases the stripe the turn must not go to that writer (it no longer exists),
    /// or every later locker (a degraded read, a write-back reader) waits forever.
    #[test]
    fn a_dropped_queued_writer_never_holds_the_next_turn() {
        let locks = StripeLocks::new(1);
        let reader = futures::executor::block_on(locks.lock(7));
        let src: WriteBuf = vec![0u8; 512].into();
        let mut w = Box::pin(locks.queue(7, src, Vec::new(), false));
        assert!(
            poll(w.as_mut()).is_pending(),
            "the writer queues behind the locker"
        );
        drop(w);
        drop(reader);
        let mut next = Box::pin(locks.lock(7));
        assert!(
            matches!(poll(next.as_mut()), Poll::Ready(_)),
            "a locker waits for a writer whose future was dropped"
        );
    }
}
