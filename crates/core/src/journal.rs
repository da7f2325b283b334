//! The journal device's on-disk format (docs/format.md, "Journal device"): a superblock in
//! two slots and a circular log of checksummed records, each the complete set of member
//! writes of one stripe operation (new data and parity chunks).
//!
//! Pure: encoding, validation and the replay walk over a caller-supplied reader. Bytes read
//! from the journal are untrusted: every decoder checks magic, checksums and ranges first.
//!
//! Positions are *logical*: a record at logical position `p` sits at byte
//! `log_start + p % log_len`. A record never straddles the end of the log area: a writer
//! whose record does not fit in what is left of the current lap starts it at the next lap
//! (`next_lap`). Replay walks from the checkpoint (`tail`, `tail_seq`) while each record
//! has the expected sequence number, the superblock's epoch, its own position and valid
//! checksums. Every assembly that replays starts a new epoch, so records a previous epoch
//! left beyond its end are never mistaken for new ones.

use crate::codec::MAX_SHARDS;

pub const JSB_SIZE: usize = 4096;
pub const JSB_SLOTS: usize = 2;
pub const JMAGIC: [u8; 8] = *b"uraid-jn";
pub const RMAGIC: [u8; 8] = *b"uraid-jr";
pub const JVERSION: u32 = 1;
/// Start of the log area (after the two superblock slots).
pub const LOG_START: u64 = (JSB_SIZE * JSB_SLOTS) as u64;
/// Records are aligned to, and padded to, this many bytes (O_DIRECT).
pub const ALIGN: u64 = 4096;
/// Size of a record header.
pub const HEADER: usize = 4096;
/// Bytes of one entry in a record header.
pub const ENTRY: usize = 16;
/// Offset of the first entry in a record header.
pub const ENTRIES_AT: usize = 64;
/// Entries a header can hold (one per member written by a stripe operation).
pub const MAX_ENTRIES: usize = (HEADER - 4 - ENTRIES_AT) / ENTRY;
const _: () = assert!(MAX_ENTRIES >= MAX_SHARDS);

pub mod joff {
    //! Byte offsets of the journal superblock's fields.
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const ARRAY_UUID: usize = 16;
    pub const JOURNAL_UUID: usize = 32;
    pub const EPOCH: usize = 48;
    pub const GEN: usize = 56;
    pub const LOG_START: usize = 64;
    pub const LOG_LEN: usize = 72;
    pub const TAIL: usize = 80;
    pub const TAIL_SEQ: usize = 88;
    pub const CRC: usize = 4092;
}

pub mod roff {
    //! Byte offsets of a record header's fields.
    pub const MAGIC: usize = 0;
    pub const EPOCH: usize = 8;
    pub const SEQ: usize = 16;
    pub const POS: usize = 24;
    pub const ENTRIES: usize = 32;
    pub const PAYLOAD_LEN: usize = 40;
    pub const PAYLOAD_CRC: usize = 48;
    pub const CRC: usize = 4092;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalSuper {
    pub array_uuid: [u8; 16],
    pub journal_uuid: [u8; 16],
    /// Incremented by every assembly that replays the journal; records carry it.
    pub epoch: u64,
    /// Superblock generation: slot `gen % 2` holds it; the valid slot with the higher wins.
    pub gen: u64,
    pub log_start: u64,
    pub log_len: u64,
    /// Logical position and sequence number of the oldest record not yet checkpointed.
    pub tail: u64,
    pub tail_seq: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JournalError {
    #[error("no uraid journal superblock (bad magic)")]
    BadMagic,
    #[error("unsupported journal version {0} (this uraid reads {JVERSION})")]
    Version(u32),
    #[error("journal superblock checksum mismatch")]
    Checksum,
    #[error("journal superblock field {0} is invalid: {1}")]
    Field(&'static str, String),
    #[error("buffer holds {0} bytes, a journal superblock needs {JSB_SIZE}")]
    Short(usize),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4-byte slice"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8-byte slice"))
}

fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// The largest record a stripe operation of `members` members and `chunk`-byte chunks
/// can produce.
pub fn max_record(members: usize, chunk: u64) -> u64 {
    HEADER as u64 + align_up(members as u64 * chunk)
}

/// The smallest log area accepted for an array (four of its largest records).
pub fn min_log(members: usize, chunk: u64) -> u64 {
    4 * max_record(members, chunk)
}

pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where a record of `size` bytes goes when the log's next free logical position is
/// `head`: `head` itself if it fits in the current lap, else the start of the next lap.
pub fn next_lap(head: u64, size: u64, log_len: u64) -> u64 {
    let in_lap = head % log_len;
    if in_lap + size <= log_len {
        head
    } else {
        head - in_lap + log_len
    }
}

impl JournalSuper {
    /// A fresh journal over a device of `dev_size` bytes.
    pub fn new(array_uuid: [u8; 16], journal_uuid: [u8; 16], dev_size: u64) -> JournalSuper {
        let log_len = (dev_size.saturating_sub(LOG_START)) / ALIGN * ALIGN;
        // The first epoch comes from the journal's uuid: records a device's previous journal
        // left behind never carry it.
        let epoch = u64::from_le_bytes(journal_uuid[..8].try_into().expect("8 bytes")) >> 1;
        JournalSuper {
            array_uuid,
            journal_uuid,
            epoch,
            gen: 1,
            log_start: LOG_START,
            log_len,
            tail: 0,
            tail_seq: 1,
        }
    }

    /// Slot this superblock is written to.
    pub fn slot(&self) -> usize {
        (self.gen % JSB_SLOTS as u64) as usize
    }

    pub fn encode(&self) -> [u8; JSB_SIZE] {
        let mut b = [0u8; JSB_SIZE];
        b[joff::MAGIC..joff::MAGIC + 8].copy_from_slice(&JMAGIC);
        put32(&mut b, joff::VERSION, JVERSION);
        b[joff::ARRAY_UUID..joff::ARRAY_UUID + 16].copy_from_slice(&self.array_uuid);
        b[joff::JOURNAL_UUID..joff::JOURNAL_UUID + 16].copy_from_slice(&self.journal_uuid);
        put64(&mut b, joff::EPOCH, self.epoch);
        put64(&mut b, joff::GEN, self.gen);
        put64(&mut b, joff::LOG_START, self.log_start);
        put64(&mut b, joff::LOG_LEN, self.log_len);
        put64(&mut b, joff::TAIL, self.tail);
        put64(&mut b, joff::TAIL_SEQ, self.tail_seq);
        let crc = crc32c::crc32c(&b[..joff::CRC]);
        put32(&mut b, joff::CRC, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<JournalSuper, JournalError> {
        if b.len() < JSB_SIZE {
            return Err(JournalError::Short(b.len()));
        }
        let b = &b[..JSB_SIZE];
        if b[..8] != JMAGIC {
            return Err(JournalError::BadMagic);
        }
        let v = u32_at(b, joff::VERSION);
        if v != JVERSION {
            return Err(JournalError::Version(v));
        }
        if u32_at(b, joff::CRC) != crc32c::crc32c(&b[..joff::CRC]) {
            return Err(JournalError::Checksum);
        }
        let field = |f: &'static str, why: String| JournalError::Field(f, why);
        let log_start = u64_at(b, joff::LOG_START);
        let log_len = u64_at(b, joff::LOG_LEN);
        if log_start != LOG_START {
            return Err(field("log_start", format!("{log_start} != {LOG_START}")));
        }
        if log_len < ALIGN * 2
            || !log_len.is_multiple_of(ALIGN)
            || log_start.checked_add(log_len).is_none()
        {
            return Err(field("log_len", format!("{log_len}")));
        }
        let tail = u64_at(b, joff::TAIL);
        if !tail.is_multiple_of(ALIGN) || tail > u64::MAX / 2 {
            return Err(field(
                "tail",
                format!("{tail} not 4 KiB aligned or beyond any reachable position"),
            ));
        }
        let tail_seq = u64_at(b, joff::TAIL_SEQ);
        if tail_seq == 0 || tail_seq > u64::MAX / 2 {
            return Err(field("tail_seq", format!("{tail_seq} out of range")));
        }
        let mut array_uuid = [0u8; 16];
        array_uuid.copy_from_slice(&b[joff::ARRAY_UUID..joff::ARRAY_UUID + 16]);
        let mut journal_uuid = [0u8; 16];
        journal_uuid.copy_from_slice(&b[joff::JOURNAL_UUID..joff::JOURNAL_UUID + 16]);
        Ok(JournalSuper {
            array_uuid,
            journal_uuid,
            epoch: u64_at(b, joff::EPOCH),
            gen: u64_at(b, joff::GEN),
            log_start,
            log_len,
            tail,
            tail_seq,
        })
    }
}

/// The journal superblock from its two slots: the valid one with the higher generation.
pub fn pick_super(slot0: &[u8], slot1: &[u8]) -> Result<JournalSuper, JournalError> {
    match (JournalSuper::decode(slot0), JournalSuper::decode(slot1)) {
        (Ok(a), Ok(b)) => Ok(if b.gen > a.gen { b } else { a }),
        (Ok(a), Err(_)) => Ok(a),
        (Err(_), Ok(b)) => Ok(b),
        (Err(e), Err(_)) => Err(e),
    }
}

/// One member write inside a record: `len` bytes at data-area offset `off` of `member`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub member: u16,
    pub len: u32,
    pub off: u64,
}

/// A decoded record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub epoch: u64,
    pub seq: u64,
    pub pos: u64,
    pub entries: Vec<Entry>,
    pub payload_len: u64,
    pub payload_crc: u32,
}

impl RecordHeader {
    /// Bytes the record takes in the log: header plus payload padded to `ALIGN`.
    pub fn size(&self) -> u64 {
        HEADER as u64 + align_up(self.payload_len)
    }

    /// Whether `payload` (exactly `payload_len` bytes) is the one the header describes.
    pub fn payload_matches(&self, payload: &[u8]) -> bool {
        payload.len() as u64 == self.payload_len && crc32c::crc32c(payload) == self.payload_crc
    }
}

/// Encodes a record (header + payload, padded) for `entries`, whose bytes are `payload`
/// (the entries' bytes back to back), into `out` (resized to the record's size).
pub fn encode_record(
    epoch: u64,
    seq: u64,
    pos: u64,
    entries: &[Entry],
    payload: &[&[u8]],
    out: &mut Vec<u8>,
) {
    assert!(
        entries.len() <= MAX_ENTRIES,
        "too many entries for a record"
    );
    let plen: u64 = payload.iter().map(|p| p.len() as u64).sum();
    let size = HEADER + align_up(plen) as usize;
    out.clear();
    out.resize(size, 0);
    let mut at = HEADER;
    let mut crc = 0u32;
    for p in payload {
        out[at..at + p.len()].copy_from_slice(p);
        crc = crc32c::crc32c_append(crc, p);
        at += p.len();
    }
    let h = &mut out[..HEADER];
    h[roff::MAGIC..roff::MAGIC + 8].copy_from_slice(&RMAGIC);
    put64(h, roff::EPOCH, epoch);
    put64(h, roff::SEQ, seq);
    put64(h, roff::POS, pos);
    put32(h, roff::ENTRIES, entries.len() as u32);
    put64(h, roff::PAYLOAD_LEN, plen);
    put32(h, roff::PAYLOAD_CRC, crc);
    for (i, e) in entries.iter().enumerate() {
        let o = ENTRIES_AT + i * ENTRY;
        h[o..o + 2].copy_from_slice(&e.member.to_le_bytes());
        put32(h, o + 4, e.len);
        put64(h, o + 8, e.off);
    }
    let c = crc32c::crc32c(&h[..roff::CRC]);
    put32(h, roff::CRC, c);
}

/// Decodes a record header (untrusted). None if it is not a valid header: bad magic or
/// checksum, too many entries, entry lengths that do not add up to the payload, members
/// beyond `members`, or a payload larger than `max_payload`.
pub fn decode_header(b: &[u8], members: usize, max_payload: u64) -> Option<RecordHeader> {
    if b.len() < HEADER || b[..8] != RMAGIC {
        return None;
    }
    if u32_at(b, roff::CRC) != crc32c::crc32c(&b[..roff::CRC]) {
        return None;
    }
    let n = u32_at(b, roff::ENTRIES) as usize;
    if n > MAX_ENTRIES {
        return None;
    }
    let payload_len = u64_at(b, roff::PAYLOAD_LEN);
    if payload_len > max_payload {
        return None;
    }
    let mut entries = Vec::with_capacity(n);
    let mut sum = 0u64;
    for i in 0..n {
        let o = ENTRIES_AT + i * ENTRY;
        let e = Entry {
            member: u16::from_le_bytes([b[o], b[o + 1]]),
            len: u32_at(b, o + 4),
            off: u64_at(b, o + 8),
        };
        if e.member as usize >= members
            || b[o + 2..o + 4] != [0, 0]
            || e.off.checked_add(e.len as u64).is_none()
        {
            return None;
        }
        sum += e.len as u64;
        entries.push(e);
    }
    if sum != payload_len {
        return None;
    }
    Some(RecordHeader {
        epoch: u64_at(b, roff::EPOCH),
        seq: u64_at(b, roff::SEQ),
        pos: u64_at(b, roff::POS),
        entries,
        payload_len,
        payload_crc: u32_at(b, roff::PAYLOAD_CRC),
    })
}

/// What a replay walk found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    pub records: u64,
    pub bytes: u64,
    /// Logical position just past the last valid record (the next record's position).
    pub end: u64,
    /// Sequence number the next record gets.
    pub next_seq: u64,
}

/// Walks the log from the checkpoint: calls `apply(header, payload)` for every valid record
/// in order and returns where the log ends. `read(device offset, len)` reads the journal; an
/// error aborts the walk (an unreadable log must fail the assembly, never silently end the
/// log: durable records after it would be dropped). `members`: the array's member count;
/// `max_payload`: the largest payload a record of this array can have. A record is valid
/// when its header decodes, carries the superblock's epoch, the expected sequence number
/// and its own position, and its payload checksum matches.
pub fn walk<E>(
    sb: &JournalSuper,
    members: usize,
    max_payload: u64,
    mut read: impl FnMut(u64, usize) -> Result<Vec<u8>, E>,
    mut apply: impl FnMut(&RecordHeader, &[u8]),
) -> Result<Walk, E> {
    let mut pos = sb.tail;
    let mut seq = sb.tail_seq;
    let mut w = Walk {
        end: pos,
        next_seq: seq,
        ..Walk::default()
    };
    let len = sb.log_len;
    // At most one lap: a log can hold no more than that.
    let limit = sb.tail.saturating_add(len);
    loop {
        let mut found = None;
        // The record is at `pos`, or at the next lap's start if the writer wrapped there
        // (it did not fit in the rest of this lap).
        let next_lap = (pos - pos % len).checked_add(len);
        for cand in [Some(pos), next_lap].into_iter().flatten() {
            if cand >= limit || (cand != pos && pos.is_multiple_of(len)) {
                continue;
            }
            if len - cand % len < HEADER as u64 {
                continue;
            }
            let hb = read(sb.log_start + cand % len, HEADER)?;
            let Some(h) = decode_header(&hb, members, max_payload) else {
                continue;
            };
            if h.epoch != sb.epoch || h.seq != seq || h.pos != cand {
                continue;
            }
            if cand % len + h.size() > len || cand.saturating_add(h.size()) > limit {
                continue;
            }
            found = Some((cand, h));
            break;
        }
        let Some((at, h)) = found else { break };
        let Some(next_seq) = seq.checked_add(1) else {
            break;
        };
        let payload = read(
            sb.log_start + at % len + HEADER as u64,
            align_up(h.payload_len) as usize,
        )?;
        let payload = &payload[..h.payload_len as usize];
        if !h.payload_matches(payload) {
            break;
        }
        apply(&h, payload);
        w.records += 1;
        w.bytes += h.payload_len;
        pos = at + h.size();
        seq = next_seq;
        w.end = pos;
        w.next_seq = seq;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sb(log_len: u64) -> JournalSuper {
        JournalSuper {
            log_len,
            ..JournalSuper::new([1; 16], [2; 16], LOG_START + log_len)
        }
    }

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let s = JournalSuper {
            epoch: 7,
            gen: 9,
            tail: 8192,
            tail_seq: 33,
            ..sb(1 << 20)
        };
        assert_eq!(JournalSuper::decode(&s.encode()).unwrap(), s);
        let good = s.encode();
        assert_eq!(
            JournalSuper::decode(&good[..10]),
            Err(JournalError::Short(10))
        );
        let mut b = good;
        b[0] = 0;
        assert_eq!(JournalSuper::decode(&b), Err(JournalError::BadMagic));
        let mut b = good;
        b[joff::TAIL] ^= 1;
        assert_eq!(JournalSuper::decode(&b), Err(JournalError::Checksum));
        let reseal = |mut b: [u8; JSB_SIZE]| {
            let c = crc32c::crc32c(&b[..joff::CRC]);
            b[joff::CRC..].copy_from_slice(&c.to_le_bytes());
            b
        };
        for (o, v, name) in [
            (joff::LOG_START, 100u64, "log_start"),
            (joff::LOG_LEN, 4096, "log_len"),
            (joff::LOG_LEN, u64::MAX - 4095, "log_len"),
            (joff::TAIL, 5, "tail"),
            (joff::TAIL, u64::MAX - 4095, "tail"),
            (joff::TAIL_SEQ, 0, "tail_seq"),
            (joff::TAIL_SEQ, u64::MAX, "tail_seq"),
        ] {
            let mut b = good;
            b[o..o + 8].copy_from_slice(&v.to_le_bytes());
            match JournalSuper::decode(&reseal(b)) {
                Err(JournalError::Field(f, _)) => assert_eq!(f, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let mut b = good;
        b[joff::VERSION] = 9;
        assert_eq!(
            JournalSuper::decode(&reseal(b)),
            Err(JournalError::Version(9))
        );
        // The higher valid generation wins; a torn slot loses.
        let mut newer = s.clone();
        newer.gen += 1;
        assert_eq!(pick_super(&good, &newer.encode()).unwrap().gen, 10);
        let mut torn = newer.encode();
        torn[100] ^= 1;
        assert_eq!(pick_super(&torn, &good).unwrap().gen, 9);
    }

    /// An in-memory log: records appended the way the engine does.
    struct Log {
        sb: JournalSuper,
        dev: Vec<u8>,
        head: u64,
        seq: u64,
    }

    impl Log {
        fn new(log_len: u64) -> Log {
            let sb = sb(log_len);
            Log {
                dev: vec![0xAA; (LOG_START + log_len) as usize],
                head: 0,
                seq: 1,
                sb,
            }
        }
        fn append(&mut self, entries: &[Entry], payload: &[&[u8]]) -> (u64, Vec<u8>) {
            let plen: u64 = payload.iter().map(|p| p.len() as u64).sum();
            let size = HEADER as u64 + align_up(plen);
            let pos = next_lap(self.head, size, self.sb.log_len);
            let mut rec = Vec::new();
            encode_record(self.sb.epoch, self.seq, pos, entries, payload, &mut rec);
            let at = (self.sb.log_start + pos % self.sb.log_len) as usize;
            self.dev[at..at + rec.len()].copy_from_slice(&rec);
            self.head = pos + size;
            self.seq += 1;
            (pos, rec)
        }
        fn walk(&self) -> (Walk, Vec<(u64, Vec<u8>)>) {
            let mut got = Vec::new();
            let w = walk(
                &self.sb,
                4,
                1 << 20,
                |o, l| {
                    self.dev
                        .get(o as usize..o as usize + l)
                        .map(|s| s.to_vec())
                        .ok_or(())
                },
                |h, p| got.push((h.seq, p.to_vec())),
            )
            .expect("in range");
            (w, got)
        }
    }

    fn entry(member: u16, off: u64, len: u32) -> Entry {
        Entry { member, len, off }
    }

    #[test]
    fn walk_replays_in_order_across_a_wrap_and_stops_at_a_torn_record() {
        let mut log = Log::new(64 << 10);
        let a = vec![1u8; 5000];
        let b = vec![2u8; 3000];
        for i in 0..3 {
            log.append(&[entry(0, i * 8192, 5000), entry(3, 0, 3000)], &[&a, &b]);
        }
        // Records of 12 KiB; checkpoint past the first two. The 5th (20 KiB) does not fit in
        // the rest of the 64 KiB lap after four: it wraps.
        log.sb.tail = 2 * 12288;
        log.sb.tail_seq = 3;
        log.append(&[entry(1, 0, 5000)], &[&a]);
        let (pos5, _) = log.append(&[entry(2, 0, 16000)], &[&vec![5u8; 16000]]);
        assert_eq!(pos5, 64 << 10, "wrapped to the next lap");
        let (w, got) = log.walk();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(w.next_seq, 6);
        assert_eq!(w.end, log.head);
        assert_eq!(got[2].1, vec![5u8; 16000]);
        // Tear record 5's payload: the walk ends after record 4.
        let at = (LOG_START + HEADER as u64 + 10) as usize;
        log.dev[at] ^= 1;
        let (w, got) = log.walk();
        assert_eq!(got.len(), 2);
        assert_eq!(w.next_seq, 5);
    }

    #[test]
    fn stale_records_of_an_older_epoch_or_lap_are_not_replayed() {
        let mut log = Log::new(64 << 10);
        let a = vec![7u8; 4096];
        for _ in 0..4 {
            log.append(&[entry(0, 0, 4096)], &[&a]);
        }
        // A new epoch starts at the end of the old records: they are still on the device.
        log.sb.epoch += 1;
        log.sb.tail = 8192;
        log.sb.tail_seq = 3;
        let (w, got) = log.walk();
        assert!(got.is_empty(), "{got:?}");
        assert_eq!(w.next_seq, 3);
        // Same epoch, but the record at the tail has an older sequence number (a lap behind).
        log.sb.epoch -= 1;
        log.sb.tail_seq = 40;
        assert!(log.walk().1.is_empty());
    }

    #[test]
    fn malformed_headers_are_refused() {
        let mut rec = Vec::new();
        encode_record(1, 1, 0, &[entry(0, 0, 512)], &[&[3u8; 512]], &mut rec);
        assert!(decode_header(&rec, 4, 1 << 20).is_some());
        assert!(decode_header(&rec[..100], 4, 1 << 20).is_none());
        assert!(
            decode_header(&rec, 0, 1 << 20).is_none(),
            "member out of range"
        );
        assert!(decode_header(&rec, 4, 100).is_none(), "payload too large");
        let reseal = |mut r: Vec<u8>| {
            let c = crc32c::crc32c(&r[..roff::CRC]);
            r[roff::CRC..HEADER].copy_from_slice(&c.to_le_bytes());
            r
        };
        let mut r = rec.clone();
        r[roff::PAYLOAD_LEN] = 9;
        assert!(
            decode_header(&reseal(r), 4, 1 << 20).is_none(),
            "lengths disagree"
        );
        let mut r = rec.clone();
        r[roff::ENTRIES..roff::ENTRIES + 4].copy_from_slice(&10_000u32.to_le_bytes());
        assert!(
            decode_header(&reseal(r), 4, 1 << 20).is_none(),
            "entry count"
        );
        let mut r = rec;
        r[7] = 0;
        assert!(decode_header(&r, 4, 1 << 20).is_none());
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let _ = JournalSuper::decode(&bytes);
            let _ = decode_header(&bytes, 64, u64::MAX);
        }

        /// Any sequence of appends (sizes random, wraps included) replays exactly the records
        /// after the checkpoint, in order, with their bytes.
        #[test]
        fn appends_replay_exactly(sizes in proptest::collection::vec(1u32..20_000, 1..40), keep in 0usize..8) {
            let mut log = Log::new(128 << 10);
            let mut recs: Vec<(u64, u64, u64, Vec<u8>)> = Vec::new();
            for (i, &s) in sizes.iter().enumerate() {
                let p = vec![(i % 251) as u8; s as usize];
                let size = HEADER as u64 + align_up(s as u64);
                // Make room the way a checkpoint does: drop the oldest records.
                while !recs.is_empty()
                    && next_lap(log.head, size, log.sb.log_len) + size - recs[0].0 > log.sb.log_len
                {
                    recs.remove(0);
                }
                let seq = log.seq;
                let (pos, _) = log.append(&[entry(1, 0, s)], &[&p]);
                recs.push((pos, seq, pos + size, p));
            }
            let start = recs.len().saturating_sub(keep.max(1));
            log.sb.tail = recs[start].0;
            log.sb.tail_seq = recs[start].1;
            let (w, got) = log.walk();
            let want: Vec<(u64, Vec<u8>)> = recs[start..].iter().map(|r| (r.1, r.3.clone())).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(w.end, log.head);
        }
    }
}
