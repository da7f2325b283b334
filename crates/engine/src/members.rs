//! The member set: the devices, their health, and every member I/O with its error policy and
//! I/O timeout.
//!
//! Health is kept in atomic words (lock-free on the read path) and read as one
//! `MemberState` per slot (`Members::state`); which members may serve a unit is
//! `MemberState::serves`, applied to every slot by `Members::at`: the one rule the read,
//! reconstruct and write paths use.
//!
//! Nothing else in the engine calls a `BlockDev` directly. Each I/O here:
//! * adds the data offset for data-area I/O (`read`/`write`) or not (metadata I/O),
//! * is counted in flight, so the watchdog (`spawn_watchdog`) can see a member that stopped
//!   answering and abort its outstanding I/O with `ETIMEDOUT`,
//! * classifies a failure (`classify`): a media error on a read is *correctable* (the caller
//!   reconstructs the chunk and rewrites it, md's read-error correction) until the member's
//!   error budget is spent; everything else fails the member.
//!
//! Failing a member durably needs the superblocks, so `Metadata` does that (its
//! `fail_member` and `failure_barrier`, metadata.rs); this module only decides.
//!
//! A flush skips a device that has nothing to make durable (`FlushState`): no write or
//! discard of it finished since the start of its last flush that succeeded, and none of its
//! flushes is in flight. A FLUSH touches only the members written since the last one
//! (a small write touches three of ten), and each flush is a system call on a worker thread.

use crate::buf::{IoBuf, Segments};
use crate::dev::BlockDev;
use crate::error::ArrayError;
use crate::metrics::{OpCounters, OpSnapshot};
use crate::shard::{self, Sharded};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};
use uraid_core::badblocks::{BadBlocks, Full};
use uraid_core::{Geometry, MemberSet};

/// What a member write writes: one buffer, or pieces of shared buffers written back to back
/// (a gather write: a client's payload written where it was received, without a copy).
pub enum MemberData {
    Buf(IoBuf),
    Gather(Segments),
}

impl MemberData {
    fn len(&self) -> usize {
        match self {
            MemberData::Buf(b) => b.len(),
            MemberData::Gather(s) => s.len(),
        }
    }

    /// The same bytes for a second device (a slot's replacement): a copy of a buffer (devices
    /// hand buffers back), shared pieces for a gather write.
    fn duplicate(&self) -> MemberData {
        match self {
            MemberData::Buf(b) => MemberData::Buf(crate::buf::copy_of(b)),
            MemberData::Gather(s) => MemberData::Gather(s.clone()),
        }
    }
}

impl From<IoBuf> for MemberData {
    fn from(b: IoBuf) -> MemberData {
        MemberData::Buf(b)
    }
}

impl From<Segments> for MemberData {
    fn from(s: Segments) -> MemberData {
        MemberData::Gather(s)
    }
}

/// How the array treats member errors (CLI: `--io-timeout`, `--max-read-errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorPolicy {
    /// Correctable read errors a member may have (decaying by half per hour, like md's
    /// `max_read_errors`) before the next one fails it.
    pub max_read_errors: u32,
    /// A member with I/O outstanding and no completion for this long is failed. None: no
    /// watchdog (in-memory tests).
    pub io_timeout: Option<Duration>,
}

impl Default for ErrorPolicy {
    fn default() -> Self {
        ErrorPolicy {
            max_read_errors: 20,
            io_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// An I/O error from a device that is no longer its slot's current one (the slot was given a
/// new device while the I/O was on its way). The slot's failure is already on disk (a device
/// is only replaced after that); the error says nothing about the new device, so it never
/// fails the slot or spends its read-error budget.
#[derive(Debug)]
pub struct StaleDevice(pub io::Error);

impl std::fmt::Display for StaleDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (from a device since replaced)", self.0)
    }
}

impl std::error::Error for StaleDevice {}

/// A data read refused before it was issued: the slot no longer holds the unit the caller
/// planned to read (`Members::read`). The caller decided from the member state that the
/// slot serves the unit, and the slot was failed, given a new device (which holds nothing
/// the rebuild has not reached) or had the chunk put on its bad-block list before the
/// device was picked. Like `StaleDevice` it says nothing about the device's health.
#[derive(Debug)]
pub struct NotHeld {
    pub member: usize,
    pub unit: u64,
}

impl std::fmt::Display for NotHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "member {} no longer holds unit {} (failed, replaced or marked bad after the read \
             was planned)",
            self.member, self.unit
        )
    }
}

impl std::error::Error for NotHeld {}

/// The unit of a read refused with `NotHeld`.
pub fn not_held_unit(e: &io::Error) -> Option<u64> {
    e.get_ref()
        .and_then(|x| x.downcast_ref::<NotHeld>())
        .map(|n| n.unit)
}

/// Whether `e` came from a replaced device (`StaleDevice`) or is a read refused because
/// its plan is out of date (`NotHeld`).
pub fn is_stale(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|x| x.is::<StaleDevice>() || x.is::<NotHeld>())
}

/// What to do about a failed member I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The error came from a device the slot no longer has (`StaleDevice`), or the read was
    /// refused because the slot no longer holds the unit (`NotHeld`): leave the
    /// member out of this operation, nothing else.
    Stale,
    /// A media error on a read within the budget: reconstruct the data from the stripe and
    /// rewrite it; the member stays in the array.
    Correct,
    /// Fail the member.
    Fail,
}

type WaitSlab = slab::Slab<(Waker, Instant)>;

fn lock(m: &Mutex<WaitSlab>) -> std::sync::MutexGuard<'_, WaitSlab> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Member I/O is timed for the latency histogram one in this many I/Os per thread: reading
/// the clock twice per I/O would cost more than the 2% the metrics may take from a 4 KiB
/// read served from memory. Counts and bytes are exact.
pub const LATENCY_SAMPLE: u64 = 16;

/// One thread's member I/O counters.
#[derive(Default)]
pub struct MemberIo {
    pub read: OpCounters,
    pub write: OpCounters,
    pub flush: OpCounters,
    /// Discards (TRIM passed down: array/discard.rs), bytes discarded.
    pub discard: OpCounters,
    /// Reads and writes timed only for the fail-slow judgement (`Members::time_every`), not
    /// one of the sampled ones, and their total latency: kept out of the histograms, whose
    /// `_count` stays one in `LATENCY_SAMPLE`.
    pub judge_timed: AtomicU64,
    pub judge_ns: AtomicU64,
    tick: AtomicU64,
}

impl MemberIo {
    /// Whether this thread's next I/O of the member is one of the sampled ones.
    #[inline]
    fn sampled(&self) -> bool {
        let t = self.tick.load(Ordering::Relaxed);
        self.tick.store(t.wrapping_add(1), Ordering::Relaxed);
        t.is_multiple_of(LATENCY_SAMPLE)
    }
}

/// The start of a timed member read or write (`Members::sample`): `metric` for one of the
/// sampled ones (histogram and judgement), else timed for the judgement only.
#[derive(Clone, Copy)]
struct Timer {
    t0: Instant,
    metric: bool,
}

/// A member's I/O totals (`Members::io`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemberIoSnapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub flush: OpSnapshot,
    pub discard: OpSnapshot,
    /// Reads and writes timed for the fail-slow judgement only, and their latency
    /// (`MemberIo::judge_timed`): with `read.timed + write.timed`, what the judgement sees.
    pub judge_timed: u64,
    pub judge_ns: u64,
}

/// A member slot's health: one typed view of the member set's atomic state (`Members::state`).
/// Whether a slot also has a replacement being filled (`uraid replace`) is separate
/// (`Members::replacement`): the replacement is written, never read, so it does not change
/// what the slot serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Present and holding every unit: read and written.
    Active,
    /// Failed, or missing since assembly: neither read nor written.
    Failed,
    /// Being rebuilt (a new device in the slot): written everywhere, holding only the units
    /// below its checkpoint `below`, and read only there.
    Rebuilding { below: u64 },
}

impl MemberState {
    /// Whether a member in this state may serve (be read for) a chunk of unit `unit` (a
    /// stripe or mirror row): the one rule every read and reconstruct decision follows.
    pub fn serves(self, unit: u64) -> bool {
        match self {
            MemberState::Active => true,
            MemberState::Failed => false,
            MemberState::Rebuilding { below } => unit < below,
        }
    }

    pub fn is_failed(self) -> bool {
        self == MemberState::Failed
    }
}

/// Who may serve one unit (stripe or mirror row), from one read of the member state
/// (`Members::at`): `MemberState::serves` over every slot. A member in neither set serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHolders {
    /// Failed or missing: neither read nor written.
    pub failed: MemberSet,
    /// Being rebuilt and not past this unit yet: written (which brings them up to date for
    /// the part written), never read.
    pub behind: MemberSet,
}

impl UnitHolders {
    /// The members that may not be read for this unit: failed or behind.
    pub fn stale(&self) -> MemberSet {
        self.failed.union(self.behind)
    }

    /// Whether member `i` may serve a chunk of this unit.
    pub fn serves(&self, i: usize) -> bool {
        !self.stale().contains(i)
    }
}

/// Per-member I/O accounting.
pub(crate) struct Health {
    /// Set by the watchdog: every outstanding and later I/O fails with ETIMEDOUT.
    aborted: AtomicBool,
    /// I/Os that are waiting (not finished): their wakers, woken on abort, and when each
    /// started waiting, which the watchdog checks. Sharded by thread, so the reactors
    /// registering I/O on the same member never share a lock or a cache line.
    waiting: Sharded<Mutex<WaitSlab>>,
    io: Sharded<MemberIo>,
    /// Correctable read errors (decayed) and when the last one was counted.
    read_errors: Mutex<(u32, Option<Instant>)>,
    /// Totals for status and tests.
    pub(crate) corrected: AtomicU64,
    /// The device answered a discard with "not supported": it is not asked again.
    no_discard: AtomicBool,
    /// What its next flush has to make durable.
    flush: FlushState,
}

/// Whether a device's flush can be skipped, in one atomic word: bit 0 `DIRTY` (a write or
/// discard finished since the start of the last flush that succeeded), the bits above it the
/// flushes in flight. Rules:
/// * A write or discard sets `DIRTY` once it finished, whatever its result (`Changing`). One
///   whose future is dropped before it finished may still be in the kernel, to land after
///   any flush: it adds an in-flight count that never goes, so the device's flushes are
///   never skipped again.
/// * A flush that finds the word 0 is skipped: every change that finished before it was
///   called had finished before a flush was issued that then succeeded. Otherwise it
///   counts itself in and clears `DIRTY` in one step, before its system call: changes that
///   finish later set it again.
/// * A flush that fails, or whose future is dropped, sets `DIRTY` again in the same step
///   that counts it out: a flush is never skipped behind one that did not succeed, nor
///   while one is in flight.
/// * A new device starts `DIRTY`: what was written to it before it came (`dev.write` by
///   the add and replace paths, which flush it themselves) is flushed again, once.
/// * A skipped flush does not probe the device: a hung or dead member with nothing to
///   flush is found by its next read or write, as before any flush.
struct FlushState(AtomicU64);

const DIRTY: u64 = 1;
const IN_FLIGHT: u64 = 2;

impl FlushState {
    fn new() -> FlushState {
        FlushState(AtomicU64::new(DIRTY))
    }

    /// A change (write, discard) of the device finished.
    #[inline]
    fn changed(&self) {
        // A load first: while the device is dirty already, nothing is written to the word's
        // cache line, so reactors writing the same member do not pass it back and forth.
        if self.0.load(Ordering::SeqCst) & DIRTY == 0 {
            self.0.fetch_or(DIRTY, Ordering::SeqCst);
        }
    }

    /// A flush is about to be issued: None if it can be skipped, else its guard (count it
    /// out with `FlushGuard::done`).
    fn begin(&self) -> Option<FlushGuard<'_>> {
        let mut w = self.0.load(Ordering::SeqCst);
        loop {
            if w == 0 {
                return None;
            }
            match self.0.compare_exchange_weak(
                w,
                (w + IN_FLIGHT) & !DIRTY,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Some(FlushGuard { s: self, ok: false }),
                Err(now) => w = now,
            }
        }
    }
}

/// One flush in flight (`FlushState::begin`); dropped without `done(true)` it counts as
/// failed.
struct FlushGuard<'a> {
    s: &'a FlushState,
    ok: bool,
}

impl FlushGuard<'_> {
    fn done(mut self, ok: bool) {
        self.ok = ok;
    }
}

impl Drop for FlushGuard<'_> {
    fn drop(&mut self) {
        let mut w = self.s.0.load(Ordering::SeqCst);
        loop {
            let next = (w - IN_FLIGHT) | if self.ok { 0 } else { DIRTY };
            match self
                .s
                .0
                .compare_exchange_weak(w, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(now) => w = now,
            }
        }
    }
}

/// Held over a write or discard: `finished` sets `DIRTY`; dropped unfinished (its future
/// dropped while the device may still hold the op) it stops the device's flushes from ever
/// being skipped.
struct Changing<'a>(&'a FlushState);

impl Changing<'_> {
    fn finished(self) {
        self.0.changed();
        std::mem::forget(self);
    }
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        (self.0).0.fetch_add(IN_FLIGHT, Ordering::SeqCst);
    }
}

/// One I/O's entry in `Health::waiting`, removed when dropped.
struct Registration<'a> {
    h: &'a Health,
    key: Option<(usize, usize)>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some((shard, k)) = self.key.take() {
            let mut w = lock(self.h.waiting.get(shard));
            // An abort drains the slab (and no I/O registers after it), so a present key is
            // still ours.
            if w.contains(k) {
                w.remove(k);
            }
        }
    }
}

impl Health {
    /// Runs one I/O of this device; fails it with ETIMEDOUT (`aborted` builds the output)
    /// once the watchdog aborted the device. `watched`: a watchdog runs (else the I/O just
    /// runs). An I/O that completes on its first poll (tmpfs members copy inline) costs one
    /// atomic load; one that waits registers its waker and start time so the watchdog can see
    /// its age and an abort can wake it. Callers spend the task's cooperative budget
    /// (`reactor::coop`) before they start the I/O's clock, so a task whose I/O completes
    /// inline still yields now and then, and a yield is not counted as device latency.
    pub(crate) async fn timed<T>(
        &self,
        watched: bool,
        op: impl std::future::Future<Output = T>,
        aborted: impl FnOnce(io::Error) -> T,
    ) -> T {
        let h = self;
        let timeout = || io::Error::from_raw_os_error(libc::ETIMEDOUT);
        if h.aborted.load(Ordering::Acquire) {
            return aborted(timeout());
        }
        if !watched {
            return op.await;
        }
        let mut op = std::pin::pin!(op);
        // Registered in the shard of the thread that first waits; removed from that shard
        // (the future may be polled later on another thread) when it completes or is
        // dropped unfinished (a hedged read takes the first answers it needs and drops the
        // rest): a registration left behind would look to the watchdog like an I/O that
        // never answers, and it would fail the member as hung.
        let mut reg = Registration { h, key: None };
        let r = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = op.as_mut().poll(cx) {
                return Poll::Ready(Some(r));
            }
            let shard = reg.key.map_or_else(shard::index, |(s, _)| s);
            let mut w = lock(h.waiting.get(shard));
            if h.aborted.load(Ordering::Acquire) {
                return Poll::Ready(None);
            }
            match reg.key {
                Some((_, k)) => {
                    if let Some(slot) = w.get_mut(k) {
                        slot.0.clone_from(cx.waker());
                    }
                }
                None => reg.key = Some((shard, w.insert((cx.waker().clone(), Instant::now())))),
            }
            Poll::Pending
        })
        .await;
        drop(reg);
        match r {
            Some(r) => r,
            None => aborted(timeout()),
        }
    }

    /// The age of the oldest I/O waiting, and how many wait (the watchdog).
    fn oldest(&self) -> (usize, Option<Instant>) {
        let (mut n, mut oldest) = (0, None::<Instant>);
        for s in self.waiting.iter() {
            let w = lock(s);
            n += w.len();
            oldest = w.iter().map(|(_, (_, t))| *t).chain(oldest).min();
        }
        (n, oldest)
    }

    /// Fails every outstanding and later I/O with ETIMEDOUT.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let wakers: Vec<Waker> = self
            .waiting
            .iter()
            .flat_map(|s| lock(s).drain().map(|(w, _)| w).collect::<Vec<_>>())
            .collect();
        for w in wakers {
            w.wake();
        }
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

impl Default for Health {
    fn default() -> Self {
        Health {
            aborted: AtomicBool::new(false),
            waiting: Sharded::default(),
            io: Sharded::default(),
            read_errors: Mutex::new((0, None)),
            corrected: AtomicU64::new(0),
            no_discard: AtomicBool::new(false),
            flush: FlushState::new(),
        }
    }
}

/// Devices a slot can be given in one session (the assembled one, devices added, spares and
/// replacements). A device the slot no longer uses is retired (`BlockDev::retire`) but its
/// handle stays allocated until the array is dropped: I/O still on its way to it keeps its
/// references valid without any counting on the I/O path.
pub const MAX_GENERATIONS: usize = 8;

/// One device generation of a slot: the device (None: missing at assembly) and its own
/// health (timeouts, error budget, counters), so a hung replaced device can never abort the
/// I/O of its successor.
type Generation<D> = std::sync::OnceLock<(Option<D>, Health)>;

/// The (current, replacement) generations of a slot packed in one word, so an I/O sees a
/// consistent pair even while a replacement is swapped in: bits 0..8 the current generation,
/// bits 8..16 the replacement's plus one (0: none).
struct Slot<D> {
    gens: Box<[Generation<D>]>,
    cur: std::sync::atomic::AtomicUsize,
}

/// Bit 16 of the pair word: the replacement is being swapped in (its superblock may name
/// it on disk already), so it can no longer be dropped: a failure of it is held for the swap
/// round's decision (`replacement_failed`).
const SWAPPING: usize = 1 << 16;

fn unpack(w: usize) -> (usize, Option<usize>) {
    (w & 0xff, ((w >> 8) & 0xff).checked_sub(1))
}

fn pack(cur: usize, repl: Option<usize>) -> usize {
    cur | repl.map_or(0, |r| (r + 1) << 8)
}

impl<D> Slot<D> {
    fn new(dev: Option<D>) -> Slot<D> {
        let gens: Box<[Generation<D>]> = (0..MAX_GENERATIONS)
            .map(|_| std::sync::OnceLock::new())
            .collect();
        let _ = gens[0].set((dev, Health::default()));
        Slot {
            gens,
            cur: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn pair(&self) -> (usize, Option<usize>) {
        unpack(self.cur.load(Ordering::Acquire))
    }

    /// The highest generation set (a new device goes above it; a dropped replacement's
    /// cell stays set).
    fn top(&self) -> usize {
        self.gens
            .iter()
            .rposition(|g| g.get().is_some())
            .unwrap_or(0)
    }

    fn current(&self) -> &(Option<D>, Health) {
        self.gens[self.pair().0]
            .get()
            .expect("the current generation is set before it is published")
    }
}

pub struct Members<D: BlockDev> {
    slots: Vec<Slot<D>>,
    failed: AtomicU64,
    /// Members being rebuilt (recovery/rebuild.rs): present and written, but holding only
    /// the units below their checkpoint (`rebuilt`). A failed member is never rebuilding.
    rebuilding: AtomicU64,
    rebuilt: Vec<AtomicU64>,
    /// Held while a slot's current device changes (`install`, `promote_replacement`) and
    /// while the rebuild moves a checkpoint or ends a rebuild for the device it rebuilt
    /// (`set_rebuilt_for`, `rebuild_done_for`): a check of the generation and the change it
    /// allows are one step, so a device put in meanwhile never inherits the old one's
    /// checkpoint or its "done".
    devices: Mutex<()>,
    /// Bad-block lists (uraid_core::badblocks): a member's chunk of a listed unit is never
    /// read (`at` counts it behind there). `bad_members`: slots with an entry, so `at` costs
    /// one more atomic load when the list is empty. Every superblock round writes this list.
    bad: std::sync::RwLock<BadBlocks>,
    bad_members: AtomicU64,
    /// Slots whose device has held no unit that reads could use since assembly (missing or
    /// being rebuilt then, until a rebuild finishes): the only ones a rebuild may fill from
    /// a verified decode of an unsynced stripe (recovery/rebuild.rs). A device that served
    /// reads may have served bytes its stripe's parity does not reflect (a write torn by
    /// the cut); a decode, even one the parities agree on, would change them.
    unseen: AtomicU64,
    /// Slots whose replacement failed while being swapped in.
    repl_failed: AtomicU64,
    /// Slots every I/O of which is timed, not one in `LATENCY_SAMPLE` (`time_every`).
    time_all: AtomicU64,
    data_offset: u64,
    policy: ErrorPolicy,
    /// Member data-area writes that bypassed the journal (allocation-map pages), and how
    /// many of them the last completed flush of every member covered (journal.rs,
    /// write-back FLUSH).
    unjournaled: AtomicU64,
    unjournaled_flushed: AtomicU64,
    /// Devices that left their slot this session (`Departed`), oldest first, at most
    /// `DEPARTED_KEPT`.
    departed: Mutex<Vec<Departed>>,
}

/// A device that left its slot while the array served (status: which drive to pull). Kept
/// in memory for the server's lifetime; the superblocks name only current devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    pub slot: usize,
    /// The device (its path).
    pub device: String,
    /// "failed" (a new device or spare took its slot), "replaced" (`uraid replace`), or
    /// "removed" (`uraid remove`).
    pub how: &'static str,
    /// The device that took the slot, if one did.
    pub by: Option<String>,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

/// How many departures `Members` keeps (the oldest go first).
pub const DEPARTED_KEPT: usize = 64;

/// errno values that mean "this sector could not be read" rather than "the device is gone".
fn media_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO) | Some(libc::ENODATA) | Some(libc::EILSEQ) | Some(libc::EBADMSG)
    )
}

impl<D: BlockDev> Members<D> {
    /// `devs[i]` None = missing; `failed` = slots the superblocks already record failed;
    /// `rebuilt[i]` Some(checkpoint) for a member being rebuilt.
    pub fn new(
        devs: Vec<Option<D>>,
        failed: MemberSet,
        rebuilt: Vec<Option<u64>>,
        data_offset: u64,
        policy: ErrorPolicy,
    ) -> Members<D> {
        let missing: MemberSet = (0..devs.len()).filter(|&i| devs[i].is_none()).collect();
        let failed = failed.union(missing);
        let rebuilding: MemberSet = (0..devs.len())
            .filter(|&i| rebuilt[i].is_some() && !failed.contains(i))
            .collect();
        Members {
            failed: AtomicU64::new(failed.bits()),
            rebuilding: AtomicU64::new(rebuilding.bits()),
            rebuilt: rebuilt
                .iter()
                .map(|r| AtomicU64::new(r.unwrap_or(0)))
                .collect(),
            devices: Mutex::new(()),
            slots: devs.into_iter().map(Slot::new).collect(),
            bad: Default::default(),
            bad_members: AtomicU64::new(0),
            unseen: AtomicU64::new(failed.union(rebuilding).bits()),
            repl_failed: AtomicU64::new(0),
            time_all: AtomicU64::new(0),
            data_offset,
            policy,
            unjournaled: AtomicU64::new(0),
            unjournaled_flushed: AtomicU64::new(0),
            departed: Mutex::new(Vec::new()),
        }
    }

    /// Notes that generation `old` of slot `i` left the slot (`how`), the slot's current
    /// device having taken it if `by`.
    fn depart(&self, i: usize, old: usize, how: &'static str, by: bool) {
        let Some(device) = self.slots[i].gens[old]
            .get()
            .and_then(|(d, _)| d.as_ref())
            .map(|d| d.name().to_string())
        else {
            return;
        };
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let d = Departed {
            slot: i,
            device,
            how,
            by: by.then(|| self.name(i).map(str::to_string)).flatten(),
            at,
        };
        let mut v = self.departed.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() >= DEPARTED_KEPT {
            v.remove(0);
        }
        v.push(d);
    }

    /// The devices that left their slot this session, oldest first.
    pub fn departed(&self) -> Vec<Departed> {
        self.departed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Slot `i`'s device is removed (`uraid remove`): noted, then let go of.
    pub(crate) fn remove_device(&self, i: usize) {
        let g = self.generation(i);
        self.depart(i, g, "removed", false);
        self.retire(i, g);
    }

    /// A member data-area write that does not go through the journal is about to be issued
    /// (allocation-map pages): the next FLUSH flushes the members.
    pub(crate) fn note_unjournaled(&self) {
        self.unjournaled.fetch_add(1, Ordering::AcqRel);
    }

    /// Unjournaled writes noted so far (read before a flush of every member).
    pub(crate) fn unjournaled_issued(&self) -> u64 {
        self.unjournaled.load(Ordering::Acquire)
    }

    /// A flush of every member that began after `seen` unjournaled writes completed.
    pub(crate) fn unjournaled_covered(&self, seen: u64) {
        self.unjournaled_flushed.fetch_max(seen, Ordering::AcqRel);
    }

    /// The failed set, or `Failed` if an array of geometry `geo` over these members cannot
    /// serve every byte. Members being rebuilt count as lost here (they do not hold every
    /// unit yet) but are not in the set returned: writes go to them.
    pub(crate) fn check_serving(&self, geo: &Geometry) -> Result<MemberSet, ArrayError> {
        let f = self.failed();
        if geo.survives(self.degraded()) {
            Ok(f)
        } else {
            Err(ArrayError::Failed {
                lost: self.degraded().len(),
                members: geo.members,
                level: geo.level,
                tolerates: geo.fault_tolerance(),
            })
        }
    }

    /// Whether an unjournaled write was noted that no completed flush covers yet.
    pub(crate) fn unjournaled_pending(&self) -> bool {
        self.unjournaled.load(Ordering::Acquire) != self.unjournaled_flushed.load(Ordering::Acquire)
    }

    /// Start of the data area on every member.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn count(&self) -> usize {
        self.slots.len()
    }

    pub fn policy(&self) -> ErrorPolicy {
        self.policy
    }

    /// Members missing or failed.
    pub fn failed(&self) -> MemberSet {
        MemberSet::from_bits(self.failed.load(Ordering::Acquire))
    }

    pub fn is_failed(&self, i: usize) -> bool {
        self.failed().contains(i)
    }

    /// Members present and not failed.
    pub fn live(&self) -> MemberSet {
        MemberSet::all(self.count()).minus(self.failed())
    }

    /// Members being rebuilt (not failed).
    pub fn rebuilding(&self) -> MemberSet {
        let r = self.rebuilding.load(Ordering::Acquire);
        if r == 0 {
            return MemberSet::EMPTY;
        }
        MemberSet::from_bits(r).minus(self.failed())
    }

    /// Members marked rebuilding, failed or not (a superblock round decides their state
    /// against its own snapshot of the failed set).
    pub(crate) fn rebuilding_marked(&self) -> MemberSet {
        MemberSet::from_bits(self.rebuilding.load(Ordering::Acquire))
    }

    /// Member `i`'s health. A member is failed first (a failed member's rebuilding mark is
    /// only kept for the superblock round that records it), then rebuilding, else active.
    pub fn state(&self, i: usize) -> MemberState {
        let bit = 1u64 << i;
        if self.failed.load(Ordering::Acquire) & bit != 0 {
            MemberState::Failed
        } else if self.rebuilding.load(Ordering::Acquire) & bit != 0 {
            MemberState::Rebuilding {
                below: self.rebuilt[i].load(Ordering::Acquire),
            }
        } else {
            MemberState::Active
        }
    }

    /// Whether member `i` may serve a chunk of unit `unit` (`MemberState::serves`, and not
    /// on its bad-block list).
    pub fn serves(&self, i: usize, unit: u64) -> bool {
        self.state(i).serves(unit) && !self.is_bad(i, unit)
    }

    /// The bad-block lists as they are now (what the next superblock round writes).
    pub fn bad_blocks(&self) -> BadBlocks {
        self.bad.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Slots with bad blocks.
    pub fn bad_members(&self) -> MemberSet {
        MemberSet::from_bits(self.bad_members.load(Ordering::Acquire))
    }

    /// Whether member `i`'s chunk of `unit` is on its bad-block list.
    pub fn is_bad(&self, i: usize, unit: u64) -> bool {
        self.bad_members.load(Ordering::Acquire) & (1 << i) != 0
            && self
                .bad
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(i, unit)
    }

    /// Replaces the lists (assembly: the superblock's).
    pub(crate) fn set_bad(&self, list: BadBlocks) {
        let mut b = self.bad.write().unwrap_or_else(|e| e.into_inner());
        *b = list;
        self.bad_members
            .store(b.members().bits(), Ordering::Release);
    }

    /// Records member `i`'s chunk of `unit` bad (a rebuild, replace or repair could not
    /// produce it): from now on it is not read. Durable with the next superblock round,
    /// which the caller makes before anything relies on the chunk (a rebuild checkpoint
    /// past it). `Full`: the list could not take it (nothing changed).
    pub(crate) fn mark_bad(&self, i: usize, unit: u64) -> Result<bool, Full> {
        let mut b = self.bad.write().unwrap_or_else(|e| e.into_inner());
        let r = b.add(i, unit);
        self.bad_members
            .store(b.members().bits(), Ordering::Release);
        r
    }

    /// Takes member `i`'s chunk of `unit` off the list: the caller wrote the whole chunk
    /// and flushed the member. False if it was not bad (or the full list cannot split a
    /// range: it stays bad).
    pub(crate) fn clear_bad(&self, i: usize, unit: u64) -> bool {
        if self.bad_members.load(Ordering::Acquire) & (1 << i) == 0 {
            return false;
        }
        let mut b = self.bad.write().unwrap_or_else(|e| e.into_inner());
        let r = b.remove(i, unit);
        self.bad_members
            .store(b.members().bits(), Ordering::Release);
        r
    }

    /// Failed, rebuilding or with bad blocks: the members the fast paths (which do not
    /// look at units) cannot count on. `degraded` decides whether the array survives.
    pub fn irregular(&self) -> MemberSet {
        self.degraded().union(self.bad_members())
    }

    /// Who may serve unit `unit` (stripe or mirror row): `MemberState::serves` for every
    /// member, from one load of the failed set. One more atomic load when nothing is being
    /// rebuilt.
    pub fn at(&self, unit: u64) -> UnitHolders {
        let failed = self.failed();
        let r = self.rebuilding.load(Ordering::Acquire);
        let bad = self.bad_members.load(Ordering::Acquire);
        if r == 0 && bad == 0 {
            return UnitHolders {
                failed,
                behind: MemberSet::EMPTY,
            };
        }
        let mut behind: MemberSet = MemberSet::from_bits(r)
            .minus(failed)
            .iter()
            .filter(|&i| {
                !MemberState::Rebuilding {
                    below: self.rebuilt(i),
                }
                .serves(unit)
            })
            .collect();
        if bad != 0 {
            // A chunk on the bad-block list is behind like one a rebuild has not reached.
            let list = self.bad.read().unwrap_or_else(|e| e.into_inner());
            for i in MemberSet::from_bits(bad).minus(failed).iter() {
                if list.contains(i, unit) {
                    behind = behind.with(i);
                }
            }
        }
        UnitHolders { failed, behind }
    }

    /// Members that may not serve unit `unit`: `at(unit).stale()`.
    pub fn stale_at(&self, unit: u64) -> MemberSet {
        self.at(unit).stale()
    }

    /// Failed or rebuilding: the members the array cannot count on everywhere.
    pub fn degraded(&self) -> MemberSet {
        MemberSet::from_bits(
            self.failed.load(Ordering::Acquire) | self.rebuilding.load(Ordering::Acquire),
        )
    }

    /// Units member `i` holds while it is rebuilt (its checkpoint).
    pub fn rebuilt(&self, i: usize) -> u64 {
        self.rebuilt[i].load(Ordering::Acquire)
    }

    /// Advances member `i`'s checkpoint: units below `to` are on it (caller: the rebuild,
    /// after its writes there completed).
    pub(crate) fn set_rebuilt(&self, i: usize, to: u64) {
        self.rebuilt[i].fetch_max(to, Ordering::AcqRel);
    }

    fn devices_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.devices.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The members being rebuilt now, each with its checkpoint and the device generation
    /// that checkpoint belongs to, read in one step with device changes (a slot given a new
    /// device is failed until `start_rebuilding`, so it is left out until its checkpoint
    /// is the new device's). What `set_rebuilt_for`, `rebuild_done_for` and persisted
    /// checkpoints are checked against.
    pub(crate) fn rebuilding_now(&self) -> Vec<(usize, u64, usize)> {
        let _g = self.devices_lock();
        self.rebuilding()
            .minus(self.failed())
            .iter()
            .map(|i| (i, self.rebuilt(i), self.generation(i)))
            .collect()
    }

    /// `set_rebuilt` if slot `i` is still being rebuilt onto device generation `gen` (the
    /// one the rebuild wrote); false (nothing done) if it was failed or given another
    /// device since.
    pub(crate) fn set_rebuilt_for(&self, i: usize, gen: usize, to: u64) -> bool {
        let _g = self.devices_lock();
        let ok = self.rebuilding().contains(i) && self.generation(i) == gen;
        if ok {
            self.set_rebuilt(i, to);
        }
        ok
    }

    /// `rebuild_done` if slot `i` is still being rebuilt onto device generation `gen`;
    /// false (nothing done) if it was failed or given another device since.
    pub(crate) fn rebuild_done_for(&self, i: usize, gen: usize) -> bool {
        let _g = self.devices_lock();
        let ok = self.rebuilding().contains(i) && self.generation(i) == gen;
        if ok {
            self.rebuild_done(i);
        }
        ok
    }

    /// Whether slot `i`'s device has served no reads since assembly (`unseen`).
    pub(crate) fn unseen_since_start(&self, i: usize) -> bool {
        self.unseen.load(Ordering::Acquire) & (1 << i) != 0
    }

    /// Slots whose device has served reads since assembly (in service then, or rebuilt
    /// since): the complement of `unseen`.
    pub(crate) fn seen(&self) -> MemberSet {
        MemberSet::all(self.count())
            .minus(MemberSet::from_bits(self.unseen.load(Ordering::Acquire)))
    }

    /// Member `i` holds every unit: it is an ordinary member from now on.
    pub(crate) fn rebuild_done(&self, i: usize) {
        self.unseen.fetch_and(!(1 << i), Ordering::AcqRel);
        self.rebuilding.fetch_and(!(1 << i), Ordering::AcqRel);
        self.rebuilt[i].store(0, Ordering::Release);
    }

    /// Times every I/O of the slots in `set` from now on, one in `LATENCY_SAMPLE` of the
    /// others: members flagged slow (slow.rs), which get few reads (probes), each slow.
    pub(crate) fn time_every(&self, set: MemberSet) {
        self.time_all.store(set.bits(), Ordering::Relaxed);
    }

    /// The start of member `i`'s read or write if it is to be timed: one in
    /// `LATENCY_SAMPLE` per thread, and every one of a slot in `time_every`.
    #[inline]
    fn sample(&self, i: usize, io: &MemberIo) -> Option<Timer> {
        let metric = io.sampled();
        (metric || self.time_all.load(Ordering::Relaxed) & (1 << i) != 0).then(|| Timer {
            t0: Instant::now(),
            metric,
        })
    }

    /// Whether every member device there is completes its reads inline (memory).
    pub fn all_inline(&self) -> bool {
        (0..self.count()).all(|i| self.device(i).is_none_or(|d| d.completes_inline()))
    }

    pub fn name(&self, i: usize) -> Option<&str> {
        self.device(i).map(|d| d.name())
    }

    fn health(&self, i: usize) -> &Health {
        &self.slots[i].current().1
    }

    /// Whether slot `i` can take another device this session.
    pub(crate) fn can_install(&self, i: usize) -> bool {
        self.slots[i].top() + 1 < MAX_GENERATIONS
    }

    /// The current device generation of slot `i` (changes when it is given a new device).
    pub fn generation(&self, i: usize) -> usize {
        self.slots[i].pair().0
    }

    /// Puts `dev` into slot `i` as its new device (the slot must be failed: no I/O goes to
    /// it until the caller clears that). Err: the slot had `MAX_GENERATIONS` devices this
    /// session already.
    pub(crate) fn install(&self, i: usize, dev: D, note: bool) -> Result<(), D> {
        let slot = &self.slots[i];
        let next = self.new_generation(i, dev)?;
        let guard = self.devices_lock();
        let (old, _) = unpack(slot.cur.swap(pack(next, None), Ordering::AcqRel));
        drop(guard);
        // `note`: the old device left with this (not a former member put back: re-add; not
        // a removed one, noted by `remove_device`).
        if note {
            self.depart(i, old, "failed", true);
        }
        self.retire(i, old);
        Ok(())
    }

    /// Lets go of generation `g` of slot `i` (`BlockDev::retire`): the slot no longer uses
    /// it.
    pub(crate) fn retire(&self, i: usize, g: usize) {
        if let Some((Some(d), _)) = self.slots[i].gens[g].get() {
            d.retire();
        }
    }

    /// Gives active member `i` a replacement device (`uraid replace`, md's
    /// want_replacement): from now on every data and metadata write and every flush of the
    /// slot also goes to it, reads do not. Err: no room for another generation, or the slot
    /// has a replacement already.
    pub(crate) fn set_replacement(&self, i: usize, dev: D) -> Result<(), D> {
        let slot = &self.slots[i];
        let cur = slot.pair().0;
        let next = self.new_generation(i, dev)?;
        slot.cur.store(pack(cur, Some(next)), Ordering::Release);
        Ok(())
    }

    /// Stores `dev` as slot `i`'s next generation (not yet used by any I/O). Err: no room
    /// for another generation, or the slot has a replacement (one new device at a time).
    fn new_generation(&self, i: usize, dev: D) -> Result<usize, D> {
        let slot = &self.slots[i];
        let next = slot.top() + 1;
        if next >= MAX_GENERATIONS || slot.pair().1.is_some() {
            return Err(dev);
        }
        slot.gens[next]
            .set((Some(dev), Health::default()))
            .map_err(|(d, _)| d.expect("just given"))?;
        Ok(next)
    }

    /// The highest device generation slot `i` has (a replacement just set is it).
    pub(crate) fn generation_top(&self, i: usize) -> usize {
        self.slots[i].top()
    }

    /// The replacement device of slot `i`, if it has one: its generation and name.
    pub fn replacement(&self, i: usize) -> Option<(usize, &str)> {
        let r = self.slots[i].pair().1?;
        let name = self.slots[i].gens[r].get()?.0.as_ref()?.name();
        Some((r, name))
    }

    /// Ends slot `i`'s replacement without using it (the replacement failed, or the
    /// operator or the old member's failure ended it). False (nothing done) if `gen` is not
    /// its replacement any more, or it is being swapped in (`begin_swap`).
    pub(crate) fn drop_replacement(&self, i: usize, gen: usize) -> bool {
        let slot = &self.slots[i];
        let w = slot.cur.load(Ordering::Acquire);
        let (cur, repl) = unpack(w);
        let dropped = w & SWAPPING == 0
            && repl == Some(gen)
            && slot
                .cur
                .compare_exchange(w, pack(cur, None), Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if dropped {
            self.retire(i, gen);
        }
        dropped
    }

    /// Marks slot `i`'s replacement `gen` as being swapped in: from now on it cannot be
    /// dropped. False if it is not the slot's replacement any more.
    pub(crate) fn begin_swap(&self, i: usize, gen: usize) -> bool {
        let slot = &self.slots[i];
        let w = slot.cur.load(Ordering::Acquire);
        unpack(w).1 == Some(gen)
            && slot
                .cur
                .compare_exchange(w, w | SWAPPING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The swap of slot `i`'s replacement did not happen (its superblock could not be
    /// written): it can be dropped again.
    pub(crate) fn end_swap(&self, i: usize) {
        self.slots[i].cur.fetch_and(!SWAPPING, Ordering::AcqRel);
    }

    /// Makes slot `i`'s replacement its device, in one store: after the superblocks name it
    /// (the replace finished), or while the slot is failed (the old member failed during
    /// the replace; the caller records it rebuilding). False if it has none.
    pub(crate) fn promote_replacement(&self, i: usize) -> bool {
        let slot = &self.slots[i];
        let w = slot.cur.load(Ordering::Acquire);
        let (old, Some(repl)) = unpack(w) else {
            return false;
        };
        let guard = self.devices_lock();
        let swapped = slot
            .cur
            .compare_exchange(w, pack(repl, None), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        drop(guard);
        if swapped {
            // Its replacement takes over a member that failed during the replace, or ends it.
            let how = if self.is_failed(i) {
                "failed"
            } else {
                "replaced"
            };
            self.depart(i, old, how, true);
            self.retire(i, old);
        }
        swapped
    }

    /// Writes to slot `i`'s replacement only (the replace walk's copy), at a data-area
    /// offset. Err (Interrupted): the slot has no replacement `gen` any more.
    pub(crate) async fn write_replacement(
        &self,
        i: usize,
        gen: usize,
        off: u64,
        buf: IoBuf,
    ) -> io::Result<()> {
        if self.slots[i].pair().1 != Some(gen) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the replacement was dropped",
            ));
        }
        self.write_gen(i, gen, self.data_offset + off, buf).await
    }

    /// Flushes slot `i`'s replacement generation `gen`.
    pub(crate) async fn flush_gen(&self, i: usize, gen: usize) -> io::Result<()> {
        let (dev, h) = self.gen_dev(i, gen)?;
        crate::reactor::coop().await;
        let Some(guard) = h.flush.begin() else {
            return Ok(()); // nothing to make durable (`FlushState`)
        };
        let io = h.io.local();
        let t0 = Some(Instant::now());
        let r = self.timed(h, dev.flush(), Err).await;
        guard.done(r.is_ok());
        account(&io.flush, 0, r.is_ok(), t0);
        r
    }

    pub(crate) async fn write_gen(
        &self,
        i: usize,
        gen: usize,
        at: u64,
        data: impl Into<MemberData>,
    ) -> io::Result<()> {
        let data = data.into();
        let (dev, h) = self.gen_dev(i, gen)?;
        crate::reactor::coop().await;
        let changing = Changing(&h.flush);
        let (io, len) = (h.io.local(), data.len() as u64);
        let t0 = self.sample(i, io);
        let r = match data {
            MemberData::Buf(buf) => {
                self.timed(h, dev.write(at, buf), |e| (Err(e), crate::buf::alloc(0)))
                    .await
                    .0
            }
            MemberData::Gather(segs) => self.timed(h, dev.write_gather(at, segs), Err).await,
        };
        changing.finished();
        account_timed(&io.write, io, len, r.is_ok(), t0);
        r
    }

    /// A write or flush of a replacement failed: the replacement is dropped (the slot keeps
    /// its device; the replace reports it), or, while it is being swapped in, the failure is
    /// noted for the swap round.
    pub(crate) fn replacement_failed(&self, i: usize, gen: usize, e: &io::Error) {
        if self.slots[i].pair().1 != Some(gen) {
            return;
        }
        let name = self.slots[i].gens[gen]
            .get()
            .and_then(|g| g.0.as_ref())
            .map_or("?", |d| d.name());
        if self.drop_replacement(i, gen) {
            tracing::error!(
                "member {i}: its replacement ({name}) failed: {e}; the replace is abandoned"
            );
        } else if self.slots[i].pair().1 == Some(gen)
            && self.repl_failed.fetch_or(1 << i, Ordering::AcqRel) & (1 << i) == 0
        {
            // Being swapped in: whether the superblocks name it is decided by the swap
            // round. The failure is noted for it; the caller's failure barrier holds the
            // I/O until that round is over (`Array::failure_barrier`).
            tracing::error!(
                "member {i}: its replacement ({name}) failed while being swapped in: {e}"
            );
        }
    }

    /// Slots whose replacement failed while being swapped in (`replacement_failed`).
    pub(crate) fn replacement_failures(&self) -> MemberSet {
        MemberSet::from_bits(self.repl_failed.load(Ordering::Acquire))
    }

    /// The swap round of slot `i` is over: its replacement failure note is consumed.
    pub(crate) fn take_replacement_failure(&self, i: usize) -> bool {
        self.repl_failed.fetch_and(!(1 << i), Ordering::AcqRel) & (1 << i) != 0
    }

    /// A replacement I/O half `b` of a mirrored write or flush issued with replacement `r`:
    /// if `r` has become the slot's device meanwhile, its error is the slot's.
    fn replacement_result(
        &self,
        i: usize,
        r: usize,
        a: io::Result<()>,
        b: io::Result<()>,
    ) -> io::Result<()> {
        match b {
            Err(e) if self.generation(i) == r => Err(e),
            Err(e) => {
                self.replacement_failed(i, r, &e);
                a
            }
            Ok(()) => a,
        }
    }

    /// Makes failed member `i` a member being rebuilt from unit 0 (after `install`).
    pub(crate) fn start_rebuilding(&self, i: usize) {
        self.rebuilt[i].store(0, Ordering::Release);
        // The new device holds nothing: its rebuild, not the old device's list, decides
        // which of its chunks are bad.
        if self.bad_members.load(Ordering::Acquire) & (1 << i) != 0 {
            let mut b = self.bad.write().unwrap_or_else(|e| e.into_inner());
            b.forget(i);
            self.bad_members
                .store(b.members().bits(), Ordering::Release);
        }
        self.rebuilding.fetch_or(1 << i, Ordering::AcqRel);
        self.failed.fetch_and(!(1 << i), Ordering::AcqRel);
    }

    /// Adds `i` to the failed set; true if it was not failed before.
    pub(crate) fn mark_failed(&self, i: usize) -> bool {
        self.failed.fetch_or(1 << i, Ordering::AcqRel) & (1 << i) == 0
    }

    /// Reads corrected on member `i` so far.
    pub fn corrected_reads(&self, i: usize) -> u64 {
        self.health(i).corrected.load(Ordering::Relaxed)
    }

    pub fn device(&self, i: usize) -> Option<&D> {
        self.slots[i].current().0.as_ref()
    }

    /// The current device of slot `i` and its health (one load: an I/O keeps the pair it
    /// started with even if the slot gets a new device meanwhile).
    fn dev(&self, i: usize) -> io::Result<(&D, &Health, usize)> {
        let g = self.generation(i);
        self.gen_dev(i, g).map(|(d, h)| (d, h, g))
    }

    /// Generation `g` of slot `i`: its device and health (ENODEV: none there).
    fn gen_dev(&self, i: usize, g: usize) -> io::Result<(&D, &Health)> {
        match self.slots[i].gens[g].get() {
            Some((Some(d), h)) => Ok((d, h)),
            _ => Err(io::Error::from_raw_os_error(libc::ENODEV)),
        }
    }

    /// An error of an I/O issued to generation `g` of slot `i`: marked stale if the slot
    /// has another device by now.
    fn mark_stale(&self, i: usize, g: usize, e: io::Error) -> io::Error {
        if self.generation(i) != g {
            io::Error::new(e.kind(), StaleDevice(e))
        } else {
            e
        }
    }

    /// Reads member `i`'s chunk bytes of units `units` (stripes or mirror rows, as in `at`)
    /// from the data area, if the slot still serves them once its device is picked: the
    /// caller planned the read from an earlier look at the member state, and meanwhile (on
    /// another reactor, or across an await) the slot may have been failed and given a new
    /// device that does not hold them yet. That read would return the new device's bytes as
    /// data; it is refused with `NotHeld` (`Verdict::Stale`: plan again). The state is read
    /// after the device: a device put in after a failure is visible only with the failure
    /// or the rebuild mark that came before it.
    pub async fn read(
        &self,
        i: usize,
        units: std::ops::Range<u64>,
        off: u64,
        buf: IoBuf,
    ) -> (io::Result<()>, IoBuf) {
        self.read_at(i, self.data_offset + off, buf, units).await
    }

    /// Writes to the data area.
    pub async fn write(&self, i: usize, off: u64, data: impl Into<MemberData>) -> io::Result<()> {
        self.write_raw(i, self.data_offset + off, data).await
    }

    /// Reads at a member offset from the slot's device now, only if it serves `units`.
    async fn read_at(
        &self,
        i: usize,
        at: u64,
        buf: IoBuf,
        units: std::ops::Range<u64>,
    ) -> (io::Result<()>, IoBuf) {
        let (dev, h, g) = match self.dev(i) {
            Ok(d) => d,
            Err(e) => return (Err(e), buf),
        };
        if let Some(unit) = units.into_iter().find(|&u| !self.serves(i, u)) {
            let e = io::Error::other(NotHeld { member: i, unit });
            return (Err(e), buf);
        }
        crate::reactor::coop().await;
        let (io, len) = (h.io.local(), buf.len() as u64);
        let t0 = self.sample(i, io);
        // Aborted before the device returned the buffer: hand back an empty one.
        let (r, b) = self
            .timed(h, dev.read(at, buf), |e| (Err(e), crate::buf::alloc(0)))
            .await;
        account_timed(&io.read, io, len, r.is_ok(), t0);
        (r.map_err(|e| self.mark_stale(i, g, e)), b)
    }

    /// Writes at a member offset (metadata), and to the slot's replacement if it has one
    /// (a failure there only ends the replacement). The pair is loaded once: a write during
    /// the swap reaches both devices.
    pub async fn write_raw(
        &self,
        i: usize,
        at: u64,
        data: impl Into<MemberData>,
    ) -> io::Result<()> {
        let data = data.into();
        let (c, repl) = self.slots[i].pair();
        match repl {
            None => self.write_at(i, c, at, data).await,
            Some(r) => {
                let copy = data.duplicate();
                let (a, b) = futures::join!(
                    self.write_at(i, c, at, data),
                    self.write_gen(i, r, at, copy)
                );
                self.replacement_result(i, r, a, b)
            }
        }
    }

    /// Writes to the slot's current device only (superblocks: a replacement gets its own
    /// in the round that swaps it in).
    pub(crate) async fn write_cur(&self, i: usize, at: u64, buf: IoBuf) -> io::Result<()> {
        self.write_at(i, self.generation(i), at, buf.into()).await
    }

    /// Writes to generation `g` of slot `i`, its error marked stale if the slot has another
    /// device by now.
    async fn write_at(&self, i: usize, g: usize, at: u64, data: MemberData) -> io::Result<()> {
        self.write_gen(i, g, at, data)
            .await
            .map_err(|e| self.mark_stale(i, g, e))
    }

    /// Flushes slot `i`'s device, and its replacement if it has one (a failure there only
    /// ends the replacement).
    pub async fn flush(&self, i: usize) -> io::Result<()> {
        let (c, repl) = self.slots[i].pair();
        let cur = async {
            self.flush_gen(i, c)
                .await
                .map_err(|e| self.mark_stale(i, c, e))
        };
        match repl {
            None => cur.await,
            Some(r) => {
                let (a, b) = futures::join!(cur, self.flush_gen(i, r));
                self.replacement_result(i, r, a, b)
            }
        }
    }

    /// Member `i`'s I/O totals so far (data and metadata I/O).
    pub fn io(&self, i: usize) -> MemberIoSnapshot {
        let io = &self.health(i).io;
        MemberIoSnapshot {
            read: OpCounters::sum(io.iter().map(|c| &c.read)),
            write: OpCounters::sum(io.iter().map(|c| &c.write)),
            flush: OpCounters::sum(io.iter().map(|c| &c.flush)),
            discard: OpCounters::sum(io.iter().map(|c| &c.discard)),
            judge_timed: io
                .iter()
                .map(|c| c.judge_timed.load(Ordering::Relaxed))
                .sum(),
            judge_ns: io.iter().map(|c| c.judge_ns.load(Ordering::Relaxed)).sum(),
        }
    }

    /// Discards `[off, off + len)` of slot `i`'s data area (`BlockDev::discard`) on its device
    /// and on its replacement if it has one. Advisory: the allocation map, not the device,
    /// says what reads as zeros, so an error fails neither (it is counted, and returned for
    /// the caller to log), and a device that cannot discard is not asked again. A discard
    /// is timed like any member I/O: one that hangs gets the member aborted by the watchdog.
    pub(crate) async fn discard(&self, i: usize, off: u64, len: u64) -> io::Result<()> {
        let (c, repl) = self.slots[i].pair();
        let at = self.data_offset + off;
        match repl {
            None => self.discard_gen(i, c, at, len).await,
            Some(r) => {
                let (a, b) = futures::join!(
                    self.discard_gen(i, c, at, len),
                    self.discard_gen(i, r, at, len)
                );
                a.and(b)
            }
        }
    }

    async fn discard_gen(&self, i: usize, gen: usize, at: u64, len: u64) -> io::Result<()> {
        let (dev, h) = self.gen_dev(i, gen)?;
        if h.no_discard.load(Ordering::Relaxed) {
            return Ok(());
        }
        crate::reactor::coop().await;
        let changing = Changing(&h.flush);
        let io = h.io.local();
        let t0 = Some(Instant::now());
        let r = self.timed(h, dev.discard(at, len), Err).await;
        changing.finished();
        let unsupported = r.as_ref().is_err_and(|e| {
            e.kind() == io::ErrorKind::Unsupported
                || matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS)
                )
        });
        if unsupported {
            h.no_discard.store(true, Ordering::Relaxed);
            return Ok(());
        }
        account(&io.discard, len, r.is_ok(), t0);
        r
    }

    /// Read errors counted against member `i`'s budget (decayed), and the budget.
    pub fn read_error_budget(&self, i: usize) -> (u32, u32) {
        let g = self
            .health(i)
            .read_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        (g.0, self.policy.max_read_errors)
    }

    /// Runs one member I/O; fails it with ETIMEDOUT (`aborted` builds the output) once the
    /// watchdog aborted the member. An I/O that completes on its first poll (tmpfs members
    /// copy inline) costs one atomic load; one that waits registers its waker and start time
    /// so the watchdog can see its age and an abort can wake it.
    async fn timed<T>(
        &self,
        h: &Health,
        op: impl std::future::Future<Output = T>,
        aborted: impl FnOnce(io::Error) -> T,
    ) -> T {
        h.timed(self.policy.io_timeout.is_some(), op, aborted).await
    }

    /// Decides what a failed I/O on member `i` means. `read`: whether it was a data read
    /// (which the caller can repair from redundancy).
    pub(crate) fn classify(&self, i: usize, read: bool, e: &io::Error) -> Verdict {
        if is_stale(e) {
            return Verdict::Stale;
        }
        if !read || !media_error(e) || self.health(i).aborted.load(Ordering::Acquire) {
            return Verdict::Fail;
        }
        let mut g = self
            .health(i)
            .read_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(last) = g.1 {
            let hours = now.duration_since(last).as_secs() / 3600;
            g.0 = g.0.checked_shr(hours.min(31) as u32).unwrap_or(0);
        }
        g.1 = Some(now);
        g.0 += 1;
        if g.0 > self.policy.max_read_errors {
            tracing::error!(
                "member {i} ({}): {} read errors, more than --max-read-errors {}: failing it",
                self.name(i).unwrap_or("?"),
                g.0,
                self.policy.max_read_errors
            );
            Verdict::Fail
        } else {
            Verdict::Correct
        }
    }

    pub(crate) fn count_corrected(&self, i: usize) {
        self.health(i).corrected.fetch_add(1, Ordering::Relaxed);
    }

    /// Every device generation of every slot with its health: (slot, generation, device
    /// name, health). The watchdog ages all of them (a replaced device's I/O too).
    fn generations(&self) -> impl Iterator<Item = (usize, usize, &str, &Health)> {
        self.slots.iter().enumerate().flat_map(|(i, s)| {
            s.gens.iter().enumerate().filter_map(move |(g, cell)| {
                cell.get()
                    .map(|(d, h)| (i, g, d.as_ref().map_or("?", |d| d.name()), h))
            })
        })
    }
}

/// Counts one member read or write (`account`), its latency where `Members::sample` timed
/// it: in the histogram if it is a sampled one, else for the fail-slow judgement only.
#[inline]
fn account_timed(c: &OpCounters, io: &MemberIo, bytes: u64, ok: bool, t: Option<Timer>) {
    match t {
        Some(Timer { t0, metric: false }) => {
            account(c, bytes, ok, None);
            let ns = t0.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            crate::shard::add(&io.judge_timed, 1);
            crate::shard::add(&io.judge_ns, ns);
        }
        _ => account(c, bytes, ok, t.map(|t| t.t0)),
    }
}

/// Counts one member I/O (and its latency when it was sampled).
#[inline]
fn account(c: &OpCounters, bytes: u64, ok: bool, t0: Option<Instant>) {
    c.record(bytes, ok);
    if let Some(t0) = t0 {
        c.observe(t0.elapsed());
    }
}

/// Something that owns a `Members` (the array); the watchdog holds it weakly.
pub(crate) trait HasMembers<D: BlockDev>: Send + Sync + 'static {
    fn members(&self) -> &Members<D>;
    /// Another device the watchdog times out (the journal), with its name.
    fn extra_device(&self) -> Option<(&Health, &str)> {
        None
    }
    /// Whether the array still serves every byte with the members in `lost` gone (the
    /// host-stall rule, `judge`). By default always: every timeout fails its member.
    fn survives(&self, _lost: MemberSet) -> bool {
        true
    }
}

/// What the watchdog does about the member I/O it sees in one round (`judge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Nothing waited past the timeout.
    Quiet,
    /// Time these members out (their I/O fails with ETIMEDOUT, which fails them).
    TimeOut(MemberSet),
    /// A host stall: I/O timed out on `together` at once (`over` past the timeout, the rest
    /// of `together` past half of it), more members than the array can lose: none is
    /// failed, their I/O keeps waiting.
    Stall {
        over: MemberSet,
        together: MemberSet,
    },
}

/// The watchdog's rule for one round (docs/design/failures.md, "Host stall"). `over`:
/// members not failed whose oldest waiting I/O has waited at least the timeout; `slow`:
/// those whose oldest waiting I/O has waited at least half of it (`over` among them: the
/// members that timed out "at once"); `lost`: members already failed, missing or being
/// rebuilt; `survives`: whether the array serves every byte without a set of members. If
/// the array survives losing `slow` as well, `over` is timed out as always (md's rule: a
/// member that stops answering is failed). If not, a timeout that hits more members at once
/// than the level tolerates is taken for a stall of the host (memory starvation, a frozen
/// VM), not for that many dead drives: none is failed and their I/O keeps waiting. Errors
/// (not timeouts) still fail members, and a real loss beyond the tolerance still fails the
/// array through them.
pub(crate) fn judge(
    over: MemberSet,
    slow: MemberSet,
    lost: MemberSet,
    survives: impl Fn(MemberSet) -> bool,
) -> Judgement {
    if over.is_empty() {
        return Judgement::Quiet;
    }
    let together = slow.union(over);
    if survives(lost.union(together)) {
        Judgement::TimeOut(over)
    } else {
        Judgement::Stall { over, together }
    }
}

/// How often a host stall that goes on is logged again (at most; at least once per timeout).
const STALL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Starts the I/O watchdog for `owner` if its policy has a timeout: a thread that checks
/// every timeout/8 (at most 1 s) how long each member's oldest waiting I/O has waited, and
/// aborts a member whose oldest I/O has waited longer than the timeout (per I/O, so one
/// stuck request is caught even while the member completes others), unless that would fail
/// more members than the array tolerates (`judge`: a host stall, logged while it lasts,
/// nothing aborted). It exits when the owner is dropped.
pub(crate) fn spawn_watchdog<D: BlockDev, A: HasMembers<D>>(owner: &Arc<A>) {
    let Some(timeout) = owner.members().policy.io_timeout else {
        return;
    };
    let weak: Weak<A> = Arc::downgrade(owner);
    let tick = (timeout / 8).clamp(Duration::from_millis(5), Duration::from_secs(1));
    // While a host stall lasts: when it began and when it was last logged.
    let mut stall: Option<(Instant, Instant)> = None;
    let spawned = std::thread::Builder::new()
        .name("uraid-watchdog".into())
        .spawn(move || loop {
            std::thread::sleep(tick);
            let Some(a) = weak.upgrade() else { return };
            let m = a.members();
            let failed = m.failed();
            // The slots' current devices: their ages decide between a dead member and a
            // stalled host.
            let (mut over, mut slow) = (MemberSet::EMPTY, MemberSet::EMPTY);
            let mut oldest_age = Duration::ZERO;
            for i in 0..m.count() {
                let h = m.health(i);
                if failed.contains(i) || h.is_aborted() {
                    continue;
                }
                let Some(oldest) = h.oldest().1 else { continue };
                let age = oldest.elapsed();
                oldest_age = oldest_age.max(age);
                if age >= timeout {
                    over = over.with(i);
                }
                if age >= timeout / 2 {
                    slow = slow.with(i);
                }
            }
            let verdict = judge(over, slow, m.degraded(), |lost| a.survives(lost));
            if let Judgement::Stall { over, together } = verdict {
                let now = Instant::now();
                match &mut stall {
                    None => {
                        tracing::error!(
                            "I/O timed out on {} member(s) at once ({over} past the timeout \
                             {timeout:?}, {together} waiting for {:.1?} or more): failing \
                             them would fail the array (members already lost: {}), so \
                             treating it as a host stall, not failing them; their I/O keeps \
                             waiting",
                            together.len(),
                            timeout / 2,
                            m.degraded()
                        );
                        stall = Some((now, now));
                    }
                    Some((since, logged))
                        if now.duration_since(*logged) >= STALL_LOG_EVERY.min(timeout) =>
                    {
                        tracing::error!(
                            "host stall for {:.0?}: I/O on members {together} still waiting \
                             (the oldest for {oldest_age:.0?}); nothing failed; the server \
                             waits as long as it lasts (a stop gives up on it, as after a \
                             crash)",
                            now.duration_since(*since)
                        );
                        *logged = now;
                    }
                    Some(_) => {}
                }
                // No timeout this round, the journal's and replacements' included: they
                // wait on the same stalled host.
                continue;
            }
            if let Some((since, _)) = stall.take() {
                tracing::warn!(
                    "host stall over after {:.1?}: member I/O answers again; no member was \
                     failed for it",
                    since.elapsed()
                );
            }
            // The members `judge` timed out; failed members' I/O still waiting (a stripe
            // operation may wait for it); replacements and replaced devices (a
            // replacement's timeout only ends the replace): per I/O, as always.
            for (i, g, name, h) in m.generations() {
                let live = g == m.generation(i) && !failed.contains(i);
                if h.is_aborted() || (live && !over.contains(i)) {
                    continue;
                }
                let (n, oldest) = h.oldest();
                let Some(oldest) = oldest else { continue };
                let age = oldest.elapsed();
                if age >= timeout {
                    tracing::error!(
                        "member {i} ({name}): an I/O has waited {:.1?} (timeout {:?}; {n} \
                         waiting): timing it out",
                        age,
                        timeout
                    );
                    h.abort();
                }
            }
            // The journal device, when the owner has one: a hung journal is failed like a
            // hung member (the array falls back to bitmap mode).
            if let Some((h, name)) = a.extra_device() {
                if let (n, Some(oldest)) = h.oldest() {
                    let age = oldest.elapsed();
                    if age >= timeout && !h.is_aborted() {
                        tracing::error!(
                            "journal {name}: an I/O has waited {age:.1?} (timeout {timeout:?}; \
                             {n} waiting): timing it out"
                        );
                        h.abort();
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the I/O watchdog thread: {e}; member I/O has no timeout");
    }
}

#[cfg(test)]
mod tests {
    use super::{is_stale, judge, ErrorPolicy, FlushState, Judgement, Members, Verdict};

    /// `FlushState`'s rules: a flush is skipped only when every change finished before the
    /// start of a flush that succeeded and no flush is in flight.
    #[test]
    fn a_flush_is_skipped_only_when_a_successful_flush_covered_every_change() {
        let s = FlushState::new();
        // A new device is flushed once.
        s.begin().expect("a new device is dirty").done(true);
        assert!(s.begin().is_none(), "nothing changed since");
        // A change, then a flush that covers it.
        s.changed();
        s.begin().expect("changed").done(true);
        assert!(s.begin().is_none());
        // A change that finishes while a flush is in flight is not covered by it.
        let g = s.begin();
        assert!(g.is_none());
        s.changed();
        let g = s.begin().expect("changed");
        s.changed();
        g.done(true);
        s.begin().expect("changed after the flush began").done(true);
        // While a flush is in flight, another is not skipped (the first has not made
        // anything durable yet), even with no change since it began.
        s.changed();
        let g1 = s.begin().expect("changed");
        let g2 = s.begin().expect("a flush is in flight");
        g2.done(true);
        assert!(s.begin().is_some_and(|g| {
            g.done(true);
            true
        }));
        g1.done(true);
        assert!(s.begin().is_none());
        // A flush that fails, or is dropped unfinished, leaves the device dirty, also for a
        // flush that was checked while it was in flight.
        s.changed();
        let g1 = s.begin().expect("changed");
        let g2 = s.begin().expect("in flight");
        g1.done(false);
        g2.done(true);
        s.begin()
            .expect("a failed flush is not skipped behind")
            .done(true);
        assert!(s.begin().is_none());
        s.changed();
        drop(s.begin().expect("changed"));
        s.begin()
            .expect("a dropped flush leaves it dirty")
            .done(true);
        assert!(s.begin().is_none());
        // A change that finished is covered by the next flush; one dropped unfinished (the
        // kernel may still write it) stops the skipping for good.
        super::Changing(&s).finished();
        s.begin().expect("changed").done(true);
        assert!(s.begin().is_none());
        drop(super::Changing(&s));
        for _ in 0..3 {
            s.begin()
                .expect("never skipped after a dropped change")
                .done(true);
        }
    }

    use crate::dev::FileDev;
    use uraid_core::MemberSet;

    /// Soak seed 16417 (RAID5, two reactors, under load): a read planned while member 1
    /// served stripe 0 picked its device only after the operator failed it and a spare took
    /// the slot, and returned the spare's unwritten bytes as data. Here the plan is taken,
    /// then the slot is failed and given a new device, then the planned read is issued: it
    /// is refused as stale (plan again) until the rebuild holds the unit; units beyond the
    /// checkpoint and chunks on the bad-block list are refused the same way; the old
    /// device's rebuild moves neither the new one's checkpoint nor ends its rebuild. Fails
    /// when `Members::read` reads whatever device the slot has.
    #[test]
    fn a_read_planned_before_its_slot_changed_is_refused() {
        let dir =
            std::path::PathBuf::from(format!("/dev/shm/uraid-members-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        const CHUNK: usize = 4096;
        let dev = |name: &str, fill: u8| {
            let p = dir.join(name);
            std::fs::write(&p, vec![fill; 4 * CHUNK]).unwrap();
            FileDev::open(&p).unwrap()
        };
        let m = Members::new(
            vec![
                Some(dev("a", 0xAA)),
                Some(dev("b", 0xBB)),
                Some(dev("c", 0xCC)),
            ],
            MemberSet::EMPTY,
            vec![None; 3],
            0,
            ErrorPolicy {
                max_read_errors: 20,
                io_timeout: None,
            },
        );
        let read = |i: usize, units: std::ops::Range<u64>| {
            let off = units.start * CHUNK as u64;
            let len = (units.end - units.start) as usize * CHUNK;
            let (r, b) = futures::executor::block_on(m.read(i, units, off, crate::buf::alloc(len)));
            r.map(|()| b[0])
        };
        assert_eq!(read(1, 0..1).unwrap(), 0xBB);
        let plan = m.at(0);
        assert!(plan.serves(1));
        let old = m.generation(1);
        // Meanwhile: the operator fails member 1 and a spare takes the slot.
        assert!(m.mark_failed(1));
        assert!(m.install(1, dev("spare", 0xEE), false).is_ok());
        assert!(
            m.rebuilding_now().is_empty(),
            "failed until its rebuild starts"
        );
        let e = read(1, 0..1).expect_err("a failed slot's new device is never read");
        assert!(is_stale(&e), "{e}");
        assert_eq!(m.classify(1, true, &e), Verdict::Stale);
        m.start_rebuilding(1);
        let e = read(1, 0..1).expect_err("the new device does not hold unit 0 yet");
        assert!(is_stale(&e), "{e}");
        // A rebuild of the old device that ends its batch or pass now moves nothing.
        assert!(!m.set_rebuilt_for(1, old, 4));
        assert!(!m.rebuild_done_for(1, old));
        assert_eq!(m.rebuilt(1), 0);
        assert!(m.rebuilding().contains(1));
        assert_eq!(m.rebuilding_now(), vec![(1, 0, m.generation(1))]);
        // The rebuild wrote unit 0 and moved its checkpoint: unit 0 is read, 1 is not, and
        // neither is a read spanning both.
        futures::executor::block_on(m.write(1, 0, crate::buf::copy_of(&[0x11u8; CHUNK]))).unwrap();
        assert!(m.set_rebuilt_for(1, m.generation(1), 1));
        assert_eq!(read(1, 0..1).unwrap(), 0x11);
        assert!(is_stale(&read(1, 1..2).unwrap_err()));
        assert!(is_stale(&read(1, 0..2).unwrap_err()));
        // A chunk put on the bad-block list is refused, its neighbours are not.
        assert!(m.mark_bad(0, 2).unwrap());
        assert!(is_stale(&read(0, 2..3).unwrap_err()));
        assert!(is_stale(&read(0, 1..3).unwrap_err()));
        assert_eq!(read(0, 1..2).unwrap(), 0xAA);
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn set(m: &[usize]) -> MemberSet {
        m.iter().copied().collect()
    }

    /// RAID6 of 6 (any two lost survive): timeouts on at most two members fail them; on
    /// more at once (the rest of `slow` counted with them) none is failed; members already
    /// lost count against the tolerance.
    #[test]
    fn judge_tells_a_host_stall_from_dead_members() {
        let survives = |lost: MemberSet| lost.len() <= 2;
        assert_eq!(
            judge(set(&[]), set(&[1, 2]), set(&[]), survives),
            Judgement::Quiet
        );
        assert_eq!(
            judge(set(&[3]), set(&[3]), set(&[]), survives),
            Judgement::TimeOut(set(&[3]))
        );
        assert_eq!(
            judge(set(&[3, 4]), set(&[]), set(&[]), survives),
            Judgement::TimeOut(set(&[3, 4]))
        );
        // Two past the timeout, a third past half of it: three at once.
        assert_eq!(
            judge(set(&[3, 4]), set(&[3, 4, 5]), set(&[]), survives),
            Judgement::Stall {
                over: set(&[3, 4]),
                together: set(&[3, 4, 5])
            }
        );
        // One lost already: two more at once is one too many.
        assert_eq!(
            judge(set(&[3]), set(&[3, 4]), set(&[0]), survives),
            Judgement::Stall {
                over: set(&[3]),
                together: set(&[3, 4])
            }
        );
        assert_eq!(
            judge(set(&[3]), set(&[3]), set(&[0]), survives),
            Judgement::TimeOut(set(&[3]))
        );
        // No redundancy left (a degraded RAID5): one hung member would fail the array.
        let raid5 = |lost: MemberSet| lost.len() <= 1;
        assert_eq!(
            judge(set(&[2]), set(&[2]), set(&[0]), raid5),
            Judgement::Stall {
                over: set(&[2]),
                together: set(&[2])
            }
        );
    }
}
