//! Background recovery work, beside `stripe/` and under the same stripe locks: resync of an
//! array that was not stopped cleanly (`resync.rs`). Rebuild and scrub will live here too.
//!
//! Progress of a background operation is published through `Progress` (status, metrics,
//! `uraid watch`).

mod resync;

pub(crate) use resync::ResyncState;
pub use resync::{ResyncLimits, ResyncReport};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Progress of one background operation, readable from any thread.
pub struct Progress {
    pub op: &'static str,
    /// Work units (stripes) done and in total.
    pub done: AtomicU64,
    pub total: AtomicU64,
    /// Bytes of member I/O per unit (for the rate).
    pub unit_bytes: u64,
    /// Stripes whose redundancy was rewritten.
    pub repaired: AtomicU64,
    pub running: AtomicBool,
    started: Mutex<Option<Instant>>,
}

/// A point-in-time view of `Progress`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressView {
    pub op: &'static str,
    pub running: bool,
    pub done: u64,
    pub total: u64,
    pub repaired: u64,
    /// 0..=1.
    pub fraction: f64,
    pub bytes_per_second: f64,
    pub eta_seconds: Option<f64>,
}

impl Progress {
    pub fn new(op: &'static str, total: u64, unit_bytes: u64) -> Progress {
        Progress {
            op,
            done: AtomicU64::new(0),
            total: AtomicU64::new(total),
            unit_bytes,
            repaired: AtomicU64::new(0),
            running: AtomicBool::new(false),
            started: Mutex::new(None),
        }
    }

    pub(crate) fn start(&self) {
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.running.store(true, Ordering::Release);
    }

    pub fn view(&self) -> ProgressView {
        let done = self.done.load(Ordering::Acquire);
        let total = self.total.load(Ordering::Acquire).max(1);
        let secs = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = if secs > 0.0 {
            done as f64 * self.unit_bytes as f64 / secs
        } else {
            0.0
        };
        let left = total.saturating_sub(done) as f64 * self.unit_bytes as f64;
        ProgressView {
            op: self.op,
            running: self.running.load(Ordering::Acquire),
            done,
            total,
            repaired: self.repaired.load(Ordering::Acquire),
            fraction: done as f64 / total as f64,
            bytes_per_second: rate,
            eta_seconds: (rate > 0.0).then(|| left / rate),
        }
    }
}
