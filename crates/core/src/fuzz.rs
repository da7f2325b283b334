//! Fuzz entry points for the parsers of untrusted on-disk bytes. The cargo-fuzz targets in
//! `fuzz/` call these, and `crates/nbd/tests/fuzz_corpus.rs` replays the committed corpus
//! through them in every test run. Each panics only when a parser breaks its contract
//! (that is the finding); none is used on a serving path.

use crate::alloc::{self, MAP_SECTOR, PAGE, SECTORS_PER_PAGE, SECTOR_PAYLOAD};
use crate::format::{self, off, Superblock, SB_SIZE};

/// Superblock decoding: arbitrary bytes, the same bytes with their checksum repaired (so
/// the field checks behind it are reached), and the two-slot choice. Whatever decodes must
/// re-encode to the same value.
pub fn superblock(data: &[u8]) {
    let check = |b: &[u8]| {
        if let Ok(sb) = Superblock::decode(b) {
            let again = Superblock::decode(&sb.encode()).expect("re-encoded superblock decodes");
            assert_eq!(again, sb);
        }
    };
    check(data);
    if data.len() >= SB_SIZE {
        let mut b = data[..SB_SIZE].to_vec();
        let crc = crc32c::crc32c(&b[..off::CRC]);
        b[off::CRC..SB_SIZE].copy_from_slice(&crc.to_le_bytes());
        check(&b);
        let rest = &data[SB_SIZE..];
        let mut b2 = vec![0u8; SB_SIZE];
        let n = rest.len().min(SB_SIZE);
        b2[..n].copy_from_slice(&rest[..n]);
        if let Ok((sb, slot)) = format::pick_superblock_slot(&b, &b2) {
            assert!(slot < 2);
            let other = if slot == 0 { &b2 } else { &b };
            if let Ok(o) = Superblock::decode(other) {
                assert!(sb.events >= o.events, "the fresher slot wins");
            }
        }
    }
}

/// Allocation-map pages: validity of arbitrary bytes, and of the same bytes resealed (page
/// index from the first byte): a resealed page is valid in its own slot only.
pub fn map_page(data: &[u8]) {
    let _ = alloc::page_valid(0, data);
    for (s, sec) in data.chunks(MAP_SECTOR).enumerate().take(SECTORS_PER_PAGE) {
        let _ = alloc::sector_valid(0, s, sec);
    }
    if data.len() >= PAGE {
        let index = data[0] as usize;
        let mut p = data[..PAGE].to_vec();
        alloc::seal_page(index, &mut p);
        assert!(alloc::page_valid(index, &p));
        assert!(!alloc::page_valid(index + 1, &p));
        assert!(p
            .chunks(MAP_SECTOR)
            .all(|sec| sec[..SECTOR_PAYLOAD].len() == SECTOR_PAYLOAD));
    }
}

/// Control-socket request heads: never a panic; a parsed head's request line, rebuilt,
/// parses to the same head; its query's parameters and their percent-decoded values (what
/// the operator commands take) never panic, and a decoded value encodes back to itself.
pub fn http_head(data: &[u8]) {
    if let Ok(Some(h)) = crate::http::parse_head(data) {
        let known = ["mode", "member", "force", "path", "since"];
        if let Ok(pairs) = crate::http::query_pairs(&h.query, &known) {
            for (_, v) in pairs {
                if let Some(d) = crate::http::percent_decode(v) {
                    let e = crate::http::percent_encode(&d);
                    assert_eq!(crate::http::percent_decode(&e), Some(d));
                }
            }
        }
        let q = if h.query.is_empty() {
            String::new()
        } else {
            format!("?{}", h.query)
        };
        let again = format!("{} {}{q} HTTP/1.1\r\n\r\n", h.method, h.path);
        assert_eq!(
            crate::http::parse_head(again.as_bytes()),
            Ok(Some(h)),
            "rebuilt head parses the same"
        );
    }
}

/// Journal bytes (untrusted at assembly): the superblock decoder on the first 4 KiB (as is
/// and resealed, so the field checks are reached; whatever decodes re-encodes the same),
/// the record-header decoder on every 4 KiB block, and a replay walk over the input as a
/// journal device (log from offset 8192, the superblock resealed with its epoch and tail
/// taken from the input): it must end, and every record it hands out must lie inside the
/// device with a payload of the length its entries add up to.
pub fn journal(data: &[u8]) {
    use crate::journal::{self as j, JournalSuper, JSB_SIZE};
    let _ = JournalSuper::decode(data);
    for b in data.chunks(j::HEADER) {
        let _ = j::decode_header(b, 64, u64::MAX);
    }
    if data.len() < JSB_SIZE {
        return;
    }
    let mut b = data[..JSB_SIZE].to_vec();
    let crc = crc32c::crc32c(&b[..j::joff::CRC]);
    b[j::joff::CRC..JSB_SIZE].copy_from_slice(&crc.to_le_bytes());
    if let Ok(sb) = JournalSuper::decode(&b) {
        assert_eq!(JournalSuper::decode(&sb.encode()).unwrap(), sb);
    }
    // A walk over the input as a small device.
    let dev = data;
    let log_len = (dev.len() as u64).saturating_sub(j::LOG_START) / j::ALIGN * j::ALIGN;
    if log_len < 2 * j::ALIGN {
        return;
    }
    let word = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().expect("8 bytes"));
    let sb = JournalSuper {
        epoch: word(j::joff::EPOCH),
        tail: word(j::joff::TAIL) / j::ALIGN * j::ALIGN,
        tail_seq: word(j::joff::TAIL_SEQ),
        log_len,
        ..JournalSuper::new([0; 16], [0; 16], dev.len() as u64)
    };
    let mut n = 0u64;
    let w = j::walk(
        &sb,
        8,
        1 << 20,
        |at, len| {
            let end = (at as usize).checked_add(len).ok_or(())?;
            dev.get(at as usize..end).map(|s| s.to_vec()).ok_or(())
        },
        |h, p| {
            n += 1;
            assert_eq!(p.len() as u64, h.payload_len);
            assert_eq!(
                h.entries.iter().map(|e| e.len as u64).sum::<u64>(),
                h.payload_len
            );
        },
    );
    if let Ok(w) = w {
        assert_eq!(w.records, n);
        assert!(w.end - sb.tail <= log_len, "the walk stays within one lap");
    }
}
