//! The NBD server: listeners, the fixed-newstyle handshake, and the transmission phase.
//!
//! Each connection is a task on one reactor (connections are spread round-robin). Its reader
//! parses requests and spawns one task per request on the same reactor, so requests run
//! concurrently and are answered out of order, each as soon as it completes. Replies go
//! through a per-connection queue: whoever finds the socket idle sends everything queued in
//! one sendmsg (header and payload pieces as iovecs), so a burst of completions costs one
//! system call and a lone reply is never held back waiting for company.
//!
//! Memory per connection is bounded: the reader takes no request from the socket while the
//! payloads of the requests it has in flight (write data held, read data requested) would
//! exceed `Config::max_payload_in_flight`, nor while more than `Config::max_reply_queue`
//! bytes of replies wait to be sent (a client that does not read its replies stops being
//! read), besides the limit of `MAX_INFLIGHT` requests.
//!
//! Before a connection is served: its peer is checked against the allow and deny lists
//! (`access`) before any byte is read, and a connection still in the handshake
//! (greeting, options, STARTTLS) counts against `Config::max_handshakes` and is cut off
//! after `Config::handshake_timeout`, so clients that never finish cannot hold the
//! server's slots.
//!
//! The parts: this file (configuration, counters, the listeners, the client list and
//! shutdown), `recv` (the buffered reader), `send` (the reply queue and replies),
//! `handshake` (option haggling, STARTTLS), `tlslink` (a connection's TLS session),
//! `command` (`validate`: a raw request to a typed command, or its error) and
//! `transmission` (the reader loop and dispatch to the array).

mod command;
mod handshake;
mod recv;
mod send;
mod tlslink;
mod transmission;

pub use handshake::{block_sizes, fuzz_options};

use crate::access::{Access, Cred, Peer};
use crate::proto;
use crate::tls::{self, Tls};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use uraid_engine::metrics::OpCounters;
use uraid_engine::net;
use uraid_engine::reactor;
use uraid_engine::shard::Sharded;
use uraid_engine::{ArrayError, BlockDev, RuntimeHandle, Volume};

/// Largest READ or WRITE payload accepted (and advertised as the maximum block size).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Requests a connection may have in flight before its reader waits.
const MAX_INFLIGHT: usize = 256;
/// Default `Config::max_payload_in_flight`.
pub const DEFAULT_MAX_PAYLOAD_IN_FLIGHT: usize = 64 << 20;
/// Default `Config::max_reply_queue`.
pub const DEFAULT_MAX_REPLY_QUEUE: usize = 32 << 20;
/// Default `Config::shutdown_grace`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Default `Config::handshake_timeout`.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `Config::max_handshakes`.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Base:allocation's metadata context id.
const META_ID: u32 = 1;

#[derive(Debug, Clone)]
pub struct Config {
    pub export: String,
    pub description: String,
    pub read_only: bool,
    /// Payload bytes one connection may have in flight: write data received and read data
    /// requested, of requests not yet answered. The reader leaves the next request in the
    /// socket until it fits (a request larger than this still runs, alone).
    pub max_payload_in_flight: usize,
    /// Reply bytes one connection may have waiting to be sent before its reader stops
    /// taking new requests (replies of requests already taken still queue up behind them).
    pub max_reply_queue: usize,
    /// How long `Server::shutdown` lets connections finish sending the replies to what they
    /// had read; connections still open then (a client that does not read) are cut off.
    pub shutdown_grace: Duration,
    /// `--tls`: whether STARTTLS is refused, offered or required.
    pub tls_mode: tls::Mode,
    /// The credentials STARTTLS uses (needed unless `tls_mode` is off).
    pub tls: Option<Arc<Tls>>,
    /// Who may connect (`--allow`, `--deny`).
    pub access: Access,
    /// How long a client may take from its connection to the end of the handshake
    /// (options, STARTTLS and the TLS handshake) before it is cut off.
    pub handshake_timeout: Duration,
    /// Connections that may be in the handshake at once; more are closed at once.
    pub max_handshakes: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            export: String::new(),
            description: String::new(),
            read_only: false,
            max_payload_in_flight: DEFAULT_MAX_PAYLOAD_IN_FLIGHT,
            max_reply_queue: DEFAULT_MAX_REPLY_QUEUE,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            tls_mode: tls::Mode::Off,
            tls: None,
            access: Access::default(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
        }
    }
}

/// NBD commands with their own counters, in `ServerStats::ops` order.
pub const OPS: [&str; 7] = [
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "block_status",
    "cache",
];

/// Index of a command type in `OPS`.
pub fn op_index(typ: u16) -> Option<usize> {
    use proto::*;
    Some(match typ {
        CMD_READ => 0,
        CMD_WRITE => 1,
        CMD_FLUSH => 2,
        CMD_TRIM => 3,
        CMD_WRITE_ZEROES => 4,
        CMD_BLOCK_STATUS => 5,
        CMD_CACHE => 6,
        _ => return None,
    })
}

/// Counters visible while serving.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections accepted (ever).
    pub connections: AtomicU64,
    /// Connections that ended on a protocol violation (malformed handshake or request).
    pub protocol_errors: AtomicU64,
    pub requests: AtomicU64,
    /// Error replies.
    pub errors: AtomicU64,
    /// Per command (`OPS`): count, bytes (payload for read and write, the range for the
    /// others), error replies and latency from request parsed to reply queued, per reactor.
    pub ops: [Sharded<OpCounters>; OPS.len()],
    /// Most payload bytes (see `Config::max_payload_in_flight`) any one connection has had
    /// in flight.
    pub payload_high_water: AtomicU64,
    /// Most reply bytes any one connection has had queued or being sent.
    pub reply_queue_high_water: AtomicU64,
    /// Connections closed before the greeting, by reason (`REFUSALS`).
    pub refused: [AtomicU64; REFUSALS.len()],
    /// TLS handshakes completed, by the client's identity (PSK identity or certificate subject;
    /// "" for a client without one), at most `MAX_TLS_PEERS` names, then "(others)".
    pub tls_peers: Mutex<BTreeMap<String, u64>>,
    /// TLS sessions that failed (in the handshake or later), by reason.
    pub tls_failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Plaintext bytes encrypted into records, and decrypted out of them.
    pub tls_bytes_encrypted: AtomicU64,
    pub tls_bytes_decrypted: AtomicU64,
}

/// Why a connection was closed unserved, in `ServerStats::refused` order: its peer is not
/// allowed; too many connections were in the handshake; it did not finish the handshake in
/// time (cut off then, not before the greeting).
pub const REFUSALS: [&str; 3] = ["not_allowed", "too_many_handshakes", "handshake_timeout"];

/// Identities `ServerStats::tls_peers` names one by one.
pub const MAX_TLS_PEERS: usize = 256;

impl ServerStats {
    pub(crate) fn tls_handshake(&self, peer: Option<&str>) {
        let mut m = self.tls_peers.lock().unwrap_or_else(|e| e.into_inner());
        let name = peer.unwrap_or("");
        let key = if m.contains_key(name) || m.len() < MAX_TLS_PEERS {
            name
        } else {
            "(others)"
        };
        *m.entry(key.to_string()).or_insert(0) += 1;
    }

    pub(crate) fn tls_failure(&self, reason: &'static str) {
        *self
            .tls_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason)
            .or_insert(0) += 1;
    }

    fn refuse(&self, which: usize) {
        self.refused[which].fetch_add(1, Ordering::Relaxed);
    }
}

/// A connection in the server's client list.
struct Client {
    fd: RawFd,
    peer: Peer,
    since: Instant,
    /// While the handshake lasts: when it must be over.
    deadline: Option<Instant>,
    tls: Option<tls::Info>,
    /// Reply framing negotiated: "simple", "structured" or "extended".
    headers: &'static str,
    /// Cut off by the reaper (its socket shut down; the task is ending).
    cut: bool,
}

/// A connection being served, for `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    pub id: u64,
    pub peer: String,
    pub seconds: u64,
    /// Still in the handshake (options, STARTTLS).
    pub handshake: bool,
    pub tls: Option<tls::Info>,
    /// "simple", "structured" or "extended" (headers and replies negotiated).
    pub headers: &'static str,
}

struct Inner<D: BlockDev> {
    array: Arc<Volume<D>>,
    rt: RuntimeHandle,
    cfg: Config,
    /// Set (under the `conns` lock) when shutdown starts.
    stopping: AtomicBool,
    next: AtomicUsize,
    next_id: AtomicU64,
    /// Live connections (their sockets, so shutdown can end their reads). A connection is
    /// registered under this lock only if `stopping` is still clear, so shutdown (which sets
    /// it under the same lock) reaches every connection that will ever be served.
    conns: Mutex<HashMap<u64, Client>>,
    /// `cfg.tls`, when the mode is not off.
    tls: Option<Arc<Tls>>,
    /// The thread that cuts off handshakes past their deadline has started.
    reaper: AtomicBool,
    warn_limit: Mutex<WarnLimit>,
    /// Signalled (with `conns`) whenever a connection ends.
    idle: Condvar,
    listeners: Mutex<Vec<RawFd>>,
    stats: Arc<ServerStats>,
    /// Runs on the accepting reactor between accept and registration (tests widen the
    /// window in which shutdown can start there).
    #[cfg(test)]
    accept_hook: Mutex<Option<Box<dyn Fn() + Send>>>,
}

/// A running NBD server over one array.
pub struct Server<D: BlockDev> {
    inner: Arc<Inner<D>>,
}

impl<D: BlockDev> Server<D> {
    pub fn new(array: Arc<Volume<D>>, rt: RuntimeHandle, cfg: Config) -> Server<D> {
        let tls = match cfg.tls_mode {
            tls::Mode::Off => None,
            _ => cfg.tls.clone(),
        };
        Server {
            inner: Arc::new(Inner {
                array,
                rt,
                tls,
                reaper: AtomicBool::new(false),
                warn_limit: Mutex::new(WarnLimit::default()),
                cfg,
                stopping: AtomicBool::new(false),
                next: AtomicUsize::new(0),
                next_id: AtomicU64::new(0),
                conns: Mutex::new(HashMap::new()),
                idle: Condvar::new(),
                listeners: Mutex::new(Vec::new()),
                stats: Arc::new(ServerStats::default()),
                #[cfg(test)]
                accept_hook: Mutex::new(None),
            }),
        }
    }

    pub fn stats(&self) -> &ServerStats {
        &self.inner.stats
    }

    /// io_uring_enter calls the reactors serving this server have made.
    pub fn ring_enters(&self) -> u64 {
        self.inner.rt.ring_enters()
    }

    /// Reactor idle turns that found work busy-polling, and turns that slept.
    pub fn idle_turns(&self) -> (u64, u64) {
        self.inner.rt.idle_turns()
    }

    /// Connections being served now.
    pub fn open_connections(&self) -> usize {
        self.inner
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The connections being served, oldest first.
    pub fn clients(&self) -> Vec<ClientInfo> {
        let conns = self.inner.conns.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<ClientInfo> = conns
            .iter()
            .map(|(&id, c)| ClientInfo {
                id,
                peer: c.peer.to_string(),
                seconds: c.since.elapsed().as_secs(),
                handshake: c.deadline.is_some() || c.cut,
                tls: c.tls.clone(),
                headers: c.headers,
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Reads the TLS credentials again (the files named at start); connections already
    /// served keep the session they have. Err if TLS is off or a file is refused (the
    /// credentials in use then stay).
    pub fn reload_tls(&self) -> Result<String, String> {
        match &self.inner.tls {
            Some(t) => t.reload(),
            None => Err("TLS is off on this server (--tls)".into()),
        }
    }

    /// Starts accepting on a bound, listening socket. `tcp` turns on TCP_NODELAY for its
    /// connections. The listener must stay open until `shutdown` returns.
    pub fn listen(&self, listener: RawFd, tcp: bool) {
        self.inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(listener);
        if !self.inner.reaper.swap(true, Ordering::SeqCst) {
            spawn_reaper(Arc::downgrade(&self.inner));
        }
        let inner = self.inner.clone();
        self.inner.rt.run_on(0, move || {
            reactor::spawn_local(accept_loop(inner, listener, tcp));
        });
    }

    /// Stops accepting, lets every connection finish the requests it has read and send
    /// their replies (for at most `Config::shutdown_grace`; connections still open then are
    /// cut off), waits for them to close, then flushes the array and records a clean
    /// shutdown. Connections accepted once shutdown has started are closed unserved.
    pub fn shutdown(&self) -> Result<(), ArrayError> {
        let inner = &self.inner;
        // Under the registration lock: every connection is either registered now (and shut
        // down below) or will see `stopping` and be closed unserved.
        let mut conns = inner.conns.lock().unwrap_or_else(|e| e.into_inner());
        inner.stopping.store(true, Ordering::SeqCst);
        for &l in inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            // SAFETY: shutdown(2) on a socket fd the caller keeps open; it only wakes the
            // pending accept.
            unsafe { libc::shutdown(l, libc::SHUT_RDWR) };
        }
        for c in conns.values() {
            // SAFETY: the fd is registered only while its connection task owns it open (it is
            // removed under this lock before being closed); SHUT_RD ends the pending receive
            // with EOF (an idle client, or one in the handshake, is done at once) and leaves
            // replies flowing.
            unsafe { libc::shutdown(c.fd, libc::SHUT_RD) };
        }
        let deadline = Instant::now() + inner.cfg.shutdown_grace;
        while !conns.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            conns = inner
                .idle
                .wait_timeout(conns, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if !conns.is_empty() {
            tracing::warn!(
                "{} connection(s) still open {:?} into shutdown (client not reading replies?): \
                 closing them",
                conns.len(),
                inner.cfg.shutdown_grace
            );
            for c in conns.values() {
                // SAFETY: as above; SHUT_RDWR also fails the pending send, so the connection
                // ends once its in-flight requests (which do not wait on the socket) finish.
                unsafe { libc::shutdown(c.fd, libc::SHUT_RDWR) };
            }
            while !conns.is_empty() {
                conns = inner.idle.wait(conns).unwrap_or_else(|e| e.into_inner());
            }
        }
        drop(conns);
        let array = inner.array.clone();
        inner
            .rt
            .block_on(0, move || async move { array.close().await })
    }
}

impl<D: BlockDev> Inner<D> {
    fn client<R>(&self, id: u64, f: impl FnOnce(&mut Client) -> R) -> Option<R> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.get_mut(&id).map(f)
    }

    /// The connection entered transmission with `headers` ("simple", "structured",
    /// "extended"): no longer held to the handshake's deadline.
    fn handshake_done(&self, id: u64, headers: &'static str) {
        self.client(id, |c| {
            c.deadline = None;
            c.headers = headers;
        });
    }

    /// Records what the connection negotiated; returns its peer address.
    fn set_client_tls(&self, id: u64, info: tls::Info) -> String {
        self.client(id, |c| {
            c.tls = Some(info);
            c.peer.to_string()
        })
        .unwrap_or_default()
    }

    fn peer(&self, id: u64) -> String {
        self.client(id, |c| c.peer.to_string()).unwrap_or_default()
    }
}

/// A connection in the client list; dropping it removes the entry and closes the socket
/// under the list's lock (so shutdown and the reaper only ever touch open sockets).
struct Registered<D: BlockDev> {
    inner: Arc<Inner<D>>,
    id: u64,
    fd: Option<OwnedFd>,
}

impl<D: BlockDev> Registered<D> {
    fn raw(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}

impl<D: BlockDev> Drop for Registered<D> {
    fn drop(&mut self) {
        let mut conns = self.inner.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.remove(&self.id);
        drop(self.fd.take());
        drop(conns);
        self.inner.idle.notify_all();
    }
}

/// Warnings about refused or failed clients logged per minute, at most; the rest go to
/// debug and are summed in the next warning (the counters have them all): a flood of bad
/// clients must not push member failures out of the event ring.
const CLIENT_WARNINGS_PER_MINUTE: u32 = 10;

#[derive(Default)]
struct WarnLimit {
    since: Option<Instant>,
    logged: u32,
    held: u64,
}

impl<D: BlockDev> Inner<D> {
    /// A warning about one client (refused, cut off, failed TLS), within the limit.
    fn warn_client(&self, msg: String) {
        let mut l = self.warn_limit.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if l.since
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
        {
            if l.held > 0 {
                tracing::warn!(
                    "{} more refused or failed client(s) in the last minute, not logged one \
                     by one (uraid status: connections.refused, tls.failures)",
                    l.held
                );
            }
            *l = WarnLimit {
                since: Some(now),
                ..WarnLimit::default()
            };
        }
        if l.logged < CLIENT_WARNINGS_PER_MINUTE {
            l.logged += 1;
            tracing::warn!("{msg}");
        } else {
            l.held += 1;
            tracing::debug!("{msg}");
        }
    }
}

/// The far end of a freshly accepted socket.
fn peer_of(fd: RawFd, tcp: bool) -> Peer {
    if tcp {
        // SAFETY: getpeername into a zeroed sockaddr_storage of the stated length.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: as above; the kernel writes at most `len` bytes.
        let r =
            unsafe { libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
        if r == 0 {
            match ss.ss_family as libc::c_int {
                libc::AF_INET => {
                    // SAFETY: the family says the storage holds a sockaddr_in.
                    let a = unsafe { *(&ss as *const _ as *const libc::sockaddr_in) };
                    let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                    return Peer::Ip(ip.into());
                }
                libc::AF_INET6 => {
                    // SAFETY: the family says the storage holds a sockaddr_in6.
                    let a = unsafe { *(&ss as *const _ as *const libc::sockaddr_in6) };
                    return Peer::Ip(std::net::Ipv6Addr::from(a.sin6_addr.s6_addr).into());
                }
                _ => {}
            }
        }
        // Unknown: matches only `all` entries (and is refused by a `deny=all`).
        return Peer::Unknown;
    }
    // SAFETY: getsockopt(SO_PEERCRED) into a zeroed ucred of the stated length.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    Peer::Unix((r == 0).then_some(Cred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    }))
}

/// Cuts off connections still in the handshake past their deadline (SHUT_RDWR ends their
/// pending receive; the connection task then closes them), until the server is dropped or
/// stops.
fn spawn_reaper<D: BlockDev>(weak: Weak<Inner<D>>) {
    let spawned = std::thread::Builder::new()
        .name("uraid-nbd-reaper".into())
        .spawn(move || loop {
            let tick = match weak.upgrade() {
                Some(i) => (i.cfg.handshake_timeout / 4)
                    .clamp(Duration::from_millis(10), Duration::from_millis(500)),
                None => return,
            };
            std::thread::sleep(tick);
            let Some(inner) = weak.upgrade() else { return };
            if inner.stopping.load(Ordering::SeqCst) {
                return;
            }
            let now = Instant::now();
            let mut conns = inner.conns.lock().unwrap_or_else(|e| e.into_inner());
            let mut cut = Vec::new();
            for c in conns.values_mut() {
                if !c.cut && c.deadline.is_some_and(|d| d <= now) {
                    c.cut = true;
                    inner.stats.refuse(2);
                    cut.push(c.peer);
                    // SAFETY: a registered fd is open while registered (`Registered` closes
                    // it under this lock).
                    unsafe { libc::shutdown(c.fd, libc::SHUT_RDWR) };
                }
            }
            drop(conns);
            for peer in cut {
                inner.warn_client(format!(
                    "cut off {peer} after {:?} in the handshake (--handshake-timeout)",
                    inner.cfg.handshake_timeout
                ));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no handshake timeout (cannot start its thread: {e})");
    }
}

/// Accepts connections on `listener` (on reactor 0) and starts each on the next reactor,
/// registered for shutdown; until shutdown starts.
async fn accept_loop<D: BlockDev>(inner: Arc<Inner<D>>, listener: RawFd, tcp: bool) {
    loop {
        let fd = match net::accept(listener).await {
            Ok(fd) => fd,
            Err(e) => {
                if inner.stopping.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!("accept failed: {e}");
                if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                continue;
            }
        };
        #[cfg(test)]
        if let Some(hook) = inner
            .accept_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            hook();
        }
        if tcp {
            let one: libc::c_int = 1;
            // SAFETY: setsockopt with a pointer to a live c_int of the stated size.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    &one as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        let peer = peer_of(fd.as_raw_fd(), tcp);
        if let Err(rule) = inner.cfg.access.check(&peer) {
            inner.stats.refuse(0);
            inner.warn_client(format!(
                "refused a connection from {peer}: not allowed (--deny {rule})"
            ));
            continue;
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut conns = inner.conns.lock().unwrap_or_else(|e| e.into_inner());
            if inner.stopping.load(Ordering::SeqCst) {
                // Accepted as shutdown started: close it unserved (dropping `fd`) rather
                // than serve a connection shutdown does not know about.
                return;
            }
            let handshaking = conns.values().filter(|c| c.deadline.is_some()).count();
            if handshaking >= inner.cfg.max_handshakes {
                drop(conns);
                inner.stats.refuse(1);
                inner.warn_client(format!(
                    "refused a connection from {peer}: {handshaking} connections are in the \
                     handshake already (--max-handshakes)"
                ));
                continue;
            }
            let now = Instant::now();
            conns.insert(
                id,
                Client {
                    fd: fd.as_raw_fd(),
                    peer,
                    since: now,
                    deadline: Some(now + inner.cfg.handshake_timeout),
                    tls: None,
                    headers: "simple",
                    cut: false,
                },
            );
        }
        inner.stats.connections.fetch_add(1, Ordering::Relaxed);
        let r = inner.next.fetch_add(1, Ordering::Relaxed) % inner.rt.reactors();
        let inner2 = inner.clone();
        // Deregisters (and closes the socket) when the task ends, however it ends: a
        // registered fd is always one this connection still holds open.
        let reg = Registered {
            inner: inner2.clone(),
            id,
            fd: Some(fd),
        };
        inner.rt.run_on(r, move || {
            reactor::spawn_local(async move {
                let raw = reg.raw();
                if let Err(e) = transmission::connection(inner2.clone(), raw, id).await {
                    if e.kind() == io::ErrorKind::InvalidData {
                        // Counted, logged at debug: a flood of bad clients must not push
                        // member failures out of the event ring.
                        inner2.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("connection closed on a protocol error: {e}");
                    } else {
                        tracing::debug!("connection closed: {e}");
                    }
                }
                drop(reg);
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::mpsc;
    use uraid_core::Level;
    use uraid_engine::Runtime;

    /// A client whose connection the accept loop has taken but not yet registered when
    /// shutdown starts (the hook holds the accepting reactor right there) must be closed
    /// unserved: registered late, it would never be told to stop, and an idle client would
    /// then keep the reactors (and `uraid serve`) from ever exiting.
    #[test]
    fn a_connection_accepted_as_shutdown_starts_is_closed_unserved() {
        let dir = std::env::temp_dir().join(format!("uraid-nbd-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rt = Runtime::new(1, 64, true).unwrap();
        assert!(rt.uses_uring(), "the NBD server needs io_uring");
        let (array, _) =
            uraid_sim::mem_array(Level::Raid0, 2, 64 << 10, 1 << 20, Some(rt.handle()));
        let server = Server::new(
            array,
            rt.handle(),
            Config {
                export: "vol".into(),
                ..Config::default()
            },
        );
        let (accepted_tx, accepted_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        *server.inner.accept_hook.lock().unwrap() = Some(Box::new(move || {
            let _ = accepted_tx.send(());
            let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
        }));
        let sock = dir.join("nbd.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        server.listen(listener.as_raw_fd(), false);

        let mut client = UnixStream::connect(&sock).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        accepted_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the server accepted the client");
        // The accepting reactor is inside the hook. Start shutting down.
        let inner = server.inner.clone();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = server.shutdown();
            drop(server);
            rt.shutdown();
            let _ = done_tx.send(r);
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !inner.stopping.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "shutdown never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(inner);
        go_tx.send(()).unwrap();
        match done_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r.expect("array closed cleanly"),
            Err(_) => panic!("server and reactors still running 10 s after shutdown started"),
        }
        let mut b = [0u8; 18];
        assert!(
            matches!(client.read(&mut b), Ok(0)),
            "the late connection is closed without a greeting"
        );
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
