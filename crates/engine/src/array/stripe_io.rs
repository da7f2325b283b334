//! Member reads for stripe work, and reconstruction of chunks that cannot be read.

use super::Array;
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::members::Verdict;
use crate::stripe::Attempt;
use crate::ArrayError;
use futures::future::join_all;
use uraid_core::MemberSet;

impl<D: BlockDev> Array<D> {
    /// Members this operation may read: not failed and not in `excl` (members whose read
    /// failed with a correctable error during this operation). `Failed` when the array
    /// cannot serve at all, `Unreadable` when only the exclusions make it impossible.
    pub(crate) fn readable(&self, excl: MemberSet) -> Result<MemberSet, ArrayError> {
        let f = self.check_serving()?;
        let fe = f.union(excl);
        if self.geo.survives(fe) {
            Ok(fe)
        } else {
            Err(ArrayError::Unreadable {
                members: excl.minus(f),
            })
        }
    }

    /// Applies the error policy to a failed read of member `m`: fail it, or exclude it from
    /// this operation (`excl`) so the data is reconstructed from the rest of the stripe. A
    /// read that went to a device the slot no longer has: if the slot's device now is an
    /// ordinary member (a replacement swapped in, holding every unit), nothing is excluded
    /// and the caller's retry reads it (excluded, it made a resync give a stripe up as
    /// unreadable while a replace swapped in); if it is failed or being rebuilt (a device
    /// put in the slot after a failure, which may not hold the unit yet), it is excluded,
    /// since some callers plan which members hold the unit only once. A read refused
    /// because the slot no longer served its unit (`NotHeld`) is excluded while it still
    /// does not.
    pub(crate) async fn read_failed(&self, m: usize, e: &std::io::Error, excl: &mut MemberSet) {
        match self.members.classify(m, true, e) {
            Verdict::Fail => self.fail_member(m, e).await,
            Verdict::Stale => {
                // A read refused because the slot stopped serving the unit (`NotHeld`) is
                // left out while that lasts; one that reached a replaced device, while the
                // slot's device now is failed or being rebuilt.
                let out = match crate::members::not_held_unit(e) {
                    Some(u) => !self.members.serves(m, u),
                    None => self.members.degraded().contains(m),
                };
                if out {
                    *excl = excl.with(m);
                }
            }
            Verdict::Correct => {
                tracing::warn!(
                    "member {m} ({}): read error: {e}; reconstructing from the stripe",
                    self.members.name(m).unwrap_or("?")
                );
                *excl = excl.with(m);
            }
        }
    }

    /// Reads `(member, offset, len)` requests of unit `unit` concurrently.
    pub(crate) async fn read_members(
        &self,
        unit: u64,
        reqs: &[(usize, u64, u64)],
        excl: &mut MemberSet,
    ) -> Attempt<Vec<IoBuf>> {
        let results = join_all(reqs.iter().map(|&(m, at, len)| async move {
            let units = unit..unit + 1;
            (
                m,
                self.members
                    .read(m, units, at, buf::alloc(len as usize))
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
                    self.read_failed(m, &e, excl).await;
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

    /// Contents of data chunks `want` over `[lo, lo + len)` of a stripe: read where the
    /// member is readable, decoded from k readable shards where not. Caller holds the stripe.
    pub(crate) async fn fetch_data(
        &self,
        stripe: u64,
        lo: u64,
        len: u64,
        want: &[usize],
        excl: &mut MemberSet,
    ) -> Result<Attempt<Vec<Option<IoBuf>>>, ArrayError> {
        let mut decoded = MemberSet::EMPTY;
        self.fetch_data_noting(stripe, lo, len, want, excl, &mut decoded)
            .await
    }

    /// `fetch_data`, also setting `decoded` to the members whose wanted chunks it decoded
    /// (not read).
    pub(crate) async fn fetch_data_noting(
        &self,
        stripe: u64,
        lo: u64,
        len: u64,
        want: &[usize],
        excl: &mut MemberSet,
        decoded: &mut MemberSet,
    ) -> Result<Attempt<Vec<Option<IoBuf>>>, ArrayError> {
        // Members that do not hold the unit now, taken again at every attempt: a device put
        // into a failed slot while this operation waited on another member (an add, a hot
        // spare) is rebuilt from its start and lacks the unit; a chunk on a bad-block list
        // is never read.
        let f = self.readable(excl.union(self.members.stale_at(stripe)))?;
        let g = &self.geo;
        let k = g.data_chunks();
        let at = g.member_offset(stripe, lo);
        let missing: Vec<usize> = want
            .iter()
            .copied()
            .filter(|&i| f.contains(g.data_member(stripe, i)))
            .collect();
        *decoded = missing.iter().map(|&i| g.data_member(stripe, i)).collect();
        let mut out: Vec<Option<IoBuf>> = (0..want.len()).map(|_| None).collect();
        if missing.is_empty() {
            let reqs: Vec<_> = want
                .iter()
                .map(|&i| (g.data_member(stripe, i), at, len))
                .collect();
            return Ok(match self.read_members(stripe, &reqs, excl).await {
                Attempt::Done(bufs) => Attempt::Done(bufs.into_iter().map(Some).collect()),
                Attempt::Retry => Attempt::Retry,
            });
        }
        // Decode: the first k readable shards, data before parity.
        let shard_member = |s: usize| {
            if s < k {
                g.data_member(stripe, s)
            } else {
                g.parity_member(stripe, s - k)
            }
        };
        let avail: Vec<usize> = (0..k + g.parity())
            .filter(|&s| !f.contains(shard_member(s)))
            .take(k)
            .collect();
        let reqs: Vec<_> = avail.iter().map(|&s| (shard_member(s), at, len)).collect();
        let shards = match self.read_members(stripe, &reqs, excl).await {
            Attempt::Done(b) => b,
            Attempt::Retry => return Ok(Attempt::Retry),
        };
        let mut rec: Vec<IoBuf> = missing.iter().map(|_| buf::alloc(len as usize)).collect();
        {
            let srcs: Vec<&[u8]> = shards.iter().map(|b| &b[..]).collect();
            let mut dsts: Vec<&mut [u8]> = rec.iter_mut().map(|b| &mut b[..]).collect();
            let codec = self.codec.as_ref().expect("parity level has a codec");
            codec
                .decode_using(&avail, &srcs, &missing, &mut dsts, |a, w| {
                    cached_decode_tables(codec, a, w)
                })
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
        // Wanted readable chunks not among the first k survivors (rare): read them.
        let extra: Vec<usize> = (0..want.len()).filter(|&p| out[p].is_none()).collect();
        if !extra.is_empty() {
            let reqs: Vec<_> = extra
                .iter()
                .map(|&p| (g.data_member(stripe, want[p]), at, len))
                .collect();
            match self.read_members(stripe, &reqs, excl).await {
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
}

/// Decode tables built this thread (a reactor), per erasure pattern: (k, m, the k survivors
/// used, the shards wanted). The tables depend on nothing else (the coding matrix follows
/// from k and m), so every array of that shape shares them. Bounded: cleared when full.
type TableKey = (usize, usize, u64, u64);

thread_local! {
    static DECODE_TABLES: std::cell::RefCell<std::collections::HashMap<TableKey, std::rc::Rc<uraid_core::codec::Tables>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// At most this many patterns are kept per thread (a 10-wide code with 2 lost has 45).
const DECODE_TABLES_MAX: usize = 1024;

/// `Codec::decode_tables`, kept per erasure pattern on this thread: a two-failure read no
/// longer inverts a matrix and expands ISA-L tables per request. Survivors and wanted
/// shards out of ascending order (never produced here) bypass the cache.
fn cached_decode_tables(
    codec: &uraid_core::Codec,
    avail: &[usize],
    wanted: &[usize],
) -> Result<std::rc::Rc<uraid_core::codec::Tables>, uraid_core::codec::CodecError> {
    let k = codec.data_shards();
    let used = &avail[..k.min(avail.len())];
    let ascending = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]) && v.iter().all(|&s| s < 64);
    if used.len() < k || !ascending(used) || !ascending(wanted) {
        return codec.decode_tables(avail, wanted).map(std::rc::Rc::new);
    }
    let mask = |v: &[usize]| v.iter().fold(0u64, |m, &s| m | 1 << s);
    let key = (k, codec.parity_shards(), mask(used), mask(wanted));
    DECODE_TABLES.with(|c| {
        if let Some(t) = c.borrow().get(&key) {
            return Ok(t.clone());
        }
        let t = std::rc::Rc::new(codec.decode_tables(avail, wanted)?);
        let mut c = c.borrow_mut();
        if c.len() >= DECODE_TABLES_MAX {
            c.clear();
        }
        c.insert(key, t.clone());
        Ok(t)
    })
}
