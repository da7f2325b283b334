//! The allocation map at run time (format and granule arithmetic: `uraid_core::alloc`).
//!
//! Bits live in atomics so every reactor can test them without a lock. A granule moves from
//! clear to allocated only through a *fill*: the first writer marks it `filling` (other
//! writers to that granule wait), writes the whole granule (zeros around its own bytes) so
//! parity is computed fresh, sets the bit, persists the map page on every live member, and
//! only then acknowledges. Trim clears bits of whole granules and zeroes partial ones.
//!
//! Pages are persisted with group commit: each page has a generation bumped on every bit
//! change and an async lock holding the generation last written; a writer whose change an
//! earlier writer's snapshot already carried skips the I/O.

use crate::array::{Array, ArrayError};
use crate::buf::{self, IoBuf, Segments};
use crate::dev::BlockDev;
use futures::future::join_all;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Waker};
use uraid_core::alloc::{self as fmt, BITS_PER_PAGE, MAP_OFFSET, PAGE, PAGE_PAYLOAD};
use uraid_core::Geometry;

pub(crate) struct AllocMap {
    pub(crate) granule: u64,
    count: u64,
    words: Vec<AtomicU64>,
    filling: Mutex<HashMap<u64, Vec<Waker>>>,
    page_gen: Vec<AtomicU64>,
    page_written: Vec<futures::lock::Mutex<u64>>,
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
            page_gen: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            page_written: (0..pages).map(|_| futures::lock::Mutex::new(0)).collect(),
        }
    }

    pub(crate) fn is_set(&self, g: u64) -> bool {
        self.words[(g / 64) as usize].load(Ordering::Acquire) & (1 << (g % 64)) != 0
    }

    /// Sets or clears bit g; returns the page to persist if it changed.
    fn change(&self, g: u64, set: bool) -> Option<usize> {
        let w = &self.words[(g / 64) as usize];
        let bit = 1u64 << (g % 64);
        let old = if set {
            w.fetch_or(bit, Ordering::AcqRel)
        } else {
            w.fetch_and(!bit, Ordering::AcqRel)
        };
        if (old & bit != 0) == set {
            return None;
        }
        let page = (g / BITS_PER_PAGE) as usize;
        self.page_gen[page].fetch_add(1, Ordering::AcqRel);
        Some(page)
    }

    /// The on-disk image of page `p`.
    fn page_image(&self, p: usize) -> IoBuf {
        let mut b = buf::zeroed(PAGE);
        let first = p as u64 * BITS_PER_PAGE;
        let last = (first + BITS_PER_PAGE).min(self.count);
        for g in first..last {
            if self.is_set(g) {
                let i = (g - first) as usize;
                b[i / 8] |= 1 << (i % 8);
            }
        }
        fmt::seal_page(p, &mut b);
        b
    }

    /// Claims granule g for filling; waits while another writer fills it. Returns false if
    /// the granule turned out allocated (nothing to fill).
    async fn claim(&self, g: u64) -> bool {
        std::future::poll_fn(|cx| {
            let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = f.get_mut(&g) {
                w.push(cx.waker().clone());
                return Poll::Pending;
            }
            if self.is_set(g) {
                return Poll::Ready(false);
            }
            f.insert(g, Vec::new());
            Poll::Ready(true)
        })
        .await
    }

    /// Like `claim` but also for allocated granules (trim needs exclusivity either way).
    async fn claim_any(&self, g: u64) {
        std::future::poll_fn(|cx| {
            let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = f.get_mut(&g) {
                w.push(cx.waker().clone());
                return Poll::Pending;
            }
            f.insert(g, Vec::new());
            Poll::Ready(())
        })
        .await
    }

    fn release(&self, g: u64) {
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

impl<D: BlockDev> Array<D> {
    /// Size of one allocation-map granule (the unit of holes and of trim).
    pub fn granule(&self) -> u64 {
        self.map.granule
    }

    /// Runs of `[off, off+len)` as (offset, length, allocated), clipped to the range.
    pub fn allocation(&self, off: u64, len: u64) -> Vec<(u64, u64, bool)> {
        let gr = self.map.granule;
        let end = off + len;
        let mut out: Vec<(u64, u64, bool)> = Vec::new();
        let mut pos = off;
        while pos < end {
            let g = pos / gr;
            let next = ((g + 1) * gr).min(end);
            let a = self.map.is_set(g);
            match out.last_mut() {
                Some(last) if last.2 == a => last.1 += next - pos,
                _ => out.push((pos, next - pos, a)),
            }
            pos = next;
        }
        out
    }

    /// Reads `[off, off+len)` as data pieces and holes (clear granules), in volume order.
    pub async fn read_sparse(
        self: &Arc<Self>,
        off: u64,
        len: u64,
    ) -> Result<Vec<ReadPiece>, ArrayError> {
        self.validate(off, len)?;
        self.check_serving()?;
        let runs = self.allocation(off, len);
        let reads = runs.into_iter().map(|(o, l, a)| async move {
            if a {
                self.read_mapped(o, l)
                    .await
                    .map(|data| ReadPiece::Data { off: o, data })
            } else {
                Ok(ReadPiece::Hole { off: o, len: l })
            }
        });
        join_all(reads).await.into_iter().collect()
    }

    /// Writes `data` at `off`, filling clear granules it touches first (see module docs).
    pub(crate) async fn write_allocating(
        self: &Arc<Self>,
        off: u64,
        data: crate::WriteBuf,
    ) -> Result<(), ArrayError> {
        let len = data.len() as u64;
        let gr = self.map.granule;
        let (g0, g1) = (off / gr, (off + len - 1) / gr);
        if (g0..=g1).all(|g| self.map.is_set(g)) {
            return self.write_mapped(off, data).await;
        }
        let mut claimed = Vec::new();
        for g in g0..=g1 {
            if !self.map.is_set(g) && self.map.claim(g).await {
                claimed.push(g);
            }
        }
        let r = self.write_claimed(off, &data, &claimed).await;
        let r = match r {
            Ok(()) => {
                let pages: Vec<usize> = claimed
                    .iter()
                    .filter_map(|&g| self.map.change(g, true))
                    .collect();
                self.persist_map(pages).await
            }
            Err(e) => Err(e),
        };
        for g in claimed {
            self.map.release(g);
        }
        r
    }

    /// Does the write when `claimed` granules are clear and ours: partially covered claimed
    /// granules (only the first and last can be) are written whole, zeros around the data.
    async fn write_claimed(
        self: &Arc<Self>,
        off: u64,
        data: &crate::WriteBuf,
        claimed: &[u64],
    ) -> Result<(), ArrayError> {
        let len = data.len() as u64;
        let end = off + len;
        let gr = self.map.granule;
        let size = self.size();
        let span = |g: u64| (g * gr, ((g + 1) * gr).min(size));
        let partial = |g: u64| {
            let (s, e) = span(g);
            claimed.contains(&g) && (off > s || end < e)
        };
        let (g0, g1) = (off / gr, (end - 1) / gr);
        let mut head_end = off;
        let mut tail_start = end;
        let mut writes: Vec<(u64, crate::WriteBuf)> = Vec::new();
        for g in [g0, g1] {
            if partial(g) && !writes.iter().any(|(o, _)| *o == span(g).0) {
                let (s, e) = span(g);
                let mut v = vec![0u8; (e - s) as usize];
                let (a, b) = (off.max(s), end.min(e));
                v[(a - s) as usize..(b - s) as usize]
                    .copy_from_slice(&data[(a - off) as usize..(b - off) as usize]);
                writes.push((s, Arc::new(v)));
                if g == g0 {
                    head_end = e.min(end);
                }
                if g == g1 {
                    tail_start = s.max(off);
                }
            }
        }
        if head_end < tail_start {
            if head_end == off && tail_start == end {
                writes.push((off, data.clone()));
            } else {
                let mid = data[(head_end - off) as usize..(tail_start - off) as usize].to_vec();
                writes.push((head_end, Arc::new(mid)));
            }
        }
        for r in join_all(writes.into_iter().map(|(o, d)| self.write_mapped(o, d))).await {
            r?;
        }
        Ok(())
    }

    /// Makes `[off, off+len)` read as zeros. Whole granules become holes (a map update, no
    /// data I/O); the parts of partially covered allocated granules are written with zeros.
    pub async fn trim(self: &Arc<Self>, off: u64, len: u64) -> Result<(), ArrayError> {
        self.validate(off, len)?;
        self.check_serving()?;
        if len == 0 {
            return Ok(());
        }
        self.ensure_dirty().await;
        let gr = self.map.granule;
        let end = off + len;
        let size = self.size();
        let (f0, f1) = uraid_core::alloc::covered(gr, off, len);
        // The last granule may be short (volume end): whole if the range reaches the end.
        let f1 = if end == size && f1 * gr < size && f1 * gr >= off {
            f1 + 1
        } else {
            f1
        };
        let mut pages = Vec::new();
        for g in f0..f1 {
            self.map.claim_any(g).await;
            pages.extend(self.map.change(g, false));
            self.map.release(g);
        }
        let mut zero_parts = Vec::new();
        if f0 >= f1 {
            zero_parts.push((off, end));
        } else {
            if off < f0 * gr {
                zero_parts.push((off, f0 * gr));
            }
            if f1 * gr < end {
                zero_parts.push((f1 * gr, end));
            }
        }
        let mut writes = Vec::new();
        for (a, b) in zero_parts {
            for (o, l, allocated) in self.allocation(a, b - a) {
                if allocated {
                    writes.push(self.write_zeros(o, l));
                }
            }
        }
        for r in join_all(writes).await {
            r?;
        }
        self.persist_map(pages).await
    }

    /// Writes real zeros over `[off, off+len)` (bounded buffers).
    pub async fn write_zeros(self: &Arc<Self>, off: u64, len: u64) -> Result<(), ArrayError> {
        const STEP: u64 = 4 << 20;
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(STEP);
            self.write(pos, Arc::new(vec![0u8; n as usize])).await?;
            pos += n;
        }
        Ok(())
    }

    /// Whether trimming `[off, off+len)` needs no data I/O (whole granules, or parts that are
    /// already holes): what NBD_CMD_FLAG_FAST_ZERO asks.
    pub fn zero_is_fast(&self, off: u64, len: u64) -> bool {
        let gr = self.map.granule;
        let size = self.size();
        let end = off + len;
        let whole = |s: u64| s.is_multiple_of(gr);
        let edge_ok = |a: u64, b: u64| a >= b || self.allocation(a, b - a).iter().all(|r| !r.2);
        let head = if whole(off) { off } else { (off / gr + 1) * gr };
        let tail = if whole(end) || end == size {
            end
        } else {
            end / gr * gr
        };
        if head >= tail {
            return edge_ok(off, end);
        }
        edge_ok(off, head) && edge_ok(tail, end)
    }

    /// Writes the given map pages to every live member (group commit per page).
    async fn persist_map(&self, mut pages: Vec<usize>) -> Result<(), ArrayError> {
        pages.sort_unstable();
        pages.dedup();
        for p in pages {
            let want = self.map.page_gen[p].load(Ordering::Acquire);
            let mut written = self.map.page_written[p].lock().await;
            if *written >= want {
                continue;
            }
            let gen = self.map.page_gen[p].load(Ordering::Acquire);
            let image = Arc::new(self.map.page_image(p));
            let f = self.failed_mask();
            let writes = (0..self.geo.members)
                .filter(|i| f & (1 << i) == 0)
                .map(|i| {
                    let copy = buf::copy_of(&image);
                    async move {
                        let at = MAP_OFFSET + (p * PAGE) as u64;
                        (i, self.dev(i).write(at, copy).await.0)
                    }
                });
            for (i, r) in join_all(writes).await {
                if let Err(e) = r {
                    self.fail_member(i, &e).await;
                }
            }
            *written = gen;
        }
        self.check_serving().map(|_| ())
    }
}

/// Merges map copies read from several members: the union of every valid copy of each page
/// (a set bit is only ever persisted after its granule was filled, so any copy's set bit is
/// safe). A page with no valid copy is taken as all allocated (reads go to the members).
/// Returns the words and the number of pages that had no valid copy.
pub fn merge_map_copies(g: &Geometry, copies: &[Vec<u8>]) -> (Vec<u64>, usize) {
    let count = fmt::granules(g);
    let mut words = vec![0u64; count.div_ceil(64) as usize];
    let mut bad = 0;
    for p in 0..fmt::pages(g) {
        let first = p as u64 * BITS_PER_PAGE;
        let last = (first + BITS_PER_PAGE).min(count);
        let valid: Vec<&[u8]> = copies
            .iter()
            .filter_map(|c| c.get(p * PAGE..(p + 1) * PAGE))
            .filter(|pg| fmt::page_valid(p, pg))
            .collect();
        if valid.is_empty() {
            bad += 1;
        }
        for gi in first..last {
            let i = (gi - first) as usize;
            let set = valid.is_empty()
                || valid
                    .iter()
                    .any(|pg| i / 8 < PAGE_PAYLOAD && pg[i / 8] & (1 << (i % 8)) != 0);
            if set {
                words[(gi / 64) as usize] |= 1 << (gi % 64);
            }
        }
    }
    (words, bad)
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
