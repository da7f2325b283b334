//! The array: maps volume byte ranges onto member I/O for every level, keeps parity correct
//! through partial writes and member failures, and applies the member error policy.
//!
//! It knows nothing about the allocation map (that is `volume.rs`, on top of it). It composes
//! the components below it, which take each other as arguments and never import `Array`:
//! * `members.rs`: the devices, their typed health, every member I/O (timeouts, error
//!   classification);
//! * `metadata.rs`: superblock rounds, dirty/clean, the failure barrier (`Metadata`);
//! * `bitmap.rs` (`WriteIntent`), `journal.rs` (`Journal`): durability of writes;
//! * `stripe/`: the stripe lock table;
//! * `background.rs` (`Recovery`): what background work the request paths consult.
//!
//! This module's files: request routing, reads and writes (here), stripe reads and decode
//! (`stripe_io.rs`), stripe write execution (`stripe_write.rs`), the array's use of its
//! journal (`journal.rs`), operator member administration (`admin.rs`), the resync of one
//! stripe a write does first (`resync.rs`).
//!
//! Concurrency model (docs/design/stripes.md has the long form):
//! * Healthy reads touch no shared state: any reactor reads data chunks straight off members.
//! * Everything that reads parity or writes a stripe (mirror rows included) runs on the
//!   calling reactor under a per-stripe lock (`stripe::StripeLocks`).

use crate::background::Recovery;
use crate::bitmap::WriteIntent;
use crate::buf::{self, IoBuf, Segments};
use crate::dev::BlockDev;
use crate::members::{spawn_watchdog, ErrorPolicy, HasMembers, MemberData, Members, UnitHolders};
use crate::metadata::{MemberId, Metadata};
use crate::reactor::RuntimeHandle;
use crate::shard::Sharded;
use crate::stripe::{Attempt, StripeLocks};

pub(crate) mod admin;
mod badblocks;
mod discard;
mod journal;
mod resync;
mod status;
mod stripe_io;
mod stripe_write;
pub use admin::Added;
use futures::future::join_all;
pub use status::{ArrayStatus, BitmapStatus, Identity, MemberErrors, MemberStatus, ScrubStatus};
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uraid_core::format::Superblock;
use uraid_core::geometry::{Extent, Level, SECTOR};
use uraid_core::{Codec, Geometry, MemberSet};

pub use crate::error::ArrayError;

/// Bytes of a write request, shared between the pieces it is split into.
pub use crate::buf::WriteBuf;

/// Counters for the request planner, readable while the array runs. Every request bumps
/// them from every reactor, so each thread counts in its own shard (`crate::shard`: no cache
/// line bounces between cores; a shared counter cost 7% of a 4k random read's CPU with two
/// reactors) and readers sum the shards.
#[derive(Debug, Default)]
pub struct Stats(Sharded<Counters>);

/// One shard of `Stats`.
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub full_stripe_writes: AtomicU64,
    pub rcw_writes: AtomicU64,
    pub rmw_writes: AtomicU64,
    /// Writes that joined another write's stripe operation instead of running their own.
    pub merged_writes: AtomicU64,
    /// Stripe operations that waited for the rest of their stripe's writes (stripe/plug.rs),
    /// and those of them whose stripe filled before the wait ended.
    pub plugged_writes: AtomicU64,
    pub plug_filled: AtomicU64,
    /// Full-stripe writes of a batch of whole chunks from the requests' own bytes
    /// (`stripe_write_tiled`; also counted in `full_stripe_writes`).
    pub tiled_writes: AtomicU64,
    /// Chunks reconstructed after a media error and rewritten in place.
    pub corrected_reads: AtomicU64,
    /// Chunk reads served by reconstruction around a member flagged slow (slow.rs).
    pub slow_reads_around: AtomicU64,
}

/// A point-in-time copy of `Stats` (bench deltas, status, metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub reads: u64,
    pub writes: u64,
    pub degraded_reads: u64,
    pub full_stripe_writes: u64,
    pub rcw_writes: u64,
    pub rmw_writes: u64,
    pub merged_writes: u64,
    pub plugged_writes: u64,
    pub plug_filled: u64,
    pub tiled_writes: u64,
    pub corrected_reads: u64,
    pub slow_reads_around: u64,
}

impl Stats {
    /// Adds `n` to the counter `which` picks, in the calling thread's shard.
    #[inline]
    pub fn add(&self, which: impl Fn(&Counters) -> &AtomicU64, n: u64) {
        crate::shard::add(which(self.0.local()), n);
    }

    /// The sum over all shards of one counter.
    pub fn total(&self, which: impl Fn(&Counters) -> &AtomicU64) -> u64 {
        self.0
            .iter()
            .map(|c| which(c).load(Ordering::Relaxed))
            .sum()
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            reads: self.total(|c| &c.reads),
            writes: self.total(|c| &c.writes),
            degraded_reads: self.total(|c| &c.degraded_reads),
            full_stripe_writes: self.total(|c| &c.full_stripe_writes),
            rcw_writes: self.total(|c| &c.rcw_writes),
            rmw_writes: self.total(|c| &c.rmw_writes),
            merged_writes: self.total(|c| &c.merged_writes),
            plugged_writes: self.total(|c| &c.plugged_writes),
            plug_filled: self.total(|c| &c.plug_filled),
            tiled_writes: self.total(|c| &c.tiled_writes),
            corrected_reads: self.total(|c| &c.corrected_reads),
            slow_reads_around: self.total(|c| &c.slow_reads_around),
        }
    }
}

impl StatsSnapshot {
    /// What happened between `before` and this snapshot.
    pub fn since(&self, before: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            reads: self.reads - before.reads,
            writes: self.writes - before.writes,
            degraded_reads: self.degraded_reads - before.degraded_reads,
            full_stripe_writes: self.full_stripe_writes - before.full_stripe_writes,
            rcw_writes: self.rcw_writes - before.rcw_writes,
            rmw_writes: self.rmw_writes - before.rmw_writes,
            merged_writes: self.merged_writes - before.merged_writes,
            plugged_writes: self.plugged_writes - before.plugged_writes,
            plug_filled: self.plug_filled - before.plug_filled,
            tiled_writes: self.tiled_writes - before.tiled_writes,
            corrected_reads: self.corrected_reads - before.corrected_reads,
            slow_reads_around: self.slow_reads_around - before.slow_reads_around,
        }
    }
}

/// How an array is opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrayOptions {
    pub policy: ErrorPolicy,
    /// Never write superblocks (a benchmark on someone's array): failures stay in memory.
    pub frozen_metadata: bool,
    /// Keep trimmed ranges on the members (no discards: array/discard.rs); `serve
    /// --discard off`.
    pub no_discard: bool,
    /// The longest a partial-stripe write of a sequential stream waits for the rest of its
    /// stripe (stripe/plug.rs); zero (the default) never waits. `serve --merge-wait`.
    pub merge_wait: Duration,
    /// Read-ahead's memory budget in bytes (readahead.rs, used by `Volume`); zero (the
    /// default) turns it off. `serve --read-ahead`, `--read-ahead-memory`.
    pub read_ahead: u64,
    /// Read ahead even when every member is memory (tmpfs), where there is no latency to
    /// hide and prefetching only costs CPU; `serve --read-ahead on` (`auto` leaves it off).
    pub read_ahead_always: bool,
}

/// The composition of an array's components, and request routing over them. Each field is
/// private to this module (and its children: admin.rs, journal.rs, stripe_io.rs,
/// stripe_write.rs); the walks above it (recovery/, volume.rs) reach a component through
/// its accessor and call its methods with the other components they need as arguments.
///
/// Lock order: safe mode's first-write lock (`Metadata::begin_clean`, `hold_dirty`) → stripe
/// lock (`locks`) → write-intent and journal locks (`intent`, `journal`) → superblock lock
/// (`Metadata::lock`). A task may take a lock right of one it holds,
/// never one left of it: so journal checkpoints and `Journal::retire_slot` (their member
/// flush may need a superblock round) never run under the superblock lock.
pub struct Array<D: BlockDev> {
    geo: Geometry,
    codec: Option<Codec>,
    members: Members<D>,
    meta: Metadata,
    locks: StripeLocks,
    /// Request-planner counters (public: the control plane reads `stats.snapshot()`).
    pub stats: Stats,
    /// Background-work state: resync's synced set, walk progress, the replace under way,
    /// scrub counts, throttle, allocation probe (background.rs).
    recovery: Recovery,
    /// Members flagged fail-slow (slow.rs): reads plan around them while redundancy allows.
    slow: crate::slow::SlowMembers,
    /// Per slot: the rebuild checkpoint the superblock had at assembly (0 unless rebuilding
    /// then): units below it may have been read from that member this session.
    rebuilt_at_start: Vec<u64>,
    intent: WriteIntent,
    /// The journal device, once attached (`attach_journal`, after replay).
    journal: std::sync::OnceLock<crate::journal::Journal<D>>,
    /// The reactors this array runs on, if any (background work is sent there).
    rt: Option<RuntimeHandle>,
    /// This array (background work started from `&self` holds it).
    me: std::sync::Weak<Self>,
    /// `ArrayOptions::read_ahead` and `read_ahead_always`, for the volume over this array.
    read_ahead: (u64, bool),
    /// Trims reach the members as discards (array/discard.rs; `ArrayOptions::no_discard`).
    discards: bool,
    /// The discards begun, for reads that raced them (array/discard.rs).
    discard_log: discard::DiscardLog,
    /// Sequential write streams, and writes waiting for the rest of their stripe
    /// (stripe/plug.rs).
    streams: crate::stripe::plug::WriteStreams,
}

impl<D: BlockDev> HasMembers<D> for Array<D> {
    fn members(&self) -> &Members<D> {
        &self.members
    }

    fn extra_device(&self) -> Option<(&crate::members::Health, &str)> {
        self.journal.get().map(|j| (&j.health, j.name()))
    }

    fn survives(&self, lost: MemberSet) -> bool {
        self.geo.survives(lost)
    }
}

impl<D: BlockDev> Array<D> {
    /// Builds an array over assembled members. `devs[i]` is None for a missing member;
    /// `sb` is the freshest superblock (index and device uuid are rewritten per member when
    /// superblocks are written); `ids[i]` member i's uuid and freshest superblock slot. `rt`
    /// sizes the stripe lock table (8 shards per reactor). `bitmap`: the write-intent bitmap
    /// as read from the members (`bitmap::merge_copies`: bit r of word r/64 set = region r
    /// dirty); None: unknown (every region counts as dirty). After an unclean stop, resync
    /// walks exactly the dirty regions.
    pub fn new(
        sb: Superblock,
        ids: Vec<MemberId>,
        devs: Vec<Option<D>>,
        rt: Option<RuntimeHandle>,
        opts: ArrayOptions,
        bitmap: Option<Vec<u64>>,
    ) -> Arc<Self> {
        let geo = sb.geometry;
        assert_eq!(devs.len(), geo.members);
        assert_eq!(ids.len(), geo.members);
        let codec = geo
            .level
            .is_parity()
            .then(|| Codec::new(geo.data_chunks(), geo.parity()).expect("geometry was validated"));
        let recorded: MemberSet = (0..geo.members).filter(|&i| sb.is_failed(i)).collect();
        let absent: MemberSet = (0..geo.members).filter(|&i| devs[i].is_none()).collect();
        let shards = rt.as_ref().map_or(1, |r| r.reactors() * 8);
        let rt_handle = rt.clone();
        // Resync units: stripes on parity levels, chunk rows on mirrors; due after an
        // unclean stop on any level with redundancy, over the regions the write-intent
        // bitmap marks dirty, or everything without one (recovery/resync.rs).
        let units = geo.units();
        let bc = sb.bitmap_chunk;
        let due = (!sb.clean && geo.fault_tolerance() > 0).then(|| match (&bitmap, bc) {
            (Some(words), bc) if bc > 0 => uraid_core::bitmap::dirty_units(&geo, bc, words),
            _ => std::iter::once(0..units).collect(),
        });
        let resync_due = due
            .as_ref()
            .is_some_and(|d| d.iter().any(|r| !r.is_empty()));
        let intent = crate::bitmap::WriteIntent::new(&geo, bc, bitmap, opts.frozen_metadata);
        let bad = sb.bad.clone();
        // Replaces the superblocks record, for `resume_replace` (recovery/replace.rs).
        let resumable: Vec<crate::background::Resumable> = (0..geo.members)
            .filter_map(|i| {
                let r = sb.replaces[i]?;
                let units = crate::background::Resumable::units(r.copied, units, due.as_deref());
                Some(crate::background::Resumable {
                    slot: i,
                    uuid: r.uuid,
                    copied: r.copied,
                    units,
                })
            })
            .collect();
        let rebuilt_at_start: Vec<u64> = (0..geo.members)
            .map(|i| {
                if sb.is_rebuilding(i) {
                    sb.rebuilt[i]
                } else {
                    0
                }
            })
            .collect();
        let a = Arc::new_cyclic(|me| Array {
            geo,
            codec,
            members: Members::new(
                devs,
                recorded,
                (0..geo.members)
                    .map(|i| sb.is_rebuilding(i).then_some(sb.rebuilt[i]))
                    .collect(),
                sb.data_offset,
                opts.policy,
            ),
            meta: Metadata::new(sb, ids, opts.frozen_metadata, absent, resync_due),
            locks: StripeLocks::new(shards),
            stats: Stats::default(),
            recovery: Recovery::new(&geo, due),
            slow: crate::slow::SlowMembers::new(geo.members),
            rebuilt_at_start,
            intent,
            journal: std::sync::OnceLock::new(),
            rt: rt_handle,
            me: me.clone(),
            discards: !opts.no_discard,
            read_ahead: (opts.read_ahead, opts.read_ahead_always),
            discard_log: Default::default(),
            streams: crate::stripe::plug::WriteStreams::new(if geo.level.is_parity() {
                opts.merge_wait
            } else {
                Duration::ZERO
            }),
        });
        a.members.set_bad(bad);
        *a.recovery
            .replace_resume
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = resumable;
        spawn_watchdog(&a);
        a
    }

    /// Tells the array which units may hold data (`Volume::new`: from the allocation map).
    pub(crate) fn set_allocation(&self, f: Box<dyn Fn(u64, bool) -> bool + Send + Sync>) {
        self.recovery.set_allocation(f);
    }

    /// Whether a background walk can skip unit `unit` (`Recovery::skippable`).
    pub(crate) fn skippable(&self, unit: u64) -> bool {
        self.recovery.skippable(unit)
    }

    /// `skippable`, except that a unit whose first write is still filling it counts as
    /// empty: for a check under the unit's lock (scrub), where the fill has not reached the
    /// unit yet (it holds whatever the member held: garbage, not a mismatch) or has written
    /// it whole already (consistent); either way nothing there to verify yet.
    pub(crate) fn empty_under_lock(&self, unit: u64) -> bool {
        self.recovery.empty_under_lock(unit)
    }

    // ------------------------------------------------------------ components (for the walks)

    pub(crate) fn geo(&self) -> &Geometry {
        &self.geo
    }

    pub(crate) fn codec(&self) -> &Option<Codec> {
        &self.codec
    }

    pub(crate) fn members(&self) -> &Members<D> {
        &self.members
    }

    pub(crate) fn meta(&self) -> &Metadata {
        &self.meta
    }

    pub(crate) fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    pub(crate) fn intent(&self) -> &WriteIntent {
        &self.intent
    }

    pub(crate) fn rt(&self) -> &Option<RuntimeHandle> {
        &self.rt
    }

    /// Runs `f` on reactor 0 when the array has reactors (its member I/O then has member
    /// timeouts), here otherwise.
    pub(crate) async fn on_reactor<T, F, Fut>(self: &Arc<Self>, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        match self.rt() {
            Some(rt) => {
                let a = self.clone();
                rt.spawn_on(0, move || f(a)).await.ok()
            }
            None => Some(f(self.clone()).await),
        }
    }

    /// Client reads and writes so far (background work's notion of client activity).
    pub(crate) fn client_ops(&self) -> u64 {
        self.stats.total(|c| &c.reads) + self.stats.total(|c| &c.writes)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn size(&self) -> u64 {
        self.geo.volume_size()
    }

    /// Members missing or failed.
    pub fn failed(&self) -> MemberSet {
        self.members.failed()
    }

    pub fn is_failed(&self, member: usize) -> bool {
        self.members.is_failed(member)
    }

    /// The device of a present member (tests inspect in-memory members through this).
    pub fn member_dev(&self, member: usize) -> Option<&D> {
        self.members.device(member)
    }

    pub fn member_name(&self, member: usize) -> Option<&str> {
        self.members.name(member)
    }

    /// Array name, uuid and creation time (seconds since the epoch); `status().identity`
    /// has them too.
    pub fn identity(&self) -> (&str, [u8; 16], u64) {
        self.meta.identity()
    }

    // ------------------------------------------------------------ write-intent bitmap

    /// One pass of the bitmap daemon: clears the bits of regions idle since the previous
    /// pass (the server runs it every `BITMAP_TICK`), and checkpoints the journal (bounding
    /// what a replay has to do). Returns how many bits it cleared. Runs on
    /// a reactor when the array has them (io_uring I/O with the member timeouts: a hung
    /// member fails instead of holding the bitmap lock), else here.
    pub async fn bitmap_tick(self: &Arc<Self>) -> u64 {
        match &self.rt {
            Some(rt) => {
                let a = self.clone();
                rt.spawn_on(0, move || async move {
                    let n = a
                        .intent
                        .clear_idle(&a.meta, &a.members, &a.recovery.resync, false, || {
                            a.journal_orphans()
                        })
                        .await;
                    a.journal_checkpoint().await;
                    n
                })
                .await
                .unwrap_or(0)
            }
            None => {
                let n = self
                    .intent
                    .clear_idle(
                        &self.meta,
                        &self.members,
                        &self.recovery.resync,
                        false,
                        || self.journal_orphans(),
                    )
                    .await;
                self.journal_checkpoint().await;
                n
            }
        }
    }

    /// Before a clean stop (after its flush): clears every bit not needed any more (none in
    /// a session that wrote nothing, or while degraded).
    pub(crate) async fn bitmap_close(&self) -> u64 {
        self.intent
            .clear_idle(
                &self.meta,
                &self.members,
                &self.recovery.resync,
                true,
                || self.journal_orphans(),
            )
            .await
    }

    /// Write-intent bitmap state: region size (0: none), regions, regions dirty now
    /// (`status().bitmap` has them with the round counts).
    pub fn bitmap_state(&self) -> (u64, u64, u64) {
        let wi = &self.intent;
        (wi.chunk, wi.regions(), wi.dirty())
    }

    /// The failed set, or `Failed` if the array cannot serve every byte. Members being
    /// rebuilt count as lost here (they do not hold every unit yet) but are not in the set
    /// returned: writes go to them.
    pub(crate) fn check_serving(&self) -> Result<MemberSet, ArrayError> {
        self.members.check_serving(&self.geo)
    }

    /// Whether the array can still serve every byte.
    pub fn is_serving(&self) -> bool {
        self.check_serving().is_ok()
    }

    pub fn validate(&self, off: u64, len: u64) -> Result<(), ArrayError> {
        let size = self.size();
        if off.checked_add(len).is_none_or(|end| end > size) {
            return Err(ArrayError::OutOfRange { off, len, size });
        }
        if !off.is_multiple_of(SECTOR) || !len.is_multiple_of(SECTOR) {
            return Err(ArrayError::Misaligned { off, len });
        }
        Ok(())
    }

    // ------------------------------------------------------------ every live member

    /// `Metadata::each_live` over this array's members.
    pub(crate) async fn each_live<T, F, Fut>(&self, set: MemberSet, op: F) -> Vec<(usize, T)>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = io::Result<T>>,
    {
        self.meta.each_live(&self.members, set, op).await
    }

    /// `Metadata::write_members` over this array's members.
    pub(crate) async fn write_members<T: Into<MemberData>>(&self, writes: Vec<(usize, u64, T)>) {
        self.meta.write_members(&self.members, writes).await
    }

    /// Marks a member failed (logging the cause) and waits until the failure is durable.
    pub(crate) async fn fail_member(&self, member: usize, err: &io::Error) {
        self.meta.fail_member(&self.members, member, err).await
    }

    /// Waits until every failure known now is recorded in the superblocks of the survivors.
    pub(crate) async fn failure_barrier(&self) {
        self.meta.failure_barrier(&self.members).await
    }

    /// Records rebuild checkpoints in a superblock round (`Metadata::persist_rebuilt`).
    pub(crate) async fn persist_rebuilt(&self, to: &[(usize, u64, usize)]) {
        self.meta.persist_rebuilt(&self.members, to).await
    }

    /// Whether superblocks are never written (read-only benchmarks).
    pub(crate) fn meta_frozen(&self) -> bool {
        self.meta.frozen()
    }

    /// The superblocks say "not clean" but the array is consistent (journal replayed): the
    /// next clean stop records "clean" even if nothing is written meanwhile.
    pub(crate) fn clean_round_due(&self) {
        self.meta.clean_round_due()
    }

    /// Before the first write of a session (and the first after a safe-mode clean pass):
    /// superblocks say "not clean", then every member's bitmap copy is made equal to memory
    /// (bitmap.rs). Background walks call this; safe mode does not run while one does.
    pub(crate) async fn ensure_dirty(&self) {
        drop(self.hold_dirty().await);
    }

    /// `ensure_dirty`, held until the returned guard drops: safe mode does not mark the
    /// array clean meanwhile (`Metadata::hold_dirty`).
    pub(crate) async fn hold_dirty(&self) -> crate::metadata::DirtyHold<'_> {
        self.meta
            .hold_dirty(
                &self.members,
                self.intent.sync_all(&self.meta, &self.members),
            )
            .await
    }

    /// Whether the superblocks say "not clean" (written since assembly or since the last
    /// safe-mode clean pass).
    pub fn is_dirty(&self) -> bool {
        self.meta.is_dirty()
    }

    /// How long no write has held the array dirty (safe mode's idle clock).
    pub fn idle_for(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.meta.idle_ms())
    }

    /// Safe mode (md's `safe_mode_delay`): if no write has been in flight for `idle` and
    /// no background walk runs or is due, makes everything written durable on the members
    /// (deferred write-back writes drained, members flushed, journal checkpointed, idle
    /// bitmap bits cleared) and records "clean" in the superblocks, as a clean stop does.
    /// The next write marks the array dirty again before it touches a member. Returns
    /// whether the superblocks now say "clean". Runs on a reactor when the array has them
    /// (member timeouts), like `bitmap_tick`.
    pub async fn safe_mode_tick(self: &Arc<Self>, idle: std::time::Duration) -> bool {
        let a = self.clone();
        let pass = move |a: Arc<Self>| async move {
            let r = &a.recovery;
            let walking = || {
                [&r.resync_progress, &r.rebuild_progress, &r.scrub_progress]
                    .into_iter()
                    .chain(r.replace_progress.iter())
                    .any(|p| p.running.load(std::sync::atomic::Ordering::Acquire))
            };
            if walking()
                || a.meta.idle_ms() < idle.as_millis() as u64
                || a.needs_resync()
                || a.check_serving().is_err()
            {
                return false;
            }
            let Some(_pass) = a.meta.begin_clean() else {
                return false;
            };
            // A walk that began meanwhile (its writes hold no DirtyHold) ends the pass.
            if walking() {
                return false;
            }
            a.journal_drain().await;
            a.flush_members().await;
            if a.check_serving().is_err() {
                return false;
            }
            a.journal_checkpoint().await;
            a.bitmap_close().await;
            a.meta.record_clean(&a.members, || a.needs_resync()).await;
            !a.meta.is_dirty()
        };
        match &self.rt {
            Some(rt) => rt.spawn_on(0, move || pass(a)).await.unwrap_or(false),
            None => pass(a).await,
        }
    }

    /// Flushes every member and, if anything was written since assembly and no resync is
    /// still due, records a clean shutdown in the superblocks. A session that only read
    /// leaves them untouched: members that were merely absent are not marked failed, since
    /// their data is still current.
    pub async fn close(&self) -> Result<(), ArrayError> {
        // Deferred member writes (write-back journal) land first.
        self.journal_drain().await;
        self.flush_members().await;
        self.check_serving()?;
        // Everything is on the members: the journal is emptied (nothing to replay).
        self.journal_checkpoint().await;
        // Regions written this session are idle and flushed: their bits go (resync's
        // unfinished regions keep theirs, so the next start resumes there).
        self.bitmap_close().await;
        self.meta
            .record_clean(&self.members, || self.needs_resync())
            .await;
        self.check_serving().map(|_| ())
    }

    /// Makes every acknowledged write durable: on every live member, or, with a write-back
    /// journal, in the journal (where every acknowledged write already is, journal.rs);
    /// returns once any member that failed on the way is recorded failed in the survivors'
    /// superblocks.
    pub async fn flush(&self) -> Result<(), ArrayError> {
        // Writes waiting for the rest of their stripe go now (stripe/plug.rs).
        self.streams.kick();
        if self.journal.get().is_some_and(|j| !j.active()) {
            // Acknowledged write-back writes may still be on their way to the members:
            // the fallback drains them and flushes the members.
            self.journal_failed_wait().await;
        }
        if self.flush_needs_members() {
            self.flush_members().await;
        } else {
            self.failure_barrier().await;
        }
        self.check_serving().map(|_| ())
    }

    /// Flushes every live member (whatever the journal mode) and waits for the failure
    /// barrier.
    pub(crate) async fn flush_members(&self) {
        self.meta.flush_members(&self.members).await
    }

    /// Read-ahead's memory budget (`ArrayOptions::read_ahead`), zero if it is off: also
    /// when every member completes its reads inline (memory) unless `read_ahead_always`.
    pub(crate) fn read_ahead_budget(&self) -> u64 {
        if !self.read_ahead.1 && self.members.all_inline() {
            return 0;
        }
        self.read_ahead.0
    }

    /// A member data-area write that does not go through the journal has completed
    /// (allocation-map pages): the next FLUSH flushes the members.
    pub(crate) fn note_unjournaled(&self) {
        self.members.note_unjournaled();
    }

    // ------------------------------------------------------------ reads

    /// Reads `[off, off + len)` from the members (no allocation map: `Volume::read` is the
    /// client-facing read). Data comes back as segments in volume order.
    pub async fn read(self: &Arc<Self>, off: u64, len: u64) -> Result<Segments, ArrayError> {
        self.validate(off, len)?;
        self.check_serving()?;
        // With resync due, the devices about to serve are on disk as served first.
        self.meta.record_served(&self.members).await;
        self.stats.add(|c| &c.reads, 1);
        let extents: Vec<Extent> = self.geo.map(off, len).collect();
        if self.journal.get().is_some() {
            self.wait_deferred(extents.iter().map(|e| e.stripe)).await;
            // After the wait: a deferred finish dropped meanwhile leaves an orphan.
            self.settle_orphans().await;
        }
        // Around members flagged slow where redundancy allows (`read_holders`); if that
        // fails (a media error on top), the same read again reading them.
        let slow = self.slow.set();
        let around = !slow.is_empty()
            && self.geo.fault_tolerance() > 0
            && extents.iter().any(|e| match self.geo.level {
                Level::Raid1 | Level::Raid10 => self
                    .geo
                    .mirror_copies(e.stripe)
                    .iter()
                    .any(|&(m, _)| slow.contains(m)),
                _ => slow.contains(self.geo.data_member(e.stripe, e.index)),
            });
        if around {
            match Box::pin(self.read_planned(extents.clone(), true)).await {
                Err(ArrayError::Unreadable { .. }) => {}
                r => return r,
            }
        }
        self.read_planned(extents, false).await
    }

    /// `read` of `extents`, planning around slow members if `around`.
    async fn read_planned(
        self: &Arc<Self>,
        extents: Vec<Extent>,
        around: bool,
    ) -> Result<Segments, ArrayError> {
        if !matches!(self.geo.level, Level::Raid1 | Level::Raid10) {
            if !around {
                if let Some(seg) = self.read_coalesced(&extents).await {
                    return Ok(seg);
                }
            }
            if self.codec.is_some()
                && extents.len() > 1
                && (around || !self.members.irregular().is_empty())
            {
                return self.read_degraded(extents, around).await;
            }
        }
        let bufs = if extents.len() == 1 {
            vec![self.read_extent(extents[0], around).await?]
        } else {
            let mut v = Vec::with_capacity(extents.len());
            for r in join_all(extents.into_iter().map(|e| self.read_extent(e, around))).await {
                v.push(r?);
            }
            v
        };
        Ok(Segments {
            parts: bufs
                .into_iter()
                .map(|b| {
                    let l = b.len();
                    (Arc::new(b), 0..l)
                })
                .collect(),
        })
    }

    /// Healthy fast path for multi-chunk reads: one member read per run of chunks that lie
    /// back to back on that member (a 1 MiB raid0 read over 4 members becomes 4 reads, not 16).
    /// None when there is nothing to coalesce, a member is failed, or a read fails; the
    /// per-extent path then does the work and handles the failure.
    async fn read_coalesced(&self, extents: &[Extent]) -> Option<Segments> {
        if extents.len() < 2 {
            return None;
        }
        // Any member failed, being rebuilt or with bad blocks: the per-extent path decides
        // per stripe.
        let f = self.members.irregular();
        // Runs of (member, member offset, length); per extent (run, offset in run, length).
        let mut runs: Vec<(usize, u64, u64)> = Vec::new();
        let mut place = Vec::with_capacity(extents.len());
        for e in extents {
            let m = self.geo.data_member(e.stripe, e.index);
            if f.contains(m) {
                return None;
            }
            let at = self.geo.member_offset(e.stripe, e.chunk_off);
            let r = match runs.iter().position(|&(rm, s, l)| rm == m && s + l == at) {
                Some(r) => r,
                None => {
                    runs.push((m, at, 0));
                    runs.len() - 1
                }
            };
            place.push((r, runs[r].2 as usize, e.len as usize));
            runs[r].2 += e.len;
        }
        if runs.len() == extents.len() {
            return None;
        }
        let reads = runs.iter().map(|&(m, at, len)| {
            let units = at / self.geo.chunk..(at + len).div_ceil(self.geo.chunk);
            self.members.read(m, units, at, buf::alloc(len as usize))
        });
        let mut bufs = Vec::with_capacity(runs.len());
        for (r, b) in join_all(reads).await {
            r.ok()?;
            bufs.push(Arc::new(b));
        }
        Some(Segments {
            parts: place
                .into_iter()
                .map(|(r, o, l)| (bufs[r].clone(), o..o + l))
                .collect(),
        })
    }

    /// The members a read of `stripe` may not read: failed, behind a rebuild and, if
    /// `around`, members flagged slow (slow.rs) as long as that keeps a margin: the stripe is
    /// synced (an unsynced one is not decoded without need), the members not read stay
    /// within the level's tolerance, and with a member already missing there, redundancy is
    /// left after. If the read wants chunks of slow members (`wants`: the members whose
    /// chunks it reads), it may be a probe of some of them or their probation share
    /// (`SlowMembers::probe`): it reads those anyway.
    fn read_holders(&self, stripe: u64, around: bool, wants: MemberSet) -> UnitHolders {
        let mut at = self.members.at(stripe);
        if !around {
            return at;
        }
        let stale = at.stale();
        let mut slow = self.slow.set().minus(stale);
        if slow.is_empty()
            || !self.margin_around(stale, slow)
            || self.recovery.resync.unsynced(stripe)
        {
            return at;
        }
        if !wants.intersect(slow).is_empty() {
            slow = slow.minus(self.slow.probe(wants.intersect(slow)));
        }
        at.behind = at.behind.union(slow);
        at
    }

    /// Whether a read may leave out slow members `slow` on top of `out` (members it cannot
    /// read: failed, behind, media errors): within the tolerance, and with redundancy left
    /// after if it is already using some for `out`.
    fn margin_around(&self, out: MemberSet, slow: MemberSet) -> bool {
        let used = out.union(slow).len();
        let tol = self.geo.fault_tolerance();
        used <= tol && (out.minus(slow).is_empty() || used < tol)
    }

    /// Counts a read that decodes `exts` of `stripe` (`at`: the plan's holders): a degraded
    /// read if a member it cannot read is missing, failed or behind, else one around a slow
    /// member.
    fn count_decoded(&self, stripe: u64, exts: &[Extent], at: &UnitHolders) {
        let real = self.members.at(stripe);
        let degraded = exts
            .iter()
            .any(|e| !real.serves(self.geo.data_member(e.stripe, e.index)));
        if degraded
            || !exts
                .iter()
                .any(|e| !at.serves(self.geo.data_member(e.stripe, e.index)))
        {
            self.stats.add(|c| &c.degraded_reads, 1);
        } else {
            self.stats.add(|c| &c.slow_reads_around, 1);
        }
    }

    /// Whether slot `i` cannot have served unit `unit`'s bytes (a torn stripe's) since the
    /// array was last in sync: its device served no reads this session
    /// (`Members::unseen_since_start`), the superblocks did not name it served in an
    /// earlier one (docs/format.md, "Served while out of sync"), and `unit` is not below the
    /// rebuild checkpoint it had at assembly (a member being rebuilt serves the units below
    /// it). Only then may its chunk of an unsynced stripe be taken from a decode the other
    /// members agree on.
    pub(crate) fn unseen_since_unsynced(&self, i: usize, unit: u64) -> bool {
        self.members.unseen_since_start(i)
            && !self.meta.served_before().contains(i)
            && unit >= self.rebuilt_at_start(i)
    }

    /// Slot `i`'s rebuild checkpoint at assembly (0 unless it was rebuilding then).
    pub(crate) fn rebuilt_at_start(&self, i: usize) -> u64 {
        self.rebuilt_at_start.get(i).copied().unwrap_or(0)
    }

    /// Members flagged slow now (slow.rs).
    pub fn slow_members(&self) -> MemberSet {
        self.slow.set()
    }

    /// Sets the fail-slow factor (`serve --slow-factor`; 0: off).
    pub fn set_slow_factor(&self, factor: f64) {
        self.slow.set_factor(factor);
        self.members.time_every(self.slow.set());
    }

    /// One judgement of member latency (slow.rs; the server calls it every second): flags
    /// and unflags slow members, logging each change.
    pub fn slow_tick(&self) {
        let now: Vec<Option<(usize, u64, u64)>> = (0..self.geo.members)
            .map(|i| {
                (!self.members.is_failed(i)).then(|| {
                    let io = self.members.io(i);
                    (
                        self.members.generation(i),
                        io.read.timed + io.write.timed + io.judge_timed,
                        io.read.latency_ns + io.write.latency_ns + io.judge_ns,
                    )
                })
            })
            .collect();
        let changes = self.slow.tick(&now);
        self.members.time_every(self.slow.set());
        for (m, event, mean, median) in changes {
            let name = self.members.name(m).unwrap_or("?");
            match event {
                crate::slow::Event::Slow => tracing::warn!(
                    "member {m} ({name}) is slow: mean I/O latency {mean:?} against a median of \
                     {median:?} over the members; reads of its chunks are served by \
                     reconstruction from the others while redundancy allows (it is still written)"
                ),
                crate::slow::Event::Probation(1) => tracing::info!(
                    "member {m} ({name}) is slow, on probation: mean I/O latency {mean:?}, \
                     median {median:?}; every read of its chunks goes to it (read again if it \
                     keeps up)"
                ),
                crate::slow::Event::Probation(share) => tracing::info!(
                    "member {m} ({name}) is slow, on probation: mean I/O latency {mean:?}, \
                     median {median:?}; one in {share} reads of its chunks goes to it"
                ),
                crate::slow::Event::Relapsed(hold) => tracing::warn!(
                    "member {m} ({name}) is still slow under load: mean I/O latency {mean:?} \
                     against a median of {median:?}; read around again, next probation after \
                     {hold} s of fast probes"
                ),
                crate::slow::Event::Fast => tracing::info!(
                    "member {m} ({name}) is no longer slow: mean I/O latency {mean:?}, median \
                     {median:?}; read again"
                ),
            }
        }
    }

    /// Multi-chunk read of a parity array with members missing. A stripe where a wanted
    /// chunk's member is missing is read as one stripe operation: each readable chunk of the
    /// span once, the missing ones decoded from those and parity (k reads per stripe). Read
    /// chunk by chunk, every missing chunk would read its k survivors again beside the reads
    /// of the wanted survivors themselves (up to twice the member I/O of a healthy read).
    /// Other stripes read per extent.
    async fn read_degraded(
        self: &Arc<Self>,
        extents: Vec<Extent>,
        around: bool,
    ) -> Result<Segments, ArrayError> {
        let mut groups: Vec<Vec<Extent>> = Vec::new();
        for e in extents {
            match groups.last_mut() {
                Some(g) if g[0].stripe == e.stripe => g.push(e),
                _ => groups.push(vec![e]),
            }
        }
        let futs = groups.into_iter().map(|g| async move {
            if g.len() == 1 {
                // One chunk: `read_extent` plans it (a plan here too would count it twice
                // towards a probe).
                let b = self.read_extent(g[0], around).await?;
                let l = b.len();
                return Ok(vec![(Arc::new(b), 0..l)]);
            }
            let wants = g
                .iter()
                .map(|e| self.geo.data_member(e.stripe, e.index))
                .collect();
            let at = self.read_holders(g[0].stripe, around, wants);
            let missing = g
                .iter()
                .any(|e| !at.serves(self.geo.data_member(e.stripe, e.index)));
            if missing {
                self.count_decoded(g[0].stripe, &g, &at);
                return Box::pin(self.read_stripe_decoded(&g, at)).await;
            }
            // Every wanted chunk is read as it is. An extent on a slow member the plan reads
            // (a probe or its probation share, or no margin to leave it out) is read from it
            // as planned: planned again it would go around it, and the probe would be lost.
            // The others are planned around slow members still, so a media error on one is
            // reconstructed around them. (The slow members the plan leaves out are not
            // wanted.)
            let slow = self.slow.set();
            let mut parts = Vec::with_capacity(g.len());
            for e in g {
                let on_slow = slow.contains(self.geo.data_member(e.stripe, e.index));
                let b = self.read_extent(e, around && !on_slow).await?;
                let l = b.len();
                parts.push((Arc::new(b), 0..l));
            }
            Ok(parts)
        });
        let mut parts = Vec::new();
        for r in join_all(futs).await {
            parts.extend(r?);
        }
        Ok(Segments { parts })
    }

    /// The extents of one stripe (in chunk order, one per chunk) through `fetch_data` over
    /// their common span, under the stripe lock like `reconstruct`: the pieces of the span
    /// each extent wants, in order.
    async fn read_stripe_decoded(
        &self,
        exts: &[Extent],
        planned: UnitHolders,
    ) -> Result<Vec<(Arc<IoBuf>, std::ops::Range<usize>)>, ArrayError> {
        let stripe = exts[0].stripe;
        let lo = exts.iter().map(|e| e.chunk_off).min().unwrap_or(0);
        let hi = exts.iter().map(|e| e.chunk_off + e.len).max().unwrap_or(0);
        let want: Vec<usize> = exts.iter().map(|e| e.index).collect();
        let held = self.lock_stripe(stripe).await;
        // Members being rebuilt that do not hold the stripe yet are not read, nor slow ones
        // the plan reads around.
        let at = self.members.at(stripe);
        let mut around = planned.behind.minus(at.stale());
        let mut excl = at.behind.union(around);
        if self.recovery.resync.unsynced(stripe) && !self.verify_unsynced(stripe, at.stale()).await
        {
            drop(held);
            return Err(self.unsynced_unreadable(stripe, at.stale()));
        }
        let r = loop {
            // As in `reconstruct`: around slow members only while a margin is left.
            if !around.is_empty()
                && !self.margin_around(excl.minus(around).union(self.members.failed()), around)
            {
                excl = excl.minus(around);
                around = MemberSet::EMPTY;
            }
            match self.fetch_data(stripe, lo, hi - lo, &want, &mut excl).await {
                Ok(Attempt::Done(v)) => break Ok(v),
                Ok(Attempt::Retry) => continue,
                Err(err) => break Err(err),
            }
        };
        let r = match r {
            Ok(bufs) => {
                let mut parts = Vec::with_capacity(exts.len());
                for (e, b) in exts.iter().zip(bufs) {
                    let b = b.expect("fetch_data returns what was asked");
                    // A media error met on the way: the decoded bytes go back (as in
                    // `reconstruct`).
                    let m = self.geo.data_member(stripe, e.index);
                    if excl.minus(at.behind).minus(around).contains(m) && !self.members.is_failed(m)
                    {
                        self.rewrite(m, self.geo.member_offset(stripe, lo), &b)
                            .await;
                    }
                    let s = (e.chunk_off - lo) as usize;
                    parts.push((Arc::new(b), s..s + e.len as usize));
                }
                Ok(parts)
            }
            Err(e) => Err(e),
        };
        drop(held);
        r
    }

    async fn read_extent(self: &Arc<Self>, e: Extent, around: bool) -> Result<IoBuf, ArrayError> {
        if matches!(self.geo.level, Level::Raid1 | Level::Raid10) {
            return self.read_mirror(e, around).await;
        }
        loop {
            self.check_serving()?;
            let m = self.geo.data_member(e.stripe, e.index);
            let holders = self.read_holders(e.stripe, around, MemberSet::one(m));
            if !holders.serves(m) {
                self.count_decoded(e.stripe, std::slice::from_ref(&e), &holders);
                return Box::pin(self.reconstruct(e, MemberSet::EMPTY, holders.behind)).await;
            }
            let at = self.geo.member_offset(e.stripe, e.chunk_off);
            match self
                .members
                .read(m, e.stripe..e.stripe + 1, at, buf::alloc(e.len as usize))
                .await
            {
                (Ok(()), b) => return Ok(b),
                (Err(err), _) => {
                    let mut excl = MemberSet::EMPTY;
                    Box::pin(self.read_failed(m, &err, &mut excl)).await;
                    if excl.contains(m) {
                        return Box::pin(self.reconstruct(e, excl, holders.behind)).await;
                    }
                }
            }
        }
    }

    /// Reconstructs a data extent from the rest of its stripe, holding the stripe lock so
    /// that no stripe update is half done meanwhile. Members in `errors` had a media error:
    /// the reconstructed bytes are written back to them (md's read-error correction).
    /// Members being rebuilt that do not hold the stripe yet are not read.
    /// `around`: slow members the plan reads around (`read_holders`), not read either.
    async fn reconstruct(
        &self,
        e: Extent,
        errors: MemberSet,
        around: MemberSet,
    ) -> Result<IoBuf, ArrayError> {
        let held = self.lock_stripe(e.stripe).await;
        let at = self.members.at(e.stripe);
        let mut around = around.minus(at.stale());
        let mut excl = errors.union(at.behind).union(around);
        if self.recovery.resync.unsynced(e.stripe)
            && !self.verify_unsynced(e.stripe, at.stale()).await
        {
            // Parity not yet made consistent after an unclean stop and the members present
            // do not show it intact: what it would rebuild may be wrong, so the read fails
            // instead (recovery/resync.rs).
            drop(held);
            return Err(self.unsynced_unreadable(e.stripe, excl.union(at.failed)));
        }
        let r = loop {
            // Reading around slow members stops once it would spend the last redundancy
            // (a member failed or a media error met meanwhile): they are read instead.
            if !around.is_empty()
                && !self.margin_around(excl.minus(around).union(self.members.failed()), around)
            {
                excl = excl.minus(around);
                around = MemberSet::EMPTY;
            }
            match self
                .fetch_data(e.stripe, e.chunk_off, e.len, &[e.index], &mut excl)
                .await
            {
                Ok(Attempt::Done(mut v)) => {
                    break Ok(v
                        .pop()
                        .flatten()
                        .expect("fetch_data returns what was asked"))
                }
                Ok(Attempt::Retry) => continue,
                Err(err) => break Err(err),
            }
        };
        if let Ok(data) = &r {
            let m = self.geo.data_member(e.stripe, e.index);
            if excl.minus(at.behind).minus(around).contains(m) && !self.members.is_failed(m) {
                let off = self.geo.member_offset(e.stripe, e.chunk_off);
                self.rewrite(m, off, data).await;
            }
        }
        drop(held);
        r
    }

    /// The error for a read that would reconstruct data from a stripe whose parity was not
    /// resynced after an unclean stop (logged once per stripe, with its volume range).
    fn unsynced_unreadable(&self, stripe: u64, members: MemberSet) -> ArrayError {
        if self.recovery.resync.report_unreadable(stripe) {
            let sdb = self.geo.stripe_data_bytes();
            tracing::error!(
                target: "uraid_engine::recovery",
                "stripe {stripe} (volume bytes {}..{}) is unreadable where member(s) {members} \
                 are missing: it is in a region marked dirty at an unclean stop (a write to it \
                 may have been cut short), it has not been resynced, and the members present \
                 cannot show it intact (or a member out served reads of it), so data taken \
                 from the others could be wrong",
                stripe * sdb,
                (stripe + 1) * sdb
            );
        }
        ArrayError::Unreadable { members }
    }

    /// Writes reconstructed bytes over a chunk that had a media error (not with frozen
    /// metadata: nothing is written then, the members may be open read-only).
    async fn rewrite(&self, m: usize, at: u64, data: &IoBuf) {
        if self.meta_frozen() {
            return;
        }
        match self.members.write(m, at, buf::copy_of(data)).await {
            Ok(()) => {
                self.members.count_corrected(m);
                self.stats.add(|c| &c.corrected_reads, 1);
                tracing::warn!(
                    "member {m} ({}): rewrote {} bytes at data offset {at} after a read error",
                    self.members.name(m).unwrap_or("?"),
                    data.len()
                );
            }
            Err(err) => self.fail_member(m, &err).await,
        }
    }

    /// The copy of mirror chunk `c` a read tries first, so reads spread over every member:
    /// RAID1 turns through the copies by chunk; RAID10 chunk c lies on pair c mod
    /// (members / 2), so it turns once per pass over the pairs (by chunk alone, the copy
    /// would follow the pair's parity when the pair count is even, and half the members
    /// would never be read).
    fn mirror_first(&self, c: u64) -> usize {
        match self.geo.level {
            Level::Raid10 => ((c / (self.geo.members as u64 / 2).max(1)) % 2) as usize,
            _ => c as usize,
        }
    }

    async fn read_mirror(&self, e: Extent, around: bool) -> Result<IoBuf, ArrayError> {
        let mut excl = MemberSet::EMPTY;
        loop {
            let f = self
                .check_serving()?
                .union(self.members.at(e.stripe).stale());
            let copies = self.geo.mirror_copies(e.stripe);
            // Spread reads over the copies: chunk number picks the first choice. A row not
            // yet resynced reads its first copy, the one resync will keep. Copies on members
            // flagged slow come last (the slow one stays written, and is read if no other
            // copy can be).
            let n = copies.len();
            let unsynced = self.recovery.resync.unsynced(e.stripe);
            let first = if unsynced {
                0
            } else {
                self.mirror_first(e.stripe)
            };
            let usable = |m: usize| !f.contains(m) && !excl.contains(m);
            let ordered = || (0..n).map(|i| copies[(first + i) % n]);
            let plain = ordered().find(|&(m, _)| usable(m));
            // A probe only where the copy read first is on a slow member.
            let slow = match plain {
                Some((m, _))
                    if around
                        && !unsynced
                        && self.slow.set().contains(m)
                        && self.slow.probe(MemberSet::one(m)).is_empty() =>
                {
                    self.slow.set()
                }
                _ => MemberSet::EMPTY,
            };
            let pick = ordered()
                .find(|&(m, _)| usable(m) && !slow.contains(m))
                .or(plain);
            if pick != plain {
                self.stats.add(|c| &c.slow_reads_around, 1);
            }
            let Some((m, base)) = pick else {
                return Err(self
                    .check_serving()
                    .err()
                    .unwrap_or(ArrayError::Unreadable { members: excl }));
            };
            if unsynced && m != copies[0].0 {
                // A row not in sync reads another copy than the one resync keeps: only if
                // that copy's slot never served it since the array was last in sync (it may
                // have served a torn write's new bytes the other copies lack), and once a
                // member absent since assembly in that slot is recorded failed (it must not
                // come back holding other bytes than these).
                let m0 = copies[0].0;
                if !self.unseen_since_unsynced(m0, e.stripe) {
                    return Err(self.unsynced_unreadable(e.stripe, MemberSet::one(m0)));
                }
                if self.meta.absent().contains(m0) {
                    self.meta.record_absent_failed(&self.members).await;
                }
            }
            match self
                .members
                .read(
                    m,
                    e.stripe..e.stripe + 1,
                    base + e.chunk_off,
                    buf::alloc(e.len as usize),
                )
                .await
            {
                (Ok(()), b) => {
                    if !excl.is_empty() {
                        Box::pin(self.repair_mirror(e, excl)).await;
                    }
                    return Ok(b);
                }
                (Err(err), _) => Box::pin(self.read_failed(m, &err, &mut excl)).await,
            }
        }
    }

    /// Copies a mirror extent from a readable copy over the copies in `bad`, under the row's
    /// lock (so no write to the row runs in between).
    async fn repair_mirror(&self, e: Extent, bad: MemberSet) {
        let _held = self.lock_stripe(e.stripe).await;
        let at = self.members.at(e.stripe);
        let copies = self.geo.mirror_copies(e.stripe);
        let good = copies
            .iter()
            .find(|(m, _)| at.serves(*m) && !bad.contains(*m));
        if let Some(&(g, base)) = good {
            if let (Ok(()), data) = self
                .members
                .read(
                    g,
                    e.stripe..e.stripe + 1,
                    base + e.chunk_off,
                    buf::alloc(e.len as usize),
                )
                .await
            {
                for &(m, base) in copies.iter().filter(|(m, _)| bad.contains(*m)) {
                    if !self.members.is_failed(m) {
                        self.rewrite(m, base + e.chunk_off, &data).await;
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------ writes

    /// Writes `data` at `off` to the members (no allocation map: `Volume::write` is the
    /// client-facing write). Returns once every member the write touches has it (with a
    /// write-back journal: once its journal record is durable, the member writes finishing
    /// in the background) and any member that failed on the way is durably recorded failed;
    /// FLUSH makes it durable.
    pub async fn write(
        self: &Arc<Self>,
        off: u64,
        data: impl Into<WriteBuf>,
    ) -> Result<(), ArrayError> {
        self.write_as(off, data.into(), true).await
    }

    /// Ends every wait for the rest of a stripe under way (stripe/plug.rs).
    pub(crate) fn kick_plugs(&self) {
        self.streams.kick();
    }

    /// `write` (`may_wait`), or a write the client waits to be durable (FUA: never waits for
    /// the rest of its stripe, and ends the waits of others; stripe/plug.rs).
    pub(crate) async fn write_as(
        self: &Arc<Self>,
        off: u64,
        data: WriteBuf,
        may_wait: bool,
    ) -> Result<(), ArrayError> {
        let len = data.len() as u64;
        self.validate(off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.check_serving()?;
        // An urgent write also ends the waits under way (`arrive` kicks).
        let pace = self
            .streams
            .arrive(off, len, self.geo.stripe_data_bytes(), may_wait);
        let _dirty = self.hold_dirty().await;
        // The regions' write-intent bits are durable before any member is written, and stay
        // set until the guard is dropped (after the member writes).
        let _intent = self.intent.begin(&self.meta, &self.members, off, len).await;
        self.stats.add(|c| &c.writes, 1);
        match self.geo.level {
            Level::Raid0 | Level::Raid1 | Level::Raid10 => {
                let results =
                    join_all(self.geo.map(off, len).map(|e| self.write_plain(e, &data))).await;
                results.into_iter().collect::<Result<(), _>>()?;
            }
            _ => self.write_parity(off, &data, pace).await?,
        }
        self.failure_barrier().await;
        self.check_serving().map(|_| ())
    }

    /// Raid0 / mirror write of one extent to every live copy. Mirror rows are written under
    /// the row's lock, so overlapping concurrent writes land in the same order on every copy.
    async fn write_plain(&self, e: Extent, data: &WriteBuf) -> Result<(), ArrayError> {
        let src = e.buf_off as usize..(e.buf_off + e.len) as usize;
        let mirror = !matches!(self.geo.level, Level::Raid0);
        let targets: Vec<(usize, u64)> = if mirror {
            self.geo.mirror_copies(e.stripe)
        } else {
            vec![(
                self.geo.data_member(e.stripe, e.index),
                self.geo.member_offset(e.stripe, 0),
            )]
        };
        let held = if mirror {
            Some(self.lock_stripe(e.stripe).await)
        } else {
            None
        };
        if held.is_some() {
            self.resync_if_unsynced(e.stripe).await?;
        }
        let r = match self.check_serving() {
            Ok(f) => {
                let writes = targets
                    .into_iter()
                    .filter(|(m, _)| !f.contains(*m))
                    .map(|(m, base)| {
                        // The client's bytes, written where they are (no copy per target).
                        let segs = Segments {
                            parts: vec![data.segment(src.clone())],
                        };
                        (m, base + e.chunk_off, segs)
                    })
                    .collect::<Vec<_>>();
                let copies: MemberSet = writes.iter().map(|w| w.0).collect();
                self.write_members(writes).await;
                // A whole mirror chunk written: copies on a bad-block list hold it now.
                if mirror && e.chunk_off == 0 && e.len == self.geo.chunk {
                    self.clear_bad_written(e.stripe, copies).await;
                }
                self.check_serving().map(|_| ())
            }
            Err(err) => Err(err),
        };
        drop(held);
        r
    }
}
