//! Scrub: read every stripe (mirror row), verify its redundancy, and with `repair` fix it
//! (md's check and repair, with raid6check's locating of the bad chunk).
//!
//! Rules (docs/invariants.md, "Scrub blames only a chunk it located"; docs/design/scrub.md):
//! * Each unit is checked under its stripe lock (no write is half done meanwhile), in 4 KiB
//!   columns (`uraid_core::scrub`). A column whose parity disagrees is *located* when the
//!   level has two or more parities (or three or more mirror copies) and exactly one chunk
//!   explains it; the member, its data-area offset and the bytes that differ are reported
//!   (log, events, status, metrics). RAID5 and two-way mirrors report the mismatch without a
//!   culprit.
//! * `repair` rewrites a located chunk with what it should hold; an unlocatable column gets
//!   its parity recomputed from the data (mirrors: the first copy written over the others),
//!   as md's repair does, and is reported as such. `check` writes no mismatch over (it does
//!   rewrite chunks it could not read, below, and resync a stripe not yet in sync first).
//! * Scrub needs every member (a degraded array has no redundancy to check against; rebuild
//!   first): it refuses to start on a degraded array and stops if a member fails. A chunk
//!   that cannot be read (media error) is reconstructed and rewritten by the read path's
//!   error policy (`read_failed`); the unit is then counted unreadable, not verified. A
//!   chunk on a bad-block list is not verified either: the unit is counted (`bad_blocks`)
//!   and `repair` rebuilds it from the others where it can. Scrub adds no entries: a
//!   member's own media error covers a few sectors, an entry a whole chunk.
//! * Throttle: the array's `Throttle`, applied by the walk driver (recovery/walk.rs);
//!   `pause` holds it between batches, `stop` ends it.

use super::walk::{self, After, At, Units, Walk, Worker};
use crate::array::{Array, ArrayError};
use crate::background::{Progress, ScrubMode, ScrubReport};
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::stripe::Attempt;
use futures::future::join_all;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use uraid_core::scrub::{check_copies, check_stripe, Column, COLUMN};
use uraid_core::MemberSet;

/// One unit's outcome.
#[derive(Clone, Default)]
struct UnitResult {
    mismatches: u64,
    located: u64,
    repaired: u64,
    unreadable: bool,
    /// A chunk of the unit is on a bad-block list.
    bad: bool,
    /// Not verified: nothing allocated there.
    skipped: bool,
}

impl<D: BlockDev> Array<D> {
    /// The running (or last) scrub: its mode (None: never ran), counts and progress.
    pub fn scrub_state(
        &self,
    ) -> (
        Option<ScrubMode>,
        ScrubReport,
        crate::recovery::ProgressView,
        bool,
    ) {
        self.recovery().scrub_state()
    }

    /// Pauses (true) or resumes a running scrub between batches.
    pub fn scrub_pause(&self, pause: bool) {
        self.recovery()
            .scrub_counts
            .paused
            .store(pause, Ordering::Release);
    }

    /// Verifies (and with `Repair` fixes) every unit's redundancy while the array serves
    /// (module docs); `stop` ends it early. Runs on any thread (the server gives it its own).
    pub async fn scrub_run(
        self: &Arc<Self>,
        mode: ScrubMode,
        stop: &AtomicBool,
    ) -> Result<ScrubReport, ArrayError> {
        if self.geo().fault_tolerance() == 0 {
            return Err(ArrayError::Refused(format!(
                "{} has no redundancy to check",
                self.geo().level
            )));
        }
        let degraded = self.members().degraded();
        if !degraded.is_empty() {
            return Err(ArrayError::Refused(format!(
                "the array is degraded (member(s) {degraded} missing, failed or rebuilding): \
                 scrub needs every member"
            )));
        }
        let units = self.geo().units();
        self.recovery().scrub_counts.reset(mode);
        let mut w = ScrubWalk {
            name: self.identity().0.to_string(),
            mode,
            units,
            t0: Instant::now(),
        };
        walk::run(self, &mut w, Units::range(0..units), stop).await
    }

    async fn scrub_batch(
        &self,
        batch: &[u64],
        mode: ScrubMode,
    ) -> Vec<Result<UnitResult, ArrayError>> {
        join_all(batch.iter().map(|&unit| async move {
            if self.skippable(unit) {
                return Ok(UnitResult {
                    skipped: true,
                    ..Default::default()
                });
            }
            let _held = self.lock_stripe(unit).await;
            // Checked again under the lock: a first write may have begun filling the unit's
            // granule since (it is not verified until the fill is complete and recorded).
            if self.empty_under_lock(unit) {
                return Ok(UnitResult {
                    skipped: true,
                    ..Default::default()
                });
            }
            self.scrub_unit(unit, mode).await
        }))
        .await
    }

    /// Checks one unit (caller holds its lock); repairs it in `Repair` mode.
    async fn scrub_unit(&self, unit: u64, mode: ScrubMode) -> Result<UnitResult, ArrayError> {
        let g = self.geo();
        let len = g.chunk;
        let degraded = self.members().degraded();
        if !degraded.is_empty() {
            return Err(ArrayError::Unreadable { members: degraded });
        }
        // After an unclean stop, resync's rule comes first (parity from the data, the first
        // mirror copy over the others): a torn write is not a corrupt member.
        self.resync_if_unsynced(unit).await?;
        if g.level.is_parity() && self.recovery().resync.unsynced(unit) {
            // Resync could not read it (a data chunk with a media error): its parity is not
            // verified, so nothing here can be judged or rebuilt from it.
            return Ok(UnitResult {
                unreadable: true,
                ..Default::default()
            });
        }
        // A chunk on a bad-block list holds nothing to verify: the unit is counted, and
        // repair rebuilds it from the others where they can (which takes it off the list).
        let listed = self.bad_at(unit, MemberSet::all(g.members));
        if !listed.is_empty() {
            if mode == ScrubMode::Repair {
                match self.regenerate(unit, MemberSet::EMPTY).await {
                    Ok(()) | Err(ArrayError::Unreadable { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            let left = self.bad_at(unit, MemberSet::all(g.members));
            tracing::warn!(
                target: "uraid_engine::recovery",
                "scrub: unit {unit}: member(s) {listed} have it on their bad-block list{}",
                if mode == ScrubMode::Check {
                    String::new()
                } else if left.is_empty() {
                    "; rebuilt from the others".into()
                } else {
                    format!("; member(s) {left} could not be rebuilt")
                }
            );
            return Ok(UnitResult {
                bad: true,
                ..Default::default()
            });
        }
        // Every chunk of the unit: (member, data-area offset).
        let (chunks, parity): (Vec<(usize, u64)>, bool) = if g.level.is_parity() {
            let at = g.member_offset(unit, 0);
            let mut v: Vec<(usize, u64)> = (0..g.data_chunks())
                .map(|i| (g.data_member(unit, i), at))
                .collect();
            v.extend((0..g.parity()).map(|j| (g.parity_member(unit, j), at)));
            (v, true)
        } else {
            (g.mirror_copies(unit), false)
        };
        let reqs: Vec<(usize, u64, u64)> = chunks.iter().map(|&(m, at)| (m, at, len)).collect();
        let mut excl = MemberSet::EMPTY;
        let bufs: Vec<IoBuf> = match self.read_members(unit, &reqs, &mut excl).await {
            Attempt::Done(b) => b,
            // A read error: the member was failed (the walk stops), or the chunk had a media
            // error: it is rebuilt from the rest of the unit and rewritten (as md's check
            // does), and the unit is counted, not verified.
            Attempt::Retry => {
                let bad = excl.minus(self.members().failed());
                // One that cannot be reconstructed either is left as it is (its other
                // sectors still hold good data) and the walk goes on.
                if !bad.is_empty() {
                    match self.regenerate(unit, bad).await {
                        Ok(()) | Err(ArrayError::Unreadable { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                return Ok(UnitResult {
                    unreadable: true,
                    ..Default::default()
                });
            }
        };
        let refs: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
        let verdicts = if parity {
            check_stripe(self.codec().as_ref().expect("parity codec"), &refs)
        } else {
            check_copies(&refs)
        };
        let mut out = UnitResult::default();
        let mut writes: Vec<(usize, u64, IoBuf)> = Vec::new();
        for (c, v) in verdicts.iter().enumerate() {
            let col = (c * COLUMN) as u64;
            match v {
                Column::Consistent => {}
                Column::Located {
                    shard,
                    good,
                    bytes,
                    first,
                } => {
                    out.mismatches += 1;
                    out.located += 1;
                    let (m, at) = chunks[*shard];
                    tracing::warn!(
                        target: "uraid_engine::recovery",
                        "scrub: unit {unit}: member {m} ({}) data offset {}: {bytes} byte(s) \
                         in the 4 KiB from there differ from what the {} say{}",
                        self.members().name(m).unwrap_or("?"),
                        at + col + *first as u64,
                        if parity { "other chunks and the parity" } else { "other copies" },
                        if mode == ScrubMode::Repair { "; rewritten" } else { "" }
                    );
                    if mode == ScrubMode::Repair {
                        writes.push((m, at + col, buf::copy_of(good)));
                        out.repaired += 1;
                    }
                }
                Column::Unlocatable => {
                    out.mismatches += 1;
                    self.log_unlocatable(unit, mode, &chunks, parity, col);
                    if mode == ScrubMode::Repair {
                        writes.extend(self.column_fix(&chunks, parity, &bufs, col));
                        out.repaired += 1;
                    }
                }
            }
        }
        if !writes.is_empty() {
            self.write_members(writes).await;
            self.check_serving()?;
        }
        Ok(out)
    }

    /// md's repair of a column no single chunk explains: parity recomputed from the data,
    /// or the first mirror copy written over the others.
    fn column_fix(
        &self,
        chunks: &[(usize, u64)],
        parity: bool,
        bufs: &[IoBuf],
        col: u64,
    ) -> Vec<(usize, u64, IoBuf)> {
        let g = self.geo();
        let k = g.data_chunks();
        let end = (col + COLUMN as u64).min(g.chunk);
        if !parity {
            return chunks[1..]
                .iter()
                .map(|&(m, at)| {
                    (
                        m,
                        at + col,
                        buf::copy_of(&bufs[0][col as usize..end as usize]),
                    )
                })
                .collect();
        }
        let data: Vec<&[u8]> = bufs[..k]
            .iter()
            .map(|b| &b[col as usize..end as usize])
            .collect();
        let mut p: Vec<IoBuf> = (0..g.parity())
            .map(|_| buf::alloc((end - col) as usize))
            .collect();
        {
            let mut outp: Vec<&mut [u8]> = p.iter_mut().map(|b| &mut b[..]).collect();
            self.codec()
                .as_ref()
                .expect("parity codec")
                .encode(&data, &mut outp);
        }
        p.into_iter()
            .enumerate()
            .map(|(j, b)| (chunks[k + j].0, chunks[k + j].1 + col, b))
            .collect()
    }

    /// Logs a column whose redundancy disagrees and that no single chunk explains.
    fn log_unlocatable(
        &self,
        unit: u64,
        mode: ScrubMode,
        chunks: &[(usize, u64)],
        parity: bool,
        col: u64,
    ) {
        tracing::warn!(
            target: "uraid_engine::recovery",
            "scrub: unit {unit}: data offset {}: {} disagree and no single member explains it \
             ({}){}",
            chunks[0].1 + col,
            if parity { "parity and data" } else { "mirror copies" },
            if parity && self.geo().parity() < 2 {
                "one parity cannot say which chunk is wrong"
            } else if !parity && chunks.len() < 3 {
                "two copies cannot say which is wrong"
            } else {
                "more than one chunk differs"
            },
            match (mode, parity) {
                (ScrubMode::Check, _) => "",
                (ScrubMode::Repair, true) => "; parity recomputed from the data",
                (ScrubMode::Repair, false) => "; the first copy written over the others",
            }
        );
    }
}

/// The scrub walk (module docs): every unit, checked (and repaired) under its lock.
struct ScrubWalk {
    name: String,
    mode: ScrubMode,
    units: u64,
    t0: Instant,
}

impl<D: BlockDev> Walk<D> for ScrubWalk {
    type Outcome = Result<UnitResult, ArrayError>;
    type Output = Result<ScrubReport, ArrayError>;

    fn progress<'a>(&self, a: &'a Array<D>) -> &'a Progress {
        &a.recovery().scrub_progress
    }

    async fn start(&mut self, a: &Arc<Array<D>>) -> Option<Self::Output> {
        // Repairs are writes: the superblocks say "not clean" first, like any writer. (A
        // check only rewrites chunks with the bytes the rest of the stripe determines, or
        // resyncs units of an array that is not clean on disk already.)
        if self.mode == ScrubMode::Repair
            && a.on_reactor(|a| async move { a.ensure_dirty().await })
                .await
                .is_none()
        {
            return Some(Err(ArrayError::Shutdown));
        }
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': scrub ({}) started over {} units",
            self.name,
            self.mode.name(),
            self.units
        );
        self.t0 = Instant::now();
        None
    }

    fn paused(&self, a: &Array<D>) -> bool {
        a.recovery().scrub_counts.paused.load(Ordering::Acquire)
    }

    async fn stopped(&mut self, a: &Arc<Array<D>>, at: At) -> Self::Output {
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': scrub ({}) cancelled at unit {} of {}",
            self.name,
            self.mode.name(),
            at.next,
            self.units
        );
        Ok(a.recovery().scrub_counts.report())
    }

    fn gone(&self) -> Self::Outcome {
        Err(ArrayError::Shutdown)
    }

    fn worker(&self) -> Worker<D, Self::Outcome> {
        let mode = self.mode;
        walk::worker(move |a, b| async move { a.scrub_batch(&b, mode).await })
    }

    async fn after_batch(
        &mut self,
        a: &Arc<Array<D>>,
        at: At,
        _batch: &[u64],
        outcomes: Vec<Self::Outcome>,
    ) -> After<Self::Output> {
        let counts = &a.recovery().scrub_counts;
        let mut result = Ok(());
        for r in outcomes {
            match r {
                Ok(u) => {
                    counts
                        .units
                        .fetch_add(u64::from(!u.skipped), Ordering::AcqRel);
                    counts.mismatches.fetch_add(u.mismatches, Ordering::AcqRel);
                    counts.located.fetch_add(u.located, Ordering::AcqRel);
                    counts.repaired.fetch_add(u.repaired, Ordering::AcqRel);
                    counts
                        .unreadable
                        .fetch_add(u64::from(u.unreadable), Ordering::AcqRel);
                    counts
                        .bad_blocks
                        .fetch_add(u64::from(u.bad), Ordering::AcqRel);
                }
                Err(e) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        if let Err(e) = result {
            tracing::error!(
                target: "uraid_engine::recovery",
                "array '{}': scrub ({}) stopped at unit {}: {e}",
                self.name,
                self.mode.name(),
                at.next
            );
            return After::End(Err(e));
        }
        a.recovery()
            .scrub_progress
            .repaired
            .store(counts.repaired.load(Ordering::Acquire), Ordering::Release);
        After::Next
    }

    async fn finish(&mut self, a: &Arc<Array<D>>, _at: At) -> Self::Output {
        let r = a.recovery().scrub_counts.report();
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': scrub ({}) finished in {:.1} s: {} units, {} mismatched column(s), {} \
             located, {} repaired, {} unreadable unit(s), {} unit(s) with bad blocks",
            self.name,
            self.mode.name(),
            self.t0.elapsed().as_secs_f64(),
            r.units,
            r.mismatches,
            r.located,
            r.repaired,
            r.unreadable,
            r.bad_blocks
        );
        Ok(r)
    }
}
