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

use crate::events::Events;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::format::uuid_string;
use uraid_core::http::{parse_head, Head, MAX_HEAD};
use uraid_engine::metrics::{bucket_bounds, OpSnapshot, BUCKETS};
use uraid_engine::{FileDev, Volume};
use uraid_nbd::{Server, OPS};

/// Version of the `/status` JSON schema (docs/control.md).
pub const SCHEMA: u32 = 1;
/// Control connections served at once per listener (Unix, TCP); more get 503.
const MAX_CLIENTS: usize = 8;
/// Time a client has to send its request and take the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Where `--control` points: a Unix socket path, or nothing.
pub fn parse_endpoint(spec: &str) -> Result<Option<PathBuf>> {
    if spec == "none" {
        return Ok(None);
    }
    match spec.strip_prefix("unix:") {
        Some(p) if !p.is_empty() => Ok(Some(PathBuf::from(p))),
        _ => bail!("--control {spec}: expected unix:PATH or none"),
    }
}

/// The default control socket of an array: `uraid-data/control.sock` for the embedded
/// default volume, `/run/uraid/NAME.sock` otherwise. None when the name is not usable in a
/// file name (superblock names are any UTF-8; only `[A-Za-z0-9._-]`, not starting with a
/// dot, make a path that stays in /run/uraid).
pub fn default_path(name: &str, embedded: bool) -> Option<PathBuf> {
    if embedded {
        return Some(Path::new(crate::DEFAULT_DIR).join("control.sock"));
    }
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    ok.then(|| Path::new("/run/uraid").join(format!("{name}.sock")))
}

/// Removes a socket file left by a server that is gone; refuses anything else (a live
/// server's socket, a regular file such as a member image named by mistake).
pub fn remove_stale_socket(path: &Path, what: &str) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(md) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !md.file_type().is_socket() {
        bail!(
            "{what} {}: exists and is not a socket; refusing to replace it",
            path.display()
        );
    }
    // A server that just died may still accept for a moment: io_uring tears down a dead
    // process's pending accept asynchronously, and until then the socket listens. The
    // listener's credentials (taken at listen) name its process: gone means stale.
    let live = UnixStream::connect(path)
        .ok()
        .is_some_and(|s| peer_cred(&s).is_none_or(|c| process_exists(c.pid)));
    if live {
        bail!(
            "{what} {}: another server is listening there",
            path.display()
        );
    }
    std::fs::remove_file(path)
        .with_context(|| format!("{what} {}: cannot remove the stale socket", path.display()))
}

/// Binds the control socket (mode 0600), replacing a stale one.
pub fn bind_unix(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("control socket: cannot create {}", dir.display()))?;
    }
    remove_stale_socket(path, "control socket")?;
    let l = UnixListener::bind(path)
        .with_context(|| format!("control socket {}: cannot bind", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("control socket {}: cannot chmod 0600", path.display()))?;
    Ok(l)
}

/// `--metrics tcp:HOST:PORT`.
pub fn bind_metrics(spec: &str) -> Result<TcpListener> {
    let Some(hp) = spec.strip_prefix("tcp:") else {
        bail!("--metrics {spec}: expected tcp:HOST:PORT (e.g. tcp:127.0.0.1:9469)");
    };
    TcpListener::bind(hp).with_context(|| format!("--metrics {spec}: cannot bind"))
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
            .spawn(move || accept_loop(state, ul, metrics, s2))
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

enum Conn {
    Unix(UnixStream),
    Tcp(std::net::TcpStream),
}

impl Conn {
    fn into_stream(self) -> Box<dyn ReadWrite> {
        match self {
            Conn::Unix(s) => Box::new(s),
            Conn::Tcp(s) => Box::new(s),
        }
    }
}

fn accept_loop(
    state: Arc<State>,
    unix: Option<UnixListener>,
    tcp: Option<TcpListener>,
    stop: Arc<AtomicBool>,
) {
    let active_unix = Arc::new(AtomicUsize::new(0));
    let active_tcp = Arc::new(AtomicUsize::new(0));
    let mut fds: Vec<libc::pollfd> = Vec::new();
    for fd in [
        unix.as_ref().map(|l| l.as_raw_fd()),
        tcp.as_ref().map(|l| l.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    {
        fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    while !stop.load(Ordering::SeqCst) {
        // SAFETY: `fds` is a live array of pollfd of the stated length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 200) };
        if n <= 0 {
            continue;
        }
        for p in fds.iter_mut() {
            if p.revents == 0 {
                continue;
            }
            p.revents = 0;
            let conn = if unix.as_ref().is_some_and(|l| l.as_raw_fd() == p.fd) {
                unix.as_ref()
                    .and_then(|l| l.accept().ok())
                    .map(|(s, _)| Conn::Unix(s))
            } else {
                tcp.as_ref()
                    .and_then(|l| l.accept().ok())
                    .map(|(s, _)| Conn::Tcp(s))
            };
            let Some(conn) = conn else { continue };
            // Unix and TCP clients have separate budgets, so metrics clients (any local user
            // can reach a loopback port) never lock operators out; a client over budget gets
            // 503 at once and the accept thread never waits.
            let counter = match conn {
                Conn::Unix(_) => &active_unix,
                Conn::Tcp(_) => &active_tcp,
            };
            if counter.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                counter.fetch_sub(1, Ordering::SeqCst);
                refuse_busy(conn);
                continue;
            }
            let (st, slot) = (state.clone(), Slot(counter.clone()));
            let _ = std::thread::Builder::new()
                .name("uraid-control-conn".into())
                .spawn(move || {
                    let _slot = slot; // released even if serving panics
                    serve_conn(&st, conn);
                });
        }
    }
}

/// A taken client slot; dropping it gives it back.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers 503 without a thread (a short write timeout: a client that does not read loses it).
fn refuse_busy(conn: Conn) {
    let r = Response::error(503, "busy: too many control requests in progress");
    let mut s = conn.into_stream();
    s.set_timeouts(Duration::from_millis(100));
    let _ = write_response(s.as_mut(), &r);
}

/// The uid of the process at the other end of a Unix socket.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    peer_cred(s).map(|c| c.uid)
}

/// Whether process `pid` exists (a zombie counts).
fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The credentials of the process at the other end of a Unix socket (for a listening
/// socket's peer: the process that called listen).
fn peer_cred(s: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `cred`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(cred)
}

/// An HTTP response: status, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    fn json(status: u16, v: &Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
        }
    }

    fn error(status: u16, msg: &str) -> Response {
        Response::json(status, &json!({ "error": msg }))
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        500 => "Internal Server Error",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

fn serve_conn(state: &State, conn: Conn) {
    let metrics_only = matches!(conn, Conn::Tcp(_));
    if let Conn::Unix(s) = &conn {
        let me = euid();
        let uid = peer_uid(s);
        if !matches!(uid, Some(u) if u == 0 || u == me) {
            tracing::warn!(
                "control socket: refused a client with uid {uid:?} (only root and uid {me})"
            );
            let mut s = conn.into_stream();
            s.set_timeouts(IO_TIMEOUT);
            // Read the request first: closing a Unix socket with unread data resets the
            // peer, which can then lose the 403 (seen under load in the test).
            let _ = read_head(s.as_mut(), Instant::now() + Duration::from_secs(1));
            let _ = write_response(
                s.as_mut(),
                &Response::error(403, "forbidden: only root and the server's user"),
            );
            return;
        }
    }
    let mut stream = conn.into_stream();
    let deadline = Instant::now() + IO_TIMEOUT;
    stream.set_timeouts(IO_TIMEOUT);
    let resp = match read_head(stream.as_mut(), deadline) {
        Ok(head) => route(state, &head, metrics_only),
        Err(r) => r,
    };
    // The reply gets what is left of the deadline (at least a moment, to say 408).
    let left = deadline.saturating_duration_since(Instant::now());
    stream.set_timeouts(left.max(Duration::from_millis(100)));
    let _ = write_response(stream.as_mut(), &resp);
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

trait ReadWrite: Read + Write {
    fn set_timeouts(&mut self, t: Duration);
}

impl ReadWrite for UnixStream {
    fn set_timeouts(&mut self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
        let _ = self.set_write_timeout(Some(t));
    }
}

impl ReadWrite for std::net::TcpStream {
    fn set_timeouts(&mut self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
        let _ = self.set_write_timeout(Some(t));
    }
}

/// Reads and parses a request head (request line and headers, up to `MAX_HEAD` bytes),
/// all of it before `deadline` (a client trickling bytes does not hold a slot longer).
fn read_head(s: &mut dyn ReadWrite, deadline: Instant) -> Result<Head, Response> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        match parse_head(&buf) {
            Ok(Some(h)) => return Ok(h),
            Ok(None) => {}
            Err(r) => return Err(Response::error(r.status, &r.message)),
        }
        if buf.len() >= MAX_HEAD {
            return Err(Response::error(431, "request head larger than 16 KiB"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Response::error(408, "timed out reading the request"));
        }
        s.set_timeouts(left);
        match s.read(&mut chunk) {
            Ok(0) => return Err(Response::error(400, "connection closed mid-request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Response::error(408, "timed out reading the request"))
            }
            Err(_) => return Err(Response::error(400, "read error")),
        }
    }
}

fn write_response(s: &mut dyn Write, r: &Response) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len(),
        match r.status {
            // The metrics listener takes GET only; the control socket GET and POST.
            405 if r.body.contains("/metrics only") => "Allow: GET\r\n",
            405 => "Allow: GET, POST\r\n",
            _ => "",
        }
    );
    s.write_all(head.as_bytes())?;
    s.write_all(r.body.as_bytes())?;
    s.flush()
}

/// `key=value` pairs of a query string (`uraid_core::http::query_pairs`); 400 otherwise.
fn query<'a>(q: &'a str, known: &[&str]) -> Result<Vec<(&'a str, &'a str)>, Response> {
    uraid_core::http::query_pairs(q, known).map_err(|e| Response::error(400, &e))
}

/// The `member=N` parameter of a command (required).
fn member_param(q: &[(&str, &str)]) -> Result<usize, Response> {
    match q
        .iter()
        .find(|x| x.0 == "member")
        .map(|x| x.1.parse::<usize>())
    {
        Some(Ok(m)) => Ok(m),
        _ => Err(Response::error(400, "member=N is required")),
    }
}

/// The `path=DEVICE` parameter of a command (required, percent-encoded).
fn path_param(q: &[(&str, &str)]) -> Result<PathBuf, Response> {
    match q
        .iter()
        .find(|x| x.0 == "path")
        .map(|x| uraid_core::http::percent_decode(x.1))
    {
        Some(Some(p)) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(Response::error(
            400,
            "path=DEVICE (percent-encoded) is required",
        )),
    }
}

/// The `force` parameter of a command: absent or 0, or 1.
fn force_param(q: &[(&str, &str)]) -> Result<bool, Response> {
    match q.iter().find(|x| x.0 == "force").map(|x| x.1) {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(Response::error(400, &format!("force={v}: 0 or 1"))),
    }
}

/// `t` with the parameters of `POST /throttle` applied: budget (stripes), min and max (MB/s
/// of member I/O), priority (low, normal, high).
fn throttle_params(
    mut t: uraid_engine::Throttle,
    q: &[(&str, &str)],
) -> Result<uraid_engine::Throttle, Response> {
    if q.is_empty() {
        return Err(Response::error(
            400,
            "nothing to set: budget=STRIPES, min=MB/S, max=MB/S or priority=low|normal|high",
        ));
    }
    let number = |k: &str, v: &str, max: u64| match v.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(Response::error(
            400,
            &format!("{k}={v}: a whole number from 0 to {max}"),
        )),
    };
    for &(k, v) in q {
        match k {
            "budget" => t.budget = number(k, v, 1 << 16)? as usize,
            "min" => t.min_bytes_per_second = number(k, v, 1 << 30)? << 20,
            "max" => t.max_bytes_per_second = number(k, v, 1 << 30)? << 20,
            _ => {
                t.priority = uraid_engine::Priority::parse(v).ok_or_else(|| {
                    Response::error(400, &format!("priority={v}: low, normal or high"))
                })?
            }
        }
    }
    Ok(t)
}

/// The throttle as an operator reads it.
pub fn throttle_words(t: &uraid_engine::Throttle) -> String {
    let rate = |b: u64| {
        if b == 0 {
            "unlimited".to_string()
        } else {
            format!("{} MB/s", b >> 20)
        }
    };
    format!(
        "budget {} stripe(s) while clients are active{}, priority {}, min {}, max {}",
        t.budget,
        if t.budget == 0 {
            " (off: min rate)"
        } else {
            ""
        },
        t.priority.name(),
        rate(t.min_bytes_per_second),
        rate(t.max_bytes_per_second)
    )
}

fn throttle_json(t: &uraid_engine::Throttle) -> Value {
    json!({
        "budget": t.budget,
        "priority": t.priority.name(),
        "min_bytes_per_second": t.min_bytes_per_second,
        "max_bytes_per_second": t.max_bytes_per_second,
    })
}

/// An operator command (`POST`, Unix socket only): 202 with a message, or the refusal.
fn command(state: &State, h: &Head) -> Response {
    let done = |r: Result<String, crate::jobs::Refusal>| match r {
        Ok(msg) => Response::json(202, &json!({ "ok": true, "message": msg })),
        Err((status, msg)) => Response::error(status, &msg),
    };
    match h.path.as_str() {
        "/scrub" => {
            let q = match query(&h.query, &["mode"]) {
                Ok(q) => q,
                Err(r) => return r,
            };
            let mode = match q.first().map(|x| x.1) {
                None | Some("check") => uraid_engine::ScrubMode::Check,
                Some("repair") => uraid_engine::ScrubMode::Repair,
                Some(m) => return Response::error(400, &format!("mode {m:?}: check or repair")),
            };
            done(state.jobs.start_scrub(mode))
        }
        "/scrub/pause" | "/scrub/resume" | "/scrub/cancel" => {
            if !h.query.is_empty() {
                return Response::error(400, "no parameters");
            }
            done(state.jobs.scrub_command(&h.path["/scrub/".len()..]))
        }
        "/add" => {
            let q = match query(&h.query, &["path", "force"]) {
                Ok(q) => q,
                Err(r) => return r,
            };
            let path = match path_param(&q) {
                Ok(p) => p,
                Err(r) => return r,
            };
            let force = match force_param(&q) {
                Ok(f) => f,
                Err(r) => return r,
            };
            done(state.jobs.add(&path, force))
        }
        "/fail" => {
            let q = match query(&h.query, &["member", "force"]) {
                Ok(q) => q,
                Err(r) => return r,
            };
            let member = match member_param(&q) {
                Ok(m) => m,
                Err(r) => return r,
            };
            let force = match force_param(&q) {
                Ok(f) => f,
                Err(r) => return r,
            };
            done(state.jobs.fail(member, force))
        }
        "/replace" => {
            let q = match query(&h.query, &["member", "path", "force"]) {
                Ok(q) => q,
                Err(r) => return r,
            };
            let member = match member_param(&q) {
                Ok(m) => m,
                Err(r) => return r,
            };
            let path = match path_param(&q) {
                Ok(p) => p,
                Err(r) => return r,
            };
            let force = match force_param(&q) {
                Ok(f) => f,
                Err(r) => return r,
            };
            done(state.jobs.replace(member, &path, force))
        }
        "/replace/cancel" => {
            if !h.query.is_empty() {
                return Response::error(400, "no parameters");
            }
            done(state.jobs.replace_cancel())
        }
        "/remove" => {
            let q = match query(&h.query, &["member", "path", "force"]) {
                Ok(q) => q,
                Err(r) => return r,
            };
            let force = match force_param(&q) {
                Ok(f) => f,
                Err(r) => return r,
            };
            let member = q.iter().find(|x| x.0 == "member").map(|x| x.1);
            let path = q.iter().find(|x| x.0 == "path").map(|x| x.1);
            let what = match (member, path) {
                (Some(m), None) => match m.parse::<usize>() {
                    Ok(m) => crate::jobs::Removal::Member(m),
                    Err(_) => return Response::error(400, &format!("member={m}: a number")),
                },
                (None, Some(p)) => match uraid_core::http::percent_decode(p) {
                    Some(p) if !p.is_empty() => crate::jobs::Removal::Spare(PathBuf::from(p)),
                    _ => return Response::error(400, "path=SPARE (percent-encoded)"),
                },
                _ => return Response::error(400, "member=N or path=SPARE (one of them)"),
            };
            done(state.jobs.remove(what, force))
        }
        "/throttle" => {
            let q = match query(&h.query, &["budget", "min", "max", "priority"]) {
                Ok(q) => q,
                Err(r) => return r,
            };
            match throttle_params(state.volume.array().throttle(), &q) {
                Ok(t) => {
                    state.volume.array().set_throttle(t);
                    tracing::info!(
                        target: "uraid_engine::recovery",
                        "throttle set: {}",
                        throttle_words(&t)
                    );
                    done(Ok(format!("throttle: {}", throttle_words(&t))))
                }
                Err(r) => r,
            }
        }
        "/status" | "/metrics" | "/events" | "/" => {
            Response::error(405, "a report: GET it (POST is for commands)")
        }
        _ => Response::error(404, "no such command"),
    }
}

fn route(state: &State, h: &Head, metrics_only: bool) -> Response {
    if h.method == "POST" && !metrics_only {
        return command(state, h);
    }
    if h.method != "GET" {
        return Response::error(
            405,
            if metrics_only {
                "this listener serves GET /metrics only"
            } else {
                "GET and POST only"
            },
        );
    }
    if metrics_only && h.path != "/metrics" {
        return Response::error(
            404,
            "this listener serves /metrics only; the rest is on the control socket",
        );
    }
    match h.path.as_str() {
        "/status" => Response::json(200, &status(state)),
        "/metrics" => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: metrics(state),
        },
        "/events" => {
            let mut since = 0u64;
            for kv in h.query.split('&').filter(|s| !s.is_empty()) {
                match kv.split_once('=') {
                    Some(("since", v)) => match v.parse() {
                        Ok(n) => since = n,
                        Err(_) => return Response::error(400, "since: expected a number"),
                    },
                    _ => return Response::error(400, &format!("unknown parameter {kv:?}")),
                }
            }
            Response::json(
                200,
                &json!({ "schema": SCHEMA, "events": state.events.since(since) }),
            )
        }
        "/" => Response::json(
            200,
            &json!({
                "endpoints": ["/status", "/metrics", "/events?since=N"],
                "commands": [
                    "POST /scrub?mode=check|repair", "POST /scrub/pause", "POST /scrub/resume",
                    "POST /scrub/cancel", "POST /fail?member=N&force=0|1",
                    "POST /add?path=DEVICE&force=0|1",
                    "POST /remove?member=N&force=0|1", "POST /remove?path=SPARE",
                    "POST /replace?member=N&path=DEVICE&force=0|1", "POST /replace/cancel",
                    "POST /throttle?budget=STRIPES&min=MB/S&max=MB/S&priority=low|normal|high"
                ],
            }),
        ),
        _ => Response::error(404, "no such endpoint"),
    }
}

// ---------------------------------------------------------------- status

fn op_json(o: &OpSnapshot) -> Value {
    json!({
        "count": o.count,
        "bytes": o.bytes,
        "errors": o.errors,
        "latency_mean_us": o.mean_us(),
        "latency_p99_us": o.quantile_bound(0.99).map(|s| s * 1e6),
    })
}

/// Array state words, md style: clean or active (written since assembly), plus degraded
/// or failed.
/// md-style state: "clean"/"active" (written since start, or not clean on disk), then
/// ", degraded" or ", FAILED", then the resync's state while one is due.
pub fn state_words(dirty: bool, failed: usize, serving: bool, resync: Option<&str>) -> String {
    let mut s = if dirty || resync.is_some() {
        "active"
    } else {
        "clean"
    }
    .to_string();
    if !serving {
        s.push_str(", FAILED");
    } else if failed > 0 {
        s.push_str(", degraded");
    }
    if let Some(r) = resync {
        s.push_str(", ");
        s.push_str(r);
    }
    s
}

/// The `/status` document (schema `SCHEMA`, docs/control.md).
pub fn status(state: &State) -> Value {
    let a = state.volume.array();
    let g = *a.geometry();
    let (name, uuid, ctime) = a.identity();
    let failed = a.failed();
    let st = a.stats.snapshot();
    let server = &state.server;
    let ss = server.stats();
    let members: Vec<Value> = (0..g.members)
        .map(|i| {
            let io = a.member_io(i);
            let (corrected, budget_used, budget) = a.member_errors(i);
            json!({
                "index": i,
                "path": member_path(state, i),
                "state": member_state(a, i),
                "rebuilt_units": a.rebuild_state().iter().find(|r| r.0 == i).map(|r| r.1),
                "replacement": a.replace_state().filter(|r| r.0 == i).map(|r| r.1),
                "read": op_json(&io.read),
                "write": op_json(&io.write),
                "flush": op_json(&io.flush),
                "read_errors_corrected": corrected,
                "read_error_budget": { "used": budget_used, "max": budget },
            })
        })
        .collect();
    let ops: serde_json::Map<String, Value> = OPS
        .iter()
        .zip(ss.ops.iter())
        .map(|(n, s)| {
            (
                n.to_string(),
                op_json(&uraid_engine::metrics::OpCounters::sum(s.iter())),
            )
        })
        .collect();
    let (bc, regions, dirty) = a.bitmap_state();
    json!({
        "schema": SCHEMA,
        "source": "server",
        "pid": std::process::id(),
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
        "name": name,
        "array_uuid": uuid_string(&uuid),
        "level": g.level.to_string(),
        "members": g.members,
        "chunk": g.chunk,
        "volume_size": g.volume_size(),
        "ctime": ctime,
        "events": a.events(),
        "dirty": a.is_dirty(),
        "state": state_words(
            a.is_dirty(),
            failed.len() + a.rebuild_state().len(),
            a.is_serving(),
            match (a.recovery_progress().running, a.needs_resync(), a.rebuild_state().is_empty()) {
                (true, _, _) => Some("resyncing"),
                (false, true, _) => Some("resync pending"),
                (_, _, false) if a.rebuild_progress().running => Some("recovering"),
                (_, _, false) => Some("recovery pending"),
                _ => None,
            }
        ),
        "degraded": !failed.is_empty() || !a.rebuild_state().is_empty(),
        "failed": failed.iter().collect::<Vec<_>>(),
        "fault_tolerance": g.fault_tolerance(),
        "slots": members,
        "exports": [{
            "name": server.config().export,
            "read_only": server.config().read_only,
            "listen": state.listen,
        }],
        "connections": {
            "open": server.open_connections(),
            "accepted": ss.connections.load(Ordering::Relaxed),
            "protocol_errors": ss.protocol_errors.load(Ordering::Relaxed),
        },
        "requests": {
            "total": ss.requests.load(Ordering::Relaxed),
            "errors": ss.errors.load(Ordering::Relaxed),
            "ops": ops,
        },
        "stripe_operations": {
            "full": st.full_stripe_writes, "reconstruct": st.rcw_writes,
            "read_modify_write": st.rmw_writes, "merged": st.merged_writes,
            "degraded_reads": st.degraded_reads, "corrected_reads": st.corrected_reads,
        },
        "background": background(a),
        "throttle": throttle_json(&a.throttle()),
        "bitmap": {
            "chunk": bc, "regions": regions, "dirty_regions": dirty,
            "set_rounds": a.bitmap_rounds().0, "clear_rounds": a.bitmap_rounds().1,
        },
        "unsynced_stripes_refused": a.unsynced_stripes_refused(),
        "scrub": scrub_json(a),
        "spares": state.jobs.spare_paths(),
        "journal": a.journal_status().map(|j| json!({
            "device": j.device, "mode": j.mode, "state": j.state,
            "log_bytes": j.log_bytes, "used_bytes": j.used_bytes,
            "records": j.records, "bytes": j.bytes, "commits": j.commits,
            "checkpoints": j.checkpoints, "replayed_records": j.replayed,
        })),
    })
}

/// The path of slot `i`'s device (the one added while serving, if any).
fn member_path(state: &State, i: usize) -> Option<String> {
    state
        .volume
        .array()
        .member_name(i)
        .map(str::to_string)
        .or_else(|| {
            state
                .members
                .get(i)
                .cloned()
                .flatten()
                .map(|p| p.display().to_string())
        })
}

/// A member's state word: missing, failed, rebuilding or active.
fn member_state(a: &uraid_engine::Array<FileDev>, i: usize) -> &'static str {
    if a.removed().contains(i) {
        "removed"
    } else if a.replace_state().is_some_and(|r| r.0 == i) {
        "replacing"
    } else if a.member_dev(i).is_none() {
        "missing"
    } else if a.is_failed(i) {
        "failed"
    } else if a.rebuild_state().iter().any(|r| r.0 == i) {
        "rebuilding"
    } else {
        "active"
    }
}

/// Background operations for status: the resync while it runs (or stopped unfinished), and
/// the rebuild while members are being rebuilt.
fn background(a: &uraid_engine::Array<FileDev>) -> Vec<Value> {
    let one = |v: uraid_engine::recovery::ProgressView| {
        json!({
            "op": v.op,
            "state": if v.running { "running" } else { "stopped" },
            "progress": v.fraction,
            "done": v.done,
            "total": v.total,
            "repaired": v.repaired,
            "rate_bytes_per_second": v.bytes_per_second,
            "eta_seconds": v.eta_seconds,
        })
    };
    let mut out = Vec::new();
    let v = a.recovery_progress();
    if v.running || a.needs_resync() {
        out.push(one(v));
    }
    if !a.rebuild_state().is_empty() {
        out.push(one(a.rebuild_progress()));
    }
    if a.replace_state().is_some() {
        out.push(one(a.replace_progress()));
    }
    let (mode, r, v, paused) = a.scrub_state();
    if let (Some(mode), true) = (mode, v.running) {
        let mut e = one(v);
        e["op"] = json!(mode.name());
        e["state"] = json!(if paused { "paused" } else { "running" });
        e["mismatches"] = json!(r.mismatches);
        e["located"] = json!(r.located);
        out.push(e);
    }
    out
}

/// The last (or running) scrub: mode, state and what it found.
fn scrub_json(a: &uraid_engine::Array<FileDev>) -> Value {
    let (mode, r, v, paused) = a.scrub_state();
    let Some(mode) = mode else {
        return json!({ "state": "never" });
    };
    json!({
        "mode": mode.name(),
        "state": match (v.running, paused, v.done >= v.total) {
            (true, true, _) => "paused",
            (true, false, _) => "running",
            (false, _, true) => "finished",
            (false, _, false) => "stopped",
        },
        "progress": v.fraction,
        "units": r.units,
        "mismatches": r.mismatches,
        "located": r.located,
        "repaired": r.repaired,
        "unreadable": r.unreadable,
    })
}

// ---------------------------------------------------------------- metrics

/// Prometheus text format 0.0.4, written by hand (ARCHITECTURE.md says why).
struct Prom {
    out: String,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(l: &[(&str, String)]) -> String {
    if l.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

impl Prom {
    fn family(&mut self, name: &str, typ: &str, help: &str) {
        self.out
            .push_str(&format!("# HELP {name} {help}\n# TYPE {name} {typ}\n"));
    }

    fn sample(&mut self, name: &str, l: &[(&str, String)], v: impl std::fmt::Display) {
        self.out.push_str(&format!("{name}{} {v}\n", labels(l)));
    }

    fn histogram(&mut self, name: &str, l: &[(&str, String)], o: &OpSnapshot) {
        let bounds = bucket_bounds();
        let mut cum = 0;
        for (i, n) in o.buckets.iter().enumerate() {
            cum += n;
            let le = if i < BUCKETS {
                format!("{}", bounds[i])
            } else {
                "+Inf".to_string()
            };
            let mut ll = l.to_vec();
            ll.push(("le", le));
            self.sample(&format!("{name}_bucket"), &ll, cum);
        }
        self.sample(&format!("{name}_sum"), l, o.latency_ns as f64 / 1e9);
        self.sample(&format!("{name}_count"), l, o.timed);
    }
}

/// The `/metrics` document.
pub fn metrics(state: &State) -> String {
    let a = state.volume.array();
    let g = *a.geometry();
    let (name, uuid, _) = a.identity();
    let arr = || ("array", name.to_string());
    let failed = a.failed();
    let mut p = Prom { out: String::new() };

    p.family("uraid_array_info", "gauge", "Array identity (value 1).");
    p.sample(
        "uraid_array_info",
        &[
            arr(),
            ("uuid", uuid_string(&uuid)),
            ("level", g.level.to_string()),
        ],
        1,
    );
    p.family(
        "uraid_array_state",
        "gauge",
        "1 for the array's current state (clean: nothing written since assembly; active: written; degraded; failed).",
    );
    let serving = a.is_serving();
    for (s, on) in [
        ("clean", !a.is_dirty()),
        ("active", a.is_dirty()),
        ("degraded", serving && !failed.is_empty()),
        ("failed", !serving),
    ] {
        p.sample(
            "uraid_array_state",
            &[arr(), ("state", s.into())],
            u8::from(on),
        );
    }
    p.family(
        "uraid_array_members",
        "gauge",
        "Members the array is built of.",
    );
    p.sample("uraid_array_members", &[arr()], g.members);
    p.family(
        "uraid_array_failed_members",
        "gauge",
        "Members missing or failed.",
    );
    p.sample("uraid_array_failed_members", &[arr()], failed.len());
    p.family("uraid_array_size_bytes", "gauge", "Volume size.");
    p.sample("uraid_array_size_bytes", &[arr()], g.volume_size());
    p.family(
        "uraid_array_events",
        "gauge",
        "Superblock event count (rises with every superblock round).",
    );
    p.sample("uraid_array_events", &[arr()], a.events());

    p.family(
        "uraid_member_state",
        "gauge",
        "1 for each member's current state (active, failed, missing, rebuilding).",
    );
    let member_labels = |i: usize| {
        let dev = member_path(state, i).unwrap_or_else(|| "-".to_string());
        vec![arr(), ("member", i.to_string()), ("device", dev)]
    };
    for i in 0..g.members {
        let now = member_state(a, i);
        for s in [
            "active",
            "failed",
            "missing",
            "rebuilding",
            "removed",
            "replacing",
        ] {
            let mut l = member_labels(i);
            l.push(("state", s.into()));
            p.sample("uraid_member_state", &l, u8::from(now == s));
        }
    }
    let ios: Vec<_> = (0..g.members).map(|i| a.member_io(i)).collect();
    type Pick = fn(&uraid_engine::members::MemberIoSnapshot) -> &OpSnapshot;
    let picks: [(&str, Pick); 3] = [
        ("read", |s| &s.read),
        ("write", |s| &s.write),
        ("flush", |s| &s.flush),
    ];
    for (fam, help, f) in [
        (
            "uraid_member_io_total",
            "Member I/Os (data and metadata).",
            (|o: &OpSnapshot| o.count) as fn(&OpSnapshot) -> u64,
        ),
        ("uraid_member_io_bytes_total", "Member I/O bytes.", |o| {
            o.bytes
        }),
        (
            "uraid_member_io_errors_total",
            "Member I/Os that failed.",
            |o| o.errors,
        ),
    ] {
        p.family(fam, "counter", help);
        for (i, io) in ios.iter().enumerate() {
            for (op, pick) in picks {
                let mut l = member_labels(i);
                l.push(("op", op.into()));
                p.sample(fam, &l, f(pick(io)));
            }
        }
    }
    p.family(
        "uraid_member_io_latency_seconds",
        "histogram",
        "Member I/O latency, sampled: one in 16 reads and writes per thread is timed, every flush.",
    );
    for (i, io) in ios.iter().enumerate() {
        for (op, pick) in picks {
            let mut l = member_labels(i);
            l.push(("op", op.into()));
            p.histogram("uraid_member_io_latency_seconds", &l, pick(io));
        }
    }
    p.family(
        "uraid_member_read_errors_corrected_total",
        "counter",
        "Media read errors reconstructed from redundancy and rewritten in place.",
    );
    for i in 0..g.members {
        p.sample(
            "uraid_member_read_errors_corrected_total",
            &member_labels(i),
            a.member_errors(i).0,
        );
    }

    let st = a.stats.snapshot();
    p.family(
        "uraid_stripe_operations_total",
        "counter",
        "Stripe writes by plan, writes merged into another's stripe operation, degraded reads.",
    );
    for (plan, v) in [
        ("full", st.full_stripe_writes),
        ("reconstruct", st.rcw_writes),
        ("read_modify_write", st.rmw_writes),
        ("merged", st.merged_writes),
        ("degraded_read", st.degraded_reads),
    ] {
        p.sample(
            "uraid_stripe_operations_total",
            &[arr(), ("plan", plan.into())],
            v,
        );
    }

    p.family(
        "uraid_background_progress_ratio",
        "gauge",
        "Progress (0 to 1) of a background operation that is due or running.",
    );
    let rv = a.recovery_progress();
    if rv.running || a.needs_resync() {
        p.sample(
            "uraid_background_progress_ratio",
            &[arr(), ("op", rv.op.to_string())],
            rv.fraction,
        );
    }
    if !a.rebuild_state().is_empty() {
        let bv = a.rebuild_progress();
        p.sample(
            "uraid_background_progress_ratio",
            &[arr(), ("op", bv.op.to_string())],
            bv.fraction,
        );
    }
    let (smode, sr, sv, _) = a.scrub_state();
    if let (Some(m), true) = (smode, sv.running) {
        p.sample(
            "uraid_background_progress_ratio",
            &[arr(), ("op", m.name().to_string())],
            sv.fraction,
        );
    }
    for (name, help, v) in [
        (
            "uraid_scrub_mismatches",
            "4 KiB columns whose redundancy disagreed in the last (or running) scrub.",
            sr.mismatches,
        ),
        (
            "uraid_scrub_located",
            "Of those, columns whose bad chunk was located (member named in the events).",
            sr.located,
        ),
        (
            "uraid_scrub_repaired",
            "Columns the last (or running) scrub repair rewrote.",
            sr.repaired,
        ),
    ] {
        p.family(name, "gauge", help);
        p.sample(name, &[arr()], v);
    }
    let (bc, _, dirty) = a.bitmap_state();
    if bc > 0 {
        p.family(
            "uraid_bitmap_dirty_regions",
            "gauge",
            "Write-intent bitmap regions set (writes in them recently; resynced after a crash).",
        );
        p.sample("uraid_bitmap_dirty_regions", &[arr()], dirty);
    }
    if let Some(j) = a.journal_status() {
        p.family(
            "uraid_journal_active",
            "gauge",
            "1 while the journal device is in service, 0 after it failed (bitmap mode).",
        );
        p.sample(
            "uraid_journal_active",
            &[arr(), ("mode", j.mode.to_string())],
            u64::from(j.state == "active"),
        );
        p.family(
            "uraid_journal_used_bytes",
            "gauge",
            "Journal log bytes not yet checkpointed.",
        );
        p.sample("uraid_journal_used_bytes", &[arr()], j.used_bytes);
        p.family(
            "uraid_journal_records_total",
            "counter",
            "Stripe updates logged to the journal.",
        );
        p.sample("uraid_journal_records_total", &[arr()], j.records);
        p.family(
            "uraid_journal_commits_total",
            "counter",
            "Journal flushes (each makes every record written before it durable).",
        );
        p.sample("uraid_journal_commits_total", &[arr()], j.commits);
    }
    p.family(
        "uraid_background_repaired_total",
        "counter",
        "Stripes whose redundancy a background operation rewrote.",
    );
    p.sample(
        "uraid_background_repaired_total",
        &[arr(), ("op", rv.op.to_string())],
        rv.repaired,
    );

    let server = &state.server;
    let ss = server.stats();
    let snaps: Vec<OpSnapshot> = ss
        .ops
        .iter()
        .map(|s| uraid_engine::metrics::OpCounters::sum(s.iter()))
        .collect();
    for (fam, help, f) in [
        (
            "uraid_nbd_requests_total",
            "NBD requests by command.",
            (|o: &OpSnapshot| o.count) as fn(&OpSnapshot) -> u64,
        ),
        (
            "uraid_nbd_request_bytes_total",
            "NBD request bytes by command (payload for read and write, range for the others).",
            |o| o.bytes,
        ),
        (
            "uraid_nbd_request_errors_total",
            "NBD error replies by command.",
            |o| o.errors,
        ),
    ] {
        p.family(fam, "counter", help);
        for (op, o) in OPS.iter().zip(&snaps) {
            p.sample(fam, &[arr(), ("op", op.to_string())], f(o));
        }
    }
    p.family(
        "uraid_reactor_ring_enters_total",
        "counter",
        "io_uring_enter system calls made by the reactors (about one per request at queue depth 1).",
    );
    p.sample(
        "uraid_reactor_ring_enters_total",
        &[arr()],
        server.ring_enters(),
    );
    p.family(
        "uraid_reactor_idle_turns_total",
        "counter",
        "Reactor turns with nothing to do, by how they ended: work found while busy-polling, or a sleep in io_uring_enter.",
    );
    let (polled, slept) = server.idle_turns();
    for (how, v) in [("polled", polled), ("slept", slept)] {
        p.sample(
            "uraid_reactor_idle_turns_total",
            &[arr(), ("how", how.to_string())],
            v,
        );
    }
    p.family(
        "uraid_nbd_request_latency_seconds",
        "histogram",
        "NBD request latency in the server, from request parsed to reply queued.",
    );
    for (op, o) in OPS.iter().zip(&snaps) {
        p.histogram(
            "uraid_nbd_request_latency_seconds",
            &[arr(), ("op", op.to_string())],
            o,
        );
    }
    p.family(
        "uraid_nbd_connections",
        "gauge",
        "NBD connections open now.",
    );
    p.sample("uraid_nbd_connections", &[arr()], server.open_connections());
    p.family(
        "uraid_nbd_connections_accepted_total",
        "counter",
        "NBD connections accepted.",
    );
    p.sample(
        "uraid_nbd_connections_accepted_total",
        &[arr()],
        ss.connections.load(Ordering::Relaxed),
    );
    p.family(
        "uraid_nbd_protocol_errors_total",
        "counter",
        "NBD connections ended by a protocol violation.",
    );
    p.sample(
        "uraid_nbd_protocol_errors_total",
        &[arr()],
        ss.protocol_errors.load(Ordering::Relaxed),
    );
    p.out
}

// ---------------------------------------------------------------- client side

/// GETs `path` from the control socket at `sock`: the status code and body.
pub fn get(sock: &Path, path: &str) -> Result<(u16, String)> {
    request(sock, "GET", path)
}

/// Sends a body-less `method` request for `path` to the control socket at `sock`.
pub fn request(sock: &Path, method: &str, path: &str) -> Result<(u16, String)> {
    let mut s = UnixStream::connect(sock)
        .with_context(|| format!("cannot connect to {}", sock.display()))?;
    // A member failure waits for a superblock round (member timeouts apply).
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: uraid\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => bail!("{}: malformed response", sock.display()),
    };
    let code = resp.code.unwrap_or(0);
    Ok((code, String::from_utf8_lossy(&buf[n..]).into_owned()))
}

/// POSTs an operator command; the server's message, or its refusal as an error.
pub fn post(sock: &Path, path: &str) -> Result<String> {
    let (code, body) = request(sock, "POST", path)?;
    let v: Value = serde_json::from_str(&body)
        .with_context(|| format!("{}: response is not JSON", sock.display()))?;
    if code != 202 {
        bail!("{}", v["error"].as_str().unwrap_or("?"));
    }
    Ok(v["message"].as_str().unwrap_or("done").to_string())
}

/// GETs a JSON document; non-200 is an error carrying the server's message.
pub fn get_json(sock: &Path, path: &str) -> Result<Value> {
    let (code, body) = get(sock, path)?;
    let v: Value = serde_json::from_str(&body)
        .with_context(|| format!("{}: response is not JSON", sock.display()))?;
    if code != 200 {
        bail!(
            "{}: {path}: HTTP {code}: {}",
            sock.display(),
            v["error"].as_str().unwrap_or("?")
        );
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            labels(&[("a", "x\"y\\z\nw".into())]),
            "{a=\"x\\\"y\\\\z\\nw\"}"
        );
    }
}
