//! The array's use of the bad-block lists (uraid_core::badblocks, kept in `Members`):
//! recording a unit a rebuild, replace or repair could not produce, and clearing one a
//! write rewrote whole.
//!
//! Rules (docs/invariants.md, "A bad block reads as an error until it is written"):
//! * A member's chunk on the list is behind there (`Members::at`): never read, served by
//!   reconstruction from the others or EIO, always written.
//! * Recorded in memory before the walk's checkpoint moves past the unit, so every round
//!   that writes the checkpoint writes the entry (the caller holds the stripe lock).
//! * Cleared only after the whole chunk was written and that member flushed, then a round
//!   is written before the write is acknowledged: a crash can leave a rewritten chunk still
//!   listed (it reads as an error until written again), never a chunk listed "good" that
//!   was not written.

use super::{Array, ArrayError};
use crate::dev::BlockDev;
use uraid_core::MemberSet;

impl<D: BlockDev> Array<D> {
    /// The members of `set` whose chunk of `unit` is on their bad-block list.
    pub(crate) fn bad_at(&self, unit: u64, set: MemberSet) -> MemberSet {
        let bad = self.members().bad_members();
        set.iter()
            .filter(|&i| bad.contains(i) && self.members().is_bad(i, unit))
            .collect()
    }

    /// `what` (a rebuild, replace or repair) could not produce `unit` for `targets` (`err`:
    /// why): their chunks there are recorded bad, so the walk can go on. `Err(err)` when the
    /// list is full (the walk stops as it did before there were lists). Caller holds the
    /// unit's stripe lock.
    pub(crate) fn record_bad(
        &self,
        what: &str,
        unit: u64,
        targets: MemberSet,
        err: ArrayError,
    ) -> Result<(), ArrayError> {
        let targets = targets.minus(self.members().failed());
        for t in targets.iter() {
            if self.members().mark_bad(t, unit).is_err() {
                tracing::error!(
                    target: "uraid_engine::recovery",
                    "{what}: unit {unit} cannot be produced for member {t} ({err}) and its \
                     bad-block list is full ({} ranges)",
                    uraid_core::badblocks::MAX_BAD_RANGES
                );
                return Err(err);
            }
        }
        let (lo, hi) = self.unit_volume_range(unit);
        tracing::error!(
            target: "uraid_engine::recovery",
            "{what}: unit {unit} (volume bytes {lo}..{hi}) cannot be produced for member(s) \
             {targets} ({err}): recorded as bad blocks; reads there that need those chunks \
             fail until the range is written"
        );
        Ok(())
    }

    /// Volume bytes unit `unit` holds data of (a stripe's data, a mirror row's chunk).
    pub(crate) fn unit_volume_range(&self, unit: u64) -> (u64, u64) {
        let sdb = self.geo().stripe_data_bytes();
        (unit * sdb, (unit + 1) * sdb)
    }

    /// The whole chunks of `unit` on `written` were just written with valid data: those on
    /// a bad-block list are flushed, taken off it, and the lists recorded in a superblock
    /// round (module rules). Caller holds the unit's stripe lock.
    pub(crate) async fn clear_bad_written(&self, unit: u64, written: MemberSet) {
        let cands = self.bad_at(unit, written);
        if cands.is_empty() {
            return;
        }
        let flushed: MemberSet = self
            .each_live(cands, |i| self.members().flush(i))
            .await
            .into_iter()
            .map(|(i, ())| i)
            .collect();
        let mut cleared = MemberSet::EMPTY;
        for i in flushed.iter() {
            if self.members().clear_bad(i, unit) {
                cleared = cleared.with(i);
            }
        }
        if cleared.is_empty() {
            return;
        }
        self.meta.persist_bad(&self.members).await;
        let (lo, hi) = self.unit_volume_range(unit);
        tracing::info!(
            target: "uraid_engine::recovery",
            "unit {unit} (volume bytes {lo}..{hi}) written: no longer a bad block on member(s) \
             {cleared}"
        );
    }

    /// Every member's bad-block list as it is now (status, tests).
    pub fn bad_blocks(&self) -> uraid_core::badblocks::BadBlocks {
        self.members().bad_blocks()
    }
}
