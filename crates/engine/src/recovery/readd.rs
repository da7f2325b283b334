//! Re-add (md's `--re-add`): a former member that comes back into its own slot is rebuilt
//! only where the write-intent bitmap says it may have missed a write, not from unit 0.
//!
//! Rules (docs/invariants.md, "A re-added member is trusted only in regions clean since it
//! left"):
//! * Only the device the slot still names comes back this way: same array, its superblock's
//!   slot (`index`) failed now with no replacement, the slot's recorded device uuid its own
//!   (never after `remove` or after another device took the slot), the same geometry and
//!   bitmap, and its own superblock saying it was active (a device that left while being
//!   rebuilt holds only part of its slot). Anything else is added as a new member.
//! * While a slot is failed or missing no write-intent bit is cleared (`WriteIntent::
//!   clear_idle`, checked again under its I/O lock right before a clear), nor while the
//!   journal holds orphans (records dropped before their member writes completed: written
//!   again later, without the client's bits held). Every client write sets its regions'
//!   bits before it is planned. So every write the device missed, and every write it may
//!   have lost unflushed, is in a region whose bit is set when it comes back; a region
//!   clear then was flushed on it before it left and not written since.
//! * From before the slot stops being failed until the bits are copied, no bit is cleared
//!   either (`WriteIntent::hold_clears`); the copy is taken *after* the slot stops being
//!   failed (`Metadata::name_rebuilding`): a write planned before that skipped the device
//!   but set its bits before it was planned, so the copy has them; a write planned after it
//!   reaches the device. Bits cleared after the copy do not matter: the copy is what the
//!   rebuild consults.
//! * Its superblocks stay until the slot is chosen under the superblock lock (a refused
//!   re-add leaves the device as it was, which a forced assembly may still want); its map
//!   and bitmap copies are zeroed first (never merged stale), and rewritten once it is in.
//! * The device is then rebuilding from unit 0 like any new member (reads use it only below
//!   its checkpoint). The rebuild regenerates every unit in a region dirty in the copy or on
//!   the slot's bad-block list then, and leaves the others as they are on it (`holds`),
//!   moving the checkpoint over them like over regenerated ones. The copy lives in memory
//!   only: after a restart the slot resumes as an ordinary rebuild from its checkpoint.

use crate::array::Array;
use crate::background::ReAdd;
use crate::dev::BlockDev;
use std::sync::atomic::Ordering;
use uraid_core::format::{self, MemberState, SB_SIZE, SB_SLOTS};

/// A device `add` found to be a former member of the array (`Array::readd_candidate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Former {
    pub(crate) slot: usize,
    pub(crate) uuid: [u8; 16],
}

impl<D: BlockDev> Array<D> {
    /// Whether `dev` may come back into its own slot from the bitmap (module docs), from its
    /// superblock; the slot's recorded uuid is checked again under the superblock lock.
    pub(crate) async fn readd_candidate(&self, dev: &D) -> Option<Former> {
        let g = self.geo();
        if !self.intent().enabled() {
            return None;
        }
        let (r, b) = dev.read(0, crate::buf::alloc(SB_SIZE * SB_SLOTS)).await;
        r.ok()?;
        let sb = format::pick_superblock(&b[..SB_SIZE], &b[SB_SIZE..]).ok()?;
        let slot = sb.index;
        let ok = sb.array_uuid == self.identity().1
            && !sb.spare
            && !sb.replacement
            && sb.geometry == *g
            && sb.data_offset == self.members().data_offset()
            && sb.bitmap_chunk == self.intent().chunk
            && sb.states.get(slot) == Some(&MemberState::Active)
            && self.members().is_failed(slot)
            && self.members().replacement(slot).is_none();
        ok.then_some(Former {
            slot,
            uuid: sb.device_uuid,
        })
    }

    /// Records that slot `slot` took back its former device as generation `gen` (after the
    /// slot stopped being failed), with `bad`, its bad-block ranges before: the bits now are
    /// the ones its rebuild honours. Returns the units in dirty regions.
    pub(crate) fn register_readd(
        &self,
        slot: usize,
        gen: usize,
        bad: uraid_core::badblocks::BadBlocks,
    ) -> u64 {
        let dirty: std::sync::Arc<[u64]> = self.intent().snapshot().into();
        let g = self.geo();
        let chunk = self.intent().chunk;
        let units: u64 = uraid_core::bitmap::dirty_units(g, chunk, &dirty)
            .iter()
            .map(|r| r.end - r.start)
            .sum();
        let mut e = self
            .recovery()
            .readd
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        e.retain(|r| r.slot != slot);
        e.push(ReAdd {
            slot,
            gen,
            dirty,
            bad,
        });
        units
    }

    /// Whether every member the rebuild would write at `unit` is a re-added one that holds
    /// it already (module docs): false when there is none.
    pub(crate) fn readd_holds(&self, unit: u64) -> bool {
        let m = self.members();
        let targets = m.rebuilding();
        if targets.is_empty() {
            return false;
        }
        let entries = self
            .recovery()
            .readd
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if entries.is_empty() {
            return false;
        }
        let g = self.geo();
        let region = uraid_core::bitmap::region_of_unit(g, self.intent().chunk, unit);
        let mut any = false;
        for t in targets.iter().filter(|&t| !m.serves(t, unit)) {
            let held = entries.iter().any(|r| {
                r.slot == t
                    && r.gen == m.generation(t)
                    && r.dirty
                        .get((region / 64) as usize)
                        .is_some_and(|w| w & (1 << (region % 64)) == 0)
                    && !r.bad.contains(t, unit)
            });
            if !held {
                return false;
            }
            any = true;
        }
        any
    }

    /// Counts a rebuild batch: units regenerated and units re-added members held.
    pub(crate) fn count_rebuilt(&self, written: u64, held: u64) {
        let r = &self.recovery().readd;
        r.written.fetch_add(written, Ordering::Relaxed);
        r.held.fetch_add(held, Ordering::Relaxed);
    }
}
