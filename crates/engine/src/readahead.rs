//! Read-ahead: sequential streams detected as reads arrive, whole stripes read ahead of them
//! into a bounded cache that the stream's later reads are served from. The volume drives it
//! (`Volume::read`); this module holds the state and the decisions, and does no I/O.
//!
//! Rules (docs/invariants.md, "Read-ahead never serves stale data"):
//! * **Detection at arrival.** A read is matched when it reaches the volume, before member
//!   I/O reorders anything, against one table shared by every connection of the volume. It
//!   belongs to a stream if it starts within a window of the stream's highest end, behind or
//!   ahead: twice the reads in flight times the read's length, at least 2 reads' length (16
//!   for a confirmed stream) and at most 16 MiB. A stream
//!   is confirmed once it has had 4 reads, of 128 KiB together at least, that cover at least
//!   half of the span they touched and more than one read's length; only confirmed streams prefetch. At most `STREAMS`
//!   streams; a new one replaces the least recently used one that is unconfirmed or idle
//!   (no read among the last `IDLE` arrivals), so random reads between a live stream's reads
//!   do not push it out; an idle stream that a read matches starts over, unconfirmed.
//! * **Whole units.** A prefetch reads whole units (the stripe's data, at least 128 KiB)
//!   through the volume's own read (holes, degraded decode, waits for write-back all apply).
//!   Its units are entered in flight first; a read wanting them waits for the prefetch
//!   instead of reading the members again. A read is served from the cache only if every
//!   unit it touches is there; else it reads the members as without read-ahead.
//! * **Distance.** A stream keeps `dist` units ahead of its highest end, refilled once half
//!   of it is used: what the stream reads during twice the time a prefetch's read takes (its
//!   rate, measured over windows of at least 2 ms, times the prefetches' mean read latency, from
//!   the task's start: time queued behind other tasks would feed back into it), at least 2
//!   units and at most `max_dist`; one refill asks for at most twice the distance. A stream
//!   held back by a short distance reads faster once
//!   it grows, which grows it again; on members as fast as memory it stays short, so data
//!   read ahead is still in the CPU's cache when it is sent.
//! * **Never stale.** Every change of the volume's contents (write, trim, write-zeroes)
//!   calls `changed` once its data is on the members (or its write-back wait is registered,
//!   so the volume's own reads wait for it) and before it is acknowledged, also when it
//!   fails. `changed` drops the ready units it overlaps and marks the in-flight ones stale:
//!   a stale unit is dropped when its prefetch completes, and its waiters read the members.
//!   (A unit is in the cache, in flight, from its prefetch's start to its completion, so
//!   every change that overlaps a prefetch while it runs marks it.) So a read that arrives
//!   after a change was acknowledged is served either by a prefetch that started after the
//!   change's data was on the members, or by the members.
//! * **Every prefetch completes.** A prefetch's job is owned by a guard that completes it
//!   as failed if its task is dropped unfinished, so no unit stays in flight forever.
//! * **Bounded.** The jobs with a unit in flight or ready together never exceed the budget
//!   less its spare share (`SPARE_SHARE`: buffers the cache freed, kept for reuse; prefetch
//!   buffers of 64 KiB and more are unpooled, buf.rs, so nothing else keeps them)
//!   (a ready unit shares its job's buffers, so a job counts whole until its last unit
//!   goes): a prefetch first evicts the oldest jobs that can go whole (every unit ready, none
//!   the arriving read's own), and is cut short if that is not enough; the stream's next refill starts where it
//!   stopped. Replies being sent may still hold a unit's buffers after it left the cache.

use crate::alloc::{zero_segments, ReadPiece};
use crate::buf::Segments;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;
use std::task::{Context, Waker};

/// Streams tracked at once.
pub const STREAMS: usize = 16;
/// A confirmed stream without a read among this many arrivals is replaced like an
/// unconfirmed one.
const IDLE: u64 = 256;
/// Reads that confirm a stream.
const CONFIRM: u64 = 4;
/// The smallest unit read ahead.
const MIN_UNIT: u64 = 128 << 10;
/// The largest distance ahead of a stream, and the largest detection window.
const MAX_AHEAD: u64 = 16 << 20;
/// The largest single prefetch read (a longer refill is split into several), where the
/// geometry allows it (`job_len`). A job reads each member's run of data chunks as one member
/// read, and every job boundary cuts runs: with rotating parity a member holds at most `data`
/// chunks in a row, and longer jobs get closer to that (RAID6 4+2, 64 KiB chunks: 136-146 KiB
/// per member read with 1 MiB jobs, 186-231 KiB with 8 MiB), which is what members with few
/// request slots are bound by (docs/benchmarks.md, "Read-ahead").
const MAX_JOB: u64 = 8 << 20;
/// The job length every geometry gets, and the most bytes of member reads one stripe of a
/// job may keep in memory: a unit's pieces point into the buffers of the member runs its
/// chunks lie in, and a reply still sending the unit keeps those after the cache let the
/// job go.
const PIN: u64 = 1 << 20;

/// The prefetch job length for a geometry (bytes) whose stripes hold `stripe` bytes of data:
/// `MAX_JOB` as long as no stripe keeps more than `PIN` of member buffers alive, else `PIN`
/// (or one stripe). A stripe's chunks lie in member runs of at most `run` stripes each
/// (`Geometry::data_run`: rotating parity, the data chunks per stripe; raid0 and mirrors,
/// unbounded: None; mirror reads are not coalesced, but longer jobs would not make their
/// member reads longer either).
pub(crate) fn job_len(stripe: u64, run: Option<u64>) -> u64 {
    match run {
        Some(r) if r * stripe <= PIN => MAX_JOB / stripe * stripe,
        _ => PIN.max(stripe),
    }
}

/// One part in this of the budget is kept as spare buffers (buf.rs, `Spare`) freed by the
/// cache for its next prefetches; the prefetches hold the rest.
const SPARE_SHARE: u64 = 8;

/// Counters, as `/status` and the metrics show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadAheadStats {
    /// Memory budget in bytes.
    pub budget: u64,
    /// Bytes of units ready or in flight now.
    pub cache_bytes: u64,
    /// Confirmed streams now.
    pub streams: u64,
    /// Reads served from ready units.
    pub hits: u64,
    /// Reads served from units they had to wait for (prefetched too late).
    pub late_hits: u64,
    /// Reads of confirmed streams that read the members.
    pub misses: u64,
    /// Bytes read ahead.
    pub prefetched_bytes: u64,
    /// Bytes read ahead that left the cache without serving a read.
    pub unused_bytes: u64,
    /// Bytes read ahead and dropped because a change overlapped them.
    pub dropped_bytes: u64,
}

/// One prefetch to run: read `[off, off + len)` and hand the result to `complete`.
#[derive(Debug)]
pub(crate) struct Job {
    pub off: u64,
    pub len: u64,
    id: u64,
    /// When its read began (`Job::begin`): the latency the distance follows is the members'
    /// and the volume's, not the time the task waited to run.
    started: std::time::Instant,
}

impl Job {
    /// The job's read begins now.
    pub(crate) fn begin(&mut self) {
        self.started = std::time::Instant::now();
    }
}

struct Stream {
    lo: u64,
    hi: u64,
    bytes: u64,
    reads: u64,
    confirmed: bool,
    /// The stream's rate in bytes per second, measured over windows of its reads.
    rate: f64,
    window: (std::time::Instant, u64),
    /// Units below this one were prefetched (or were asked to be).
    pf_end: u64,
    used: u64,
}

enum Slot {
    InFlight,
    Ready(Vec<ReadPiece>),
}

struct Entry {
    slot: Slot,
    job: u64,
    /// In flight, and a change overlapped it: dropped when its prefetch completes.
    stale: bool,
    /// Position in `State::fifo` (eviction order).
    seq: u64,
    /// Bytes of the unit reads took from it.
    served: u64,
    waiters: Vec<Waker>,
}

#[derive(Default)]
struct State {
    streams: Vec<Stream>,
    tick: u64,
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
    fifo: VecDeque<(u64, u64)>,
    next_seq: u64,
    /// Bytes of the jobs that still have a unit in `entries`: a ready unit shares its job's
    /// buffers, so a job's memory is held until its last unit goes.
    bytes: u64,
    /// Per job with units in `entries`: (units left, units entered, first unit; a job's
    /// units are consecutive).
    jobs: std::collections::HashMap<u64, (u64, u64, u64)>,
    /// Mean time from a prefetch's start to its completion, in seconds (moving average).
    latency: f64,
    /// The counters (`stats` fills in the gauges).
    count: ReadAheadStats,
}

/// What a read found in the cache.
pub(crate) enum Found {
    /// Not every unit is there: read the members.
    Miss,
    /// Every unit is ready: the read's pieces, in volume order.
    Hit(Vec<ReadPiece>),
    /// Some unit is in flight: the waker is registered, ask again when woken.
    Wait,
}

pub(crate) struct ReadAhead {
    unit: u64,
    size: u64,
    /// The whole budget, as shown.
    budget: u64,
    /// The part of it prefetches may hold; the rest is kept as spare buffers for reuse.
    cache_budget: u64,
    _spare: crate::buf::Spare,
    max_dist: u64,
    /// Units in one prefetch job at most.
    per_job: u64,
    state: Mutex<State>,
    /// Entries in the cache (ready or in flight): `changed` and lookups skip the lock at 0.
    active: AtomicUsize,
    /// Reads in the volume now (the detection window).
    in_flight: AtomicUsize,
    stopped: std::sync::atomic::AtomicBool,
}

/// A read in flight in the volume (the detection window counts them).
pub(crate) struct Reading<'a> {
    ra: &'a ReadAhead,
    /// The read belongs to a confirmed stream (a miss of it is counted).
    streamed: bool,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.ra.in_flight.fetch_sub(1, Relaxed);
    }
}

impl ReadAhead {
    /// `stripe`: the stripe's data bytes; `size`: the volume's; `budget`: bytes of memory;
    /// `job`: the longest prefetch read (`job_len`).
    pub(crate) fn new(stripe: u64, size: u64, budget: u64, job: u64) -> ReadAhead {
        let unit = stripe * MIN_UNIT.div_ceil(stripe).max(1);
        let max_dist = (MAX_AHEAD.min(budget / 4) / unit).max(1);
        // Never so much that the cache could not hold one unit.
        let spare = (budget / SPARE_SHARE).min(budget.saturating_sub(unit));
        ReadAhead {
            unit,
            size,
            budget,
            cache_budget: budget - spare,
            _spare: crate::buf::Spare::reserve(spare as usize),
            max_dist,
            per_job: (job / unit).max(1),
            state: Mutex::new(State::default()),
            active: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            stopped: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic under the lock leaves consistent-enough state: counters and a cache.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No more prefetches (the volume is closing).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, SeqCst);
    }

    /// A read of `[off, off + len)` arrived: matches it to a stream and returns the
    /// prefetches to start (their units are already entered in flight), and the read's
    /// in-flight registration.
    pub(crate) fn arrive(&self, off: u64, len: u64) -> (Vec<Job>, Reading<'_>) {
        let n = self.in_flight.fetch_add(1, Relaxed) as u64 + 1;
        let mut reading = Reading {
            ra: self,
            streamed: false,
        };
        if len == 0 || off >= self.size || self.stopped.load(Relaxed) {
            return (Vec::new(), reading);
        }
        let end = (off + len).min(self.size);
        // Reads in flight can arrive in any order within about their number times their
        // length; a confirmed stream also accepts a few requests more.
        // (`max` then `min`: a read longer than MAX_AHEAD / 2 has a window of 2 reads.)
        let near = (2 * n * len).min(MAX_AHEAD).max(2 * len);
        let far = (2 * n * len).max(16 * len).min(MAX_AHEAD).max(2 * len);
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        let at = st.streams.iter().position(|s| {
            let w = if s.confirmed { far } else { near };
            end > s.hi.saturating_sub(w) && off < s.hi + w
        });
        let i = match at {
            Some(i) => {
                let s = &mut st.streams[i];
                if tick - s.used >= IDLE {
                    // An ended stream's window caught a read: it starts over, unconfirmed.
                    s.confirmed = false;
                    (s.lo, s.hi, s.bytes, s.reads) = (off, end, 0, 0);
                }
                s.window.1 += end - off;
                let dt = s.window.0.elapsed().as_secs_f64();
                // Windows of at least 2 ms: reads served from the cache arrive in bursts.
                if dt >= 0.002 {
                    let r = s.window.1 as f64 / dt;
                    s.rate = if s.rate == 0.0 { r } else { (s.rate + r) / 2.0 };
                    s.window = (std::time::Instant::now(), 0);
                }
                s.lo = s.lo.min(off);
                s.hi = s.hi.max(end);
                s.bytes += end - off;
                s.reads += 1;
                s.used = tick;
                if !s.confirmed
                    && s.reads >= CONFIRM
                    && s.bytes >= MIN_UNIT
                    && 2 * s.bytes >= s.hi - s.lo
                    && s.hi - s.lo > s.bytes / s.reads
                {
                    s.confirmed = true;
                }
                i
            }
            None => {
                let s = Stream {
                    lo: off,
                    hi: end,
                    bytes: end - off,
                    reads: 1,
                    confirmed: false,
                    rate: 0.0,
                    window: (std::time::Instant::now(), 0),
                    pf_end: 0,
                    used: tick,
                };
                if st.streams.len() < STREAMS {
                    st.streams.push(s);
                    st.streams.len() - 1
                } else {
                    // The least recently used, unconfirmed or idle ones first: random reads
                    // between the reads of a live stream do not push it out, and streams
                    // that ended leave their slots.
                    let (j, _) = st
                        .streams
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, s)| (s.confirmed && tick - s.used < IDLE, s.used))
                        .expect("STREAMS > 0");
                    st.streams[j] = s;
                    j
                }
            }
        };
        if !st.streams[i].confirmed {
            return (Vec::new(), reading);
        }
        reading.streamed = true;
        let (u0, u1) = (off / self.unit, (end - 1) / self.unit);
        let units = self.size.div_ceil(self.unit);
        let latency = st.latency;
        let s = &mut st.streams[i];
        let dist = ((2.0 * s.rate * latency / self.unit as f64)
            .ceil()
            .min(self.max_dist as f64) as u64
            + 1)
        .max(2)
        .min(self.max_dist);
        let from = s.pf_end.max(u0);
        // At most twice the distance at once (a read far ahead of the rest does not fetch
        // everything in between).
        let want = (s.hi.div_ceil(self.unit) + dist)
            .min(units)
            .min(from + 2 * dist);
        // Refill once half the distance is used (or the read's own units are not asked for).
        if from >= want || (from > u0 && want - from < dist.div_ceil(2)) {
            return (Vec::new(), reading);
        }
        let (jobs, reached) = self.enter(&mut st, from, want, u0..=u1);
        st.streams[i].pf_end = reached;
        (jobs, reading)
    }

    /// Enters units `[from, to)` that are not in the cache as in flight, within the budget
    /// (evicting the oldest ready units first, but not `keep`: the arriving read's), as jobs
    /// of at most `per_job` units; and the unit it stopped at (`to` unless the budget ran out).
    fn enter(
        &self,
        st: &mut State,
        from: u64,
        to: u64,
        keep: std::ops::RangeInclusive<u64>,
    ) -> (Vec<Job>, u64) {
        let mut jobs: Vec<Job> = Vec::new();
        let per_job = self.per_job;
        for u in from..to {
            if st.entries.contains_key(&u) {
                continue;
            }
            while st.bytes + self.unit > self.cache_budget {
                if !self.evict(st, &keep) {
                    return (jobs, u);
                }
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            st.fifo.push_back((u, seq));
            let extend = jobs
                .last()
                .is_some_and(|j| j.off + j.len == u * self.unit && j.len < per_job * self.unit);
            if !extend {
                st.next_id += 1;
                jobs.push(Job {
                    off: u * self.unit,
                    len: 0,
                    id: st.next_id,
                    started: std::time::Instant::now(),
                });
            }
            let j = jobs.last_mut().expect("pushed above");
            j.len = ((u + 1) * self.unit).min(self.size) - j.off;
            st.entries.insert(
                u,
                Entry {
                    slot: Slot::InFlight,
                    job: j.id,
                    stale: false,
                    seq,
                    served: 0,
                    waiters: Vec::new(),
                },
            );
            let left = st.jobs.entry(j.id).or_insert((0, 0, u));
            left.0 += 1;
            left.1 += 1;
            st.bytes += self.unit;
            self.active.fetch_add(1, SeqCst);
        }
        (jobs, to)
    }

    /// Evicts the job of the oldest ready unit whose job can go whole (every unit of it
    /// still here ready, none in `keep`): only that frees memory (a job's buffers stay while
    /// any unit of it does), so no unit is thrown away for nothing. False if there is none.
    fn evict(&self, st: &mut State, keep: &std::ops::RangeInclusive<u64>) -> bool {
        let mut skipped = Vec::new();
        let mut done = false;
        while let Some((u, seq)) = st.fifo.pop_front() {
            let Some(e) = st.entries.get(&u).filter(|e| e.seq == seq) else {
                continue; // already gone
            };
            let job = e.job;
            let Some(&(_, total, first)) = st.jobs.get(&job) else {
                continue;
            };
            let ours: Vec<(u64, bool)> = (first..first + total)
                .filter_map(|v| {
                    st.entries
                        .get(&v)
                        .filter(|x| x.job == job)
                        .map(|x| (v, matches!(x.slot, Slot::Ready(_)) && !keep.contains(&v)))
                })
                .collect();
            if ours.iter().any(|&(_, free)| !free) {
                skipped.push((u, seq));
                continue;
            }
            for (v, _) in ours {
                self.remove(st, v, true);
            }
            done = true;
            break;
        }
        for x in skipped.into_iter().rev() {
            st.fifo.push_front(x);
        }
        done
    }

    /// Removes unit `u`; `evicted`: it left the cache for room (counted if unused).
    fn remove(&self, st: &mut State, u: u64, evicted: bool) -> Option<Entry> {
        let e = st.entries.remove(&u)?;
        if let Some(left) = st.jobs.get_mut(&e.job) {
            left.0 -= 1;
            if left.0 == 0 {
                st.bytes -= left.1 * self.unit;
                st.jobs.remove(&e.job);
            }
        }
        self.active.fetch_sub(1, SeqCst);
        if evicted && e.served == 0 {
            st.count.unused_bytes += self.unit;
        }
        if st.fifo.len() > 4 * st.entries.len() + 64 {
            let keep: std::collections::HashSet<(u64, u64)> =
                st.entries.iter().map(|(&u, e)| (u, e.seq)).collect();
            st.fifo.retain(|x| keep.contains(x));
        }
        Some(e)
    }

    /// The job's read finished: its units become ready if no change overlapped them since
    /// it started (module rules), else they are dropped; waiters are woken either way.
    pub(crate) fn complete(&self, job: Job, result: Option<Vec<ReadPiece>>) {
        let (u0, u1) = (job.off / self.unit, (job.off + job.len).div_ceil(self.unit));
        let mut st = self.lock();
        if result.is_some() {
            let t = job.started.elapsed().as_secs_f64();
            st.latency = if st.latency == 0.0 {
                t
            } else {
                0.75 * st.latency + 0.25 * t
            };
        }
        let mut wake = Vec::new();
        for u in u0..u1 {
            let Some(stale) = st
                .entries
                .get(&u)
                .filter(|e| e.job == job.id && matches!(e.slot, Slot::InFlight))
                .map(|e| e.stale)
            else {
                continue;
            };
            match (&result, stale) {
                (Some(pieces), false) => {
                    let a = u * self.unit;
                    let b = (a + self.unit).min(self.size);
                    let e = st.entries.get_mut(&u).expect("checked above");
                    e.slot = Slot::Ready(clip(pieces, a, b));
                    wake.append(&mut e.waiters);
                }
                _ => {
                    if let Some(mut e) = self.remove(&mut st, u, false) {
                        wake.append(&mut e.waiters);
                    }
                    if stale {
                        st.count.dropped_bytes += self.unit;
                    }
                }
            }
        }
        if result.is_some() {
            st.count.prefetched_bytes += job.len;
        }
        drop(st);
        for w in wake {
            w.wake();
        }
    }

    /// The volume's contents in `[off, off + len)` changed (module rules: after the data is
    /// on the members, before the change is acknowledged).
    pub(crate) fn changed(&self, off: u64, len: u64) {
        if self.active.load(SeqCst) == 0 || len == 0 {
            return;
        }
        let (u0, u1) = (off / self.unit, off.saturating_add(len).div_ceil(self.unit));
        let mut st = self.lock();
        let mut ready = Vec::new();
        for (&u, e) in st.entries.range_mut(u0..u1) {
            match e.slot {
                Slot::InFlight => e.stale = true,
                Slot::Ready(_) => ready.push(u),
            }
        }
        for u in ready {
            if let Some(e) = self.remove(&mut st, u, false) {
                if e.served == 0 {
                    st.count.dropped_bytes += self.unit;
                }
            }
        }
    }

    /// Looks up `[off, off + len)` (module rules); `cx` is registered on units in flight.
    /// `waited`: this read waited before (a hit now is late).
    pub(crate) fn find(&self, off: u64, len: u64, cx: &Context<'_>, waited: bool) -> Found {
        if self.active.load(SeqCst) == 0 || len == 0 {
            return Found::Miss;
        }
        let end = (off + len).min(self.size);
        if off >= end {
            return Found::Miss;
        }
        let (u0, u1) = (off / self.unit, (end - 1) / self.unit);
        let mut st = self.lock();
        let mut wait = false;
        for u in u0..=u1 {
            match st.entries.get_mut(&u) {
                None => return Found::Miss,
                Some(e) => {
                    if matches!(e.slot, Slot::InFlight) {
                        if !e.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                            e.waiters.push(cx.waker().clone());
                        }
                        wait = true;
                    }
                }
            }
        }
        if wait {
            return Found::Wait;
        }
        let mut out = Vec::new();
        for u in u0..=u1 {
            let a = (u * self.unit).max(off);
            let b = ((u + 1) * self.unit).min(end);
            let e = st.entries.get_mut(&u).expect("checked above");
            if let Slot::Ready(p) = &e.slot {
                for piece in clip(p, a, b) {
                    push_merged(&mut out, piece);
                }
            }
            e.served += b - a;
            if e.served >= self.unit.min(self.size - u * self.unit) {
                self.remove(&mut st, u, false);
            }
        }
        if waited {
            st.count.late_hits += 1;
        } else {
            st.count.hits += 1;
        }
        Found::Hit(out)
    }

    /// A read of a confirmed stream read the members.
    pub(crate) fn missed(&self, reading: &Reading<'_>) {
        if reading.streamed {
            self.lock().count.misses += 1;
        }
    }

    pub(crate) fn stats(&self) -> ReadAheadStats {
        let st = self.lock();
        ReadAheadStats {
            budget: self.budget,
            cache_bytes: st.bytes,
            streams: st.streams.iter().filter(|s| s.confirmed).count() as u64,
            ..st.count
        }
    }
}

/// The parts of `pieces` (volume order, back to back) inside `[a, b)`.
pub(crate) fn clip(pieces: &[ReadPiece], a: u64, b: u64) -> Vec<ReadPiece> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            ReadPiece::Hole { off, len } => {
                let (x, y) = ((*off).max(a), (off + len).min(b));
                if x < y {
                    out.push(ReadPiece::Hole { off: x, len: y - x });
                }
            }
            ReadPiece::Data { off, data } => {
                let (x, y) = ((*off).max(a), (off + data.len() as u64).min(b));
                if x < y {
                    out.push(ReadPiece::Data {
                        off: x,
                        data: slice(data, (x - off) as usize, (y - off) as usize),
                    });
                }
            }
        }
    }
    out
}

/// Appends `p` to `out`, merged into the last piece if both are holes or both data (the
/// pieces of one read come back as few chunks as without read-ahead).
fn push_merged(out: &mut Vec<ReadPiece>, p: ReadPiece) {
    match (out.last_mut(), p) {
        (Some(ReadPiece::Hole { len, .. }), ReadPiece::Hole { len: more, .. }) => *len += more,
        (Some(ReadPiece::Data { data, .. }), ReadPiece::Data { data: more, .. }) => {
            data.parts.extend(more.parts)
        }
        (_, p) => out.push(p),
    }
}

/// Bytes `[from, to)` of `seg`, sharing its buffers.
fn slice(seg: &Segments, from: usize, to: usize) -> Segments {
    let mut parts = Vec::new();
    let mut pos = 0;
    for (buf, r) in &seg.parts {
        let (s, e) = (pos, pos + r.len());
        pos = e;
        let (x, y) = (s.max(from), e.min(to));
        if x < y {
            parts.push((buf.clone(), r.start + (x - s)..r.start + (y - s)));
        }
        if pos >= to {
            break;
        }
    }
    Segments { parts }
}

/// `pieces` as one run of bytes (holes as zeros).
pub(crate) fn flatten(pieces: Vec<ReadPiece>) -> Segments {
    let mut out = Segments::default();
    for p in pieces {
        match p {
            ReadPiece::Data { data, .. } => out.parts.extend(data.parts),
            ReadPiece::Hole { len, .. } => out.parts.extend(zero_segments(len).parts),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::job_len;

    const K: u64 = 1 << 10;

    /// Jobs are 8 MiB where no stripe keeps more than 1 MiB of member reads alive, else 1 MiB
    /// (or one stripe), as before.
    #[test]
    fn a_job_is_long_where_no_stripe_pins_more_than_a_mib() {
        // RAID6 4+2, 64 KiB chunks: runs of 4 chunks at most, so a stripe pins 1 MiB.
        assert_eq!(job_len(256 * K, Some(4)), 8 << 20);
        // RAID5 3+1: runs of 3 pin 576 KiB; a whole number of stripes under 8 MiB.
        assert_eq!(job_len(192 * K, Some(3)), 42 * 192 * K);
        // RAID0 over 4: each member's run is as long as the job.
        assert_eq!(job_len(256 * K, None), 1 << 20);
        // RAID6 8+2: runs of 8 stripes of 512 KiB would pin 4 MiB.
        assert_eq!(job_len(512 * K, Some(8)), 1 << 20);
        // 512 KiB chunks on 4+2: a stripe alone pins 2 MiB: one stripe, as before.
        assert_eq!(job_len(2 << 20, Some(4)), 2 << 20);
        // Mirrors (a member's chunks back to back, unbounded): 1 MiB.
        assert_eq!(job_len(64 * K, None), 1 << 20);
        // A stripe over 8 MiB: one stripe.
        assert_eq!(job_len(16 << 20, Some(4)), 16 << 20);
    }
}
