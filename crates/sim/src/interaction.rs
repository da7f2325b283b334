//! The interaction simulator: one seeded run drives the whole engine on its reactors —
//! clients on several connections (writes, FUA writes, reads, flushes, trims, zeroes) — while
//! it injects every fault class the design claims to survive, in any combination: power cuts
//! behind volatile write caches (cached writes kept, dropped or torn at 512-byte sectors),
//! member failures (operator, device death, death after N operations), media errors, slow
//! metadata writes, fail-slow members read around (and their probes and probation), a journal in either mode and its failure, the write-intent bitmap daemon, a
//! device taking a failed slot (`add`, or a hot spare taking over) and its rebuild, replace,
//! remove, scrub (with corruption planted on a member's medium of a synced array), resync
//! after an unclean stop, and restarts
//! in the middle of any walk.
//!
//! A run is a sequence of *stages*. A stage assembles the array from what the media hold
//! (with the product's rules: superblock slots, `decide`, journal replay, map merge), checks
//! every sector against the model, then serves a seeded workload with faults until its power
//! is cut (at a random member operation) or it stops cleanly.
//!
//! The model is the history of client operations with their issue and acknowledgement times
//! (one counter for all connections). A read while serving may return, per sector, the value
//! before the stage (unless a write acknowledged before the read was issued covers it) or any
//! write issued before the read completed that no write finished between it and the read
//! replaced. After a power cut, a sector may hold the newest write whose acknowledgement a
//! completed FLUSH covered, or a write that may have replaced it (`crash::allowed_values`).
//! Within the level's tolerance a read may fail only where the array itself says it refuses
//! (a stripe not yet resynced whose redundancy is gone: the write hole without a journal).
//!
//! `beyond` mode goes past the tolerance on purpose: the array must then fail cleanly —
//! requests error, assembly refuses or serves only bytes the model allows — never return
//! wrong data.
//!
//! Reproduction: the schedule (configuration, each task's operations and fault choices, cut
//! points) is a pure function of the seed; the interleaving is not: the same seed's actions
//! differ between runs, even on one reactor (not yet traced: jobs that cross the ring through
//! the eventfd and time-based rounds are the suspects), so a failing seed fails on most
//! reruns, not all. `URAID_SIM_LOG=1` prints each stage's actions.

use crate::crash::{allowed_values, cached_dev, reassemble_on, Clock, Ev};
use crate::rng::Rng;
use crate::{fresh_images_with, journal_image, payload, MemDev};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use uraid_core::format::{JournalMode, DATA_OFFSET};
use uraid_core::geometry::SECTOR;
use uraid_core::{Geometry, Level};
use uraid_engine::{ArrayError, BlockDev, Runtime, ScrubMode, Volume, WriteBuf};

/// The simulator's array options: `sim_options` with write plugging and read-ahead on, as
/// `serve` runs (its clients send pipelined sequential streams: stripe/plug.rs, and read
/// them back: readahead.rs; a small budget, so units are evicted too).
fn plugging_options() -> uraid_engine::ArrayOptions {
    uraid_engine::ArrayOptions {
        merge_wait: Duration::from_micros(500),
        read_ahead: 2 << 20,
        ..crate::sim_options()
    }
}

/// One run's shape, drawn from its seed.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub level: Level,
    pub members: usize,
    pub chunk: u64,
    /// Stripes (rows) per member.
    pub rows: u64,
    pub journal: Option<JournalMode>,
    /// Journal size in records of the largest size (small: it wraps and checkpoints often;
    /// large: records stay in the log across member changes).
    pub journal_records: u64,
    pub reactors: usize,
    /// Concurrent client connections, and operations each per stage.
    pub conns: usize,
    pub ops: usize,
    pub stages: usize,
    /// Run the write-intent bitmap daemon's pass beside the clients.
    pub bitmap_daemon: bool,
    /// Go past the level's tolerance (the array must fail cleanly).
    pub beyond: bool,
    /// Let a device take a failed slot (add, spare, replace take-over) while stripes wait for
    /// resync and no journal is in service. On by default: the rebuild never decodes such a
    /// stripe unverified, the new member's chunk there goes on its bad-block list (read EIO,
    /// which the model accepts for a listed stripe, never other bytes).
    pub rebuild_unsynced: bool,
}

const LEVELS: &[(Level, usize)] = &[
    (Level::Raid1, 3),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid5, 5),
    (Level::Raid6, 6),
    (Level::Ec { parity: 3 }, 6),
];

impl SimConfig {
    /// The configuration of seed `seed` (within the tolerance).
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut r = Rng::new(seed ^ 0x51AE);
        let (level, members) = LEVELS[r.below(LEVELS.len() as u64) as usize];
        let journal = if level.is_parity() {
            match r.below(3) {
                0 => None,
                1 => Some(JournalMode::WriteThrough),
                _ => Some(JournalMode::WriteBack),
            }
        } else {
            None
        };
        SimConfig {
            seed,
            level,
            members,
            chunk: 4096,
            rows: 24,
            journal,
            journal_records: if r.below(2) == 0 { 8 } else { 64 },
            reactors: 1 + (r.below(4) == 0) as usize,
            conns: 2 + r.below(3) as usize,
            ops: 24 + r.below(24) as usize,
            stages: 3 + r.below(2) as usize,
            bitmap_daemon: r.below(2) == 0,
            beyond: false,
            rebuild_unsynced: true,
        }
        .focused()
    }

    /// `from_seed` narrowed to the journal: a parity level with a large journal and no
    /// bitmap daemon (whose passes checkpoint the journal), so records stay in the log
    /// across member changes. `URAID_SIM_FOCUS=journal` makes `from_seed` do this.
    pub fn journal_focus(seed: u64) -> SimConfig {
        SimConfig::from_seed(seed).focus_journal()
    }

    fn focused(self) -> SimConfig {
        if std::env::var("URAID_SIM_FOCUS").as_deref() == Ok("journal") {
            self.focus_journal()
        } else {
            self
        }
    }

    fn focus_journal(mut self) -> SimConfig {
        {
            let mut r = Rng::new(self.seed ^ 0xF0C5);
            let parity = [(Level::Raid5, 4), (Level::Raid5, 5), (Level::Raid6, 6)];
            (self.level, self.members) = parity[r.below(3) as usize];
            self.journal = Some(if r.below(2) == 0 {
                JournalMode::WriteThrough
            } else {
                JournalMode::WriteBack
            });
            self.journal_records = 64;
            self.bitmap_daemon = false;
        }
        self
    }

    fn geometry(&self) -> Geometry {
        Geometry::new(self.level, self.members, self.chunk, self.rows * self.chunk)
            .expect("valid simulator geometry")
    }
}

/// What a run did (so a test can check the mix really happened).
#[derive(Debug, Default, Clone)]
pub struct SimReport {
    pub stages: usize,
    pub power_cuts: usize,
    pub acked_writes: usize,
    pub reads_checked: usize,
    /// Reads refused (EIO) where the array said it must refuse.
    pub reads_refused: usize,
    /// Member bytes discarded (trims of whole granules passed down).
    pub discarded: u64,
    /// Stripe writes that waited for the rest of their stripe, and those whose stripe
    /// filled (stripe/plug.rs).
    pub plugged: u64,
    pub plug_filled: u64,
    /// Reads served from read-ahead (readahead.rs), and bytes it dropped because a change
    /// overlapped them.
    pub read_ahead_hits: u64,
    pub read_ahead_dropped: u64,
    /// Reads served around a member flagged slow (slow.rs).
    pub slow_reads_around: u64,
    /// Every fault and lifecycle action taken, in order ("fail 2", "add 2", ...).
    pub actions: Vec<String>,
}

/// Runs seed `seed` with its own configuration.
pub fn run_seed(seed: u64) -> Result<SimReport, String> {
    run(&SimConfig::from_seed(seed))
}

/// The devices of a run: every image ever given to the array, by device index (named
/// `mem{index}`); the journal is one of them.
struct Media {
    images: Vec<Vec<u8>>,
    journal: Option<usize>,
    /// Devices the array may be assembled from (old replaced ones stay: assembly must
    /// refuse them by uuid).
    present: Vec<bool>,
}

/// The model: the volume's contents when the stage began, per sector possibly unknown
/// (a refused stripe), and the stage's history.
#[derive(Clone)]
struct Base {
    bytes: Vec<u8>,
    unknown: Vec<bool>,
    /// Other values a sector may show without a write (the previous histories allowed
    /// them and the read-back happened to show another): after a power cut a mirror row
    /// not yet resynced reads as its first copy, and as another copy once the first is lost
    /// (md does the same); cleared by a clean stop (every row in sync).
    alts: std::collections::HashMap<usize, Vec<Vec<u8>>>,
}

impl Base {
    fn may_be(&self, s: usize, have: &[u8]) -> bool {
        let lo = s * SECTOR as usize;
        have == &self.bytes[lo..lo + SECTOR as usize]
            || self
                .alts
                .get(&s)
                .is_some_and(|a| a.iter().any(|v| v == have))
    }
}

struct Hist {
    events: Vec<Ev>,
    /// For every write event: when its future returned (also an error).
    done: Vec<Option<u64>>,
    time: u64,
}

impl Hist {
    fn now(&mut self) -> u64 {
        self.time += 1;
        self.time
    }
}

/// Shared state of one stage's tasks.
struct Stage {
    cfg: SimConfig,
    vol: Arc<Volume<MemDev>>,
    clock: Arc<Clock>,
    base: Base,
    hist: Mutex<Hist>,
    /// Fault switches of every device on this stage's clock, by name; the journal's.
    faults: Mutex<Vec<(String, Arc<crate::Faults>)>>,
    journal_faults: Option<Arc<crate::Faults>>,
    /// Media errors planted this stage (member slots).
    bad: Mutex<Vec<usize>>,
    clients_done: AtomicUsize,
    stop: AtomicBool,
    reads: AtomicU64,
    refused: AtomicU64,
    actions: Mutex<Vec<String>>,
    /// New devices given during the stage: (index, image handle).
    new_devs: Mutex<Vec<(usize, MemDev)>>,
    next_index: AtomicUsize,
    error: Mutex<Option<String>>,
    /// Slots whose replace (recorded by an earlier stage cut or stopped during it) resumed
    /// at assembly: the walks task runs them.
    resumed: Mutex<Vec<usize>>,
}

impl Stage {
    fn log(&self, what: String) {
        if std::env::var_os("URAID_SIM_LOG").is_some() {
            eprintln!("sim {}: {what}", self.cfg.seed);
        }
        self.actions.lock().expect("actions").push(what);
    }

    fn fail(&self, e: String) {
        self.error.lock().expect("error").get_or_insert(e);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The fault switch of the device serving slot `slot` now.
    fn faults_of(&self, slot: usize) -> Option<Arc<crate::Faults>> {
        let a = self.vol.array();
        let name = a.member_name(slot)?;
        self.faults
            .lock()
            .expect("faults")
            .iter()
            .find(|f| f.0 == name)
            .map(|f| f.1.clone())
    }

    fn over(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.clock.is_off()
    }

    fn begin_write(&self, off: u64, data: WriteBuf) -> usize {
        let mut h = self.hist.lock().expect("hist");
        let issue = h.now();
        h.events.push(Ev::Write {
            off,
            data,
            issue,
            ack: None,
        });
        h.done.push(None);
        h.events.len() - 1
    }

    fn end_write(&self, i: usize, ok: bool) {
        let mut h = self.hist.lock().expect("hist");
        let t = h.now();
        h.done[i] = Some(t);
        // An acknowledgement after the power went never reached the client.
        if ok && !self.clock.is_off() {
            if let Ev::Write { ack, .. } = &mut h.events[i] {
                *ack = Some(t);
            }
        }
    }

    async fn flush(&self) {
        let i = {
            let mut h = self.hist.lock().expect("hist");
            let issue = h.now();
            h.events.push(Ev::Flush { issue, ack: None });
            h.done.push(None);
            h.events.len() - 1
        };
        let ok = self.vol.flush().await.is_ok();
        let mut h = self.hist.lock().expect("hist");
        let t = h.now();
        if ok && !self.clock.is_off() {
            if let Ev::Flush { ack, .. } = &mut h.events[i] {
                *ack = Some(t);
            }
        }
    }

    /// Checks a read's bytes against what the history allows while serving (module docs).
    fn check_live(&self, off: u64, got: &[u8], issue: u64, done: u64) -> Result<(), String> {
        let h = self.hist.lock().expect("hist");
        for (k, have) in got.chunks(SECTOR as usize).enumerate() {
            let lo = off + k as u64 * SECTOR;
            let s = (lo / SECTOR) as usize;
            let cands: Vec<(usize, &WriteBuf, u64, u64, Option<u64>)> = h
                .events
                .iter()
                .enumerate()
                .filter_map(|(i, e)| match e {
                    Ev::Write {
                        off,
                        data,
                        issue,
                        ack,
                    } if *off <= lo && lo < off + data.len() as u64 && *issue < done => {
                        Some((i, data, *off, *issue, *ack))
                    }
                    _ => None,
                })
                .collect();
            let finished_before_read =
                |c: &(usize, &WriteBuf, u64, u64, Option<u64>)| c.4.is_some_and(|a| a < issue);
            let superseded = |c: &(usize, &WriteBuf, u64, u64, Option<u64>)| {
                let end = h.done[c.0];
                cands.iter().any(|c2| {
                    end.is_some_and(|e| e < c2.3) && finished_before_read(c2) && c2.0 != c.0
                })
            };
            let bytes = |c: &(usize, &WriteBuf, u64, u64, Option<u64>)| -> Vec<u8> {
                let o = (lo - c.2) as usize;
                c.1[o..o + SECTOR as usize].to_vec()
            };
            let base_ok = !cands.iter().any(finished_before_read);
            if base_ok && self.base.unknown[s] {
                continue;
            }
            let base = &self.base.bytes[lo as usize..(lo + SECTOR) as usize];
            let ok = (base_ok && self.base.may_be(s, have))
                || cands.iter().any(|c| !superseded(c) && bytes(c) == have);
            if !ok {
                return Err(format!(
                    "read while serving: sector {s} (volume offset {lo}) holds {} no write \
                     allows ({} candidate writes, read issued at t={issue}, done t={done})",
                    describe(have, base),
                    cands.len()
                ));
            }
        }
        Ok(())
    }

    /// Whether a failed read is one the array may refuse.
    /// The resync and bad-block units (`Geometry::units`) of volume range `off, len`:
    /// stripes on parity levels, chunk rows on RAID1, volume chunks on RAID10.
    fn units_of(&self, off: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        let g = self.vol.array().geometry();
        let unit = if g.level.is_parity() {
            g.stripe_data_bytes()
        } else {
            g.chunk
        };
        off / unit..=(off + len - 1) / unit
    }

    fn refusal_allowed(&self, off: u64, len: u64, e: &ArrayError, was_unsynced: bool) -> bool {
        if self.cfg.beyond || self.clock.is_off() {
            return true;
        }
        let a = self.vol.array();
        let g = a.geometry();
        match e {
            ArrayError::Unreadable { .. } => {
                // Refused while not in sync: at issue (`was_unsynced`: a rebuild or resync
                // may have synced the unit by the time the refusal is checked) or now.
                let units = self.units_of(off, len);
                let unsynced = was_unsynced || units.clone().any(|u| a.stripe_unsynced(u));
                // A unit with a chunk on a bad-block list (a rebuild could not produce it).
                let bad = a.bad_blocks();
                let listed = units
                    .clone()
                    .any(|u| (0..g.members).any(|m| bad.contains(m, u)));
                // A media error plus lost members can exceed one stripe's redundancy.
                let lost = self
                    .bad
                    .lock()
                    .expect("bad")
                    .iter()
                    .chain(a.rebuild_state().iter().map(|r| &r.0))
                    .fold(a.failed(), |s, &m| s.with(m));
                let planted = lost.len() > g.fault_tolerance();
                unsynced || planted || listed
            }
            ArrayError::Failed { .. } => !a.is_serving() && self.cfg.beyond,
            _ => false,
        }
    }
}

/// `URAID_SIM_LOG=1` also shows the engine's own log (warnings and errors: read errors
/// corrected, journal failures, unreadable stripes), interleaved with the stage's actions.
fn engine_log() {
    if std::env::var_os("URAID_SIM_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .with_writer(std::io::stderr)
            .without_time()
            .try_init();
    }
}

/// Runs one configuration to its end; Err says what went wrong, with the seed.
pub fn run(cfg: &SimConfig) -> Result<SimReport, String> {
    engine_log();
    let g = cfg.geometry();
    let mut images = fresh_images_with(g, cfg.journal);
    let journal = cfg.journal.map(|_| {
        let size = uraid_core::journal::LOG_START
            + cfg.journal_records * uraid_core::journal::max_record(g.members, g.chunk);
        images.push(journal_image(size as usize));
        images.len() - 1
    });
    let n = images.len();
    let mut media = Media {
        images,
        journal,
        present: vec![true; n],
    };
    let size = g.volume_size();
    let mut base = Base {
        bytes: vec![0; size as usize],
        unknown: vec![false; (size / SECTOR) as usize],
        alts: Default::default(),
    };
    let mut report = SimReport::default();
    let mut rng = Rng::new(cfg.seed);
    for stage in 0..cfg.stages {
        match run_stage(cfg, stage, &mut media, base, &mut rng, &mut report) {
            Ok(Some(next)) => base = next,
            Ok(None) => return Ok(report),
            Err(e) => {
                return Err(format!(
                    "seed {} stage {stage} ({cfg:?}): {e}; actions: {:?}",
                    cfg.seed, report.actions
                ))
            }
        }
        report.stages += 1;
    }
    Ok(report)
}

/// One stage (module docs). Returns the model's base for the next stage, or None when the
/// run is over (beyond the tolerance, the array refused to assemble).
fn run_stage(
    cfg: &SimConfig,
    stage: usize,
    media: &mut Media,
    base: Base,
    rng: &mut Rng,
    report: &mut SimReport,
) -> Result<Option<Base>, String> {
    let rt = Runtime::new(cfg.reactors, 64, true).map_err(|e| format!("runtime: {e}"))?;
    // The power goes at a random member operation, or never (a clean stop, or a cut at the
    // end) in one stage of four.
    let crash_at = if rng.below(4) == 0 {
        0
    } else {
        1 + rng.below(2500)
    };
    let clock = Clock::new(crash_at, cfg.seed ^ ((stage as u64) << 40));
    let slow = rng.below(3) == 0;
    let devs: Mutex<Vec<(usize, MemDev)>> = Mutex::new(Vec::new());
    let vol = reassemble_on(
        &media.images,
        &media.present,
        media.journal,
        Some(rt.handle()),
        plugging_options(),
        |i, img| {
            let d = cached_dev(format!("mem{i}"), img, &clock);
            d.faults.yield_ops.store(true, Ordering::Relaxed);
            d.faults.jitter.store(true, Ordering::Relaxed);
            if slow && i % 3 == 1 {
                d.faults.slow_meta_writes.store(3, Ordering::Relaxed);
            }
            devs.lock().expect("devs").push((i, d.share()));
            d
        },
    );
    let vol = match vol {
        Ok(v) => v,
        Err(e) if clock.is_off() => {
            // The power went during assembly (inside a journal replay, say): what the media
            // hold now must read back exactly as before (replay is idempotent).
            report
                .actions
                .push(format!("power cut during assembly: {e}"));
            report.power_cuts += 1;
            let order: Vec<usize> = devs.lock().expect("devs").iter().map(|d| d.0).collect();
            for (k, img) in clock
                .images()
                .expect("the power went")
                .into_iter()
                .enumerate()
            {
                media.images[order[k]] = img;
            }
            rt.shutdown();
            return verify(cfg, media, &[], base, false).map(Some);
        }
        Err(e) if cfg.beyond => {
            report.actions.push(format!("assembly refused: {e}"));
            rt.shutdown();
            return Ok(None);
        }
        Err(e) => return Err(format!("does not assemble: {e}")),
    };
    // Devices the clock numbers in the order they were put on it; the images it returns
    // follow that order: map back to device indexes.
    let devs = devs.into_inner().expect("devs");
    let a = vol.array().clone();
    // Check what the media hold against the model (the previous stage's history is folded
    // into `base` by `verify`), then take the read-back as this stage's base.
    let faults: Vec<(String, Arc<crate::Faults>)> = devs
        .iter()
        .map(|d| (d.1.name().to_string(), d.1.faults.clone()))
        .collect();
    let journal_faults = media
        .journal
        .and_then(|j| devs.iter().find(|d| d.0 == j).map(|d| d.1.faults.clone()));
    let st = Arc::new(Stage {
        cfg: cfg.clone(),
        vol: vol.clone(),
        clock: clock.clone(),
        base,
        hist: Mutex::new(Hist {
            events: Vec::new(),
            done: Vec::new(),
            time: 0,
        }),
        faults: Mutex::new(faults),
        journal_faults,
        bad: Mutex::new(Vec::new()),
        clients_done: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        reads: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        actions: Mutex::new(Vec::new()),
        new_devs: Mutex::new(Vec::new()),
        next_index: AtomicUsize::new(media.images.len()),
        error: Mutex::new(None),
        resumed: Mutex::new(Vec::new()),
    });
    st.log(format!(
        "stage {stage}: cut at {crash_at}, failed {}, rebuilding {:?}, resync {}",
        a.failed(),
        a.rebuild_state(),
        a.needs_resync()
    ));
    // A replace the superblocks record (an earlier stage's power cut or stop caught one)
    // resumes with its replacement, as `uraid serve` does, before anything is written.
    let resumed = resume_replaces(&st, media, &devs, &rt);
    *st.resumed.lock().expect("resumed") = resumed;
    // Planted corruption: after a clean stop, on a level whose scrub can locate one bad
    // chunk (two or more parities), a sector of one chunk of an allocated stripe is flipped
    // on its member's medium; a scrub in repair mode must locate and repair it before any
    // client reads (a healthy read does not check parity, so it would serve the flip).
    let quiet = a.failed().is_empty() && a.rebuild_state().is_empty() && !a.needs_resync();
    // A power cut during that scrub, or after it before the members were flushed (a repair
    // is a member write like any other, in the volatile cache until a flush), leaves the
    // simulator's own damage on the media: undone after the stage where the medium still
    // holds it (`unplant`).
    let mut planted = None;
    if quiet && a.geometry().parity() >= 2 && rng.below(2) == 0 {
        if let Some((what, at)) = plant(&vol, &devs, rng) {
            planted = Some(at);
            let a2 = a.clone();
            let r = rt.handle().block_on(0, move || async move {
                a2.scrub_run(ScrubMode::Repair, &AtomicBool::new(false))
                    .await
            });
            st.log(format!("planted corruption at {what}; scrub repair: {r:?}"));
            let fixed = matches!(&r, Ok(rep) if rep.located >= 1 && rep.repaired >= 1);
            if !fixed && !clock.is_off() {
                report
                    .actions
                    .extend(st.actions.lock().expect("actions").drain(..));
                return Err(format!(
                    "stage {stage}: planted corruption at {what} not located and repaired: \
                     {r:?}"
                ));
            }
        }
    }
    let (tx, rx) = mpsc::channel::<()>();
    let tasks = cfg.conns + 3;
    for c in 0..cfg.conns {
        let (st, tx) = (st.clone(), tx.clone());
        let seed = cfg.seed ^ ((stage as u64) << 32) ^ ((c as u64 + 1) * 0x9E37);
        rt.handle().run_on(c % cfg.reactors, move || {
            uraid_engine::reactor::spawn_local(async move {
                client(&st, seed).await;
                st.clients_done.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(());
            })
        });
    }
    {
        let (st, tx) = (st.clone(), tx.clone());
        let seed = cfg.seed ^ ((stage as u64) << 32) ^ 0xC4A0;
        rt.handle().run_on(0, move || {
            uraid_engine::reactor::spawn_local(async move {
                chaos(&st, seed).await;
                let _ = tx.send(());
            })
        });
    }
    {
        let (st, tx) = (st.clone(), tx.clone());
        let seed = cfg.seed ^ ((stage as u64) << 32) ^ 0xB17;
        rt.handle().run_on(cfg.reactors - 1, move || {
            uraid_engine::reactor::spawn_local(async move {
                walks(&st, seed).await;
                let _ = tx.send(());
            })
        });
    }
    {
        let (st, tx) = (st.clone(), tx.clone());
        let seed = cfg.seed ^ ((stage as u64) << 32) ^ 0x5104;
        rt.handle().run_on(0, move || {
            uraid_engine::reactor::spawn_local(async move {
                fail_slow(&st, seed).await;
                let _ = tx.send(());
            })
        });
    }
    drop(tx);
    for _ in 0..tasks {
        if rx.recv_timeout(Duration::from_secs(120)).is_err() {
            return Err(format!(
                "stage {stage}: tasks hung (a lost wake-up or a walk that never ends); actions \
                 {:?}",
                st.actions.lock().expect("actions")
            ));
        }
    }
    if let Some(e) = st.error.lock().expect("error").take() {
        report
            .actions
            .extend(st.actions.lock().expect("actions").drain(..));
        return Err(format!("stage {stage}: {e}"));
    }
    // The stage ends: cleanly in one of three, else the power goes now (if it did not yet).
    let mut clean = false;
    if !clock.is_off() && rng.below(3) == 0 {
        // A clean stop is a FLUSH of everything acknowledged before it.
        let i = {
            let mut h = st.hist.lock().expect("hist");
            let issue = h.now();
            h.events.push(Ev::Flush { issue, ack: None });
            h.done.push(None);
            h.events.len() - 1
        };
        let v = vol.clone();
        let r = rt
            .handle()
            .block_on(0, move || async move { v.close().await });
        // Clean means every row in sync: a stop with resync still owed (degraded) is not.
        clean = r.is_ok() && !clock.is_off() && !a.needs_resync();
        if clean {
            let mut h = st.hist.lock().expect("hist");
            let t = h.now();
            if let Ev::Flush { ack, .. } = &mut h.events[i] {
                *ack = Some(t);
            }
        }
        st.log(format!("clean stop: {r:?}"));
    }
    clock.power_cut();
    report.power_cuts += usize::from(!clean);
    let out = clock.images().expect("the power went");
    // Clock order → device index.
    let mut order: Vec<usize> = devs.iter().map(|d| d.0).collect();
    order.extend(st.new_devs.lock().expect("new devs").iter().map(|d| d.0));
    for (k, img) in out.into_iter().enumerate() {
        let i = order[k];
        if i >= media.images.len() {
            media.images.resize(i + 1, Vec::new());
            media.present.resize(i + 1, true);
        }
        media.images[i] = img;
    }
    if let Some(p) = planted {
        unplant(media, p);
    }
    let hist = std::mem::replace(
        &mut *st.hist.lock().expect("hist"),
        Hist {
            events: Vec::new(),
            done: Vec::new(),
            time: 0,
        },
    );
    report.acked_writes += hist
        .events
        .iter()
        .filter(|e| matches!(e, Ev::Write { ack: Some(_), .. }))
        .count();
    report.reads_checked += st.reads.load(Ordering::Relaxed) as usize;
    report.reads_refused += st.refused.load(Ordering::Relaxed) as usize;
    let ops = st.vol.array().stats.snapshot();
    report.slow_reads_around += ops.slow_reads_around;
    report.plugged += ops.plugged_writes;
    report.plug_filled += ops.plug_filled;
    if let Some(ra) = st.vol.read_ahead_stats() {
        report.read_ahead_hits += ra.hits + ra.late_hits;
        report.read_ahead_dropped += ra.dropped_bytes;
    }
    report.discarded += st
        .faults
        .lock()
        .expect("faults")
        .iter()
        .map(|(_, f)| f.discarded.load(Ordering::Relaxed))
        .sum::<u64>();
    report
        .actions
        .extend(st.actions.lock().expect("actions").drain(..));
    let old_base = st.base.clone();
    drop(st);
    drop(a);
    drop(vol);
    rt.shutdown();
    verify(cfg, media, &hist.events, old_base, clean).map(Some)
}

/// Reassembles from the media (no power clock), reads every stripe and checks each sector
/// against `events` on top of `base`; returns the next base. Beyond the tolerance, a refusal
/// to assemble or a read error is clean; wrong bytes never are.
fn verify(
    cfg: &SimConfig,
    media: &Media,
    events: &[Ev],
    base: Base,
    clean: bool,
) -> Result<Base, String> {
    let vol = match reassemble_on(
        &media.images,
        &media.present,
        media.journal,
        None,
        plugging_options(),
        |i, img| MemDev::from_image(format!("mem{i}"), img),
    ) {
        Ok(v) => v,
        Err(_) if cfg.beyond => {
            return Ok(Base {
                unknown: vec![true; base.unknown.len()],
                ..base
            })
        }
        Err(e) => return Err(format!("after the stage the array does not assemble: {e}")),
    };
    let a = vol.array().clone();
    let g = *a.geometry();
    let next = read_back(cfg, &vol, events, &base, "all members")?;
    // Parity too: on a parity level with every slot served, each stripe read again with one
    // member (seeded) left out must give the same bytes (a chunk rebuilt from a stripe whose
    // parity is wrong would differ), unless the array refuses it (not resynced).
    let healthy = a.failed().is_empty() && a.rebuild_state().is_empty();
    if g.level.is_parity() && healthy && !cfg.beyond {
        let out = (Rng::new(cfg.seed ^ events.len() as u64).below(g.members as u64)) as usize;
        let name = a.member_name(out).map(str::to_string);
        drop(a);
        drop(vol);
        let mut present = media.present.clone();
        if let Some(i) = name.and_then(|n| n[3..].parse::<usize>().ok()) {
            present[i] = false;
            let vol = match reassemble_on(
                &media.images,
                &present,
                media.journal,
                None,
                plugging_options(),
                |i, img| MemDev::from_image(format!("mem{i}"), img),
            ) {
                Ok(v) => v,
                // The power cut a metadata round short and only the member left out holds
                // its record (a rebuild's end, say): the rest describe the array as it was
                // before, which may not start without it. Nothing is read then.
                Err(e) if e.contains("cannot start") && sole_newest(media, i) => {
                    let mut next = next;
                    if clean {
                        next.alts.clear();
                    }
                    return Ok(next);
                }
                Err(e) => return Err(format!("does not assemble with member {out} left out: {e}")),
            };
            read_back(cfg, &vol, &[], &next, &format!("member {out} left out"))?;
        }
    }
    let mut next = next;
    if clean {
        next.alts.clear();
    }
    Ok(next)
}

/// Whether image `i` alone holds the newest metadata round: every other member its
/// superblock names holds the round before (one event fewer), as a power cut in the middle of
/// a round leaves them.
fn sole_newest(media: &Media, i: usize) -> bool {
    use uraid_core::format::{pick_superblock, Superblock, SB_SIZE};
    let sb = |img: &Vec<u8>| -> Option<Superblock> {
        (img.len() >= 2 * SB_SIZE)
            .then(|| pick_superblock(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE]).ok())
            .flatten()
    };
    let Some(mine) = media.images.get(i).and_then(sb) else {
        return false;
    };
    let others: Vec<Superblock> = media
        .images
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i && media.present[j])
        .filter_map(|(_, img)| sb(img))
        .filter(|o| mine.slot_uuids.contains(&o.device_uuid))
        .collect();
    !others.is_empty() && others.iter().all(|o| o.events + 1 == mine.events)
}

/// Reads every stripe of `vol` and checks it against `events` on top of `base` (the next
/// base: what was read, refused stripes unknown).
fn read_back(
    cfg: &SimConfig,
    vol: &Volume<MemDev>,
    events: &[Ev],
    base: &Base,
    how: &str,
) -> Result<Base, String> {
    let a = vol.array().clone();
    let g = *a.geometry();
    let sdb = g.stripe_data_bytes();
    let mut next = base.clone();
    for stripe in 0..g.units() {
        let off = stripe * sdb;
        match futures::executor::block_on(vol.read(off, sdb)) {
            Ok(seg) => {
                let got = seg.to_vec();
                for (k, have) in got.chunks(SECTOR as usize).enumerate() {
                    let lo = off + k as u64 * SECTOR;
                    let s = (lo / SECTOR) as usize;
                    let before = &base.bytes[lo as usize..(lo + SECTOR) as usize];
                    let mut was = vec![before.to_vec()];
                    was.extend(base.alts.get(&s).cloned().unwrap_or_default());
                    let (allowed, cands, floor) = allowed_values(events, lo, lo + SECTOR, was);
                    let unknown_ok = base.unknown[s] && floor.is_none();
                    if !unknown_ok && !allowed.iter().any(|v| v == have) {
                        return Err(format!(
                            "after reassembly ({how}) sector {s} (volume offset {lo}, stripe \
                             {stripe}) holds {} the history does not allow ({} candidate \
                             writes, durable floor {:?}); members {:?}",
                            describe(have, before),
                            cands.len(),
                            floor.map(|f| (f.2, f.3)),
                            (0..g.members).map(|m| a.member_name(m)).collect::<Vec<_>>()
                        ));
                    }
                    next.bytes[lo as usize..(lo + SECTOR) as usize].copy_from_slice(have);
                    next.unknown[s] = false;
                    let mut others: Vec<Vec<u8>> = Vec::new();
                    for v in allowed {
                        if v != have && !others.contains(&v) {
                            others.push(v);
                        }
                    }
                    if others.is_empty() {
                        next.alts.remove(&s);
                    } else {
                        next.alts.insert(s, others);
                    }
                }
            }
            Err(ArrayError::Unreadable { .. })
                if a.stripe_unsynced(stripe)
                    || cfg.beyond
                    || (0..g.members).any(|m| a.bad_blocks().contains(m, stripe)) =>
            {
                for k in 0..sdb / SECTOR {
                    next.unknown[((off / SECTOR) + k) as usize] = true;
                }
            }
            Err(e) if cfg.beyond => {
                let _ = e;
                for k in 0..sdb / SECTOR {
                    next.unknown[((off / SECTOR) + k) as usize] = true;
                }
            }
            Err(e) => {
                return Err(format!(
                    "after reassembly ({how}) stripe {stripe} fails: {e}"
                ))
            }
        }
    }
    Ok(next)
}

/// Flips one sector of one chunk of an allocated stripe on its member's medium (`devs`: the
/// stage's devices); returns where.
/// Where a sector was flipped: device index, offset, the bytes before.
type Planted = (usize, usize, Vec<u8>);

fn plant(
    vol: &Volume<MemDev>,
    devs: &[(usize, MemDev)],
    rng: &mut Rng,
) -> Option<(String, Planted)> {
    let g = *vol.geometry();
    let sdb = g.stripe_data_bytes();
    let runs = vol.allocation(0, vol.size()).ok()?;
    let stripes: Vec<u64> = (0..g.units())
        .filter(|&s| {
            runs.iter()
                .any(|r| r.allocated && r.off <= s * sdb && (s + 1) * sdb <= r.off + r.len)
        })
        .collect();
    if stripes.is_empty() {
        return None;
    }
    let stripe = stripes[rng.below(stripes.len() as u64) as usize];
    let slot = rng.below(g.members as u64) as usize;
    let name = vol.array().member_name(slot)?;
    let d = devs.iter().find(|d| d.1.name() == name)?;
    let at =
        (DATA_OFFSET + g.member_offset(stripe, 0) + rng.below(g.chunk / SECTOR) * SECTOR) as usize;
    let mut state = d.1.state.lock().expect("device state");
    let before = state.data[at..at + SECTOR as usize].to_vec();
    for b in &mut state.data[at..at + SECTOR as usize] {
        *b ^= 0x5A;
    }
    if let Some(medium) = state.durable.as_mut() {
        for b in &mut medium[at..at + SECTOR as usize] {
            *b ^= 0x5A;
        }
    }
    Some((
        format!("stripe {stripe}, member {slot}, device offset {at}"),
        (d.0, at, before),
    ))
}

/// Undoes a planted flip the power cut left on a medium (a repair that landed stays).
fn unplant(media: &mut Media, p: Planted) {
    let (dev, at, before) = p;
    let sector = &mut media.images[dev][at..at + SECTOR as usize];
    if sector
        .iter()
        .zip(&before)
        .all(|(&now, &was)| now == was ^ 0x5A)
    {
        sector.copy_from_slice(&before);
    }
}

/// What wrong bytes look like (for failure messages).
fn describe(have: &[u8], base: &[u8]) -> String {
    if have.iter().all(|&b| b == 0) {
        "zeros".into()
    } else if have.iter().all(|&b| b == 0xEE) {
        "a new device's fill (0xEE)".into()
    } else if base.iter().all(|&b| b == 0) {
        format!("bytes {:02x?}.. where zeros were", &have[..8])
    } else {
        format!(
            "bytes {:02x?}.. where {:02x?}.. were",
            &have[..8],
            &base[..8]
        )
    }
}

/// One client connection: a seeded mix of operations, every read checked.
async fn client(st: &Stage, seed: u64) {
    let mut r = Rng::new(seed);
    let size = st.vol.size();
    let sectors = size / SECTOR;
    let sdb = st.vol.geometry().stripe_data_bytes();
    for i in 0..st.cfg.ops {
        if st.over() {
            return;
        }
        let kind = r.below(100);
        let mut off = r.below(sectors) * SECTOR;
        let mut len = ((1 + r.below(16)) * SECTOR).min(size - off);
        if kind.is_multiple_of(10) && size >= 3 * sdb {
            // Whole stripes (a parity level's gather-write path).
            let n = 1 + r.below(2);
            off = r.below(size / sdb - n + 1) * sdb;
            len = n * sdb;
        }
        match kind {
            30..=34 if sdb >= 2 * SECTOR => {
                // A sequential stream of partial-stripe writes issued one after another
                // without waiting for each other (an NBD client's pipelined writes): the
                // array's plugs wait for the rest of their stripes (stripe/plug.rs).
                let piece = (sdb / (2 + r.below(3)) / SECTOR).max(1) * SECTOR;
                let mut start = r.below(sectors) * SECTOR;
                if r.below(2) == 0 {
                    // Aligned: whole chunks when a piece is one (the batch then tiles its
                    // stripe: `stripe_write_tiled`).
                    start -= start % piece;
                }
                let base = (seed.wrapping_mul(1000) + i as u64) << 8;
                let writes = (0..4 + r.below(13))
                    .map(|j| (j, start + j * piece))
                    .take_while(|&(_, o)| o + piece <= size)
                    .map(|(j, o)| async move {
                        for _ in 0..j {
                            uraid_engine::reactor::yield_now().await;
                        }
                        let data = payload(base + 1 + j, piece as usize);
                        let ev = st.begin_write(o, data.clone());
                        let ok = st.vol.write(o, data).await.is_ok();
                        st.end_write(ev, ok);
                    });
                futures::future::join_all(writes).await;
            }
            0..=39 => {
                let data = payload(seed.wrapping_mul(1000) + i as u64, len as usize);
                let ev = st.begin_write(off, data.clone());
                let ok = if kind >= 35 {
                    // FUA: never plugged, ends the plugs of others (stripe/plug.rs); then
                    // the flush the server does for it.
                    st.vol.write_now(off, data).await.is_ok()
                } else {
                    st.vol.write(off, data).await.is_ok()
                };
                st.end_write(ev, ok);
                if kind >= 35 {
                    st.flush().await;
                }
            }
            40..=44 => {
                let ev = st.begin_write(off, WriteBuf::from(vec![0u8; len as usize]));
                let ok = st.vol.trim(off, len).await.is_ok();
                st.end_write(ev, ok);
            }
            45..=49 => {
                let ev = st.begin_write(off, WriteBuf::from(vec![0u8; len as usize]));
                let ok = st.vol.write_zeros(off, len).await.is_ok();
                st.end_write(ev, ok);
            }
            50..=79 => {
                if let Err(e) = read_checked(st, off, len).await {
                    st.fail(e);
                    return;
                }
            }
            80..=84 => {
                // A sequential stream of reads issued without waiting for each other (an
                // NBD client's pipelined reads, which arrive reordered): read-ahead follows
                // it and serves it from units read ahead (readahead.rs). Every read checked.
                let piece = (1 + r.below(2 * (sdb / SECTOR).max(1))) * SECTOR;
                let start = r.below(sectors) * SECTOR;
                let reads = (0..6 + r.below(20))
                    .map(|j| (j, start + j * piece))
                    .take_while(|&(_, o)| o + piece <= size)
                    .map(|(j, o)| async move {
                        for _ in 0..(j % 4) {
                            uraid_engine::reactor::yield_now().await;
                        }
                        read_checked(st, o, piece).await
                    });
                for res in futures::future::join_all(reads).await {
                    if let Err(e) = res {
                        st.fail(e);
                        return;
                    }
                }
            }
            _ => st.flush().await,
        }
        for _ in 0..r.below(3) {
            uraid_engine::reactor::yield_now().await;
        }
    }
}

/// Reads `[off, off + len)` and checks it against the history of writes (or that a refusal
/// was allowed); counts it.
async fn read_checked(st: &Stage, off: u64, len: u64) -> Result<(), String> {
    let issue = st.hist.lock().expect("hist").now();
    let was_unsynced = {
        let a = st.vol.array();
        st.units_of(off, len).any(|u| a.stripe_unsynced(u))
    };
    let got = st.vol.read(off, len).await;
    let done = st.hist.lock().expect("hist").now();
    match got {
        Ok(seg) => {
            st.reads.fetch_add(1, Ordering::Relaxed);
            st.check_live(off, &seg.to_vec(), issue, done)
        }
        Err(e) if st.refusal_allowed(off, len, &e, was_unsynced) => {
            st.refused.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(format!("read {off}+{len} failed within the tolerance: {e}")),
    }
}

/// Yields `n` times (lets the clients run between fault actions).
async fn pause(n: u64) {
    for _ in 0..n {
        uraid_engine::reactor::yield_now().await;
    }
}

/// Resumes every replace the superblocks record whose replacement is among the media (a
/// device with a replacement superblock of that uuid), on the stage's clock, and drops the
/// others (`Supervisor::resume_replaces`). Returns the slots resumed.
fn resume_replaces(
    st: &Stage,
    media: &Media,
    devs: &[(usize, MemDev)],
    rt: &Runtime,
) -> Vec<usize> {
    use uraid_core::format::{pick_superblock, SB_SIZE};
    let a = st.vol.array().clone();
    let mut slots = Vec::new();
    for (slot, uuid, copied) in a.resumable_replaces() {
        let found = (0..media.images.len()).find(|&k| {
            let img = &media.images[k];
            media.present.get(k) == Some(&true)
                && Some(k) != media.journal
                && !devs.iter().any(|d| d.0 == k)
                && img.len() >= 2 * SB_SIZE
                && pick_superblock(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE])
                    .is_ok_and(|sb| sb.replacement && sb.device_uuid == uuid)
        });
        let Some(k) = found else {
            st.log(format!(
                "replace of {slot} ({copied} copied): replacement not found"
            ));
            continue;
        };
        let d = cached_dev(format!("mem{k}"), media.images[k].clone(), &st.clock);
        d.faults.yield_ops.store(true, Ordering::Relaxed);
        d.faults.jitter.store(true, Ordering::Relaxed);
        st.new_devs.lock().expect("new devs").push((k, d.share()));
        st.faults
            .lock()
            .expect("faults")
            .push((d.name().to_string(), d.faults.clone()));
        let v = st.vol.clone();
        let r = rt.handle().block_on(
            0,
            move || async move { v.resume_replace(slot, d, uuid).await },
        );
        st.log(format!(
            "replace of {slot} by mem{k} resumes ({copied} copied): {r:?}"
        ));
        if r.is_ok() {
            slots.push(slot);
        }
    }
    let a2 = a.clone();
    rt.handle()
        .block_on(0, move || async move { a2.drop_unresumed_replaces().await });
    slots
}

/// A new member device on the stage's power clock.
fn new_device(st: &Stage) -> (usize, MemDev) {
    let i = st.next_index.fetch_add(1, Ordering::SeqCst);
    let g = st.vol.geometry();
    let d = cached_dev(
        format!("mem{i}"),
        vec![0xEE; (DATA_OFFSET + g.member_data) as usize],
        &st.clock,
    );
    d.faults.yield_ops.store(true, Ordering::Relaxed);
    d.faults.jitter.store(true, Ordering::Relaxed);
    st.new_devs.lock().expect("new devs").push((i, d.share()));
    st.faults
        .lock()
        .expect("faults")
        .push((d.name().to_string(), d.faults.clone()));
    (i, d)
}

fn uuid_of(i: usize, seed: u64) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(
        &(seed ^ 0x5EED)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .to_le_bytes(),
    );
    u[8..].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    u[6] = 0x40 | (u[6] & 0x0f);
    u
}

/// A fail-slow member, in one stage of three: a member's reads and writes lag 0.5–3 ms (on
/// the reactor's timer) while this task reads and writes the volume (32 reads, every one
/// checked, and 4 writes at a time, beside the clients) and runs the fail-slow judgement
/// between rounds, so its chunks are read around it (decoded, beside the clients and the
/// stage's faults while they run, and after them until it is flagged) and probes go to it; in half those stages it recovers midway (probation, then
/// read again). It goes on after the clients until the member is flagged, and read again
/// if it recovers, at most 300 rounds.
async fn fail_slow(st: &Stage, seed: u64) {
    let mut r = Rng::new(seed);
    if r.below(3) != 0 {
        return;
    }
    let a = st.vol.array().clone();
    let m = r.below(st.cfg.members as u64) as usize;
    let lag = 500 + r.below(2500);
    let recover = (r.below(2) == 0).then(|| 20 + r.below(40));
    pause(r.below(20)).await;
    let Some(f) = st.faults_of(m) else {
        return;
    };
    f.lag_us.store(lag, Ordering::Relaxed);
    st.log(format!("member {m} lags {lag} us"));
    let (size, sectors) = (st.vol.size(), st.vol.size() / SECTOR);
    let (mut ticks, mut flagged, mut cleared, mut after_clients) = (0u64, false, false, 0);
    // (Not `st.over()`: the walks task sets `stop` once the clients are done.)
    let failed = || st.error.lock().expect("error").is_some();
    while !st.clock.is_off() && !failed() {
        if st.clients_done.load(Ordering::SeqCst) == st.cfg.conns {
            // On until flagged, and read again if it recovers.
            after_clients += 1;
            if (flagged && recover.is_none()) || after_clients > 300 {
                break;
            }
        }
        let mut pick = || {
            let off = r.below(sectors) * SECTOR;
            (off, ((1 + r.below(16)) * SECTOR).min(size - off))
        };
        let reads: Vec<(u64, u64)> = (0..32).map(|_| pick()).collect();
        let writes: Vec<(u64, u64)> = (0..4).map(|_| pick()).collect();
        let reads = futures::future::join_all(
            reads
                .into_iter()
                .map(|(off, len)| read_checked(st, off, len)),
        );
        let writes = futures::future::join_all(writes.into_iter().enumerate().map(
            |(j, (off, len))| async move {
                let data = payload(seed ^ (ticks << 8) ^ j as u64, len as usize);
                let ev = st.begin_write(off, data.clone());
                let ok = st.vol.write(off, data).await.is_ok();
                st.end_write(ev, ok);
            },
        ));
        let (got, _) = futures::future::join(reads, writes).await;
        if let Some(e) = got.into_iter().find_map(Result::err) {
            st.fail(format!("member {m} slow: {e}"));
            break;
        }
        uraid_engine::reactor::sleep(Duration::from_millis(1)).await;
        a.slow_tick();
        ticks += 1;
        let now = a.slow_members().contains(m);
        if !flagged && now {
            flagged = true;
            st.log(format!(
                "member {m} flagged slow after {ticks} judgements ({})",
                if after_clients == 0 {
                    "clients running"
                } else {
                    "after the clients"
                }
            ));
        }
        if recover.is_some_and(|t| ticks >= t) && flagged && !cleared {
            f.lag_us.store(0, Ordering::Relaxed);
            cleared = true;
            st.log(format!("member {m} fast again"));
        }
        if cleared && !now {
            // Unflagged by its probation, not dropped with its device (failed, replaced).
            let same = st.faults_of(m).is_some_and(|g| Arc::ptr_eq(&g, &f));
            if same && !a.failed().contains(m) {
                st.log(format!("member {m} read again after {ticks} judgements"));
            }
            break;
        }
    }
    f.lag_us.store(0, Ordering::Relaxed);
    st.log(format!(
        "member {m}: fail-slow task ends after {ticks} judgements ({after_clients} after the \
         clients), flagged {}, over {}",
        a.slow_members().contains(m),
        st.over()
    ));
}

/// Fault and lifecycle actions beside the clients, a few per stage, each at a random moment.
async fn chaos(st: &Stage, seed: u64) {
    let mut r = Rng::new(seed);
    let mut re = Rng::new(seed ^ 0x2EADD);
    let a = st.vol.array().clone();
    let g = *a.geometry();
    let tol = g.fault_tolerance();
    let actions = 1 + r.below(4);
    for _ in 0..actions {
        pause(r.below(40)).await;
        if st.over() || st.clients_done.load(Ordering::SeqCst) == st.cfg.conns {
            return;
        }
        let degraded = a
            .failed()
            .union(a.rebuild_state().iter().map(|x| x.0).collect());
        let doomed = st.bad.lock().expect("bad").clone();
        let live: Vec<usize> = (0..g.members)
            .filter(|&m| !degraded.contains(m) && !doomed.contains(&m))
            .collect();
        let limit = if st.cfg.beyond { tol + 1 } else { tol };
        let lost = st
            .bad
            .lock()
            .expect("bad")
            .iter()
            .fold(degraded, |s, &m| s.with(m))
            .len();
        let pick = |r: &mut Rng| {
            live.get(r.below(live.len().max(1) as u64) as usize)
                .copied()
        };
        // A device may take a failed slot unless that would rebuild unsynced stripes with
        // no journal (SimConfig::rebuild_unsynced).
        let journal_on = a.journal_status().is_some_and(|j| j.state == "active");
        let may_install = st.cfg.rebuild_unsynced || journal_on || !a.needs_resync();
        match r.below(9) {
            0 if lost < limit => {
                if let Some(v) = pick(&mut r) {
                    // Its device, for a re-add (the same medium: what it holds is kept).
                    let former = a.member_dev(v).map(|d| d.share());
                    let res = a.fail_by_operator(v, true).await;
                    st.log(format!("operator fails {v}: {res:?}"));
                    // (`re` draws the re-add choices: the seeds' schedules from before it
                    // existed stay as they were.)
                    let spare = r.below(2) == 0;
                    if res.is_ok() && !spare && may_install && re.below(2) == 0 {
                        if let Some(d) = former {
                            // It comes back into its slot (md's re-add): rebuilt only where
                            // the write-intent bitmap says it missed writes.
                            pause(re.below(30)).await;
                            let res = st.vol.add_member_with(d, uuid_of(99, st.cfg.seed)).await;
                            st.log(format!("member {v} re-added: {res:?}"));
                        }
                    } else if res.is_ok() && spare && may_install {
                        // A hot spare takes the slot soon after (what a server with spares
                        // does), while records made before the failure may be in the log.
                        pause(r.below(30)).await;
                        let (i, d) = new_device(st);
                        let res = st.vol.add_member(d, uuid_of(i, st.cfg.seed)).await;
                        st.log(format!("spare mem{i} takes over: {res:?}"));
                    }
                }
            }
            1 if lost < limit => {
                if let Some(v) = pick(&mut r) {
                    if let Some(f) = &st.faults_of(v) {
                        let after = r.below(8) as i64;
                        if after == 0 {
                            f.kill();
                        } else {
                            f.kill_after(after);
                        }
                        // Counted as lost from now on (it dies on its own schedule).
                        st.bad.lock().expect("bad").push(v);
                        st.log(format!("device of member {v} dies after {after} ops"));
                    }
                }
            }
            2 if lost < limit && tol > 0 => {
                if let Some(v) = pick(&mut r) {
                    if let Some(f) = &st.faults_of(v) {
                        let at = DATA_OFFSET + r.below(g.member_data / SECTOR) * SECTOR;
                        f.bad_range(at, at + SECTOR * (1 + r.below(8)));
                        st.bad.lock().expect("bad").push(v);
                        st.log(format!("media error on member {v} at {at}"));
                    }
                }
            }
            3 => {
                if let Some(f) = &st.journal_faults {
                    f.kill_after(1 + r.below(6) as i64);
                    st.log("journal device dies".into());
                }
            }
            4 | 5 if !a.failed().is_empty() && may_install => {
                // A hot spare taking over (the same call as `uraid add` on a server).
                let (i, d) = new_device(st);
                let res = st.vol.add_member(d, uuid_of(i, st.cfg.seed)).await;
                st.log(format!("mem{i} added into a failed slot: {res:?}"));
            }
            6 if degraded.is_empty() && tol > 0 && may_install => {
                if let Some(v) = pick(&mut r) {
                    let (i, d) = new_device(st);
                    let res = st.vol.replace_member(v, d, uuid_of(i, st.cfg.seed)).await;
                    st.log(format!("replace {v} by mem{i}: {res:?}"));
                    if res.is_ok() {
                        // Sometimes the member being replaced dies meanwhile: the
                        // replacement takes its slot and is rebuilt.
                        // (Only within the limit: the replaced member counts as lost.)
                        let room = st
                            .bad
                            .lock()
                            .expect("bad")
                            .iter()
                            .fold(a.failed(), |s, &m| s.with(m))
                            .with(v)
                            .len()
                            <= limit;
                        let dies = (room && r.below(3) == 0).then(|| r.below(200));
                        let old = st.faults_of(v);
                        let kill = async {
                            if let (Some(after), Some(f)) = (dies, &old) {
                                pause(after).await;
                                f.kill();
                                st.bad.lock().expect("bad").push(v);
                                st.log(format!("member {v} dies during its replace"));
                            }
                        };
                        let (o, ()) = futures::join!(st.vol.replace_run(&st.stop), kill);
                        st.log(format!("replace run: {o:?}"));
                    }
                }
            }
            7 if !a.failed().is_empty() => {
                let v = a.failed().iter().next().expect("non-empty");
                let res = a.remove_member(v, false).await;
                st.log(format!("remove {v}: {res:?}"));
            }
            _ => {
                if tol > 0 && !st.cfg.beyond {
                    let mode = if r.below(2) == 0 {
                        ScrubMode::Check
                    } else {
                        ScrubMode::Repair
                    };
                    let res = a.scrub_run(mode, &st.stop).await;
                    st.log(format!("scrub {mode:?}: {res:?}"));
                    if let Ok(rep) = &res {
                        // Nothing was planted while serving: a mismatch is a real one,
                        // unless the array is degraded or a stripe awaits resync.
                        if rep.mismatches > 0
                            && a.failed().is_empty()
                            && st.bad.lock().expect("bad").is_empty()
                            && !a.needs_resync()
                            && !st.clock.is_off()
                        {
                            st.fail(format!(
                                "scrub found {} mismatches on a consistent array",
                                rep.mismatches
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// The background walks a server runs: resync after an unclean stop, the rebuild of
/// members in rebuilding slots (resumed from their checkpoints), the bitmap daemon.
async fn walks(st: &Stage, seed: u64) {
    let mut r = Rng::new(seed);
    let a = st.vol.array().clone();
    // Replaces resumed at assembly, each to its end (or the stage's).
    let resumed = std::mem::take(&mut *st.resumed.lock().expect("resumed"));
    for slot in resumed {
        let res = st
            .vol
            .replace_run_slot(slot, &st.stop, Duration::ZERO)
            .await;
        st.log(format!("resumed replace of {slot}: {res:?}"));
    }
    loop {
        if st.over() || st.clients_done.load(Ordering::SeqCst) == st.cfg.conns {
            st.stop.store(true, Ordering::SeqCst);
            return;
        }
        if a.needs_resync() && a.is_serving() {
            let res = a.resync(&st.stop).await;
            st.log(format!("resync: {res:?}"));
        }
        let journal_on = a.journal_status().is_some_and(|j| j.state == "active");
        let may_rebuild = st.cfg.rebuild_unsynced || journal_on || !a.needs_resync();
        if !a.rebuild_state().is_empty() && a.is_serving() && may_rebuild {
            let res = a.rebuild(&st.stop).await;
            st.log(format!("rebuild: {res:?}"));
        }
        if st.cfg.bitmap_daemon {
            a.bitmap_tick().await;
        }
        pause(1 + r.below(20)).await;
    }
}
