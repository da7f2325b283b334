//! The crash-model test device and crash trials.
//!
//! Every member has a volatile write cache: a completed write is visible to reads at once
//! but reaches the medium only on a flush. A power cut (`Clock`, shared by the members of
//! one trial, cuts the power at its `crash_at`-th member operation) keeps, per member, the
//! medium plus any subset of the cached writes (seeded), each kept whole, dropped, or torn
//! at 512-byte sector boundaries (a random subset of its sectors lands). After the cut every
//! member operation fails with ENODEV.
//!
//! A trial (`run_trial`) runs a seeded concurrent workload (writes, FUA writes, trims,
//! flushes, optionally member failures) on a volume over such members, cuts the power at a
//! random moment (superblock rounds, failure handling and map persistence included),
//! *reassembles the array from the member images* with the product's assembly rules, and
//! checks every sector against the history: a write acknowledged before an acknowledged
//! FLUSH was issued must read back (unless a later write may have replaced it); any other
//! sector reads as one of the writes that may be current, or zeros if none is durable;
//! nothing else, and the array must assemble.

use crate::{fresh_images, payload, sim_options, DevState, MemDev};
use futures::executor::block_on;
use futures::future::join_all;
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use uraid_core::format::{pick_superblock_slot, JournalMode, SB_SIZE};
use uraid_core::geometry::SECTOR;
use uraid_core::{Geometry, Level};
use uraid_engine::assemble::{decide, Found};
use uraid_engine::{Array, Volume, WriteBuf};

/// The simulators' seeded generator (`crate::rng`; also reachable here, where it lived first).
pub use crate::rng::Rng;

/// The power switch of one trial.
pub struct Clock {
    ops: AtomicU64,
    crash_at: u64,
    off: AtomicBool,
    devices: Mutex<Vec<Arc<Mutex<DevState>>>>,
    images: Mutex<Option<Vec<Vec<u8>>>>,
    rng: Mutex<Rng>,
}

impl Clock {
    /// `crash_at`: the member operation (1-based) at which the power goes; 0 = never (until
    /// `power_cut` is called).
    pub fn new(crash_at: u64, seed: u64) -> Arc<Clock> {
        Arc::new(Clock {
            ops: AtomicU64::new(0),
            crash_at,
            off: AtomicBool::new(false),
            devices: Mutex::new(Vec::new()),
            images: Mutex::new(None),
            rng: Mutex::new(Rng::new(seed ^ 0xC0FFEE)),
        })
    }

    /// Member operations so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    pub(crate) fn tick(&self) -> io::Result<()> {
        let gone = || io::Error::from_raw_os_error(19); // ENODEV
        if self.is_off() {
            return Err(gone());
        }
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.crash_at {
            self.power_cut();
            return Err(gone());
        }
        Ok(())
    }

    /// Cuts the power now, keeping exactly the cached writes `keep(member, offset)` says
    /// (members numbered in the order they were put on this clock): targeted tests of
    /// ordering rules.
    pub fn power_cut_with(&self, keep: impl Fn(usize, u64) -> bool) {
        // Held while the images are computed: a second cut (another thread's member I/O
        // reaching the crash point) waits for them instead of finding none.
        let mut slot = self.images.lock().unwrap();
        if self.off.swap(true, Ordering::SeqCst) {
            return;
        }
        let images = self
            .devices
            .lock()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(m, st)| {
                let st = st.lock().unwrap();
                let mut img = st.durable.clone().unwrap_or_else(|| st.data.clone());
                for (off, bytes) in &st.cache {
                    if keep(m, *off) {
                        let off = *off as usize;
                        img[off..off + bytes.len()].copy_from_slice(bytes);
                    }
                }
                img
            })
            .collect();
        *slot = Some(images);
    }

    /// Cuts the power now: computes what each member's medium holds.
    pub fn power_cut(&self) {
        // As in `power_cut_with`: whoever cuts second waits for the images.
        let mut slot = self.images.lock().unwrap();
        if self.off.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut rng = self.rng.lock().unwrap();
        let images = self
            .devices
            .lock()
            .unwrap()
            .iter()
            .map(|st| {
                let st = st.lock().unwrap();
                let mut img = st.durable.clone().unwrap_or_else(|| st.data.clone());
                for (off, bytes) in &st.cache {
                    let off = *off as usize;
                    match rng.below(3) {
                        0 => {}
                        1 => img[off..off + bytes.len()].copy_from_slice(bytes),
                        _ => {
                            for (s, sec) in bytes.chunks(SECTOR as usize).enumerate() {
                                if rng.below(2) == 0 {
                                    let o = off + s * SECTOR as usize;
                                    img[o..o + sec.len()].copy_from_slice(sec);
                                }
                            }
                        }
                    }
                }
                img
            })
            .collect();
        *slot = Some(images);
    }

    /// What the members' media held when the power went.
    pub fn images(&self) -> Option<Vec<Vec<u8>>> {
        self.images.lock().unwrap().clone()
    }
}

/// A volume over fresh members with volatile write caches on `clock`'s power (crash tests
/// that script their own workload), plus the members' fault switches.
pub fn cached_volume(
    level: Level,
    members: usize,
    chunk: u64,
    rows: u64,
    clock: &Arc<Clock>,
) -> (Arc<Volume<MemDev>>, Vec<Arc<crate::Faults>>) {
    let g = Geometry::new(level, members, chunk, rows * chunk).expect("valid geometry");
    let devs: Vec<MemDev> = fresh_images(g)
        .into_iter()
        .enumerate()
        .map(|(i, img)| cached_dev(format!("mem{i}"), img, clock))
        .collect();
    let faults = devs.iter().map(|d| d.faults.clone()).collect();
    let array = Array::new(
        crate::sim_superblock(g),
        crate::sim_ids(members),
        devs.into_iter().map(Some).collect(),
        None,
        sim_options(),
        // A fresh array: its bitmap is known to be empty.
        Some(Vec::new()),
    );
    (Volume::new(array, Some(Vec::new())), faults)
}

/// A member with a volatile write cache on `clock`'s power.
pub fn cached_dev(name: String, image: Vec<u8>, clock: &Arc<Clock>) -> MemDev {
    let mut d = MemDev::from_image(name, image);
    {
        let mut st = d.state.lock().unwrap();
        st.durable = Some(st.data.clone());
    }
    clock.devices.lock().unwrap().push(d.state.clone());
    d.clock = Some(clock.clone());
    d
}

#[derive(Debug, Clone)]
pub struct TrialConfig {
    pub level: Level,
    pub members: usize,
    pub chunk: u64,
    /// Stripes per member.
    pub rows: u64,
    pub seed: u64,
    /// Concurrent clients and operations each.
    pub tasks: usize,
    pub ops_per_task: usize,
    /// Let the workload fail members (within the level's tolerance).
    pub fail_members: bool,
    /// After the power cut, lose this many members (chosen by the seed) before reassembly:
    /// the RAID write hole case. Without `resync` that is a dirty-degraded start (what
    /// `--start-dirty-degraded` serves): stripes whose write-intent bit is set must be
    /// refused, never served wrong.
    pub lose_after: usize,
    /// Before losing members, reassemble with all of them, run resync to completion and let
    /// the bitmap daemon clear what it resynced (what `uraid serve` does after an unclean
    /// stop), then lose power again: the write hole must then be closed, nothing refused.
    pub resync: bool,
    /// Run the bitmap daemon's pass (`Array::bitmap_tick`) concurrently with the workload,
    /// so the cut also lands while bits are being cleared.
    pub bitmap_daemon: bool,
    /// Run safe mode's clean pass (`Array::safe_mode_tick`, no idle delay) concurrently
    /// with the workload: the cut also lands while an idle array is being marked clean and
    /// while the next write marks it dirty again.
    pub safe_mode: bool,
    /// A journal device in this mode (one more device on the clock, small enough to wrap
    /// and checkpoint during the workload): every reassembly replays it, so nothing may be
    /// refused, with members lost or not.
    pub journal: Option<JournalMode>,
    /// Kill the journal device at a random moment of the workload: the array falls back to
    /// bitmap mode (stripes it then refuses on a degraded reassembly must be ones the bitmap
    /// marks), and the cut can land inside the fallback.
    pub journal_fault: bool,
}

impl TrialConfig {
    /// A scripted journal trial: one task and no random workload (the caller drives the
    /// volume), 8 rows of 4 KiB chunks, a journal in `mode`, nothing else in the background.
    pub fn journal_script(level: Level, members: usize, mode: JournalMode, seed: u64) -> Self {
        TrialConfig {
            level,
            members,
            chunk: 4096,
            rows: 8,
            seed,
            tasks: 1,
            ops_per_task: 0,
            fail_members: false,
            lose_after: 0,
            resync: false,
            bitmap_daemon: false,
            safe_mode: false,
            journal: Some(mode),
            journal_fault: false,
        }
    }
}

/// Size of the trial journal: eight of the array's largest records.
pub fn trial_journal_size(g: &Geometry) -> usize {
    (uraid_core::journal::LOG_START + 8 * uraid_core::journal::max_record(g.members, g.chunk))
        as usize
}

#[derive(Debug, Clone)]
pub(crate) enum Ev {
    Write {
        off: u64,
        data: WriteBuf,
        issue: u64,
        ack: Option<u64>,
    },
    Flush {
        issue: u64,
        ack: Option<u64>,
    },
}

/// What a trial saw.
#[derive(Debug, Default, Clone)]
pub struct TrialReport {
    /// Sectors of stripes a degraded reassembly refused to read (EIO): not resynced after
    /// the cut, so data rebuilt there could be wrong. Every sector served was right.
    pub refused_sectors: u64,
    pub ops_total: u64,
    pub crash_at: u64,
    pub acked_writes: usize,
    pub acked_flushes: usize,
    /// With members lost after the cut (and no resync first): whether the product refuses
    /// that start without `--start-dirty-degraded`.
    pub dirty_degraded_refused: Option<bool>,
    /// Member bytes discarded before the cut (trims of whole granules passed down).
    pub discarded: u64,
}

struct Run {
    clock: Arc<Clock>,
    events: RefCell<Vec<Ev>>,
    time: RefCell<u64>,
}

impl Run {
    fn now(&self) -> u64 {
        let mut t = self.time.borrow_mut();
        *t += 1;
        *t
    }
    fn ack_time(&self) -> Option<u64> {
        (!self.clock.is_off()).then(|| self.now())
    }
}

/// Trial workloads that ended with the journal failed (bitmap mode): the fault test checks
/// that the fallback really ran.
pub static JOURNAL_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Journal checkpoints taken during trial workloads (all threads): the journal tests check
/// that the log really filled, wrapped and was checkpointed under the cut.
pub static JOURNAL_CHECKPOINTS: AtomicU64 = AtomicU64::new(0);

/// Safe-mode passes that recorded "clean" in trials with `safe_mode` (all threads): the
/// safe-mode test checks that cleaning really happened under the cut.
pub static SAFE_MODE_CLEANS: AtomicU64 = AtomicU64::new(0);

/// Regions the bitmap daemon cleared in trials with `bitmap_daemon` (all threads): the
/// daemon test checks that clearing really happened under the cut.
pub static BITMAP_REGIONS_CLEARED: AtomicU64 = AtomicU64::new(0);

fn workload(
    cfg: &TrialConfig,
    vol: &Arc<Volume<MemDev>>,
    faults: &[Arc<crate::Faults>],
    run: &Rc<Run>,
) {
    let size = vol.size();
    let sectors = size / SECTOR;
    let tol = vol.geometry().fault_tolerance();
    let killed = Rc::new(RefCell::new(0usize));
    let tasks = (0..cfg.tasks).map(|t| {
        let (vol, run, killed) = (vol.clone(), run.clone(), killed.clone());
        let mut rng = Rng::new(cfg.seed * 1000 + t as u64);
        let faults = faults.to_vec();
        let cfg = cfg.clone();
        async move {
            for _ in 0..cfg.ops_per_task {
                if run.clock.is_off() {
                    return;
                }
                let mut kind = rng.below(100);
                if cfg.bitmap_daemon && (70..97).contains(&kind) && rng.below(6) != 0 {
                    // Few flushes: cached writes stay volatile while the daemon clears.
                    kind = rng.below(55);
                }
                let mut off = rng.below(sectors) * SECTOR;
                let mut len = ((1 + rng.below(24)) * SECTOR).min(size - off);
                let sdb = vol.geometry().stripe_data_bytes();
                if kind < 8 && size >= 4 * sdb {
                    // A run of whole stripes (parity levels write it as one I/O per member).
                    let n = 2 + rng.below(3);
                    off = rng.below(size / sdb - n + 1) * sdb;
                    len = n * sdb;
                }
                let gr = vol.granule();
                if (55..59).contains(&kind) && size >= 4 * gr {
                    // A trim of whole granules: map holes, and discards on the members.
                    let n = 1 + rng.below(3);
                    off = rng.below(size / gr - n + 1) * gr;
                    len = n * gr;
                }
                if kind < 55 || (65..70).contains(&kind) {
                    // Write (kind 65..70: FUA = write + flush).
                    let data = payload(rng.next_u64(), len as usize);
                    let i = {
                        let mut ev = run.events.borrow_mut();
                        ev.push(Ev::Write {
                            off,
                            data: data.clone(),
                            issue: run.now(),
                            ack: None,
                        });
                        ev.len() - 1
                    };
                    let r = vol.write(off, data).await;
                    if r.is_ok() {
                        if let Ev::Write { ack, .. } = &mut run.events.borrow_mut()[i] {
                            *ack = run.ack_time();
                        }
                    }
                    if kind >= 65 {
                        flush(&vol, &run).await;
                    }
                } else if kind < 65 {
                    // Trim: the range reads as zeros.
                    let i = {
                        let mut ev = run.events.borrow_mut();
                        ev.push(Ev::Write {
                            off,
                            data: WriteBuf::from(vec![0; len as usize]),
                            issue: run.now(),
                            ack: None,
                        });
                        ev.len() - 1
                    };
                    if vol.trim(off, len).await.is_ok() {
                        if let Ev::Write { ack, .. } = &mut run.events.borrow_mut()[i] {
                            *ack = run.ack_time();
                        }
                    }
                } else if kind < 97 {
                    flush(&vol, &run).await;
                } else if cfg.journal_fault && kind >= 98 && faults.len() > cfg.members {
                    let j = &faults[cfg.members];
                    if rng.below(2) == 0 {
                        j.kill();
                    } else {
                        j.kill_after(1 + rng.below(6) as i64);
                    }
                } else if cfg.fail_members && *killed.borrow() < tol.saturating_sub(cfg.lose_after)
                {
                    *killed.borrow_mut() += 1;
                    let m = rng.below(cfg.members as u64) as usize;
                    if rng.below(2) == 0 {
                        faults[m].kill();
                    } else {
                        faults[m].kill_after(1 + rng.below(6) as i64);
                    }
                }
            }
        }
    });
    let done = std::cell::Cell::new(false);
    let work = async {
        join_all(tasks).await;
        done.set(true);
    };
    let mut rng = Rng::new(cfg.seed ^ 0xB17);
    let daemon = async {
        while (cfg.bitmap_daemon || cfg.safe_mode) && !done.get() && !run.clock.is_off() {
            if cfg.bitmap_daemon {
                let n = vol.array().bitmap_tick().await;
                BITMAP_REGIONS_CLEARED.fetch_add(n, Ordering::Relaxed);
            }
            if cfg.safe_mode && vol.array().safe_mode_tick(std::time::Duration::ZERO).await {
                SAFE_MODE_CLEANS.fetch_add(1, Ordering::Relaxed);
            }
            for _ in 0..rng.below(16) {
                uraid_engine::reactor::yield_now().await;
            }
        }
    };
    block_on(futures::future::join(work, daemon));
}

async fn flush(vol: &Arc<Volume<MemDev>>, run: &Rc<Run>) {
    let i = {
        let mut ev = run.events.borrow_mut();
        ev.push(Ev::Flush {
            issue: run.now(),
            ack: None,
        });
        ev.len() - 1
    };
    if vol.flush().await.is_ok() {
        if let Ev::Flush { ack, .. } = &mut run.events.borrow_mut()[i] {
            *ack = run.ack_time();
        }
    }
}

fn build(
    cfg: &TrialConfig,
    crash_at: u64,
) -> (Arc<Volume<MemDev>>, Vec<Arc<crate::Faults>>, Arc<Clock>) {
    let g = Geometry::new(cfg.level, cfg.members, cfg.chunk, cfg.rows * cfg.chunk)
        .expect("valid trial geometry");
    let clock = Clock::new(crash_at, cfg.seed);
    let devs: Vec<MemDev> = crate::fresh_images_with(g, cfg.journal)
        .into_iter()
        .enumerate()
        .map(|(i, img)| cached_dev(format!("mem{i}"), img, &clock))
        .collect();
    for d in &devs {
        d.faults.yield_ops.store(true, Ordering::Relaxed);
    }
    let mut faults: Vec<Arc<crate::Faults>> = devs.iter().map(|d| d.faults.clone()).collect();
    let mut sb = crate::sim_superblock(g);
    sb.journal = cfg.journal.map(|m| (crate::SIM_JOURNAL_UUID, m));
    let array = Array::new(
        sb.clone(),
        crate::sim_ids(cfg.members),
        devs.into_iter().map(Some).collect(),
        None,
        sim_options(),
        // A fresh array: its bitmap is known to be empty.
        Some(Vec::new()),
    );
    if let Some(mode) = cfg.journal {
        let img = crate::journal_image(trial_journal_size(&g));
        // Read off the clock (the power cut counts member operations from the workload on).
        let jsb = uraid_engine::journal::check_journal(&MemDev::from_image("j", img.clone()), &sb)
            .expect("fresh journal");
        let jdev = cached_dev(format!("mem{}", cfg.members), img, &clock);
        jdev.faults.yield_ops.store(true, Ordering::Relaxed);
        faults.push(jdev.faults.clone());
        array.attach_journal(uraid_engine::journal::Journal::new(jdev, mode, jsb, 0));
    }
    (Volume::new(array, Some(Vec::new())), faults, clock)
}

/// Reassembles a volume from member images with the product's rules (superblock slots,
/// `assemble::decide`, map merge). `present[i]` false: member i is not given.
pub fn reassemble(images: &[Vec<u8>], present: &[bool]) -> Result<Arc<Volume<MemDev>>, String> {
    reassemble_with(images, present, |i, img| {
        MemDev::from_image(format!("mem{i}"), img)
    })
}

/// `reassemble` with the member devices built by `make_dev(index, image)` (a second crash
/// stage puts them on a new power clock).
pub fn reassemble_with(
    images: &[Vec<u8>],
    present: &[bool],
    make_dev: impl Fn(usize, Vec<u8>) -> MemDev,
) -> Result<Arc<Volume<MemDev>>, String> {
    let journal = (images.len() > present.len()).then_some(present.len());
    reassemble_on(images, present, journal, None, sim_options(), make_dev)
}

/// `reassemble_with` where the journal is image `journal` (if the array has one; that image
/// is never taken for a member), the array runs on `rt`'s reactors with `opts`.
pub fn reassemble_on(
    images: &[Vec<u8>],
    present: &[bool],
    journal: Option<usize>,
    rt: Option<uraid_engine::RuntimeHandle>,
    opts: uraid_engine::ArrayOptions,
    make_dev: impl Fn(usize, Vec<u8>) -> MemDev,
) -> Result<Arc<Volume<MemDev>>, String> {
    let mut present = present.to_vec();
    if let Some(j) = journal.filter(|&j| j < present.len()) {
        present[j] = false;
    }
    let plan = plan_from(images, &present, journal.is_some())?;
    plan.can_start()
        .map_err(|e| format!("{e}; refused: {:?}", plan.refused))?;
    let g = plan.sb.geometry;
    let mo = uraid_core::alloc::MAP_OFFSET as usize;
    let len = uraid_core::alloc::pages(&g) * uraid_core::alloc::PAGE;
    let mut copies = Vec::new();
    let mut devs = Vec::new();
    for (slot, p) in plan.slots.iter().enumerate() {
        match p {
            Some(p) if !plan.sb.is_failed(slot) => {
                let i: usize = p.to_string_lossy()[3..].parse().expect("memN");
                copies.push(images[i][mo..mo + len].to_vec());
                devs.push(Some(make_dev(i, images[i].clone())));
            }
            _ => devs.push(None),
        }
    }
    let (words, _) = uraid_engine::alloc::merge_map_copies(&g, &copies);
    // The journal (the image after the members'), replayed as `assemble::open_volume` does.
    let build = |sb, devs| Array::new(sb, plan.ids(), devs, rt.clone(), opts, plan.bitmap.clone());
    let array = match (plan.sb.journal, journal.and_then(|j| images.get(j))) {
        (Some((_, mode)), Some(img)) => {
            let jdev = make_dev(journal.expect("journal image"), img.clone());
            uraid_engine::assemble::replay(jdev, mode, &plan.sb, devs, build)
                .map_err(|e| format!("journal replay: {e}"))?
        }
        (Some(_), None) => return Err("the array has a journal and none was given".into()),
        _ => build(plan.sb.clone(), devs),
    };
    Ok(Volume::new(array, Some(words)))
}

/// Reassembles every member, runs resync to completion and returns the member images
/// after it (index = image index), with the resync's report.
pub fn resync_images(
    images: &[Vec<u8>],
) -> Result<(Vec<Vec<u8>>, uraid_engine::ResyncReport), String> {
    let present = vec![true; images.len()];
    let vol = reassemble(images, &present).map_err(|e| format!("does not assemble: {e}"))?;
    let a = vol.array();
    if !a.needs_resync() {
        // Cut before the first superblock round marked the array dirty: nothing was
        // written to the data area, so there is nothing to resync.
        return Ok((images.to_vec(), Default::default()));
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = block_on(a.resync(&stop)).map_err(|e| format!("resync: {e}"))?;
    if a.needs_resync() {
        return Err("resync finished but the array still asks for it".into());
    }
    // The bitmap daemon's passes: the first sees resync's regions idle, the next clears them
    // (after flushing the members). The array is still "not clean" on disk afterwards, so a
    // degraded start is judged by the bitmap alone.
    for _ in 0..2 {
        block_on(a.bitmap_tick());
    }
    let (bc, _, dirty) = a.bitmap_state();
    if bc > 0 && dirty > 0 {
        return Err(format!(
            "{dirty} bitmap regions still dirty after resync and two idle daemon passes"
        ));
    }
    let g = *a.geometry();
    if matches!(
        g.level,
        uraid_core::Level::Raid1 | uraid_core::Level::Raid10
    ) {
        // Every copy of every row equal (snapshots by slot, as mirror_copies counts).
        let snap: Vec<Vec<u8>> = (0..g.members)
            .map(|i| a.member_dev(i).map(|d| d.snapshot()).unwrap_or_default())
            .collect();
        // Rows of granules that hold written data (the rest reads as zeros whatever the
        // members hold: fresh members carry different garbage, never resynced).
        let off = uraid_core::format::DATA_OFFSET;
        let runs = vol.allocation(0, vol.size()).map_err(|e| e.to_string())?;
        for row in 0..g.volume_size() / g.chunk {
            let at = row * g.chunk;
            if !runs
                .iter()
                .any(|r| r.allocated && r.off <= at && at < r.off + r.len)
            {
                continue;
            }
            let copies = g.mirror_copies(row);
            let bytes = |&(m, base): &(usize, u64)| {
                let s = (off + base) as usize;
                snap[m][s..s + g.chunk as usize].to_vec()
            };
            if copies.iter().any(|c| bytes(c) != bytes(&copies[0])) {
                return Err(format!("after resync the copies of row {row} differ"));
            }
        }
    }
    let mut out = images.to_vec();
    for slot in 0..a.geometry().members {
        if let (Some(d), Some(name)) = (a.member_dev(slot), a.member_name(slot)) {
            let i: usize = name[3..]
                .parse()
                .map_err(|_| format!("member name {name}"))?;
            out[i] = d.snapshot();
        }
    }
    Ok((out, report))
}

/// Whether the product refuses to start from these members without
/// `--start-dirty-degraded` (`Plan::check_dirty_degraded`).
pub fn dirty_degraded_refused(images: &[Vec<u8>], present: &[bool]) -> bool {
    plan_from(images, present, images.len() > present.len())
        .is_ok_and(|p| p.check_dirty_degraded(false).is_err())
}

/// The product's assembly decision (`assemble::decide`, no --force) for the member images
/// given (`present[i]`), named memN.
fn plan_from(
    images: &[Vec<u8>],
    present: &[bool],
    journal_given: bool,
) -> Result<uraid_engine::assemble::Plan, String> {
    let mut found = Vec::new();
    let mut refused = Vec::new();
    for (i, img) in images.iter().enumerate().take(present.len()) {
        if !present[i] {
            continue;
        }
        match pick_superblock_slot(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE]) {
            Ok((sb, slot)) => found.push(Found {
                path: format!("mem{i}").into(),
                sb,
                slot,
            }),
            Err(e) => refused.push(format!("mem{i}: {e}")),
        }
    }
    let mut plan = decide(found, refused, false).map_err(|e| e.to_string())?;
    if plan.sb.journal.is_some() && journal_given {
        plan.journal = Some("journal".into());
    }
    // The write-intent bitmap as the product loads it: the union of the usable members'
    // valid copies.
    let (g, bc) = (plan.sb.geometry, plan.sb.bitmap_chunk);
    if bc > 0 {
        let bo = uraid_core::bitmap::BITMAP_OFFSET as usize;
        let len = uraid_core::bitmap::pages(&g, bc) * uraid_core::alloc::PAGE;
        let copies: Vec<Vec<u8>> = plan
            .slots
            .iter()
            .enumerate()
            .filter(|(slot, p)| p.is_some() && !plan.sb.is_failed(*slot))
            .map(|(_, p)| {
                let i: usize = p.as_ref().expect("filtered").to_string_lossy()[3..]
                    .parse()
                    .expect("memN");
                images[i][bo..bo + len].to_vec()
            })
            .collect();
        plan.bitmap = Some(uraid_core::bitmap::merge_copies(&g, bc, &copies).0);
    }
    Ok(plan)
}

/// A write that may be current in a sector: (bytes, volume offset, issued, acknowledged).
pub(crate) type Cand<'a> = (&'a WriteBuf, u64, u64, Option<u64>);

/// What sector `[lo, hi)` may hold after `events` on top of a volume where it held any of
/// `before`: the durable floor write and whatever may have replaced it, or, with no floor,
/// any of `before` and every write of the history. Also the candidates and the floor.
pub(crate) fn allowed_values<'a>(
    events: &'a [Ev],
    lo: u64,
    hi: u64,
    before: Vec<Vec<u8>>,
) -> (Vec<Vec<u8>>, Vec<Cand<'a>>, Option<Cand<'a>>) {
    let flush_issues: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Ev::Flush {
                issue,
                ack: Some(_),
            } => Some(*issue),
            _ => None,
        })
        .collect();
    let durable = |ack: u64| flush_issues.iter().any(|&fi| fi >= ack);
    let cands: Vec<Cand> = events
        .iter()
        .filter_map(|e| match e {
            Ev::Write {
                off,
                data,
                issue,
                ack,
            } if *off < hi && lo < off + data.len() as u64 => Some((data, *off, *issue, *ack)),
            _ => None,
        })
        .collect();
    let floor = cands
        .iter()
        .filter(|c| c.3.is_some_and(durable))
        .max_by_key(|c| c.3)
        .copied();
    let bytes = |c: &Cand| -> Vec<u8> {
        let o = (lo - c.1) as usize;
        c.0[o..o + SECTOR as usize].to_vec()
    };
    let mut allowed: Vec<Vec<u8>> = Vec::new();
    match floor {
        Some(f) => {
            allowed.push(bytes(&f));
            for c in &cands {
                // Writes completed before the floor write was issued cannot be current.
                if c.3.is_none_or(|a| a >= f.2) {
                    allowed.push(bytes(c));
                }
            }
        }
        None => {
            allowed.extend(before);
            allowed.extend(cands.iter().map(bytes));
        }
    }
    (allowed, cands, floor)
}

/// Checks every sector of `got` against the history (module docs) on top of `base`; with
/// `earlier`, a sector this history leaves as it was may hold any value the earlier history
/// allowed on a zeroed volume, not only the one `base` shows (mirrors: a reassembly with a
/// member left out can show the other copy of a row an earlier cut left unsynced). Err
/// names the first sector that is wrong.
fn check(
    events: &[Ev],
    got: &[u8],
    base: &[u8],
    earlier: Option<&[Ev]>,
    exempt: &dyn Fn(u64) -> bool,
) -> Result<(), String> {
    let sectors = got.len() as u64 / SECTOR;
    for s in 0..sectors {
        let (lo, hi) = (s * SECTOR, (s + 1) * SECTOR);
        if exempt(s) {
            continue;
        }
        let mut before = vec![base[lo as usize..hi as usize].to_vec()];
        if let Some(e) = earlier {
            before.extend(allowed_values(e, lo, hi, vec![vec![0; SECTOR as usize]]).0);
        }
        let (allowed, cands, floor) = allowed_values(events, lo, hi, before);
        let have = &got[lo as usize..hi as usize];
        if !allowed.iter().any(|a| a == have) {
            let bytes = |c: &Cand| -> Vec<u8> {
                let o = (lo - c.1) as usize;
                c.0[o..o + SECTOR as usize].to_vec()
            };
            let what = if have.iter().all(|&b| b == 0) {
                "zeros".to_string()
            } else if have == &base[lo as usize..hi as usize] {
                "its contents before this stage".to_string()
            } else if let Some(c) = cands.iter().find(|c| bytes(c) == have) {
                format!(
                    "the write issued at t={} acked at {:?} (superseded)",
                    c.2, c.3
                )
            } else {
                "bytes no write left there".to_string()
            };
            return Err(format!(
                "sector {s} (volume offset {lo}) holds {what} ({} candidate writes, durable \
                 floor: {})",
                cands.len(),
                floor.map_or("none".to_string(), |f| format!(
                    "write issued at t={} acked at {:?}",
                    f.2, f.3
                ))
            ));
        }
    }
    Ok(())
}

/// The workload of one stage on `vol`, the power cut at `crash_at`: the history and what
/// the members' media held.
fn stage(
    cfg: &TrialConfig,
    vol: Arc<Volume<MemDev>>,
    faults: &[Arc<crate::Faults>],
    clock: &Arc<Clock>,
) -> (Vec<Ev>, Vec<Vec<u8>>, u64) {
    let run = Rc::new(Run {
        clock: clock.clone(),
        events: RefCell::new(Vec::new()),
        time: RefCell::new(0),
    });
    workload(cfg, &vol, faults, &run);
    if let Some(j) = vol.array().journal_status() {
        JOURNAL_CHECKPOINTS.fetch_add(j.checkpoints, Ordering::Relaxed);
        if j.state == "failed" {
            JOURNAL_FALLBACKS.fetch_add(1, Ordering::Relaxed);
        }
    }
    let ops = clock.ops();
    clock.power_cut();
    drop(vol);
    let images = clock.images().expect("power was cut");
    let events = run.events.borrow().clone();
    (events, images, ops)
}

/// Picks the cut uniformly over the member operations a dry run of the same stage performs.
fn pick_crash(seed: u64, dry: impl FnOnce() -> u64) -> u64 {
    1 + Rng::new(seed ^ 0xABCD).below(dry().max(1))
}

/// Reassembles from `images` (members in `lost` left out), reads the whole volume stripe
/// by stripe and checks it against `events` on top of `base` (what the volume held before
/// the stage). A stripe the product refuses to read (EIO: degraded, and its parity not
/// resynced after the unclean stop, so what it would rebuild may be wrong) is counted as
/// refused, not checked — but only if the product says that stripe is unsynced. Every
/// sector it serves must be right: no exemption. Returns the bytes read (refused stripes
/// as zeros) and the refused sector count.
fn verify(
    cfg: &TrialConfig,
    events: &[Ev],
    images: &[Vec<u8>],
    base: &[u8],
    lost: &[usize],
    expect_whole: bool,
) -> Result<(Vec<u8>, u64), String> {
    verify_alt(cfg, events, images, base, None, lost, expect_whole)
}

/// `verify` where a sector this history leaves as it was may hold any value the `earlier`
/// history allowed (`check`).
fn verify_alt(
    cfg: &TrialConfig,
    events: &[Ev],
    images: &[Vec<u8>],
    base: &[u8],
    earlier: Option<&[Ev]>,
    lost: &[usize],
    expect_whole: bool,
) -> Result<(Vec<u8>, u64), String> {
    let present: Vec<bool> = (0..cfg.members).map(|i| !lost.contains(&i)).collect();
    let vol = reassemble(images, &present).map_err(|e| format!("does not assemble: {e}"))?;
    if expect_whole && !vol.array().failed().is_empty() {
        return Err(format!(
            "reassembly left out members {} that were never failed",
            vol.array().failed()
        ));
    }
    let g = *vol.geometry();
    let sdb = g.stripe_data_bytes();
    let mut got = Vec::with_capacity(vol.size() as usize);
    let mut refused = std::collections::HashSet::new();
    for st in 0..g.units() {
        match block_on(vol.read(st * sdb, sdb)) {
            Ok(seg) => got.extend(seg.to_vec()),
            Err(uraid_engine::ArrayError::Unreadable { .. }) if vol.array().stripe_unsynced(st) => {
                refused.insert(st);
                got.extend(std::iter::repeat_n(0u8, sdb as usize));
            }
            Err(e) => return Err(format!("read of stripe {st} after reassembly: {e}")),
        }
    }
    let exempt = |sector: u64| refused.contains(&(sector * SECTOR / sdb));
    check(events, &got, base, earlier, &exempt)?;
    Ok((got, refused.len() as u64 * sdb / SECTOR))
}

/// One crash trial (module docs). `crash_at`: None picks the cut uniformly over the member
/// operations the same workload performs without one. On parity levels with every member
/// present, the array is also reassembled with each member left out in turn, so parity is
/// checked too: a lost chunk rebuilt from a stripe no pending write touched must be exact.
pub fn run_trial(cfg: &TrialConfig, crash_at: Option<u64>) -> Result<TrialReport, String> {
    let crash_at = crash_at.unwrap_or_else(|| {
        pick_crash(cfg.seed, || {
            let (vol, faults, clock) = build(cfg, 0);
            stage(cfg, vol, &faults, &clock).2
        })
    });
    let (vol, faults, clock) = build(cfg, crash_at);
    let (events, images, ops_total) = stage(cfg, vol, &faults, &clock);
    let discarded = faults
        .iter()
        .map(|f| f.discarded.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let ctx = |e: String| format!("{:?} crash_at {crash_at}: {e}", cfg);
    let mut rng = Rng::new(cfg.seed ^ 0x1055);
    let lost: Vec<usize> = (0..cfg.lose_after)
        .map(|_| rng.below(cfg.members as u64) as usize)
        .collect();
    let size = images_volume_size(cfg);
    let zeros = vec![0u8; size as usize];
    let whole = cfg.lose_after == 0 && !cfg.fail_members;
    let images = if cfg.resync {
        resync_images(&images).map_err(ctx)?.0
    } else {
        images
    };
    let refused = (!lost.is_empty() && !cfg.resync).then(|| {
        let present: Vec<bool> = (0..cfg.members).map(|i| !lost.contains(&i)).collect();
        dirty_degraded_refused(&images, &present)
    });
    let (_, mut hole) = verify(cfg, &events, &images, &zeros, &lost, whole).map_err(ctx)?;
    if whole && cfg.level.is_parity() {
        for m in 0..cfg.members {
            let (_, h) = verify(cfg, &events, &images, &zeros, &[m], false)
                .map_err(|e| ctx(format!("member {m} left out: {e}")))?;
            hole += h;
        }
    }
    let mut r = report(&events, ops_total, crash_at, hole);
    r.dirty_degraded_refused = refused;
    r.discarded = discarded;
    Ok(r)
}

fn images_volume_size(cfg: &TrialConfig) -> u64 {
    Geometry::new(cfg.level, cfg.members, cfg.chunk, cfg.rows * cfg.chunk)
        .expect("valid trial geometry")
        .volume_size()
}

fn report(events: &[Ev], ops_total: u64, crash_at: u64, refused_sectors: u64) -> TrialReport {
    TrialReport {
        refused_sectors,
        ops_total,
        crash_at,
        acked_writes: events
            .iter()
            .filter(|e| matches!(e, Ev::Write { ack: Some(_), .. }))
            .count(),
        acked_flushes: events
            .iter()
            .filter(|e| matches!(e, Ev::Flush { ack: Some(_), .. }))
            .count(),
        dirty_degraded_refused: None,
        discarded: 0,
    }
}

/// Two power cuts: the first at `crash1`; the array reassembled from the media is put on
/// members with volatile caches again and runs a second workload, cut at a random point;
/// then reassembled and checked against the second history on top of what the first
/// reassembly read. Catches metadata that survives one torn round but not the next (a
/// member that missed a round must not lose its only valid superblock in the following one).
pub fn run_two_stage(
    cfg: &TrialConfig,
    crash1: u64,
    crash2: Option<u64>,
) -> Result<TrialReport, String> {
    let ctx = |e: String| format!("{:?} crash1 {crash1}: {e}", cfg);
    let (vol, faults, clock) = build(cfg, crash1);
    let (events1, images1, _) = stage(cfg, vol, &faults, &clock);
    let zeros = vec![0u8; images_volume_size(cfg) as usize];
    let (got1, _) = verify(cfg, &events1, &images1, &zeros, &[], false)
        .map_err(|e| ctx(format!("stage 1: {e}")))?;
    let present = vec![true; cfg.members];
    let cfg2 = TrialConfig {
        seed: cfg.seed.wrapping_mul(31) + 7,
        ..cfg.clone()
    };
    let on_clock = |clock: &Arc<Clock>| {
        reassemble_with(&images1, &present, |i, img| {
            let d = cached_dev(format!("mem{i}"), img, clock);
            d.faults.yield_ops.store(true, Ordering::Relaxed);
            d
        })
    };
    let crash2 = crash2.unwrap_or_else(|| {
        pick_crash(cfg2.seed, || {
            let clock = Clock::new(0, cfg2.seed);
            match on_clock(&clock) {
                Ok(vol) => stage(&cfg2, vol, &[], &clock).2,
                Err(_) => 1,
            }
        })
    });
    let clock = Clock::new(crash2, cfg2.seed);
    let (events2, images2, ops2) = match on_clock(&clock) {
        Ok(vol) => stage(&cfg2, vol, &[], &clock),
        // The cut landed in the assembly itself (a journal replay): stage 2 wrote nothing,
        // and the next assembly must replay again from what the media hold.
        Err(_) if clock.is_off() => (
            Vec::new(),
            clock.images().expect("power was cut"),
            clock.ops(),
        ),
        Err(e) => return Err(ctx(format!("stage 2 does not assemble: {e}"))),
    };
    let (_, mut refused) = verify(&cfg2, &events2, &images2, &got1, &[], false)
        .map_err(|e| ctx(format!("stage 2, crash_at {crash2}: {e}")))?;
    if Geometry::new(cfg.level, cfg.members, cfg.chunk, cfg.rows * cfg.chunk)
        .is_ok_and(|g| g.fault_tolerance() > 0)
    {
        // Each member left out: stripes torn by either cut must be refused, never rebuilt
        // wrong, and no flushed write lost (a bitmap clear or map fill of stage 1 that reached
        // only some members must not let stage 2's writes go unrecorded).
        for m in 0..cfg.members {
            // A sector stage 2 did not write may read as any state the first history allows,
            // not only the one stage 1's reassembly showed. Mirrors: a row the first cut left
            // with differing copies may read as either copy; stage 1 read the first. Parity
            // levels: an allocation-map bit the first cut left on one member only is written
            // to the others at stage 2's first write — a second cut before any write (e.g.
            // inside a journal replay) leaves it there, so with that member out the granule
            // is a hole again: its data was never flushed, and a flushed sector of stage 1
            // still has to read back (its floor rules out zeros).
            let earlier = Some(&events1[..]);
            let (_, r) = verify_alt(&cfg2, &events2, &images2, &got1, earlier, &[m], false)
                .map_err(|e| {
                    ctx(format!(
                        "stage 2, crash_at {crash2}, member {m} left out: {e}"
                    ))
                })?;
            refused += r;
        }
    }
    Ok(report(&events2, ops2, crash2, refused))
}

/// A journal replayed while a member is absent must not let that member come back later
/// with the chunks it missed: power cut (`crash_at`, None: random), reassembly with member
/// `absent` left out (the replay writes to the others), then reassembly of *its* members'
/// images plus the absent member's old image: every sector must be right (the product
/// refuses the stale member as failed, so it serves degraded from the replayed ones).
pub fn run_replay_then_member_returns(
    cfg: &TrialConfig,
    absent: usize,
    crash_at: Option<u64>,
) -> Result<TrialReport, String> {
    let crash_at = crash_at.unwrap_or_else(|| {
        pick_crash(cfg.seed, || {
            let (vol, faults, clock) = build(cfg, 0);
            stage(cfg, vol, &faults, &clock).2
        })
    });
    let ctx = |e: String| format!("{:?} crash_at {crash_at}: {e}", cfg);
    let (vol, faults, clock) = build(cfg, crash_at);
    let (events, images, ops) = stage(cfg, vol, &faults, &clock);
    let present: Vec<bool> = (0..cfg.members).map(|i| i != absent).collect();
    let vol = reassemble(&images, &present).map_err(|e| ctx(format!("degraded: {e}")))?;
    let a = vol.array();
    let mut after = images.clone();
    for slot in 0..cfg.members {
        if let (Some(d), Some(name)) = (a.member_dev(slot), a.member_name(slot)) {
            let i: usize = name[3..].parse().map_err(|_| format!("member {name}"))?;
            after[i] = d.snapshot();
        }
    }
    if let Some(j) = a.journal_dev() {
        after[cfg.members] = j.snapshot();
    }
    drop(vol);
    let zeros = vec![0u8; images_volume_size(cfg) as usize];
    let (_, refused) = verify(cfg, &events, &after, &zeros, &[], false)
        .map_err(|e| ctx(format!("member {absent} back after the replay: {e}")))?;
    Ok(report(&events, ops, crash_at, refused))
}

/// Every power-cut point of a journal failure's fallback, one by one: a write-back journal
/// holds two writes that were acknowledged and FLUSHed (whose member writes sit only in the
/// members' volatile caches: a write-back FLUSH flushes no member), then the journal dies and
/// the next writes switch the array to bitmap mode. The cut lands at every member operation
/// from the journal's death to the end, with `seeds` different choices of which cached
/// writes survive; reassembled (whole, and with each member left out), both writes must read
/// back. Returns the cuts tried.
pub fn journal_failure_every_cut(
    level: Level,
    members: usize,
    mode: JournalMode,
    seeds: u64,
) -> Result<u64, String> {
    let cfg = TrialConfig::journal_script(level, members, mode, 1);
    let g = Geometry::new(level, members, cfg.chunk, cfg.rows * cfg.chunk)
        .map_err(|e| e.to_string())?;
    let sdb = g.stripe_data_bytes();
    let w1 = crate::payload(7, sdb as usize);
    let w2 = crate::payload(8, 4096);
    // The script; returns the clock's operation count when the journal died. The first
    // writes allocate their granules (map pages: that FLUSH does flush the members); the
    // overwrites that follow are in the journal and the members' caches only.
    let script = |vol: &Arc<Volume<MemDev>>, faults: &[Arc<crate::Faults>], clock: &Clock| {
        block_on(async {
            let ok = vol.write(0, crate::payload(5, sdb as usize)).await.is_ok()
                && vol.write(2 * sdb, crate::payload(6, 4096)).await.is_ok()
                && vol.flush().await.is_ok()
                && vol.write(0, w1.clone()).await.is_ok()
                && vol.write(2 * sdb, w2.clone()).await.is_ok()
                && vol.flush().await.is_ok();
            let at = clock.ops();
            faults[members].kill();
            // Into regions whose write-intent bits are already set (a bit set would flush
            // the members first), and granules already allocated.
            let _ = vol.write(sdb, crate::payload(9, 4096)).await;
            let _ = vol.write(2 * sdb + 8192, crate::payload(10, 4096)).await;
            let _ = vol.flush().await;
            (ok, at)
        })
    };
    let (vol, faults, clock) = build(&cfg, 0);
    let (ok, died_at) = script(&vol, &faults, &clock);
    if !ok {
        return Err("the writes before the journal died failed".into());
    }
    let total = clock.ops();
    drop(vol);
    let mut tried = 0;
    for crash_at in died_at + 1..=total + 1 {
        for seed in 0..seeds {
            let cfg = TrialConfig {
                seed: seed + 1,
                ..cfg.clone()
            };
            let (vol, faults, clock) = build(&cfg, crash_at);
            let (ok, _) = script(&vol, &faults, &clock);
            clock.power_cut();
            drop(vol);
            if !ok {
                return Err(format!("crash_at {crash_at}: cut before the journal died"));
            }
            let images = clock.images().expect("power was cut");
            for lost in std::iter::once(None).chain((0..members).map(Some)) {
                let present: Vec<bool> = (0..members).map(|i| Some(i) != lost).collect();
                let v = reassemble(&images, &present)
                    .map_err(|e| format!("crash_at {crash_at}, member {lost:?} out: {e}"))?;
                for (off, w) in [(0, &w1), (2 * sdb, &w2)] {
                    let got = match block_on(v.read(off, w.len() as u64)) {
                        Ok(seg) => seg.to_vec(),
                        // Bitmap mode after the fallback: a degraded read of a stripe not
                        // resynced since the cut is refused, which the product says.
                        Err(uraid_engine::ArrayError::Unreadable { .. })
                            if lost.is_some() && v.array().stripe_unsynced(off / sdb) =>
                        {
                            continue
                        }
                        Err(e) => {
                            return Err(format!("crash_at {crash_at}, member {lost:?} out: {e}"))
                        }
                    };
                    if got != w[..] {
                        return Err(format!(
                            "crash_at {crash_at} (journal died at {died_at}), seed {seed}, \
                             member {lost:?} out: the write at {off}, acknowledged and \
                             FLUSHed before the journal died, reads back wrong"
                        ));
                    }
                }
            }
            tried += 1;
        }
    }
    Ok(tried)
}

/// A journal that cannot be read at assembly must fail the assembly, not end the log early
/// (durable records after the bad spot would be dropped for good). Writes some records, cuts
/// the power, and reassembles with every read of the log area failing. Returns whether the
/// journal held records (the caller checks that the case is not vacuous).
pub fn journal_read_error_fails_assembly(cfg: &TrialConfig) -> Result<bool, String> {
    let (vol, _faults, clock) = build(cfg, 0);
    let sdb = vol.geometry().stripe_data_bytes();
    block_on(async {
        for i in 0..6u64 {
            let _ = vol.write(i * sdb, crate::payload(i, 4096)).await;
        }
        let _ = vol.flush().await;
    });
    let records = vol.array().journal_status().map_or(0, |j| j.records);
    clock.power_cut();
    drop(vol);
    let images = clock.images().expect("power was cut");
    let present = vec![true; cfg.members];
    let members = cfg.members;
    let r = reassemble_with(&images, &present, |i, img| {
        let len = img.len() as u64;
        let d = MemDev::from_image(format!("mem{i}"), img);
        if i == members {
            d.faults.bad_range(uraid_core::journal::LOG_START, len);
        }
        d
    });
    match r {
        Err(e) if e.contains("reading the journal") => Ok(records > 0),
        Err(e) => Err(format!("failed for another reason: {e}")),
        Ok(_) => Err("assembled although the journal could not be read".into()),
    }
}

/// Polls `fut` with a no-op waker until it is ready, at most `max` times (the members and
/// the journal complete in memory, each operation after one yield): Err if it never was,
/// a writer spinning forever.
fn poll_bounded<T>(fut: impl std::future::Future<Output = T>, max: u64) -> Result<T, String> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    for _ in 0..max {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Ok(v);
        }
    }
    Err(format!("not done after {max} polls"))
}

/// What `dropped_write_every_poll` saw over its drop points.
#[derive(Debug, Default)]
pub struct DroppedWrites {
    /// Drop points tried (the write future polled 1, 2, ... times, then dropped).
    pub drops: u64,
    /// Of which the journal stayed in service (and its checkpoints moved on)...
    pub active: u64,
    /// ...or was poisoned by the abandoned record (the array switched to bitmap mode).
    pub poisoned: u64,
    /// Drop points where the record was durable and its member writes unfinished: written
    /// again by the switch to bitmap mode (`Journal::orphan`).
    pub reapplied: u64,
}

/// A write future dropped at every await point: for N = 1, 2, ... a read-modify-write into a
/// journalled array is polled N times and dropped (until N polls complete it). Afterwards
/// later writes, into the same stripe and elsewhere, enough to wrap the small trial log
/// several times, must complete (no writer waits for the dropped sequence number); the
/// journal's checkpoints must have moved on, or the journal was poisoned and the switch to
/// bitmap mode is done. Then the power is cut after a FLUSH and the array reassembled, whole
/// and with each member left out: every byte reads as written (the dropped write's range
/// was overwritten), or, only in bitmap mode with a member out, is refused on a stripe the
/// bitmap marks.
pub fn dropped_write_every_poll(
    level: Level,
    members: usize,
    mode: JournalMode,
) -> Result<DroppedWrites, String> {
    let cfg = TrialConfig::journal_script(level, members, mode, 3);
    use std::future::Future as _;
    let mut seen = DroppedWrites::default();
    const POLLS: u64 = 1_000_000;
    // Each drop point twice: then a power cut (the next assembly must read back right,
    // with each member out), or the member holding the dropped write's chunk failed in the
    // running array (its degraded reads decode from the parity the later writes left).
    for (n, lose) in (1..).flat_map(|n| [(n, false), (n, true)]) {
        let ctx = |e: String| {
            format!("{level} {mode:?}, dropped after {n} polls (member lost: {lose}): {e}")
        };
        let (vol, faults, clock) = build(&cfg, 0);
        // Member writes complete in different orders and over several polls, so a drop
        // can fall between the first and the last of a record's member writes.
        for f in &faults {
            f.yield_ops.store(true, Ordering::Relaxed);
            f.jitter.store(true, Ordering::Relaxed);
        }
        let size = vol.size();
        let sdb = vol.geometry().stripe_data_bytes();
        let mut model = crate::Model::new(size);
        let base = crate::payload(100, size as usize);
        poll_bounded(vol.write(0, base.clone()), POLLS)
            .map_err(ctx)?
            .map_err(|e| ctx(e.to_string()))?;
        poll_bounded(vol.flush(), POLLS)
            .map_err(ctx)?
            .map_err(|e| ctx(e.to_string()))?;
        model.write(0, &base);
        let cps0 = vol.array().journal_status().map_or(0, |j| j.checkpoints);
        // The write dropped: one chunk of stripe 1 (a read-modify-write).
        let (woff, wlen) = (sdb + 4096, 4096u64);
        let mut w = Box::pin(vol.write(woff, crate::payload(200, wlen as usize)));
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        let mut finished = false;
        for _ in 0..n {
            if let std::task::Poll::Ready(r) = w.as_mut().poll(&mut cx) {
                r.map_err(|e| ctx(format!("the write itself: {e}")))?;
                finished = true;
                break;
            }
        }
        drop(w);
        // Later writes: the dropped write's range first (so its bytes are known), then
        // small writes over every stripe, round and round. With a member to lose, none
        // (a write to the stripe may heal or hide a tear): the bytes of the dropped write's
        // range are whatever the running array read before the loss.
        let mut later = vec![(woff, wlen)];
        for i in 0..48u64 {
            later.push(((i % 8) * sdb + (i % 3) * 4096, 4096));
        }
        if lose {
            later.clear();
        }
        for (i, &(off, len)) in later.iter().enumerate() {
            let data = crate::payload(300 + i as u64, len as usize);
            poll_bounded(vol.write(off, data.clone()), POLLS)
                .map_err(|e| ctx(format!("later write {i}: {e}")))?
                .map_err(|e| ctx(format!("later write {i}: {e}")))?;
            model.write(off, &data);
        }
        poll_bounded(vol.flush(), POLLS)
            .map_err(ctx)?
            .map_err(|e| ctx(e.to_string()))?;
        let j = vol.array().journal_status().expect("journal");
        let counted = !finished && !lose;
        seen.drops += u64::from(counted);
        if j.state == "active" {
            seen.active += u64::from(counted);
            if j.checkpoints <= cps0 && !lose {
                return Err(ctx(format!(
                    "the journal's checkpoints never moved on: {j:?}"
                )));
            }
        } else {
            seen.poisoned += u64::from(counted);
            if finished {
                return Err(ctx("a write that completed poisoned the journal".into()));
            }
        }
        seen.reapplied += u64::from(lose && j.reapplied > 0);
        if lose {
            let before = poll_bounded(vol.read(0, size), POLLS)
                .map_err(ctx)?
                .map_err(|e| ctx(e.to_string()))?
                .to_vec();
            let dropped = crate::payload(200, wlen as usize);
            for (k, sector) in before[woff as usize..(woff + wlen) as usize]
                .chunks(512)
                .enumerate()
            {
                let o = k * 512;
                let old = &model.bytes[woff as usize + o..woff as usize + o + 512];
                if sector != old && sector != &dropped[o..o + 512] {
                    return Err(ctx(format!(
                        "sector {k} of the dropped write holds neither value"
                    )));
                }
            }
            model.write(woff, &before[woff as usize..(woff + wlen) as usize]);
            let m = vol.geometry().data_member(1, 1);
            poll_bounded(vol.array().fail_by_operator(m, true), POLLS)
                .map_err(ctx)?
                .map_err(|e| ctx(format!("failing member {m}: {e}")))?;
        }
        let live = poll_bounded(vol.read(0, size), POLLS)
            .map_err(ctx)?
            .map_err(|e| ctx(e.to_string()))?;
        if live.to_vec() != model.bytes {
            return Err(ctx("the running array reads back wrong".into()));
        }
        if lose {
            if finished {
                return Ok(seen);
            }
            continue;
        }
        clock.power_cut();
        drop(vol);
        let images = clock.images().expect("power was cut");
        for lost in std::iter::once(None).chain((0..members).map(Some)) {
            let present: Vec<bool> = (0..members).map(|i| Some(i) != lost).collect();
            let v = reassemble(&images, &present)
                .map_err(|e| ctx(format!("member {lost:?} out: reassembly: {e}")))?;
            for s in 0..size / sdb {
                let got = match block_on(v.read(s * sdb, sdb)) {
                    Ok(b) => b.to_vec(),
                    Err(uraid_engine::ArrayError::Unreadable { .. })
                        if j.state != "active"
                            && lost.is_some()
                            && v.array().stripe_unsynced(s) =>
                    {
                        continue
                    }
                    Err(e) => return Err(ctx(format!("member {lost:?} out, stripe {s}: {e}"))),
                };
                if got[..] != *model.read(s * sdb, sdb) {
                    return Err(ctx(format!(
                        "member {lost:?} out: stripe {s} reads back wrong after the cut"
                    )));
                }
            }
        }
    }
    unreachable!("the loop returns once the write completes")
}
