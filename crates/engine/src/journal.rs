//! The journal device at run time (format: `uraid_core::journal`, docs/format.md).
//!
//! Rules (docs/invariants.md, "Journal records precede member writes"):
//! * Every stripe operation of a parity array with an active journal writes one record — the
//!   complete new contents of every member range it is about to write, data and parity —
//!   and the record is *durable* (written, and a journal flush completed after it and after
//!   every earlier record was written) before any of those member writes is issued
//!   (`Journal::log`). A power cut therefore leaves every stripe either untouched since its
//!   last durable state or described completely by a durable record: replay at assembly
//!   (`replay_records`, then `new_epoch`) rewrites the records in order, which makes every stripe consistent, so a
//!   dirty array needs no resync and a dirty *degraded* one is safe to start.
//! * Durability is a prefix: a journal flush covers exactly the records whose writes
//!   completed before it began, and a record counts as durable only when every record
//!   before it does too (group commit: one flush serves every record written meanwhile).
//!   Replay stops at the first invalid record, so no durable record ever follows a gap.
//! * Space is reclaimed by checkpoints: the tail moves past a record only after its member
//!   writes completed *and* a member flush finished after that; then the journal
//!   superblock (alternating slots, generation counter) records the new tail, flushed.
//! * Write-back mode: a client FLUSH (or FUA) needs no member flush: every acknowledged
//!   write's record is already durable. Member writes that bypass the journal (allocation
//!   map pages) are counted (`note_unjournaled`); a FLUSH after one flushes the members.
//! * A journal I/O error switches the array to bitmap mode before any member write goes
//!   unlogged: the journal is marked failed in memory (a failed or abandoned record poisons
//!   it, so no commit counts past it), records already durable finish their member writes,
//!   the members are flushed (write-back: what only the journal held), a superblock round
//!   records "no journal", and only then do stripe operations continue without it.
//! * A dropped future never leaves a sequence number in flight (the checkpoint could never
//!   pass it, the log would fill and every writer wait): a record dropped before it is
//!   durable poisons the journal (`Abandon`), one dropped after it (`Applied`, a deferred
//!   finish: `Journal::release`) too unless its member writes all completed; each releases
//!   its sequence number on drop. A durable record dropped before its member writes all
//!   completed is an orphan (its stripe may be torn): the switch to bitmap mode writes it
//!   to the members again from the log before "no journal" is durable (checkpoints never
//!   pass it meanwhile), and until then every stripe lock and every read settles the
//!   orphans first (`Array::lock_stripe`), so no operation computes parity from, or
//!   decodes, a torn stripe. If the log cannot be read back (a second fault: the journal
//!   device failing too), the stripe may stay torn: that is logged with the advice to
//!   scrub in repair mode.
//! * Write-back's deferred member writes are bounded in bytes (`deferred_limit`, default
//!   `DEFAULT_DEFERRED_LIMIT`): a record is deferred only if its bytes fit under the bound
//!   (`reserve_deferred`, counted until its finish releases them); otherwise its writer
//!   does the member writes itself before it is acknowledged, as in write-through mode, so
//!   at the bound new writes wait for the members and never fail. The wait needs nothing a
//!   deferred write holds (those hold only their own stripe and do member I/O), so it cannot
//!   deadlock.
//! * Assertions (`assert!`, also in release: each is O(1) per record or checkpoint, and a
//!   violation would make replay write the wrong bytes): a record never straddles the end
//!   of a lap and positions only move forward (`reserve`); a checkpoint never moves the
//!   tail backwards (`checkpoint`).
//! * Members a record leaves out because they failed are durably recorded failed before the
//!   record is written (else a cut brings them back trusted under replayed parity). The write-intent bitmap runs under the
//!   journal all along, so its dirty regions cover everything written since.

use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::error::ArrayError;
use crate::members::Members;
use crate::metadata::Metadata;
use futures::executor::block_on;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use uraid_core::format::{JournalMode, Superblock};
use uraid_core::journal::{self as fmt, Entry, JournalSuper, JSB_SIZE};
use uraid_core::{Geometry, MemberSet};

/// The journal of a running array.
pub struct Journal<D: BlockDev> {
    dev: D,
    mode: JournalMode,
    uuid: [u8; 16],
    log_len: u64,
    epoch: u64,
    st: Mutex<LogState>,
    /// Group commit: whoever holds it flushes for every record written so far.
    flush_lock: tokio::sync::Mutex<()>,
    /// The journal superblock as last written (checkpoints are serialised by it).
    sb: tokio::sync::Mutex<JournalSuper>,
    /// Set once an I/O error took the journal out of service (bitmap mode from then on).
    failed: AtomicBool,
    /// Serialises the switch to bitmap mode; true once it is durable (and `fallback_done`).
    fallback: tokio::sync::Mutex<bool>,
    fallback_done: AtomicBool,
    /// `LogState::orphans` is not empty (one load on the read and lock paths).
    orphaned: AtomicBool,
    /// The failure was logged.
    reported: AtomicBool,
    checkpoint_running: AtomicBool,
    stats: JournalStats,
    /// Bytes of deferred member writes held in memory now, and their bound (module docs).
    deferred_bytes: AtomicU64,
    deferred_limit: AtomicU64,
    /// I/O timeouts: the array's watchdog ages the journal's I/Os like a member's and aborts
    /// them (ETIMEDOUT: the journal fails, the array falls back to bitmap mode).
    pub(crate) health: crate::members::Health,
    watched: AtomicBool,
}

/// Counters for status and metrics (`Journal::status`).
#[derive(Default)]
struct JournalStats {
    records: AtomicU64,
    bytes: AtomicU64,
    commits: AtomicU64,
    checkpoints: AtomicU64,
    replayed: AtomicU64,
    reapplied: AtomicU64,
}

struct LogState {
    /// Next free logical position and sequence number.
    head: u64,
    next_seq: u64,
    /// Oldest logical position still needed (as the durable superblock says).
    tail: u64,
    /// The sequence number there: every record before it is checkpointed away, durably.
    tail_seq: u64,
    /// Records reserved whose member writes have not all completed: seq → position.
    inflight: BTreeMap<u64, u64>,
    /// Per member slot: one past the newest record that writes it (0: none this session).
    /// A slot is retired up to here before a new device takes it (`retire_slot`).
    last_with: Vec<u64>,
    /// Records reserved whose journal write has not completed.
    unwritten: BTreeMap<u64, ()>,
    /// Every record up to this sequence number is durable.
    durable: u64,
    /// Durable records dropped before their member writes all completed (seq, position):
    /// their stripes may be torn until `reapply_orphans` writes them again.
    orphans: Vec<(u64, u64)>,
}

/// A snapshot for status and metrics.
#[derive(Debug, Clone, Default)]
pub struct JournalStatus {
    pub device: String,
    pub mode: &'static str,
    /// "active", or "failed" (the array runs in bitmap mode).
    pub state: &'static str,
    pub log_bytes: u64,
    pub used_bytes: u64,
    pub records: u64,
    pub bytes: u64,
    /// Journal flushes (each makes every record written before it durable).
    pub commits: u64,
    pub checkpoints: u64,
    /// Records replayed when the array was assembled.
    pub replayed: u64,
    /// Durable records dropped before their member writes completed and written to the
    /// members again at the switch to bitmap mode (`Journal::orphan`).
    pub reapplied: u64,
    /// Write-back: bytes of acknowledged member writes held in memory until the members
    /// have them, and their bound.
    pub deferred_bytes: u64,
    pub deferred_limit: u64,
}

/// The default bound of write-back's deferred member writes: 256 MiB, a burst of a quarter
/// second at 1 GB/s of member writes held for slow members (md's stripe cache holds far
/// less, 256 stripes), well under the 1 GiB a server should stay within; a record larger
/// than the bound is never deferred.
pub const DEFAULT_DEFERRED_LIMIT: u64 = 256 << 20;

/// Reads both superblock slots of a journal device.
fn read_super<J: BlockDev>(dev: &J) -> Result<JournalSuper, String> {
    let (r, b) = block_on(dev.read(0, buf::alloc(2 * JSB_SIZE)));
    r.map_err(|e| format!("{}: cannot read the journal superblock: {e}", dev.name()))?;
    fmt::pick_super(&b[..JSB_SIZE], &b[JSB_SIZE..]).map_err(|e| format!("{}: {e}", dev.name()))
}

/// Writes `sb` into its slot and flushes.
async fn write_super<J: BlockDev>(dev: &J, sb: &JournalSuper) -> io::Result<()> {
    let at = (sb.slot() * JSB_SIZE) as u64;
    dev.write(at, buf::copy_of(&sb.encode())).await.0?;
    dev.flush().await
}

/// Writes a fresh journal superblock (both slots) on `dev` for the array `array_uuid`.
pub fn format_journal<J: BlockDev>(
    dev: &J,
    array_uuid: [u8; 16],
    journal_uuid: [u8; 16],
) -> io::Result<JournalSuper> {
    let mut sb = JournalSuper::new(array_uuid, journal_uuid, dev.size());
    for g in [2, 1] {
        sb.gen = g;
        let at = (sb.slot() * JSB_SIZE) as u64;
        block_on(dev.write(at, buf::copy_of(&sb.encode()))).0?;
    }
    block_on(dev.flush())?;
    Ok(sb)
}

/// Checks that `dev` is the journal `sb` names: its superblock, the array and journal
/// uuids, and a log large enough for this array's records.
pub fn check_journal<J: BlockDev>(dev: &J, sb: &Superblock) -> Result<JournalSuper, String> {
    let Some((uuid, _)) = sb.journal else {
        return Err("the array has no journal".into());
    };
    let j = read_super(dev)?;
    if j.array_uuid != sb.array_uuid || j.journal_uuid != uuid {
        return Err(format!(
            "{} is journal {} of array {}, not this array's journal {}",
            dev.name(),
            uraid_core::format::uuid_string(&j.journal_uuid),
            uraid_core::format::uuid_string(&j.array_uuid),
            uraid_core::format::uuid_string(&uuid)
        ));
    }
    let g = &sb.geometry;
    if j.log_start + j.log_len > dev.size() || j.log_len < fmt::min_log(g.members, g.chunk) {
        return Err(format!(
            "{}: the journal's log area ({} bytes) does not fit the device or holds fewer than \
             four of this array's largest records",
            dev.name(),
            j.log_len
        ));
    }
    Ok(j)
}

/// Replays the journal `dev` onto `members` (assembly; sync): every record after the
/// checkpoint is written, in order, to the members present (`members[i]` None: missing or
/// failed, its entries are skipped) and the members written are flushed; a member whose
/// replay write or flush fails is left out (set to None). Err if the records are invalid or
/// too many members are left. The caller builds the array, then starts the journal's new
/// epoch (`new_epoch`); a crash before that replays the same records again (idempotent).
pub(crate) fn replay_records<D: BlockDev>(
    dev: &D,
    sb: &Superblock,
    members: &mut [Option<D>],
) -> Result<(JournalSuper, fmt::Walk), String> {
    let j = check_journal(dev, sb)?;
    let g = &sb.geometry;
    let max_payload = g.members as u64 * g.chunk;
    let mut err: Option<String> = None;
    let mut written = MemberSet::EMPTY;
    // Members whose replay write failed: left out (failed) like absent ones.
    let mut bad = MemberSet::EMPTY;
    let walk = fmt::walk(
        &j,
        g.members,
        max_payload,
        |at, len| {
            let (r, b) = block_on(dev.read(at, buf::alloc(len)));
            r.map(|()| b.to_vec())
        },
        |h, payload| {
            let mut p = 0usize;
            for e in &h.entries {
                let bytes = &payload[p..p + e.len as usize];
                p += e.len as usize;
                let m = e.member as usize;
                let Some(d) = members.get(m).and_then(|d| d.as_ref()) else {
                    continue;
                };
                if bad.contains(m) {
                    continue;
                }
                if e.off + e.len as u64 > g.member_data {
                    err.get_or_insert(format!(
                        "journal record {} writes past member {m}'s data area",
                        h.seq
                    ));
                    continue;
                }
                match block_on(d.write(sb.data_offset + e.off, buf::copy_of(bytes))).0 {
                    Ok(()) => written = written.with(m),
                    Err(e) => {
                        tracing::error!(
                            "member {m} ({}): journal replay write failed: {e}; leaving it out \
                             of the array (faulty)",
                            d.name()
                        );
                        bad = bad.with(m);
                    }
                }
            }
        },
    )
    .map_err(|e| format!("{}: reading the journal: {e}", dev.name()))?;
    if let Some(e) = err {
        return Err(e);
    }
    for m in written.minus(bad).iter() {
        if let Some(d) = &members[m] {
            if let Err(e) = block_on(d.flush()) {
                tracing::error!(
                    "member {m} ({}): flush after the journal replay failed: {e}; leaving it \
                     out of the array (faulty)",
                    d.name()
                );
                bad = bad.with(m);
            }
        }
    }
    for m in bad.iter() {
        members[m] = None;
    }
    let absent: MemberSet = (0..g.members).filter(|&i| members[i].is_none()).collect();
    if !g.survives(absent) {
        return Err(format!(
            "after the journal replay {} of {} members are missing or failed; {} tolerates {}",
            absent.len(),
            g.members,
            g.level,
            g.fault_tolerance()
        ));
    }
    Ok((j, walk))
}

/// After a replay (`replay_records`) of `walk` from journal superblock `j`: the journal
/// superblock starts a new epoch with an empty log, so the old records are never replayed
/// again. Returns that superblock (for `Journal::new`).
pub(crate) fn new_epoch<D: BlockDev>(
    dev: &D,
    j: &JournalSuper,
    walk: &fmt::Walk,
) -> Result<JournalSuper, String> {
    let next = JournalSuper {
        epoch: j.epoch + 1,
        gen: j.gen + 1,
        tail: walk.end,
        tail_seq: walk.next_seq,
        ..j.clone()
    };
    block_on(write_super(dev, &next)).map_err(|e| format!("{}: {e}", dev.name()))?;
    if walk.records > 0 {
        tracing::warn!(
            "journal {}: replayed {} record(s), {} bytes, onto the members: every stripe written \
             when the array stopped is consistent again (no resync needed)",
            dev.name(),
            walk.records,
            walk.bytes
        );
    }
    Ok(next)
}

/// How many records a replay of `dev` would apply (a read-only look: nothing is written).
pub fn pending_records<J: BlockDev>(dev: &J, sb: &Superblock) -> Result<u64, String> {
    let j = check_journal(dev, sb)?;
    let g = &sb.geometry;
    fmt::walk(
        &j,
        g.members,
        g.members as u64 * g.chunk,
        |at, len| {
            let (r, b) = block_on(dev.read(at, buf::alloc(len)));
            r.map(|()| b.to_vec())
        },
        |_, _| {},
    )
    .map(|w| w.records)
    .map_err(|e| format!("{}: reading the journal: {e}", dev.name()))
}

impl<D: BlockDev> Journal<D> {
    /// A journal whose superblock `sb` was just written by `new_epoch` (empty log).
    pub fn new(dev: D, mode: JournalMode, sb: JournalSuper, replayed: u64) -> Journal<D> {
        let st = LogState {
            head: sb.tail,
            next_seq: sb.tail_seq,
            tail: sb.tail,
            tail_seq: sb.tail_seq,
            inflight: BTreeMap::new(),
            last_with: Vec::new(),
            unwritten: BTreeMap::new(),
            orphans: Vec::new(),
            durable: sb.tail_seq - 1,
        };
        let j = Journal {
            mode,
            uuid: sb.journal_uuid,
            log_len: sb.log_len,
            epoch: sb.epoch,
            dev,
            st: Mutex::new(st),
            flush_lock: tokio::sync::Mutex::new(()),
            sb: tokio::sync::Mutex::new(sb),
            failed: AtomicBool::new(false),
            fallback: tokio::sync::Mutex::new(false),
            fallback_done: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            health: Default::default(),
            watched: AtomicBool::new(false),
            checkpoint_running: AtomicBool::new(false),
            stats: JournalStats::default(),
            deferred_bytes: AtomicU64::new(0),
            deferred_limit: AtomicU64::new(DEFAULT_DEFERRED_LIMIT),
        };
        j.stats.replayed.store(replayed, Ordering::Relaxed);
        j
    }

    /// A write to the journal device, timed out by the array's watchdog.
    async fn dev_write(&self, at: u64, b: IoBuf) -> io::Result<()> {
        let w = self.watched.load(Ordering::Relaxed);
        crate::reactor::coop().await;
        self.health
            .timed(w, async { self.dev.write(at, b).await.0 }, Err)
            .await
    }

    /// A read of the journal device, timed out by the array's watchdog.
    async fn dev_read(&self, at: u64, len: usize) -> io::Result<IoBuf> {
        let w = self.watched.load(Ordering::Relaxed);
        crate::reactor::coop().await;
        self.health
            .timed(
                w,
                async {
                    let (r, b) = self.dev.read(at, buf::alloc(len)).await;
                    r.map(|()| b)
                },
                Err,
            )
            .await
    }

    /// A flush of the journal device, timed out by the array's watchdog.
    async fn dev_flush(&self) -> io::Result<()> {
        let w = self.watched.load(Ordering::Relaxed);
        crate::reactor::coop().await;
        self.health.timed(w, self.dev.flush(), Err).await
    }

    /// Writes `sb` into its slot and flushes (timed).
    async fn write_super(&self, sb: &JournalSuper) -> io::Result<()> {
        let at = (sb.slot() * JSB_SIZE) as u64;
        self.dev_write(at, buf::copy_of(&sb.encode())).await?;
        self.dev_flush().await
    }

    pub(crate) fn name(&self) -> &str {
        self.dev.name()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn active(&self) -> bool {
        !self.failed.load(Ordering::Acquire)
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    fn used(&self) -> u64 {
        let st = self.lock();
        st.head - st.tail
    }

    /// Makes record `seq` durable (group commit, module docs).
    async fn commit(&self, seq: u64) -> io::Result<()> {
        let poisoned = || io::Error::other("the journal failed: an earlier record was lost");
        loop {
            if !self.active() {
                return Err(poisoned());
            }
            if self.lock().durable >= seq {
                return Ok(());
            }
            let _g = self.flush_lock.lock().await;
            // Every record before the first unwritten one is written.
            let target = {
                let st = self.lock();
                if st.durable >= seq {
                    return Ok(());
                }
                st.unwritten
                    .keys()
                    .next()
                    .map_or(st.next_seq - 1, |&s| s - 1)
            };
            if target < seq {
                // An earlier record's write is still in flight: let it finish.
                drop(_g);
                crate::reactor::yield_now().await;
                continue;
            }
            if let Err(e) = self.dev_flush().await {
                // Poisoned before the flush lock goes: a later flush that succeeds may not
                // cover what this one lost, so nobody may count past it.
                self.failed.store(true, Ordering::SeqCst);
                return Err(e);
            }
            // A record at or below `target` whose write failed (or was abandoned) was taken
            // out of `unwritten` only after the journal was marked failed: nothing past it
            // may count as durable.
            if !self.active() {
                return Err(poisoned());
            }
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            let mut st = self.lock();
            st.durable = st.durable.max(target);
        }
    }
}

/// A record reserved that is not durable yet: dropping it (a cancelled request, before its
/// write completed or during its commit) poisons the journal and releases the sequence
/// number (`Journal::log`), so neither a commit nor a checkpoint nor the fallback waits
/// for it.
struct Abandon<'a, D: BlockDev> {
    j: &'a Journal<D>,
    seq: u64,
    armed: bool,
}

impl<D: BlockDev> Drop for Abandon<'_, D> {
    fn drop(&mut self) {
        if self.armed {
            self.j.failed.store(true, Ordering::SeqCst);
            let mut st = self.j.lock();
            st.unwritten.remove(&self.seq);
            st.inflight.remove(&self.seq);
        }
    }
}

/// A durable record whose member writes are being issued: `done()` once they all completed
/// (or failed their members), which lets a checkpoint pass it. Dropped without `done` (a
/// cancelled request: its stripe may be torn) it poisons the journal instead and becomes an
/// orphan (`Journal::orphan`): never checkpointed away, written to the members again at the
/// switch to bitmap mode, or replayed by the next assembly if a cut comes first.
pub(crate) struct Applied<'a, D: BlockDev> {
    j: &'a Journal<D>,
    seq: u64,
    done: bool,
    /// The members the record writes: the operation's writes to any other member (failed
    /// since it was planned) must be left out too.
    pub(crate) kept: MemberSet,
}

/// What `Journal::reserve` did.
enum Reserve {
    Done(u64, u64),
    Full,
    Changed,
}

impl<D: BlockDev> Applied<'_, D> {
    pub(crate) fn done(mut self) {
        self.done = true;
    }

    /// Hands the record's member writes to the task that finishes them (`Array::finish_deferred`,
    /// which releases the record: `Journal::release`) if their bytes fit under the bound of
    /// deferred writes (`Journal::reserve_deferred`); else gives them back with the record,
    /// for the caller to write before it is acknowledged.
    #[allow(clippy::type_complexity)]
    pub(crate) fn defer(
        mut self,
        writes: Vec<(usize, u64, IoBuf)>,
        region: Option<u64>,
    ) -> Result<Deferred, (Self, Vec<(usize, u64, IoBuf)>)> {
        let bytes: u64 = writes.iter().map(|w| w.2.len() as u64).sum();
        if !self.j.reserve_deferred(bytes) {
            return Err((self, writes));
        }
        self.done = true;
        let seq = self.seq;
        // Still in flight: the deferred writer removes it when its writes completed.
        self.seq = u64::MAX;
        Ok(Deferred {
            seq,
            bytes,
            writes,
            region,
        })
    }
}

/// The member writes of a durable record whose client writes were acknowledged already
/// (write-back journal on reactors): the stripe stays locked until they completed.
pub(crate) struct Deferred {
    seq: u64,
    /// Counted in the journal's deferred bytes until released.
    bytes: u64,
    writes: Vec<(usize, u64, IoBuf)>,
    region: Option<u64>,
}

impl<D: BlockDev> Drop for Applied<'_, D> {
    fn drop(&mut self) {
        if self.seq == u64::MAX {
            return;
        }
        if self.done {
            self.j.lock().inflight.remove(&self.seq);
        } else {
            self.j.orphan(self.seq);
        }
    }
}

impl Deferred {
    /// The record's sequence number, its bytes, its member writes and its write-intent
    /// region (the task that finishes it: `Journal::release` once the writes completed).
    #[allow(clippy::type_complexity)]
    pub(crate) fn into_parts(self) -> (u64, u64, Vec<(usize, u64, IoBuf)>, Option<u64>) {
        (self.seq, self.bytes, self.writes, self.region)
    }
}

impl<D: BlockDev> Journal<D> {
    /// The journal device (tests snapshot it).
    pub(crate) fn dev(&self) -> &D {
        &self.dev
    }

    pub(crate) fn mode(&self) -> JournalMode {
        self.mode
    }

    /// Whether the array's watchdog ages this journal's I/Os (set when it is attached).
    pub(crate) fn set_watched(&self, on: bool) {
        self.watched.store(on, Ordering::Relaxed);
    }

    /// A deferred record (`Applied::defer`) of `bytes` is finished: its member writes
    /// completed (`done`) or were dropped (not done: the journal is poisoned, the record is
    /// an orphan, `orphan`).
    pub(crate) fn release(&self, seq: u64, bytes: u64, done: bool) {
        if done {
            self.lock().inflight.remove(&seq);
        } else {
            self.orphan(seq);
        }
        self.deferred_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Durable record `seq` was dropped before its member writes all completed: its stripe
    /// may be torn. The journal is poisoned (no record is written after it), the record
    /// leaves the in-flight set (nothing waits for it) and is kept as an orphan, which the
    /// switch to bitmap mode writes to the members again before anything else touches the
    /// stripe (`reapply_orphans`; until then every stripe lock and read settles it first:
    /// `Array::lock_stripe`, `Array::read`). A cut before that replays it at assembly (the
    /// journal is still named in the superblocks).
    fn orphan(&self, seq: u64) {
        self.failed.store(true, Ordering::SeqCst);
        let mut st = self.lock();
        if let Some(pos) = st.inflight.remove(&seq) {
            st.orphans.push((seq, pos));
            self.orphaned.store(true, Ordering::SeqCst);
        }
    }

    /// Whether durable records dropped unfinished wait to be written again (`orphan`).
    pub(crate) fn has_orphans(&self) -> bool {
        self.orphaned.load(Ordering::Acquire)
    }

    /// Writes the orphans' entries to the members again, read back from the log (where
    /// they are durable), skipping members failed since. A record that cannot be read back
    /// whole is reported: its stripe may stay torn (the write was never acknowledged in
    /// write-through mode; in write-back mode an acknowledged write may be torn).
    async fn reapply_orphans(&self, geo: &Geometry, meta: &Metadata, members: &Members<D>) {
        let orphans = std::mem::take(&mut self.lock().orphans);
        for (seq, pos) in orphans {
            match self.read_record(geo, seq, pos).await {
                Ok((h, payload)) => {
                    let mut p = 0usize;
                    for e in &h.entries {
                        let bytes = &payload[p..p + e.len as usize];
                        p += e.len as usize;
                        let m = e.member as usize;
                        if members.failed().contains(m) {
                            continue;
                        }
                        if let Err(err) = members.write(m, e.off, buf::copy_of(bytes)).await {
                            meta.fail_member(members, m, &err).await;
                        }
                    }
                    self.stats.reapplied.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::error!(
                    "journal {}: record {seq}, dropped before its member writes completed, \
                     cannot be read back to complete them ({e}): its stripe may be torn; run \
                     `uraid scrub --repair`",
                    self.dev.name()
                ),
            }
        }
        self.orphaned.store(false, Ordering::Release);
    }

    /// Reads record `seq` at logical position `pos` back from the log and checks it.
    async fn read_record(
        &self,
        geo: &Geometry,
        seq: u64,
        pos: u64,
    ) -> io::Result<(fmt::RecordHeader, Vec<u8>)> {
        let at = fmt::LOG_START + pos % self.log_len;
        let hb = self.dev_read(at, fmt::HEADER).await?;
        let max_payload = geo.members as u64 * geo.chunk;
        let h = fmt::decode_header(&hb, geo.members, max_payload)
            .filter(|h| h.epoch == self.epoch && h.seq == seq && h.pos == pos)
            .ok_or_else(|| io::Error::other("the record's header does not match"))?;
        let pb = self
            .dev_read(
                at + fmt::HEADER as u64,
                fmt::align_up(h.payload_len) as usize,
            )
            .await?;
        let payload = pb[..h.payload_len as usize].to_vec();
        if !h.payload_matches(&payload) {
            return Err(io::Error::other(
                "the record's payload checksum does not match",
            ));
        }
        Ok((h, payload))
    }

    /// Sets the bound of deferred member writes in bytes (module docs).
    pub(crate) fn set_deferred_limit(&self, bytes: u64) {
        self.deferred_limit.store(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` of member writes as deferred if they fit under the bound; false: the
    /// caller writes them itself (module docs).
    pub(crate) fn reserve_deferred(&self, bytes: u64) -> bool {
        let limit = self.deferred_limit.load(Ordering::Relaxed);
        self.deferred_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= limit).then_some(held + bytes)
            })
            .is_ok()
    }

    /// Logs the member writes of one stripe operation of an array of geometry `geo` over
    /// `members` (`writes`: member, data-area offset, bytes) and returns once the record is
    /// durable: the token the caller finishes (`Applied::done` or `defer`). None: the
    /// journal is out of service (also after this call switched to bitmap mode, durably,
    /// through `meta`). Err: the array stopped serving meanwhile (nothing may be written).
    /// The caller starts a checkpoint when `half_full` after a record.
    pub(crate) async fn log(
        &self,
        geo: &Geometry,
        meta: &Metadata,
        members: &Members<D>,
        writes: &[(usize, u64, IoBuf)],
    ) -> Result<Option<Applied<'_, D>>, ArrayError> {
        let j = self;
        if !j.active() {
            // Failed: nothing goes to the members unlogged before "no journal" is durable.
            self.failed_wait(geo, meta, members).await;
            return Ok(None);
        }
        // Reserve space (checkpointing when the log is full). Members left out of this
        // record because they failed must be recorded failed before the record can be
        // durable: else a cut brings them back trusted, and replay makes parity over their
        // stale chunks "consistent" (two atomic loads when nothing failed since the last
        // round). The record leaves out exactly the members failed when it is reserved
        // (taken again under the log lock), so a member that failed after this operation
        // was planned gets no entry: `retire_slot` reads `last_with` under the same lock, so
        // no record reserved after a slot's failure can write the slot's next device.
        let (seq, pos, kept, entries, plen) = loop {
            if !j.active() {
                self.failed_wait(geo, meta, members).await;
                return Ok(None);
            }
            // An array past its tolerance frees no space (checkpoints stop): fail the write.
            members.check_serving(geo)?;
            // The set first, then the barrier that makes it durable: a member failing after
            // the snapshot changes the set, and the reservation below sees it (Changed).
            let failed = members.failed();
            meta.failure_barrier(members).await;
            let kept: MemberSet = writes
                .iter()
                .map(|w| w.0)
                .filter(|&m| !failed.contains(m))
                .collect();
            let entries: Vec<Entry> = writes
                .iter()
                .filter(|w| kept.contains(w.0))
                .map(|(m, at, b)| Entry {
                    member: *m as u16,
                    len: b.len() as u32,
                    off: *at,
                })
                .collect();
            let plen: u64 = entries.iter().map(|e| e.len as u64).sum();
            let size = fmt::HEADER as u64 + fmt::align_up(plen);
            match j.reserve(size, &entries, || members.failed() == failed) {
                Reserve::Done(seq, pos) => break (seq, pos, kept, entries, plen),
                // Another member failed meanwhile: make that durable first.
                Reserve::Changed => continue,
                Reserve::Full => {}
            }
            if !self.checkpoint(geo, meta, members).await {
                crate::reactor::yield_now().await;
            }
        };
        // From here until the record is durable (or its failure handled), a dropped future
        // (runtime shutdown, an embedder's timeout) abandons the record: the journal is
        // marked failed and the sequence number leaves the in-flight set, so nobody waits
        // for it (`Abandon`). Dropped before its write completed, the log may hold a gap a
        // later commit must not count past; dropped during its commit, the record may yet
        // become durable without its member writes ever being issued, and replaying it
        // before a later record of the same stripe (computed from the members without it)
        // would leave that stripe's parity wrong. After the poison no record is written
        // again: replay applies at most this one, last for its stripe.
        let mut guard = Abandon {
            j,
            seq,
            armed: true,
        };
        let mut rec = Vec::new();
        let payload: Vec<&[u8]> = writes
            .iter()
            .filter(|w| kept.contains(w.0))
            .map(|w| &w.2[..])
            .collect();
        fmt::encode_record(j.epoch, seq, pos, &entries, &payload, &mut rec);
        let at = fmt::LOG_START + pos % j.log_len;
        let r = j.dev_write(at, buf::copy_of(&rec)).await;
        if r.is_err() {
            // Failed first, then out of `unwritten` (commit's rule).
            j.failed.store(true, Ordering::SeqCst);
        }
        j.lock().unwritten.remove(&seq);
        let r = match r {
            Ok(()) => j.commit(seq).await,
            Err(e) => Err(e),
        };
        guard.armed = false;
        if let Err(e) = r {
            j.lock().inflight.remove(&seq);
            self.fail(geo, meta, members, &e).await;
            return Ok(None);
        }
        j.stats.records.fetch_add(1, Ordering::Relaxed);
        j.stats.bytes.fetch_add(plen, Ordering::Relaxed);
        Ok(Some(Applied {
            j,
            seq,
            done: false,
            kept,
        }))
    }

    /// Reserves `size` bytes of log for the next record, whose `entries` name the members
    /// it writes, if `unchanged()` still holds under the log lock: its sequence number and
    /// logical position; `Full` when a checkpoint must free space first.
    fn reserve(&self, size: u64, entries: &[Entry], unchanged: impl FnOnce() -> bool) -> Reserve {
        let mut st = self.lock();
        if !unchanged() {
            return Reserve::Changed;
        }
        let pos = fmt::next_lap(st.head, size, self.log_len);
        // A record never straddles the end of a lap, and positions only move forward.
        assert!(
            pos >= st.head && pos % self.log_len + size <= self.log_len,
            "journal record at {pos} ({size} bytes) straddles a lap of {} (head {})",
            self.log_len,
            st.head
        );
        if pos + size - st.tail > self.log_len {
            return Reserve::Full;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.head = pos + size;
        st.inflight.insert(seq, pos);
        st.unwritten.insert(seq, ());
        for e in entries {
            let m = e.member as usize;
            if st.last_with.len() <= m {
                st.last_with.resize(m + 1, 0);
            }
            st.last_with[m] = seq + 1;
        }
        Reserve::Done(seq, pos)
    }

    /// Before a new device takes failed slot `slot` (an add, a hot spare, a replacement
    /// taking over): every record that wrote the slot's old member is checkpointed away,
    /// durably. Replay writes a record's entries to whatever device fills the slot at
    /// assembly; a record from before the failure would write the old member's chunk over
    /// what the rebuild put on the new device (stale data, or parity that no longer matches
    /// the stripe) — records after the failure leave the slot out (`log` takes the failed
    /// set again under the log lock), so nothing would repair it. Call it once the slot's
    /// failure is durable, without holding the superblock lock (the checkpoint's member
    /// flush may need it). A journal that fails meanwhile: returns once "no journal" is
    /// durable (no replay after that). Found by the interaction simulator.
    pub(crate) async fn retire_slot(
        &self,
        slot: usize,
        geo: &Geometry,
        meta: &Metadata,
        members: &Members<D>,
    ) {
        let upto = self.lock().last_with.get(slot).copied().unwrap_or(0);
        if upto == 0 {
            return;
        }
        // The records up to `upto` finish their member writes...
        while self.active() && self.lock().inflight.range(..upto).next().is_some() {
            crate::reactor::yield_now().await;
        }
        // ...and the durable tail passes them (members flushed first: `checkpoint`).
        while self.active()
            && members.check_serving(geo).is_ok()
            && self.sb.lock().await.tail_seq < upto
        {
            if !self.checkpoint(geo, meta, members).await {
                crate::reactor::yield_now().await;
            }
        }
        if !self.active() {
            self.failed_wait(geo, meta, members).await;
        }
    }

    /// Whether no record that wrote `slot` can be replayed any more: none was logged this
    /// session, the durable tail is past the newest one, or the switch to bitmap mode is
    /// done (durable while the array serves, which callers check first: past the tolerance
    /// the records stay). `retire_slot` ends in this state unless the array stopped
    /// serving; a slot that held another device since (a replacement that took over, then
    /// failed) may have new records, so whoever retired it checks again under the
    /// superblock lock before a device takes it.
    pub(crate) fn slot_retired(&self, slot: usize) -> bool {
        let st = self.lock();
        let upto = st.last_with.get(slot).copied().unwrap_or(0);
        upto == 0 || st.tail_seq >= upto || self.fallback_done.load(Ordering::Acquire)
    }

    /// More than half of the log is in use: time for a background checkpoint.
    pub(crate) fn half_full(&self) -> bool {
        self.used() > self.log_len / 2
    }

    /// Claims the one background checkpoint slot; false if one is running already.
    pub(crate) fn claim_checkpoint(&self) -> bool {
        !self.checkpoint_running.swap(true, Ordering::AcqRel)
    }

    /// The background checkpoint claimed by `claim_checkpoint` finished.
    pub(crate) fn checkpoint_finished(&self) {
        self.checkpoint_running.store(false, Ordering::Release);
    }

    /// Moves the tail past every record whose member writes completed: `members` flushed
    /// (through `meta`, which records any member that fails), then the journal superblock.
    /// Returns whether space was freed (never while out of service).
    pub(crate) async fn checkpoint(
        &self,
        geo: &Geometry,
        meta: &Metadata,
        members: &Members<D>,
    ) -> bool {
        let j = self;
        if !j.active() {
            return false;
        }
        let mut sb = j.sb.lock().await;
        let (tail, tail_seq) = {
            let st = j.lock();
            // Failed since the check above: an orphan may have left both sets already (the
            // switch to bitmap mode took it to write it again); nothing is checkpointed.
            if !j.active() {
                return false;
            }
            // Orphans (dropped unfinished, not yet written again) hold the tail like records
            // in flight: one may leave the in-flight set while this checkpoint runs.
            let first = st
                .inflight
                .iter()
                .map(|(&seq, &pos)| (seq, pos))
                .chain(st.orphans.iter().copied())
                .min();
            match first {
                Some((seq, pos)) => (pos, seq),
                None => (st.head, st.next_seq),
            }
        };
        if tail == sb.tail {
            return false;
        }
        // Every record still in flight lies past the durable tail: it only moves forward.
        assert!(
            tail > sb.tail && tail_seq >= sb.tail_seq,
            "journal checkpoint moving backwards: tail {tail} (seq {tail_seq}) behind {} \
             (seq {})",
            sb.tail,
            sb.tail_seq
        );
        // Every record before `tail` has completed its member writes: make them durable.
        meta.flush_members(members).await;
        if members.check_serving(geo).is_err() {
            // Past the level's tolerance: keep every record (a forced assembly may want it).
            return false;
        }
        let next = JournalSuper {
            tail,
            tail_seq,
            gen: sb.gen + 1,
            ..sb.clone()
        };
        if let Err(e) = j.write_super(&next).await {
            drop(sb);
            self.fail(geo, meta, members, &e).await;
            return false;
        }
        *sb = next;
        {
            let mut st = j.lock();
            st.tail = tail;
            st.tail_seq = tail_seq;
        }
        j.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A journal I/O error: switch to bitmap mode durably (module docs), then return.
    async fn fail(&self, geo: &Geometry, meta: &Metadata, members: &Members<D>, e: &io::Error) {
        let j = self;
        j.failed.store(true, Ordering::SeqCst);
        if !j.reported.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "journal {} failed: {e}; the array continues in write-intent bitmap mode (the \
                 write hole is open again until a journal is added back)",
                j.dev.name()
            );
        }
        self.failed_wait(geo, meta, members).await;
    }

    /// Waits until the switch to bitmap mode is durable (doing it if nobody has): records
    /// in flight finish, `members` are flushed and, while the array serves, a superblock
    /// round through `meta` records "no journal".
    pub(crate) async fn failed_wait(&self, geo: &Geometry, meta: &Metadata, members: &Members<D>) {
        let j = self;
        if j.fallback_done.load(Ordering::Acquire) {
            return;
        }
        let mut done = j.fallback.lock().await;
        if !*done {
            // Records already durable finish their member writes first (their writers never
            // wait for this lock), so every logged stripe operation is whole on the members.
            while !j.lock().inflight.is_empty() {
                crate::reactor::yield_now().await;
            }
            // Records dropped before their member writes completed are written again
            // (their stripes may be torn, and no replay will follow once "no journal" is
            // durable).
            self.reapply_orphans(geo, meta, members).await;
            // Members next: until the round below is durable, assembly still trusts the
            // journal's records over the members; after it, only the members count, so
            // they must already hold everything acknowledged (write-back: what only the
            // journal made durable).
            meta.flush_members(members).await;
            if members.check_serving(geo).is_ok() {
                meta.drop_journal(members).await;
            }
            // Past the level's tolerance nothing is written any more; the journal stays
            // named, its records kept for a forced assembly.
            *done = true;
            j.fallback_done.store(true, Ordering::Release);
        }
    }

    /// Waits until every journalled stripe operation finished its member writes (a clean
    /// stop flushes the members after this).
    pub(crate) async fn drain(&self) {
        while !self.lock().inflight.is_empty() {
            crate::reactor::yield_now().await;
        }
    }

    /// A snapshot for status and metrics.
    pub(crate) fn status(&self) -> JournalStatus {
        let j = self;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        JournalStatus {
            device: j.dev.name().to_string(),
            mode: j.mode.name(),
            state: if j.active() { "active" } else { "failed" },
            log_bytes: j.log_len,
            used_bytes: j.used(),
            records: l(&j.stats.records),
            bytes: l(&j.stats.bytes),
            commits: l(&j.stats.commits),
            checkpoints: l(&j.stats.checkpoints),
            replayed: l(&j.stats.replayed),
            reapplied: l(&j.stats.reapplied),
            deferred_bytes: l(&j.deferred_bytes),
            deferred_limit: l(&j.deferred_limit),
        }
    }
}
