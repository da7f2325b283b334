//! The state of background work that the array's request paths and its status consult
//! (below the array; the walks that drive it are recovery/{resync,rebuild,replace,scrub}.rs,
//! above it, and the supervisor that owns their threads is supervisor.rs): which units
//! resync still owes, each walk's progress, the replace under way, scrub counters, the
//! throttle and the allocation probe, grouped as `Recovery`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use uraid_core::{Geometry, MemberSet};

/// Background-work state of one array. Each part has its own rules (`ResyncState`,
/// `Progress`, `ScrubCounts`); `Recovery` only groups them and answers `skippable`.
pub(crate) struct Recovery {
    pub(crate) resync: ResyncState,
    /// Progress of each walk.
    pub(crate) resync_progress: Progress,
    pub(crate) rebuild_progress: Progress,
    pub(crate) scrub_progress: Progress,
    /// Per slot: progress of its running (or last) replace.
    pub(crate) replace_progress: Vec<Progress>,
    /// The replaces started (recovery/replace.rs), the latest last; each is current while
    /// its slot has that replacement generation.
    pub(crate) replacing: Mutex<Vec<Replacing>>,
    /// Replaces the superblocks recorded at assembly, waiting for their replacement
    /// (`Array::resume_replace`) or to be dropped (`Array::drop_unresumed_replaces`).
    pub(crate) replace_resume: Mutex<Vec<Resumable>>,
    /// Set when the server stops: a replace walk stopped from then on keeps its replace
    /// (recorded, resumed at the next start) instead of dropping it.
    pub(crate) replace_keep: AtomicBool,
    pub(crate) scrub_counts: ScrubCounts,
    /// The throttle of background work, shared with the running walks (`Pacer`).
    pub(crate) throttle: Arc<Mutex<Throttle>>,
    /// Whether a unit may hold data (the volume's allocation map; unset: every unit); the
    /// flag says whether a unit whose first write is filling it counts.
    allocation: OnceLock<Box<dyn Fn(u64, bool) -> bool + Send + Sync>>,
    /// Former members put back into their slot (recovery/readd.rs).
    pub(crate) readd: ReAdds,
}

/// Members re-added into their own slot (`uraid add` of a device the slot still names,
/// recovery/readd.rs): per slot and device generation, the write-intent regions dirty when it
/// came back and its bad-block ranges then. Its rebuild leaves the units of the other regions
/// as they are on it.
#[derive(Default)]
pub(crate) struct ReAdds {
    pub(crate) entries: Mutex<Vec<ReAdd>>,
    /// Units a rebuild left as they were on a re-added member (it held them).
    pub(crate) held: AtomicU64,
    /// Units a rebuild wrote (regenerated), re-added or not.
    pub(crate) written: AtomicU64,
}

/// One re-added member (`ReAdds`).
#[derive(Debug, Clone)]
pub(crate) struct ReAdd {
    pub(crate) slot: usize,
    /// The slot's device generation it went in as.
    pub(crate) gen: usize,
    /// The write-intent bits when it came back (bit r of word r/64: region r dirty).
    pub(crate) dirty: Arc<[u64]>,
    /// The bad-block lists then: its slot's chunks there are not held either.
    pub(crate) bad: uraid_core::badblocks::BadBlocks,
}

impl Recovery {
    /// Resync units are stripes on parity levels and chunk rows on mirrors; `due`: the units
    /// resync owes (`ResyncState::new`).
    pub(crate) fn new(geo: &Geometry, due: Option<Vec<std::ops::Range<u64>>>) -> Recovery {
        let units = geo.units();
        let unit_bytes = match geo.level {
            uraid_core::Level::Raid1 | uraid_core::Level::Raid10 => {
                geo.mirror_copies(0).len() as u64 * geo.chunk
            }
            _ => geo.members as u64 * geo.chunk,
        };
        Recovery {
            resync: ResyncState::new(units, due),
            resync_progress: Progress::new("resync", units, unit_bytes),
            rebuild_progress: Progress::new("rebuild", units, unit_bytes),
            scrub_progress: Progress::new("scrub", units, unit_bytes),
            replace_progress: (0..geo.members)
                .map(|_| Progress::new("replace", units, geo.chunk))
                .collect(),
            replacing: Mutex::new(Vec::new()),
            replace_resume: Mutex::new(Vec::new()),
            replace_keep: AtomicBool::new(false),
            scrub_counts: Default::default(),
            throttle: Default::default(),
            allocation: OnceLock::new(),
            readd: ReAdds::default(),
        }
    }

    /// Tells which units may hold data (`Volume::new`: from the allocation map).
    pub(crate) fn set_allocation(&self, f: Box<dyn Fn(u64, bool) -> bool + Send + Sync>) {
        let _ = self.allocation.set(f);
    }

    /// Whether a background walk (rebuild, replace, scrub) can skip unit `unit`: no data
    /// was ever written there or it was trimmed (the allocation map), nobody is filling it,
    /// and it is not waiting for resync. Its chunks are then never read (a read of it
    /// returns zeros from the map) and its first write fills whole stripes, so what any
    /// member holds there does not matter.
    pub(crate) fn skippable(&self, unit: u64) -> bool {
        self.allocation.get().is_some_and(|f| !f(unit, true)) && !self.resync.unsynced(unit)
    }

    /// Whether unit `unit` holds no data (the allocation map: never written or trimmed, and
    /// nobody filling it), whether in sync or not: reads there return zeros without I/O.
    pub(crate) fn holds_no_data(&self, unit: u64) -> bool {
        self.allocation.get().is_some_and(|f| !f(unit, true))
    }

    /// `skippable` where a unit whose first write is still filling it counts as empty
    /// (`Array::empty_under_lock`).
    pub(crate) fn empty_under_lock(&self, unit: u64) -> bool {
        self.allocation.get().is_some_and(|f| !f(unit, false)) && !self.resync.unsynced(unit)
    }

    /// The running (or last) scrub: its mode (None: never ran), counts, progress, paused.
    pub(crate) fn scrub_state(&self) -> (Option<ScrubMode>, ScrubReport, ProgressView, bool) {
        let c = &self.scrub_counts;
        let mode = match c.mode.load(Ordering::Acquire) {
            1 => Some(ScrubMode::Check),
            2 => Some(ScrubMode::Repair),
            _ => None,
        };
        (
            mode,
            c.report(),
            self.scrub_progress.view(),
            c.paused.load(Ordering::Acquire),
        )
    }

    /// The throttle background work applies now.
    pub(crate) fn throttle_now(&self) -> Throttle {
        *self.throttle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How hard background work (resync, rebuild, scrub) may push while clients are active,
/// and how fast it may go: the array's live settings (`Array::set_throttle`; `uraid serve
/// --background-budget/--resync-min/--resync-max/--priority`, `uraid throttle` on a running
/// server). Every walk reads them at each round, so a change applies at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    /// Units in flight while clients are active (OpenZFS's rule: one unit reads one chunk
    /// of each member it needs, so about one background I/O per member); 0: md's
    /// `min_bytes_per_second` rule instead.
    pub budget: usize,
    /// Rate while clients are active when there is no budget (md's sync_speed_min); 0:
    /// unlimited.
    pub min_bytes_per_second: u64,
    /// Rate while clients are idle (md's sync_speed_max); 0: unlimited.
    pub max_bytes_per_second: u64,
    /// With a budget: how long background work pauses after each round while clients are
    /// active.
    pub priority: Priority,
}

impl Throttle {
    /// No throttle at all (the engine's default; the server sets its own).
    pub const UNLIMITED: Throttle = Throttle {
        budget: 0,
        min_bytes_per_second: 0,
        max_bytes_per_second: 0,
        priority: Priority::Normal,
    };
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::UNLIMITED
    }
}

/// The share of time background work holds its budget while clients are active: after a
/// round of `budget` units it pauses for the round's time times `pause_factor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Pauses twice the round's time: the budget is held a third of the time.
    Low,
    /// Pauses half the round's time: held two thirds of the time (the default).
    Normal,
    /// No pause: the budget is always in flight (clients still see at most `budget` units
    /// of background I/O ahead of them).
    High,
}

impl Priority {
    pub fn name(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    pub fn parse(s: &str) -> Option<Priority> {
        match s {
            "low" => Some(Priority::Low),
            "normal" => Some(Priority::Normal),
            "high" => Some(Priority::High),
            _ => None,
        }
    }

    /// Pause after a busy round, as a multiple of the round's time (numerator, denominator).
    pub(crate) fn pause_factor(self) -> (u32, u32) {
        match self {
            Priority::Low => (2, 1),
            Priority::Normal => (1, 2),
            Priority::High => (0, 1),
        }
    }
}

/// Which units (stripes; mirror rows) resync still owes after an unclean stop.
///
/// Contract (docs/design/resync.md; docs/invariants.md, "Unsynced stripes are resynced
/// before the array is clean"):
/// * Set once at assembly (`new`): the units `due` then start unsynced, every other unit
///   synced. While nothing is due the state is not *pending* and every unit is synced.
/// * A unit goes from unsynced to synced (`mark`), never back; only the holder of its
///   stripe lock marks it, after its parity (or mirror copies) were made consistent: by the
///   resync walk, by a client write that resyncs it first (`Array::resync_if_unsynced`), or
///   by a rebuild that rewrote every chunk of it; or after the chunks of the members
///   present were found to be one codeword with a parity to spare and at most one data
///   chunk out (`Array::verify_unsynced`, a degraded array that cannot resync).
/// * Pending ends once (`finish`, or `finish_if_all_synced`) and never starts again; after
///   that `unsynced` is false for every unit.
/// * `given_up`: units a write found unreadable (not retried by writes); `reported`: units
///   whose degraded reads were refused (logged once each). Both only grow.
pub(crate) struct ResyncState {
    pending: AtomicBool,
    synced: Vec<AtomicU64>,
    /// The units due at assembly (dirty regions of the write-intent bitmap, or all).
    due: Vec<std::ops::Range<u64>>,
    /// Stripes writes found unreadable (media error on a data chunk): not retried by writes;
    /// with the members whose chunk a write met a media error in (writes plan around them:
    /// a chunk decoded from an unsynced stripe's parity may be wrong, so it is never
    /// written back, and reading it again would only spend the member's error budget).
    given_up: std::sync::Mutex<std::collections::HashMap<u64, MemberSet>>,
    /// Units whose degraded reads were refused (not yet resynced: parity untrusted).
    reported: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Units a degraded read or write found consistent among the members present
    /// (`Array::verify_unsynced`) and marked synced.
    verified: AtomicU64,
}

impl ResyncState {
    /// `due`: the units to resync (None or empty: nothing, the array was stopped cleanly or
    /// no region was dirty). Every other unit starts synced.
    pub(crate) fn new(units: u64, due: Option<Vec<std::ops::Range<u64>>>) -> ResyncState {
        let due: Vec<_> = due
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect();
        let pending = !due.is_empty();
        let words = if pending { units.div_ceil(64) } else { 0 };
        let synced: Vec<AtomicU64> = (0..words).map(|_| AtomicU64::new(u64::MAX)).collect();
        for u in due.iter().flat_map(|r| r.clone()) {
            synced[(u / 64) as usize].fetch_and(!(1 << (u % 64)), Ordering::Relaxed);
        }
        ResyncState {
            pending: AtomicBool::new(pending),
            synced,
            due,
            given_up: Default::default(),
            reported: Default::default(),
            verified: AtomicU64::new(0),
        }
    }

    /// The ranges of units due at assembly (what the resync walk visits).
    pub(crate) fn due_ranges(&self) -> &[std::ops::Range<u64>] {
        &self.due
    }

    /// Units due at assembly.
    pub(crate) fn due_units(&self) -> u64 {
        self.due.iter().map(|r| r.end - r.start).sum()
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Whether `unit` still needs resync (caller holds its stripe lock to act on it).
    pub(crate) fn unsynced(&self, unit: u64) -> bool {
        self.is_pending()
            && self.synced[(unit / 64) as usize].load(Ordering::Acquire) & (1 << (unit % 64)) == 0
    }

    pub(crate) fn mark(&self, unit: u64) {
        if let Some(w) = self.synced.get((unit / 64) as usize) {
            w.fetch_or(1 << (unit % 64), Ordering::AcqRel);
        }
    }

    pub(crate) fn given_up(&self, unit: u64) -> bool {
        self.given_up
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&unit)
    }

    pub(crate) fn give_up(&self, unit: u64) {
        self.given_up
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(unit)
            .or_insert(MemberSet::EMPTY);
    }

    /// A write met media errors on `members` in unsynced `unit`: later writes plan around
    /// them (`unreadable`).
    pub(crate) fn note_unreadable(&self, unit: u64, members: MemberSet) {
        let mut g = self.given_up.lock().unwrap_or_else(|e| e.into_inner());
        let e = g.entry(unit).or_insert(MemberSet::EMPTY);
        *e = e.union(members);
    }

    /// Members whose chunk of unsynced `unit` a write found unreadable.
    pub(crate) fn unreadable(&self, unit: u64) -> MemberSet {
        self.given_up
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&unit)
            .copied()
            .unwrap_or(MemberSet::EMPTY)
    }

    /// Records that reads of `unit` were refused; true the first time (to log it once).
    pub(crate) fn report_unreadable(&self, unit: u64) -> bool {
        self.reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(unit)
    }

    /// Units whose reads were refused so far (status).
    pub(crate) fn unreadable_reported(&self) -> u64 {
        self.reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len() as u64
    }

    /// An unsynced unit was found consistent among the members present and marked synced.
    pub(crate) fn note_verified(&self) {
        self.verified.fetch_add(1, Ordering::Relaxed);
    }

    /// Units verified so far (status).
    pub(crate) fn verified(&self) -> u64 {
        self.verified.load(Ordering::Relaxed)
    }

    pub(crate) fn finish(&self) {
        self.pending.store(false, Ordering::Release);
    }

    /// Ends the pending resync if every unit is synced (the rebuild resyncs the units it
    /// rebuilds, and may finish what the walk had to leave to it).
    pub(crate) fn finish_if_all_synced(&self) {
        if self.is_pending()
            && self
                .synced
                .iter()
                .all(|w| w.load(Ordering::Acquire) == u64::MAX)
        {
            self.finish();
        }
    }
}

/// A replace under way: slot, the replacement's generation and its device uuid, and the
/// units its copy walks (all of them for a new replace; for a resumed one, those its
/// checkpoint does not cover, `Resumable::units`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replacing {
    pub slot: usize,
    pub gen: usize,
    pub uuid: [u8; 16],
    pub units: Vec<std::ops::Range<u64>>,
}

/// A replace recorded in the superblocks at assembly (format version 7): slot, the
/// replacement's device uuid, and the units its copy must still walk when it resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resumable {
    pub slot: usize,
    pub uuid: [u8; 16],
    /// The recorded checkpoint.
    pub copied: u64,
    pub units: Vec<std::ops::Range<u64>>,
}

impl Resumable {
    /// What the copy must walk again: everything from the checkpoint `copied`, and below it
    /// the units resync owes (`due`, after an unclean stop: a write there may have reached
    /// one of the two devices and not the other), in order.
    pub(crate) fn units(
        copied: u64,
        total: u64,
        due: Option<&[std::ops::Range<u64>]>,
    ) -> Vec<std::ops::Range<u64>> {
        let mut v: Vec<std::ops::Range<u64>> = due
            .unwrap_or(&[])
            .iter()
            .map(|r| r.start..r.end.min(copied))
            .filter(|r| !r.is_empty())
            .collect();
        v.push(copied..total);
        v.retain(|r| !r.is_empty());
        v
    }

    /// The checkpoint the resumed replace records at once: the first unit it walks (every
    /// unit below it is trusted on the replacement).
    pub(crate) fn first(&self) -> u64 {
        self.units.first().map_or(self.copied, |r| r.start)
    }
}

/// Check only, or also repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrubMode {
    Check,
    Repair,
}

impl ScrubMode {
    pub fn name(self) -> &'static str {
        match self {
            ScrubMode::Check => "check",
            ScrubMode::Repair => "repair",
        }
    }
}

/// What a scrub found (also live in `scrub_counts` while it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubReport {
    /// Units verified (units with nothing allocated are skipped).
    pub units: u64,
    /// 4 KiB columns whose redundancy disagreed.
    pub mismatches: u64,
    /// Of those, columns whose bad chunk was located (member named).
    pub located: u64,
    /// Columns rewritten (repair mode).
    pub repaired: u64,
    /// Units not verified because a chunk could not be read.
    pub unreadable: u64,
    /// Units not verified because a chunk of theirs is on a bad-block list (repair rebuilds
    /// those it can, which takes them off the list).
    pub bad_blocks: u64,
}

/// Live scrub counters (status, metrics).
#[derive(Default)]
pub(crate) struct ScrubCounts {
    pub(crate) units: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) located: AtomicU64,
    pub(crate) repaired: AtomicU64,
    pub(crate) unreadable: AtomicU64,
    pub(crate) bad_blocks: AtomicU64,
    /// 0 idle, 1 check, 2 repair.
    pub(crate) mode: AtomicU8,
    pub(crate) paused: AtomicBool,
}

impl ScrubCounts {
    pub(crate) fn reset(&self, mode: ScrubMode) {
        for c in [
            &self.units,
            &self.mismatches,
            &self.located,
            &self.repaired,
            &self.unreadable,
            &self.bad_blocks,
        ] {
            c.store(0, Ordering::Release);
        }
        self.mode.store(
            match mode {
                ScrubMode::Check => 1,
                ScrubMode::Repair => 2,
            },
            Ordering::Release,
        );
    }

    pub(crate) fn report(&self) -> ScrubReport {
        let l = |a: &AtomicU64| a.load(Ordering::Acquire);
        ScrubReport {
            units: l(&self.units),
            mismatches: l(&self.mismatches),
            located: l(&self.located),
            repaired: l(&self.repaired),
            unreadable: l(&self.unreadable),
            bad_blocks: l(&self.bad_blocks),
        }
    }
}

/// Progress of one background operation, readable from any thread.
pub struct Progress {
    pub op: &'static str,
    /// Work units (stripes) done and in total.
    pub done: AtomicU64,
    pub total: AtomicU64,
    /// Bytes of member I/O per unit (for the rate).
    pub unit_bytes: u64,
    /// Stripes whose redundancy was rewritten.
    pub repaired: AtomicU64,
    pub running: AtomicBool,
    started: Mutex<Option<Instant>>,
}

/// A running walk's hold on its `Progress` (`Progress::begin`): clears "running" on drop.
pub(crate) struct Running<'a>(&'a Progress);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}

/// A point-in-time view of `Progress`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressView {
    pub op: &'static str,
    pub running: bool,
    pub done: u64,
    pub total: u64,
    pub repaired: u64,
    /// 0..=1.
    pub fraction: f64,
    pub bytes_per_second: f64,
    pub eta_seconds: Option<f64>,
}

impl Progress {
    pub fn new(op: &'static str, total: u64, unit_bytes: u64) -> Progress {
        Progress {
            op,
            done: AtomicU64::new(0),
            total: AtomicU64::new(total),
            unit_bytes,
            repaired: AtomicU64::new(0),
            running: AtomicBool::new(false),
            started: Mutex::new(None),
        }
    }

    fn start(&self) {
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.running.store(true, Ordering::Release);
    }

    /// A walk over `total` units starts: `done` counts from 0 (`repaired` is left to the
    /// walk), running until the returned guard is dropped (on every exit of the walk,
    /// errors and early returns included).
    pub(crate) fn begin(&self, total: u64) -> Running<'_> {
        self.total.store(total, Ordering::Release);
        self.done.store(0, Ordering::Release);
        self.start();
        Running(self)
    }

    pub fn view(&self) -> ProgressView {
        let done = self.done.load(Ordering::Acquire);
        let total = self.total.load(Ordering::Acquire).max(1);
        let secs = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = if secs > 0.0 {
            done as f64 * self.unit_bytes as f64 / secs
        } else {
            0.0
        };
        let left = total.saturating_sub(done) as f64 * self.unit_bytes as f64;
        ProgressView {
            op: self.op,
            running: self.running.load(Ordering::Acquire),
            done,
            total,
            repaired: self.repaired.load(Ordering::Acquire),
            fraction: done as f64 / total as f64,
            bytes_per_second: rate,
            eta_seconds: (rate > 0.0).then(|| left / rate),
        }
    }
}
