//! Test support for uraid: in-memory member devices with injectable faults (dead devices,
//! bad sectors, hangs, a volatile write cache that a simulated power cut partly loses), the
//! flat reference model, and helpers to build and reassemble arrays over them. Never used
//! by the product itself.

pub mod crash;
pub mod interaction;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use uraid_core::format::{MemberState, Superblock, DATA_OFFSET, SB_SIZE, SB_SLOTS};
use uraid_core::{Geometry, Level};
use uraid_engine::array::WriteBuf;
use uraid_engine::buf::IoBuf;
use uraid_engine::{Array, ArrayOptions, BlockDev, ErrorPolicy, RuntimeHandle, Volume};

/// Fault switch shared between a test and one device.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every operation fails with ENODEV (the device is gone) while set.
    pub dead: AtomicBool,
    /// When positive, counts operations down; the device dies when it reaches zero.
    pub die_after: AtomicI64,
    /// When set, every operation yields to the executor once before it touches the bytes, so
    /// other requests run in between, as they do while real I/O is in flight (memory
    /// otherwise completes synchronously and hides every interleaving).
    pub yield_ops: AtomicBool,
    /// Reads of bytes in `[bad_lo, bad_hi)` (device offsets) fail with EIO: bad sectors. A
    /// write over them repairs them (as a drive remaps a sector on write).
    bad: Mutex<Vec<(u64, u64)>>,
    /// While set, operations never complete (a hung device).
    pub hang: AtomicBool,
    /// Operations started (for tests that count member I/O).
    pub ops: AtomicU64,
    /// Writes to the metadata area (below the data offset) yield this many extra times: a
    /// slow map-page or superblock write, to widen a race window on purpose.
    pub slow_meta_writes: AtomicU64,
    /// Each write yields a pseudo-random 0..4 extra times, so concurrent writes to different
    /// members complete in different orders.
    pub jitter: AtomicBool,
    jitter_seq: AtomicU64,
    /// While set (`hold`), every operation waits before it touches the bytes until
    /// `release`: requests stay in flight as long as a test needs them to.
    pub held: AtomicBool,
    parked: Mutex<Vec<Waker>>,
}

impl Faults {
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    /// The device dies on its `ops`-th operation from now (1 = the next one).
    pub fn kill_after(&self, ops: i64) {
        self.die_after.store(ops, Ordering::SeqCst);
    }

    /// Marks device bytes `[lo, hi)` unreadable until written.
    pub fn bad_range(&self, lo: u64, hi: u64) {
        self.bad.lock().unwrap().push((lo, hi));
    }

    /// Operations from now on wait until `release`.
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Lets every held (and later) operation proceed.
    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        for w in self.parked.lock().unwrap().drain(..) {
            w.wake();
        }
    }

    async fn until_released(&self) {
        std::future::poll_fn(|cx| {
            if !self.held.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            self.parked.lock().unwrap().push(cx.waker().clone());
            // Released between the check and the push: its drain may have missed us.
            if self.held.load(Ordering::SeqCst) {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await
    }

    fn check(&self) -> io::Result<()> {
        self.ops.fetch_add(1, Ordering::SeqCst);
        if self.die_after.load(Ordering::SeqCst) > 0
            && self.die_after.fetch_sub(1, Ordering::SeqCst) == 1
        {
            self.kill();
        }
        if self.dead.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(libc_enodev()))
        } else {
            Ok(())
        }
    }

    fn check_read(&self, off: u64, len: u64) -> io::Result<()> {
        let bad = self.bad.lock().unwrap();
        if bad.iter().any(|&(lo, hi)| off < hi && lo < off + len) {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        Ok(())
    }

    fn repair(&self, off: u64, len: u64) {
        let mut bad = self.bad.lock().unwrap();
        // Whole sectors written are good again; partial overlaps keep the rest bad.
        let mut out = Vec::new();
        for &(lo, hi) in bad.iter() {
            if off < hi && lo < off + len {
                if lo < off {
                    out.push((lo, off));
                }
                if off + len < hi {
                    out.push((off + len, hi));
                }
            } else {
                out.push((lo, hi));
            }
        }
        *bad = out;
    }
}

fn libc_enodev() -> i32 {
    19
}

/// Returns Pending once (waking itself), then Ready: one trip through the executor.
async fn yield_once(on: bool) {
    let mut yielded = !on;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Pending until `hang` is cleared (polled again on every executor trip).
async fn wait_unhung(f: &Faults) {
    std::future::poll_fn(|cx| {
        if f.hang.load(Ordering::SeqCst) {
            // Re-poll later: a test that clears the flag (or a watchdog abort) moves on.
            let w = cx.waker().clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(5));
                w.wake();
            });
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await
}

/// The bytes of one device: what reads see, and (in cache mode) what survives a power cut.
pub(crate) struct DevState {
    pub(crate) data: Vec<u8>,
    /// Some: the device has a volatile write cache. `durable` is what the medium holds;
    /// `cache` the writes completed since the last flush, in completion order.
    pub(crate) durable: Option<Vec<u8>>,
    pub(crate) cache: Vec<(u64, Vec<u8>)>,
}

/// A member held in memory.
pub struct MemDev {
    name: String,
    pub(crate) state: Arc<Mutex<DevState>>,
    pub faults: Arc<Faults>,
    /// Power-cut clock shared by the devices of one crash trial.
    pub(crate) clock: Option<Arc<crash::Clock>>,
}

impl MemDev {
    pub fn new(name: impl Into<String>, size: usize) -> MemDev {
        MemDev::from_image(name, vec![0; size])
    }

    /// A device holding `image` (no write cache).
    pub fn from_image(name: impl Into<String>, image: Vec<u8>) -> MemDev {
        MemDev {
            name: name.into(),
            state: Arc::new(Mutex::new(DevState {
                data: image,
                durable: None,
                cache: Vec::new(),
            })),
            faults: Arc::new(Faults::default()),
            clock: None,
        }
    }

    /// Another handle on the same device (its bytes, faults and power clock): a test keeps
    /// one on a device it gives to an array.
    pub fn share(&self) -> MemDev {
        MemDev {
            name: self.name.clone(),
            state: self.state.clone(),
            faults: self.faults.clone(),
            clock: self.clock.clone(),
        }
    }

    /// A copy of the device's bytes as reads see them.
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.lock().unwrap().data.clone()
    }

    /// Ticks the power-cut clock; Err once the power is off.
    fn tick(&self) -> io::Result<()> {
        match &self.clock {
            Some(c) => c.tick(),
            None => Ok(()),
        }
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.state.lock().unwrap().data.len() as u64
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self, off: u64, mut buf: IoBuf) -> (io::Result<()>, IoBuf) {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.until_released().await;
        wait_unhung(&self.faults).await;
        let n = buf.len();
        if let Err(e) = self
            .tick()
            .and_then(|_| self.faults.check())
            .and_then(|_| self.faults.check_read(off, n as u64))
        {
            return (Err(e), buf);
        }
        let d = self.state.lock().unwrap();
        let o = off as usize;
        buf.copy_from_slice(&d.data[o..o + n]);
        (Ok(()), buf)
    }

    async fn write(&self, off: u64, buf: IoBuf) -> (io::Result<()>, IoBuf) {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.until_released().await;
        if self.faults.jitter.load(Ordering::Relaxed) {
            let n = self.faults.jitter_seq.fetch_add(1, Ordering::Relaxed);
            let salt = self.name.bytes().fold(0u64, |a, b| a * 31 + b as u64);
            let extra = (n ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61;
            for _ in 0..extra {
                yield_once(true).await;
            }
        }
        if off < DATA_OFFSET {
            for _ in 0..self.faults.slow_meta_writes.load(Ordering::Relaxed) {
                yield_once(true).await;
            }
        }
        wait_unhung(&self.faults).await;
        if let Err(e) = self.tick().and_then(|_| self.faults.check()) {
            return (Err(e), buf);
        }
        self.faults.repair(off, buf.len() as u64);
        let mut d = self.state.lock().unwrap();
        let o = off as usize;
        d.data[o..o + buf.len()].copy_from_slice(&buf);
        if d.durable.is_some() {
            d.cache.push((off, buf.to_vec()));
        }
        (Ok(()), buf)
    }

    async fn flush(&self) -> io::Result<()> {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        wait_unhung(&self.faults).await;
        self.tick().and_then(|_| self.faults.check())?;
        let mut d = self.state.lock().unwrap();
        let d = &mut *d;
        if let Some(durable) = d.durable.as_mut() {
            for (off, bytes) in d.cache.drain(..) {
                durable[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
            }
        }
        Ok(())
    }
}

/// Options for in-memory test arrays: no watchdog thread (tests build thousands of arrays);
/// tests that exercise the timeout pass their own policy.
pub fn sim_options() -> ArrayOptions {
    ArrayOptions {
        policy: ErrorPolicy {
            io_timeout: None,
            ..ErrorPolicy::default()
        },
        frozen_metadata: false,
    }
}

/// The superblock a fresh in-memory array starts from.
pub fn sim_superblock(geometry: Geometry) -> Superblock {
    Superblock {
        array_uuid: [1; 16],
        name: "sim".into(),
        geometry,
        index: 0,
        clean: true,
        spare: false,
        data_offset: DATA_OFFSET,
        events: 1,
        ctime: 0,
        utime: 0,
        device_uuid: [0; 16],
        states: vec![MemberState::Active; geometry.members],
        rebuilt: vec![0; geometry.members],
        slot_uuids: (0..geometry.members).map(device_uuid).collect(),
        bitmap_chunk: sim_bitmap_chunk(&geometry),
        journal: None,
    }
}

/// The journal uuid of in-memory arrays with a journal.
pub const SIM_JOURNAL_UUID: [u8; 16] = [0x4a; 16];

/// The write-intent bitmap region of in-memory arrays: two chunk rows, so that small trial
/// arrays have several regions and resync after a crash covers only some of them.
pub fn sim_bitmap_chunk(g: &Geometry) -> u64 {
    if g.fault_tolerance() == 0 {
        0
    } else {
        2 * g.chunk
    }
}

/// Member images of a freshly created array: superblocks in both slots, an empty
/// allocation map, and a data area full of garbage (not even parity-consistent), as on a
/// reused disk: the allocation map must keep every never-written byte reading as zero, and
/// no parity may ever be computed from stale bytes.
pub fn fresh_images(geometry: Geometry) -> Vec<Vec<u8>> {
    fresh_images_with(geometry, None)
}

/// `fresh_images` of an array whose superblock records a journal in `mode` (the journal
/// device itself: `journal_image`).
pub fn fresh_images_with(
    geometry: Geometry,
    journal: Option<uraid_core::format::JournalMode>,
) -> Vec<Vec<u8>> {
    let mut sb = sim_superblock(geometry);
    sb.journal = journal.map(|m| (SIM_JOURNAL_UUID, m));
    let map = uraid_engine::alloc::empty_map_image(&geometry);
    (0..geometry.members)
        .map(|i| {
            let mut img = vec![0u8; (DATA_OFFSET + geometry.member_data) as usize];
            sb.index = i;
            sb.device_uuid = device_uuid(i);
            for slot in 0..SB_SLOTS {
                img[slot * SB_SIZE..(slot + 1) * SB_SIZE].copy_from_slice(&sb.encode());
            }
            let mo = uraid_core::alloc::MAP_OFFSET as usize;
            img[mo..mo + map.len()].copy_from_slice(&map);
            let bo = uraid_core::bitmap::BITMAP_OFFSET as usize;
            let bm = uraid_core::bitmap::empty_image(&geometry, sb.bitmap_chunk);
            img[bo..bo + bm.len()].copy_from_slice(&bm);
            let junk = payload(0xdead_0000 + i as u64, geometry.member_data as usize);
            img[DATA_OFFSET as usize..].copy_from_slice(&junk);
            img
        })
        .collect()
}

/// A formatted, empty journal device of `size` bytes for the array `sim_superblock` makes
/// (garbage in its log area, as on a reused disk).
pub fn journal_image(size: usize) -> Vec<u8> {
    let d = MemDev::from_image("journal", payload(0x10a1, size).to_vec());
    uraid_engine::journal::format_journal(&d, [1; 16], SIM_JOURNAL_UUID)
        .expect("in-memory journal formats");
    d.snapshot()
}

pub fn device_uuid(i: usize) -> [u8; 16] {
    [i as u8 + 1; 16]
}

/// Identities of fresh in-memory members (both superblock slots hold the same superblock).
pub fn sim_ids(n: usize) -> Vec<uraid_engine::MemberId> {
    (0..n)
        .map(|i| uraid_engine::MemberId {
            uuid: device_uuid(i),
            sb_slot: 0,
            events: 1,
        })
        .collect()
}

/// A new volume over fresh in-memory members (allocation map empty, as after `create`), plus
/// each member's fault switch.
pub fn mem_array(
    level: Level,
    members: usize,
    chunk: u64,
    member_data: u64,
    rt: Option<RuntimeHandle>,
) -> (Arc<Volume<MemDev>>, Vec<Arc<Faults>>) {
    mem_array_with(level, members, chunk, member_data, rt, sim_options())
}

/// `mem_array` with explicit options.
pub fn mem_array_with(
    level: Level,
    members: usize,
    chunk: u64,
    member_data: u64,
    rt: Option<RuntimeHandle>,
    opts: ArrayOptions,
) -> (Arc<Volume<MemDev>>, Vec<Arc<Faults>>) {
    let (vol, faults, _) = build_mem(level, members, chunk, member_data, rt, opts, None);
    (vol, faults)
}

/// `mem_array_with` on a parity level, with a journal device in `mode` (a fresh in-memory
/// one of 4 MiB): the volume, the members' fault switches and the journal's.
pub fn mem_array_with_journal(
    level: Level,
    members: usize,
    chunk: u64,
    member_data: u64,
    rt: Option<RuntimeHandle>,
    opts: ArrayOptions,
    mode: uraid_core::format::JournalMode,
) -> JournalledArray {
    let (vol, faults, j) = build_mem(level, members, chunk, member_data, rt, opts, Some(mode));
    (vol, faults, j.expect("journal built"))
}

/// A volume, its members' fault switches and its journal's.
pub type JournalledArray = (Arc<Volume<MemDev>>, Vec<Arc<Faults>>, Arc<Faults>);
type Built = (Arc<Volume<MemDev>>, Vec<Arc<Faults>>, Option<Arc<Faults>>);

/// A fresh in-memory array, with a journal in `journal` mode if given.
fn build_mem(
    level: Level,
    members: usize,
    chunk: u64,
    member_data: u64,
    rt: Option<RuntimeHandle>,
    opts: ArrayOptions,
    journal: Option<uraid_core::format::JournalMode>,
) -> Built {
    let geometry = Geometry::new(level, members, chunk, member_data).expect("valid test geometry");
    let devs: Vec<MemDev> = fresh_images_with(geometry, journal)
        .into_iter()
        .enumerate()
        .map(|(i, img)| MemDev::from_image(format!("mem{i}"), img))
        .collect();
    let faults = devs.iter().map(|d| d.faults.clone()).collect();
    let mut sb = sim_superblock(geometry);
    sb.journal = journal.map(|m| (SIM_JOURNAL_UUID, m));
    let jdev = journal.map(|_| MemDev::from_image("journal", journal_image(4 << 20)));
    let jfaults = jdev.as_ref().map(|d| d.faults.clone());
    let array = Array::new(
        sb.clone(),
        sim_ids(members),
        devs.into_iter().map(Some).collect(),
        rt,
        opts,
        // A fresh array: its bitmap is known to be empty.
        Some(Vec::new()),
    );
    if let (Some(d), Some(mode)) = (jdev, journal) {
        let jsb = uraid_engine::journal::check_journal(&d, &sb).expect("fresh journal");
        array.attach_journal(uraid_engine::journal::Journal::new(d, mode, jsb, 0));
    }
    (Volume::new(array, Some(Vec::new())), faults, jfaults)
}

/// Member `m`'s bytes as reads see them (to compare mirror copies, parity, ...).
pub fn member_bytes(vol: &Volume<MemDev>, m: usize) -> Vec<u8> {
    vol.array()
        .member_dev(m)
        .map(|d| d.snapshot())
        .unwrap_or_default()
}

/// Replaces member `slot` of an array's member images by a new member being rebuilt, as
/// `uraid add` does on files (`assemble::with_new_member`, events + 1 everywhere): the new
/// image holds the array metadata copied from another member, and `fill` in its data area
/// (a read that used it before the rebuild passed would show).
pub fn add_member_images(images: &mut [Vec<u8>], slot: usize, fill: u8) {
    use uraid_core::format::pick_superblock;
    let sbs: Vec<Superblock> = images
        .iter()
        .map(|img| {
            pick_superblock(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE]).expect("member image")
        })
        .collect();
    let best = sbs
        .iter()
        .max_by_key(|s| s.events)
        .expect("members")
        .clone();
    let new_uuid = [0xA0 ^ slot as u8; 16];
    let mut sb = uraid_engine::assemble::with_new_member(&best, slot, new_uuid);
    sb.events += 1;
    let meta_at = SB_SIZE * SB_SLOTS;
    let donor = (slot + 1) % images.len();
    let meta = images[donor][meta_at..DATA_OFFSET as usize].to_vec();
    images[slot].fill(fill);
    images[slot][meta_at..DATA_OFFSET as usize].copy_from_slice(&meta);
    for (i, img) in images.iter_mut().enumerate() {
        let mut m = sb.clone();
        m.index = i;
        m.device_uuid = if i == slot {
            new_uuid
        } else {
            sbs[i].device_uuid
        };
        let b = m.encode();
        for s in 0..SB_SLOTS {
            img[s * SB_SIZE..(s + 1) * SB_SIZE].copy_from_slice(&b);
        }
    }
}

/// Marks every member's superblocks "not clean" and every write-intent region dirty (what
/// a power cut during writes everywhere leaves).
pub fn make_dirty(images: &mut [Vec<u8>]) {
    make_dirty_regions(images, |_| true)
}

/// Marks every member's superblocks "not clean" and the bitmap regions `dirty` picks set.
pub fn make_dirty_regions(images: &mut [Vec<u8>], dirty: impl Fn(u64) -> bool) {
    for img in images.iter_mut() {
        let (mut sb, _) =
            uraid_core::format::pick_superblock_slot(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE])
                .unwrap();
        sb.clean = false;
        for slot in 0..2 {
            img[slot * SB_SIZE..(slot + 1) * SB_SIZE].copy_from_slice(&sb.encode());
        }
        let (g, bc) = (sb.geometry, sb.bitmap_chunk);
        assert!(bc > 0, "sim arrays have a bitmap");
        let bo = uraid_core::bitmap::BITMAP_OFFSET as usize;
        for p in 0..uraid_core::bitmap::pages(&g, bc) {
            let page = uraid_core::bitmap::page_image(&g, bc, p, &dirty);
            img[bo + p * 4096..bo + (p + 1) * 4096].copy_from_slice(&page);
        }
    }
}

/// The flat reference model: what the volume must read back.
pub struct Model {
    pub bytes: Vec<u8>,
}

impl Model {
    pub fn new(size: u64) -> Model {
        Model {
            bytes: vec![0; size as usize],
        }
    }

    pub fn write(&mut self, off: u64, data: &[u8]) {
        self.bytes[off as usize..off as usize + data.len()].copy_from_slice(data);
    }

    pub fn read(&self, off: u64, len: u64) -> &[u8] {
        &self.bytes[off as usize..(off + len) as usize]
    }
}

/// A random sector-aligned range of 1 to `max_sectors` sectors inside a volume of `size`
/// bytes.
pub fn random_range(rng: &mut crash::Rng, size: u64, max_sectors: u64) -> (u64, u64) {
    let len = (1 + rng.below(max_sectors)) * 512;
    let off = rng.below((size - len) / 512) * 512;
    (off, len)
}

/// A volume written at `writes` random ranges (up to 24 sectors each) and stopped cleanly:
/// its member images and the model.
pub fn written_images(
    level: Level,
    members: usize,
    chunk: u64,
    rows: u64,
    writes: u64,
    seed: u64,
) -> (Vec<Vec<u8>>, Model) {
    let (vol, _) = mem_array(level, members, chunk, rows * chunk, None);
    let mut model = Model::new(vol.size());
    let mut rng = crash::Rng::new(seed);
    futures::executor::block_on(async {
        for i in 0..writes {
            let (off, len) = random_range(&mut rng, vol.size(), 24);
            let data = payload(seed * 1000 + i, len as usize);
            vol.write(off, data.clone()).await.expect("write");
            model.write(off, &data);
        }
        vol.close().await.expect("close");
    });
    let images = (0..members).map(|m| member_bytes(&vol, m)).collect();
    (images, model)
}

/// The whole volume, read in one request.
pub fn read_all(vol: &Volume<MemDev>) -> Vec<u8> {
    futures::executor::block_on(vol.read(0, vol.size()))
        .expect("read")
        .to_vec()
}

/// Deterministic pseudo-random payload for a write.
pub fn payload(seed: u64, len: usize) -> WriteBuf {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut b = uraid_engine::buf::alloc(len);
    for v in b.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = x as u8;
    }
    WriteBuf::from(b)
}
