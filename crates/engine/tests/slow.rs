//! Fail-slow members (slow.rs): a member made far slower than its peers is flagged after
//! three judgements, reads of its chunks are then served by reconstruction (data exact, the
//! member read only by probes), it is still written, and the flag goes once it is fast
//! again. Never around it when that would use the last redundancy of a degraded array, nor
//! for a stripe not yet resynced; a read that cannot be reconstructed around it reads it.

use futures::executor::block_on;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::{Level, MemberSet};
use uraid_engine::{slow, Volume};
use uraid_sim::{mem_array, payload, Faults, MemDev};

const CHUNK: u64 = 4096;
const SLOW: usize = 2;

fn array(level: Level, members: usize) -> (Arc<Volume<MemDev>>, Vec<Arc<Faults>>, Vec<u8>) {
    let (vol, faults) = mem_array(level, members, CHUNK, 256 * CHUNK, None);
    let data = payload(5, vol.size() as usize);
    block_on(vol.write(0, data.clone())).unwrap();
    (vol, faults, data.to_vec())
}

/// Reads every chunk once (checking it) and writes one chunk per stripe back, then one
/// judgement.
fn round(vol: &Arc<Volume<MemDev>>, want: &[u8]) {
    read_every_chunk(vol, want);
    let size = vol.size();
    let sdb = vol.geometry().stripe_data_bytes();
    let mut off = 0;
    while off < size {
        let o = off as usize;
        block_on(vol.write(off, want[o..o + CHUNK as usize].to_vec())).unwrap();
        off += sdb;
    }
    vol.array().slow_tick();
}

/// Reads every chunk of the volume once, checking it; returns how many.
fn read_every_chunk(vol: &Arc<Volume<MemDev>>, want: &[u8]) -> u64 {
    let (size, mut off, mut reads) = (vol.size(), 0, 0);
    while off < size {
        let got = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
        assert!(
            got[..] == want[off as usize..(off + CHUNK) as usize],
            "read at {off}"
        );
        off += CHUNK;
        reads += 1;
    }
    reads
}

/// Three judgements with equal members, then member `SLOW` made slow until it is flagged
/// (three more).
fn flag_slow(vol: &Arc<Volume<MemDev>>, faults: &[Arc<Faults>], want: &[u8]) {
    for _ in 0..3 {
        round(vol, want);
    }
    faults[SLOW].delay_us.store(1500, Ordering::Relaxed);
    for _ in 0..3 {
        round(vol, want);
    }
    assert_eq!(vol.array().slow_members(), MemberSet::one(SLOW));
}

fn reads_of(faults: &Faults) -> u64 {
    faults.ops.load(Ordering::SeqCst)
}

#[test]
fn a_slow_member_is_read_around_and_still_written_then_read_again_once_fast() {
    for (level, members) in [(Level::Raid6, 6), (Level::Raid5, 4), (Level::Raid10, 4)] {
        let (vol, faults, want) = array(level, members);
        let a = vol.array().clone();
        for _ in 0..3 {
            round(&vol, &want);
        }
        assert!(a.slow_members().is_empty(), "{level:?}: equal members");
        // The member reads go to most (RAID10 reads one copy of a pair first).
        let slow = (0..members).max_by_key(|&m| reads_of(&faults[m])).unwrap();
        faults[slow].delay_us.store(1500, Ordering::Relaxed);
        for _ in 0..2 {
            round(&vol, &want);
        }
        assert!(a.slow_members().is_empty(), "{level:?}: two judgements");
        round(&vol, &want);
        assert_eq!(a.slow_members(), MemberSet::one(slow), "{level:?}: flagged");
        assert!(a.status().members[slow].slow);
        // Flagged: reads go around it (probes aside), data exact; writes still reach it.
        let before_ops = reads_of(&faults[slow]);
        let before = a.stats.snapshot();
        let reads = read_every_chunk(&vol, &want);
        let d = a.stats.snapshot().since(&before);
        let touched = reads_of(&faults[slow]) - before_ops;
        let on_slow = reads / members as u64;
        assert!(
            d.slow_reads_around >= on_slow * 3 / 4,
            "{level:?}: {} of about {on_slow} reads of its chunks went around it",
            d.slow_reads_around
        );
        assert!(
            touched <= on_slow / 4,
            "{level:?}: the slow member was read {touched} times for {on_slow} chunks"
        );
        let w = reads_of(&faults[slow]);
        block_on(vol.write(0, want[..(CHUNK * members as u64) as usize].to_vec())).unwrap();
        assert!(reads_of(&faults[slow]) > w, "{level:?}: still written");
        // Fast again: unflagged after three judgements at the fast latency and three per
        // probation stage (its writes and probes measure it; samples left from the slow time
        // may make the first one slow).
        faults[slow].delay_us.store(0, Ordering::Relaxed);
        let least = slow::AFTER as usize * (1 + slow::PROBATION.len());
        let mut rounds = 0;
        while !a.slow_members().is_empty() && rounds < least + 3 {
            round(&vol, &want);
            rounds += 1;
        }
        assert!(a.slow_members().is_empty(), "{level:?}: unflagged");
        assert!(
            rounds >= least,
            "{level:?}: unflagged after {rounds} judgements"
        );
    }
}

#[test]
fn a_flagged_member_only_probes_read_is_judged_by_them_and_unflagged_once_fast() {
    // Chunk reads, and whole-stripe reads (planned per stripe: a probe there must reach
    // the member, not be planned around again).
    for whole_stripes in [false, true] {
        let (vol, faults, want) = array(Level::Raid6, 6);
        let a = vol.array().clone();
        flag_slow(&vol, &faults, &want);
        faults[SLOW].delay_us.store(0, Ordering::Relaxed);
        // Reads only: the member serves probes alone (about one per `PROBE_EVERY`), too few
        // for one in `LATENCY_SAMPLE` to judge it; each is timed while it is flagged. After
        // `AFTER` fast judgements it is on probation (a share of its reads, whatever the
        // time), stage by stage, then unflagged.
        let least = slow::AFTER as usize * (1 + slow::PROBATION.len());
        let mut ticks = 0;
        while !a.slow_members().is_empty() && ticks < least + 3 {
            // A tick's worth of probes (however slow the host: at most 20 s).
            let (t, before) = (std::time::Instant::now(), reads_of(&faults[SLOW]));
            let mut probes = 0;
            while probes < slow::MIN_SAMPLES && t.elapsed() < std::time::Duration::from_secs(20) {
                if whole_stripes {
                    read_every_stripe(&vol, &want);
                } else {
                    read_every_chunk(&vol, &want);
                }
                probes = reads_of(&faults[SLOW]) - before;
            }
            let intervals = (t.elapsed().as_nanos() / slow::PROBE_EVERY.as_nanos()) as u64;
            let paced = ticks < slow::AFTER as usize;
            assert!(
                probes >= slow::MIN_SAMPLES && (!paced || probes <= intervals + 1),
                "whole stripes {whole_stripes}: {probes} probe reads in {:?}",
                t.elapsed()
            );
            a.slow_tick();
            ticks += 1;
        }
        assert!(
            a.slow_members().is_empty(),
            "whole stripes {whole_stripes}: unflagged"
        );
        assert!(ticks >= least, "unflagged after {ticks} judgements");
    }
}

/// Reads the volume a stripe at a time, checking it.
fn read_every_stripe(vol: &Arc<Volume<MemDev>>, want: &[u8]) {
    let (size, sdb) = (vol.size(), vol.geometry().stripe_data_bytes());
    let mut off = 0;
    while off < size {
        let got = block_on(vol.read(off, sdb)).unwrap().to_vec();
        assert!(
            got[..] == want[off as usize..(off + sdb) as usize],
            "read at {off}"
        );
        off += sdb;
    }
}

/// Two members flagged, one of them fast again: its probation sends it a share of the reads
/// of its chunks, at the last stage all of them, and those reads still go around the other
/// (whole-stripe reads want both: a probe of one is not a probe of every slow member).
#[test]
fn a_probation_of_one_slow_member_still_reads_around_another() {
    let (vol, faults, want) = array(Level::Raid6, 6);
    let a = vol.array().clone();
    for _ in 0..3 {
        round(&vol, &want);
    }
    for m in [1, SLOW] {
        faults[m].delay_us.store(1500, Ordering::Relaxed);
    }
    for _ in 0..3 {
        round(&vol, &want);
    }
    assert_eq!(a.slow_members(), MemberSet::one(1).with(SLOW));
    faults[SLOW].delay_us.store(0, Ordering::Relaxed);
    let geo = vol.geometry();
    let stripes = vol.size() / geo.stripe_data_bytes();
    // Stripe reads that want member 2's chunk.
    let on_two = (0..stripes)
        .filter(|&st| (0..geo.data_chunks()).any(|i| geo.data_member(st, i) == SLOW))
        .count() as u64;
    let least = slow::AFTER as usize * (1 + slow::PROBATION.len());
    let (mut rounds, mut all_reads_while_flagged) = (0, false);
    while a.slow_members().contains(SLOW) && rounds < least + 3 {
        round(&vol, &want);
        rounds += 1;
        let before = [reads_of(&faults[1]), reads_of(&faults[SLOW])];
        read_every_stripe(&vol, &want);
        let [one, two] = [
            reads_of(&faults[1]) - before[0],
            reads_of(&faults[SLOW]) - before[1],
        ];
        // Member 1: paced probes only (at most one per `PROBE` reads that want it).
        assert!(
            one <= stripes / slow::PROBE + 1,
            "round {rounds}: member 1 read {one} times in {stripes} stripe reads"
        );
        // On its last stage it is read for every stripe read that wants it.
        all_reads_while_flagged |= a.slow_members().contains(SLOW) && two >= on_two;
    }
    assert_eq!(a.slow_members(), MemberSet::one(1), "after {rounds} rounds");
    assert!(
        all_reads_while_flagged,
        "no stage sent member 2 all of its reads"
    );
}

#[test]
fn a_degraded_array_reads_a_slow_member_rather_than_spend_its_last_redundancy() {
    let (vol, faults, want) = array(Level::Raid6, 6);
    let a = vol.array().clone();
    flag_slow(&vol, &faults, &want);
    // One member lost: reading around the slow one would leave no redundancy. (The read
    // that first meets the dead member finds it out and does not read around either.)
    faults[0].kill();
    block_on(vol.read(0, vol.size())).unwrap();
    assert!(a.failed().contains(0));
    let before = a.stats.snapshot();
    let before_ops = reads_of(&faults[SLOW]);
    read_every_chunk(&vol, &want);
    assert!(a.failed().contains(0));
    assert_eq!(a.stats.snapshot().since(&before).slow_reads_around, 0);
    assert!(
        reads_of(&faults[SLOW]) > before_ops,
        "the slow member is read"
    );
}

#[test]
fn a_read_that_cannot_be_reconstructed_around_a_slow_member_reads_it() {
    let (vol, faults, want) = array(Level::Raid5, 4);
    let a = vol.array().clone();
    flag_slow(&vol, &faults, &want);
    // In three stripes every other member has a bad sector: no reconstruction around the
    // slow member is possible there, so reads of its chunks there must read it.
    let g = *vol.geometry();
    let sdb = g.stripe_data_bytes();
    let on_slow: Vec<(u64, usize)> = (0..g.rows())
        .filter_map(|s| {
            (0..g.data_chunks())
                .find(|&i| g.data_member(s, i) == SLOW)
                .map(|i| (s, i))
        })
        .take(3)
        .collect();
    for &(s, _) in &on_slow {
        for (m, f) in faults.iter().enumerate() {
            if m != SLOW {
                let lo = uraid_core::format::DATA_OFFSET + g.member_offset(s, 0);
                f.bad_range(lo, lo + CHUNK);
            }
        }
    }
    for &(s, i) in &on_slow {
        // (A probe reads it anyway; these six are not all probes.)
        for _ in 0..2 {
            let off = s * sdb + i as u64 * CHUNK;
            let got = block_on(vol.read(off, CHUNK))
                .unwrap_or_else(|e| panic!("stripe {s}: {e}"))
                .to_vec();
            assert!(got[..] == want[off as usize..(off + CHUNK) as usize]);
        }
    }
    assert!(a.failed().is_empty(), "nothing failed: {:?}", a.failed());
}
