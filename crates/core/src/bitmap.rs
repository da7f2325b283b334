//! The write-intent bitmap: one bit per *region* of the members' data areas, set on the
//! members (durably) before the first write into the region and cleared lazily once the
//! region has been idle and the members flushed. After an unclean stop only the regions
//! whose bit is set can hold stripes whose parity disagrees with their data, so resync walks
//! those and nothing else (md's write-intent bitmap).
//!
//! A region is `bitmap_chunk` bytes of every member's data area (the superblock field; a
//! power of two, at least one chunk). Resync units (`Geometry::units`) map to regions
//! through their member offset.
//!
//! Layout on every member (docs/format.md): `BITMAP_PAGES` 4 KiB pages from
//! `BITMAP_OFFSET`, the same sector layout as the allocation map (`crate::alloc`): each
//! 512-byte sector carries 4064 region bits and a CRC-32C of page index, sector index and
//! payload, here seeded with `seed()` so that a map sector is never a valid bitmap sector.
//! Pure code: the engine does the I/O.

use crate::alloc::{self, BITS_PER_PAGE, MAP_OFFSET, PAGE};
use crate::geometry::Geometry;

/// Start of the bitmap on every member: right after the two superblock slots.
pub const BITMAP_OFFSET: u64 = 8 << 10;
/// Pages reserved for the bitmap: up to the allocation map.
pub const BITMAP_PAGES: usize = ((MAP_OFFSET - BITMAP_OFFSET) as usize) / PAGE;
/// Most regions a bitmap can hold (455,168).
pub const MAX_REGIONS: u64 = BITS_PER_PAGE * BITMAP_PAGES as u64;
/// Default region size in member bytes (docs/benchmarks.md, "Write-intent bitmap", has the
/// measurements behind it): fine enough that a crash leaves tens of MiB of volume per region
/// touched to resync (or, started dirty and degraded without a parity to spare, to refuse),
/// coarse enough that a sequential writer pays a set round (a FLUSH of every member) only
/// once per region entered: a few percent with 2 ms flushes, where 1 MiB cost a quarter.
pub const DEFAULT_CHUNK: u64 = 4 << 20;

/// CRC seed of bitmap sectors.
pub fn seed() -> u32 {
    crc32c::crc32c(b"uraid-write-intent-bitmap")
}

/// Why a `bitmap_chunk` cannot be used with a geometry (0 = no bitmap is always valid).
pub fn check_chunk(g: &Geometry, bitmap_chunk: u64) -> Result<(), String> {
    if bitmap_chunk == 0 {
        return Ok(());
    }
    if g.fault_tolerance() == 0 {
        return Err(format!(
            "{} has no redundancy: it has no write hole and no write-intent bitmap",
            g.level
        ));
    }
    if !bitmap_chunk.is_power_of_two() || bitmap_chunk < g.chunk {
        return Err(format!(
            "{bitmap_chunk} is not a power of two of at least one chunk ({})",
            g.chunk
        ));
    }
    let n = regions(g, bitmap_chunk);
    if n > MAX_REGIONS {
        return Err(format!(
            "{n} regions of {bitmap_chunk} bytes exceed the {MAX_REGIONS} bits the bitmap holds"
        ));
    }
    Ok(())
}

/// The region size `create` uses when none is given: `DEFAULT_CHUNK`, or the smallest power
/// of two (at least a chunk) that fits the bitmap. 0 for levels without redundancy.
pub fn default_chunk(g: &Geometry) -> u64 {
    if g.fault_tolerance() == 0 {
        return 0;
    }
    let mut c = DEFAULT_CHUNK.max(g.chunk);
    while regions(g, c) > MAX_REGIONS {
        c *= 2;
    }
    c
}

/// Regions covering the data area.
pub fn regions(g: &Geometry, bitmap_chunk: u64) -> u64 {
    if bitmap_chunk == 0 {
        0
    } else {
        g.member_data.div_ceil(bitmap_chunk)
    }
}

/// Pages the bitmap of this geometry uses.
pub fn pages(g: &Geometry, bitmap_chunk: u64) -> usize {
    regions(g, bitmap_chunk).div_ceil(BITS_PER_PAGE) as usize
}

/// The region resync unit `u` lies in.
pub fn region_of_unit(g: &Geometry, bitmap_chunk: u64, u: u64) -> u64 {
    g.unit_member_offset(u) / bitmap_chunk
}

/// The resync units of region `r`.
pub fn units_of_region(g: &Geometry, bitmap_chunk: u64, r: u64) -> std::ops::Range<u64> {
    g.units_in(r * bitmap_chunk, (r + 1) * bitmap_chunk)
}

/// The resync units of the regions set in `words` (bit r of word r/64), as ranges merged
/// where adjacent.
pub fn dirty_units(g: &Geometry, bitmap_chunk: u64, words: &[u64]) -> Vec<std::ops::Range<u64>> {
    let mut out: Vec<std::ops::Range<u64>> = Vec::new();
    for r in 0..regions(g, bitmap_chunk) {
        if words
            .get((r / 64) as usize)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
        {
            let us = units_of_region(g, bitmap_chunk, r);
            match out.last_mut() {
                Some(last) if last.end == us.start => last.end = us.end,
                _ if us.is_empty() => {}
                _ => out.push(us),
            }
        }
    }
    out
}

/// Where region `i` of a page (0..BITS_PER_PAGE) lives: (byte in the page, bit).
pub fn bit_position(i: u64) -> (usize, u8) {
    alloc::bit_position(i)
}

/// Seals every sector of bitmap page `index` whose payloads are already in `page`.
pub fn seal_page(index: usize, page: &mut [u8]) {
    alloc::seal_page_seeded(seed(), index, page)
}

/// Whether `sector` (read from disk: untrusted) is a valid copy of sector `s` of bitmap page
/// `index`.
pub fn sector_valid(index: usize, s: usize, sector: &[u8]) -> bool {
    alloc::sector_valid_seeded(seed(), index, s, sector)
}

/// Merges bitmap copies read from several members (each `pages(g, bitmap_chunk) * PAGE`
/// bytes from `BITMAP_OFFSET`; shorter copies count as missing sectors), sector by sector:
/// the union of every valid copy (a bit is cleared on a member only after the region was
/// flushed everywhere, so any copy's set bit may be the only record of a write in flight).
/// A sector with no valid copy marks all its regions dirty. Returns the region bits (bit r
/// of word r/64) and the number of sectors that had no valid copy.
pub fn merge_copies(g: &Geometry, bitmap_chunk: u64, copies: &[Vec<u8>]) -> (Vec<u64>, usize) {
    alloc::merge_sector_copies(seed(), regions(g, bitmap_chunk), copies)
}

/// The on-disk image of bitmap page `p` for region bits `is_set`.
pub fn page_image(
    g: &Geometry,
    bitmap_chunk: u64,
    p: usize,
    is_set: impl Fn(u64) -> bool,
) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let first = p as u64 * BITS_PER_PAGE;
    let last = (first + BITS_PER_PAGE).min(regions(g, bitmap_chunk));
    for r in first..last {
        if is_set(r) {
            let (byte, bit) = bit_position(r - first);
            b[byte] |= 1 << bit;
        }
    }
    seal_page(p, &mut b);
    b
}

/// The bitmap image of a freshly created array: every page sealed, no region dirty.
pub fn empty_image(g: &Geometry, bitmap_chunk: u64) -> Vec<u8> {
    let mut v = Vec::new();
    for p in 0..pages(g, bitmap_chunk) {
        v.extend(page_image(g, bitmap_chunk, p, |_| false));
    }
    v
}

/// Fuzz entry point (`fuzz/`, and the corpus replay test): bitmap copies read from members
/// are untrusted. The first byte picks how many copies (1..=3) and whether their sectors are
/// resealed; merging must never panic, must size the words right, and resealed copies
/// must have no bad sector.
pub fn fuzz_copies(data: &[u8]) {
    let g = Geometry::new(crate::Level::Raid6, 6, 4096, 4 << 30).expect("valid geometry");
    let bc = 64 << 10;
    let len = pages(&g, bc) * PAGE;
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let n = 1 + (ctl % 3) as usize;
    let mut copies: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            rest.get(i * len..)
                .unwrap_or(&[])
                .iter()
                .take(len)
                .copied()
                .collect()
        })
        .collect();
    if ctl & 0x80 != 0 {
        for c in &mut copies {
            c.resize(len, 0);
            for (p, page) in c.chunks_mut(PAGE).enumerate() {
                seal_page(p, page);
            }
        }
    }
    let (words, bad) = merge_copies(&g, bc, &copies);
    assert_eq!(words.len() as u64, regions(&g, bc).div_ceil(64));
    if ctl & 0x80 != 0 {
        assert_eq!(bad, 0, "resealed copies are valid");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Level;
    use proptest::prelude::*;

    #[test]
    fn layout_fits_between_superblocks_and_map() {
        assert_eq!(BITMAP_OFFSET, 2 * crate::format::SB_SIZE as u64);
        assert_eq!(BITMAP_PAGES, 14);
        assert_eq!(MAX_REGIONS, 455_168);
        // 4 MiB regions cover 1.7 TiB per member; bigger members get the smallest power of
        // two that fits (64 MiB for 16 TiB).
        let small = Geometry::new(Level::Raid6, 10, 65536, 1 << 40).unwrap();
        assert_eq!(default_chunk(&small), DEFAULT_CHUNK);
        assert!(pages(&small, DEFAULT_CHUNK) <= BITMAP_PAGES);
        let g = Geometry::new(Level::Raid6, 10, 65536, 1 << 44).unwrap();
        assert_eq!(default_chunk(&g), 64 << 20);
        assert!(pages(&g, 64 << 20) <= BITMAP_PAGES);
        let g0 = Geometry::new(Level::Raid0, 4, 65536, 1 << 30).unwrap();
        assert_eq!(default_chunk(&g0), 0);
        assert!(check_chunk(&g0, 1 << 20).is_err());
        assert!(check_chunk(&g, 3 << 20).is_err(), "not a power of two");
        assert!(check_chunk(&g, 32 << 10).is_err(), "below one chunk");
        assert!(check_chunk(&g, 4 << 20).is_err(), "too many regions");
        assert!(check_chunk(&g, 0).is_ok());
    }

    #[test]
    fn copies_merge_as_a_union_and_missing_sectors_are_dirty() {
        let g = Geometry::new(Level::Raid5, 4, 4096, 1 << 30).unwrap();
        let bc = 4096;
        assert!(pages(&g, bc) >= 2);
        let empty = empty_image(&g, bc);
        let (w, bad) = merge_copies(&g, bc, std::slice::from_ref(&empty));
        assert_eq!(bad, 0);
        assert!(w.iter().all(|&x| x == 0));
        let a = {
            let mut v = empty.clone();
            v[..PAGE].copy_from_slice(&page_image(&g, bc, 0, |r| r == 3));
            v
        };
        let b = {
            let mut v = empty.clone();
            v[..PAGE].copy_from_slice(&page_image(&g, bc, 0, |r| r == 70));
            v
        };
        let (w, bad) = merge_copies(&g, bc, &[a.clone(), b]);
        assert_eq!(bad, 0);
        assert_eq!(w[0], 1 << 3);
        assert_eq!(w[1], 1 << 6);
        // An allocation-map page is not a bitmap page (different CRC seed).
        let mut m = a.clone();
        let mut map_page = vec![0u8; PAGE];
        alloc::seal_page(0, &mut map_page);
        m[..PAGE].copy_from_slice(&map_page);
        let (w, bad) = merge_copies(&g, bc, &[m]);
        assert_eq!(bad, 8, "every sector of page 0 is invalid");
        assert_eq!(
            w[0],
            u64::MAX,
            "regions without a valid copy count as dirty"
        );
        // A short copy (member read failed part-way) counts as missing there.
        let (_, bad) = merge_copies(&g, bc, &[a[..PAGE].to_vec()]);
        assert_eq!(
            bad as u64,
            regions(&g, bc).div_ceil(alloc::BITS_PER_SECTOR) - 8
        );
    }

    proptest! {
        /// Every unit lies in exactly one region, and `units_of_region` lists the units
        /// `region_of_unit` maps there, on every level with redundancy.
        #[test]
        fn units_and_regions_are_inverse(level in 0usize..4, n in 4usize..9, rows in 1u64..200, shift in 0u32..5) {
            let level = [Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6][level];
            let chunk = 4096;
            let g = Geometry::new(level, n, chunk, rows * chunk).unwrap();
            let bc = chunk << shift;
            let mut next = 0;
            for r in 0..regions(&g, bc) {
                let us = units_of_region(&g, bc, r);
                prop_assert_eq!(us.start, next);
                for u in us.clone() {
                    prop_assert_eq!(region_of_unit(&g, bc, u), r);
                }
                next = us.end;
            }
            prop_assert_eq!(next, g.units());
        }

        #[test]
        fn merging_never_panics(data in proptest::collection::vec(any::<u8>(), 0..20000)) {
            fuzz_copies(&data);
        }
    }
}
