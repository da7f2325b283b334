//! The allocation map in memory (format and granule arithmetic: `uraid_core::alloc`; the
//! rules for filling, trimming and persisting pages: `volume.rs`).
//!
//! Bits live in atomics so every reactor can test them without a lock. A bit changes in
//! memory only after its page was written with the change, while the page's lock is held
//! (`Volume::persist_page`): what any request observes in memory is already on the members.

use crate::buf::{self, IoBuf, Segments};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Waker};
use uraid_core::alloc::{self as fmt, BITS_PER_PAGE, PAGE};
use uraid_core::Geometry;

pub(crate) struct AllocMap {
    pub(crate) granule: u64,
    pub(crate) count: u64,
    words: Vec<AtomicU64>,
    filling: Mutex<HashMap<u64, VecDeque<Waker>>>,
    /// Held while a page is written and its bits changed in memory.
    pub(crate) page_locks: Vec<tokio::sync::Mutex<()>>,
}

/// A piece of a read: data, or a run that reads as zeros without touching the members.
#[derive(Debug)]
pub enum ReadPiece {
    Data { off: u64, data: Segments },
    Hole { off: u64, len: u64 },
}

impl AllocMap {
    /// `words`: the map as loaded (bit g of word g/64); None = every granule allocated
    /// (the safe assumption when nothing is known).
    pub(crate) fn new(g: &Geometry, words: Option<Vec<u64>>) -> AllocMap {
        let count = fmt::granules(g);
        let nwords = count.div_ceil(64) as usize;
        let words = match words {
            Some(mut w) => {
                w.resize(nwords, 0);
                w
            }
            None => vec![u64::MAX; nwords],
        };
        let pages = fmt::pages(g);
        AllocMap {
            granule: fmt::granule(g),
            count,
            words: words.into_iter().map(AtomicU64::new).collect(),
            filling: Mutex::new(HashMap::new()),
            page_locks: (0..pages).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    /// Whether granule `g` holds data or is being filled or trimmed now (a background walk
    /// may skip a unit only when neither: a fill that claims it later writes whole stripes
    /// to every member the array has at that time).
    pub(crate) fn in_use(&self, g: u64) -> bool {
        self.is_set_in_range(g)
            || self
                .filling
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&g)
    }

    /// `is_set` for any granule number: false beyond the map.
    pub(crate) fn is_set_in_range(&self, g: u64) -> bool {
        g < self.count && self.is_set(g)
    }

    pub(crate) fn is_set(&self, g: u64) -> bool {
        self.words[(g / 64) as usize].load(Ordering::Acquire) & (1 << (g % 64)) != 0
    }

    /// Sets or clears bit g in memory (the caller wrote its page first).
    pub(crate) fn change(&self, g: u64, set: bool) {
        let w = &self.words[(g / 64) as usize];
        let bit = 1u64 << (g % 64);
        if set {
            w.fetch_or(bit, Ordering::AcqRel);
        } else {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// The on-disk image of page `p`, with the granules `set` set and `clear` cleared.
    pub(crate) fn page_image(&self, p: usize, set: &[u64], clear: &[u64]) -> IoBuf {
        let mut b = buf::zeroed(PAGE);
        let first = p as u64 * BITS_PER_PAGE;
        let last = (first + BITS_PER_PAGE).min(self.count);
        for g in first..last {
            if (self.is_set(g) || set.contains(&g)) && !clear.contains(&g) {
                let (byte, bit) = fmt::bit_position(g - first);
                b[byte] |= 1 << bit;
            }
        }
        fmt::seal_page(p, &mut b);
        b
    }

    /// Claims granule g for filling; waits while another writer fills it. Returns false if
    /// the granule turned out allocated (nothing to fill).
    pub(crate) async fn claim(&self, g: u64) -> bool {
        std::future::poll_fn(|cx| {
            let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = f.get_mut(&g) {
                crate::reactor::park(w, cx.waker());
                return Poll::Pending;
            }
            if self.is_set(g) {
                return Poll::Ready(false);
            }
            f.insert(g, VecDeque::new());
            Poll::Ready(true)
        })
        .await
    }

    /// Like `claim` but also for allocated granules (trim needs exclusivity either way).
    pub(crate) async fn claim_any(&self, g: u64) {
        std::future::poll_fn(|cx| {
            let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = f.get_mut(&g) {
                crate::reactor::park(w, cx.waker());
                return Poll::Pending;
            }
            f.insert(g, VecDeque::new());
            Poll::Ready(())
        })
        .await
    }

    pub(crate) fn release(&self, g: u64) {
        let waiters = self
            .filling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&g);
        for w in waiters.into_iter().flatten() {
            w.wake();
        }
    }
}

/// Shared all-zero buffer that hole segments point into.
fn zeros() -> Arc<IoBuf> {
    static Z: OnceLock<Arc<IoBuf>> = OnceLock::new();
    Z.get_or_init(|| Arc::new(IoBuf::zeroed(1 << 20))).clone()
}

/// Segments of `len` zero bytes.
pub(crate) fn zero_segments(len: u64) -> Segments {
    let z = zeros();
    let mut parts = Vec::new();
    let mut left = len as usize;
    while left > 0 {
        let n = left.min(z.len());
        parts.push((z.clone(), 0..n));
        left -= n;
    }
    Segments { parts }
}

/// Merges map copies read from several members, sector by sector: the union of every valid
/// copy of each sector (a set bit is only ever persisted after its granule was filled and
/// made durable, so any copy's set bit is safe). A sector with no valid copy counts as all
/// its granules allocated (reads go to the members; nothing is hidden).
/// Returns the words and the number of sectors that had no valid copy.
pub fn merge_map_copies(g: &Geometry, copies: &[Vec<u8>]) -> (Vec<u64>, usize) {
    fmt::merge_sector_copies(0, fmt::granules(g), copies)
}

/// Fuzz entry point (`fuzz/`, and the corpus replay test): map copies as read from members
/// are untrusted. The input is split into up to three copies of a small array's map
/// (the first byte picks how many and whether their sectors are resealed); merging must
/// never panic, must cover every granule, and all-valid empty copies must merge to empty.
pub fn fuzz_map_copies(data: &[u8]) {
    let g = Geometry::new(uraid_core::Level::Raid6, 6, 4096, 192 << 20).expect("valid geometry");
    let len = fmt::pages(&g) * PAGE;
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let n = 1 + (ctl % 3) as usize;
    let mut copies: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut c = vec![0u8; len];
            let src = rest.get(i * len..).unwrap_or(&[]);
            let m = src.len().min(len);
            c[..m].copy_from_slice(&src[..m]);
            c
        })
        .collect();
    if ctl & 0x80 != 0 {
        for c in &mut copies {
            for (p, page) in c.chunks_mut(PAGE).enumerate() {
                fmt::seal_page(p, page);
            }
        }
    }
    let (words, bad) = merge_map_copies(&g, &copies);
    assert_eq!(words.len() as u64, fmt::granules(&g).div_ceil(64));
    assert!(bad <= fmt::pages(&g) * fmt::SECTORS_PER_PAGE);
    if ctl & 0x80 != 0 {
        assert_eq!(bad, 0, "resealed copies are valid");
    }
    let (w, b) = merge_map_copies(&g, &[empty_map_image(&g)]);
    assert!(b == 0 && w.iter().all(|&x| x == 0));
}

/// The map image of a freshly created array: every page sealed, no granule allocated.
pub fn empty_map_image(g: &Geometry) -> Vec<u8> {
    let mut v = vec![0u8; fmt::pages(g) * PAGE];
    for (p, page) in v.chunks_mut(PAGE).enumerate() {
        fmt::seal_page(p, page);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use uraid_core::Level;

    #[test]
    fn merging_copies_takes_the_union_of_valid_pages() {
        let g = Geometry::new(Level::Raid5, 4, 4096, 1 << 30).unwrap();
        assert!(fmt::pages(&g) >= 2);
        let empty = empty_map_image(&g);
        let (w, bad) = merge_map_copies(&g, &[empty.clone(), empty.clone()]);
        assert_eq!(bad, 0);
        assert!(w.iter().all(|&x| x == 0));
        // Copy A has granule 3 set, copy B granule 70 of page 0 and page 1 torn.
        let mut a = empty.clone();
        a[0] |= 1 << 3;
        fmt::seal_page(0, &mut a[..PAGE]);
        let mut b = empty.clone();
        b[70 / 8] |= 1 << (70 % 8);
        fmt::seal_page(0, &mut b[..PAGE]);
        b[PAGE + 5] ^= 0xff;
        let (w, bad) = merge_map_copies(&g, &[a.clone(), b]);
        assert_eq!(bad, 0, "page 1 still has a valid copy on A");
        assert_eq!(w[0], 1 << 3);
        assert_eq!(w[1], 1 << 6, "granule 70 is bit 6 of word 1");
        // No valid copy of page 1 anywhere: its granules count as allocated.
        let mut c = a.clone();
        c[PAGE + 9] ^= 1;
        let (w, bad) = merge_map_copies(&g, &[c]);
        assert_eq!(bad, 1);
        let first = BITS_PER_PAGE as usize;
        assert!(w[first / 64 + 1] == u64::MAX);
        assert_eq!(w[0], 1 << 3);
    }
}
