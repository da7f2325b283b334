//! Fail-slow members: a member that answers but far more slowly than its peers is found
//! from the latency the member I/O path already samples (`Members::io`: one read or write
//! in `LATENCY_SAMPLE`, every one of a flagged member), and reads of its
//! chunks are served by reconstruction from the others while the level has redundancy to
//! spare (array/mod.rs, `read_holders`). It is still written, so it stays current.
//!
//! Rules:
//! * Judged once per `tick` (the server's metadata daemon calls `Array::slow_tick` every
//!   second): a member is *slow now* if its mean sampled latency over the tick is above
//!   `factor` times the median of every judged member's mean and above `FLOOR`. A member with
//!   fewer than `MIN_SAMPLES` samples since it was last judged is not judged in this tick
//!   (and keeps its flag); its samples add up until it has them, so a member too slow to
//!   complete a few sampled I/Os a second is judged over a longer window.
//! * Flagged after `AFTER` slow ticks in a row. At least three members must be judged for a
//!   median.
//! * Flagging changes only which members a read plans around; it never fails a member (the
//!   I/O timeout does that) and never changes what is written.
//! * A flagged member keeps getting a probe: a read planned around it that goes to it, once
//!   at least `PROBE` such reads and `PROBE_EVERY` have passed since the last one, so its
//!   latency is still measured when the load only reads, and a busy array does not keep
//!   hundreds of client reads a second waiting for it. Only reads that want its chunks
//!   count. Every read and write of a flagged member is timed (`Members::time_every`), not
//!   one in `LATENCY_SAMPLE` (the extra ones outside the histograms), so the few probes
//!   judge it.
//! * Fast probes do not unflag a member: a member slow only under load (a throttled link, a
//!   drive that cannot keep up) looks fast to a few isolated reads. After its hold (`AFTER`
//!   ticks at or below half the threshold, doubled by each failed probation up to
//!   `MAX_HOLD`) it is on probation: one read in `PROBATION[s]` of those that want its
//!   chunks goes to it, stage by stage, `AFTER` fast ticks each; the last stage is every
//!   one of them (still planned a chunk at a time, as reads around a slow member are), so
//!   it is unflagged only once it has kept up with its whole share of the load (a member
//!   that keeps up with half of it need not keep up with all). There a tick at or below
//!   `LAST_STAGE` of the threshold counts as fast (nearly not slow by the flag's own
//!   measure; a margin left so it does not flap). A slow tick on probation ends it (back
//!   to probes, the hold doubled). A member flagged again within `FLAP_WINDOW` ticks of
//!   being unflagged has relapsed too (its hold doubled); otherwise, and for a new device
//!   in the slot, the hold starts at `AFTER`.
//! * Probes and probation shares are per member: a read that probes one flagged member (or
//!   gives it its share) still reads around the others (`probe` returns the members it
//!   goes to), and two flagged members get their probes each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uraid_core::MemberSet;

/// Mean latency below which no member counts as slow, however fast its peers.
pub const FLOOR: Duration = Duration::from_micros(200);
/// Samples a member needs in a tick to be judged.
pub const MIN_SAMPLES: u64 = 4;
/// Ticks in a row to flag or unflag.
pub const AFTER: u32 = 3;
/// At most one read in this many of those planned around a slow member goes to it (a probe).
pub const PROBE: u64 = 64;
/// And at most one per this interval: up to 10 a second, each timed, judge a member in every
/// tick where it gets `MIN_SAMPLES` (reads that would go to it count towards a probe: a
/// RAID10 read that picks the other copy does not).
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Probation stages: one read in this many of those that want a flagged member's chunks
/// goes to it, `AFTER` fast ticks per stage; unflagged after the last (all of them).
pub const PROBATION: [u64; 4] = [16, 4, 2, 1];
/// At the last probation stage a tick at or below this fraction of the threshold is fast
/// (half elsewhere): the member serves every read of its chunks there, and one that keeps
/// up with them with a margin is read again.
pub const LAST_STAGE: f64 = 0.75;
/// The longest hold (ticks of fast probes before a probation).
pub const MAX_HOLD: u32 = 96;
/// A member flagged again within this many ticks of its unflagging has relapsed: its hold
/// is doubled (else it starts at `AFTER`).
pub const FLAP_WINDOW: u64 = 120;
/// The default factor (`serve --slow-factor`).
pub const DEFAULT_FACTOR: f64 = 5.0;

/// A change of a member's state in a tick (`SlowMembers::tick`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Flagged slow: read around from now on.
    Slow,
    /// On probation: one read in this many of those that want its chunks goes to it.
    Probation(u64),
    /// Slow again on probation: read around again; the next probation after this many
    /// ticks of fast probes.
    Relapsed(u32),
    /// Unflagged: read again.
    Fast,
}

/// A member whose state changed in a tick: (member, event, its mean, the median).
pub type Change = (usize, Event, Duration, Duration);

pub(crate) struct SlowMembers {
    slow: AtomicU64,
    base: Instant,
    /// Per member on probation: one read in this many goes to it (0: not on probation).
    share: Vec<AtomicU64>,
    /// Per member: reads that wanted its chunks since its last probe (or counted towards
    /// its probation share), and when its last probe went (ns since `base`).
    seen: Vec<AtomicU64>,
    last_probe: Vec<AtomicU64>,
    judge: Mutex<Judge>,
}

struct Judge {
    /// 0: off.
    factor: f64,
    /// Per member: cumulative (sampled operations, their latency in ns) at the last tick.
    last: Vec<(u64, u64)>,
    /// Per member: ticks in a row judged slow (unflagged) or recovered (flagged).
    streak: Vec<u32>,
    /// Per member: the slot's device generation the judgement is about.
    gens: Vec<usize>,
    /// Per flagged member: its probation stage (0: probes only; s: `PROBATION[s - 1]`).
    stage: Vec<usize>,
    /// Per member: fast ticks of probes needed before a probation.
    hold: Vec<u32>,
    /// Per member: the tick it was last unflagged at.
    unflagged: Vec<Option<u64>>,
    /// Ticks so far.
    ticks: u64,
}

impl SlowMembers {
    pub(crate) fn new(members: usize) -> SlowMembers {
        SlowMembers {
            slow: AtomicU64::new(0),
            base: Instant::now(),
            share: (0..members).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..members).map(|_| AtomicU64::new(0)).collect(),
            last_probe: (0..members).map(|_| AtomicU64::new(0)).collect(),
            judge: Mutex::new(Judge {
                factor: DEFAULT_FACTOR,
                last: vec![(0, 0); members],
                streak: vec![0; members],
                gens: vec![0; members],
                stage: vec![0; members],
                hold: vec![AFTER; members],
                unflagged: vec![None; members],
                ticks: 0,
            }),
        }
    }

    /// Members flagged slow now.
    pub(crate) fn set(&self) -> MemberSet {
        MemberSet::from_bits(self.slow.load(Ordering::Acquire))
    }

    /// Sets the factor (0: off, which also clears every flag).
    pub(crate) fn set_factor(&self, factor: f64) {
        let mut j = self.judge.lock().unwrap_or_else(|e| e.into_inner());
        j.factor = factor;
        if factor <= 0.0 {
            self.slow.store(0, Ordering::Release);
            j.streak.iter_mut().for_each(|s| *s = 0);
            for i in 0..j.stage.len() {
                self.set_stage(&mut j, i, 0);
            }
        }
    }

    /// Puts flagged member `i` at probation stage `stage` (0: probes only).
    fn set_stage(&self, j: &mut Judge, i: usize, stage: usize) {
        j.stage[i] = stage;
        let share = stage.checked_sub(1).map_or(0, |s| PROBATION[s]);
        self.seen[i].store(0, Ordering::Relaxed);
        self.share[i].store(share, Ordering::Relaxed);
    }

    /// Which of `wants` (slow members whose chunks a read planned around them wants) the
    /// read should go to instead: a member on probation for one in its stage's share of its
    /// reads; else for a probe of that member, after `PROBE` of its reads and `PROBE_EVERY`
    /// since its last one (the compare-exchange gives each interval to one reactor; reads
    /// counted meanwhile are forgotten, harmless). The read still goes around the rest.
    pub(crate) fn probe(&self, wants: MemberSet) -> MemberSet {
        let mut go = MemberSet::EMPTY;
        let mut now = None;
        for i in wants.iter() {
            let (Some(share), Some(seen), Some(last_probe)) =
                (self.share.get(i), self.seen.get(i), self.last_probe.get(i))
            else {
                continue;
            };
            let share = share.load(Ordering::Relaxed);
            let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
            if share != 0 {
                if n.is_multiple_of(share) {
                    go = go.with(i);
                }
                continue;
            }
            if n < PROBE {
                continue;
            }
            let t = *now.get_or_insert_with(|| self.base.elapsed().as_nanos() as u64);
            let last = last_probe.load(Ordering::Relaxed);
            if t.saturating_sub(last) >= PROBE_EVERY.as_nanos() as u64
                && last_probe
                    .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                seen.store(0, Ordering::Relaxed);
                go = go.with(i);
            }
        }
        go
    }

    /// One tick: `now[i]` is member i's device generation and cumulative (sampled
    /// operations, latency ns), None if it is not serving (failed or missing: its flag is
    /// dropped). Another device in a slot (a replacement swapped in) drops the slot's flag
    /// and is judged from its own samples on. Returns the members whose flag changed.
    pub(crate) fn tick(&self, now: &[Option<(usize, u64, u64)>]) -> Vec<Change> {
        let mut j = self.judge.lock().unwrap_or_else(|e| e.into_inner());
        let mut flags = self.set();
        let mut means: Vec<Option<f64>> = Vec::with_capacity(now.len());
        for (i, n) in now.iter().enumerate() {
            if let Some((gen, ops, ns)) = *n {
                if j.gens[i] != gen {
                    if flags.contains(i) {
                        tracing::info!(
                            "member {i}: a new device in the slot; the old one's slow flag is \
                             dropped"
                        );
                    }
                    j.gens[i] = gen;
                    j.last[i] = (ops, ns);
                    j.streak[i] = 0;
                    j.hold[i] = AFTER;
                    j.unflagged[i] = None;
                    flags = flags.without(i);
                    means.push(None);
                    continue;
                }
            }
            let Some((_, ops, ns)) = *n else {
                // Not serving: a device put into the slot later counts from zero.
                if let Some(l) = j.last.get_mut(i) {
                    *l = (0, 0);
                }
                means.push(None);
                continue;
            };
            let (mut lops, mut lns) = j.last.get(i).copied().unwrap_or((0, 0));
            if ops < lops || ns < lns {
                // Another device in the slot (its own counters): judged from its start.
                (lops, lns) = (0, 0);
                j.streak[i] = 0;
            }
            let (d_ops, d_ns) = (ops.saturating_sub(lops), ns.saturating_sub(lns));
            if d_ops < MIN_SAMPLES {
                means.push(None);
                continue;
            }
            if let Some(l) = j.last.get_mut(i) {
                *l = (ops, ns);
            }
            means.push(Some(d_ns as f64 / d_ops as f64));
        }
        j.ticks += 1;
        let mut changes = Vec::new();
        for (i, n) in now.iter().enumerate() {
            if n.is_none() && flags.contains(i) {
                flags = flags.without(i);
                j.streak[i] = 0;
            }
        }
        let mut judged: Vec<f64> = means.iter().flatten().copied().collect();
        if j.factor > 0.0 && judged.len() >= 3 {
            judged.sort_by(|a, b| a.total_cmp(b));
            let median = judged[judged.len() / 2];
            let limit = (j.factor * median).max(FLOOR.as_nanos() as f64);
            let d = |ns: f64| Duration::from_nanos(ns as u64);
            for (i, m) in means.iter().enumerate() {
                let Some(m) = *m else { continue };
                if !flags.contains(i) {
                    j.streak[i] = if m > limit { j.streak[i] + 1 } else { 0 };
                    if j.streak[i] >= AFTER {
                        j.streak[i] = 0;
                        flags = flags.with(i);
                        // Slow again soon after its probation let it go: slow only under
                        // the whole load, so a relapse (the hold doubled).
                        let again = j.unflagged[i].is_some_and(|t| j.ticks - t <= FLAP_WINDOW);
                        j.hold[i] = if again { doubled(j.hold[i]) } else { AFTER };
                        changes.push((i, Event::Slow, d(m), d(median)));
                    }
                    continue;
                }
                let stage = j.stage[i];
                if stage > 0 && m > limit {
                    // Slow under its share of the load: read around again, a longer hold.
                    j.streak[i] = 0;
                    j.hold[i] = doubled(j.hold[i]);
                    self.set_stage(&mut j, i, 0);
                    changes.push((i, Event::Relapsed(j.hold[i]), d(m), d(median)));
                    continue;
                }
                // Half the threshold to move on; at the last stage (every read of its
                // chunks) `LAST_STAGE` of it (else a member between the two would serve
                // every read and stay reported slow).
                let fast = limit
                    * if stage == PROBATION.len() {
                        LAST_STAGE
                    } else {
                        0.5
                    };
                j.streak[i] = if m <= fast { j.streak[i] + 1 } else { 0 };
                let needed = if stage == 0 { j.hold[i] } else { AFTER };
                if j.streak[i] < needed {
                    continue;
                }
                j.streak[i] = 0;
                if stage < PROBATION.len() {
                    self.set_stage(&mut j, i, stage + 1);
                    changes.push((i, Event::Probation(PROBATION[stage]), d(m), d(median)));
                } else {
                    self.set_stage(&mut j, i, 0);
                    flags = flags.without(i);
                    j.unflagged[i] = Some(j.ticks);
                    changes.push((i, Event::Fast, d(m), d(median)));
                }
            }
        }
        for i in 0..now.len() {
            if !flags.contains(i) && j.stage[i] != 0 {
                self.set_stage(&mut j, i, 0);
            }
        }
        self.slow.store(flags.bits(), Ordering::Release);
        changes
    }
}

/// A relapsed member's next hold.
fn doubled(hold: u32) -> u32 {
    (hold * 2).min(MAX_HOLD)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `ticks` ticks where every member does 100 sampled ops at `lat[i]` µs.
    fn run(s: &SlowMembers, acc: &mut [(u64, u64)], lat: &[u64], ticks: usize) -> Vec<Change> {
        let mut all = Vec::new();
        for _ in 0..ticks {
            let now: Vec<Option<(usize, u64, u64)>> = acc
                .iter_mut()
                .zip(lat)
                .map(|(a, &l)| {
                    a.0 += 100;
                    a.1 += 100 * l * 1000;
                    Some((0, a.0, a.1))
                })
                .collect();
            all.extend(s.tick(&now));
        }
        all
    }

    #[test]
    fn a_member_far_slower_than_its_peers_is_flagged_after_three_ticks_and_unflagged_after_recovering(
    ) {
        let s = SlowMembers::new(6);
        let mut acc = vec![(0, 0); 6];
        let mut lat = vec![300; 6];
        assert!(run(&s, &mut acc, &lat, 5).is_empty(), "equal peers");
        lat[2] = 6000; // 20x
        assert!(run(&s, &mut acc, &lat, 2).is_empty(), "not yet: two ticks");
        let c = run(&s, &mut acc, &lat, 1);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].0, c[0].1), (2, Event::Slow));
        assert_eq!(s.set(), MemberSet::one(2));
        // Twice as slow is not slow (factor 5): three ticks per stage of probation, then
        // unflagged.
        lat[2] = 600;
        let events = |c: Vec<Change>| c.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>();
        for share in PROBATION {
            let c = run(&s, &mut acc, &lat, AFTER as usize);
            assert_eq!(events(c), [(2, Event::Probation(share))]);
            assert_eq!(s.set(), MemberSet::one(2), "still flagged on probation");
        }
        let c = run(&s, &mut acc, &lat, AFTER as usize);
        assert_eq!(events(c), [(2, Event::Fast)], "recovered");
        assert!(s.set().is_empty());
        lat[4] = 1200; // 4x: under the factor
        assert!(run(&s, &mut acc, &lat, 6).is_empty());
    }

    #[test]
    fn fast_members_under_the_floor_and_members_without_samples_are_never_flagged() {
        let s = SlowMembers::new(4);
        let mut acc = vec![(0, 0); 4];
        // 10 µs peers, one at 150 µs: 15x but under the 200 µs floor.
        assert!(run(&s, &mut acc, &[10, 10, 10, 150], 10).is_empty());
        // A member with no samples is not judged; two judged members are no median.
        let now = [
            Some((0, 1000, 1 << 40)),
            None,
            Some((0, 0, 0)),
            Some((0, 0, 0)),
        ];
        for _ in 0..5 {
            assert!(s.tick(&now).is_empty());
        }
        // Off: nothing flagged, and a flag is cleared.
        let s = SlowMembers::new(4);
        let mut acc = vec![(0, 0); 4];
        run(&s, &mut acc, &[300, 300, 300, 9000], 3);
        assert_eq!(s.set(), MemberSet::one(3));
        s.set_factor(0.0);
        assert!(s.set().is_empty());
        assert!(run(&s, &mut acc, &[300, 300, 300, 9000], 5).is_empty());
    }

    #[test]
    fn a_probe_goes_once_per_probe_reads_and_once_per_interval() {
        let s = SlowMembers::new(4);
        let w = MemberSet::one(1);
        let hit = |wants: MemberSet| !s.probe(wants).is_empty();
        std::thread::sleep(PROBE_EVERY);
        // Due by time: still one read in `PROBE`.
        assert_eq!((1..PROBE).filter(|_| hit(w)).count(), 0);
        let t = Instant::now();
        assert_eq!(s.probe(w), w);
        // Due by count at once: none before another interval, however many reads (the one
        // above and at most two more in 2.5 intervals; fewer if this thread stalls).
        let mut n = 1;
        while t.elapsed() < PROBE_EVERY * 5 / 2 {
            n += hit(w) as u32;
        }
        assert!((1..=3).contains(&n), "{n} probes in 2.5 intervals");
        // A read that wants no slow member never probes.
        assert!((0..10 * PROBE).all(|_| !hit(MemberSet::EMPTY)));
        // Per member: another one's probe is due at once, and reads wanting both probe each
        // (a probe names the members it goes to: the read goes around the others).
        assert!((1..=PROBE).any(|_| hit(MemberSet::one(2))));
        std::thread::sleep(PROBE_EVERY);
        let both = MemberSet::one(1).with(2);
        let probes: Vec<MemberSet> = (0..4 * PROBE)
            .map(|_| s.probe(both))
            .filter(|p| !p.is_empty())
            .collect();
        // (Paced per array it would be one of them; two of one only if this thread stalls
        // an interval. Both in one read is fine: due together.)
        for m in [1, 2] {
            let n = probes.iter().filter(|p| p.contains(m)).count();
            assert!((1..=2).contains(&n), "member {m}: {probes:?}");
        }
    }

    /// Member 3 slow (peers at 300 µs, it at 9 ms) and fast again.
    const SLOW: [u64; 4] = [300, 300, 300, 9000];
    const FAST: [u64; 4] = [300; 4];

    /// Four members with member 3 flagged, and their cumulative samples.
    fn flagged() -> (SlowMembers, Vec<(u64, u64)>) {
        let s = SlowMembers::new(4);
        let mut acc = vec![(0, 0); 4];
        run(&s, &mut acc, &SLOW, AFTER as usize);
        assert_eq!(s.set(), MemberSet::one(3));
        (s, acc)
    }

    fn events(c: Vec<Change>) -> Vec<Event> {
        c.iter().map(|c| c.1).collect()
    }

    /// Takes flagged member 3, at its hold's last tick of fast probes, through its
    /// probation: each stage's share of its reads goes to it (whatever the time, and to it
    /// alone), and after the last stage (every read) it is read again.
    fn through_probation(s: &SlowMembers, acc: &mut [(u64, u64)]) {
        let w = MemberSet::one(3);
        for share in PROBATION {
            assert_eq!(events(run(s, acc, &FAST, 1)), [Event::Probation(share)]);
            assert_eq!(s.set(), w, "still flagged on probation");
            // Reads that also want member 1 (not flagged: asked about, it gets paced probes
            // only) go around it: at most the paced probes of 160 reads.
            let got: Vec<MemberSet> = (0..160).map(|_| s.probe(w.with(1))).collect();
            let n = got.iter().filter(|p| p.contains(3)).count();
            assert_eq!(n, 160 / share as usize, "share {share}");
            let n = got.iter().filter(|p| p.contains(1)).count();
            assert!(
                n <= 160 / PROBE as usize,
                "share {share}: {n} reads of member 1"
            );
            assert!(run(s, acc, &FAST, AFTER as usize - 1).is_empty());
        }
        assert_eq!(events(run(s, acc, &FAST, 1)), [Event::Fast]);
        assert!(s.set().is_empty());
    }

    #[test]
    fn on_probation_a_share_of_its_reads_goes_to_the_member_up_to_all_of_them() {
        let (s, mut acc) = flagged();
        assert!(run(&s, &mut acc, &FAST, AFTER as usize - 1).is_empty());
        through_probation(&s, &mut acc);
        // Between half the threshold and `LAST_STAGE` of it (here 1 ms, against 300 µs
        // peers and factor 5: 750 µs to 1.125 ms): such a member stays at its stage, except
        // at the last, where it has kept up with its whole share and is read again.
        let (s, mut acc) = flagged();
        let mid = [300, 300, 300, 1000];
        assert!(run(&s, &mut acc, &FAST, AFTER as usize - 1).is_empty());
        for share in &PROBATION[..PROBATION.len() - 1] {
            assert_eq!(
                events(run(&s, &mut acc, &FAST, 1)),
                [Event::Probation(*share)]
            );
            assert!(run(&s, &mut acc, &mid, 4 * AFTER as usize).is_empty());
            assert!(run(&s, &mut acc, &FAST, AFTER as usize - 1).is_empty());
        }
        assert_eq!(events(run(&s, &mut acc, &FAST, 1)), [Event::Probation(1)]);
        // Above `LAST_STAGE` of the threshold but not above it: neither read again nor
        // read around (the margin against flapping).
        let near = [300, 300, 300, 1300];
        assert!(run(&s, &mut acc, &near, 4 * AFTER as usize).is_empty());
        assert_eq!(
            events(run(&s, &mut acc, &mid, AFTER as usize)),
            [Event::Fast]
        );
        // A member at stage 0 (here not flagged at all: `probe` is asked only about flagged
        // ones) still only gets paced probes.
        let n = (0..160)
            .filter(|_| !s.probe(MemberSet::one(1)).is_empty())
            .count();
        assert!(n <= 1, "{n}");
    }

    /// A member fast through its probation but slow under the whole load is flagged again
    /// within 3 ticks of being read again: that is a relapse too, so each cycle waits twice
    /// as long as the one before (it does not flap at the probation's pace). A new device in
    /// the slot starts over.
    #[test]
    fn a_member_flagged_again_soon_after_unflagging_waits_twice_as_long() {
        let (s, mut acc) = flagged();
        let mut hold = AFTER as usize;
        for _ in 0..3 {
            assert!(run(&s, &mut acc, &FAST, hold - 1).is_empty());
            through_probation(&s, &mut acc);
            assert_eq!(
                events(run(&s, &mut acc, &SLOW, AFTER as usize)),
                [Event::Slow]
            );
            hold *= 2;
        }
        // A new device in the slot: its own hold.
        let now: Vec<Option<(usize, u64, u64)>> = acc
            .iter()
            .enumerate()
            .map(|(i, a)| Some((usize::from(i == 3), a.0, a.1)))
            .collect();
        s.tick(&now);
        assert!(s.set().is_empty());
        let gen1 = |acc: &mut [(u64, u64)], lat: &[u64], ticks: usize| {
            let mut all = Vec::new();
            for _ in 0..ticks {
                let now: Vec<Option<(usize, u64, u64)>> = acc
                    .iter_mut()
                    .zip(lat)
                    .enumerate()
                    .map(|(i, (a, &l))| {
                        a.0 += 100;
                        a.1 += 100 * l * 1000;
                        Some((usize::from(i == 3), a.0, a.1))
                    })
                    .collect();
                all.extend(s.tick(&now).into_iter().map(|c| c.1));
            }
            all
        };
        assert_eq!(gen1(&mut acc, &SLOW, AFTER as usize), [Event::Slow]);
        assert_eq!(
            gen1(&mut acc, &FAST, AFTER as usize),
            [Event::Probation(PROBATION[0])]
        );
    }

    /// A member slow only under load (it looks fast to probes, slow once it gets a share of
    /// the reads) goes back to probes with a doubled hold each time, up to `MAX_HOLD`, also
    /// when flagged again soon after being unflagged; after `FLAP_WINDOW` the hold starts over.
    #[test]
    fn a_member_slow_under_its_share_of_the_load_relapses_with_a_longer_hold() {
        let (s, mut acc) = flagged();
        let mut hold = AFTER;
        for stage in 0..8 {
            let c = run(&s, &mut acc, &FAST, hold as usize - 1);
            assert!(c.is_empty(), "{c:?}");
            // Through some stages of its probation (at the last, under the whole load).
            let stages = stage % PROBATION.len() + 1;
            let c = run(&s, &mut acc, &FAST, 1 + (stages - 1) * AFTER as usize);
            let want: Vec<Event> = PROBATION[..stages]
                .iter()
                .map(|&s| Event::Probation(s))
                .collect();
            assert_eq!(events(c), want);
            // One slow tick on probation is enough.
            hold = doubled(hold);
            assert_eq!(events(run(&s, &mut acc, &SLOW, 1)), [Event::Relapsed(hold)]);
            assert_eq!(s.set(), MemberSet::one(3));
            let n = (0..160)
                .filter(|_| !s.probe(MemberSet::one(3)).is_empty())
                .count();
            assert!(n <= 1, "back to paced probes: {n}");
        }
        assert_eq!(hold, MAX_HOLD);
        // Through probation to unflagged, then slow again at once: the hold stays at most.
        assert!(run(&s, &mut acc, &FAST, hold as usize - 1).is_empty());
        through_probation(&s, &mut acc);
        assert_eq!(
            events(run(&s, &mut acc, &SLOW, AFTER as usize)),
            [Event::Slow]
        );
        let c = run(&s, &mut acc, &FAST, MAX_HOLD as usize - 1);
        assert!(c.is_empty(), "{c:?}");
        through_probation(&s, &mut acc);
        // Unflagged and fast for longer than the flap window: the hold starts over.
        run(&s, &mut acc, &FAST, FLAP_WINDOW as usize + 1);
        run(&s, &mut acc, &SLOW, AFTER as usize);
        assert_eq!(s.set(), MemberSet::one(3));
        assert_eq!(
            events(run(&s, &mut acc, &FAST, AFTER as usize)),
            [Event::Probation(PROBATION[0])]
        );
    }

    #[test]
    fn a_member_with_few_samples_is_judged_once_they_add_up() {
        let s = SlowMembers::new(4);
        let mut acc = [(0u64, 0u64); 4];
        let mut flagged_at = None;
        for t in 0..12 {
            // Peers: 100 samples a tick at 300 us; member 3: one sample a tick at 20 ms.
            for a in acc.iter_mut().take(3) {
                a.0 += 100;
                a.1 += 100 * 300_000;
            }
            acc[3].0 += 1;
            acc[3].1 += 20_000_000;
            let now: Vec<Option<(usize, u64, u64)>> =
                acc.iter().map(|&a| Some((0, a.0, a.1))).collect();
            if !s.tick(&now).is_empty() {
                flagged_at = Some(t);
                break;
            }
        }
        // Judged every fourth tick (four samples): flagged at the third judgement.
        assert_eq!(flagged_at, Some(11));
        assert_eq!(s.set(), MemberSet::one(3));
    }

    #[test]
    fn a_member_that_stops_serving_loses_its_flag() {
        let s = SlowMembers::new(4);
        let mut acc = vec![(0, 0); 4];
        run(&s, &mut acc, &[300, 300, 300, 9000], 3);
        assert_eq!(s.set(), MemberSet::one(3));
        let g0 = |a: (u64, u64)| Some((0, a.0, a.1));
        s.tick(&[g0(acc[0]), g0(acc[1]), g0(acc[2]), None]);
        assert!(s.set().is_empty());
    }

    /// A replacement swapped into a flagged slot (the slot's next device generation) is not
    /// read around for its predecessor's latency: the flag goes with the old device, and the
    /// new one is judged from its own samples (its counters may continue the slot's).
    #[test]
    fn a_new_device_in_a_flagged_slot_starts_unflagged() {
        let s = SlowMembers::new(4);
        let mut acc = vec![(0, 0); 4];
        run(&s, &mut acc, &[300, 300, 300, 9000], 3);
        assert_eq!(s.set(), MemberSet::one(3));
        let mut now: Vec<Option<(usize, u64, u64)>> =
            acc.iter().map(|&a| Some((0, a.0, a.1))).collect();
        now[3] = Some((1, acc[3].0, acc[3].1));
        s.tick(&now);
        assert!(s.set().is_empty(), "the flag went with the old device");
        // The new device is fast: never flagged.
        for t in 1..6u64 {
            let now: Vec<Option<(usize, u64, u64)>> = acc
                .iter()
                .enumerate()
                .map(|(i, a)| Some((usize::from(i == 3), a.0 + 100 * t, a.1 + 100 * t * 300_000)))
                .collect();
            assert!(s.tick(&now).is_empty());
        }
        assert!(s.set().is_empty());
    }
}
