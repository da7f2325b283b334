//! Resync: after an unclean stop, parity (and mirror copies) may disagree with the data of
//! stripes that were being written at the cut — the RAID write hole. Resync walks every
//! stripe under its stripe lock and rewrites parity computed from the data (mirrors: the
//! first live copy over the others), while the array serves.
//!
//! Rules (docs/invariants.md, "Unsynced stripes are resynced before the array is clean"):
//! * Until resync has passed a stripe, that stripe is *unsynced*. A client write into an
//!   unsynced stripe resyncs it first, under the same lock hold (`stripe_write`,
//!   `write_plain`), so no write builds parity on top of an inconsistent stripe; the stripe
//!   is then marked synced and the walker skips it.
//! * Reads on a healthy array never wait for resync (they take no stripe lock).
//! * Without a write-intent bitmap every stripe is walked, and progress is not persisted: a
//!   restart resyncs again; with one, only the dirty regions' stripes (bitmap.rs).
//! * Resync needs every member: a member that fails during resync stops it (the unsynced
//!   stripes' parity is then not trustworthy for reconstruction; logged as an error). A
//!   chunk that cannot be read (media error) leaves its stripe unsynced, logged; the walk
//!   goes on, and the array stays "not clean".
//! * Throttle: the array's `Throttle`, shared with rebuild and scrub, applied by the walk
//!   driver (recovery/walk.rs). The walk runs on its own thread, so sleeping is the
//!   throttle; the stripe work itself goes to the array's reactors, `BATCH` stripes on each
//!   at once (io_uring, member timeouts), or runs inline on an array without reactors
//!   (tests).
//! * The resync of one stripe (`Array::resync_unit`) is array/resync.rs: writes use it too.
//! * Mirror rows not yet resynced are read from their first copy (the one resync copies
//!   over the others), so a read never changes without a write (md's choose_first).

use super::walk::{self, After, At, Units, Walk, Worker};
use crate::array::{Array, ArrayError};
use crate::background::{Progress, ProgressView};
use crate::dev::BlockDev;
use futures::future::join_all;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What a finished resync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResyncReport {
    /// Stripes (mirror rows) walked by resync itself.
    pub stripes: u64,
    /// Of those, stripes whose parity or copies were rewritten.
    pub repaired: u64,
    /// Stripes that client writes had already resynced.
    pub skipped: u64,
    /// Stripes left unsynced because a chunk could not be read (media errors).
    pub unreadable: u64,
    /// Stripes left to the rebuild: a member being rebuilt does not hold them yet (the
    /// rebuild resyncs them as it passes).
    pub deferred: u64,
}

impl<D: BlockDev> Array<D> {
    /// Walks every stripe not yet synced, under its stripe lock, with the array's throttle;
    /// `stop` ends it early (the array stays "resync pending"). Runs on any
    /// thread (the server gives it its own). Progress in `recovery_progress()`.
    pub async fn resync(self: &Arc<Self>, stop: &AtomicBool) -> Result<ResyncReport, ArrayError> {
        let due = self.recovery().resync.due_ranges().to_vec();
        let mut w = ResyncWalk {
            name: self.identity().0.to_string(),
            units: self.recovery().resync.due_units(),
            report: ResyncReport::default(),
            t0: Instant::now(),
        };
        walk::run(self, &mut w, Units::new(due), stop).await
    }

    /// Resyncs the units of `batch` that are still unsynced, concurrently, each under its
    /// stripe lock (no task holds two). Per unit: None if writes had resynced it already.
    async fn resync_batch(&self, batch: &[u64]) -> Vec<Option<Result<Option<bool>, ArrayError>>> {
        join_all(batch.iter().map(|&unit| async move {
            if !self.recovery().resync.unsynced(unit) {
                return None;
            }
            let _held = self.lock_stripe(unit).await;
            if self.recovery().resync.unsynced(unit) {
                let r = self.resync_unit(unit).await;
                if let Ok(Some(_)) = r {
                    self.recovery().resync.mark(unit);
                }
                Some(r)
            } else {
                None
            }
        }))
        .await
    }

    /// Stripes whose degraded reads were refused because their parity was not resynced
    /// after an unclean stop (each logged once with its volume range).
    pub fn unsynced_stripes_refused(&self) -> u64 {
        self.recovery().resync.unreadable_reported()
    }

    /// Stripes not yet resynced that the members present showed intact (served).
    pub fn unsynced_stripes_verified(&self) -> u64 {
        self.recovery().resync.verified()
    }

    /// Progress of the array's background operation (resync).
    pub fn recovery_progress(&self) -> crate::recovery::ProgressView {
        self.recovery().resync_progress.view()
    }
}

impl<D: BlockDev> Array<D> {
    /// Used by tests: resyncs one unit under its lock, as the walk does.
    #[doc(hidden)]
    pub async fn resync_unit_for_test(&self, unit: u64) {
        self.ensure_dirty().await;
        let _held = self.lock_stripe(unit).await;
        if let Ok(Some(_)) = self.resync_unit(unit).await {
            self.recovery().resync.mark(unit);
        }
    }

    /// Used by tests to see a stripe's state.
    #[doc(hidden)]
    pub fn stripe_unsynced(&self, unit: u64) -> bool {
        self.recovery().resync.unsynced(unit)
    }
}

/// The resync walk (module docs): the due units, each resynced under its lock unless a
/// write did it first.
struct ResyncWalk {
    name: String,
    /// Units due.
    units: u64,
    report: ResyncReport,
    t0: Instant,
}

/// One unit's outcome: None if writes had resynced it already.
type Resynced = Option<Result<Option<bool>, ArrayError>>;

impl<D: BlockDev> Walk<D> for ResyncWalk {
    type Outcome = Resynced;
    type Output = Result<ResyncReport, ArrayError>;

    fn progress<'a>(&self, a: &'a Array<D>) -> &'a Progress {
        &a.recovery().resync_progress
    }

    async fn start(&mut self, a: &Arc<Array<D>>) -> Option<Self::Output> {
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': resync started: {} of {} stripes ({}): it was not stopped cleanly",
            self.name,
            self.units,
            a.geo().units(),
            if a.intent().enabled() {
                "the regions the write-intent bitmap marks dirty"
            } else {
                "no write-intent bitmap"
            }
        );
        // Resync writes: the superblocks say "not clean" already (that is why it runs), and
        // marking the session dirty lets a clean stop after it finishes record "clean". On a
        // reactor when there are any: the first write's metadata I/O gets member timeouts.
        a.on_reactor(|a| async move { a.ensure_dirty().await })
            .await;
        self.t0 = Instant::now();
        None
    }

    async fn stopped(&mut self, a: &Arc<Array<D>>, at: At) -> Self::Output {
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': resync stopped after {} of {} stripes; {}",
            self.name,
            at.done,
            self.units,
            if a.intent().enabled() {
                "regions it finished are cleared from the bitmap and not redone"
            } else {
                "without a write-intent bitmap it starts over next time"
            }
        );
        Ok(self.report)
    }

    fn gone(&self) -> Resynced {
        Some(Err(ArrayError::Shutdown))
    }

    fn worker(&self) -> Worker<D, Resynced> {
        walk::worker(|a, b| async move { a.resync_batch(&b).await })
    }

    async fn after_batch(
        &mut self,
        a: &Arc<Array<D>>,
        at: At,
        batch: &[u64],
        outcomes: Vec<Resynced>,
    ) -> After<Self::Output> {
        let report = &mut self.report;
        for (&unit, r) in batch.iter().zip(outcomes) {
            match r {
                Some(Ok(Some(repaired))) => {
                    report.stripes += 1;
                    if repaired {
                        report.repaired += 1;
                        a.recovery()
                            .resync_progress
                            .repaired
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some(Ok(None)) => report.unreadable += 1,
                // A member being rebuilt does not hold the unit yet.
                Some(Err(ArrayError::Unreadable { .. })) if a.check_serving().is_ok() => {
                    report.deferred += 1
                }
                Some(Err(e)) => {
                    tracing::error!(
                        target: "uraid_engine::recovery",
                        "array '{}': resync stopped at stripe {unit} ({} of {} done): {e}; \
                         parity of the stripes left was not verified: reads that would \
                         reconstruct data there fail instead",
                        self.name,
                        at.done,
                        self.units
                    );
                    return After::End(Err(e));
                }
                None => report.skipped += 1,
            }
        }
        After::Next
    }

    fn log_progress(&self, _a: &Array<D>, v: &ProgressView) {
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': resync {:.1}% ({} of {} stripes), {:.1} MB/s, {} repaired, ETA {}",
            self.name,
            v.fraction * 100.0,
            v.done,
            v.total,
            v.bytes_per_second / 1e6,
            v.repaired,
            v.eta_seconds.map_or("unknown".into(), |s| format!("{s:.0} s"))
        );
    }

    /// Every unit a resync visits costs its reads (units writes resynced included).
    fn worked(&mut self, _a: &Array<D>, batch: &[u64]) -> usize {
        batch.len()
    }

    async fn finish(&mut self, a: &Arc<Array<D>>, _at: At) -> Self::Output {
        let report = self.report;
        let secs = self.t0.elapsed().as_secs_f64();
        if report.unreadable > 0 {
            // Still due: the superblocks stay "not clean" and the next start tries again.
            tracing::error!(
                target: "uraid_engine::recovery",
                "array '{}': resync walked every stripe in {secs:.1} s but {} could not be \
                 read (media errors) and stay unsynced: losing a member would rebuild wrong \
                 data there",
                self.name,
                report.unreadable
            );
            return Ok(report);
        }
        if report.deferred > 0 {
            tracing::info!(
                target: "uraid_engine::recovery",
                "array '{}': resync walked every stripe in {secs:.1} s and left {} to the \
                 rebuild (a member being rebuilt does not hold them yet; it resyncs them as \
                 it passes)",
                self.name,
                report.deferred
            );
            a.finish_resync(false).await;
            return Ok(report);
        }
        a.finish_resync(true).await;
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{}': resync finished in {secs:.2} s: {} stripes checked, {} repaired, {} \
             already resynced by writes",
            self.name,
            report.stripes,
            report.repaired,
            report.skipped
        );
        Ok(report)
    }
}
