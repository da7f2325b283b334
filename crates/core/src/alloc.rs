//! The allocation map: one bit per *granule* of the volume, set once the granule holds data
//! the client wrote. Clear granules read as zeros without touching the members, which is
//! what makes TRIM, WRITE_ZEROES and "never written" holes (NBD_REPLY_TYPE_OFFSET_HOLE,
//! base:allocation) cheap.
//!
//! A granule is a whole number of full stripes, so the first write into a clear granule can
//! write the whole granule (zeros around the client's bytes) with freshly computed parity:
//! whatever stale bytes a clear granule holds on the members never feed a parity update.
//!
//! Layout on every member (docs/format.md): `MAP_PAGES` 4 KiB pages from `MAP_OFFSET`; page
//! p holds granules `p * BITS_PER_PAGE ..`. Each 512-byte sector of a page stands alone:
//! bytes 0..508 hold `BITS_PER_SECTOR` granule bits (bit i of byte j is granule 8j + i of the
//! sector) and bytes 508..512 a CRC-32C over the page index (u32 LE), the sector index
//! (u32 LE) and bytes 0..508. A write torn at a sector boundary therefore leaves every sector
//! valid (old or new), never a page that cannot be read. Pure code: the engine does the I/O.

use crate::geometry::Geometry;

pub const PAGE: usize = 4096;
pub const MAP_OFFSET: u64 = 64 << 10;
/// Pages reserved for the map: from 64 KiB up to the data area at 1 MiB.
pub const MAP_PAGES: usize = ((crate::format::DATA_OFFSET - MAP_OFFSET) as usize) / PAGE;
/// Sectors per page, each sealed on its own.
pub const MAP_SECTOR: usize = 512;
pub const SECTORS_PER_PAGE: usize = PAGE / MAP_SECTOR;
pub const SECTOR_PAYLOAD: usize = MAP_SECTOR - 4;
pub const BITS_PER_SECTOR: u64 = SECTOR_PAYLOAD as u64 * 8;
pub const BITS_PER_PAGE: u64 = BITS_PER_SECTOR * SECTORS_PER_PAGE as u64;
pub const MAX_GRANULES: u64 = BITS_PER_PAGE * MAP_PAGES as u64;

/// Granule size for a geometry: the smallest power-of-two multiple of one stripe's data whose
/// map fits the reserved pages.
pub fn granule(g: &Geometry) -> u64 {
    let mut gr = g.stripe_data_bytes();
    while g.volume_size().div_ceil(gr) > MAX_GRANULES {
        gr *= 2;
    }
    gr
}

/// Number of granules covering the volume (the last may be partial).
pub fn granules(g: &Geometry) -> u64 {
    g.volume_size().div_ceil(granule(g))
}

/// Pages the map of this geometry uses.
pub fn pages(g: &Geometry) -> usize {
    granules(g).div_ceil(BITS_PER_PAGE) as usize
}

/// CRC of sector `sector` of page `page` whose payload is `payload`, starting from `seed`
/// (0 for the allocation map; the write-intent bitmap, which uses the same sector layout,
/// starts from its own seed so that one area's sector is never valid in the other).
pub(crate) fn sector_crc(seed: u32, page: usize, sector: usize, payload: &[u8]) -> u32 {
    let c = crc32c::crc32c_append(seed, &(page as u32).to_le_bytes());
    let c = crc32c::crc32c_append(c, &(sector as u32).to_le_bytes());
    crc32c::crc32c_append(c, payload)
}

/// Where granule `i` of a page (0..BITS_PER_PAGE) lives: (byte in the page, bit).
pub fn bit_position(i: u64) -> (usize, u8) {
    let sector = (i / BITS_PER_SECTOR) as usize;
    let j = (i % BITS_PER_SECTOR) as usize;
    (sector * MAP_SECTOR + j / 8, (j % 8) as u8)
}

/// Seals every sector of page `index` whose payloads are already in `page`.
pub fn seal_page(index: usize, page: &mut [u8]) {
    seal_page_seeded(0, index, page)
}

pub(crate) fn seal_page_seeded(seed: u32, index: usize, page: &mut [u8]) {
    assert_eq!(page.len(), PAGE);
    for (s, sec) in page.chunks_mut(MAP_SECTOR).enumerate() {
        let crc = sector_crc(seed, index, s, &sec[..SECTOR_PAYLOAD]);
        sec[SECTOR_PAYLOAD..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Whether `sector` (read from disk: untrusted) is a valid copy of sector `s` of page `index`.
pub fn sector_valid(index: usize, s: usize, sector: &[u8]) -> bool {
    sector_valid_seeded(0, index, s, sector)
}

pub(crate) fn sector_valid_seeded(seed: u32, index: usize, s: usize, sector: &[u8]) -> bool {
    sector.len() == MAP_SECTOR
        && u32::from_le_bytes(
            sector[SECTOR_PAYLOAD..]
                .try_into()
                .expect("4-byte slice of a 512-byte sector"),
        ) == sector_crc(seed, index, s, &sector[..SECTOR_PAYLOAD])
}

/// Whether `page` (read from disk: untrusted) is a valid copy of page `index`: every sector.
pub fn page_valid(index: usize, page: &[u8]) -> bool {
    page.len() == PAGE
        && page
            .chunks(MAP_SECTOR)
            .enumerate()
            .all(|(s, sec)| sector_valid(index, s, sec))
}

/// Merges copies of a sector-sealed bit area (the allocation map, seed 0; the write-intent
/// bitmap, its own seed) read from several members, sector by sector: the union of every
/// valid copy of each sector. A sector with no valid copy sets all its bits (both areas'
/// safe assumption). `count` bits from page 0; copies shorter than a sector's end count as
/// not having it. Returns the words (bit b of word b/64) and the sectors with no valid copy.
pub fn merge_sector_copies(seed: u32, count: u64, copies: &[Vec<u8>]) -> (Vec<u64>, usize) {
    let mut words = vec![0u64; count.div_ceil(64) as usize];
    let mut bad = 0;
    for p in 0..count.div_ceil(BITS_PER_PAGE) as usize {
        let first = p as u64 * BITS_PER_PAGE;
        for s in 0..SECTORS_PER_PAGE {
            let lo = first + s as u64 * BITS_PER_SECTOR;
            let hi = (lo + BITS_PER_SECTOR).min(count);
            if lo >= hi {
                break;
            }
            let at = p * PAGE + s * MAP_SECTOR;
            let valid: Vec<&[u8]> = copies
                .iter()
                .filter_map(|c| c.get(at..at + MAP_SECTOR))
                .filter(|sec| sector_valid_seeded(seed, p, s, sec))
                .collect();
            if valid.is_empty() {
                bad += 1;
            }
            for b in lo..hi {
                let (byte, bit) = bit_position(b - first);
                let byte = byte - s * MAP_SECTOR;
                if valid.is_empty() || valid.iter().any(|sec| sec[byte] & (1 << bit) != 0) {
                    words[(b / 64) as usize] |= 1 << (b % 64);
                }
            }
        }
    }
    (words, bad)
}

/// Granule range `[first, last]` of the granules `[off, off+len)` touches, and of those the
/// range fully covered (empty if none).
pub fn covered(granule: u64, off: u64, len: u64) -> (u64, u64) {
    let first_full = off.div_ceil(granule);
    let end_full = (off + len) / granule;
    (first_full, end_full.max(first_full))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Level;

    #[test]
    fn granule_is_whole_stripes_and_map_fits() {
        for (level, n, chunk, member) in [
            (Level::Raid6, 10, 65536u64, 1u64 << 30),
            (Level::Raid0, 4, 4096, 1 << 20),
            (Level::Raid1, 2, 4096, 1 << 40),
            (Level::Raid5, 5, 1 << 20, 1 << 44),
            (Level::Raid10, 4, 65536, 1 << 34),
        ] {
            let g = Geometry::new(level, n, chunk, member).unwrap();
            let gr = granule(&g);
            assert_eq!(gr % g.stripe_data_bytes(), 0);
            assert!((gr / g.stripe_data_bytes()).is_power_of_two());
            assert!(granules(&g) <= MAX_GRANULES);
            assert!(pages(&g) <= MAP_PAGES);
            if gr > g.stripe_data_bytes() {
                // Not larger than needed.
                assert!(g.volume_size().div_ceil(gr / 2) > MAX_GRANULES);
            }
        }
        let g = Geometry::new(Level::Raid6, 10, 65536, 1 << 30).unwrap();
        assert_eq!(granule(&g), 512 << 10);
    }

    #[test]
    fn pages_seal_and_validate() {
        let mut p = vec![0u8; PAGE];
        p[7] = 0x81;
        seal_page(3, &mut p);
        assert!(page_valid(3, &p));
        assert!(
            !page_valid(4, &p),
            "a page written to the wrong slot is refused"
        );
        p[100] ^= 1;
        assert!(!page_valid(3, &p));
        assert!(
            !page_valid(3, &[0u8; PAGE]),
            "an all-zero block is not a page"
        );
        assert!(!page_valid(3, &p[..100]));
        // Sectors stand alone: a page mixing sectors of two sealed versions is valid.
        let mut a = vec![0u8; PAGE];
        seal_page(3, &mut a);
        let mut b = vec![0u8; PAGE];
        b[MAP_SECTOR + 1] = 0xff;
        seal_page(3, &mut b);
        let mut torn = a.clone();
        torn[MAP_SECTOR..2 * MAP_SECTOR].copy_from_slice(&b[MAP_SECTOR..2 * MAP_SECTOR]);
        assert!(page_valid(3, &torn));
        // A sector moved to another slot is not valid there.
        assert!(!sector_valid(3, 2, &b[MAP_SECTOR..2 * MAP_SECTOR]));
        assert_eq!(bit_position(0), (0, 0));
        assert_eq!(bit_position(BITS_PER_SECTOR + 9), (MAP_SECTOR + 1, 1));
    }

    #[test]
    fn covered_granules() {
        assert_eq!(covered(100, 0, 100), (0, 1));
        assert_eq!(covered(100, 50, 100), (1, 1));
        assert_eq!(covered(100, 50, 300), (1, 3));
        assert_eq!(covered(100, 0, 50), (0, 0));
    }
}
