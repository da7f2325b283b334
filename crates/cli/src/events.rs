//! Events: what the server logs at INFO and above (member failures, state changes, assembly
//! warnings, start and stop) is also kept in a bounded in-memory ring, served by the control
//! socket at `GET /events`. A `tracing` layer with its own filter, so the ring sees INFO
//! events even when the terminal only shows warnings.

use serde::Serialize;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// Events kept; older ones are dropped (their sequence numbers show the gap).
pub const CAPACITY: usize = 1000;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Entry {
    /// 1, 2, 3... in the order logged; `GET /events?since=N` returns those after N.
    pub seq: u64,
    /// Seconds since the Unix epoch.
    pub time: f64,
    pub level: String,
    pub target: String,
    pub message: String,
}

#[derive(Default)]
struct Inner {
    next: u64,
    ring: VecDeque<Entry>,
}

/// The ring; clones share it.
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Inner>>);

impl Events {
    pub fn push(&self, level: Level, target: &str, message: String) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.next += 1;
        let e = Entry {
            seq: g.next,
            time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            level: level.as_str().to_string(),
            target: target.to_string(),
            message,
        };
        if g.ring.len() == CAPACITY {
            g.ring.pop_front();
        }
        g.ring.push_back(e);
    }

    /// Events with a sequence number above `since`, oldest first.
    pub fn since(&self, since: u64) -> Vec<Entry> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.ring.iter().filter(|e| e.seq > since).cloned().collect()
    }

    /// The tracing layer feeding this ring: INFO and above from uraid's own crates.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let ring = self.clone();
        // A `Targets` filter (not a closure) gives tracing a level hint, so DEBUG and TRACE
        // call sites stay disabled without evaluating a filter on the hot path.
        RingLayer { ring }.with_filter(
            tracing_subscriber::filter::Targets::new().with_target("uraid", Level::INFO),
        )
    }
}

struct RingLayer {
    ring: Events,
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        let meta = event.metadata();
        self.ring.push(*meta.level(), meta.target(), m.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::prelude::*;

    #[test]
    fn ring_keeps_info_and_above_from_uraid_and_drops_the_oldest() {
        let ev = Events::default();
        let sub = tracing_subscriber::registry().with(ev.layer());
        tracing::subscriber::with_default(sub, || {
            tracing::info!(target: "uraid::test", "member {} failed", 3);
            tracing::debug!(target: "uraid::test", "not kept");
            tracing::warn!(target: "other_crate", "not ours");
            tracing::error!(target: "uraid::test", member = 2, "gone");
        });
        let all = ev.since(0);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].message, "member 3 failed");
        assert_eq!(all[0].level, "INFO");
        assert_eq!(all[1].message, "gone member=2");
        assert_eq!(ev.since(1).len(), 1);
        for i in 0..CAPACITY + 5 {
            ev.push(Level::WARN, "uraid::test", format!("e{i}"));
        }
        let all = ev.since(0);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(all.last().map(|e| e.seq), Some(CAPACITY as u64 + 7));
    }
}
