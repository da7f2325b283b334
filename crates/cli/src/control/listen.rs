//! Where the control endpoints listen, the accept thread, and who may talk to them: the
//! Unix socket (mode 0600; peers other than root and the server's user get 403) and the
//! metrics-only TCP listener, each with its own budget of `MAX_CLIENTS` connections.

use super::http::{read_head, write_response, ReadWrite, Response};
use super::{routes, State};
use anyhow::{bail, Context, Result};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Control connections served at once per listener (Unix, TCP); more get 503.
const MAX_CLIENTS: usize = 8;
/// Time a client has to send its request and take the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

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
    if is_live(path) {
        bail!(
            "{what} {}: another server is listening there",
            path.display()
        );
    }
    std::fs::remove_file(path)
        .with_context(|| format!("{what} {}: cannot remove the stale socket", path.display()))
}

/// Whether a live server listens on the socket at `path`. A server that just died may still
/// accept for a moment: io_uring tears down a dead process's pending accept asynchronously,
/// and until then the socket listens. The listener's credentials (taken at listen) name its
/// process: gone means stale.
pub fn is_live(path: &Path) -> bool {
    UnixStream::connect(path)
        .ok()
        .is_some_and(|s| peer_cred(&s).is_none_or(|c| process_exists(c.pid)))
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

/// An accepted connection: the control socket's, or the metrics listener's.
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

/// The accept thread: polls both listeners (200 ms, to see `stop`) and hands each
/// connection to a thread of its own, or answers 503 when its listener's budget is spent.
pub(super) fn accept_loop(
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

/// One connection: the peer check (Unix socket), one request, one response.
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
        Ok(head) => routes::route(state, &head, metrics_only),
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
