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
//! * Throttle: the array's `Throttle` (recovery/mod.rs), shared with rebuild and scrub.
//!   The walk runs on its own thread, so sleeping is the throttle; the stripe work itself goes to the array's
//!   reactors, `BATCH` stripes on each at once (io_uring, member timeouts), or runs inline
//!   on an array without reactors (tests).
//! * Mirror rows not yet resynced are read from their first copy (the one resync copies
//!   over the others), so a read never changes without a write (md's choose_first).

use crate::array::{Array, ArrayError};
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::recovery::BATCH;
use crate::stripe::Attempt;
use futures::future::join_all;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::MemberSet;

/// How often a running resync logs its progress (the server log; status has it live).
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

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
    /// Whether this array needs a resync (assembled after an unclean stop, level with
    /// redundancy) that has not finished.
    pub fn needs_resync(&self) -> bool {
        self.recovery().resync.is_pending()
    }

    /// Resyncs `unit` if it is still unsynced. Caller holds its stripe lock (a client write
    /// about to update the stripe). Whenever the stripe cannot be resynced — the array is
    /// degraded (started dirty and degraded on purpose, or a member failed, also during this
    /// call), or a data chunk has a media error — the write goes ahead as it would on a
    /// degraded stripe: never an error the write would not have had otherwise. A stripe with
    /// an unreadable data chunk is not retried by writes (each retry would spend the member's
    /// read-error budget); the walk reports it.
    pub(crate) async fn resync_if_unsynced(&self, unit: u64) -> Result<(), ArrayError> {
        if !self.recovery().resync.unsynced(unit)
            || !self.members().stale_at(unit).is_empty()
            || self.recovery().resync.given_up(unit)
        {
            return Ok(());
        }
        match self.resync_unit(unit).await {
            Ok(Some(repaired)) => {
                if repaired {
                    self.recovery()
                        .resync_progress
                        .repaired
                        .fetch_add(1, Ordering::Relaxed);
                }
                self.recovery().resync.mark(unit);
            }
            Ok(None) => self.recovery().resync.give_up(unit),
            Err(_) => {}
        }
        Ok(())
    }

    /// Makes one stripe consistent: parity computed from the data, or every mirror copy
    /// equal to the first readable one. A parity chunk or mirror copy with a media error is
    /// simply rewritten (which repairs the sector). `Some(true)` if anything was rewritten;
    /// `None` if no trustworthy source could be read (a data chunk, or every copy, has a
    /// media error: the stripe stays unsynced). `Err` when the array lost a member (resync
    /// needs all of them). Caller holds the lock.
    async fn resync_unit(&self, unit: u64) -> Result<Option<bool>, ArrayError> {
        let g = self.geo();
        let len = g.chunk;
        let mut excl = MemberSet::EMPTY;
        for _ in 0..8 {
            self.check_serving()?;
            // Resync needs every member's chunk of the unit (one being rebuilt holds it
            // once the rebuild passed it).
            let stale = self.members().stale_at(unit);
            if !stale.is_empty() {
                return Err(ArrayError::Unreadable { members: stale });
            }
            let unreadable = |why: &str| {
                tracing::error!(
                    target: "uraid_engine::recovery",
                    "resync: stripe {unit}: media error on member(s) {excl} ({why}); left unsynced"
                );
                Ok(None)
            };
            // Members to read: every one but those with a media error in this stripe.
            let (members, at): (Vec<(usize, u64)>, u64) = if g.level.is_parity() {
                let at = g.member_offset(unit, 0);
                let k = g.data_chunks();
                if (0..k).any(|i| excl.contains(g.data_member(unit, i))) {
                    return unreadable("a data chunk");
                }
                let mut v: Vec<(usize, u64)> =
                    (0..k).map(|i| (g.data_member(unit, i), at)).collect();
                v.extend((0..g.parity()).map(|j| (g.parity_member(unit, j), at)));
                (v, at)
            } else {
                (g.mirror_copies(unit), 0)
            };
            let reqs: Vec<_> = members
                .iter()
                .filter(|(m, _)| !excl.contains(*m))
                .map(|&(m, base)| (m, base, len))
                .collect();
            if reqs.is_empty() {
                return unreadable("every copy");
            }
            let mut bufs = match self.read_members(&reqs, &mut excl).await {
                Attempt::Done(b) => b.into_iter(),
                Attempt::Retry => continue,
            };
            // Per member in `members`: what it holds, None if it has a media error.
            let held: Vec<Option<IoBuf>> = members
                .iter()
                .map(|(m, _)| if excl.contains(*m) { None } else { bufs.next() })
                .collect();
            let writes: Vec<(usize, u64, IoBuf)> = if g.level.is_parity() {
                let k = g.data_chunks();
                let mut parity: Vec<IoBuf> =
                    (0..g.parity()).map(|_| buf::alloc(len as usize)).collect();
                {
                    let data: Vec<&[u8]> = held[..k]
                        .iter()
                        .map(|b| &b.as_ref().expect("data chunks were read")[..])
                        .collect();
                    let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
                    let codec = self.codec().as_ref().expect("parity level has a codec");
                    codec.encode(&data, &mut out);
                }
                parity
                    .into_iter()
                    .enumerate()
                    .filter(|(j, p)| held[k + j].as_ref().is_none_or(|h| h[..] != p[..]))
                    .map(|(j, p)| (g.parity_member(unit, j), at, p))
                    .collect()
            } else {
                let src = held.iter().flatten().next().expect("a copy was read");
                members
                    .iter()
                    .zip(&held)
                    .filter(|(_, h)| h.as_ref().is_none_or(|h| h[..] != src[..]))
                    .map(|(&(m, base), _)| (m, base, buf::copy_of(src)))
                    .collect()
            };
            let repaired = !writes.is_empty();
            self.write_members(writes).await;
            return Ok(Some(repaired));
        }
        Ok(None)
    }

    /// Walks every stripe not yet synced, under its stripe lock, with the array's throttle;
    /// `stop` ends it early (the array stays "resync pending"). Runs on any
    /// thread (the server gives it its own). Progress in `recovery_progress()`.
    pub async fn resync(self: &Arc<Self>, stop: &AtomicBool) -> Result<ResyncReport, ArrayError> {
        let p = &self.recovery().resync_progress;
        let units = self.recovery().resync.due_units();
        let due = self.recovery().resync.due.clone();
        p.total.store(units, Ordering::Release);
        p.done.store(0, Ordering::Release);
        p.start();
        let unit_bytes = p.unit_bytes;
        let (name, _, _) = self.identity();
        let of = self.geo().units();
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{name}': resync started: {units} of {of} stripes ({}): it was not stopped cleanly",
            if self.intent().enabled() {
                "the regions the write-intent bitmap marks dirty"
            } else {
                "no write-intent bitmap"
            }
        );
        // Resync writes: the superblocks say "not clean" already (that is why it runs), and
        // marking the session dirty lets a clean stop after it finishes record "clean". On a
        // reactor when there are any: the first write's metadata I/O gets member timeouts.
        self.on_reactor(|a| async move { a.ensure_dirty().await })
            .await;
        let mut report = ResyncReport::default();
        let t0 = Instant::now();
        let mut pacer = self.pacer(unit_bytes);
        let mut last_log = Instant::now();
        let mut todo = due.into_iter().flatten();
        let mut n = 0u64;
        let lanes = self.rt().as_ref().map_or(1, |rt| rt.reactors());
        loop {
            let cap = pacer.cap(self.client_ops());
            let batch: Vec<u64> = todo.by_ref().take((BATCH * lanes).min(cap)).collect();
            if batch.is_empty() {
                break;
            }
            if stop.load(Ordering::Acquire) {
                p.running.store(false, Ordering::Release);
                tracing::info!(
                    target: "uraid_engine::recovery",
                    "array '{name}': resync stopped after {n} of {units} stripes; {}",
                    if self.intent().enabled() {
                        "regions it finished are cleared from the bitmap and not redone"
                    } else {
                        "without a write-intent bitmap it starts over next time"
                    }
                );
                return Ok(report);
            }
            let outcomes = self
                .fan_out(&batch, Some(Err(ArrayError::Shutdown)), |a, b| async move {
                    a.resync_batch(&b).await
                })
                .await;
            for (&unit, r) in batch.iter().zip(outcomes) {
                match r {
                    Some(Ok(Some(repaired))) => {
                        report.stripes += 1;
                        if repaired {
                            report.repaired += 1;
                            p.repaired.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(Ok(None)) => report.unreadable += 1,
                    // A member being rebuilt does not hold the unit yet.
                    Some(Err(ArrayError::Unreadable { .. })) if self.check_serving().is_ok() => {
                        report.deferred += 1
                    }
                    Some(Err(e)) => {
                        p.running.store(false, Ordering::Release);
                        tracing::error!(
                            target: "uraid_engine::recovery",
                            "array '{name}': resync stopped at stripe {unit} ({n} of {units} \
                             done): {e}; parity of the stripes left was not verified: reads \
                             that would reconstruct data there fail instead"
                        );
                        return Err(e);
                    }
                    None => report.skipped += 1,
                }
            }
            n += batch.len() as u64;
            p.done.store(n, Ordering::Release);
            if last_log.elapsed() >= PROGRESS_LOG_EVERY {
                last_log = Instant::now();
                let v = p.view();
                tracing::info!(
                    target: "uraid_engine::recovery",
                    "array '{name}': resync {:.1}% ({} of {} stripes), {:.1} MB/s, {} repaired, ETA {}",
                    v.fraction * 100.0,
                    v.done,
                    v.total,
                    v.bytes_per_second / 1e6,
                    v.repaired,
                    v.eta_seconds.map_or("unknown".into(), |s| format!("{s:.0} s"))
                );
            }
            pacer.pace(batch.len(), self.client_ops(), stop);
        }
        p.running.store(false, Ordering::Release);
        if report.unreadable > 0 {
            // Still due: the superblocks stay "not clean" and the next start tries again.
            tracing::error!(
                target: "uraid_engine::recovery",
                "array '{name}': resync walked every stripe in {:.1} s but {} could not be read \
                 (media errors) and stay unsynced: losing a member would rebuild wrong data there",
                t0.elapsed().as_secs_f64(),
                report.unreadable
            );
            return Ok(report);
        }
        if report.deferred > 0 {
            tracing::info!(
                target: "uraid_engine::recovery",
                "array '{name}': resync walked every stripe in {:.1} s and left {} to the \
                 rebuild (a member being rebuilt does not hold them yet; it resyncs them as it \
                 passes)",
                t0.elapsed().as_secs_f64(),
                report.deferred
            );
            self.recovery().resync.finish_if_all_synced();
            return Ok(report);
        }
        self.recovery().resync.finish();
        tracing::info!(
            target: "uraid_engine::recovery",
            "array '{name}': resync finished in {:.2} s: {} stripes checked, {} repaired, {} \
             already resynced by writes",
            t0.elapsed().as_secs_f64(),
            report.stripes,
            report.repaired,
            report.skipped
        );
        Ok(report)
    }

    /// Resyncs the units of `batch` that are still unsynced, concurrently, each under its
    /// stripe lock (no task holds two). Per unit: None if writes had resynced it already.
    async fn resync_batch(&self, batch: &[u64]) -> Vec<Option<Result<Option<bool>, ArrayError>>> {
        join_all(batch.iter().map(|&unit| async move {
            if !self.recovery().resync.unsynced(unit) {
                return None;
            }
            let _held = self.locks().lock(unit).await;
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

    /// Client reads and writes so far (the throttle's notion of activity).
    pub(crate) fn client_ops(&self) -> u64 {
        self.stats.total(|c| &c.reads) + self.stats.total(|c| &c.writes)
    }

    /// Stripes whose degraded reads were refused because their parity was not resynced
    /// after an unclean stop (each logged once with its volume range).
    pub fn unsynced_stripes_refused(&self) -> u64 {
        self.recovery().resync.unreadable_reported()
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
        let _held = self.locks().lock(unit).await;
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
