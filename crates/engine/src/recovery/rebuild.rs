//! Rebuild: a new member in a failed slot (`uraid add`) is filled with what it should hold,
//! unit by unit (stripes on parity levels, mirror rows on RAID1/10), while the array serves.
//!
//! Rules (docs/invariants.md, "A rebuilding member is read only below its checkpoint"):
//! * A rebuilding member holds the units below its *checkpoint* (`Members::rebuilt`). Reads
//!   never use it at or above the checkpoint (`Members::stale_at`: the stripe is read as
//!   degraded, reconstructed from the others); writes go to it everywhere (what they write
//!   is correct, and the rebuild rewrites the whole chunk under the stripe lock anyway).
//! * The walk rebuilds each unit under its stripe lock: the chunks the member should hold
//!   are computed from the other members (data decoded, parity encoded from the data) and
//!   written; the checkpoint moves past a batch of units only after every write of the
//!   batch completed, so a reader that sees the new checkpoint finds the data there.
//! * The checkpoint is persisted every `PERSIST_EVERY` in a superblock round, after a
//!   flush of every live member: a checkpoint on disk never covers a unit whose chunk is
//!   not durable, nor a unit skipped as a hole whose map clear (a trim) is not durable on
//!   every member (lost, the bit comes back and the unit would read the new member's
//!   stale bytes). A restart or crash resumes from it (at worst redoing one interval).
//! * When every unit is done the members are flushed (all, as for a checkpoint) and the
//!   new one is recorded active.
//! * The member being written failing ends its rebuild (it is failed as any member is);
//!   another member failing leaves the walk going while the level's tolerance allows; a
//!   unit that cannot be reconstructed (read errors past the tolerance, or a parity unit
//!   not in sync: never decoded) goes on the targets' bad-block lists (array/badblocks.rs)
//!   and the walk goes on; only a full list stops the rebuild with an error, the member
//!   left rebuilding from the last checkpoint.
//! * Units no data was written to (or trimmed: the allocation map) are skipped
//!   (`Array::skippable`): reads there return zeros without touching the members, and the
//!   first write there fills whole stripes on every member, the new one included.
//! * Throttle: the array's `Throttle`, shared with resync and scrub, applied by the walk
//!   driver (recovery/walk.rs).

use super::walk::{self, After, At, Units, Walk, Worker};
use crate::array::{Array, ArrayError};
use crate::background::{Progress, ProgressView};
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::stripe::Attempt;
use futures::future::join_all;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::geometry::Role;
use uraid_core::MemberSet;

/// How often a running rebuild persists its checkpoint.
pub const PERSIST_EVERY: Duration = Duration::from_secs(2);

/// What a rebuild did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RebuildReport {
    /// Units rebuilt by this call (skipped ones included).
    pub units: u64,
    /// Of those, units skipped: nothing allocated there (recovery docs), or every member
    /// behind there a re-added one that holds it (readd.rs).
    pub skipped: u64,
    /// Members that hold every unit now (recorded active).
    pub finished: MemberSet,
}

impl<D: BlockDev> Array<D> {
    /// Members being rebuilt and their checkpoints (units they hold).
    pub fn rebuild_state(&self) -> Vec<(usize, u64)> {
        self.members()
            .rebuilding()
            .iter()
            .map(|i| (i, self.members().rebuilt(i)))
            .collect()
    }

    /// Progress of the running (or last) rebuild.
    pub fn rebuild_progress(&self) -> crate::recovery::ProgressView {
        self.recovery().rebuild_progress.view()
    }

    /// Rebuilds every member that is being rebuilt, from its checkpoint, while the array
    /// serves (module docs); `stop` ends it early with the checkpoint persisted. Runs on
    /// any thread (the server gives it its own).
    pub async fn rebuild(self: &Arc<Self>, stop: &AtomicBool) -> Result<RebuildReport, ArrayError> {
        self.rebuild_with(stop, PERSIST_EVERY).await
    }

    /// `rebuild` persisting the checkpoint every `persist_every` (tests: after every batch).
    pub async fn rebuild_with(
        self: &Arc<Self>,
        stop: &AtomicBool,
        persist_every: Duration,
    ) -> Result<RebuildReport, ArrayError> {
        let mut report = RebuildReport::default();
        let units = self.geo().units();
        let name = self.identity().0.to_string();
        let t0 = Instant::now();
        // A member added while the walk ran (its checkpoint behind the walk) is picked up by
        // the next pass.
        loop {
            let targets = self.members().rebuilding();
            let Some(start) = targets.iter().map(|i| self.members().rebuilt(i)).min() else {
                break;
            };
            if stop.load(Ordering::Acquire) {
                break;
            }
            let mut pass = RebuildPass {
                name: &name,
                units,
                start,
                targets,
                persist_every,
                last_persist: Instant::now(),
                covered: Vec::new(),
                report: &mut report,
                t0,
            };
            let end = if start < units {
                walk::run(self, &mut pass, Units::range(start..units), stop).await
            } else {
                Walk::<D>::finish(
                    &mut pass,
                    self,
                    At {
                        next: units,
                        done: 0,
                    },
                )
                .await
            };
            if let ControlFlow::Break(r) = end {
                return r;
            }
        }
        Ok(report)
    }

    /// Persists the rebuilding members' checkpoints: taken first, then those members
    /// flushed (so everything the checkpoints cover is durable), then a superblock round.
    async fn persist_rebuild_checkpoints(self: &Arc<Self>) {
        let to = self.members().rebuilding_now();
        if to.is_empty() {
            return;
        }
        self.on_reactor(move |a| async move {
            // Every live member, not only the rebuilding ones: units skipped as holes
            // (`skippable`) are covered by the checkpoint only once the map clear that made
            // them holes (a trim: pages written, not flushed) is durable everywhere.
            a.flush_members().await;
            // A slot given another device since: its checkpoint is not this one's (checked
            // again under the superblock lock).
            let keep: Vec<(usize, u64, usize)> = to
                .iter()
                .copied()
                .filter(|t| a.members().generation(t.0) == t.2)
                .collect();
            a.persist_rebuilt(&keep).await;
        })
        .await;
    }

    /// Rebuilds the units of `batch` concurrently, each under its stripe lock.
    async fn rebuild_batch(&self, batch: &[u64]) -> Vec<Result<(), ArrayError>> {
        join_all(batch.iter().map(|&unit| async move {
            if self.skippable(unit) {
                return Ok(());
            }
            // Every member behind here is a re-added one that holds the unit (readd.rs).
            if self.readd_holds(unit) {
                self.count_rebuilt(0, 1);
                return Ok(());
            }
            self.count_rebuilt(1, 0);
            let _held = self.lock_stripe(unit).await;
            match self.regenerate(unit, MemberSet::EMPTY).await {
                // Not reconstructable (read errors past the tolerance, or not in sync): the
                // targets' chunks there go on their bad-block lists and the walk goes on;
                // a full list stops it.
                Err(e @ ArrayError::Unreadable { .. }) if self.check_serving().is_ok() => {
                    let targets = self
                        .members()
                        .rebuilding()
                        .iter()
                        .filter(|&t| !self.members().serves(t, unit))
                        .collect();
                    self.record_bad("rebuild", unit, targets, e)
                }
                r => r,
            }
        }))
        .await
    }

    /// Writes to the members being rebuilt that do not hold `unit` yet, and to the members
    /// in `also` (chunks a scrub could not read), what they should hold there, computed from
    /// the others; chunks on a bad-block list among them are good again once written. A
    /// unit not yet resynced after an unclean stop (only reachable with
    /// `--start-dirty-degraded`, or on mirrors) and holding data is decoded on parity
    /// levels only when a spare parity confirms it (`unsynced_decode_verified`), else a target holding data
    /// there gets `Unreadable` (the rebuild records its chunk bad); when it goes ahead the
    /// live parity members get parity encoded from the data too (resync). `also` comes from scrub, which never calls this on a parity unit still
    /// unsynced (scrub.rs). Caller holds the lock.
    pub(crate) async fn regenerate(&self, unit: u64, also: MemberSet) -> Result<(), ArrayError> {
        let g = self.geo();
        let mut excl = MemberSet::EMPTY;
        loop {
            let failed = self.check_serving()?;
            let targets = self.members().stale_at(unit).union(also).minus(failed);
            if targets.is_empty() {
                return Ok(());
            }
            excl = excl.union(targets);
            let writes = if g.level.is_parity() {
                self.regenerate_parity(unit, targets, failed, &mut excl)
                    .await?
            } else {
                self.regenerate_mirror(unit, targets, failed, &mut excl)
                    .await?
            };
            let Attempt::Done(writes) = writes else {
                continue;
            };
            // A target that fails here is failed like any member (its rebuild ends).
            self.write_members(writes).await;
            // Whole chunks, computed from a unit in sync: any of them on a bad-block list
            // is good again.
            if !self.recovery().resync.unsynced(unit) {
                self.clear_bad_written(unit, targets).await;
            }
            if self.recovery().resync.unsynced(unit)
                && self.members().degraded().minus(targets).is_empty()
                && self.recovery().resync.unreadable(unit).is_empty()
            {
                // Every chunk of the unit was just written consistently (or, on mirrors,
                // copied from the copy reads use and resync keeps).
                if g.level.is_parity() {
                    self.recovery().resync.mark(unit);
                }
            }
            return Ok(());
        }
    }

    /// `regenerate` on a parity level: the chunks of `targets` in `unit`, decoded (data) or
    /// encoded from the data (parity), and on a unit not yet resynced the live parity
    /// members' parity recomputed too. `Retry` when a read failed (`excl` grew).
    async fn regenerate_parity(
        &self,
        unit: u64,
        targets: MemberSet,
        failed: MemberSet,
        excl: &mut MemberSet,
    ) -> Result<Attempt<Vec<(usize, u64, IoBuf)>>, ArrayError> {
        let g = self.geo();
        let len = g.chunk;
        let k = g.data_chunks();
        let want: Vec<usize> = (0..k).collect();
        // The data members whose chunks this attempt decoded rather than read (targets,
        // failed members, survivors whose read failed), as fetch_data saw them: a member
        // failed by another reactor since `failed` was taken is among them.
        let mut decoded_data = MemberSet::EMPTY;
        let mut data = match self
            .fetch_data_noting(unit, 0, len, &want, excl, &mut decoded_data)
            .await?
        {
            Attempt::Done(v) => v,
            Attempt::Retry => return Ok(Attempt::Retry),
        };
        let unsynced = self.recovery().resync.unsynced(unit);
        // Parity is encoded only when a target holds parity here or the unit is resynced
        // too (most units of a rebuilt data member need just the decode).
        let need_parity = unsynced
            || targets
                .iter()
                .any(|t| matches!(g.role(unit, t), Role::Parity(_)));
        let mut parity: Vec<IoBuf> = if need_parity {
            (0..g.parity()).map(|_| buf::alloc(len as usize)).collect()
        } else {
            Vec::new()
        };
        if need_parity {
            let srcs: Vec<&[u8]> = data
                .iter()
                .map(|b| &b.as_ref().expect("fetch_data returns every chunk")[..])
                .collect();
            let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
            let codec = self.codec().as_ref().expect("parity level has a codec");
            codec.encode(&srcs, &mut out);
        }
        let at = g.member_offset(unit, 0);
        let hole = unsynced && !decoded_data.is_empty() && self.recovery().holds_no_data(unit);
        if hole && self.members().unjournaled_pending() {
            // A hole: its reads return zeros whatever the chunks hold, so the decode below
            // needs no check, and the live parity is rewritten from it. But the map clear
            // that made it a hole (a trim) may still be only in the members' caches: lost in
            // a power cut, the bit would come back over parities that now agree on a wrong
            // decode, and a read would serve it. Durable first, unless a flush since already
            // covers every map-page write (the clear was counted when its page write
            // completed, before the bit changed in memory). The bit cannot be set again
            // meanwhile: a fill sets it only after writing this stripe, which needs the
            // stripe lock held here.
            self.flush_members().await;
        }
        if unsynced && !hole && !decoded_data.is_empty() {
            // Not in sync (started dirty and degraded): a data chunk decoded from parity is
            // trusted only if a parity the decode did not need agrees with it, and only for
            // a slot whose device served no reads since the array was last in sync, in
            // this session or an earlier one (`unseen_since_unsynced`; one that did may have
            // served a torn write's new bytes that no parity holds: the parities agreeing
            // on the old ones would change what was read). That holds whether the decoded
            // chunk is written to a target or only feeds the parity encoded for one: parity
            // encoded from a wrong decode and written would make the torn stripe look
            // consistent (simulator seed 29). Where no data was ever written, reads return
            // zeros whatever the chunks hold.
            let unseen = decoded_data
                .iter()
                .all(|t| self.unseen_since_unsynced(t, unit));
            let verified = if unseen {
                self.unsynced_decode_verified(unit, &parity, decoded_data, excl)
                    .await?
            } else {
                Attempt::Done(false)
            };
            match verified {
                Attempt::Retry => return Ok(Attempt::Retry),
                Attempt::Done(true) => {}
                Attempt::Done(false) => {
                    if self.recovery().resync.report_unreadable(unit) {
                        let (lo, hi) = self.unit_volume_range(unit);
                        tracing::error!(
                            target: "uraid_engine::recovery",
                            "stripe {unit} (volume bytes {lo}..{hi}) is in a region marked \
                             dirty and was not resynced, and no spare parity confirms a decode: \
                             member(s) {targets} are not rebuilt there from parity that was not \
                             verified"
                        );
                    }
                    return Err(ArrayError::Unreadable { members: targets });
                }
            }
        }
        let mut extra = Vec::new();
        // Surviving data members whose chunk had to be decoded (a media error met here): on
        // an unsynced unit that decode came from parity that may be wrong, so no parity is
        // made to agree with it and the unit stays unsynced (its reads keep refusing).
        let decoded_survivors: MemberSet = (0..k)
            .map(|i| g.data_member(unit, i))
            .filter(|&m| excl.contains(m) && !targets.contains(m) && !failed.contains(m))
            .collect();
        if unsynced && !decoded_survivors.is_empty() {
            self.recovery()
                .resync
                .note_unreadable(unit, decoded_survivors);
        }
        if unsynced {
            // (Every target holds parity here: data targets were refused above.)
            // Live parity members get the recomputed parity too (resync), unless it was
            // computed from a survivor's decoded chunk.
            for (j, p) in parity
                .iter()
                .enumerate()
                .filter(|_| decoded_survivors.is_empty())
            {
                let pm = g.parity_member(unit, j);
                if !targets.contains(pm) && !failed.contains(pm) {
                    extra.push((pm, at, buf::copy_of(p)));
                }
            }
        }
        let mut parity: Vec<Option<IoBuf>> = parity.into_iter().map(Some).collect();
        let mut w: Vec<(usize, u64, IoBuf)> = targets
            .iter()
            .filter_map(|t| {
                let b = match g.role(unit, t) {
                    Role::Data(i) => data[i].take(),
                    Role::Parity(j) => parity[j].take(),
                };
                b.map(|b| (t, at, b))
            })
            .collect();
        w.extend(extra);
        Ok(Attempt::Done(w))
    }

    /// Whether the data decoded for an unsynced `unit` (the chunks of `decoded`), whose
    /// parity encoded from it is `parity`, is confirmed: one data chunk decoded at most, at
    /// least one live parity chunk more, and every live parity chunk equal to the one
    /// encoded. A torn stripe then disagrees with a parity the decode did
    /// not use. With two data chunks decoded a torn write can pass (`Array::verify_unsynced`
    /// says why; resync.rs `a_torn_write_never_passes_the_spare_parity_check`). `Retry`
    /// when a parity read failed (`excl` grew); the array's failure if it no longer serves.
    async fn unsynced_decode_verified(
        &self,
        unit: u64,
        parity: &[IoBuf],
        decoded: MemberSet,
        excl: &mut MemberSet,
    ) -> Result<Attempt<bool>, ArrayError> {
        let g = self.geo();
        // Members whose parity chunk cannot confirm anything, taken now: another reactor
        // may have failed one since the caller's snapshot, or a device been put into a
        // failed slot (it lacks the unit).
        let gone = self
            .check_serving()?
            .union(*excl)
            .union(self.members().stale_at(unit));
        let decoded = decoded.len();
        let live: Vec<usize> = (0..g.parity())
            .filter(|&j| !gone.contains(g.parity_member(unit, j)))
            .collect();
        if decoded > 1 || live.len() <= decoded {
            return Ok(Attempt::Done(false));
        }
        let at = g.member_offset(unit, 0);
        let reqs: Vec<(usize, u64, u64)> = live
            .iter()
            .map(|&j| (g.parity_member(unit, j), at, g.chunk))
            .collect();
        Ok(match self.read_members(unit, &reqs, excl).await {
            Attempt::Retry => Attempt::Retry,
            Attempt::Done(held) => {
                Attempt::Done(live.iter().zip(held).all(|(&j, h)| h[..] == parity[j][..]))
            }
        })
    }

    /// `regenerate` on a mirror level: the first live copy, read, written to `targets`. On a
    /// unit not in sync, a copy other than the first (the one resync keeps) is used only if
    /// the first copy's slot served no reads of it since the array was last in sync
    /// (`unseen_since_unsynced`); else the targets get `Unreadable` (recorded bad).
    async fn regenerate_mirror(
        &self,
        unit: u64,
        targets: MemberSet,
        failed: MemberSet,
        excl: &mut MemberSet,
    ) -> Result<Attempt<Vec<(usize, u64, IoBuf)>>, ArrayError> {
        let g = self.geo();
        let copies = g.mirror_copies(unit);
        let Some(&(src, base)) = copies
            .iter()
            .find(|(m, _)| !failed.contains(*m) && !excl.contains(*m))
        else {
            return Err(ArrayError::Unreadable { members: *excl });
        };
        let first = copies[0].0;
        if src != first && self.recovery().resync.unsynced(unit) {
            if !self.unseen_since_unsynced(first, unit) {
                return Err(ArrayError::Unreadable { members: targets });
            }
            if self.meta().absent().contains(first) {
                self.meta().record_absent_failed(self.members()).await;
            }
        }
        let b = match self.read_members(unit, &[(src, base, g.chunk)], excl).await {
            Attempt::Done(mut v) => v.pop().expect("one read"),
            Attempt::Retry => return Ok(Attempt::Retry),
        };
        Ok(Attempt::Done(
            copies
                .iter()
                .filter(|(m, _)| targets.contains(*m))
                .map(|&(m, base)| (m, base, buf::copy_of(&b)))
                .collect(),
        ))
    }
}

/// One pass of the rebuild walk (module docs): from the lowest checkpoint of the members
/// being rebuilt to the end. `Break` ends the rebuild with its result; `Continue` goes on
/// to the next pass (members added behind the walk).
struct RebuildPass<'r> {
    name: &'r str,
    units: u64,
    start: u64,
    /// The members being rebuilt when the pass began.
    targets: MemberSet,
    persist_every: Duration,
    last_persist: Instant,
    /// The members the running batch brings forward, with their devices' generations.
    covered: Vec<(usize, usize)>,
    report: &'r mut RebuildReport,
    /// When the rebuild began.
    t0: Instant,
}

type PassEnd = ControlFlow<Result<RebuildReport, ArrayError>>;

impl<D: BlockDev> Walk<D> for RebuildPass<'_> {
    type Outcome = Result<(), ArrayError>;
    type Output = PassEnd;

    fn progress<'a>(&self, a: &'a Array<D>) -> &'a Progress {
        &a.recovery().rebuild_progress
    }

    async fn start(&mut self, _a: &Arc<Array<D>>) -> Option<PassEnd> {
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': rebuilding member(s) {} from unit {} of {}",
            self.name,
            self.targets,
            self.start,
            self.units
        );
        None
    }

    async fn check(&mut self, a: &Arc<Array<D>>, at: At) -> Option<PassEnd> {
        if a.members().rebuilding().is_empty() {
            // Every member being rebuilt failed: nothing left to do.
            return Some(self.finish(a, at).await);
        }
        None
    }

    async fn stopped(&mut self, a: &Arc<Array<D>>, at: At) -> PassEnd {
        a.persist_rebuild_checkpoints().await;
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': rebuild stopped at unit {} of {}; it resumes from its checkpoint at \
             the next start",
            self.name,
            at.next,
            self.units
        );
        ControlFlow::Break(Ok(*self.report))
    }

    fn gone(&self) -> Self::Outcome {
        Err(ArrayError::Shutdown)
    }

    fn worker(&self) -> Worker<D, Self::Outcome> {
        walk::worker(|a, b| async move { a.rebuild_batch(&b).await })
    }

    /// The members this batch brings forward: rebuilding from at most its first unit, with
    /// the device they have now (one added or replaced during the batch is not).
    fn before_batch(&mut self, a: &Array<D>, batch: &[u64]) {
        let next = batch.first().copied().unwrap_or(self.units);
        self.covered = a
            .members()
            .rebuilding_now()
            .into_iter()
            .filter(|&(_, r, _)| r >= next)
            .map(|(t, _, gen)| (t, gen))
            .collect();
    }

    async fn after_batch(
        &mut self,
        a: &Arc<Array<D>>,
        at: At,
        batch: &[u64],
        outcomes: Vec<Self::Outcome>,
    ) -> After<PassEnd> {
        if let Some((unit, e)) = batch
            .iter()
            .zip(outcomes)
            .find_map(|(&u, r)| r.err().map(|e| (u, e)))
        {
            a.persist_rebuild_checkpoints().await;
            tracing::error!(
                target: "uraid_engine::recovery",
                "array '{}': rebuild stopped at unit {unit}: {e}; member(s) {} stay \
                 rebuilding from their last checkpoint",
                self.name,
                a.members().rebuilding()
            );
            return After::End(ControlFlow::Break(Err(e)));
        }
        // Only members whose checkpoint the walk had reached before the batch move, and
        // only if they still have the same device (one added behind the walk, or during
        // the batch, keeps its own).
        let end = at.next + batch.len() as u64;
        for &(t, gen) in &self.covered {
            a.members().set_rebuilt_for(t, gen, end);
        }
        self.report.units += batch.len() as u64;
        After::Next
    }

    async fn checkpoint(&mut self, a: &Arc<Array<D>>) {
        if self.last_persist.elapsed() >= self.persist_every {
            self.last_persist = Instant::now();
            a.persist_rebuild_checkpoints().await;
        }
    }

    fn log_progress(&self, _a: &Array<D>, v: &ProgressView) {
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': rebuild {:.1}% ({} of {} units), {:.1} MB/s, ETA {}",
            self.name,
            v.fraction * 100.0,
            v.done,
            v.total,
            v.bytes_per_second / 1e6,
            v.eta_seconds.map_or("unknown".into(), |s| format!("{s:.0} s"))
        );
    }

    fn worked(&mut self, a: &Array<D>, batch: &[u64]) -> usize {
        let worked = batch
            .iter()
            .filter(|&&u| !a.skippable(u) && !a.readd_holds(u))
            .count();
        self.report.skipped += (batch.len() - worked) as u64;
        worked
    }

    /// Every unit is on the members that reached the end: durable first, then active.
    async fn finish(&mut self, a: &Arc<Array<D>>, _at: At) -> PassEnd {
        let units = self.units;
        let done_gens: Vec<(usize, usize)> = a
            .members()
            .rebuilding_now()
            .into_iter()
            .filter(|&(_, r, _)| r >= units)
            .map(|(t, _, gen)| (t, gen))
            .collect();
        let done: MemberSet = done_gens.iter().map(|d| d.0).collect();
        if done.is_empty() {
            // None reached the end: the next pass (if any member is still rebuilding).
            return ControlFlow::Continue(());
        }
        if a.on_reactor(move |a| async move {
            // Every live member (as for a checkpoint): skipped holes stay holes.
            a.flush_members().await;
            for &(t, gen) in &done_gens {
                if !a.members().is_failed(t) {
                    a.members().rebuild_done_for(t, gen);
                }
            }
            a.persist_rebuilt(&[]).await;
        })
        .await
        .is_none()
        {
            return ControlFlow::Break(Err(ArrayError::Shutdown));
        }
        // Units it resynced on the way (after an unclean stop) may have been the last.
        a.finish_resync(false).await;
        let finished = done.minus(a.members().failed());
        self.report.finished = self.report.finished.union(finished);
        if !finished.is_empty() {
            tracing::info!(
                target: "uraid_engine::recovery",
                "array '{}': rebuild of member(s) {finished} finished in {:.1} s: the array is {}",
                self.name,
                self.t0.elapsed().as_secs_f64(),
                if a.members().degraded().is_empty() {
                    "fully redundant again"
                } else {
                    "still degraded"
                }
            );
        }
        ControlFlow::Continue(())
    }
}
