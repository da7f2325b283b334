//! Executing stripe writes: group a volume write by stripe, queue each part on its stripe,
//! and run a batch as one planned stripe operation (`uraid_core::plan`).

use super::Array;
use crate::buf::{self, IoBuf, Segments};
use crate::dev::BlockDev;
use crate::reactor;
use crate::stripe::plug::{Outcome, Pace, Plug};
use crate::stripe::{Attempt, PendingWrite, Piece, PlugCheck, Turn};
use crate::{ArrayError, WriteBuf};
use futures::future::join_all;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use uraid_core::{plan_write, MemberSet, Shard, WritePlan};

/// Whole stripes merged into one member I/O each, at most (a 1 MiB run per member with 64 KiB
/// chunks).
const MERGE_STRIPES: u64 = 16;

impl<D: BlockDev> Array<D> {
    /// Parity-level write of `data` at `off`: runs of whole stripes as one I/O per member
    /// each, the rest one queued part per stripe; `pace`: whether a partial stripe may wait
    /// for the rest of its writes, or must end such a wait (stripe/plug.rs).
    pub(crate) async fn write_parity(
        self: &Arc<Self>,
        off: u64,
        data: &WriteBuf,
        pace: Pace<'_>,
    ) -> Result<(), ArrayError> {
        let (first, whole) = self.whole_stripes(off, data.len() as u64);
        if whole >= 2 && self.journal.get().is_none() && self.members.irregular().is_empty() {
            // Runs of whole stripes go to each member as one I/O per run (below); whatever a
            // run could not take goes the per-stripe way.
            let runs = (0..whole)
                .step_by(MERGE_STRIPES as usize)
                .map(|r| (first + r, (whole - r).min(MERGE_STRIPES)));
            let futs = runs.map(|(s, n)| async move {
                let rel = ((s - first) * self.geo.stripe_data_bytes()) as usize;
                if self.write_stripe_run(s, n, data, rel).await? {
                    Ok(())
                } else {
                    let len = (n * self.geo.stripe_data_bytes()) as usize;
                    Box::pin(self.write_parity_per_stripe(off, data, rel..rel + len, pace)).await
                }
            });
            for r in join_all(futs).await {
                r?;
            }
            return Ok(());
        }
        self.write_parity_per_stripe(off, data, 0..data.len(), pace)
            .await
    }

    /// Stripes `[first, first + n)` when `[off, off + len)` is exactly whole stripes.
    fn whole_stripes(&self, off: u64, len: u64) -> (u64, u64) {
        let sdb = self.geo.stripe_data_bytes();
        if !off.is_multiple_of(sdb) || !len.is_multiple_of(sdb) {
            return (0, 0);
        }
        (off / sdb, len / sdb)
    }

    /// Writes `n` whole stripes from `first` (their data at `data[rel..]`) as one operation:
    /// the stripes' locks taken in ascending order (so two runs cannot deadlock), parity
    /// encoded per stripe, and each member written once with its chunks of all `n` stripes,
    /// which lie back to back on it. Only for the plain case: every member healthy and none
    /// being rebuilt (degraded stripes are left to the per-stripe planner), no journal (its
    /// records are per stripe operation), every stripe in sync. Returns false (nothing
    /// written) when the case does not apply. A member being replaced gets its writes
    /// mirrored by `Members::write` like any other.
    async fn write_stripe_run(
        &self,
        first: u64,
        n: u64,
        data: &WriteBuf,
        rel: usize,
    ) -> Result<bool, ArrayError> {
        if self.journal.get().is_some() || !self.members.irregular().is_empty() {
            return Ok(false);
        }
        let stripes = first..first + n;
        let mut held = Vec::with_capacity(n as usize);
        for s in stripes.clone() {
            held.push(self.locks.lock(s).await);
        }
        // Releases the run's stripes, in order.
        let unlock = || drop(held);
        match self.plain_case(stripes) {
            Ok(true) => {}
            r => {
                unlock();
                return r;
            }
        }
        let (k, chunk) = (self.geo.data_chunks(), self.geo.chunk as usize);
        self.write_full_stripes(first, n, |r, i| (data, rel + (r * k + i) * chunk))
            .await;
        unlock();
        self.check_serving().map(|_| true)
    }

    /// Writes the `n` whole stripes from `first`, chunk `i` of stripe `first + r` taken from
    /// `src(r, i)` (a buffer and the chunk's offset in it): parity encoded per stripe from
    /// those bytes, and each member written once with its chunks of all `n` stripes, which
    /// lie back to back on it: a gather write of the buffers where they are (no copy) where
    /// it holds data, of the encoder's output where it holds parity. The caller holds the
    /// stripes and checked `plain_case`.
    async fn write_full_stripes<'a>(
        &self,
        first: u64,
        n: u64,
        src: impl Fn(usize, usize) -> (&'a WriteBuf, usize),
    ) {
        let g = &self.geo;
        let (k, mp, chunk) = (g.data_chunks(), g.parity(), g.chunk as usize);
        let mut gathers: Vec<Segments> = (0..k + mp).map(|_| Segments::default()).collect();
        for r in 0..n as usize {
            let stripe = first + r as u64;
            let srcs: Vec<&[u8]> = (0..k)
                .map(|i| {
                    let (b, o) = src(r, i);
                    &b[o..o + chunk]
                })
                .collect();
            let mut parity: Vec<IoBuf> = (0..mp).map(|_| buf::alloc(chunk)).collect();
            self.encode(&srcs, &mut parity);
            for i in 0..k {
                let (b, o) = src(r, i);
                gathers[g.data_member(stripe, i)]
                    .parts
                    .push(b.segment(o..o + chunk));
            }
            for (j, p) in parity.into_iter().enumerate() {
                gathers[g.parity_member(stripe, j)]
                    .parts
                    .push((Arc::new(p), 0..chunk));
            }
        }
        self.stats.add(|c| &c.full_stripe_writes, n);
        let at = g.member_offset(first, 0);
        let writes = gathers
            .into_iter()
            .enumerate()
            .map(|(m, segs)| (m, at, segs))
            .collect();
        self.write_members(writes).await;
    }

    /// Encodes the parity of `srcs` (the stripe's data chunks, or equal spans of them) into
    /// `parity`.
    fn encode(&self, srcs: &[&[u8]], parity: &mut [IoBuf]) {
        let codec = self.codec.as_ref().expect("parity level has a codec");
        let mut dsts: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
        codec.encode(srcs, &mut dsts);
    }

    /// Parity-level write of `data[range]` (volume bytes `off + range`), one queued stripe
    /// operation per stripe.
    async fn write_parity_per_stripe(
        self: &Arc<Self>,
        off: u64,
        data: &WriteBuf,
        range: std::ops::Range<usize>,
        pace: Pace<'_>,
    ) -> Result<(), ArrayError> {
        let mut parts: Vec<(u64, Vec<Piece>)> = Vec::new();
        let len = (range.end - range.start) as u64;
        for e in self.geo.map(off + range.start as u64, len) {
            let piece = Piece {
                index: e.index,
                chunk_off: e.chunk_off,
                len: e.len,
                src_off: range.start + e.buf_off as usize,
            };
            match parts.last_mut() {
                Some((s, v)) if *s == e.stripe => v.push(piece),
                _ => parts.push((e.stripe, vec![piece])),
            }
        }
        let futs = parts
            .into_iter()
            .map(|(stripe, pieces)| self.queue_stripe_write(stripe, data.clone(), pieces, pace));
        for r in join_all(futs).await {
            r?;
        }
        Ok(())
    }

    /// Queues a stripe part; if this task gets the stripe it runs one batch (its own part and
    /// whatever else queued), otherwise the holder that ran it reports the result.
    async fn queue_stripe_write(
        self: &Arc<Self>,
        stripe: u64,
        src: WriteBuf,
        pieces: Vec<Piece>,
        pace: Pace<'_>,
    ) -> Result<(), ArrayError> {
        let urgent = matches!(pace, Pace::Urgent);
        let (turn, rx) = self.locks.queue(stripe, src, pieces, urgent).await;
        match turn {
            Turn::Done(r) => r,
            Turn::Lead(held) => {
                // The stripe may be torn by a record dropped unfinished (`lock_stripe`).
                self.settle_orphans().await;
                // Let writes that are already runnable join this stripe operation.
                reactor::yield_now().await;
                if let Pace::Plug(p) = pace {
                    self.plug(stripe, p).await;
                }
                let batch = self.locks.take_batch(stripe);
                if batch.len() > 1 {
                    self.stats.add(|c| &c.merged_writes, batch.len() as u64 - 1);
                }
                let (r, tail) = if batch.is_empty() {
                    (Ok(()), None)
                } else {
                    match self.stripe_write_tiled(stripe, &batch).await {
                        Ok(true) => (Ok(()), None),
                        Ok(false) => match self.stripe_write(stripe, &batch).await {
                            Ok(tail) => (Ok(()), tail),
                            Err(e) => (Err(e), None),
                        },
                        Err(e) => (Err(e), None),
                    }
                };
                for w in batch {
                    let _ = w.done.send(r.clone());
                }
                match tail {
                    // Write-back journal: acknowledged once the record is durable; the member
                    // writes finish in the background, holding the stripe (journal.rs).
                    Some(t) => self.finish_deferred(held.detach(), t),
                    None => drop(held),
                }
                rx.await.unwrap_or(Err(ArrayError::Shutdown))
            }
        }
    }

    /// A batch that tiles `stripe` exactly (every data chunk written whole by one piece: a
    /// plugged stream of chunk-aligned requests) written as one full-stripe operation from
    /// the requests' own bytes: parity encoded from them, each member written once with a
    /// one-piece gather write, no copy into stripe buffers. Only in `write_stripe_run`'s
    /// plain case (no journal, every member healthy and none rebuilding or with bad
    /// blocks, the stripe in sync). Returns false (nothing written) when it does not apply.
    /// Caller holds the stripe.
    async fn stripe_write_tiled(
        &self,
        stripe: u64,
        batch: &[PendingWrite],
    ) -> Result<bool, ArrayError> {
        let (k, chunk) = (self.geo.data_chunks(), self.geo.chunk as usize);
        let mut tiles: Vec<Option<(&WriteBuf, usize)>> = vec![None; k];
        for w in batch {
            for p in &w.pieces {
                let tile = &mut tiles[p.index];
                if tile.is_some() || p.chunk_off != 0 || p.len != chunk as u64 {
                    return Ok(false);
                }
                *tile = Some((&w.src, p.src_off));
            }
        }
        let Some(tiles) = tiles.into_iter().collect::<Option<Vec<_>>>() else {
            return Ok(false);
        };
        if !self.plain_case(stripe..stripe + 1)? {
            return Ok(false);
        }
        self.write_full_stripes(stripe, 1, |_, i| tiles[i]).await;
        self.stats.add(|c| &c.tiled_writes, 1);
        self.check_serving().map(|_| true)
    }

    /// Whether held `stripes` are in the plain case the no-copy writes need
    /// (`write_stripe_run`, `stripe_write_tiled`): no journal, every member in service,
    /// none failed, rebuilding or with bad blocks, every stripe in sync. Checked with the
    /// stripes held and nothing awaited before their member writes are issued.
    fn plain_case(&self, mut stripes: std::ops::Range<u64>) -> Result<bool, ArrayError> {
        let failed = self.check_serving()?;
        Ok(self.journal.get().is_none()
            && failed.is_empty()
            && self.members.irregular().is_empty()
            && !stripes.any(|s| self.recovery.resync.unsynced(s)))
    }

    /// Waits, holding `stripe`, until the writes queued on it fill it (from their first byte
    /// to its end), the budget has passed, a FLUSH or urgent write comes, or an urgent write
    /// or a locker waits for the stripe (`StripeLocks::plug_check`, stripe/plug.rs). Counted
    /// as a plugged write, and as filled when the stripe filled.
    async fn plug(&self, stripe: u64, plug: Plug<'_>) {
        let (k, chunk) = (self.geo.data_chunks(), self.geo.chunk);
        let noop = futures::task::noop_waker();
        if self.locks.plug_check(stripe, k, chunk, &noop) != PlugCheck::Open {
            return;
        }
        self.stats.add(|c| &c.plugged_writes, 1);
        let mut waiter = self.streams.waiter();
        let mut timer = std::pin::pin!(reactor::sleep(plug.budget));
        let how = std::future::poll_fn(|cx| {
            if waiter.kicked(cx.waker()) {
                return Poll::Ready(Outcome::Kicked);
            }
            match self.locks.plug_check(stripe, k, chunk, cx.waker()) {
                PlugCheck::Filled => return Poll::Ready(Outcome::Filled),
                PlugCheck::Interrupted => return Poll::Ready(Outcome::Kicked),
                PlugCheck::Open => {}
            }
            timer.as_mut().poll(cx).map(|()| Outcome::RanOut)
        })
        .await;
        if how == Outcome::Filled {
            self.stats.add(|c| &c.plug_filled, 1);
        }
        plug.report(how);
    }

    /// On an unsynced stripe, notes the members of `excl` that met a media error in this
    /// operation (resync's unreadable list): not the members failed or behind now, which
    /// are out for another reason (a chunk on the bad-block list, a new device the rebuild
    /// has not reached); noted, they would keep the stripe from ever being resynced.
    fn note_media_errors(&self, stripe: u64, unsynced: bool, excl: MemberSet) {
        let errors = excl.minus(self.members.at(stripe).stale());
        if unsynced && !errors.is_empty() {
            self.recovery.resync.note_unreadable(stripe, errors);
        }
    }

    /// One stripe operation covering every queued write in `batch`. Caller holds the stripe.
    /// Returns the member writes still to do when they were deferred (write-back journal).
    async fn stripe_write(
        &self,
        stripe: u64,
        batch: &[PendingWrite],
    ) -> Result<Option<crate::journal::Deferred>, ArrayError> {
        // No parity is built on an unsynced stripe (recovery/resync.rs).
        self.resync_if_unsynced(stripe).await?;
        // Still unsynced (degraded, or a data chunk resync cannot read): its parity may
        // disagree with its data, so a chunk decoded from it is never written to a member
        // (docs/invariants.md, "Unsynced stripes are resynced before the array is clean").
        let unsynced = self.recovery.resync.unsynced(stripe);
        let g = self.geo;
        let k = g.data_chunks();
        let m = g.parity();
        let mods = StripeMods::of(batch, k);
        let span = mods.hi - mods.lo;
        let at = g.member_offset(stripe, mods.lo);
        // Members whose reads failed with a correctable error during this operation, and
        // members being rebuilt that do not hold this stripe yet: they are written (which
        // repairs them, or brings them up to date for the part written) but never read.
        let stale = self.members.at(stripe).behind;
        // Members a write met a media error on in this unsynced stripe are not read again
        // for chunks this batch leaves untouched (each read would spend the member's error
        // budget, and their chunk could only be decoded from untrusted parity), as long as
        // the stripe can do without them.
        let mut noted = if unsynced {
            let touched: MemberSet = (0..k)
                .filter(|&i| mods.touched[i])
                .map(|i| g.data_member(stripe, i))
                .collect();
            self.recovery.resync.unreadable(stripe).minus(touched)
        } else {
            MemberSet::EMPTY
        };
        let mut excl =
            if !noted.is_empty() && g.survives(self.members.failed().union(stale).union(noted)) {
                stale.union(noted)
            } else {
                stale
            };
        loop {
            let failed = self.check_serving()?;
            // A member that went behind since (a chunk put on its bad-block list, a new
            // device in a failed slot) is never read: the plan sees it, so a decode it
            // forces is one the plan made (an unplanned one makes the plan again, below).
            excl = excl.union(self.members.at(stripe).behind);
            let shard = |mem: usize| {
                if failed.contains(mem) {
                    Shard::Lost
                } else if excl.contains(mem) {
                    Shard::Unreadable
                } else {
                    Shard::Readable
                }
            };
            let data_state: Vec<Shard> = (0..k).map(|i| shard(g.data_member(stripe, i))).collect();
            let parity_state: Vec<Shard> =
                (0..m).map(|j| shard(g.parity_member(stripe, j))).collect();
            let plan = plan_write(
                &mods.covered,
                &mods.touched,
                &data_state,
                &parity_state,
                !unsynced,
            );

            let mut parity: Vec<IoBuf> = (0..m).map(|_| buf::alloc(span as usize)).collect();
            let built = match &plan {
                WritePlan::FullStripe | WritePlan::Reconstruct { .. } => {
                    let fetch: (&[usize], bool) = match &plan {
                        WritePlan::Reconstruct { fetch, decode } => (fetch, *decode),
                        _ => (&[], false),
                    };
                    let built = self
                        .reconstruct_write(stripe, &mods, fetch, unsynced, &mut excl, &mut parity)
                        .await;
                    self.note_media_errors(stripe, unsynced, excl);
                    match built? {
                        // Members noted unreadable here earlier, kept out to spare their
                        // error budget, may be what rules read-modify-write out (a parity
                        // chunk): planned once more with them read before refusing.
                        Err(_) if !excl.minus(excl.minus(noted)).is_empty() => {
                            // Not the members behind: those are never read (soak seed
                            // 153130: member 4 noted unreadable and behind at stripe 4, let
                            // back in here, made every later plan fetch it, and the
                            // unplanned decode of it re-planned forever).
                            excl = excl.minus(noted).union(stale);
                            noted = MemberSet::EMPTY;
                            continue;
                        }
                        Err(members) => {
                            return Err(self.unsynced_unreadable(stripe, members.union(failed)))
                        }
                        Ok(a) => a,
                    }
                }
                WritePlan::ReadModifyWrite {
                    parity: live_parity,
                } => {
                    let built = self
                        .rmw_write(stripe, &mods, live_parity, unsynced, &mut excl, &mut parity)
                        .await;
                    self.note_media_errors(stripe, unsynced, excl);
                    built?
                }
            };
            let data_out = match built {
                Attempt::Done(d) => d,
                Attempt::Retry => continue,
            };
            // Chunks on a bad-block list that this operation rewrites whole (the span is
            // the whole chunk; every chunk it writes holds valid data over the span: data
            // read or decoded and overlaid, parity encoded from that): cleared once written.
            let whole = mods.lo == 0 && mods.hi == g.chunk;
            let mut clears = if whole && !unsynced {
                self.bad_at(stripe, stale)
            } else {
                MemberSet::EMPTY
            };
            let written: MemberSet = data_out
                .iter()
                .map(|(i, _)| g.data_member(stripe, *i))
                .chain((0..m).map(|j| g.parity_member(stripe, j)))
                .collect();
            clears = clears.minus(failed).minus(clears.minus(written));
            let r = self
                .issue_stripe_writes(stripe, at, failed, data_out, parity, !clears.is_empty())
                .await;
            if r.is_ok() && !clears.is_empty() {
                self.clear_bad_written(stripe, clears).await;
            }
            return r;
        }
    }

    /// A full-stripe or reconstruct-write of `stripe`: reads the uncovered data chunks
    /// `fetch` (decoding those on lost members), overlays `mods`, encodes into `parity`
    /// (span-sized, one per parity chunk). Returns the data chunks to write (index, bytes),
    /// or Retry when a member read failed (the plan is made again). On an `unsynced` stripe
    /// no decoded chunk is written or encoded into parity: Err(members) (the write is
    /// refused, like a read of it) when a fetched chunk had to be decoded.
    async fn reconstruct_write(
        &self,
        stripe: u64,
        mods: &StripeMods<'_>,
        (fetch, planned_decode): (&[usize], bool),
        unsynced: bool,
        excl: &mut MemberSet,
        parity: &mut [IoBuf],
    ) -> Result<Result<Attempt<Vec<(usize, IoBuf)>>, MemberSet>, ArrayError> {
        let (touched, covered) = (&mods.touched, &mods.covered);
        let g = self.geo;
        let k = g.data_chunks();
        let (lo, span) = (mods.lo, mods.hi - mods.lo);
        let mut decoded = MemberSet::EMPTY;
        let old = match self
            .fetch_data_noting(stripe, lo, span, fetch, excl, &mut decoded)
            .await?
        {
            Attempt::Done(v) => v,
            Attempt::Retry => return Ok(Ok(Attempt::Retry)),
        };
        // On an unsynced stripe no decoded chunk may feed the new parity: encoded around a
        // wrong decode (the stripe torn), the stripe would become a codeword and later pass
        // the spare-parity check as intact. The planner picks read-modify-write there
        // whenever it can run (it carries parity forward by difference, so a mismatch stays
        // where it was, still detectable); a decode it planned anyway is refused (EIO, as a
        // read of the chunk would be). One it did not plan (a member failed or went behind
        // since) makes the plan again, which sees that member.
        if unsynced && !decoded.is_empty() {
            return Ok(if planned_decode {
                Err(*excl)
            } else {
                Ok(Attempt::Retry)
            });
        }
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
        for i in (0..k).filter(|&i| touched[i]) {
            mods.overlay(i, &mut data[i]);
        }
        let srcs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
        self.encode(&srcs, parity);
        if fetch.is_empty() {
            self.stats.add(|c| &c.full_stripe_writes, 1);
        } else {
            self.stats.add(|c| &c.rcw_writes, 1);
        }
        // Written: the touched chunks, and fetched ones that had a media error (decoded from
        // the stripe: writing them back repairs the sector, as a read would; otherwise every
        // later write here would hit it again).
        let mut data_out: Vec<(usize, IoBuf)> = Vec::new();
        let mut data: Vec<Option<IoBuf>> = data.into_iter().map(Some).collect();
        for i in
            (0..k).filter(|&i| touched[i] || (!unsynced && excl.contains(g.data_member(stripe, i))))
        {
            data_out.push((i, data[i].take().expect("chunk present")));
        }
        Ok(Ok(Attempt::Done(data_out)))
    }

    /// A read-modify-write of `stripe`: reads the touched data chunks and the live parity
    /// chunks `live_parity` (into `parity`), updates parity by the difference `mods` makes,
    /// and rewrites untouched chunks that had a media error (not on an `unsynced` stripe:
    /// they would be decoded from parity that may be wrong). Returns the data chunks to
    /// write, or Retry when a member read failed (the plan is made again).
    async fn rmw_write(
        &self,
        stripe: u64,
        mods: &StripeMods<'_>,
        live_parity: &[usize],
        unsynced: bool,
        excl: &mut MemberSet,
        parity: &mut [IoBuf],
    ) -> Result<Attempt<Vec<(usize, IoBuf)>>, ArrayError> {
        let touched = &mods.touched;
        let g = self.geo;
        let k = g.data_chunks();
        let (lo, span) = (mods.lo, mods.hi - mods.lo);
        let at = g.member_offset(stripe, lo);
        let codec = self.codec.as_ref().expect("parity level has a codec");
        let mut data_out: Vec<(usize, IoBuf)> = Vec::new();
        let tlist: Vec<usize> = (0..k).filter(|&i| touched[i]).collect();
        let mut reqs: Vec<(usize, u64, u64)> = tlist
            .iter()
            .map(|&i| (g.data_member(stripe, i), at, span))
            .collect();
        reqs.extend(
            live_parity
                .iter()
                .map(|&j| (g.parity_member(stripe, j), at, span)),
        );
        let mut bufs = match self.read_members(stripe, &reqs, excl).await {
            Attempt::Done(b) => b,
            Attempt::Retry => return Ok(Attempt::Retry),
        };
        for (p, &j) in live_parity.iter().enumerate().rev() {
            parity[j] = bufs.remove(tlist.len() + p);
        }
        for (&i, mut old) in tlist.iter().zip(bufs) {
            let mut new = old.clone();
            mods.overlay(i, &mut new);
            for (o, n) in old.iter_mut().zip(new.iter()) {
                *o ^= *n;
            }
            let mut dsts: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
            codec.update(i, &old, &mut dsts);
            data_out.push((i, new));
        }
        self.stats.add(|c| &c.rmw_writes, 1);
        // Untouched chunks whose read failed with a media error on an earlier attempt
        // (which turned it into this plan): decoded from the stripe as it is on disk and
        // written back, which repairs the sector.
        let bad: Vec<usize> = (0..k)
            .filter(|&i| !unsynced && !touched[i] && excl.contains(g.data_member(stripe, i)))
            .collect();
        if !bad.is_empty() {
            // One that cannot be decoded (a chunk on a bad-block list with another read
            // error in the span) is left as it is: the write itself needs none of them.
            match self.fetch_data(stripe, lo, span, &bad, excl).await {
                Ok(Attempt::Done(v)) => {
                    for (i, b) in bad.into_iter().zip(v) {
                        if let Some(b) = b {
                            data_out.push((i, b));
                        }
                    }
                }
                Ok(Attempt::Retry) | Err(ArrayError::Unreadable { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Attempt::Done(data_out))
    }

    /// Writes a planned stripe operation's new data chunks `data_out` and `parity` at member
    /// offset `at` to every member not in `failed` (unreadable ones included: the write
    /// repairs them); with a journal, the record is durable first, and with a write-back
    /// journal on a reactor the member writes are returned deferred (unless `no_defer`).
    async fn issue_stripe_writes(
        &self,
        stripe: u64,
        at: u64,
        failed: MemberSet,
        data_out: Vec<(usize, IoBuf)>,
        parity: Vec<IoBuf>,
        no_defer: bool,
    ) -> Result<Option<crate::journal::Deferred>, ArrayError> {
        let g = self.geo;
        let m = g.parity();
        let mut writes: Vec<(usize, IoBuf)> = Vec::with_capacity(data_out.len() + m);
        for (i, b) in data_out {
            writes.push((g.data_member(stripe, i), b));
        }
        for (j, b) in parity.into_iter().enumerate() {
            writes.push((g.parity_member(stripe, j), b));
        }
        let writes: Vec<(usize, u64, IoBuf)> = writes
            .into_iter()
            .filter(|(mem, _)| !failed.contains(*mem))
            .map(|(mem, b)| (mem, at, b))
            .collect();
        // With a journal: the whole update is durable there before any member sees it.
        let record = self.journal_log(&writes).await?;
        if let Some(r) = record {
            // Members that failed since the plan: not in the record, not written (in place:
            // no copy of the list on the usual path, where nothing failed).
            let mut writes = writes;
            writes.retain(|w| r.kept.contains(w.0));
            // A write that clears a bad block is not deferred: the chunk must be on the
            // member (and flushed) before the list says it is good.
            let (r, writes) = if self.can_defer() && !no_defer {
                let region = self.intent.deferred_begin(stripe);
                match r.defer(writes, region) {
                    Ok(d) => return Ok(Some(d)),
                    // At the bound of deferred bytes: written now, before the acknowledgement.
                    Err(back) => {
                        self.intent.deferred_end(region);
                        back
                    }
                }
            } else {
                (r, writes)
            };
            self.write_members(writes).await;
            r.done();
        } else {
            self.write_members(writes).await;
        }
        self.check_serving().map(|_| None)
    }
}

/// What a batch writes into one stripe: the span of chunk offsets it touches (`lo..hi`),
/// per data chunk its pieces in arrival order (chunk offset, length, bytes), and per data
/// chunk whether the batch changes some of it (`touched`) or all of it over the span
/// (`covered`).
struct StripeMods<'a> {
    lo: u64,
    hi: u64,
    chunks: Vec<Vec<(u64, u64, &'a [u8])>>,
    touched: Vec<bool>,
    covered: Vec<bool>,
}

impl<'a> StripeMods<'a> {
    fn of(batch: &'a [PendingWrite], k: usize) -> Self {
        let mut lo = u64::MAX;
        let mut hi = 0;
        let mut chunks: Vec<Vec<(u64, u64, &[u8])>> = vec![Vec::new(); k];
        for w in batch {
            for p in &w.pieces {
                lo = lo.min(p.chunk_off);
                hi = hi.max(p.chunk_off + p.len);
                chunks[p.index].push((
                    p.chunk_off,
                    p.len,
                    &w.src[p.src_off..p.src_off + p.len as usize],
                ));
            }
        }
        let touched: Vec<bool> = chunks.iter().map(|v| !v.is_empty()).collect();
        let covered: Vec<bool> = chunks.iter().map(|v| covers(v, lo, hi)).collect();
        StripeMods {
            lo,
            hi,
            chunks,
            touched,
            covered,
        }
    }

    /// Copies data chunk `i`'s pieces into `b` (which holds the span from `lo`), in order.
    fn overlay(&self, i: usize, b: &mut IoBuf) {
        for &(co, len, src) in &self.chunks[i] {
            let s = (co - self.lo) as usize;
            b[s..s + len as usize].copy_from_slice(src);
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
