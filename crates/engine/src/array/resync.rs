//! The request-path half of resync (recovery/resync.rs is the walk): whether resync is
//! due, and the resync of one stripe, which a client write into a stripe not yet resynced
//! does first under its stripe lock (docs/design/resync.md).

use super::{Array, ArrayError};
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::stripe::Attempt;
use std::sync::atomic::Ordering;
use uraid_core::MemberSet;

impl<D: BlockDev> Array<D> {
    /// Whether this array needs a resync (assembled after an unclean stop, level with
    /// redundancy) that has not finished.
    pub fn needs_resync(&self) -> bool {
        self.recovery().resync.is_pending()
    }

    /// Ends the pending resync: entirely (`all`, the walk synced every unit), or if every
    /// unit is synced by now. In sync, superblock rounds stop recording the served set.
    pub(crate) async fn finish_resync(self: &std::sync::Arc<Self>, all: bool) {
        if all {
            self.recovery().resync.finish();
        } else {
            self.recovery().resync.finish_if_all_synced();
        }
        if !self.needs_resync() {
            // On a reactor when there are any: the round's member I/O gets timeouts (the
            // walks run on their own threads, where it would block on a hung member while
            // holding the superblock lock).
            self.on_reactor(|a| async move { a.meta().in_sync(a.members()).await })
                .await;
        }
    }

    /// Resyncs `unit` if it is still unsynced. Caller holds its stripe lock (a client write
    /// about to update the stripe). Whenever the stripe cannot be resynced — the array is
    /// degraded (started dirty and degraded on purpose, or a member failed, also during this
    /// call), or a data chunk has a media error — the write goes ahead as it would on a
    /// degraded stripe: never an error the write would not have had otherwise. A stripe with
    /// an unreadable data chunk is not retried by writes (each retry would spend the member's
    /// read-error budget); the walk reports it.
    pub(crate) async fn resync_if_unsynced(&self, unit: u64) -> Result<(), ArrayError> {
        if !self.recovery().resync.unsynced(unit) || self.recovery().resync.given_up(unit) {
            return Ok(());
        }
        let (stale, _) = self.stale_split(unit);
        if !stale.is_empty() {
            // Degraded: resync cannot run, but with a parity to spare the members present
            // may show that the stripe is not torn (then the write plans as on a synced one).
            self.verify_unsynced(unit, stale).await;
            return Ok(());
        }
        match self.resync_unit(unit).await {
            Ok(Some(repaired)) => {
                if repaired {
                    self.recovery()
                        .resync_progress
                        .repaired
                        .fetch_add(1, Ordering::Relaxed);
                }
                self.recovery().resync.mark(unit);
            }
            Ok(None) => self.recovery().resync.give_up(unit),
            Err(_) => {}
        }
        Ok(())
    }

    /// A degraded read or write meets unsynced `unit` with the members in `out` (missing,
    /// failed or behind a rebuild) unusable, each of them out since assembly. With fewer of them
    /// than parities, the chunks that can be read are more than k and can be checked
    /// against each other: decode the data from the first k, recompute every other chunk
    /// read. If all agree, the stripe is one codeword, and the chunks of the members out are
    /// the ones it determines. The unit is then marked synced (ResyncState's contract) and
    /// true returned. False: torn, no parity to spare, not a parity level, a read failed, or
    /// more than one data chunk out; the caller refuses as before. Caller holds the lock.
    ///
    /// Why at most one data chunk out. A write of one data chunk cut short leaves some of the
    /// chunks it wrote new and the others old: in each byte the stripe differs from a
    /// codeword by that byte's change times the code's column for the chunk written, on the
    /// chunks that got the write, so whether a tear fits does not depend on the data. With
    /// one data chunk out, none fits (the code is MDS: no data column proportional to
    /// another, no zero coefficient, no singular 2x2 minor). With two out, some do: EC 3+3
    /// with data chunks 0 and 2 out, a write to chunk 1 torn with parity 0 and 2 new passed
    /// the check and chunks 0 and 2 decoded as garbage (soak seed 68629; resync.rs
    /// `a_torn_write_never_passes_the_spare_parity_check`). What stays possible: a mix of
    /// two unflushed writes to the same chunk, or one write over more data chunks than there
    /// are spare parities, fits when the changes happen to stand in the code's ratio in every
    /// changed byte (likely only for writes that change a byte or a few).
    pub(crate) async fn verify_unsynced(&self, unit: u64, out: MemberSet) -> bool {
        let g = self.geo();
        if !g.level.is_parity() {
            return false;
        }
        let Ok(out) = self.readable(out) else {
            return false;
        };
        // Only for members that served no reads since the array was last in sync (this
        // session or an earlier one, `unseen_since_unsynced`): one that did may have served
        // a torn write's new bytes, and a decode (however the parities agree) would change
        // them. A member rebuilding at assembly served the units below its checkpoint then.
        if out.iter().any(|m| !self.unseen_since_unsynced(m, unit)) {
            return false;
        }
        let (k, p) = (g.data_chunks(), g.parity());
        if (0..k)
            .filter(|&d| out.contains(g.data_member(unit, d)))
            .count()
            > 1
        {
            return false;
        }
        let shard_member = |s: usize| {
            if s < k {
                g.data_member(unit, s)
            } else {
                g.parity_member(unit, s - k)
            }
        };
        let avail: Vec<usize> = (0..k + p)
            .filter(|&s| !out.contains(shard_member(s)))
            .collect();
        if avail.len() <= k {
            return false;
        }
        let at = g.member_offset(unit, 0);
        let reqs: Vec<_> = avail
            .iter()
            .map(|&s| (shard_member(s), at, g.chunk))
            .collect();
        let mut excl = MemberSet::EMPTY;
        let shards = match self.read_members(unit, &reqs, &mut excl).await {
            Attempt::Done(b) => b,
            Attempt::Retry => return false,
        };
        let codec = self.codec().as_ref().expect("parity level has a codec");
        // The data the first k chunks read determine.
        let basis = &avail[..k];
        let wanted: Vec<usize> = (0..k).filter(|d| !basis.contains(d)).collect();
        let mut decoded: Vec<IoBuf> = wanted
            .iter()
            .map(|_| buf::alloc(g.chunk as usize))
            .collect();
        {
            let srcs: Vec<&[u8]> = shards[..k].iter().map(|b| &b[..]).collect();
            let mut dsts: Vec<&mut [u8]> = decoded.iter_mut().map(|b| &mut b[..]).collect();
            if codec.decode(basis, &srcs, &wanted, &mut dsts).is_err() {
                return false;
            }
        }
        let data: Vec<&[u8]> = (0..k)
            .map(|d| match basis.iter().position(|&s| s == d) {
                Some(i) => &shards[i][..],
                None => &decoded[wanted.iter().position(|&w| w == d).unwrap_or(0)][..],
            })
            .collect();
        let mut parity: Vec<IoBuf> = (0..p).map(|_| buf::alloc(g.chunk as usize)).collect();
        {
            let mut outp: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
            codec.encode(&data, &mut outp);
        }
        let agree = avail.iter().zip(&shards).skip(k).all(|(&s, held)| {
            let want: &[u8] = if s < k { data[s] } else { &parity[s - k][..] };
            held[..] == *want
        });
        if agree {
            if out.iter().any(|m| self.meta().absent().contains(m)) {
                // Served decoded around a member absent since assembly: it is recorded
                // failed first, so it never comes back holding the torn write's other bytes.
                self.meta().record_absent_failed(self.members()).await;
            }
            self.recovery().resync.mark(unit);
            self.recovery().resync.note_verified();
        }
        agree
    }

    /// The members that may not serve `unit` (`Members::stale_at`), split: those behind a
    /// rebuild that has not reached it, and those only on a bad-block list there (which a
    /// resync reads around and rewrites where they hold parity or a mirror copy).
    fn stale_split(&self, unit: u64) -> (MemberSet, MemberSet) {
        let stale = self.members().stale_at(unit);
        let listed = self.bad_at(unit, stale);
        let degraded = self.members().degraded();
        let behind = stale
            .iter()
            .filter(|&m| {
                !listed.contains(m) || (degraded.contains(m) && unit >= self.members().rebuilt(m))
            })
            .collect();
        (behind, listed)
    }

    /// Makes one stripe consistent: parity computed from the data, or every mirror copy
    /// equal to the first readable one. A parity chunk or mirror copy with a media error or
    /// on a bad-block list is simply rewritten (which repairs the sector, and takes it off
    /// the list). `Some(true)` if anything was rewritten;
    /// `None` if no trustworthy source could be read (a data chunk, or every copy, has a
    /// media error; or the first mirror copy cannot be read and its slot served the row
    /// since the array was last in sync: the stripe stays unsynced). `Err` when the array lost a member (resync
    /// needs all of them). Caller holds the lock.
    pub(crate) async fn resync_unit(&self, unit: u64) -> Result<Option<bool>, ArrayError> {
        let g = self.geo();
        let len = g.chunk;
        let mut excl = MemberSet::EMPTY;
        for _ in 0..8 {
            self.check_serving()?;
            // Resync needs every member's chunk of the unit (one being rebuilt holds it
            // once the rebuild passed it): the walk leaves the unit to the rebuild.
            let (behind, listed) = self.stale_split(unit);
            if !behind.is_empty() {
                return Err(ArrayError::Unreadable { members: behind });
            }
            // A chunk on a bad-block list is unreadable like one with a media error: a
            // parity chunk or mirror copy there is rewritten (and comes off the list); a
            // data chunk leaves the stripe unsynced until the range is written. No rebuild
            // will pass such a unit, so it is never left to one.
            excl = excl.union(listed);
            let unreadable = |why: &str| {
                tracing::error!(
                    target: "uraid_engine::recovery",
                    "resync: stripe {unit}: member(s) {excl} cannot be read there ({why}: a \
                     media error or a bad-block list); left unsynced"
                );
                Ok(None)
            };
            // Members to read: every one but those with a media error in this stripe.
            let (members, at): (Vec<(usize, u64)>, u64) = if g.level.is_parity() {
                let at = g.member_offset(unit, 0);
                let k = g.data_chunks();
                if (0..k).any(|i| excl.contains(g.data_member(unit, i))) {
                    return unreadable("a data chunk");
                }
                let mut v: Vec<(usize, u64)> =
                    (0..k).map(|i| (g.data_member(unit, i), at)).collect();
                v.extend((0..g.parity()).map(|j| (g.parity_member(unit, j), at)));
                (v, at)
            } else {
                (g.mirror_copies(unit), 0)
            };
            let reqs: Vec<_> = members
                .iter()
                .filter(|(m, _)| !excl.contains(*m))
                .map(|&(m, base)| (m, base, len))
                .collect();
            if reqs.is_empty() {
                return unreadable("every copy");
            }
            let mut bufs = match self.read_members(unit, &reqs, &mut excl).await {
                Attempt::Done(b) => b.into_iter(),
                Attempt::Retry => continue,
            };
            // Per member in `members`: what it holds, None if it has a media error.
            let held: Vec<Option<IoBuf>> = members
                .iter()
                .map(|(m, _)| if excl.contains(*m) { None } else { bufs.next() })
                .collect();
            let writes: Vec<(usize, u64, IoBuf)> = if g.level.is_parity() {
                let k = g.data_chunks();
                let mut parity: Vec<IoBuf> =
                    (0..g.parity()).map(|_| buf::alloc(len as usize)).collect();
                {
                    let data: Vec<&[u8]> = held[..k]
                        .iter()
                        .map(|b| &b.as_ref().expect("data chunks were read")[..])
                        .collect();
                    let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
                    let codec = self.codec().as_ref().expect("parity level has a codec");
                    codec.encode(&data, &mut out);
                }
                parity
                    .into_iter()
                    .enumerate()
                    .filter(|(j, p)| held[k + j].as_ref().is_none_or(|h| h[..] != p[..]))
                    .map(|(j, p)| (g.parity_member(unit, j), at, p))
                    .collect()
            } else {
                if held[0].is_none() && !self.unseen_since_unsynced(members[0].0, unit) {
                    // The first copy (the one reads of a row not in sync use) cannot be
                    // read, and its slot served this row since the array was last in sync:
                    // another copy may hold other bytes than it served, so none is copied
                    // over the others (the row stays unsynced; reads of it refuse).
                    tracing::error!(
                        target: "uraid_engine::recovery",
                        "resync: row {unit}: its first copy (member {}) cannot be read and \
                         served reads of it since the array was last in sync; the other copies \
                         are not copied over it; left unsynced",
                        members[0].0
                    );
                    return Ok(None);
                }
                let src = held.iter().flatten().next().expect("a copy was read");
                members
                    .iter()
                    .zip(&held)
                    .filter(|(_, h)| h.as_ref().is_none_or(|h| h[..] != src[..]))
                    .map(|(&(m, base), _)| (m, base, buf::copy_of(src)))
                    .collect()
            };
            let repaired = !writes.is_empty();
            self.write_members(writes).await;
            // Whole chunks computed from a readable source: off the lists.
            self.clear_bad_written(unit, listed).await;
            return Ok(Some(repaired));
        }
        Ok(None)
    }
}
