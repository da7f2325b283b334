//! The control socket of a running `uraid serve`: HTTP/1.1 with JSON bodies on a Unix
//! socket (mode 0600, peer credentials checked), so `curl --unix-socket` works, plus an
//! optional TCP listener that serves only `/metrics` to Prometheus.
//!
//! One accept thread; each connection gets a short-lived thread (at most `MAX_CLIENTS` at
//! once), with read and write timeouts. Status and metrics never touch the reactors: they
//! are read from atomics the data path updates (`uraid_engine::metrics`); only `POST /fail`
//! waits for one (its superblock round runs there, with member timeouts).
//!
//! Endpoints (docs/control.md has the schema):
//! * `GET /status`: the array, its members, exports, connections, requests (JSON, versioned);
//! * `GET /metrics`: Prometheus text format 0.0.4;
//! * `GET /events[?since=N]`: the event ring (`events.rs`), JSON;
//! * `POST /scrub[?mode=check|repair]`, `POST /scrub/pause|resume|cancel`,
//!   `POST /fail?member=N[&force=1]`, `POST /add?path=DEVICE`, `POST /remove?member=N`,
//!   `POST /throttle?budget=&min=&max=&priority=`: operator commands (`jobs.rs`), on the
//!   Unix socket only.
//!
//! The parts: `listen` (sockets, the accept thread, the peer check), `http` (reading a
//! request head, writing a response), `routes` (endpoints and commands), `status` (the
//! `/status` document), `metrics` (the `/metrics` document, a table of families). The
//! client side (`uraid status`, `uraid fail`, …) is in `client.rs`.

mod http;
mod listen;
mod metrics;
mod routes;
mod status;

pub use listen::{
    bind_metrics, bind_unix, default_path, is_live, parse_endpoint, remove_stale_socket,
};

/// Appended to a refusal that names `--force`, for a client of the socket itself (curl);
/// `uraid` strips it again (client.rs).
pub const FORCE_HINT: &str = " (over the control socket: the force=1 parameter)";

use crate::events::Events;
use anyhow::{Context, Result};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use uraid_engine::{FileDev, Volume};
use uraid_nbd::Server;

/// Version of the `/status` JSON schema (docs/control.md).
pub const SCHEMA: u32 = 1;

/// The `/status` document (schema `SCHEMA`, docs/control.md) of a serving array.
pub fn status_document(state: &State) -> serde_json::Value {
    status::status(state)
}

/// What the control socket reports on.
pub struct State {
    pub jobs: Arc<crate::jobs::Jobs>,
    pub volume: Arc<Volume<FileDev>>,
    pub server: Arc<Server<FileDev>>,
    pub members: Vec<Option<PathBuf>>,
    pub listen: Vec<String>,
    pub events: Events,
    pub started: Instant,
}

/// The running control endpoints; `stop` (or drop) ends them.
pub struct Control {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: Option<PathBuf>,
}

impl Control {
    /// Starts serving a bound control socket (`unix`: listener and path, removed at stop)
    /// and the metrics listener, if any.
    pub fn start(
        state: Arc<State>,
        unix: Option<(UnixListener, PathBuf)>,
        metrics: Option<TcpListener>,
    ) -> Result<Control> {
        let (ul, unix) = match unix {
            Some((l, p)) => (Some(l), Some(p)),
            None => (None, None),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("uraid-control".into())
            .spawn(move || listen::accept_loop(state, ul, metrics, s2))
            .context("starting the control thread")?;
        Ok(Control {
            stop,
            thread: Some(thread),
            path: unix,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop();
    }
}
