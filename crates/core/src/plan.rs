//! The stripe-write planner: given which data chunks of a stripe a write covers or touches
//! over a span of chunk offsets, and which members are alive, decide how parity is brought
//! up to date. Pure: the engine executes the plan (`engine/src/stripe/write.rs`).
//!
//! * full-stripe: every data chunk is covered, parity is encoded from the new data alone;
//! * reconstruct-write: read the data chunks the write does not cover (decoding the ones
//!   whose member is gone from k survivors) and encode parity from the whole stripe;
//! * read-modify-write: read the old contents of the touched data chunks and the live parity
//!   and apply `parity ^= A[j][i] * (old ^ new)`. Needs every touched data member alive.
//!
//! Whichever reads fewer chunks wins; ties go to reconstruct-write (it also repairs parity
//! that was stale, and its reads are data reads that coalesce better). On a stripe whose
//! parity may disagree with its data (not yet resynced) a decode cannot be trusted:
//! read-modify-write wins whenever it can run.

/// What a stripe operation can do with one member's chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shard {
    /// Alive and readable.
    Readable,
    /// Alive (it is written) but a read failed in this operation: its old contents must be
    /// reconstructed, never read.
    Unreadable,
    /// Missing or failed: neither read nor written.
    Lost,
}

/// How one stripe operation updates parity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritePlan {
    /// No reads: every data chunk is covered over the span.
    FullStripe,
    /// Fetch these uncovered data chunks (read, or decode when `decode` is set because one
    /// of them lives on a lost member), then encode.
    Reconstruct { fetch: Vec<usize>, decode: bool },
    /// Read old data of the touched chunks and these live parity chunks, then update.
    ReadModifyWrite { parity: Vec<usize> },
}

impl WritePlan {
    /// Member chunks the plan reads over the span.
    pub fn reads(&self, k: usize, touched: usize) -> usize {
        match self {
            WritePlan::FullStripe => 0,
            WritePlan::Reconstruct { decode: true, .. } => k,
            WritePlan::Reconstruct { fetch, .. } => fetch.len(),
            WritePlan::ReadModifyWrite { parity } => touched + parity.len(),
        }
    }
}

/// Plans a stripe write. `covered[i]`: data chunk i is fully written over the span;
/// `touched[i]`: the write changes some of it; `data[i]`, `parity[j]`: the state of the member
/// holding data chunk i / parity j. Read-modify-write needs every touched data chunk and
/// every written parity readable (an unreadable parity must be recomputed from scratch).
///
/// `trust_decode` false (a stripe whose parity may not match its data: not yet resynced):
/// a chunk decoded from that parity must not feed new parity, or the stripe would become a
/// codeword around a wrong decode and later pass for intact. Read-modify-write is then
/// chosen whenever it can run, whatever it reads (it carries parity forward by difference
/// and keeps any mismatch where it was); a reconstruct-write that would decode is still
/// returned when nothing else can run, and the engine refuses it.
pub fn plan_write(
    covered: &[bool],
    touched: &[bool],
    data: &[Shard],
    parity: &[Shard],
    trust_decode: bool,
) -> WritePlan {
    let k = covered.len();
    debug_assert!(touched.len() == k && data.len() == k);
    let uncovered: Vec<usize> = (0..k).filter(|&i| !covered[i]).collect();
    if uncovered.is_empty() {
        return WritePlan::FullStripe;
    }
    let decode = uncovered.iter().any(|&i| data[i] != Shard::Readable);
    let rcw = WritePlan::Reconstruct {
        fetch: uncovered,
        decode,
    };
    let n_touched = touched.iter().filter(|&&t| t).count();
    let rmw_ok = (0..k).all(|i| !touched[i] || data[i] == Shard::Readable)
        && parity.iter().all(|&p| p != Shard::Unreadable);
    if !rmw_ok {
        return rcw;
    }
    let rmw = WritePlan::ReadModifyWrite {
        parity: (0..parity.len())
            .filter(|&j| parity[j] == Shard::Readable)
            .collect(),
    };
    if (decode && !trust_decode) || rmw.reads(k, n_touched) < rcw.reads(k, n_touched) {
        rmw
    } else {
        rcw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bools(n: usize, set: &[usize]) -> Vec<bool> {
        (0..n).map(|i| set.contains(&i)).collect()
    }

    fn live(v: &[bool]) -> Vec<Shard> {
        v.iter()
            .map(|&l| if l { Shard::Readable } else { Shard::Lost })
            .collect()
    }

    fn plan_write(c: &[bool], t: &[bool], d: &[bool], p: &[bool]) -> WritePlan {
        super::plan_write(c, t, &live(d), &live(p), true)
    }

    #[test]
    fn full_stripe_when_everything_is_covered() {
        let all = bools(4, &[0, 1, 2, 3]);
        assert_eq!(
            plan_write(&all, &all, &bools(4, &[0, 1, 2]), &[false, true]),
            WritePlan::FullStripe,
            "a lost member does not matter when nothing is read"
        );
    }

    #[test]
    fn small_write_on_a_wide_stripe_is_read_modify_write() {
        // 8+2, one chunk touched: rmw reads 1 + 2, rcw reads 7.
        let t = bools(8, &[3]);
        let p = plan_write(&bools(8, &[]), &t, &[true; 8], &[true, true]);
        assert_eq!(p, WritePlan::ReadModifyWrite { parity: vec![0, 1] });
        assert_eq!(p.reads(8, 1), 3);
        // Only live parity is read and updated.
        let p = plan_write(&bools(8, &[]), &t, &[true; 8], &[false, true]);
        assert_eq!(p, WritePlan::ReadModifyWrite { parity: vec![1] });
    }

    #[test]
    fn wide_write_is_reconstruct_and_ties_go_to_it() {
        // 4+1, three chunks covered: rcw reads 1, rmw 3 + 1.
        let c = bools(4, &[0, 1, 2]);
        assert_eq!(
            plan_write(&c, &c, &[true; 4], &[true]),
            WritePlan::Reconstruct {
                fetch: vec![3],
                decode: false
            }
        );
        // 3+1, one chunk touched: rcw reads 2, rmw 1 + 1: rmw. 2+1: rcw 1 vs rmw 2.
        let t = bools(2, &[0]);
        assert!(matches!(
            plan_write(&bools(2, &[0]), &t, &[true; 2], &[true]),
            WritePlan::Reconstruct { .. }
        ));
        // Tie: 4+2, two covered, one touched-only: rcw 2, rmw 3 + 2... construct a real tie:
        // 3+1 with chunk 0 covered and chunk 1 touched: rcw reads 2 (1, 2), rmw 2 + 1 = 3.
        // 2+2 with chunk 0 touched (not covered): rcw 2, rmw 1 + 2 = 3; with one parity
        // lost rmw is 1 + 1 = 2: tie -> reconstruct.
        let p = plan_write(&bools(2, &[]), &bools(2, &[0]), &[true; 2], &[true, false]);
        assert_eq!(
            p,
            WritePlan::Reconstruct {
                fetch: vec![0, 1],
                decode: false
            }
        );
    }

    #[test]
    fn unreadable_parity_forces_reconstruct() {
        let t = bools(8, &[3]);
        let p = super::plan_write(
            &bools(8, &[]),
            &t,
            &[Shard::Readable; 8],
            &[Shard::Readable, Shard::Unreadable],
            true,
        );
        assert_eq!(
            p,
            WritePlan::Reconstruct {
                fetch: (0..8).collect(),
                decode: false
            }
        );
        // An unreadable touched data chunk likewise; its old contents are decoded.
        let mut d = [Shard::Readable; 8];
        d[3] = Shard::Unreadable;
        let p = super::plan_write(&bools(8, &[]), &t, &d, &[Shard::Readable; 2], true);
        assert!(matches!(p, WritePlan::Reconstruct { decode: true, .. }));
    }

    #[test]
    fn lost_members_force_reconstruct_with_decode() {
        // Touched chunk's member lost: rmw impossible.
        let t = bools(8, &[2]);
        let live = bools(8, &[0, 1, 3, 4, 5, 6, 7]);
        let p = plan_write(&bools(8, &[]), &t, &live, &[true, true]);
        assert!(matches!(p, WritePlan::Reconstruct { decode: true, .. }));
        assert_eq!(p.reads(8, 1), 8, "decoding needs k survivors");
        // An uncovered chunk on a lost member: rcw decodes, rmw (if cheaper) still works.
        let live = bools(8, &[0, 1, 2, 3, 4, 5, 6]);
        let p = plan_write(&bools(8, &[]), &t, &live, &[true, true]);
        assert_eq!(p, WritePlan::ReadModifyWrite { parity: vec![0, 1] });
    }

    #[test]
    fn an_untrusted_decode_never_feeds_parity_when_rmw_can_run() {
        // 4+2, chunks 0 and 1 covered, chunk 3 on a lost member: rcw decodes it (reads 4),
        // rmw reads 2 + 2. Trusted: rcw wins the tie; untrusted: rmw.
        let c = bools(4, &[0, 1]);
        let d = [
            Shard::Readable,
            Shard::Readable,
            Shard::Readable,
            Shard::Lost,
        ];
        let p = [Shard::Readable; 2];
        let trusted = super::plan_write(&c, &c, &d, &p, true);
        assert!(matches!(
            trusted,
            WritePlan::Reconstruct { decode: true, .. }
        ));
        assert_eq!(
            super::plan_write(&c, &c, &d, &p, false),
            WritePlan::ReadModifyWrite { parity: vec![0, 1] }
        );
        // 3 of 4 covered, the fourth lost: rcw decodes; untrusted, rmw although it reads
        // 3 + 2 chunks against 4.
        let c = bools(4, &[0, 1, 2]);
        assert_eq!(
            super::plan_write(&c, &c, &d, &p, false),
            WritePlan::ReadModifyWrite { parity: vec![0, 1] }
        );
        // A touched chunk lost: rmw cannot run; the decoding rcw is returned (refused by
        // the engine on such a stripe).
        let t = bools(4, &[3]);
        assert!(matches!(
            super::plan_write(&bools(4, &[]), &t, &d, &p, false),
            WritePlan::Reconstruct { decode: true, .. }
        ));
        // No decode needed: the cheaper plan as usual.
        let all = [Shard::Readable; 4];
        assert_eq!(
            super::plan_write(&c, &c, &all, &p, false),
            super::plan_write(&c, &c, &all, &p, true)
        );
    }
}
