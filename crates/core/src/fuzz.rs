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
/// parses to the same head.
pub fn http_head(data: &[u8]) {
    if let Ok(Some(h)) = crate::http::parse_head(data) {
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
