//! The write-intent bitmap at run time (layout and region arithmetic: `uraid_core::bitmap`).
//!
//! Rules (docs/invariants.md, "A write-intent bit precedes the write"):
//! * A bit set in memory is set on every live member and flushed. A client write is issued
//!   to the members only after the bits of every region it touches are set (`WriteIntent::begin`): the
//!   fast path is one atomic add and one load per region; the first write into a clear
//!   region sets it through `WriteIntent::set`, which batches every region waiting at that moment into
//!   one page write + flush per member.
//! * A bit is cleared only when its region has had no write in flight and none completed
//!   for a whole tick, resync no longer needs it, and the members were flushed *after* that
//!   was observed (`clear_idle`): clearing first in memory, then re-checking the in-flight
//!   count and the touched flag (SeqCst on both sides: a writer either sees the bit clear
//!   and takes the slow path, or the clearer sees the writer). A lost clear only costs a
//!   resync of a clean region; a lost set cannot happen (set → flush → write).
//! * Page writes (sets and clears) are serialised by one async mutex, so a set never lands
//!   before an earlier clear of the same page.
//! * A region's in-flight count never goes below zero (`debug_assert!` in `end_inflight`:
//!   it is on every client write's path, and in release a wrapped count only keeps the bit
//!   set, which costs a resync of a clean region, never data).

use crate::background::ResyncState;
use crate::buf;
use crate::dev::BlockDev;
use crate::members::Members;
use crate::metadata::Metadata;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use uraid_core::alloc::{BITS_PER_PAGE, PAGE};
use uraid_core::bitmap::{self as fmt, BITMAP_OFFSET};
use uraid_core::{Geometry, MemberSet};

pub(crate) struct WriteIntent {
    geo: Geometry,
    /// Region size in member bytes; 0: no bitmap.
    pub(crate) chunk: u64,
    regions: u64,
    /// Set: durable on the members.
    bits: Vec<AtomicU64>,
    /// Writes in flight per region.
    inflight: Vec<AtomicU32>,
    /// A write completed in the region since the last tick looked.
    touched: Vec<AtomicU64>,
    /// Regions writers wait to have set (the next page write takes them all).
    want: Mutex<BTreeSet<u64>>,
    io: tokio::sync::Mutex<()>,
    /// Held by a clearing pass from its selection to its last page write.
    pass: tokio::sync::Mutex<()>,
    frozen: bool,
    /// Holds on clearing (`hold_clears`): while not zero, no bit is cleared.
    holds: AtomicU32,
    /// Page writes that set and that cleared bits (status, metrics, tests).
    pub(crate) set_rounds: AtomicU64,
    pub(crate) clear_rounds: AtomicU64,
}

impl WriteIntent {
    /// `words`: the bits as loaded from the members (the union of their copies); None:
    /// unknown, every region counts as set (the first write of the session writes this
    /// state to every member: `sync_all`).
    pub(crate) fn new(g: &Geometry, chunk: u64, words: Option<Vec<u64>>, frozen: bool) -> Self {
        let regions = fmt::regions(g, chunk);
        let nwords = regions.div_ceil(64) as usize;
        let mut words = words.unwrap_or_else(|| vec![u64::MAX; nwords]);
        words.resize(nwords, 0);
        if let (Some(last), r) = (words.last_mut(), regions % 64) {
            if r != 0 {
                *last &= (1u64 << r) - 1;
            }
        }
        WriteIntent {
            geo: *g,
            chunk,
            regions,
            bits: words.into_iter().map(AtomicU64::new).collect(),
            inflight: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            touched: (0..nwords).map(|_| AtomicU64::new(0)).collect(),
            want: Mutex::new(BTreeSet::new()),
            io: tokio::sync::Mutex::new(()),
            pass: tokio::sync::Mutex::new(()),
            frozen,
            holds: AtomicU32::new(0),
            set_rounds: AtomicU64::new(0),
            clear_rounds: AtomicU64::new(0),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.chunk != 0
    }

    pub(crate) fn regions(&self) -> u64 {
        self.regions
    }

    pub(crate) fn is_set(&self, r: u64) -> bool {
        self.bits[(r / 64) as usize].load(Ordering::SeqCst) & (1 << (r % 64)) != 0
    }

    /// The bits set now (bit r of word r/64: region r).
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        self.bits.iter().map(|w| w.load(Ordering::SeqCst)).collect()
    }

    /// Regions whose bit is set now.
    pub(crate) fn dirty(&self) -> u64 {
        self.bits
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as u64)
            .sum()
    }

    /// A write in region `r` ended (its guard, or a deferred write's `deferred_end`).
    fn end_inflight(&self, r: u64) {
        let was = self.inflight[r as usize].fetch_sub(1, Ordering::SeqCst);
        debug_assert!(
            was > 0,
            "write-intent region {r}: in-flight count below zero"
        );
    }

    fn touch(&self, r: u64) {
        let w = &self.touched[(r / 64) as usize];
        let bit = 1 << (r % 64);
        if w.load(Ordering::SeqCst) & bit == 0 {
            w.fetch_or(bit, Ordering::SeqCst);
        }
    }
}

/// A hold on clearing bits (`WriteIntent::hold_clears`), released when dropped.
pub(crate) struct ClearHold<'a>(&'a WriteIntent);

impl Drop for ClearHold<'_> {
    fn drop(&mut self) {
        self.0.holds.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held by a client write while its member writes are in flight: the regions it touches
/// stay set. Dropping it (also when the write future is dropped) ends the write. Deferred
/// member writes (write-back journal) hold their region with `WriteIntent::deferred_begin`.
pub(crate) struct IntentGuard<'a> {
    wi: &'a WriteIntent,
    regions: std::ops::RangeInclusive<u64>,
}

impl Drop for IntentGuard<'_> {
    fn drop(&mut self) {
        for r in self.regions.clone() {
            self.wi.touch(r);
            self.wi.end_inflight(r);
        }
    }
}

impl WriteIntent {
    /// A deferred (write-back) stripe operation keeps its region "in flight" until its
    /// member writes completed (`deferred_end`). Called while the client's own guard
    /// still holds the region, so the count never drops to zero in between.
    pub(crate) fn deferred_begin(&self, stripe: u64) -> Option<u64> {
        let wi = self;
        if !wi.enabled() {
            return None;
        }
        let r = fmt::region_of_unit(&self.geo, wi.chunk, stripe);
        wi.inflight[r as usize].fetch_add(1, Ordering::SeqCst);
        Some(r)
    }

    pub(crate) fn deferred_end(&self, r: Option<u64>) {
        if let Some(r) = r {
            self.touch(r);
            self.end_inflight(r);
        }
    }

    /// Before a write of `[off, off+len)` goes to the members: makes the bits of its regions
    /// durable (the caller checked the range). None when there is no bitmap.
    pub(crate) async fn begin<'a, D: BlockDev>(
        &'a self,
        meta: &Metadata,
        members: &Members<D>,
        off: u64,
        len: u64,
    ) -> Option<IntentGuard<'a>> {
        let wi = self;
        if !wi.enabled() || len == 0 {
            return None;
        }
        let sdb = self.geo.stripe_data_bytes();
        let r0 = fmt::region_of_unit(&self.geo, wi.chunk, off / sdb);
        let r1 = fmt::region_of_unit(&self.geo, wi.chunk, (off + len - 1) / sdb);
        for r in r0..=r1 {
            wi.inflight[r as usize].fetch_add(1, Ordering::SeqCst);
        }
        let guard = IntentGuard {
            wi,
            regions: r0..=r1,
        };
        if !(r0..=r1).all(|r| wi.is_set(r)) {
            Box::pin(self.set(meta, members, r0, r1)).await;
        }
        Some(guard)
    }

    /// Slow path: sets the bits of regions `r0..=r1` durably, with whatever else is waiting.
    async fn set<D: BlockDev>(&self, meta: &Metadata, members: &Members<D>, r0: u64, r1: u64) {
        let wi = self;
        {
            let mut want = wi.want.lock().unwrap_or_else(|e| e.into_inner());
            want.extend((r0..=r1).filter(|&r| !wi.is_set(r)));
        }
        let _io = wi.io.lock().await;
        if (r0..=r1).all(|r| wi.is_set(r)) {
            return; // An earlier batch set them.
        }
        // Everything waiting, and this write's own regions: a batch leader whose future was
        // dropped mid-write may have taken them out of `want` without setting them.
        let mut batch: BTreeSet<u64> =
            std::mem::take(&mut *wi.want.lock().unwrap_or_else(|e| e.into_inner()));
        batch.extend(r0..=r1);
        let batch: Vec<u64> = batch.into_iter().filter(|&r| !wi.is_set(r)).collect();
        if !wi.frozen {
            let pages: BTreeSet<usize> = batch
                .iter()
                .map(|&r| (r / BITS_PER_PAGE) as usize)
                .collect();
            self.write_pages(
                meta,
                members,
                &pages,
                |r| wi.is_set(r) || batch.binary_search(&r).is_ok(),
                true,
            )
            .await;
        }
        for &r in &batch {
            wi.bits[(r / 64) as usize].fetch_or(1 << (r % 64), Ordering::SeqCst);
        }
        wi.set_rounds.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes bitmap pages `pages` (bits from `is_set`) to every live member, flushing them
    /// if `flush`. A member that fails is failed (the write-intent record on the others
    /// stands: the union is taken at assembly). Caller holds the bitmap's I/O lock.
    async fn write_pages<D: BlockDev>(
        &self,
        meta: &Metadata,
        members: &Members<D>,
        pages: &BTreeSet<usize>,
        is_set: impl Fn(u64) -> bool,
        flush: bool,
    ) {
        let chunk = self.chunk;
        let images: Vec<(usize, Vec<u8>)> = pages
            .iter()
            .map(|&p| (p, fmt::page_image(&self.geo, chunk, p, &is_set)))
            .collect();
        let all = MemberSet::all(self.geo.members);
        meta.each_live(members, all, |i| {
            let writes: Vec<_> = images
                .iter()
                .map(|(p, img)| (BITMAP_OFFSET + (*p * PAGE) as u64, buf::copy_of(img)))
                .collect();
            async move {
                for (at, b) in writes {
                    members.write_raw(i, at, b).await?;
                }
                if flush {
                    members.flush(i).await?;
                }
                Ok(())
            }
        })
        .await;
    }

    /// No bit is cleared until the guard is dropped (a re-add copies the bits while a slot
    /// stops being failed: recovery/readd.rs). A pass already past its last check when this
    /// is called had seen the failed slot (or no hold) under the I/O lock, which this waits
    /// for.
    pub(crate) async fn hold_clears(&self) -> ClearHold<'_> {
        self.holds.fetch_add(1, Ordering::SeqCst);
        drop(self.io.lock().await);
        ClearHold(self)
    }

    /// Clears the bits of regions that are idle: no write in flight, none completed since
    /// the previous call (unless `at_close`, after the final flush of a stop), and nothing
    /// left for resync (`resync`). Flushes the members first. Nothing is cleared while a
    /// member is failed or missing, while a hold is on (`hold_clears`), or while `blocked`
    /// (the journal's orphans: records whose member writes were dropped unfinished), each
    /// checked again under the I/O lock right before the clear. The server calls this every
    /// few seconds (`Array::bitmap_tick`); `Array::close` calls it before recording a clean
    /// stop.
    pub(crate) async fn clear_idle<D: BlockDev>(
        &self,
        meta: &Metadata,
        members: &Members<D>,
        resync: &ResyncState,
        at_close: bool,
        blocked: impl Fn() -> bool,
    ) -> u64 {
        let wi = self;
        // A session that wrote nothing writes no bitmap either; a degraded one clears nothing.
        let held =
            || !members.failed().is_empty() || wi.holds.load(Ordering::SeqCst) != 0 || blocked();
        if !wi.enabled() || wi.frozen || !meta.is_dirty() || held() {
            return 0;
        }
        // One pass at a time: a second pass's swap of the touched flags would hide a write
        // from this pass's re-check.
        let _pass = wi.pass.lock().await;
        let mut cand = Vec::new();
        for (wn, w) in wi.bits.iter().enumerate() {
            let set = w.load(Ordering::SeqCst);
            if set == 0 {
                continue;
            }
            // Writes completed since the last look keep their regions one more round.
            let touched = wi.touched[wn].swap(0, Ordering::SeqCst);
            for b in 0..64 {
                let r = wn as u64 * 64 + b;
                if set & (1 << b) == 0 || (!at_close && touched & (1 << b) != 0) {
                    continue;
                }
                if wi.inflight[r as usize].load(Ordering::SeqCst) == 0 && self.resynced(resync, r) {
                    cand.push(r);
                }
            }
        }
        if cand.is_empty() {
            return 0;
        }
        // Everything written into the candidates so far becomes durable. Nothing is cleared
        // while a member is failed or missing (md's rule): its last writes may never have
        // become durable, and a forced reassembly could bring it back.
        meta.flush_members(members).await;
        if members.check_serving(&self.geo).is_err() || held() {
            return 0;
        }
        let _io = wi.io.lock().await;
        if held() {
            return 0;
        }
        let mut cleared = Vec::new();
        for r in cand {
            let (wn, bit) = ((r / 64) as usize, 1u64 << (r % 64));
            wi.bits[wn].fetch_and(!bit, Ordering::SeqCst);
            if wi.inflight[r as usize].load(Ordering::SeqCst) != 0
                || wi.touched[wn].load(Ordering::SeqCst) & bit != 0
            {
                // A write came in after the candidates were picked: keep the bit (it is
                // still set on the members).
                wi.bits[wn].fetch_or(bit, Ordering::SeqCst);
            } else {
                cleared.push(r);
            }
        }
        if cleared.is_empty() {
            return 0;
        }
        let pages: BTreeSet<usize> = cleared
            .iter()
            .map(|&r| (r / BITS_PER_PAGE) as usize)
            .collect();
        self.write_pages(meta, members, &pages, |r| wi.is_set(r), false)
            .await;
        wi.clear_rounds.fetch_add(1, Ordering::Relaxed);
        cleared.len() as u64
    }

    /// Whether resync is done with every unit of region `r`.
    fn resynced(&self, resync: &ResyncState, r: u64) -> bool {
        !resync.is_pending()
            || fmt::units_of_region(&self.geo, self.chunk, r).all(|u| !resync.unsynced(u))
    }

    /// Before the first write of a session (`ensure_dirty`): writes every bitmap page from
    /// memory to every live member and flushes. The bits in memory are the union of the
    /// members' copies (or all set, when nothing was known), and the fast path trusts a set
    /// bit to be on every member: a clear that reached only some members before a crash
    /// would otherwise let writes into that region go unrecorded there.
    pub(crate) async fn sync_all<D: BlockDev>(&self, meta: &Metadata, members: &Members<D>) {
        let wi = self;
        if !wi.enabled() || wi.frozen {
            return;
        }
        let _io = wi.io.lock().await;
        let pages: BTreeSet<usize> = (0..fmt::pages(&self.geo, wi.chunk)).collect();
        self.write_pages(meta, members, &pages, |r| wi.is_set(r), true)
            .await;
    }
}

/// How often the server's bitmap daemon runs (md's bitmap daemon sleeps 5 s): a region is
/// cleared after it has been idle for one to two periods.
pub const BITMAP_TICK: std::time::Duration = std::time::Duration::from_secs(5);
