//! The volume clients see: the array plus the allocation map (holes for never-written and
//! trimmed granules, trim, write-zeroes, block status). It depends on the array; the array
//! never on it.
//!
//! Crash rules for the map (docs/invariants.md, "Allocation-map bits follow the data";
//! docs/format.md):
//! * A granule moves from clear to allocated only through a *fill*: the first writer claims
//!   it (other writers to it wait), writes the whole granule (zeros around its own bytes, so
//!   parity is computed fresh), flushes the members, writes the map page with the bit set,
//!   and only then sets the bit in memory and acknowledges. A bit set in memory is therefore
//!   always on disk, so no writer can take the fast path into a granule whose bit could
//!   still be lost.
//! * Every 512-byte sector of a map page carries its own checksum (`uraid_core::alloc`), so a
//!   page write torn by a crash leaves each sector valid, old or new, on every copy; assembly
//!   takes the union of valid copies per sector. Pages are not flushed on their own: a
//!   client FLUSH flushes them with the data.

use crate::alloc::{zero_segments, AllocMap, ReadPiece};
use crate::array::{Array, ArrayError, WriteBuf};
use crate::buf::{self, Segments};
use crate::dev::BlockDev;
use crate::readahead::{job_len, Found, ReadAhead, ReadAheadStats};
use futures::future::join_all;
use std::sync::{Arc, Weak};
use uraid_core::alloc::{MAP_OFFSET, PAGE};
use uraid_core::{Geometry, MemberSet};

/// A run of the volume that is allocated (holds written data) or a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub off: u64,
    pub len: u64,
    pub allocated: bool,
}

pub struct Volume<D: BlockDev> {
    array: Arc<Array<D>>,
    map: Arc<AllocMap>,
    /// Every map page written from memory this session (`sync_map`).
    map_synced: std::sync::atomic::AtomicBool,
    map_sync: tokio::sync::Mutex<()>,
    /// Read-ahead (readahead.rs), unless the array's options turn it off.
    ra: Option<ReadAhead>,
    /// This volume, for the prefetch tasks it spawns.
    me: Weak<Volume<D>>,
}

/// What read-ahead did for a read (`Volume::read_ahead`).
enum Ahead<'a> {
    /// Served from the cache.
    Hit(Vec<ReadPiece>),
    /// Read the members, holding this registration meanwhile (None: read-ahead is off).
    Miss(Option<crate::readahead::Reading<'a>>),
}

/// A prefetch's task: completes its job as failed if the task is dropped before it
/// finishes (readahead.rs: every prefetch completes).
struct Prefetch<D: BlockDev> {
    vol: Arc<Volume<D>>,
    job: Option<crate::readahead::Job>,
}

impl<D: BlockDev> Drop for Prefetch<D> {
    fn drop(&mut self) {
        if let (Some(job), Some(ra)) = (self.job.take(), &self.vol.ra) {
            ra.complete(job, None);
        }
    }
}

/// Calls `ReadAhead::changed` when dropped: a change of the volume's contents ends (done,
/// failed or abandoned) before it is acknowledged.
struct Changing<'a>(Option<&'a ReadAhead>, u64, u64);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        if let Some(ra) = self.0 {
            ra.changed(self.1, self.2);
        }
    }
}

impl<D: BlockDev> Volume<D> {
    /// `map`: the allocation map as loaded (`assemble::load_map`; bit g of word g/64); None
    /// treats every granule as allocated (the safe assumption when nothing is known).
    pub fn new(array: Arc<Array<D>>, map: Option<Vec<u64>>) -> Arc<Self> {
        let map = Arc::new(AllocMap::new(array.geometry(), map));
        // Background walks (rebuild, replace, scrub) skip units no granule data is in.
        let (m, sdb) = (map.clone(), array.geometry().stripe_data_bytes());
        array.set_allocation(Box::new(move |unit, filling| {
            let g = unit * sdb / m.granule;
            if filling {
                m.in_use(g)
            } else {
                m.is_set_in_range(g)
            }
        }));
        let budget = array.read_ahead_budget();
        let ra = (budget > 0).then(|| {
            let g = array.geometry();
            let job = job_len(g.stripe_data_bytes(), g.data_run());
            ReadAhead::new(g.stripe_data_bytes(), g.volume_size(), budget, job)
        });
        Arc::new_cyclic(|me| Volume {
            array,
            map,
            map_synced: std::sync::atomic::AtomicBool::new(false),
            map_sync: tokio::sync::Mutex::new(()),
            ra,
            me: me.clone(),
        })
    }

    pub fn array(&self) -> &Arc<Array<D>> {
        &self.array
    }

    pub fn geometry(&self) -> &Geometry {
        self.array.geometry()
    }

    pub fn size(&self) -> u64 {
        self.array.size()
    }

    pub fn is_serving(&self) -> bool {
        self.array.is_serving()
    }

    /// Size of one allocation-map granule (the unit of holes and of trim).
    pub fn granule(&self) -> u64 {
        self.map.granule
    }

    pub async fn flush(&self) -> Result<(), ArrayError> {
        self.array.flush().await
    }

    /// Puts `dev` into the lowest failed slot (a former member: its own) while serving (`Array::add_member_online`),
    /// then writes every allocation-map page to every live member (the new one's copy was
    /// zeroed) and flushes them. Its rebuild is the caller's to start (`Array::rebuild`).
    pub async fn add_member(self: &Arc<Self>, dev: D, uuid: [u8; 16]) -> Result<usize, String> {
        self.add_member_with(dev, uuid).await.map(|a| a.slot)
    }

    /// `add_member`, saying whether the device came back into its own slot (re-add:
    /// recovery/readd.rs).
    pub async fn add_member_with(
        self: &Arc<Self>,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<crate::Added, String> {
        let added = self.array.add_member_online(dev, uuid).await?;
        self.rewrite_map_pages().await.map_err(|e| {
            format!(
                "member {} added, but writing the allocation map failed: {e}",
                added.slot
            )
        })?;
        Ok(added)
    }

    /// Starts replacing active member `i` by `dev` while it serves (`uraid replace`,
    /// recovery/replace.rs): the replacement gets every map page; then `replace_run_slot`.
    pub async fn replace_member(
        self: &Arc<Self>,
        i: usize,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<(), String> {
        self.array.start_replace(i, dev, uuid).await?;
        self.replacement_map_pages(i).await
    }

    /// Resumes the replace of member `i` the superblocks recorded, with its replacement
    /// `dev` found at assembly (`Array::resume_replace`); then `replace_run_slot`.
    pub async fn resume_replace(
        self: &Arc<Self>,
        i: usize,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<(), String> {
        self.array.resume_replace(i, dev, uuid).await?;
        self.replacement_map_pages(i).await
    }

    /// Slot `i`'s new replacement gets every allocation-map page.
    async fn replacement_map_pages(self: &Arc<Self>, i: usize) -> Result<(), String> {
        if let Err(e) = self.rewrite_map_pages().await {
            self.array.abandon_replace_of(i);
            return Err(format!(
                "replacing member {i}: writing the allocation map failed: {e}"
            ));
        }
        if !self.array.replace_states().iter().any(|r| r.0 == i) {
            return Err(format!(
                "replacing member {i}: the replacement failed while its metadata was written"
            ));
        }
        Ok(())
    }

    /// Runs the replace started last by `replace_member` to its end (`Array::replace_run`).
    pub async fn replace_run(
        self: &Arc<Self>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<crate::ReplaceOutcome, ArrayError> {
        let o = self.array.replace_run(stop).await?;
        self.after_replace(o).await
    }

    /// Runs the replace of member `i` to its end (`Array::replace_run_slot`); when the old
    /// member failed meanwhile and the replacement took its slot, its map pages are
    /// rewritten (it is rebuilt like an added member: the caller starts the rebuild).
    pub async fn replace_run_slot(
        self: &Arc<Self>,
        i: usize,
        stop: &std::sync::atomic::AtomicBool,
        persist_every: std::time::Duration,
    ) -> Result<crate::ReplaceOutcome, ArrayError> {
        let o = self.array.replace_run_slot(i, stop, persist_every).await?;
        self.after_replace(o).await
    }

    async fn after_replace(
        self: &Arc<Self>,
        o: crate::ReplaceOutcome,
    ) -> Result<crate::ReplaceOutcome, ArrayError> {
        if let crate::ReplaceOutcome::Rebuilding { .. } = o {
            self.rewrite_map_pages().await?;
        }
        Ok(o)
    }

    /// Writes every allocation-map page to every live member and flushes (a member that
    /// got a new or replacement device has none of them).
    async fn rewrite_map_pages(self: &Arc<Self>) -> Result<(), ArrayError> {
        let v = self.clone();
        let pages = move || async move {
            for p in 0..v.map.page_locks.len() {
                v.persist_page(p, &[], &[]).await?;
            }
            v.array.flush_members().await;
            v.array.check_serving().map(|_| ())
        };
        match self.array.rt() {
            Some(rt) => rt
                .spawn_on(0, pages)
                .await
                .unwrap_or(Err(ArrayError::Shutdown)),
            None => pages().await,
        }
    }

    pub async fn close(&self) -> Result<(), ArrayError> {
        if let Some(ra) = &self.ra {
            ra.stop();
        }
        self.array.close().await
    }

    /// Runs of `[off, off+len)`, clipped to the range.
    pub fn allocation(&self, off: u64, len: u64) -> Result<Vec<Run>, ArrayError> {
        self.allocation_prefix(off, len, usize::MAX, u64::MAX)
    }

    /// The runs of a prefix of `[off, off+len)`: at most `max_runs` runs (≥ 1) and
    /// `max_granules` granules looked at (≥ 1), so the work and the list are bounded
    /// whatever the range (NBD block status answers for a prefix).
    pub fn allocation_prefix(
        &self,
        off: u64,
        len: u64,
        max_runs: usize,
        max_granules: u64,
    ) -> Result<Vec<Run>, ArrayError> {
        self.array.validate(off, len)?;
        let gr = self.map.granule;
        let end = off + len;
        let mut out: Vec<Run> = Vec::new();
        let mut pos = off;
        let mut looked = 0u64;
        while pos < end && looked < max_granules.max(1) {
            let g = pos / gr;
            let next = ((g + 1) * gr).min(end);
            let a = self.map.is_set(g);
            looked += 1;
            let full = out.len() >= max_runs.max(1);
            match out.last_mut() {
                Some(last) if last.allocated == a => last.len += next - pos,
                _ if full => break,
                _ => out.push(Run {
                    off: pos,
                    len: next - pos,
                    allocated: a,
                }),
            }
            pos = next;
        }
        Ok(out)
    }

    /// The units `[off, off + len)` touches (for `DiscardLog::since`).
    fn units_of(&self, off: u64, len: u64) -> std::ops::Range<u64> {
        let sdb = self.geometry().stripe_data_bytes();
        off / sdb..(off + len).div_ceil(sdb)
    }

    /// Reads `[off, off + len)`; holes (clear granules) come back as zeros. Read again if a
    /// trim discarded any of its units meanwhile (array/discard.rs, `DiscardLog`).
    pub async fn read(&self, off: u64, len: u64) -> Result<Segments, ArrayError> {
        let _reading = match self.read_ahead(off, len).await? {
            Ahead::Hit(pieces) => return Ok(crate::readahead::flatten(pieces)),
            Ahead::Miss(r) => r,
        };
        self.unless_discarded(off, len, || self.read_once(off, len))
            .await
    }

    /// Read-ahead's part of a read (readahead.rs): matches it to a stream, starts the
    /// stream's prefetches, and serves it from the cache if every unit it touches is there
    /// (waiting for units in flight). Else a miss, with the read's in-flight registration
    /// (None with read-ahead off) to hold while it reads the members.
    async fn read_ahead(&self, off: u64, len: u64) -> Result<Ahead<'_>, ArrayError> {
        let Some(ra) = &self.ra else {
            return Ok(Ahead::Miss(None));
        };
        // Before anything uses the range: a read served from the cache never reaches the
        // array's checks (`check_serving` follows a hit; a miss gets both from the array).
        self.array.validate(off, len)?;
        let (jobs, reading) = ra.arrive(off, len);
        self.prefetch(ra, jobs);
        let mut waited = false;
        let found = std::future::poll_fn(|cx| match ra.find(off, len, cx, waited) {
            Found::Wait => {
                waited = true;
                std::task::Poll::Pending
            }
            Found::Hit(p) => std::task::Poll::Ready(Some(p)),
            Found::Miss => std::task::Poll::Ready(None),
        })
        .await;
        match found {
            None => {
                ra.missed(&reading);
                Ok(Ahead::Miss(Some(reading)))
            }
            Some(pieces) => {
                self.array.check_serving()?;
                Ok(Ahead::Hit(pieces))
            }
        }
    }

    /// Starts read-ahead's prefetches as tasks on this reactor (none off a reactor: their
    /// units are released at once).
    fn prefetch(&self, ra: &ReadAhead, jobs: Vec<crate::readahead::Job>) {
        for job in jobs {
            match self.me.upgrade() {
                Some(vol) if crate::reactor::current().is_some() => {
                    let (off, len) = (job.off, job.len);
                    // Owned by the task from the start: dropped unpolled, it still completes.
                    let mut p = Prefetch {
                        vol,
                        job: Some(job),
                    };
                    crate::reactor::spawn_local(async move {
                        if let Some(job) = p.job.as_mut() {
                            job.begin();
                        }
                        // Its buffers are the cache's, which the budget bounds: not
                        // the pools', which would keep them once the cache lets go.
                        let r = crate::buf::unpooled(p.vol.read_sparse_plain(off, len))
                            .await
                            .ok();
                        if let (Some(job), Some(ra)) = (p.job.take(), &p.vol.ra) {
                            ra.complete(job, r);
                        }
                    });
                }
                _ => ra.complete(job, None),
            }
        }
    }

    /// Read-ahead's counters; None when it is off.
    pub fn read_ahead_stats(&self) -> Option<ReadAheadStats> {
        self.ra.as_ref().map(|ra| ra.stats())
    }

    /// Runs `read` of `[off, off+len)` again until no discard of its units began while it
    /// ran (array/discard.rs, `DiscardLog`).
    async fn unless_discarded<T, F: std::future::Future<Output = Result<T, ArrayError>>>(
        &self,
        off: u64,
        len: u64,
        read: impl Fn() -> F,
    ) -> Result<T, ArrayError> {
        loop {
            let seen = self.array.discard_log().seq();
            let r = read().await?;
            if !self
                .array
                .discard_log()
                .since(seen, self.units_of(off, len))
            {
                return Ok(r);
            }
        }
    }

    async fn read_once(&self, off: u64, len: u64) -> Result<Segments, ArrayError> {
        // Common case first: a read inside one allocated granule needs no run list (the
        // array validates the range; out-of-range granules are never "set" here).
        let gr = self.map.granule;
        let last = off.checked_add(len).and_then(|e| e.checked_sub(1));
        if len > 0 && last.is_some_and(|l| l / gr == off / gr) && self.map.is_set_in_range(off / gr)
        {
            return self.array.read(off, len).await;
        }
        let runs = self.allocation(off, len)?;
        if runs.len() == 1 && runs[0].allocated {
            return self.array.read(off, len).await;
        }
        let mut out = Segments::default();
        for piece in Box::pin(self.read_sparse_once(off, len)).await? {
            match piece {
                ReadPiece::Data { data, .. } => out.parts.extend(data.parts),
                ReadPiece::Hole { len, .. } => out.parts.extend(zero_segments(len).parts),
            }
        }
        Ok(out)
    }

    /// Reads `[off, off+len)` as data pieces and holes (clear granules), in volume order
    /// (again if a trim discarded any of its units meanwhile, as `read`).
    pub async fn read_sparse(&self, off: u64, len: u64) -> Result<Vec<ReadPiece>, ArrayError> {
        let _reading = match self.read_ahead(off, len).await? {
            Ahead::Hit(pieces) => return Ok(pieces),
            Ahead::Miss(r) => r,
        };
        self.read_sparse_plain(off, len).await
    }

    async fn read_sparse_plain(&self, off: u64, len: u64) -> Result<Vec<ReadPiece>, ArrayError> {
        self.unless_discarded(off, len, || self.read_sparse_once(off, len))
            .await
    }

    async fn read_sparse_once(&self, off: u64, len: u64) -> Result<Vec<ReadPiece>, ArrayError> {
        let runs = self.allocation(off, len)?;
        self.array.check_serving()?;
        let reads = runs.into_iter().map(|r| async move {
            if r.allocated {
                self.array
                    .read(r.off, r.len)
                    .await
                    .map(|data| ReadPiece::Data { off: r.off, data })
            } else {
                Ok(ReadPiece::Hole {
                    off: r.off,
                    len: r.len,
                })
            }
        });
        join_all(reads).await.into_iter().collect()
    }

    /// Before the first write or trim of a session: marks the array dirty (`ensure_dirty`),
    /// then writes every map page from memory to
    /// every live member. The map in memory is the union of the members' copies, and a bit
    /// may have been on one member only (a fill whose page write a crash cut short on the
    /// others, never flushed). A write into such a granule takes the fast path and writes
    /// no page, so without this its FLUSH would make the data durable while the bit stays
    /// on that one member: losing it would turn the granule into a hole. The write's FLUSH
    /// makes these pages durable too (they completed before the write was issued).
    async fn sync_map(&self) -> Result<(), ArrayError> {
        use std::sync::atomic::Ordering;
        if self.map_synced.load(Ordering::Acquire) {
            return Ok(());
        }
        Box::pin(async {
            let _g = self.map_sync.lock().await;
            if !self.map_synced.load(Ordering::Acquire) {
                // The superblocks say "not clean" before any metadata or data is written.
                self.array.ensure_dirty().await;
                let pages = (0..self.map.page_locks.len()).map(|p| self.persist_page(p, &[], &[]));
                for r in join_all(pages).await {
                    r?;
                }
                self.map_synced.store(true, Ordering::Release);
            }
            Ok(())
        })
        .await
    }

    /// Writes `data` at `off`, filling clear granules it touches first (module docs).
    pub async fn write(&self, off: u64, data: impl Into<WriteBuf>) -> Result<(), ArrayError> {
        self.write_as(off, data.into(), true).await
    }

    /// `write` for a write the client waits to be durable (FUA): it never waits for the rest
    /// of its stripe, and ends the waits of others (`Array::write_as`, stripe/plug.rs).
    pub async fn write_now(&self, off: u64, data: impl Into<WriteBuf>) -> Result<(), ArrayError> {
        self.write_as(off, data.into(), false).await
    }

    async fn write_as(&self, off: u64, data: WriteBuf, may_wait: bool) -> Result<(), ArrayError> {
        let len = data.len() as u64;
        self.array.validate(off, len)?;
        let _changing = Changing(self.ra.as_ref(), off, len);
        if len == 0 {
            return Ok(());
        }
        self.sync_map().await?;
        let gr = self.map.granule;
        let (g0, g1) = (off / gr, (off + len - 1) / gr);
        if (g0..=g1).all(|g| self.map.is_set(g)) {
            return self.array.write_as(off, data, may_wait).await;
        }
        // First write into a granule (rare once a volume is in use): boxed, so the common
        // write's future stays small.
        Box::pin(async move {
            if !may_wait {
                // Urgent: before waiting for a granule claim a plugged fill may hold (the
                // array's own `arrive` kicks the common path).
                self.array.kick_plugs();
            }
            let mut claimed = Vec::new();
            for g in g0..=g1 {
                if !self.map.is_set(g) && self.map.claim(g).await {
                    claimed.push(g);
                }
            }
            let r = self.fill(off, &data, &claimed, may_wait).await;
            for g in claimed {
                self.map.release(g);
            }
            r
        })
        .await
    }

    /// Writes with `claimed` granules clear and ours, makes the granules durable, then
    /// persists their bits.
    async fn fill(
        &self,
        off: u64,
        data: &WriteBuf,
        claimed: &[u64],
        may_wait: bool,
    ) -> Result<(), ArrayError> {
        self.write_claimed(off, data, claimed, may_wait).await?;
        if claimed.is_empty() {
            return Ok(());
        }
        // The granules' bytes must be durable before a bit saying "allocated" can be.
        self.array.flush().await?;
        for (p, set) in by_page_of(claimed) {
            self.persist_page(p, &set, &[]).await?;
        }
        Ok(())
    }

    /// Does the write when `claimed` granules are clear and ours: partially covered claimed
    /// granules (only the first and last can be) are written whole, zeros around the data.
    async fn write_claimed(
        &self,
        off: u64,
        data: &WriteBuf,
        claimed: &[u64],
        may_wait: bool,
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
        let mut writes: Vec<(u64, WriteBuf)> = Vec::new();
        for g in [g0, g1] {
            if partial(g) && !writes.iter().any(|(o, _)| *o == span(g).0) {
                let (s, e) = span(g);
                let mut v = vec![0u8; (e - s) as usize];
                let (a, b) = (off.max(s), end.min(e));
                v[(a - s) as usize..(b - s) as usize]
                    .copy_from_slice(&data[(a - off) as usize..(b - off) as usize]);
                writes.push((s, WriteBuf::from(v)));
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
                let mid = &data[(head_end - off) as usize..(tail_start - off) as usize];
                writes.push((head_end, WriteBuf::from(mid)));
            }
        }
        let writes = writes
            .into_iter()
            .map(|(o, d)| self.array.write_as(o, d, may_wait));
        for r in join_all(writes).await {
            r?;
        }
        Ok(())
    }

    /// Makes `[off, off+len)` read as zeros. Whole granules become holes (a map update, no
    /// data I/O); the parts of partially covered allocated granules are written with zeros.
    pub async fn trim(&self, off: u64, len: u64) -> Result<(), ArrayError> {
        self.array.validate(off, len)?;
        let _changing = Changing(self.ra.as_ref(), off, len);
        self.array.check_serving()?;
        if len == 0 {
            return Ok(());
        }
        self.sync_map().await?;
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
        // Whole granules become holes: claimed (no fill runs meanwhile), their pages written
        // with the bits clear, then cleared in memory.
        let whole: Vec<u64> = (f0..f1).collect();
        for &g in &whole {
            self.map.claim_any(g).await;
        }
        let mut cleared = Ok(());
        for (p, clear) in by_page_of(&whole) {
            if cleared.is_ok() {
                cleared = self.persist_page(p, &[], &clear).await;
            }
        }
        if cleared.is_ok() && f0 < f1 && self.array.discards() {
            // The members forget the data only once the clear is durable everywhere
            // (array/discard.rs), and before the claims go: no fill runs into a granule
            // while its units are discarded.
            self.array.flush_members().await;
            cleared = self.array.check_serving().map(|_| ());
            if cleared.is_ok() {
                let sdb = self.geometry().stripe_data_bytes();
                let units = f0 * gr / sdb..(f1 * gr).min(size) / sdb;
                self.array.discard_units(units).await;
            }
        }
        for &g in &whole {
            self.map.release(g);
        }
        cleared?;
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
            for r in self.allocation(a, b - a)? {
                if r.allocated {
                    writes.push(self.write_zeros(r.off, r.len));
                }
            }
        }
        for r in join_all(writes).await {
            r?;
        }
        self.array.check_serving().map(|_| ())
    }

    /// Writes real zeros over `[off, off+len)` (bounded buffers).
    pub async fn write_zeros(&self, off: u64, len: u64) -> Result<(), ArrayError> {
        self.array.validate(off, len)?;
        const STEP: u64 = 4 << 20;
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(STEP);
            // Urgent (stripe/plug.rs): a FUA TRIM or WRITE_ZEROES is never held back by a plug.
            let zeros = WriteBuf::from(Arc::new(vec![0u8; n as usize]));
            self.write_as(pos, zeros, false).await?;
            pos += n;
        }
        Ok(())
    }

    /// Whether trimming `[off, off+len)` needs no data I/O (whole granules, or parts that are
    /// already holes): what NBD_CMD_FLAG_FAST_ZERO asks.
    pub fn zero_is_fast(&self, off: u64, len: u64) -> Result<bool, ArrayError> {
        self.array.validate(off, len)?;
        let gr = self.map.granule;
        let size = self.size();
        let end = off + len;
        let whole = |s: u64| s.is_multiple_of(gr);
        let edge_ok = |a: u64, b: u64| {
            a >= b
                || self
                    .allocation(a, b - a)
                    .is_ok_and(|runs| runs.iter().all(|r| !r.allocated))
        };
        let head = if whole(off) { off } else { (off / gr + 1) * gr };
        let tail = if whole(end) || end == size {
            end
        } else {
            end / gr * gr
        };
        if head >= tail {
            return Ok(edge_ok(off, end));
        }
        Ok(edge_ok(off, head) && edge_ok(tail, end))
    }

    /// Writes map page `p` with granules `set` set and `clear` cleared to every live member,
    /// then applies the change in memory, under the page's lock: memory never shows a bit
    /// the members do not have, and a concurrent writer of the same page includes it.
    async fn persist_page(&self, p: usize, set: &[u64], clear: &[u64]) -> Result<(), ArrayError> {
        let lock = self.map.page_locks[p].lock().await;
        let image = Arc::new(self.map.page_image(p, set, clear));
        let at = MAP_OFFSET + (p * PAGE) as u64;
        let all = MemberSet::all(self.geometry().members);
        let members = self.array.members();
        self.array
            .each_live(all, |i| members.write_raw(i, at, buf::copy_of(&image)))
            .await;
        // Counted once written: a member flush that began before the write completed
        // must not count as covering it (journal.rs, write-back FLUSH).
        self.array.note_unjournaled();
        for &g in set {
            self.map.change(g, true);
        }
        for &g in clear {
            self.map.change(g, false);
        }
        drop(lock);
        self.array.check_serving().map(|_| ())
    }
}

/// Granules grouped by map page, in page order.
fn by_page_of(granules: &[u64]) -> Vec<(usize, Vec<u64>)> {
    let mut out: Vec<(usize, Vec<u64>)> = Vec::new();
    for &g in granules {
        let p = (g / uraid_core::alloc::BITS_PER_PAGE) as usize;
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some((_, v)) => v.push(g),
            None => out.push((p, vec![g])),
        }
    }
    out.sort_by_key(|(p, _)| *p);
    out
}
