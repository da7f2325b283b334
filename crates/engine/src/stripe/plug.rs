//! Write plugging: a partial-stripe write that is part of a sequential stream waits a short,
//! bounded time for the rest of its stripe before its stripe operation runs, so the stripe
//! is written whole instead of piece by piece (md's delayed stripes and plugging). Over NBD
//! the pieces of one stripe arrive as separate requests tens of microseconds apart; without
//! the wait the first runs alone as a read-modify-write, and so does each of the others.
//! `WriteStreams` decides who waits (this module); the wait itself runs in
//! array/stripe_write.rs (`Array::plug`) on the held stripe, where writes to the stripe keep
//! queueing and join its batch.
//!
//! Whether the rest of a stripe can arrive during the wait depends on the client's queue
//! depth, which the server cannot see: on memory members a request is done before the next
//! is received, so the server never has more than one in flight, whatever the client has
//! outstanding. So a stream learns it from its waits: one that fills is evidence for the
//! next; one that runs out (a client at queue depth 1 or 2 sends nothing more until it is
//! answered) stops the stream's waits for a cool-down that doubles with each miss.
//!
//! Rules:
//! * Only a stream waits: a write that starts where a recent write ended, or a little past
//!   it (`REORDER` requests: reordering between connections). A random write waits only when
//!   it happens to land there.
//! * The wait is bounded: twice the time the stripe's missing pieces take to arrive at the
//!   stream's arrival rate, plus `SLACK`, at least half the array's `merge_wait` and never
//!   more than it; a stream slower than twice `merge_wait` per stripe does not wait.
//! * A wait that runs out without its stripe filling costs the stream its waits for the next
//!   `COOL_DOWN << (misses - 1)` writes (at most `COOL_DOWN_MAX`); a filled one resets it.
//!   At queue depth 1 a sequential stream of partial-stripe writes waits on fewer than one
//!   write in `COOL_DOWN_MAX` once it has missed a few times.
//! * Durability requests are never delayed by a plug: urgent writes (FUA, and the zeroing
//!   writes of TRIM and WRITE_ZEROES) never wait; a FLUSH or an urgent write ends every wait
//!   under way (`kick`), and an urgent write or a locker (a degraded read, a walk, a
//!   write-back read, a run of whole stripes) that queues on a plugged stripe ends its wait
//!   (`StripeLocks::plug_check`). Such an end is no miss.
//! * A wait is what the write would have held anyway for a little longer: its stripe, its
//!   safe-mode and write-intent holds, a first write's granule claims. The stripe operation
//!   that follows is the one that would have run without the wait, over a larger batch.

use slab::Slab;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::Waker;
use std::time::{Duration, Instant};

/// Streams tracked at once (least recently used replaced).
const STREAMS: usize = 16;
/// A continuation may start this many request lengths past the stream's end.
const REORDER: u64 = 4;
/// Writes a stream does not wait after its first miss; doubled per further miss, up to the
/// maximum.
const COOL_DOWN: u32 = 64;
const COOL_DOWN_MAX: u32 = 4096;
/// Added to every wait's budget (scheduling noise between the client's requests).
const SLACK: Duration = Duration::from_micros(20);

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    /// Where the stream's newest write ended (0 with `used == 0`: a free slot).
    next: u64,
    /// Arrival of its newest write, nanoseconds since `Table::origin`.
    last_ns: u64,
    /// Smoothed time between its arrivals (0: one arrival so far).
    gap_ns: u64,
    /// Waits in a row that ran out without their stripe filling.
    misses: u32,
    /// Writes left before the stream may wait again.
    cool_down: u32,
    /// LRU tick of its newest arrival (0: free).
    used: u64,
    /// Bumped when the slot goes to a new stream, so the outcome of an old stream's wait
    /// does not count for the new one.
    gen: u32,
}

struct Table {
    streams: [Stream; STREAMS],
    tick: u64,
    origin: Instant,
}

/// The sequential write streams an array sees, and the plugged writes waiting now.
pub(crate) struct WriteStreams {
    table: Mutex<Table>,
    /// Bumped by `kick`; a wait that sees it change ends.
    epoch: AtomicU64,
    waiting: Mutex<Slab<Waker>>,
    waiters: AtomicUsize,
    /// The longest a write waits (0: plugging off).
    max: Duration,
}

/// How a write meets its stripe (`WriteStreams::arrive`).
#[derive(Clone, Copy)]
pub(crate) enum Pace<'a> {
    /// It may wait for the rest of its stripe.
    Plug(Plug<'a>),
    /// It runs as soon as it holds its stripe.
    Normal,
    /// As `Normal`, and it ends the wait of a plugged stripe it queues on (FUA; zeroing).
    Urgent,
}

/// A write's permission to wait for the rest of its stripe, and where its outcome goes.
#[derive(Clone, Copy)]
pub(crate) struct Plug<'a> {
    streams: &'a WriteStreams,
    slot: usize,
    gen: u32,
    /// The longest it may wait.
    pub budget: Duration,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The queued writes filled the stripe (`StripeLocks::queued_fill_stripe`).
    Filled,
    /// The budget ran out first.
    RanOut,
    /// A FLUSH or FUA write ended it.
    Kicked,
}

impl Plug<'_> {
    /// Records how the wait ended (module rules).
    pub(crate) fn report(&self, how: Outcome) {
        let mut t = self.streams.lock();
        let s = &mut t.streams[self.slot];
        if s.gen != self.gen {
            return;
        }
        match how {
            Outcome::Filled => s.misses = 0,
            Outcome::RanOut => {
                s.misses += 1;
                s.cool_down = COOL_DOWN
                    .saturating_mul(1 << (s.misses - 1).min(16))
                    .min(COOL_DOWN_MAX);
            }
            Outcome::Kicked => {}
        }
    }
}

impl WriteStreams {
    /// The longest `max` may be (longer is taken as this).
    pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);

    pub(crate) fn new(max: Duration) -> WriteStreams {
        let max = max.min(Self::MAX_WAIT);
        WriteStreams {
            table: Mutex::new(Table {
                streams: [Stream::default(); STREAMS],
                tick: 0,
                origin: Instant::now(),
            }),
            epoch: AtomicU64::new(0),
            waiting: Mutex::new(Slab::new()),
            waiters: AtomicUsize::new(0),
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write of `len` bytes at `off` arrives (`stripe`: the array's data bytes per stripe).
    /// `may_wait`: false for urgent writes (which also end the waits under way). Returns how
    /// it meets its stripe.
    pub(crate) fn arrive(&self, off: u64, len: u64, stripe: u64, may_wait: bool) -> Pace<'_> {
        if !may_wait {
            self.kick();
        }
        match self.arrive_at(off, len, stripe, may_wait, Instant::now()) {
            Some(p) => Pace::Plug(p),
            None if may_wait => Pace::Normal,
            None => Pace::Urgent,
        }
    }

    /// `arrive` at time `now`.
    fn arrive_at(
        &self,
        off: u64,
        len: u64,
        stripe: u64,
        may_wait: bool,
        now: Instant,
    ) -> Option<Plug<'_>> {
        if self.max.is_zero() || len == 0 {
            return None;
        }
        let mut t = self.lock();
        let now = now.saturating_duration_since(t.origin).as_nanos() as u64;
        t.tick += 1;
        let tick = t.tick;
        let found = t
            .streams
            .iter()
            .position(|s| s.used != 0 && off >= s.next && off - s.next <= REORDER * len);
        let Some(i) = found else {
            let i = (0..STREAMS).min_by_key(|&i| t.streams[i].used).unwrap_or(0);
            let gen = t.streams[i].gen.wrapping_add(1);
            t.streams[i] = Stream {
                next: off + len,
                last_ns: now,
                used: tick,
                gen,
                ..Stream::default()
            };
            return None;
        };
        let s = &mut t.streams[i];
        let gap = now.saturating_sub(s.last_ns);
        s.gap_ns = if s.gap_ns == 0 {
            gap
        } else {
            (3 * s.gap_ns + gap) / 4
        };
        s.next = s.next.max(off + len);
        s.last_ns = now;
        s.used = tick;
        if s.cool_down > 0 {
            s.cool_down -= 1;
            return None;
        }
        let budget = self.budget(s, len, stripe).filter(|_| may_wait)?;
        Some(Plug {
            streams: self,
            slot: i,
            gen: s.gen,
            budget,
        })
    }

    /// How long a write of `len` in stream `s` may wait for the rest of its stripe (module
    /// rules), if at all.
    fn budget(&self, s: &Stream, len: u64, stripe: u64) -> Option<Duration> {
        if s.gap_ns == 0 {
            return None;
        }
        // Requests of this size that make a stripe (a write as long as a stripe or longer
        // leaves at most its two ends partial).
        let pieces = if len >= stripe {
            2
        } else {
            stripe.div_ceil(len)
        };
        // Measured gaps include this server's own pace (a stream of read-modify-writes
        // arrives slower than one of full-stripe writes), so every wait gets at least half
        // the maximum.
        let fill = Duration::from_nanos(s.gap_ns.saturating_mul(pieces - 1));
        (fill <= 2 * self.max).then(|| (2 * fill + SLACK).clamp(self.max / 2, self.max))
    }

    /// Ends every wait under way (a FLUSH, a FUA write).
    pub(crate) fn kick(&self) {
        if self.waiters.load(Ordering::Acquire) == 0 {
            return;
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let wakers: Vec<Waker> = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Registers a plugged write's waker for `kick` (once per wait: `Waiter`).
    pub(crate) fn waiter(&self) -> Waiter<'_> {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        Waiter {
            streams: self,
            key: None,
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }
}

/// A plugged write's registration for `kick`.
pub(crate) struct Waiter<'a> {
    streams: &'a WriteStreams,
    key: Option<usize>,
    epoch: u64,
}

impl Waiter<'_> {
    /// Whether a kick came since the wait began; else `w` is woken by the next one.
    pub(crate) fn kicked(&mut self, w: &Waker) -> bool {
        let mut slab = self
            .streams
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Checked under the slab's lock: a kick bumps the epoch before it drains the slab.
        if self.streams.epoch.load(Ordering::Acquire) != self.epoch {
            return true;
        }
        match self.key.and_then(|k| slab.get_mut(k)) {
            Some(old) => old.clone_from(w),
            None => self.key = Some(slab.insert(w.clone())),
        }
        false
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            let mut slab = self
                .streams
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // A kick drained it already (and a later waiter may hold the same key).
            if self.streams.epoch.load(Ordering::Acquire) == self.epoch {
                slab.try_remove(k);
            }
        }
        self.streams.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRIPE: u64 = 512 << 10;
    const LEN: u64 = 128 << 10;
    const MAX: Duration = Duration::from_micros(500);

    /// Write `i` of a 128 KiB stream from 0 whose writes arrive `gap` apart.
    fn at(w: &WriteStreams, i: u64, gap: Duration, may_wait: bool) -> Option<Plug<'_>> {
        let t = w.lock().origin + gap * (i as u32 + 1);
        w.arrive_at(i * LEN, LEN, STRIPE, may_wait, t)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_sequential_stream_waits_and_random_writes_do_not() {
        let w = WriteStreams::new(MAX);
        assert!(
            at(&w, 0, us(10), true).is_none(),
            "one write is not yet a stream"
        );
        for i in 1..40 {
            assert!(at(&w, i, us(10), true).is_some(), "write {i}");
        }
        // Starting a little past the stream's end (reordering between connections) continues it.
        let t = w.lock().origin + us(420);
        assert!(w.arrive_at(42 * LEN, LEN, STRIPE, true, t).is_some());
        let w = WriteStreams::new(MAX);
        for i in 0..64u64 {
            let p = w.arrive((i * 7919 % 997) << 20, 4096, STRIPE, true);
            assert!(matches!(p, Pace::Normal), "random write {i} waits");
        }
    }

    #[test]
    fn fua_writes_never_wait_and_a_zero_maximum_turns_plugging_off() {
        let w = WriteStreams::new(MAX);
        for i in 0..8 {
            at(&w, i, us(10), true);
        }
        assert!(at(&w, 8, us(10), false).is_none(), "a FUA write waits");
        assert!(at(&w, 9, us(10), true).is_some());
        let off = WriteStreams::new(Duration::ZERO);
        assert!((0..40).all(|i| at(&off, i, us(10), true).is_none()));
    }

    #[test]
    fn a_wait_is_bounded_by_the_arrival_rate_and_the_maximum() {
        // 10 µs apart, a stripe of four pieces fills in 30 µs: waits get the floor, half the
        // maximum.
        let w = WriteStreams::new(MAX);
        let p: Vec<_> = (0..20).filter_map(|i| at(&w, i, us(10), true)).collect();
        assert!(p.iter().all(|p| p.budget == MAX / 2));
        // 100 µs apart: twice 300 µs (capped) and the slack.
        let w = WriteStreams::new(MAX);
        let p: Vec<_> = (0..20).filter_map(|i| at(&w, i, us(100), true)).collect();
        assert!(
            p.iter().all(|p| p.budget == MAX),
            "{:?}",
            p.iter().map(|p| p.budget).collect::<Vec<_>>()
        );
        // 60 µs apart: 2 × 180 + 20.
        let w = WriteStreams::new(MAX);
        let p: Vec<_> = (0..20).filter_map(|i| at(&w, i, us(60), true)).collect();
        assert_eq!(p.last().unwrap().budget, us(380));
        // Slower than twice the maximum per stripe: no wait.
        let w = WriteStreams::new(MAX);
        assert!((0..40).all(|i| at(&w, i, us(400), true).is_none()));
    }

    #[test]
    fn waits_that_run_out_cool_the_stream_down_and_a_filled_one_ends_that() {
        let w = WriteStreams::new(MAX);
        let mut i = 0;
        let mut next = || {
            i += 1;
            at(&w, i, us(10), true)
        };
        next();
        // A queue-depth-1 client: every wait runs out.
        let mut waited = 0;
        for _ in 0..20_000 {
            if let Some(p) = next() {
                waited += 1;
                p.report(Outcome::RanOut);
            }
        }
        // 64 + 128 + ... + 4096, then one per 4096.
        assert!(waited <= 12, "{waited} of 20000 writes waited");
        // Kicks are no misses; a wait that fills lets the next writes wait again.
        let p = loop {
            if let Some(p) = next() {
                break p;
            }
        };
        p.report(Outcome::Kicked);
        next()
            .expect("a kicked wait cools nothing down")
            .report(Outcome::Filled);
        for _ in 0..10 {
            next()
                .expect("waits after a filled one")
                .report(Outcome::Filled);
        }
        // A reused slot ignores the old stream's outcome.
        let w = WriteStreams::new(MAX);
        at(&w, 0, us(10), true);
        let old = at(&w, 1, us(10), true).unwrap();
        for s in 0..STREAMS as u64 {
            w.arrive((1000 + s * 97) << 20, 4096, STRIPE, true);
        }
        old.report(Outcome::RanOut);
        assert!(w.lock().streams.iter().all(|s| s.misses == 0));
    }

    #[test]
    fn a_kick_ends_every_wait_and_leaves_no_registration() {
        let w = WriteStreams::new(MAX);
        let waker = futures::task::noop_waker();
        let mut a = w.waiter();
        let mut b = w.waiter();
        assert!(!a.kicked(&waker) && !b.kicked(&waker));
        w.kick();
        assert!(a.kicked(&waker) && b.kicked(&waker));
        drop((a, b));
        assert_eq!(w.waiters.load(Ordering::Relaxed), 0);
        assert!(w.waiting.lock().unwrap().is_empty());
        // A waiter that ends before any kick removes its registration.
        let mut c = w.waiter();
        assert!(!c.kicked(&waker));
        drop(c);
        assert!(w.waiting.lock().unwrap().is_empty());
    }
}
