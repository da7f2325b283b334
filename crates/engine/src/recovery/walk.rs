//! The walk driver: one loop for every background walk (resync, rebuild, replace's copy,
//! scrub). A walk says what its units are and what one batch of them does (`Walk`); `run`
//! owns everything they share:
//! * the units, in order, `BATCH` per reactor at a time (`fan_out`), never more than the
//!   throttle allows for the round (`Pacer`, the array's `Throttle`);
//! * pause (held between batches) and stop (seen before each batch and while pacing);
//! * progress (`Progress`: units done, running), started when the walk starts and no longer
//!   "running" on every exit (`Running`, dropped with the loop), a log line every
//!   `PROGRESS_LOG_EVERY` where the walk has one;
//! * the walk's checkpoint hook after each batch is counted done.
//!
//! Order of one round: no units left: `Walk::finish`. Otherwise `Walk::check` (it may end the
//! walk), the pause, the stop (`Walk::stopped`), the round's cap, the batch
//! (`Walk::before_batch`, the work on the reactors, `Walk::after_batch`), then progress, the
//! checkpoint hook, the log, and the pace for the units actually worked.

use crate::array::Array;
use crate::background::{Progress, ProgressView, Throttle};
use crate::dev::BlockDev;
use futures::future::{join_all, LocalBoxFuture};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a running walk logs its progress (the server log; status has it live), for the
/// walks that do (`Walk::log_progress`).
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

/// How often a paused walk looks at its pause and stop flags.
const PAUSE_POLL: Duration = Duration::from_millis(50);

/// One batch's work, run on a reactor (or inline): one outcome per unit, in order.
pub(crate) type Worker<D, T> =
    Arc<dyn Fn(Arc<Array<D>>, Vec<u64>) -> LocalBoxFuture<'static, Vec<T>> + Send + Sync>;

/// A `Worker` from `f` (a closure over a slice of units).
pub(crate) fn worker<D, T, F, Fut>(f: F) -> Worker<D, T>
where
    D: BlockDev,
    F: Fn(Arc<Array<D>>, Vec<u64>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Vec<T>> + 'static,
{
    Arc::new(
        move |a: Arc<Array<D>>, b: Vec<u64>| -> LocalBoxFuture<'static, Vec<T>> {
            Box::pin(f(a, b))
        },
    )
}

/// Where a walk is: the next unit, and units done since it started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At {
    pub next: u64,
    pub done: u64,
}

/// What the walk does after a batch.
pub(crate) enum After<O> {
    /// The batch is done: count it, go on.
    Next,
    /// The batch is not done and the walk goes back to `check` (which ends it).
    Again,
    /// The walk ends with this.
    End(O),
}

/// What one walk is (module docs): its hooks, called by `run` in the order given there.
pub(crate) trait Walk<D: BlockDev> {
    /// One unit's outcome.
    type Outcome: Clone + Send + 'static;
    /// What the walk returns.
    type Output;

    /// The progress it publishes.
    fn progress<'a>(&self, a: &'a Array<D>) -> &'a Progress;

    /// Once, after progress started and before the first unit: `Some` ends the walk.
    async fn start(&mut self, _a: &Arc<Array<D>>) -> Option<Self::Output> {
        None
    }

    /// Before each batch: `Some` ends the walk (what it works for is gone).
    async fn check(&mut self, _a: &Arc<Array<D>>, _at: At) -> Option<Self::Output> {
        None
    }

    /// Whether the walk is paused (held between batches until resumed or stopped).
    fn paused(&self, _a: &Array<D>) -> bool {
        false
    }

    /// Stop was asked before unit `at.next`.
    async fn stopped(&mut self, a: &Arc<Array<D>>, at: At) -> Self::Output;

    /// The outcome of the units of a slice whose reactor stopped.
    fn gone(&self) -> Self::Outcome;

    /// The work of one batch.
    fn worker(&self) -> Worker<D, Self::Outcome>;

    /// Just before the batch's work starts.
    fn before_batch(&mut self, _a: &Array<D>, _batch: &[u64]) {}

    /// The batch's outcomes, one per unit.
    async fn after_batch(
        &mut self,
        a: &Arc<Array<D>>,
        at: At,
        batch: &[u64],
        outcomes: Vec<Self::Outcome>,
    ) -> After<Self::Output>;

    /// After a batch was counted done (`Progress::done` includes it).
    async fn checkpoint(&mut self, _a: &Arc<Array<D>>) {}

    /// A progress line for the log, every `PROGRESS_LOG_EVERY` (none by default).
    fn log_progress(&self, _a: &Array<D>, _v: &ProgressView) {}

    /// Units of the batch that cost I/O (what the throttle charges): by default those not
    /// skippable (nothing allocated there).
    fn worked(&mut self, a: &Array<D>, batch: &[u64]) -> usize {
        batch.iter().filter(|&&u| !a.skippable(u)).count()
    }

    /// Every unit was visited.
    async fn finish(&mut self, a: &Arc<Array<D>>, at: At) -> Self::Output;
}

/// The units a walk visits, in order: ranges of unit numbers.
pub(crate) struct Units {
    ranges: Vec<Range<u64>>,
    /// Index of the range `next` is in.
    i: usize,
    next: u64,
}

impl Units {
    pub(crate) fn new(ranges: Vec<Range<u64>>) -> Units {
        let mut ranges = ranges;
        ranges.retain(|r| !r.is_empty());
        let next = ranges.first().map_or(0, |r| r.start);
        Units { ranges, i: 0, next }
    }

    /// The units of one range.
    pub(crate) fn range(r: Range<u64>) -> Units {
        Units::new(std::iter::once(r).collect())
    }

    /// Units left to visit.
    fn len(&self) -> u64 {
        self.ranges
            .iter()
            .enumerate()
            .skip(self.i)
            .map(|(k, r)| r.end - if k == self.i { self.next } else { r.start })
            .sum()
    }

    fn peek(&self) -> Option<u64> {
        (self.i < self.ranges.len()).then_some(self.next)
    }

    /// The next `n` units, without moving past them.
    fn batch(&self, n: usize) -> Vec<u64> {
        let mut v = Vec::new();
        for (k, r) in self.ranges.iter().enumerate().skip(self.i) {
            let from = if k == self.i { self.next } else { r.start };
            v.extend((from..r.end).take(n - v.len()));
            if v.len() == n {
                break;
            }
        }
        v
    }

    /// Moves past `n` units.
    fn advance(&mut self, mut n: u64) {
        while n > 0 && self.i < self.ranges.len() {
            let r = &self.ranges[self.i];
            let here = (r.end - self.next).min(n);
            self.next += here;
            n -= here;
            if self.next == r.end {
                self.i += 1;
                if let Some(r) = self.ranges.get(self.i) {
                    self.next = r.start;
                }
            }
        }
    }
}

/// Drives `w` over `units` (module docs); `stop` ends it early through `Walk::stopped`.
pub(crate) async fn run<D: BlockDev, W: Walk<D>>(
    a: &Arc<Array<D>>,
    w: &mut W,
    mut units: Units,
    stop: &AtomicBool,
) -> W::Output {
    let p = w.progress(a);
    let _running = p.begin(units.len());
    if let Some(o) = w.start(a).await {
        return o;
    }
    let lanes = a.rt().as_ref().map_or(1, |rt| rt.reactors());
    let mut pacer = a.pacer(p.unit_bytes);
    let mut last_log = Instant::now();
    let mut done = 0u64;
    let worker = w.worker();
    loop {
        let Some(next) = units.peek() else {
            return w.finish(a, At { next: 0, done }).await;
        };
        let at = At { next, done };
        if let Some(o) = w.check(a, at).await {
            return o;
        }
        while w.paused(a) && !stop.load(Ordering::Acquire) {
            std::thread::sleep(PAUSE_POLL);
        }
        if stop.load(Ordering::Acquire) {
            return w.stopped(a, at).await;
        }
        let cap = pacer.cap(a.client_ops());
        let batch = units.batch((BATCH * lanes).min(cap));
        w.before_batch(a, &batch);
        let work = worker.clone();
        let outcomes = a.fan_out(&batch, w.gone(), move |a, b| work(a, b)).await;
        match w.after_batch(a, at, &batch, outcomes).await {
            After::Next => {}
            After::Again => continue,
            After::End(o) => return o,
        }
        units.advance(batch.len() as u64);
        done += batch.len() as u64;
        p.done.store(done, Ordering::Release);
        w.checkpoint(a).await;
        if last_log.elapsed() >= PROGRESS_LOG_EVERY {
            last_log = Instant::now();
            w.log_progress(a, &p.view());
        }
        let worked = w.worked(a, &batch);
        pacer.pace(worked, a.client_ops(), stop);
    }
}

/// Units a background walk works on at once per reactor (each reads a chunk of every
/// member): enough to keep each member's queue busy, few enough that client I/O is never
/// far behind it.
pub(crate) const BATCH: usize = 8;

/// The throttle of a walk running on its own thread, applying the array's `Throttle` as it
/// is at each round. While clients did I/O since the last round: with a budget, rounds of
/// `budget` units, each followed by a pause set by the priority; without one, md's
/// sync_speed_min: at most `min_bytes_per_second`. While clients are idle: full rounds, at
/// most `max_bytes_per_second`. 0 = unlimited for either rate; at most 200 ms of unused
/// credit.
pub(crate) struct Pacer {
    settings: Arc<Mutex<Throttle>>,
    /// The settings this round uses (read by `cap`).
    now: Throttle,
    unit_bytes: u64,
    /// When the current round started (`cap`).
    round: Instant,
    t0: Instant,
    paced: Duration,
    last_client: u64,
}

impl Pacer {
    pub(crate) fn new(settings: Arc<Mutex<Throttle>>, unit_bytes: u64, client_ops: u64) -> Pacer {
        let now = *settings.lock().unwrap_or_else(|e| e.into_inner());
        Pacer {
            settings,
            now,
            unit_bytes: unit_bytes.max(1),
            round: Instant::now(),
            t0: Instant::now(),
            paced: Duration::ZERO,
            last_client: client_ops,
        }
    }

    /// Units the next round may take: while clients are active, the budget, or at most
    /// 200 ms of the minimum rate (at least one), so the walk never bursts past the
    /// throttle.
    pub(crate) fn cap(&mut self, client_ops: u64) -> usize {
        self.now = *self.settings.lock().unwrap_or_else(|e| e.into_inner());
        self.round = Instant::now();
        let min = self.now.min_bytes_per_second;
        let busy = client_ops != self.last_client;
        if busy && self.now.budget > 0 {
            self.now.budget
        } else if busy && min > 0 {
            (min / 5 / self.unit_bytes).max(1) as usize
        } else {
            usize::MAX
        }
    }

    /// After a round of `units`: sleeps what the rule that applies now owes, in slices
    /// that notice `stop`.
    pub(crate) fn pace(&mut self, units: usize, client_ops: u64, stop: &AtomicBool) {
        let busy = client_ops != self.last_client;
        self.last_client = client_ops;
        if busy && self.now.budget > 0 {
            // The budget is the throttle, with a pause after each round in proportion to
            // the round's time (the same share of time on any host's speed).
            self.paced = self.t0.elapsed();
            let (n, d) = self.now.priority.pause_factor();
            let pause = (self.round.elapsed() * n / d).min(Duration::from_millis(100));
            if !pause.is_zero() && !stop.load(Ordering::Acquire) {
                std::thread::sleep(pause);
            }
            return;
        }
        let rate = if busy {
            self.now.min_bytes_per_second
        } else {
            self.now.max_bytes_per_second
        };
        if rate == 0 {
            self.paced = self.t0.elapsed();
            return;
        }
        self.paced = self
            .paced
            .max(self.t0.elapsed().saturating_sub(Duration::from_millis(200)));
        self.paced +=
            Duration::from_secs_f64((self.unit_bytes * units as u64) as f64 / rate as f64);
        loop {
            let ahead = self.paced.saturating_sub(self.t0.elapsed());
            if ahead.is_zero() || stop.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(ahead.min(Duration::from_millis(50)));
        }
    }
}

impl<D: BlockDev> Array<D> {
    /// A new pacer for a walk over units of `unit_bytes`.
    pub(crate) fn pacer(&self, unit_bytes: u64) -> Pacer {
        Pacer::new(
            self.recovery().throttle.clone(),
            unit_bytes,
            self.client_ops(),
        )
    }

    /// Runs `work` over `units`: with reactors, slices of at most `BATCH` units spread over
    /// them (io_uring: every member busy, member timeouts apply); without, here. One result per
    /// unit, in order; `gone` for the units of a slice whose reactor stopped.
    pub(crate) async fn fan_out<T, F, Fut>(
        self: &Arc<Self>,
        units: &[u64],
        gone: T,
        work: F,
    ) -> Vec<T>
    where
        T: Clone + Send + 'static,
        F: Fn(Arc<Self>, Vec<u64>) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = Vec<T>> + 'static,
    {
        match self.rt() {
            Some(rt) => {
                // Spread over the reactors: a small round (the in-flight budget while
                // clients are active) puts one unit on each rather than all on one.
                let per = units.len().div_ceil(rt.reactors()).clamp(1, BATCH);
                let slices = units.chunks(per).enumerate().map(|(i, slice)| {
                    let (a, b, w) = (self.clone(), slice.to_vec(), work.clone());
                    let n = b.len();
                    let rx = rt.spawn_on(i % rt.reactors(), move || w(a, b));
                    let gone = gone.clone();
                    async move { rx.await.unwrap_or_else(|_| vec![gone; n]) }
                });
                join_all(slices).await.into_iter().flatten().collect()
            }
            None => work(self.clone(), units.to_vec()).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Units;

    /// Every unit once, in the ranges' order (unsorted and empty ranges included), in
    /// batches that do not move the walk until advanced.
    #[test]
    fn units_visit_each_range_in_order() {
        let mut u = Units::new(vec![5..8, 3..3, 0..2, 10..11]);
        assert_eq!(u.len(), 6);
        assert_eq!(u.peek(), Some(5));
        assert_eq!(u.batch(4), vec![5, 6, 7, 0]);
        assert_eq!(
            u.batch(4),
            vec![5, 6, 7, 0],
            "a batch does not move the walk"
        );
        u.advance(4);
        assert_eq!((u.peek(), u.len()), (Some(1), 2));
        assert_eq!(u.batch(8), vec![1, 10]);
        u.advance(2);
        assert_eq!((u.peek(), u.len()), (None, 0));
        assert!(u.batch(8).is_empty());
        assert_eq!(Units::new(vec![]).peek(), None);
    }
}
