//! Request execution: maps volume requests onto member I/O for every level, keeps parity
//! correct through partial writes and member failures, and serialises work per stripe.
//!
//! Concurrency model (ARCHITECTURE.md has the long form):
//! * Healthy reads touch no shared state: any reactor reads data chunks straight off members.
//! * Everything that reads parity or writes a parity stripe runs on the calling reactor under
//!   a per-stripe lock. The lock table is sharded (`shard()`: runs of stripes, one mutex-
//!   guarded map per shard, held only for a few instructions); waiters park with their
//!   wakers, which may belong to any reactor.
//! * Writes to a stripe queue on its slot; whoever holds the stripe drains the queue, so
//!   writes that arrive while the stripe is busy are merged into one stripe operation (a run
//!   of small sequential writes becomes full-stripe writes).

use crate::alloc::{zero_segments, AllocMap, ReadPiece};
use crate::buf::{self, IoBuf, Segments};
use crate::dev::BlockDev;
use crate::reactor::{self, RuntimeHandle};
use futures::channel::oneshot;
use futures::future::join_all;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use uraid_core::format::{MemberState, Superblock};
use uraid_core::geometry::{Extent, Level, SECTOR};
use uraid_core::{Codec, Geometry};

/// Bytes of a write request, shared between the pieces it is split into.
pub type WriteBuf = Arc<Vec<u8>>;

/// Stripes are assigned to lock-table shards in runs of this many.
const SHARD_RUN_SHIFT: u32 = 3;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ArrayError {
    #[error("request at offset {off} length {len} is beyond the end of the volume ({size} bytes)")]
    OutOfRange { off: u64, len: u64, size: u64 },
    #[error("request at offset {off} length {len} is not aligned to {SECTOR}-byte sectors")]
    Misaligned { off: u64, len: u64 },
    #[error("array has failed: {lost} of {members} members lost, {level} tolerates {tolerates}")]
    Failed {
        lost: usize,
        members: usize,
        level: Level,
        tolerates: usize,
    },
    #[error("reactor stopped before the request finished")]
    Shutdown,
}

/// Counters for the request planner, readable while the array runs.
#[derive(Debug, Default)]
pub struct Stats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub full_stripe_writes: AtomicU64,
    pub rcw_writes: AtomicU64,
    pub rmw_writes: AtomicU64,
    /// Writes that joined another write's stripe operation instead of running their own.
    pub merged_writes: AtomicU64,
}

/// One piece of a write inside a stripe: (data index, chunk offset, length, offset in the
/// write's buffer).
type Piece = (usize, u64, u64, usize);

/// A write (or part of one) waiting for its stripe.
struct PendingWrite {
    src: WriteBuf,
    /// (data index, chunk offset, length, offset in src)
    pieces: Vec<Piece>,
    done: oneshot::Sender<Result<(), ArrayError>>,
}

#[derive(Default)]
struct StripeSlot {
    locked: bool,
    waiters: VecDeque<Waker>,
    pending: Vec<PendingWrite>,
}

struct Meta {
    sb: Superblock,
    device_uuids: Vec<[u8; 16]>,
    /// The failed mask last written to the superblocks.
    persisted_failed: u64,
}

/// Outcome of one attempt at a stripe operation.
enum Attempt<T> {
    Done(T),
    /// A member failed mid-way and has been marked; plan again.
    Retry,
}

pub struct Array<D: BlockDev> {
    pub(crate) geo: Geometry,
    codec: Option<Codec>,
    devs: Vec<Option<D>>,
    data_offset: u64,
    failed: AtomicU64,
    dirty: AtomicBool,
    meta: futures::lock::Mutex<Meta>,
    locks: Vec<Mutex<HashMap<u64, StripeSlot>>>,
    pub(crate) map: AllocMap,
    pub stats: Stats,
}

impl<D: BlockDev> Array<D> {
    /// Builds an array over assembled members. `devs[i]` is None for a missing member;
    /// `sb` is the freshest superblock (any member's; index and device uuid are rewritten per
    /// member when superblocks are written). `rt` sizes the stripe lock table (8 shards per
    /// reactor).
    /// `map` is the allocation map as loaded (`assemble::load_map`); None treats every
    /// granule as allocated.
    pub fn new(
        sb: Superblock,
        device_uuids: Vec<[u8; 16]>,
        devs: Vec<Option<D>>,
        rt: Option<RuntimeHandle>,
        map: Option<Vec<u64>>,
    ) -> Arc<Self> {
        let geo = sb.geometry;
        assert_eq!(devs.len(), geo.members);
        assert_eq!(device_uuids.len(), geo.members);
        let codec = geo
            .level
            .is_parity()
            .then(|| Codec::new(geo.data_chunks(), geo.parity()).expect("geometry was validated"));
        let mut failed = 0u64;
        for (i, d) in devs.iter().enumerate() {
            if d.is_none() || sb.is_failed(i) {
                failed |= 1 << i;
            }
        }
        let persisted: u64 = (0..geo.members)
            .filter(|&i| sb.is_failed(i))
            .fold(0, |m, i| m | 1 << i);
        let shards = rt.as_ref().map_or(1, |r| r.reactors() * 8);
        Arc::new(Array {
            geo,
            codec,
            devs,
            data_offset: sb.data_offset,
            failed: AtomicU64::new(failed),
            dirty: AtomicBool::new(false),
            meta: futures::lock::Mutex::new(Meta {
                sb,
                device_uuids,
                persisted_failed: persisted,
            }),
            locks: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
            map: AllocMap::new(&geo, map),
            stats: Stats::default(),
        })
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn size(&self) -> u64 {
        self.geo.volume_size()
    }

    /// Bit i set = member i missing or failed.
    pub fn failed_mask(&self) -> u64 {
        self.failed.load(Ordering::Acquire)
    }

    pub fn is_failed(&self, member: usize) -> bool {
        self.failed_mask() & (1 << member) != 0
    }

    pub fn member_name(&self, member: usize) -> Option<&str> {
        self.devs[member].as_ref().map(|d| d.name())
    }

    pub(crate) fn check_serving(&self) -> Result<u64, ArrayError> {
        let f = self.failed_mask();
        if self.geo.can_serve(f) {
            Ok(f)
        } else {
            Err(ArrayError::Failed {
                lost: f.count_ones() as usize,
                members: self.geo.members,
                level: self.geo.level,
                tolerates: self.geo.fault_tolerance(),
            })
        }
    }

    /// Whether the array can still serve every byte.
    pub fn is_serving(&self) -> bool {
        self.check_serving().is_ok()
    }

    pub(crate) fn validate(&self, off: u64, len: u64) -> Result<(), ArrayError> {
        let size = self.size();
        if off.checked_add(len).is_none_or(|end| end > size) {
            return Err(ArrayError::OutOfRange { off, len, size });
        }
        if !off.is_multiple_of(SECTOR) || !len.is_multiple_of(SECTOR) {
            return Err(ArrayError::Misaligned { off, len });
        }
        Ok(())
    }

    pub(crate) fn dev(&self, member: usize) -> &D {
        self.devs[member]
            .as_ref()
            .expect("I/O is only issued to present members")
    }

    fn member_off(&self, off: u64) -> u64 {
        self.data_offset + off
    }

    // ---------------------------------------------------------------- stripe locks

    fn shard(&self, stripe: u64) -> usize {
        ((stripe >> SHARD_RUN_SHIFT) % self.locks.len() as u64) as usize
    }

    fn with_slot<R>(&self, stripe: u64, f: impl FnOnce(&mut StripeSlot) -> R) -> R {
        let mut t = self.locks[self.shard(stripe)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let slot = t.entry(stripe).or_default();
        let r = f(slot);
        if !slot.locked && slot.waiters.is_empty() && slot.pending.is_empty() {
            t.remove(&stripe);
        }
        r
    }

    async fn lock_stripe(&self, stripe: u64) {
        std::future::poll_fn(|cx| {
            self.with_slot(stripe, |s| {
                if s.locked {
                    s.waiters.push_back(cx.waker().clone());
                    Poll::Pending
                } else {
                    s.locked = true;
                    Poll::Ready(())
                }
            })
        })
        .await
    }

    /// Runs queued writes for the stripe (the holder does them), then releases it.
    async fn unlock_stripe(&self, stripe: u64) {
        loop {
            let batch = self.with_slot(stripe, |s| {
                if s.pending.is_empty() {
                    s.locked = false;
                    // Wake every waiter, not just the first: a task polled again while
                    // waiting registers its waker twice, and a stale entry must never
                    // swallow the only wake-up a real waiter gets. Waiters re-check the lock.
                    for w in s.waiters.drain(..) {
                        w.wake();
                    }
                }
                std::mem::take(&mut s.pending)
            });
            if batch.is_empty() {
                return;
            }
            if batch.len() > 1 {
                self.stats
                    .merged_writes
                    .fetch_add(batch.len() as u64 - 1, Ordering::Relaxed);
            }
            let r = self.stripe_write(stripe, &batch).await;
            for w in batch {
                let _ = w.done.send(r.clone());
            }
        }
    }

    // ---------------------------------------------------------------- failure handling

    /// Marks a member failed and waits until every surviving superblock records it, so that
    /// nothing acknowledged afterwards can be lost to the member coming back stale.
    pub(crate) async fn fail_member(&self, member: usize, err: &io::Error) {
        let prev = self.failed.fetch_or(1 << member, Ordering::AcqRel);
        if prev & (1 << member) == 0 {
            tracing::error!(
                "member {member} ({}) failed: {err}; marking it faulty",
                self.member_name(member).unwrap_or("?")
            );
        }
        let mut meta = self.meta.lock().await;
        self.persist(&mut meta, false).await;
    }

    /// Writes superblocks to every live member if the failed set (or `force`) says so.
    async fn persist(&self, meta: &mut Meta, force: bool) {
        for _ in 0..=self.geo.members {
            let failed = self.failed_mask();
            if !force && failed == meta.persisted_failed {
                return;
            }
            meta.sb.events += 1;
            meta.sb.utime = now();
            for i in 0..self.geo.members {
                meta.sb.states[i] = if failed & (1 << i) != 0 {
                    MemberState::Failed
                } else {
                    MemberState::Active
                };
            }
            let writes = (0..self.geo.members)
                .filter(|i| failed & (1 << i) == 0)
                .map(|i| {
                    let mut sb = meta.sb.clone();
                    sb.index = i;
                    sb.device_uuid = meta.device_uuids[i];
                    let block = buf::copy_of(&sb.encode());
                    async move {
                        let (r, _) = self.dev(i).write(0, block).await;
                        let r = match r {
                            Ok(()) => self.dev(i).flush().await,
                            Err(e) => Err(e),
                        };
                        (i, r)
                    }
                });
            let mut newly = false;
            for (i, r) in join_all(writes).await {
                if let Err(e) = r {
                    tracing::error!("member {i}: superblock update failed: {e}; marking it faulty");
                    self.failed.fetch_or(1 << i, Ordering::AcqRel);
                    newly = true;
                }
            }
            meta.persisted_failed = failed;
            if !newly {
                return;
            }
        }
    }

    pub(crate) async fn ensure_dirty(&self) {
        if self.dirty.load(Ordering::Acquire) {
            return;
        }
        let mut meta = self.meta.lock().await;
        if !self.dirty.load(Ordering::Acquire) {
            meta.sb.clean = false;
            self.persist(&mut meta, true).await;
            self.dirty.store(true, Ordering::Release);
        }
    }

    /// Flushes every member and, if anything was written since assembly, records a clean
    /// shutdown in the superblocks. A session that only read leaves them untouched: members
    /// that were merely absent are not marked failed, since their data is still current.
    pub async fn close(&self) -> Result<(), ArrayError> {
        self.flush().await?;
        let mut meta = self.meta.lock().await;
        if self.dirty.load(Ordering::Acquire) {
            meta.sb.clean = true;
            self.persist(&mut meta, true).await;
            self.dirty.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Makes every acknowledged write durable on every live member.
    pub async fn flush(&self) -> Result<(), ArrayError> {
        let f = self.failed_mask();
        let flushes = (0..self.geo.members)
            .filter(|i| f & (1 << i) == 0)
            .map(|i| async move { (i, self.dev(i).flush().await) });
        for (i, r) in join_all(flushes).await {
            if let Err(e) = r {
                self.fail_member(i, &e).await;
            }
        }
        self.check_serving().map(|_| ())
    }

    // ---------------------------------------------------------------- reads

    /// Reads `[off, off + len)`. Data comes back as segments in volume order; holes (clear
    /// granules of the allocation map) as zeros.
    pub async fn read(self: &Arc<Self>, off: u64, len: u64) -> Result<Segments, ArrayError> {
        self.validate(off, len)?;
        let runs = self.allocation(off, len);
        if runs.len() == 1 && runs[0].2 {
            return self.read_mapped(off, len).await;
        }
        let mut out = Segments::default();
        for piece in self.read_sparse(off, len).await? {
            match piece {
                ReadPiece::Data { data, .. } => out.parts.extend(data.parts),
                ReadPiece::Hole { len, .. } => out.parts.extend(zero_segments(len).parts),
            }
        }
        Ok(out)
    }

    /// Reads allocated granules from the members.
    pub(crate) async fn read_mapped(
        self: &Arc<Self>,
        off: u64,
        len: u64,
    ) -> Result<Segments, ArrayError> {
        self.validate(off, len)?;
        self.check_serving()?;
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let extents: Vec<Extent> = self.geo.map(off, len).collect();
        if !matches!(self.geo.level, Level::Raid1 | Level::Raid10) {
            if let Some(seg) = self.read_coalesced(&extents).await {
                return Ok(seg);
            }
        }
        let bufs = if extents.len() == 1 {
            vec![self.read_extent(extents[0]).await?]
        } else {
            let mut v = Vec::with_capacity(extents.len());
            for r in join_all(extents.into_iter().map(|e| self.read_extent(e))).await {
                v.push(r?);
            }
            v
        };
        Ok(Segments {
            parts: bufs
                .into_iter()
                .map(|b| {
                    let l = b.len();
                    (Arc::new(b), 0..l)
                })
                .collect(),
        })
    }

    /// Healthy fast path for multi-chunk reads: one member read per run of chunks that lie
    /// back to back on that member (a 1 MiB raid0 read over 4 members becomes 4 reads, not 16).
    /// None when there is nothing to coalesce, a member is failed, or a read fails; the
    /// per-extent path then does the work and handles the failure.
    async fn read_coalesced(&self, extents: &[Extent]) -> Option<Segments> {
        if extents.len() < 2 {
            return None;
        }
        let f = self.failed_mask();
        // Runs of (member, member offset, length); per extent (run, offset in run, length).
        let mut runs: Vec<(usize, u64, u64)> = Vec::new();
        let mut place = Vec::with_capacity(extents.len());
        for e in extents {
            let m = self.geo.data_member(e.stripe, e.index);
            if f & (1 << m) != 0 {
                return None;
            }
            let at = self.geo.member_offset(e.stripe, e.chunk_off);
            let r = match runs.iter().position(|&(rm, s, l)| rm == m && s + l == at) {
                Some(r) => r,
                None => {
                    runs.push((m, at, 0));
                    runs.len() - 1
                }
            };
            place.push((r, runs[r].2 as usize, e.len as usize));
            runs[r].2 += e.len;
        }
        if runs.len() == extents.len() {
            return None;
        }
        let reads = runs.iter().map(|&(m, at, len)| {
            self.dev(m)
                .read(self.member_off(at), buf::alloc(len as usize))
        });
        let mut bufs = Vec::with_capacity(runs.len());
        for (r, b) in join_all(reads).await {
            r.ok()?;
            bufs.push(Arc::new(b));
        }
        Some(Segments {
            parts: place
                .into_iter()
                .map(|(r, o, l)| (bufs[r].clone(), o..o + l))
                .collect(),
        })
    }

    async fn read_extent(self: &Arc<Self>, e: Extent) -> Result<IoBuf, ArrayError> {
        match self.geo.level {
            Level::Raid1 | Level::Raid10 => self.read_mirror(e).await,
            _ => loop {
                let f = self.check_serving()?;
                let m = self.geo.data_member(e.stripe, e.index);
                if f & (1 << m) != 0 {
                    self.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
                    return self.clone().degraded_read(e).await;
                }
                let at = self.member_off(self.geo.member_offset(e.stripe, e.chunk_off));
                match self.dev(m).read(at, buf::alloc(e.len as usize)).await {
                    (Ok(()), b) => return Ok(b),
                    (Err(err), _) => self.fail_member(m, &err).await,
                }
            },
        }
    }

    async fn read_mirror(&self, e: Extent) -> Result<IoBuf, ArrayError> {
        loop {
            let f = self.check_serving()?;
            let copies = self.geo.mirror_copies(e.stripe);
            // Spread reads over the copies: chunk number picks the first choice.
            let n = copies.len();
            let pick = (0..n)
                .map(|i| copies[(e.stripe as usize + i) % n])
                .find(|(m, _)| f & (1 << m) == 0);
            let Some((m, base)) = pick else {
                return Err(self.check_serving().err().unwrap_or(ArrayError::Shutdown));
            };
            match self
                .dev(m)
                .read(
                    self.member_off(base + e.chunk_off),
                    buf::alloc(e.len as usize),
                )
                .await
            {
                (Ok(()), b) => return Ok(b),
                (Err(err), _) => self.fail_member(m, &err).await,
            }
        }
    }

    /// Reconstructs a data extent whose member is gone, holding the stripe lock so that no
    /// stripe update is half done while it reads the survivors. Runs on the calling reactor.
    async fn degraded_read(self: Arc<Self>, e: Extent) -> Result<IoBuf, ArrayError> {
        self.lock_stripe(e.stripe).await;
        let r = loop {
            match self
                .fetch_data(e.stripe, e.chunk_off, e.len, &[e.index])
                .await
            {
                Ok(Attempt::Done(mut v)) => {
                    break Ok(v
                        .pop()
                        .flatten()
                        .expect("fetch_data returns what was asked"))
                }
                Ok(Attempt::Retry) => continue,
                Err(err) => break Err(err),
            }
        };
        self.unlock_stripe(e.stripe).await;
        r
    }

    /// Reads `(member, offset, len)` requests concurrently. Failing members are marked and
    /// the attempt reports Retry.
    async fn read_members(&self, reqs: &[(usize, u64, u64)]) -> Attempt<Vec<IoBuf>> {
        let results = join_all(reqs.iter().map(|&(m, at, len)| async move {
            (
                m,
                self.dev(m)
                    .read(self.member_off(at), buf::alloc(len as usize))
                    .await,
            )
        }))
        .await;
        let mut out = Vec::with_capacity(results.len());
        let mut retry = false;
        for (m, (r, b)) in results {
            match r {
                Ok(()) => out.push(b),
                Err(e) => {
                    self.fail_member(m, &e).await;
                    retry = true;
                }
            }
        }
        if retry {
            Attempt::Retry
        } else {
            Attempt::Done(out)
        }
    }

    /// Old contents of data chunks `want` over `[lo, lo + len)` of a stripe: read where the
    /// member is alive, decoded from k survivors where not. Caller holds the stripe.
    async fn fetch_data(
        &self,
        stripe: u64,
        lo: u64,
        len: u64,
        want: &[usize],
    ) -> Result<Attempt<Vec<Option<IoBuf>>>, ArrayError> {
        let f = self.check_serving()?;
        let g = &self.geo;
        let k = g.data_chunks();
        let at = g.member_offset(stripe, lo);
        let missing: Vec<usize> = want
            .iter()
            .copied()
            .filter(|&i| f & (1 << g.data_member(stripe, i)) != 0)
            .collect();
        let mut out: Vec<Option<IoBuf>> = (0..want.len()).map(|_| None).collect();
        if missing.is_empty() {
            let reqs: Vec<_> = want
                .iter()
                .map(|&i| (g.data_member(stripe, i), at, len))
                .collect();
            return Ok(match self.read_members(&reqs).await {
                Attempt::Done(bufs) => Attempt::Done(bufs.into_iter().map(Some).collect()),
                Attempt::Retry => Attempt::Retry,
            });
        }
        // Decode: the first k live shards, data before parity.
        let shard_member = |s: usize| {
            if s < k {
                g.data_member(stripe, s)
            } else {
                g.parity_member(stripe, s - k)
            }
        };
        let avail: Vec<usize> = (0..k + g.parity())
            .filter(|&s| f & (1 << shard_member(s)) == 0)
            .take(k)
            .collect();
        let reqs: Vec<_> = avail.iter().map(|&s| (shard_member(s), at, len)).collect();
        let shards = match self.read_members(&reqs).await {
            Attempt::Done(b) => b,
            Attempt::Retry => return Ok(Attempt::Retry),
        };
        let mut rec: Vec<IoBuf> = missing.iter().map(|_| buf::alloc(len as usize)).collect();
        {
            let srcs: Vec<&[u8]> = shards.iter().map(|b| &b[..]).collect();
            let mut dsts: Vec<&mut [u8]> = rec.iter_mut().map(|b| &mut b[..]).collect();
            let codec = self.codec.as_ref().expect("parity level has a codec");
            codec
                .decode(&avail, &srcs, &missing, &mut dsts)
                .expect("k live shards decode");
        }
        // Place decoded chunks, and survivors that happened to be wanted.
        let mut rec = rec.into_iter();
        let mut shards: Vec<Option<IoBuf>> = shards.into_iter().map(Some).collect();
        for (slot, &i) in out.iter_mut().zip(want) {
            if missing.contains(&i) {
                *slot = rec.next();
            } else if let Some(p) = avail.iter().position(|&s| s == i) {
                *slot = shards[p].take();
            }
        }
        // Wanted live chunks not among the first k survivors (rare): read them.
        let extra: Vec<usize> = (0..want.len()).filter(|&p| out[p].is_none()).collect();
        if !extra.is_empty() {
            let reqs: Vec<_> = extra
                .iter()
                .map(|&p| (g.data_member(stripe, want[p]), at, len))
                .collect();
            match self.read_members(&reqs).await {
                Attempt::Done(bufs) => {
                    for (p, b) in extra.into_iter().zip(bufs) {
                        out[p] = Some(b);
                    }
                }
                Attempt::Retry => return Ok(Attempt::Retry),
            }
        }
        Ok(Attempt::Done(out))
    }

    // ---------------------------------------------------------------- writes

    /// Writes `data` at `off`. Returns once every member the write touches has it (O_DIRECT
    /// completion) and the allocation map records it; FLUSH makes it durable.
    pub async fn write(self: &Arc<Self>, off: u64, data: WriteBuf) -> Result<(), ArrayError> {
        self.validate(off, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.write_allocating(off, data).await
    }

    /// Writes to the members, ignoring the allocation map.
    pub(crate) async fn write_mapped(
        self: &Arc<Self>,
        off: u64,
        data: WriteBuf,
    ) -> Result<(), ArrayError> {
        let len = data.len() as u64;
        self.validate(off, len)?;
        self.check_serving()?;
        self.ensure_dirty().await;
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        match self.geo.level {
            Level::Raid0 | Level::Raid1 | Level::Raid10 => {
                let results =
                    join_all(self.geo.map(off, len).map(|e| self.write_plain(e, &data))).await;
                results.into_iter().collect::<Result<(), _>>()?;
                self.check_serving().map(|_| ())
            }
            _ => {
                // Group extents by stripe; each stripe's part queues on that stripe.
                let mut parts: Vec<(u64, Vec<Piece>)> = Vec::new();
                for e in self.geo.map(off, len) {
                    let piece = (e.index, e.chunk_off, e.len, e.buf_off as usize);
                    match parts.last_mut() {
                        Some((s, v)) if *s == e.stripe => v.push(piece),
                        _ => parts.push((e.stripe, vec![piece])),
                    }
                }
                let futs = parts.into_iter().map(|(stripe, pieces)| {
                    let src = data.clone();
                    self.clone().queue_stripe_write(stripe, src, pieces)
                });
                for r in join_all(futs).await {
                    r?;
                }
                Ok(())
            }
        }
    }

    /// Raid0 / mirror write of one extent to every live copy.
    async fn write_plain(&self, e: Extent, data: &WriteBuf) -> Result<(), ArrayError> {
        let src = &data[e.buf_off as usize..(e.buf_off + e.len) as usize];
        let targets: Vec<(usize, u64)> = match self.geo.level {
            Level::Raid0 => vec![(
                self.geo.data_member(e.stripe, e.index),
                self.geo.member_offset(e.stripe, 0),
            )],
            _ => self.geo.mirror_copies(e.stripe),
        };
        let f = self.check_serving()?;
        let writes =
            targets
                .into_iter()
                .filter(|(m, _)| f & (1 << m) == 0)
                .map(|(m, base)| async move {
                    (
                        m,
                        self.dev(m)
                            .write(self.member_off(base + e.chunk_off), buf::copy_of(src))
                            .await
                            .0,
                    )
                });
        for (m, r) in join_all(writes).await {
            if let Err(err) = r {
                self.fail_member(m, &err).await;
            }
        }
        self.check_serving().map(|_| ())
    }

    /// Queues a stripe part; if the stripe is idle this task runs the stripe (and whatever
    /// else queues meanwhile), otherwise the current holder picks it up.
    async fn queue_stripe_write(
        self: Arc<Self>,
        stripe: u64,
        src: WriteBuf,
        pieces: Vec<Piece>,
    ) -> Result<(), ArrayError> {
        let (tx, rx) = oneshot::channel();
        let lead = self.with_slot(stripe, |s| {
            s.pending.push(PendingWrite {
                src,
                pieces,
                done: tx,
            });
            if s.locked {
                false
            } else {
                s.locked = true;
                true
            }
        });
        if lead {
            // Let writes that are already runnable join this stripe operation.
            reactor::yield_now().await;
            self.unlock_stripe(stripe).await;
        }
        rx.await.unwrap_or(Err(ArrayError::Shutdown))
    }

    /// One stripe operation covering every queued write in `batch`. Caller holds the stripe.
    async fn stripe_write(&self, stripe: u64, batch: &[PendingWrite]) -> Result<(), ArrayError> {
        let g = self.geo;
        let k = g.data_chunks();
        let m = g.parity();
        // Span of chunk offsets touched, and per data chunk the pieces in arrival order.
        let mut lo = u64::MAX;
        let mut hi = 0;
        let mut mods: Vec<Vec<(u64, u64, &[u8])>> = vec![Vec::new(); k];
        for w in batch {
            for &(i, co, len, so) in &w.pieces {
                lo = lo.min(co);
                hi = hi.max(co + len);
                mods[i].push((co, len, &w.src[so..so + len as usize]));
            }
        }
        let span = hi - lo;
        let touched: Vec<usize> = (0..k).filter(|&i| !mods[i].is_empty()).collect();
        let covered: Vec<bool> = mods.iter().map(|v| covers(v, lo, hi)).collect();
        let overlay = |i: usize, b: &mut IoBuf| {
            for &(co, len, src) in &mods[i] {
                let s = (co - lo) as usize;
                b[s..s + len as usize].copy_from_slice(src);
            }
        };
        loop {
            let f = self.check_serving()?;
            let alive = |mem: usize| f & (1 << mem) == 0;
            let live_parity: Vec<usize> = (0..m)
                .filter(|&j| alive(g.parity_member(stripe, j)))
                .collect();
            let uncovered: Vec<usize> = (0..k).filter(|&i| !covered[i]).collect();
            let rcw_reads = if uncovered.iter().all(|&i| alive(g.data_member(stripe, i))) {
                uncovered.len()
            } else {
                k
            };
            let rmw_ok = touched.iter().all(|&i| alive(g.data_member(stripe, i)));
            let rmw_reads = touched.len() + live_parity.len();
            let at = g.member_offset(stripe, lo);

            let mut data_out: Vec<(usize, IoBuf)> = Vec::with_capacity(touched.len());
            let mut parity: Vec<IoBuf> = (0..m).map(|_| buf::alloc(span as usize)).collect();
            let codec = self.codec.as_ref().expect("parity level has a codec");
            if !rmw_ok || rcw_reads <= rmw_reads {
                // Reconstruct-write (full-stripe when nothing needs reading).
                let old = match self.fetch_data(stripe, lo, span, &uncovered).await? {
                    Attempt::Done(v) => v,
                    Attempt::Retry => continue,
                };
                let mut old = old.into_iter();
                let mut data: Vec<IoBuf> = (0..k)
                    .map(|i| {
                        if covered[i] {
                            buf::alloc(span as usize)
                        } else {
                            old.next().flatten().expect("fetched")
                        }
                    })
                    .collect();
                for &i in &touched {
                    overlay(i, &mut data[i]);
                }
                {
                    let srcs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
                    let mut dsts: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
                    codec.encode(&srcs, &mut dsts);
                }
                let counter = if uncovered.is_empty() {
                    &self.stats.full_stripe_writes
                } else {
                    &self.stats.rcw_writes
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let mut data: Vec<Option<IoBuf>> = data.into_iter().map(Some).collect();
                for &i in &touched {
                    data_out.push((i, data[i].take().expect("touched chunk present")));
                }
            } else {
                // Read-modify-write: old data of touched chunks and old live parity.
                let mut reqs: Vec<(usize, u64, u64)> = touched
                    .iter()
                    .map(|&i| (g.data_member(stripe, i), at, span))
                    .collect();
                reqs.extend(
                    live_parity
                        .iter()
                        .map(|&j| (g.parity_member(stripe, j), at, span)),
                );
                let mut bufs = match self.read_members(&reqs).await {
                    Attempt::Done(b) => b,
                    Attempt::Retry => continue,
                };
                for (p, &j) in live_parity.iter().enumerate().rev() {
                    parity[j] = bufs.remove(touched.len() + p);
                }
                for (&i, mut old) in touched.iter().zip(bufs) {
                    let mut new = old.clone();
                    overlay(i, &mut new);
                    for (o, n) in old.iter_mut().zip(new.iter()) {
                        *o ^= *n;
                    }
                    let mut dsts: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
                    codec.update(i, &old, &mut dsts);
                    data_out.push((i, new));
                }
                self.stats.rmw_writes.fetch_add(1, Ordering::Relaxed);
            }
            // Write new data and parity to every live member.
            let mut writes: Vec<(usize, IoBuf)> = Vec::with_capacity(data_out.len() + m);
            for (i, b) in data_out {
                writes.push((g.data_member(stripe, i), b));
            }
            for (j, b) in parity.into_iter().enumerate() {
                writes.push((g.parity_member(stripe, j), b));
            }
            let results = join_all(
                writes
                    .into_iter()
                    .filter(|(mem, _)| alive(*mem))
                    .map(|(mem, b)| async move {
                        (mem, self.dev(mem).write(self.member_off(at), b).await.0)
                    }),
            )
            .await;
            for (mem, r) in results {
                if let Err(e) = r {
                    // The rest of the stripe is consistent without this member.
                    self.fail_member(mem, &e).await;
                }
            }
            return self.check_serving().map(|_| ());
        }
    }
}

/// Whether the pieces cover `[lo, hi)` completely.
fn covers(pieces: &[(u64, u64, &[u8])], lo: u64, hi: u64) -> bool {
    let mut iv: Vec<(u64, u64)> = pieces.iter().map(|&(o, l, _)| (o, o + l)).collect();
    iv.sort_unstable();
    let mut reach = lo;
    for (s, e) in iv {
        if s > reach {
            return false;
        }
        reach = reach.max(e);
    }
    reach >= hi
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
