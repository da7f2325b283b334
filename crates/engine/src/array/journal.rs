//! The array's use of its journal (journal.rs): attaching it, logging stripe operations,
//! checkpoints, the write-back deferred member writes, and what a FLUSH must do.

use super::Array;
use crate::buf::IoBuf;
use crate::dev::BlockDev;
use crate::journal::{Applied, Deferred, Journal, JournalStatus};
use crate::stripe::{HeldStripe, StripeGuard};
use crate::ArrayError;
use std::sync::Arc;
use uraid_core::format::JournalMode;

/// A deferred record's finish, owned by the task that does it (built before the task is
/// spawned, so a task dropped before its first poll drops it too): dropped before its
/// member writes completed (runtime shutdown), it poisons the journal (the record is
/// replayed). Either way the record leaves the journal's in-flight set, its write-intent
/// region ends, and then the stripe it holds is released.
struct OwnedApplied<D: BlockDev> {
    a: Arc<Array<D>>,
    seq: u64,
    bytes: u64,
    region: Option<u64>,
    held: Option<HeldStripe>,
    done: bool,
}

impl<D: BlockDev> Drop for OwnedApplied<D> {
    fn drop(&mut self) {
        if let Some(j) = self.a.journal.get() {
            j.release(self.seq, self.bytes, self.done);
        }
        self.a.intent.deferred_end(self.region);
        if let Some(h) = self.held.take() {
            drop(self.a.locks.resume(h));
        }
    }
}

/// The background checkpoint slot claimed by `spawn_checkpoint`, released on drop.
struct CheckpointClaim<D: BlockDev>(Arc<Array<D>>);

impl<D: BlockDev> Drop for CheckpointClaim<D> {
    fn drop(&mut self) {
        if let Some(j) = self.0.journal.get() {
            j.checkpoint_finished();
        }
    }
}

impl<D: BlockDev> Array<D> {
    /// The journal, while it is in service.
    pub(crate) fn journal_active(&self) -> Option<&Journal<D>> {
        self.journal.get().filter(|j| j.active())
    }

    /// Whether journal records dropped before their member writes completed wait to be
    /// written again (`Journal::has_orphans`): their stripes may be torn, so no write-intent
    /// bit is cleared meanwhile (and a member failed before they are written again misses
    /// them inside a dirty region, where a re-add rebuilds).
    pub(crate) fn journal_orphans(&self) -> bool {
        self.journal.get().is_some_and(|j| j.has_orphans())
    }

    /// The journal device, if one is attached (tests snapshot it).
    pub fn journal_dev(&self) -> Option<&D> {
        self.journal.get().map(|j| j.dev())
    }

    /// Attaches the journal (after `assemble::replay`). Only parity levels have one.
    pub fn attach_journal(&self, j: Journal<D>) {
        j.set_watched(self.members.policy().io_timeout.is_some());
        if self.geo.level.is_parity() && !self.meta_frozen() {
            let _ = self.journal.set(j);
        }
    }

    /// Logs the member writes of one stripe operation (`Journal::log`) and returns once the
    /// record is durable; starts a background checkpoint when the log is half full.
    pub(crate) async fn journal_log(
        &self,
        writes: &[(usize, u64, IoBuf)],
    ) -> Result<Option<Applied<'_, D>>, ArrayError> {
        let Some(j) = self.journal.get() else {
            return Ok(None);
        };
        let r = j.log(&self.geo, &self.meta, &self.members, writes).await;
        if matches!(r, Ok(Some(_))) && j.half_full() {
            self.spawn_checkpoint();
        }
        r
    }

    fn spawn_checkpoint(&self) {
        let Some(j) = self.journal.get() else { return };
        if !j.claim_checkpoint() {
            return;
        }
        match (&self.rt, self.me.upgrade()) {
            (Some(rt), Some(a)) => {
                rt.run_on(0, move || {
                    // Released also when the task is dropped unfinished (runtime shutdown).
                    let claim = CheckpointClaim(a);
                    crate::reactor::spawn_local(async move {
                        claim.0.journal_checkpoint().await;
                        drop(claim);
                    })
                });
            }
            // No reactors (tests): writers checkpoint when the log is full.
            _ => j.checkpoint_finished(),
        }
    }

    /// Moves the journal's tail past every record whose member writes completed: members
    /// flushed, then the superblock. Returns whether space was freed.
    pub async fn journal_checkpoint(&self) -> bool {
        match self.journal_active() {
            Some(j) => j.checkpoint(&self.geo, &self.meta, &self.members).await,
            None => false,
        }
    }

    /// Before a new device takes failed slot `slot`: the journal's records that wrote the
    /// slot's old member are checkpointed away (`Journal::retire_slot`). Call it once the
    /// failure is durable, without the superblock lock.
    pub(crate) async fn journal_retire_slot(&self, slot: usize) {
        if let Some(j) = self.journal.get() {
            j.retire_slot(slot, &self.geo, &self.meta, &self.members)
                .await;
        }
    }

    /// `Journal::slot_retired` (true without a journal).
    pub(crate) fn journal_slot_retired(&self, slot: usize) -> bool {
        self.journal.get().is_none_or(|j| j.slot_retired(slot))
    }

    /// Locks `stripe` for a stripe operation (every one but the journal-less full-stripe
    /// run); once it holds the lock, a durable record dropped before its member writes
    /// completed (`Journal::orphan`: its stripe may be torn) is written again first, so no
    /// operation reads a torn stripe's parity.
    pub(crate) async fn lock_stripe(&self, stripe: u64) -> StripeGuard<'_> {
        let held = self.locks.lock(stripe).await;
        self.settle_orphans().await;
        held
    }

    /// Completes the records dropped unfinished (`Journal::orphan`), if any: one atomic
    /// load otherwise.
    pub(crate) async fn settle_orphans(&self) {
        if self.journal.get().is_some_and(|j| j.has_orphans()) {
            self.journal_failed_wait().await;
        }
    }

    /// Waits until the switch to bitmap mode is durable (doing it if nobody has).
    pub(crate) async fn journal_failed_wait(&self) {
        if let Some(j) = self.journal.get() {
            j.failed_wait(&self.geo, &self.meta, &self.members).await;
        }
    }

    /// Whether a stripe operation may acknowledge once its record is durable and finish its
    /// member writes in the background: a write-back journal in service, on a reactor (the
    /// background task runs there; without reactors the writes are done inline).
    pub(crate) fn can_defer(&self) -> bool {
        self.journal_active()
            .is_some_and(|j| j.mode() == JournalMode::WriteBack)
            && crate::reactor::local().is_some()
    }

    /// Finishes a deferred stripe operation: its member writes, then the record is done and
    /// the stripe unlocked — in a task of this reactor, so the acknowledged writers return
    /// now. Readers of the stripe wait for the lock meanwhile (`wait_deferred`).
    pub(crate) fn finish_deferred(self: &Arc<Self>, held: HeldStripe, d: Deferred) {
        let (seq, bytes, writes, region) = d.into_parts();
        let mut rec = OwnedApplied {
            a: self.clone(),
            seq,
            bytes,
            region,
            held: Some(held),
            done: false,
        };
        crate::reactor::spawn_local(async move {
            rec.a.write_members(writes).await;
            rec.done = true;
            drop(rec);
        });
    }

    /// Before a read of `stripes` goes to the members: with a write-back journal, a stripe
    /// whose acknowledged writes may still be on their way to the members is locked by their
    /// writer until they arrive; wait for it. (One check of the lock table per stripe; none
    /// without a write-back journal.)
    pub(crate) async fn wait_deferred(&self, stripes: impl Iterator<Item = u64>) {
        let Some(j) = self.journal.get() else { return };
        if j.mode() != JournalMode::WriteBack {
            return;
        }
        let mut last = None;
        for st in stripes {
            if last == Some(st) {
                continue;
            }
            last = Some(st);
            if self.locks.is_locked(st) {
                drop(self.locks.lock(st).await);
            }
        }
    }

    /// Waits until every journalled stripe operation finished its member writes (a clean
    /// stop flushes the members after this).
    pub(crate) async fn journal_drain(&self) {
        if let Some(j) = self.journal.get() {
            j.drain().await;
        }
    }

    /// Bounds write-back's deferred member writes to `bytes` (`Journal::reserve_deferred`;
    /// default `journal::DEFAULT_DEFERRED_LIMIT`). No effect without a journal.
    pub fn set_deferred_limit(&self, bytes: u64) {
        if let Some(j) = self.journal.get() {
            j.set_deferred_limit(bytes);
        }
    }

    /// Journal state for status (None: the array has no journal).
    pub fn journal_status(&self) -> Option<JournalStatus> {
        self.journal.get().map(|j| j.status())
    }

    /// Whether a client FLUSH must flush the members: always without a write-back journal;
    /// with one, only after member writes that bypassed it.
    pub(crate) fn flush_needs_members(&self) -> bool {
        match self.journal_active() {
            Some(j) if j.mode() == JournalMode::WriteBack => self.members.unjournaled_pending(),
            _ => true,
        }
    }
}
