//! Fixtures the simulators and the engine tests share: in-memory arrays of any level and
//! member count (`mem_array`, with a journal: `mem_array_with_journal`), member images
//! (fresh, written, made dirty, with a new member), the flat reference model, seeded
//! payloads and ranges.

use crate::rng::Rng;
use crate::{Faults, MemDev};
use std::sync::Arc;
use uraid_core::format::{MemberState, Superblock, DATA_OFFSET, SB_SIZE, SB_SLOTS};
use uraid_core::{Geometry, Level};
use uraid_engine::array::WriteBuf;
use uraid_engine::{Array, ArrayOptions, ErrorPolicy, RuntimeHandle, Volume};

/// Options for in-memory test arrays: no watchdog thread (tests build thousands of arrays);
/// tests that exercise the timeout pass their own policy.
pub fn sim_options() -> ArrayOptions {
    ArrayOptions {
        policy: ErrorPolicy {
            io_timeout: None,
            ..ErrorPolicy::default()
        },
        frozen_metadata: false,
        no_discard: false,
        // No write plugging: its waits are wall-clock time, which would make the crash
        // simulator's trials depend on timing (the interaction simulator turns it on).
        merge_wait: std::time::Duration::ZERO,
        // No read-ahead: its prefetches are tasks of their own (the interaction simulator
        // turns it on).
        read_ahead: 0,
        read_ahead_always: false,
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
        replacement: false,
        replaces: vec![None; geometry.members],
        bitmap_chunk: sim_bitmap_chunk(&geometry),
        journal: None,
        bad: Default::default(),
        served: Default::default(),
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

/// Every member's bytes as reads see them (`member_bytes` of each slot).
pub fn member_images(vol: &Volume<MemDev>) -> Vec<Vec<u8>> {
    (0..vol.geometry().members)
        .map(|m| member_bytes(vol, m))
        .collect()
}

/// A device uuid for a new device (an add, a spare, a replacement) in tests, from `seed`
/// (version-4 style, so unlike `device_uuid`'s for arrays of up to 63 members).
pub fn new_device_uuid(seed: u64) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    u[8..].copy_from_slice(&(seed ^ 0xA5A5).to_le_bytes());
    u[6] = 0x40 | (u[6] & 0x0f);
    u
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
pub fn random_range(rng: &mut Rng, size: u64, max_sectors: u64) -> (u64, u64) {
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
    let mut rng = Rng::new(seed);
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

/// A volume of `rows` chunk rows written end to end with `payload(seed)` and stopped
/// cleanly: its member images and its contents.
pub fn written_whole(
    level: Level,
    members: usize,
    chunk: u64,
    rows: u64,
    seed: u64,
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let (vol, _) = mem_array(level, members, chunk, rows * chunk, None);
    let data = payload(seed, vol.size() as usize);
    futures::executor::block_on(vol.write(0, data.clone())).expect("write");
    futures::executor::block_on(vol.close()).expect("close");
    (member_images(&vol), data.to_vec())
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
