//! `Array::status`: everything the control plane reports about a running array (status
//! JSON, metrics, `uraid watch`), read in one call from the atomics and counters the data
//! path updates. No lock on the request paths is taken; each value is read once, so values
//! derived from the same source (the failed set, each member's state) agree with each other.

use super::{Array, StatsSnapshot};
use crate::background::{ProgressView, ScrubMode, ScrubReport, Throttle};
use crate::dev::BlockDev;
use crate::journal::JournalStatus;
use crate::members::{MemberIoSnapshot, MemberState};
use std::sync::atomic::Ordering;
use uraid_core::{Geometry, MemberSet};

/// An array's identity, as its superblocks record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub uuid: [u8; 16],
    /// Creation time, seconds since the Unix epoch.
    pub ctime: u64,
}

/// A member's read-error accounting (`--max-read-errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberErrors {
    /// Media errors reconstructed from redundancy and rewritten in place so far.
    pub corrected: u64,
    /// Read errors counted against the budget now (halved every hour).
    pub budget_used: u32,
    /// The budget: the next read error past it fails the member.
    pub budget: u32,
}

/// One member slot.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    /// The slot's current device (its path for a file or block device); None: missing.
    pub name: Option<String>,
    /// Its health: active, failed, or rebuilding with its checkpoint.
    pub state: MemberState,
    /// The operator removed it (`uraid remove`) and no device has taken the slot since.
    pub removed: bool,
    /// The device it is being replaced by, while a replace (`uraid replace`) runs.
    pub replacement: Option<String>,
    /// Flagged fail-slow (slow.rs): reads plan around it while redundancy allows.
    pub slow: bool,
    /// Progress of that replace's copy (None while not being replaced).
    pub replace: Option<ProgressView>,
    /// I/O totals of the current device (data and metadata I/O).
    pub io: MemberIoSnapshot,
    pub errors: MemberErrors,
    /// Its bad-block list (uraid_core::badblocks): (first unit, units) ranges whose chunk
    /// on this slot holds no valid data, and their bytes on the member.
    pub bad_ranges: Vec<(u64, u64)>,
    pub bad_bytes: u64,
}

/// The write-intent bitmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BitmapStatus {
    /// Bytes of volume per region; 0: the array has no bitmap.
    pub chunk: u64,
    pub regions: u64,
    /// Regions whose bit is set now.
    pub dirty: u64,
    /// Page-write rounds so far that set bits (each: one page write and flush per member,
    /// shared by every write waiting for it), and that cleared them.
    pub set_rounds: u64,
    pub clear_rounds: u64,
}

/// The running (or last) scrub.
#[derive(Debug, Clone)]
pub struct ScrubStatus {
    /// None: no scrub ran this session (`report` and `progress` are then empty).
    pub mode: Option<ScrubMode>,
    pub report: ScrubReport,
    pub progress: ProgressView,
    /// Paused between batches (`uraid scrub --pause`).
    pub paused: bool,
}

/// A running array's state (`Array::status`).
#[derive(Debug, Clone)]
pub struct ArrayStatus {
    pub identity: Identity,
    /// The superblocks' event count (md's "Events"; rises with every superblock round).
    pub events: u64,
    pub geometry: Geometry,
    /// Written since assembly (the superblocks say "not clean").
    pub dirty: bool,
    /// The array can serve every byte (false: more members lost than the level tolerates).
    pub serving: bool,
    /// Members missing or failed: those whose `state` is `Failed`.
    pub failed: MemberSet,
    /// The failed set the superblocks on disk record (trails `failed` only while a
    /// superblock round is in progress).
    pub durable_failed: MemberSet,
    /// One entry per slot, in slot order.
    pub members: Vec<MemberStatus>,
    /// Request-planner counters.
    pub stats: StatsSnapshot,
    pub bitmap: BitmapStatus,
    /// None: the array has no journal.
    pub journal: Option<JournalStatus>,
    /// A resync is due (assembled after an unclean stop) and has not finished.
    pub resync_due: bool,
    /// Progress of the running (or last) resync.
    pub resync: ProgressView,
    /// Stripes whose degraded reads were refused because their parity was not resynced
    /// after an unclean stop (each logged once with its volume range).
    pub unsynced_stripes_refused: u64,
    /// Stripes not yet resynced that a degraded read or write found intact among the
    /// members present (a parity to spare) and served.
    pub unsynced_stripes_verified: u64,
    /// Progress of the running (or last) rebuild.
    pub rebuild: ProgressView,
    /// Units rebuilds regenerated this session, and units they left as they were on a
    /// re-added member that held them (recovery/readd.rs).
    pub rebuild_written: u64,
    pub rebuild_held: u64,
    /// Progress of the running (or last) replace.
    pub replace: ProgressView,
    /// Devices that left their slot while this server ran (failed and taken over, replaced,
    /// removed), oldest first.
    pub departed: Vec<crate::members::Departed>,
    pub scrub: ScrubStatus,
    /// The throttle background work applies now.
    pub throttle: Throttle,
}

impl ArrayStatus {
    /// Volume size in bytes.
    pub fn size(&self) -> u64 {
        self.geometry.volume_size()
    }

    /// Members being rebuilt.
    pub fn rebuilding(&self) -> MemberSet {
        (0..self.members.len())
            .filter(|&i| matches!(self.members[i].state, MemberState::Rebuilding { .. }))
            .collect()
    }

    /// Failed or rebuilding members: the array is degraded.
    pub fn degraded(&self) -> bool {
        !self.failed.is_empty() || !self.rebuilding().is_empty()
    }

    /// The slot being replaced, while a replace runs (the lowest, if several do).
    pub fn replacing(&self) -> Option<usize> {
        self.members.iter().position(|m| m.replacement.is_some())
    }

    /// Every slot being replaced, with its copy's progress.
    pub fn replaces(&self) -> Vec<(usize, ProgressView)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((i, m.replace.clone()?)))
            .collect()
    }
}

impl<D: BlockDev> Array<D> {
    /// The array's state for the control plane (module docs).
    pub fn status(&self) -> ArrayStatus {
        // The replaces under way, while their replacement is still the slot's
        // (recovery/replace.rs).
        let replacing = self.replace_states();
        let removed = self.meta.removed();
        let bad = self.members.bad_blocks();
        let members: Vec<MemberStatus> = (0..self.geo.members)
            .map(|i| {
                let (budget_used, budget) = self.members.read_error_budget(i);
                MemberStatus {
                    name: self.members.name(i).map(str::to_string),
                    state: self.members.state(i),
                    removed: removed.contains(i),
                    replacement: replacing.iter().find(|r| r.0 == i).map(|r| r.1.clone()),
                    slow: self.slow.set().contains(i),
                    replace: replacing
                        .iter()
                        .any(|r| r.0 == i)
                        .then(|| self.recovery.replace_progress[i].view()),
                    io: self.members.io(i),
                    errors: MemberErrors {
                        corrected: self.members.corrected_reads(i),
                        budget_used,
                        budget,
                    },
                    bad_ranges: bad
                        .ranges()
                        .iter()
                        .filter(|r| r.member == i)
                        .map(|r| (r.start, r.len))
                        .collect(),
                    bad_bytes: bad.count(i).1 * self.geo.chunk,
                }
            })
            .collect();
        let failed = (0..members.len())
            .filter(|&i| members[i].state.is_failed())
            .collect();
        let (mode, report, progress, paused) = self.recovery.scrub_state();
        let wi = &self.intent;
        let (name, uuid, ctime) = self.meta.identity();
        ArrayStatus {
            identity: Identity {
                name: name.to_string(),
                uuid,
                ctime,
            },
            events: self.meta.events(),
            geometry: self.geo,
            dirty: self.meta.is_dirty(),
            serving: self.is_serving(),
            failed,
            durable_failed: self.meta.persisted(),
            members,
            stats: self.stats.snapshot(),
            bitmap: BitmapStatus {
                chunk: wi.chunk,
                regions: wi.regions(),
                dirty: wi.dirty(),
                set_rounds: wi.set_rounds.load(Ordering::Relaxed),
                clear_rounds: wi.clear_rounds.load(Ordering::Relaxed),
            },
            journal: self.journal_status(),
            resync_due: self.needs_resync(),
            resync: self.recovery.resync_progress.view(),
            unsynced_stripes_refused: self.recovery.resync.unreadable_reported(),
            unsynced_stripes_verified: self.recovery.resync.verified(),
            rebuild: self.recovery.rebuild_progress.view(),
            rebuild_written: self.recovery.readd.written.load(Ordering::Relaxed),
            rebuild_held: self.recovery.readd.held.load(Ordering::Relaxed),
            replace: self.replace_progress(),
            departed: self.members.departed(),
            scrub: ScrubStatus {
                mode,
                report,
                progress,
                paused,
            },
            throttle: self.recovery.throttle_now(),
        }
    }
}
