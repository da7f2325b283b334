//! Background recovery work, under the same stripe locks as client writes: resync of an
//! array that was not stopped cleanly (`resync.rs`), rebuild of new members (`rebuild.rs`),
//! replace (`replace.rs`) and scrub (`scrub.rs`). These walks drive the array (they sit above
//! `array/` and reach its components through its accessors); the state the array's request
//! paths consult while they run (resync's synced set, progress, the replace under way, scrub
//! counts, throttle) is `state.rs`, below the array.
//!
//! Progress of a background operation is published through `Progress` (status, metrics,
//! `uraid watch`); its pace by `Pacer`; its stripe work goes to the reactors through
//! `fan_out`.

mod rebuild;
mod replace;
mod resync;
mod scrub;
pub(crate) mod state;

pub use rebuild::RebuildReport;
pub use replace::ReplaceOutcome;
pub use resync::ResyncReport;
pub use state::{Priority, Progress, ProgressView, ScrubMode, ScrubReport, Throttle};

use crate::array::Array;
use crate::dev::BlockDev;
use futures::future::join_all;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Sets the throttle of background work (resync, rebuild, scrub); running walks apply
    /// it from their next round.
    pub fn set_throttle(&self, t: Throttle) {
        *self
            .recovery()
            .throttle
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = t;
    }

    /// The throttle background work applies now.
    pub fn throttle(&self) -> Throttle {
        *self
            .recovery()
            .throttle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

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

    /// Runs `f` on reactor 0 when the array has reactors (its member I/O then has member
    /// timeouts), here otherwise.
    pub(crate) async fn on_reactor<T, F, Fut>(self: &Arc<Self>, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + 'static,
    {
        match self.rt() {
            Some(rt) => {
                let a = self.clone();
                rt.spawn_on(0, move || f(a)).await.ok()
            }
            None => Some(f(self.clone()).await),
        }
    }
}
