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
//!   ascending order, as `write_stripe_run` does): no walk (scrub, rebuild, resync, replace)
//!   sees a unit half discarded, and a write-back journal's deferred member writes to it,
//!   which carry the lock, finish before the discard starts.
//! * Failed and missing slots are skipped; a member being rebuilt and a replacement are
//!   discarded like the others (what they hold there does not matter either).
//! * Advisory: a discard error is counted (member I/O "discard" errors) and logged, never
//!   fails a member; a device that cannot discard is not asked again (`Members::discard`).

use super::Array;
use crate::dev::BlockDev;
use futures::future::join_all;
use std::ops::Range;

/// Bytes per member discarded under one run of stripe locks.
const RUN_BYTES: u64 = 32 << 20;

impl<D: BlockDev> Array<D> {
    /// Used by tests: holds unit `unit`'s stripe lock until the returned guard is dropped.
    #[doc(hidden)]
    pub async fn hold_stripe_for_test(&self, unit: u64) -> impl Drop + '_ {
        self.lock_stripe(unit).await
    }

    /// Whether trims reach the members (`serve --discard`, on by default).
    pub(crate) fn discards(&self) -> bool {
        self.discards
    }

    /// Discards every member's chunks of `units` (see the rules above; the caller cleared
    /// their granules durably and holds the claims). Returns the member bytes discarded.
    pub(crate) async fn discard_units(&self, units: Range<u64>) -> u64 {
        let g = *self.geometry();
        let per_run = (RUN_BYTES / g.chunk).max(1);
        let mut total = 0;
        let mut u = units.start.min(g.units());
        let end = units.end.min(g.units());
        while u < end {
            let run = u..(u + per_run).min(end);
            let mut held = Vec::with_capacity((run.end - run.start) as usize);
            for s in run.clone() {
                held.push(self.locks.lock(s).await);
            }
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
                match r {
                    Ok(()) => total += len,
                    Err(e) => {
                        let errors = self.members.io(m).discard.errors;
                        if errors == 1 || errors.is_multiple_of(1000) {
                            tracing::warn!(
                                target: "uraid_engine::discard",
                                "member {m} ({}): discard of {len} bytes at data offset {off} \
                                 failed: {e} ({errors} discard errors so far; the member stays, \
                                 the range reads as zeros from the allocation map)",
                                self.members.name(m).unwrap_or("?")
                            );
                        }
                    }
                }
            }
            u = run.end;
        }
        total
    }
}
