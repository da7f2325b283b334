//! The on-disk superblock: one 4 KiB block at offset 0 of every member.
//! docs/format.md documents every byte; a test there-in checks the offsets below.
//!
//! All integers little-endian. Bytes read from disk are untrusted: `Superblock::decode` checks
//! magic, version, crc32c and every field's range before anything else uses them.

use crate::badblocks::{BadBlocks, BadRange, MAX_BAD_RANGES};
use crate::codec::MAX_SHARDS;
use crate::geometry::{Geometry, GeometryError, Level};
use crate::members::MemberSet;

pub const SB_SIZE: usize = 4096;
pub const MAGIC: [u8; 8] = *b"uraid-sb";
pub const VERSION: u32 = 8;
/// Version 3 (before the write-intent bitmap) is read as version 6 with no bitmap and no
/// journal, version 4 (before the journal device) as version 6 with no journal, version 5
/// (before rebuild) with no slot device uuids and no member rebuilding; the next superblock
/// round writes version 6.
pub const VERSION_NO_BITMAP: u32 = 3;
pub const VERSION_NO_JOURNAL: u32 = 4;
pub const VERSION_NO_REBUILD: u32 = 5;
/// Version 6 (before bad-block lists) is read as version 7 with no bad blocks.
pub const VERSION_NO_BADBLOCKS: u32 = 6;
/// Version 6 (before persisted replaces) is read as version 7 with no replace in progress.
pub const VERSION_NO_REPLACE: u32 = 6;
/// Version 7 (before the served set) is read as version 8 with no slot recorded as having
/// served reads while the array was out of sync.
pub const VERSION_NO_SERVED: u32 = 7;
/// Superblock slots: rounds alternate between the copy at offset 0 and the one at 4096
/// (slot = events % 2), so a torn round leaves the previous superblock intact.
pub const SB_SLOTS: usize = 2;
/// Start of the data area on every member. Between the superblock slots and the allocation
/// map (crate::alloc, from 64 KiB) lies the write-intent bitmap (crate::bitmap).
pub const DATA_OFFSET: u64 = 1 << 20;
pub const NAME_LEN: usize = 32;

pub mod off {
    //! Byte offsets of every superblock field (docs/format.md).
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const SB_SIZE: usize = 12;
    pub const ARRAY_UUID: usize = 16;
    pub const NAME: usize = 32;
    pub const LEVEL: usize = 64;
    pub const PARITY: usize = 68;
    pub const CHUNK: usize = 72;
    pub const MEMBERS: usize = 76;
    pub const INDEX: usize = 80;
    pub const FLAGS: usize = 84;
    pub const DATA_OFFSET: usize = 88;
    pub const MEMBER_DATA: usize = 96;
    pub const VOLUME_SIZE: usize = 104;
    pub const EVENTS: usize = 112;
    pub const CTIME: usize = 120;
    pub const UTIME: usize = 128;
    pub const DEVICE_UUID: usize = 136;
    pub const BITMAP_CHUNK: usize = 152;
    pub const JOURNAL_UUID: usize = 160;
    pub const JOURNAL_MODE: usize = 176;
    /// Version 8: slots (bit i) whose device may have served reads since the array was
    /// last in sync, u64 (`Superblock::served`).
    pub const SERVED: usize = 184;
    pub const STATES: usize = 256;
    /// Per slot: units (stripes, mirror rows) a rebuilding member holds, u64 each.
    pub const REBUILT: usize = 512;
    /// Per slot: the device uuid of the member in it (all zero: not known, version 5).
    pub const SLOT_UUIDS: usize = 1024;
    // ---- bad-block list (version 7; crate::badblocks) ----
    /// Number of bad ranges that follow, u32 (at most `MAX_BAD_RANGES`).
    pub const BAD_COUNT: usize = 3584;
    /// Bad ranges, 16 bytes each: first unit u64, units u32, member slot u32.
    pub const BAD_RANGES: usize = 3592;
    pub const BAD_RANGE_SIZE: usize = 16;
    // ---- end of the bad-block list ----
    pub use super::replace_off::*;
    pub const CRC: usize = 4092;
}

// ---- Persisted replace (version 7; docs/format.md, "Replace in progress") -------------------
// Kept apart from the fields above: a replace under way (`uraid replace`) is recorded per slot
// as the replacement's device uuid and its copy checkpoint.

pub mod replace_off {
    //! Byte offsets of the replace fields (version 7).
    /// Per slot: the device uuid of the replacement being copied for that slot's member
    /// (all zero: no replace), 16 bytes each.
    pub const REPLACE_UUIDS: usize = 2048;
    /// Per slot: units of the slot the replacement holds (copied and flushed), from unit 0,
    /// u64 each; 0 without a replace.
    pub const REPLACE_COPIED: usize = 3072;
}

/// Flag (version 7): this device is the replacement being copied for slot `index` (not a
/// member, not a spare). Its superblock is otherwise a copy of the array's when the replace
/// started; assembly uses it only if the array's superblock records a replace of that slot
/// by this `device_uuid`.
pub const FLAG_REPLACEMENT: u32 = 4;

/// A replace in progress (`Superblock::replaces`): the replacement's device uuid and the
/// units of the slot it holds (copied, then flushed, before this was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplaceRecord {
    pub uuid: [u8; 16],
    pub copied: u64,
}

/// Encodes the replace fields of `sb` into `b`.
fn encode_replaces(sb: &Superblock, b: &mut [u8; SB_SIZE]) {
    use replace_off::*;
    for (i, r) in sb.replaces.iter().enumerate() {
        let Some(r) = r else { continue };
        b[REPLACE_UUIDS + 16 * i..REPLACE_UUIDS + 16 * (i + 1)].copy_from_slice(&r.uuid);
        b[REPLACE_COPIED + 8 * i..REPLACE_COPIED + 8 * (i + 1)]
            .copy_from_slice(&r.copied.to_le_bytes());
    }
}

/// Decodes and checks the replace fields (version 7; earlier versions: none). A record is
/// valid only on an active slot of a level with redundancy, naming a device that is neither
/// the slot's member nor `REMOVED_SLOT`, with a checkpoint at most the array's units; a
/// slot without one has a zero checkpoint.
fn decode_replaces(
    b: &[u8],
    version: u32,
    geometry: &Geometry,
    states: &[MemberState],
    slot_uuids: &[[u8; 16]],
) -> Result<Vec<Option<ReplaceRecord>>, FormatError> {
    use replace_off::*;
    let members = states.len();
    let mut v = vec![None; members];
    if version <= VERSION_NO_REPLACE {
        return Ok(v);
    }
    let units = geometry.units();
    for i in 0..members {
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[REPLACE_UUIDS + 16 * i..REPLACE_UUIDS + 16 * (i + 1)]);
        let copied = u64_at(b, REPLACE_COPIED + 8 * i);
        if uuid == [0; 16] {
            if copied != 0 {
                return Err(field(
                    "replace_copied",
                    format!("slot {i} has copy checkpoint {copied} and no replacement"),
                ));
            }
            continue;
        }
        let why = if geometry.fault_tolerance() == 0 {
            Some(format!("{} has no redundancy", geometry.level))
        } else if states[i] != MemberState::Active {
            Some(format!("slot {i} is {:?}, not active", states[i]))
        } else if uuid == REMOVED_SLOT || uuid == slot_uuids[i] {
            Some(format!(
                "slot {i}'s replacement {} is not a new device",
                uuid_string(&uuid)
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(field("replace_uuids", why));
        }
        if copied > units {
            return Err(field(
                "replace_copied",
                format!("slot {i} has copy checkpoint {copied} (the array has {units} units)"),
            ));
        }
        v[i] = Some(ReplaceRecord { uuid, copied });
    }
    Ok(v)
}

// ---- end of the persisted replace ----------------------------------------------------------

pub const FLAG_CLEAN: u32 = 1;
/// A hot spare of the array (version 6): no slot; it takes over a failed member's slot
/// while serving. Its superblock is otherwise a copy of the array's when it was added.
pub const FLAG_SPARE: u32 = 2;
/// `slot_uuids` entry of a slot whose member was removed (`uraid remove`): no device carries
/// it (a random version-4 uuid never has every bit set), so the old member is refused and
/// the slot assembles as missing until a new member is added.
pub const REMOVED_SLOT: [u8; 16] = [0xff; 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Active = 0,
    Failed = 1,
    /// A new member being rebuilt: it holds the units below `Superblock::rebuilt[i]` (the
    /// persisted rebuild checkpoint); the rest is reconstructed from the other members.
    Rebuilding = 2,
}

/// How the array uses its journal device (`Superblock::journal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalMode {
    /// Every stripe update is logged before the members are written; FLUSH still flushes the
    /// members. Closes the write hole.
    WriteThrough = 1,
    /// As write-through, and FLUSH/FUA are satisfied by the journal (durable before the
    /// member writes); members are flushed when the journal is checkpointed.
    WriteBack = 2,
}

impl JournalMode {
    pub fn name(self) -> &'static str {
        match self {
            JournalMode::WriteThrough => "write-through",
            JournalMode::WriteBack => "write-back",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub array_uuid: [u8; 16],
    pub name: String,
    pub geometry: Geometry,
    pub index: usize,
    pub clean: bool,
    /// This device is a hot spare of the array (FLAG_SPARE), not the member in `index`.
    pub spare: bool,
    pub data_offset: u64,
    pub events: u64,
    pub ctime: u64,
    pub utime: u64,
    pub device_uuid: [u8; 16],
    pub states: Vec<MemberState>,
    /// Per slot: the rebuild checkpoint of a rebuilding member (units it holds, from 0);
    /// 0 for every other state.
    pub rebuilt: Vec<u64>,
    /// Per slot: the device uuid of its member; all zero when not known (superblocks
    /// written before version 6). Assembly refuses a device with another uuid for the slot
    /// (a replaced member coming back).
    pub slot_uuids: Vec<[u8; 16]>,
    /// This device is the replacement being copied for slot `index` (FLAG_REPLACEMENT).
    pub replacement: bool,
    /// Per slot: the replace in progress (version 7); None for every slot before.
    pub replaces: Vec<Option<ReplaceRecord>>,
    /// Write-intent bitmap region size in member data-area bytes; 0: no bitmap.
    pub bitmap_chunk: u64,
    /// The journal device (its uuid) and mode; None: no journal.
    pub journal: Option<([u8; 16], JournalMode)>,
    /// Every slot's bad-block list (version 7; empty before).
    pub bad: BadBlocks,
    /// Version 8: the slots whose device may have served client reads since the array was
    /// last in sync (an unclean stop with resync still due). A read may have returned a
    /// torn write's bytes that only that device held, so no later session may decode that
    /// slot's chunks of a stripe not yet resynced as if the other members' agreement
    /// settled them (docs/format.md, "Served while out of sync"). Empty on a clean array.
    pub served: MemberSet,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("no uraid superblock (bad magic)")]
    BadMagic,
    #[error("unsupported superblock version {0} (this uraid reads versions {VERSION_NO_BITMAP} to {VERSION})")]
    Version(u32),
    #[error("superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("superblock field {field} is invalid: {why}")]
    Field { field: &'static str, why: String },
    #[error("superblock geometry is invalid: {0}")]
    Geometry(#[from] GeometryError),
    #[error("buffer holds {0} bytes, a superblock needs {SB_SIZE}")]
    Short(usize),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4-byte slice"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8-byte slice"))
}

fn field(field: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::Field {
        field,
        why: why.into(),
    }
}

impl Superblock {
    pub fn is_failed(&self, member: usize) -> bool {
        self.states.get(member) == Some(&MemberState::Failed)
    }

    /// The slot's member was removed (`REMOVED_SLOT`): it is failed with no device.
    pub fn is_removed(&self, member: usize) -> bool {
        self.slot_uuids.get(member) == Some(&REMOVED_SLOT)
    }

    pub fn is_rebuilding(&self, member: usize) -> bool {
        self.states.get(member) == Some(&MemberState::Rebuilding)
    }

    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        let g = &self.geometry;
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
        b[off::VERSION..off::VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[off::SB_SIZE..off::SB_SIZE + 4].copy_from_slice(&(SB_SIZE as u32).to_le_bytes());
        b[off::ARRAY_UUID..off::ARRAY_UUID + 16].copy_from_slice(&self.array_uuid);
        let name = self.name.as_bytes();
        let n = name.len().min(NAME_LEN);
        b[off::NAME..off::NAME + n].copy_from_slice(&name[..n]);
        let put32 =
            |b: &mut [u8; SB_SIZE], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        let put64 =
            |b: &mut [u8; SB_SIZE], o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        put32(&mut b, off::LEVEL, g.level.code());
        put32(&mut b, off::PARITY, g.level.parity() as u32);
        put32(&mut b, off::CHUNK, g.chunk as u32);
        put32(&mut b, off::MEMBERS, g.members as u32);
        put32(&mut b, off::INDEX, self.index as u32);
        put32(
            &mut b,
            off::FLAGS,
            if self.clean { FLAG_CLEAN } else { 0 }
                | if self.spare { FLAG_SPARE } else { 0 }
                | if self.replacement {
                    FLAG_REPLACEMENT
                } else {
                    0
                },
        );
        put64(&mut b, off::DATA_OFFSET, self.data_offset);
        put64(&mut b, off::MEMBER_DATA, g.member_data);
        put64(&mut b, off::VOLUME_SIZE, g.volume_size());
        put64(&mut b, off::EVENTS, self.events);
        put64(&mut b, off::CTIME, self.ctime);
        put64(&mut b, off::UTIME, self.utime);
        put64(&mut b, off::BITMAP_CHUNK, self.bitmap_chunk);
        if let Some((uuid, mode)) = self.journal {
            b[off::JOURNAL_UUID..off::JOURNAL_UUID + 16].copy_from_slice(&uuid);
            put32(&mut b, off::JOURNAL_MODE, mode as u32);
        }
        b[off::DEVICE_UUID..off::DEVICE_UUID + 16].copy_from_slice(&self.device_uuid);
        for (i, s) in self.states.iter().enumerate() {
            b[off::STATES + i] = *s as u8;
        }
        for (i, r) in self.rebuilt.iter().enumerate() {
            put64(&mut b, off::REBUILT + 8 * i, *r);
        }
        for (i, u) in self.slot_uuids.iter().enumerate() {
            b[off::SLOT_UUIDS + 16 * i..off::SLOT_UUIDS + 16 * (i + 1)].copy_from_slice(u);
        }
        let bad = self.bad.ranges();
        put32(&mut b, off::BAD_COUNT, bad.len() as u32);
        for (i, r) in bad.iter().enumerate() {
            let o = off::BAD_RANGES + off::BAD_RANGE_SIZE * i;
            put64(&mut b, o, r.start);
            put32(&mut b, o + 8, r.len as u32);
            put32(&mut b, o + 12, r.member as u32);
        }
        encode_replaces(self, &mut b);
        put64(&mut b, off::SERVED, self.served.bits());
        let crc = crc32c::crc32c(&b[..off::CRC]);
        put32(&mut b, off::CRC, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        if b.len() < SB_SIZE {
            return Err(FormatError::Short(b.len()));
        }
        let b = &b[..SB_SIZE];
        if b[..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        let version = u32_at(b, off::VERSION);
        if !(VERSION_NO_BITMAP..=VERSION).contains(&version) {
            return Err(FormatError::Version(version));
        }
        let stored = u32_at(b, off::CRC);
        let computed = crc32c::crc32c(&b[..off::CRC]);
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        if u32_at(b, off::SB_SIZE) as usize != SB_SIZE {
            return Err(field(
                "sb_size",
                format!("{} != {SB_SIZE}", u32_at(b, off::SB_SIZE)),
            ));
        }
        let name_raw = &b[off::NAME..off::NAME + NAME_LEN];
        let name_len = name_raw.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        let name = std::str::from_utf8(&name_raw[..name_len])
            .map_err(|_| field("name", "not UTF-8"))?
            .to_string();
        let level =
            Level::from_code(u32_at(b, off::LEVEL), u32_at(b, off::PARITY)).ok_or_else(|| {
                field(
                    "level",
                    format!(
                        "code {} parity {}",
                        u32_at(b, off::LEVEL),
                        u32_at(b, off::PARITY)
                    ),
                )
            })?;
        let members = u32_at(b, off::MEMBERS) as usize;
        if members == 0 || members > MAX_SHARDS {
            return Err(field(
                "members",
                format!("{members} not in 1..={MAX_SHARDS}"),
            ));
        }
        let index = u32_at(b, off::INDEX) as usize;
        if index >= members {
            return Err(field("index", format!("{index} >= members {members}")));
        }
        let chunk = u32_at(b, off::CHUNK) as u64;
        let member_data = u64_at(b, off::MEMBER_DATA);
        let geometry = Geometry::new(level, members, chunk, member_data)?;
        if geometry.member_data != member_data {
            return Err(field(
                "member_data",
                format!("{member_data} is not a multiple of chunk {chunk}"),
            ));
        }
        let volume = u64_at(b, off::VOLUME_SIZE);
        if volume != geometry.volume_size() {
            return Err(field(
                "volume_size",
                format!("{volume} != {} implied by geometry", geometry.volume_size()),
            ));
        }
        let data_offset = u64_at(b, off::DATA_OFFSET);
        // The data area must start past the superblock slots and the allocation map.
        if data_offset < DATA_OFFSET
            || !data_offset.is_multiple_of(4096)
            || data_offset.checked_add(member_data).is_none()
        {
            return Err(field(
                "data_offset",
                format!("{data_offset} not 4 KiB aligned at or past {DATA_OFFSET} (the map's end)"),
            ));
        }
        let flags = u32_at(b, off::FLAGS);
        let known = if version > VERSION_NO_REPLACE {
            FLAG_CLEAN | FLAG_SPARE | FLAG_REPLACEMENT
        } else if version > VERSION_NO_REBUILD {
            FLAG_CLEAN | FLAG_SPARE
        } else {
            FLAG_CLEAN
        };
        if flags & !known != 0 {
            return Err(field("flags", format!("unknown bits {flags:#x}")));
        }
        if flags & FLAG_SPARE != 0 && flags & FLAG_REPLACEMENT != 0 {
            return Err(field("flags", "both a spare and a replacement"));
        }
        let mut states = Vec::with_capacity(members);
        for i in 0..members {
            states.push(match b[off::STATES + i] {
                0 => MemberState::Active,
                1 => MemberState::Failed,
                2 if version > VERSION_NO_REBUILD && geometry.fault_tolerance() > 0 => {
                    MemberState::Rebuilding
                }
                s => return Err(field("member_states", format!("member {i} has state {s}"))),
            });
        }
        let mut rebuilt = vec![0u64; members];
        let mut slot_uuids = vec![[0u8; 16]; members];
        if version > VERSION_NO_REBUILD {
            let units = geometry.units();
            for i in 0..members {
                let r = u64_at(b, off::REBUILT + 8 * i);
                let ok = if states[i] == MemberState::Rebuilding {
                    r <= units
                } else {
                    r == 0
                };
                if !ok {
                    return Err(field(
                        "rebuilt",
                        format!(
                            "member {i} ({:?}) has rebuild checkpoint {r} (the array has {units}                              units)",
                            states[i]
                        ),
                    ));
                }
                rebuilt[i] = r;
                slot_uuids[i]
                    .copy_from_slice(&b[off::SLOT_UUIDS + 16 * i..off::SLOT_UUIDS + 16 * (i + 1)]);
            }
        }
        let replaces = decode_replaces(b, version, &geometry, &states, &slot_uuids)?;
        let bitmap_chunk = if version == VERSION_NO_BITMAP {
            0
        } else {
            u64_at(b, off::BITMAP_CHUNK)
        };
        crate::bitmap::check_chunk(&geometry, bitmap_chunk)
            .map_err(|e| field("bitmap_chunk", e))?;
        let journal = if version <= VERSION_NO_JOURNAL {
            None
        } else {
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&b[off::JOURNAL_UUID..off::JOURNAL_UUID + 16]);
            match u32_at(b, off::JOURNAL_MODE) {
                0 if uuid == [0; 16] => None,
                1 if level.is_parity() => Some((uuid, JournalMode::WriteThrough)),
                2 if level.is_parity() => Some((uuid, JournalMode::WriteBack)),
                m => {
                    return Err(field(
                        "journal_mode",
                        format!("mode {m} (journal {}) on {level}", uuid_string(&uuid)),
                    ))
                }
            }
        };
        let bad = if version <= VERSION_NO_BADBLOCKS {
            BadBlocks::default()
        } else {
            decode_bad(b, members, geometry.units())?
        };
        let served = if version <= VERSION_NO_SERVED {
            MemberSet::EMPTY
        } else {
            decode_served(u64_at(b, off::SERVED), members, flags & FLAG_CLEAN != 0)?
        };
        let mut array_uuid = [0u8; 16];
        array_uuid.copy_from_slice(&b[off::ARRAY_UUID..off::ARRAY_UUID + 16]);
        let mut device_uuid = [0u8; 16];
        device_uuid.copy_from_slice(&b[off::DEVICE_UUID..off::DEVICE_UUID + 16]);
        Ok(Superblock {
            array_uuid,
            name,
            geometry,
            index,
            clean: flags & FLAG_CLEAN != 0,
            spare: flags & FLAG_SPARE != 0,
            replacement: flags & FLAG_REPLACEMENT != 0,
            data_offset,
            events: u64_at(b, off::EVENTS),
            ctime: u64_at(b, off::CTIME),
            utime: u64_at(b, off::UTIME),
            device_uuid,
            states,
            rebuilt,
            slot_uuids,
            replaces,
            bitmap_chunk,
            journal,
            bad,
            served,
        })
    }
}

/// The served set of a version 8 superblock: only slots of the array, and none on a clean
/// one (a clean stop means every stripe is in sync).
fn decode_served(bits: u64, members: usize, clean: bool) -> Result<MemberSet, FormatError> {
    let set = MemberSet::from_bits(bits);
    if members < 64 && bits >> members != 0 {
        return Err(field(
            "served",
            format!("{bits:#x} names slots past the array's {members}"),
        ));
    }
    if clean && !set.is_empty() {
        return Err(field(
            "served",
            format!("{set} on a superblock marked clean"),
        ));
    }
    Ok(set)
}

/// The bad-block list of a version 7 superblock, checked (`BadBlocks::check`).
fn decode_bad(b: &[u8], members: usize, units: u64) -> Result<BadBlocks, FormatError> {
    let n = u32_at(b, off::BAD_COUNT) as usize;
    if n > MAX_BAD_RANGES {
        return Err(field("bad_count", format!("{n} > {MAX_BAD_RANGES}")));
    }
    let ranges: Vec<BadRange> = (0..n)
        .map(|i| {
            let o = off::BAD_RANGES + off::BAD_RANGE_SIZE * i;
            BadRange {
                start: u64_at(b, o),
                len: u32_at(b, o + 8) as u64,
                member: u32_at(b, o + 12) as usize,
            }
        })
        .collect();
    BadBlocks::check(&ranges, members, units).map_err(|e| field("bad_ranges", e))?;
    Ok(BadBlocks::from_ranges(ranges))
}

/// The superblock of a member from its two slots (`SB_SLOTS`): the valid one with the
/// higher event count. If neither is valid, slot 0's error.
pub fn pick_superblock(slot0: &[u8], slot1: &[u8]) -> Result<Superblock, FormatError> {
    pick_superblock_slot(slot0, slot1).map(|(sb, _)| sb)
}

/// Like `pick_superblock`, also saying which slot (0 or 1) it came from.
pub fn pick_superblock_slot(
    slot0: &[u8],
    slot1: &[u8],
) -> Result<(Superblock, usize), FormatError> {
    match (Superblock::decode(slot0), Superblock::decode(slot1)) {
        (Ok(a), Ok(b)) => Ok(if b.events > a.events { (b, 1) } else { (a, 0) }),
        (Ok(a), Err(_)) => Ok((a, 0)),
        (Err(_), Ok(b)) => Ok((b, 1)),
        (Err(e), Err(_)) => Err(e),
    }
}

/// Formats a 16-byte UUID the usual 8-4-4-4-12 way.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            array_uuid: [7; 16],
            name: "vol0".into(),
            geometry: Geometry::new(Level::Raid6, 10, 65536, 1 << 30).unwrap(),
            index: 3,
            clean: true,
            spare: false,
            data_offset: DATA_OFFSET,
            events: 42,
            ctime: 1_700_000_000,
            utime: 1_700_000_001,
            device_uuid: [9; 16],
            states: vec![MemberState::Active; 10],
            rebuilt: vec![0; 10],
            slot_uuids: (0..10).map(|i| [i as u8 + 1; 16]).collect(),
            replacement: false,
            // One replace under way, so the mutation tests reach its fields.
            replaces: (0..10)
                .map(|i| {
                    (i == 7).then_some(ReplaceRecord {
                        uuid: [0x77; 16],
                        copied: 3,
                    })
                })
                .collect(),
            bitmap_chunk: 64 << 20,
            journal: Some(([5; 16], JournalMode::WriteBack)),
            bad: BadBlocks::from_ranges(vec![BadRange {
                member: 6,
                start: 3,
                len: 2,
            }]),
            served: MemberSet::EMPTY,
        }
    }

    #[test]
    fn round_trips() {
        let mut s = sample();
        s.states[4] = MemberState::Failed;
        s.states[6] = MemberState::Rebuilding;
        s.rebuilt[6] = 12345;
        s.clean = false;
        assert_eq!(Superblock::decode(&s.encode()).unwrap(), s);
        s.spare = true;
        assert_eq!(Superblock::decode(&s.encode()).unwrap(), s);
        // Version 7: replaces in progress, and a replacement's own superblock.
        s.spare = false;
        s.replaces[2] = Some(ReplaceRecord {
            uuid: [0x42; 16],
            copied: 777,
        });
        s.replaces[9] = Some(ReplaceRecord {
            uuid: [0x43; 16],
            copied: 0,
        });
        assert_eq!(Superblock::decode(&s.encode()).unwrap(), s);
        s.replacement = true;
        assert_eq!(Superblock::decode(&s.encode()).unwrap(), s);
    }

    /// The replace fields (version 7) of a malformed superblock are refused, naming the
    /// field; version 6 reads as "no replace in progress".
    #[test]
    fn rejects_malformed_replace_fields() {
        use replace_off::*;
        let mut s = sample();
        s.replaces[2] = Some(ReplaceRecord {
            uuid: [0x42; 16],
            copied: 5,
        });
        let good = s.encode();
        let reseal = |mut b: [u8; SB_SIZE]| {
            let c = crc32c::crc32c(&b[..off::CRC]);
            b[off::CRC..].copy_from_slice(&c.to_le_bytes());
            b
        };
        let refused = |b: [u8; SB_SIZE], name: &str| match Superblock::decode(&reseal(b)) {
            Err(FormatError::Field { field, .. }) => assert_eq!(field, name),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(Superblock::decode(&good).unwrap(), s);
        // A checkpoint without a replacement.
        let mut b = good;
        b[REPLACE_COPIED + 8 * 3] = 1;
        refused(b, "replace_copied");
        // A checkpoint past the array's units.
        let mut b = good;
        b[REPLACE_COPIED + 8 * 2 + 7] = 1;
        refused(b, "replace_copied");
        // A replace of a failed or rebuilding slot.
        for state in [1u8, 2] {
            let mut b = good;
            b[off::STATES + 2] = state;
            refused(b, "replace_uuids");
        }
        // The replacement is the slot's own member, or the removed-slot mark.
        let mut b = good;
        b[REPLACE_UUIDS + 32..REPLACE_UUIDS + 48].copy_from_slice(&[3; 16]);
        refused(b, "replace_uuids");
        let mut b = good;
        b[REPLACE_UUIDS + 32..REPLACE_UUIDS + 48].copy_from_slice(&REMOVED_SLOT);
        refused(b, "replace_uuids");
        // A level without redundancy.
        let mut b = good;
        b[off::LEVEL..off::LEVEL + 4].copy_from_slice(&0u32.to_le_bytes());
        b[off::PARITY..off::PARITY + 4].copy_from_slice(&0u32.to_le_bytes());
        b[off::JOURNAL_MODE] = 0;
        b[off::JOURNAL_UUID..off::JOURNAL_UUID + 16].fill(0);
        b[off::BITMAP_CHUNK..off::BITMAP_CHUNK + 8].fill(0);
        b[off::VOLUME_SIZE..off::VOLUME_SIZE + 8].copy_from_slice(&(10u64 << 30).to_le_bytes());
        let v = Superblock::decode(&reseal(b));
        assert!(
            matches!(
                v,
                Err(FormatError::Field {
                    field: "replace_uuids",
                    ..
                })
            ),
            "{v:?}"
        );
        // Spare and replacement at once.
        let mut b = good;
        b[off::FLAGS] = (FLAG_SPARE | FLAG_REPLACEMENT) as u8;
        refused(b, "flags");
        // Version 6: the replace bytes are ignored, the replacement flag is unknown.
        let mut b = good;
        b[off::VERSION] = 6;
        b[REPLACE_COPIED + 8 * 3] = 1;
        let v6 = Superblock::decode(&reseal(b)).unwrap();
        assert_eq!(v6.replaces, vec![None; 10]);
        assert!(!v6.replacement);
        let mut b = good;
        b[off::VERSION] = 6;
        b[off::FLAGS] = FLAG_REPLACEMENT as u8;
        refused(b, "flags");
    }

    /// The served set (version 8): slots of the array only, none on a clean superblock;
    /// version 7 reads as empty whatever the bytes hold.
    #[test]
    fn served_set_round_trips_and_rejects_malformed() {
        let mut s = sample();
        s.clean = false;
        s.served = MemberSet::from_bits(0b10_0000_0101);
        let good = s.encode();
        assert_eq!(Superblock::decode(&good).unwrap(), s);
        let reseal = |mut b: [u8; SB_SIZE]| {
            let c = crc32c::crc32c(&b[..off::CRC]);
            b[off::CRC..].copy_from_slice(&c.to_le_bytes());
            b
        };
        let refused = |b: [u8; SB_SIZE]| match Superblock::decode(&reseal(b)) {
            Err(FormatError::Field { field, .. }) => assert_eq!(field, "served"),
            other => panic!("{other:?}"),
        };
        // Slot 10 of a 10-member array; the top bit.
        let mut b = good;
        b[off::SERVED + 1] |= 0b100;
        refused(b);
        let mut b = good;
        b[off::SERVED + 7] = 0x80;
        refused(b);
        // Marked clean.
        let mut b = good;
        b[off::FLAGS] |= FLAG_CLEAN as u8;
        refused(b);
        // Version 7: ignored.
        let mut b = good;
        b[off::VERSION] = 7;
        b[off::SERVED + 7] = 0xff;
        assert_eq!(
            Superblock::decode(&reseal(b)).unwrap().served,
            MemberSet::EMPTY
        );
    }

    #[test]
    fn rejects_malformed() {
        let good = sample().encode();
        assert_eq!(
            Superblock::decode(&good[..100]),
            Err(FormatError::Short(100))
        );
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Superblock::decode(&b), Err(FormatError::BadMagic));
        let mut b = good;
        b[off::EVENTS] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(FormatError::Checksum { .. })
        ));
        let reseal = |mut b: [u8; SB_SIZE]| {
            let c = crc32c::crc32c(&b[..off::CRC]);
            b[off::CRC..].copy_from_slice(&c.to_le_bytes());
            b
        };
        let mut b = good;
        b[off::VERSION] = 2;
        assert_eq!(Superblock::decode(&reseal(b)), Err(FormatError::Version(2)));
        for (o, v, name) in [
            (off::INDEX, 10u32, "index"),
            (off::MEMBERS, 65, "members"),
            (off::LEVEL, 3, "level"),
            (off::FLAGS, 8, "flags"),
        ] {
            let mut b = good;
            b[o..o + 4].copy_from_slice(&v.to_le_bytes());
            match Superblock::decode(&reseal(b)) {
                Err(FormatError::Field { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let mut b = good;
        b[off::CHUNK..off::CHUNK + 4].copy_from_slice(&3000u32.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Geometry(_))
        ));
        // A huge member_data must be refused, not overflow the volume size (found by the
        // mutation property test below).
        let mut b = good;
        b[off::MEMBER_DATA + 7] = 32;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Geometry(
                crate::geometry::GeometryError::TooLarge(_)
            ))
        ));
        // A data area that would overlap the allocation map is refused.
        let mut b = good;
        b[off::DATA_OFFSET..off::DATA_OFFSET + 8].copy_from_slice(&(64u64 << 10).to_le_bytes());
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "data_offset",
                ..
            })
        ));
        let mut b = good;
        b[off::STATES + 2] = 9;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "member_states",
                ..
            })
        ));
        let mut b = good;
        b[off::BITMAP_CHUNK..off::BITMAP_CHUNK + 8].copy_from_slice(&(3u64 << 20).to_le_bytes());
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "bitmap_chunk",
                ..
            })
        ));
        // Version 3 superblocks (no bitmap) are read with the bitmap off, version 4 without a
        // journal.
        let mut b = good;
        b[off::VERSION] = 3;
        assert_eq!(Superblock::decode(&reseal(b)).unwrap().bitmap_chunk, 0);
        let mut b = good;
        b[off::VERSION] = 4;
        let v4 = Superblock::decode(&reseal(b)).unwrap();
        assert_eq!((v4.bitmap_chunk, v4.journal), (64 << 20, None));
        // Version 5 (before rebuild): no slot uuids, no rebuilding state.
        let mut b = good;
        b[off::VERSION] = 5;
        let v5 = Superblock::decode(&reseal(b)).unwrap();
        assert_eq!(v5.slot_uuids, vec![[0u8; 16]; 10]);
        let mut b = good;
        b[off::VERSION] = 5;
        b[off::STATES + 1] = 2;
        assert!(Superblock::decode(&reseal(b)).is_err());
        let mut b = good;
        b[off::VERSION] = 5;
        b[off::FLAGS] = 2;
        assert!(
            Superblock::decode(&reseal(b)).is_err(),
            "no spares before version 6"
        );
        // A checkpoint on a member that is not rebuilding, or past the end, is refused.
        let mut b = good;
        b[off::REBUILT + 8] = 1;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "rebuilt",
                ..
            })
        ));
        let mut b = good;
        b[off::STATES + 1] = 2;
        b[off::REBUILT + 8 + 7] = 1;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "rebuilt",
                ..
            })
        ));
        let mut b = good;
        b[off::STATES + 1] = 2;
        b[off::REBUILT + 8] = 9;
        assert_eq!(Superblock::decode(&reseal(b)).unwrap().rebuilt[1], 9);
        let mut b = good;
        b[off::JOURNAL_MODE] = 3;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "journal_mode",
                ..
            })
        ));
        // A journal on a level without parity is refused (it has no write hole to close).
        let mut b = good;
        b[off::LEVEL..off::LEVEL + 4].copy_from_slice(&1u32.to_le_bytes());
        b[off::PARITY..off::PARITY + 4].copy_from_slice(&0u32.to_le_bytes());
        assert!(Superblock::decode(&reseal(b)).is_err());
        let mut b = good;
        b[off::NAME] = 0xff;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field { field: "name", .. })
        ));
        let mut b = good;
        b[off::VOLUME_SIZE] ^= 0x10;
        assert!(matches!(
            Superblock::decode(&reseal(b)),
            Err(FormatError::Field {
                field: "volume_size",
                ..
            })
        ));
    }

    #[test]
    fn bad_block_lists_round_trip_and_malformed_ones_are_refused() {
        let reseal = |mut b: [u8; SB_SIZE]| {
            let c = crc32c::crc32c(&b[..off::CRC]);
            b[off::CRC..].copy_from_slice(&c.to_le_bytes());
            b
        };
        let mut s = sample();
        let mut bad = BadBlocks::default();
        for u in [0, 1, 2, 7, 100] {
            bad.add(3, u).unwrap();
        }
        bad.add(9, s.geometry.units() - 1).unwrap();
        s.bad = bad;
        let good = s.encode();
        assert_eq!(Superblock::decode(&good).unwrap(), s);
        assert_eq!(u32_at(&good, off::BAD_COUNT), 4);
        // Version 6 (before bad-block lists): whatever lies there, no bad blocks.
        let mut b = good;
        b[off::VERSION] = 6;
        assert!(Superblock::decode(&reseal(b)).unwrap().bad.is_empty());
        let refused = |b: [u8; SB_SIZE], name: &str| match Superblock::decode(&reseal(b)) {
            Err(FormatError::Field { field, .. }) => assert_eq!(field, name),
            other => panic!("{name}: {other:?}"),
        };
        let entry = |i: usize| off::BAD_RANGES + off::BAD_RANGE_SIZE * i;
        // Too many ranges.
        let mut b = good;
        b[off::BAD_COUNT..off::BAD_COUNT + 4].copy_from_slice(&64u32.to_le_bytes());
        refused(b, "bad_count");
        // A member past the array's.
        let mut b = good;
        b[entry(0) + 12] = 10;
        refused(b, "bad_ranges");
        // An empty range.
        let mut b = good;
        b[entry(0) + 8..entry(0) + 12].copy_from_slice(&0u32.to_le_bytes());
        refused(b, "bad_ranges");
        // Past the last unit.
        let mut b = good;
        b[entry(3)..entry(3) + 8].copy_from_slice(&s.geometry.units().to_le_bytes());
        refused(b, "bad_ranges");
        // Out of order (overlapping the previous range).
        let mut b = good;
        b[entry(1)..entry(1) + 8].copy_from_slice(&1u64.to_le_bytes());
        refused(b, "bad_ranges");
        // A count that leaves a range out is a shorter valid list.
        let mut b = good;
        b[off::BAD_COUNT] = 3;
        assert_eq!(
            Superblock::decode(&reseal(b)).unwrap().bad.ranges().len(),
            3
        );
    }

    #[test]
    fn the_fresher_valid_slot_wins() {
        let mut a = sample();
        let old = a.encode();
        a.events += 1;
        let new = a.encode();
        assert_eq!(pick_superblock(&old, &new).unwrap().events, 43);
        assert_eq!(pick_superblock(&new, &old).unwrap().events, 43);
        let mut torn = new;
        torn[100] ^= 1;
        assert_eq!(pick_superblock(&old, &torn).unwrap().events, 42);
        assert_eq!(pick_superblock(&torn, &old).unwrap().events, 42);
        assert!(pick_superblock(&torn, &[0u8; SB_SIZE]).is_err());
    }

    proptest! {
        /// Arbitrary bytes never panic the parser; arbitrary mutations of a good block with the
        /// checksum repaired either decode to something that re-encodes identically or error.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = Superblock::decode(&bytes);
        }

        #[test]
        fn mutated_blocks_are_validated(edits in proptest::collection::vec((0usize..off::CRC, any::<u8>()), 1..8)) {
            let mut b = sample().encode();
            for (o, v) in edits { b[o] = v; }
            let c = crc32c::crc32c(&b[..off::CRC]);
            b[off::CRC..].copy_from_slice(&c.to_le_bytes());
            if let Ok(sb) = Superblock::decode(&b) {
                prop_assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
            }
        }
    }
}
