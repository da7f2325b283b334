//! TRIM passed down to the members: the chunks of units that hold no data are discarded
//! (`BlockDev::discard`: a hole punched in a member file, BLKDISCARD on a block device), so
//! files give their space back and SSDs learn what is free. `Volume::trim` calls
//! `discard_units` for the whole granules it has just cleared in the allocation map.
//!
//! Rules (docs/invariants.md, "Only units that hold no data are discarded"):
//! * Only units whose granule bit is clear in memory and on every live member, *durably*
//!   (the caller flushed the members after writing the map page), and whose granule the
//!   caller has claimed, so no first write fills it until the discards are done. What a
//!   member holds in such a unit is never read as data (reads there return zeros from the
//!   map; the first write fills whole stripes with fresh parity), so a discard that leaves
//!   zeros, old bytes or anything else, whole or torn by a crash, changes nothing a client
//!   can read. A crash before the flush leaves the bit set and the data untouched.
//! * Each unit's chunks are discarded while its stripe lock is held (runs of units locked in
//!   ascending order, the order `write_stripe_run` takes them in): no walk (scrub, rebuild,
//!   resync, replace) sees a unit half discarded, and a write-back journal's deferred member
//!   writes to it, which carry the lock, finish before the discard starts.
//! * Client reads take no stripe lock: a run is logged (`DiscardLog`) before its discards are
//!   issued, and a read that overlapped one is read again (`Volume::read`), so it returns the
//!   bytes from before the trim or zeros, never what a discard left.
//! * Failed and missing slots are skipped; a member being rebuilt and a replacement are
//!   discarded like the others (what they hold there does not matter either).
//! * Advisory: a discard error is counted (member I/O "discard" errors) and logged, never
//!   fails a member; a device that cannot discard is not asked again (`Members::discard`).
//!   A discard is member I/O like any other for the watchdog: one still outstanding after
//!   `--io-timeout` gets its member failed as hung (the trim must wait for its discards:
//!   a late one could land after a fill of the granule).

use super::Array;
use crate::dev::BlockDev;
use futures::future::join_all;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Bytes per member discarded under one run of stripe locks.
const RUN_BYTES: u64 = 32 << 20;

/// Runs of discards remembered for reads (`DiscardLog`).
const RECENT: usize = 64;

/// The discards started, numbered, and the units of the most recent runs. A client read
/// takes no stripe lock: it checks the map, then reads the members, and a trim of the same
/// range may clear the bit and discard the units meanwhile, under the read (which then holds
/// junk, or a decode of a half-discarded stripe). `Volume::read` notes `seq()` before it looks
/// at the map and, once it has the bytes, asks `since` whether a discard of its units began
/// in between; if so it reads again (the map now says hole). A run is logged before any of
/// its discards is issued.
#[derive(Default)]
pub(crate) struct DiscardLog {
    seq: AtomicU64,
    recent: Mutex<VecDeque<(u64, Range<u64>)>>,
    /// Discards that failed (for the log's rate limit).
    errors: AtomicU64,
}

impl DiscardLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Range<u64>)>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs a run of discards about to start on `units`.
    fn begin(&self, units: Range<u64>) {
        let mut r = self.lock();
        let s = self.seq.load(Ordering::Relaxed) + 1;
        r.push_back((s, units));
        if r.len() > RECENT {
            r.pop_front();
        }
        self.seq.store(s, Ordering::SeqCst);
    }

    /// The number of discard runs begun so far.
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Whether a run that began after `seen` (a `seq()`) covered any of `units` (or may
    /// have: it is no longer remembered).
    pub(crate) fn since(&self, seen: u64, units: Range<u64>) -> bool {
        if self.seq.load(Ordering::SeqCst) == seen {
            return false;
        }
        let r = self.lock();
        match r.front() {
            Some((first, _)) if *first <= seen + 1 => r
                .iter()
                .any(|(s, u)| *s > seen && u.start < units.end && units.start < u.end),
            _ => true,
        }
    }
}

impl<D: BlockDev> Array<D> {
    /// Used by tests: holds unit `unit`'s stripe lock until the returned guard is dropped.
    #[doc(hidden)]
    pub async fn hold_stripe_for_test(&self, unit: u64) -> impl Drop + '_ {
        self.lock_stripe(unit).await
    }

    /// The discards begun so far (`DiscardLog`).
    pub(crate) fn discard_log(&self) -> &DiscardLog {
        &self.discard_log
    }

    /// Whether trims reach the members (`serve --discard`, on by default).
    pub(crate) fn discards(&self) -> bool {
        self.discards
    }

    /// Discards every member's chunks of `units` (see the rules above; the caller cleared
    /// their granules durably and holds the claims).
    pub(crate) async fn discard_units(&self, units: Range<u64>) {
        let g = *self.geometry();
        let per_run = (RUN_BYTES / g.chunk).max(1);
        let mut u = units.start.min(g.units());
        let end = units.end.min(g.units());
        while u < end {
            let run = u..(u + per_run).min(end);
            let mut held = Vec::with_capacity((run.end - run.start) as usize);
            for s in run.clone() {
                held.push(self.locks.lock(s).await);
            }
            self.discard_log.begin(run.clone());
            let failed = self.members.failed();
            let ranges: Vec<(usize, u64, u64)> = g
                .unit_ranges(run.clone())
                .into_iter()
                .filter(|&(m, _, _)| !failed.contains(m) && self.members.device(m).is_some())
                .collect();
            let results = join_all(
                ranges
                    .iter()
                    .map(|&(m, off, len)| self.members.discard(m, off, len)),
            )
            .await;
            drop(held);
            for (&(m, off, len), r) in ranges.iter().zip(results) {
                if let Err(e) = r {
                    let errors = self.discard_log.errors.fetch_add(1, Ordering::Relaxed) + 1;
                    if errors == 1 || errors.is_multiple_of(1000) {
                        tracing::warn!(
                            target: "uraid_engine::discard",
                            "member {m}: discard of {len} bytes at data offset {off} failed: {e} \
                             ({errors} discard errors so far; the member stays, the range reads \
                             as zeros from the allocation map)"
                        );
                    }
                }
            }
            u = run.end;
        }
    }
}
