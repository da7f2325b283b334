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

use crate::proto::{self, Errno, Request};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};
use uraid_core::geometry::SECTOR;
use uraid_engine::metrics::OpCounters;
use uraid_engine::net::{self, OutPart};
use uraid_engine::reactor;
use uraid_engine::shard::{self, Sharded};
use uraid_engine::{buf, ArrayError, BlockDev, IoBuf, ReadPiece, RuntimeHandle, Volume};

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
/// Receive buffer per connection.
const RECV_BUF: usize = 256 << 10;
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
}

struct Inner<D: BlockDev> {
    array: Arc<Volume<D>>,
    rt: RuntimeHandle,
    cfg: Config,
    /// Set (under the `conns` lock) when shutdown starts.
    stopping: AtomicBool,
    next: AtomicUsize,
    next_id: AtomicU64,
    /// Live connections' sockets, so shutdown can end their reads. A connection is
    /// registered under this lock only if `stopping` is still clear, so shutdown (which sets
    /// it under the same lock) reaches every connection that will ever be served.
    conns: Mutex<HashMap<u64, RawFd>>,
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
        Server {
            inner: Arc::new(Inner {
                array,
                rt,
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

    /// Starts accepting on a bound, listening socket. `tcp` turns on TCP_NODELAY for its
    /// connections. The listener must stay open until `shutdown` returns.
    pub fn listen(&self, listener: RawFd, tcp: bool) {
        self.inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(listener);
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
        for &fd in conns.values() {
            // SAFETY: the fd is registered only while its connection task owns it open (it is
            // removed under this lock before being closed); SHUT_RD ends the pending receive
            // with EOF (an idle client, or one in the handshake, is done at once) and leaves
            // replies flowing.
            unsafe { libc::shutdown(fd, libc::SHUT_RD) };
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
            for &fd in conns.values() {
                // SAFETY: as above; SHUT_RDWR also fails the pending send, so the connection
                // ends once its in-flight requests (which do not wait on the socket) finish.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
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
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut conns = inner.conns.lock().unwrap_or_else(|e| e.into_inner());
            if inner.stopping.load(Ordering::SeqCst) {
                // Accepted as shutdown started: close it unserved (dropping `fd`) rather
                // than serve a connection shutdown does not know about.
                return;
            }
            conns.insert(id, fd.as_raw_fd());
        }
        inner.stats.connections.fetch_add(1, Ordering::Relaxed);
        let r = inner.next.fetch_add(1, Ordering::Relaxed) % inner.rt.reactors();
        let inner2 = inner.clone();
        inner.rt.run_on(r, move || {
            reactor::spawn_local(async move {
                let raw = fd.as_raw_fd();
                if let Err(e) = connection(inner2.clone(), raw).await {
                    if e.kind() == io::ErrorKind::InvalidData {
                        // Counted, logged at debug: a flood of bad clients must not push
                        // member failures out of the event ring.
                        inner2.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("connection closed on a protocol error: {e}");
                    } else {
                        tracing::debug!("connection closed: {e}");
                    }
                }
                let mut conns = inner2.conns.lock().unwrap_or_else(|e| e.into_inner());
                conns.remove(&id);
                drop(fd);
                drop(conns);
                inner2.idle.notify_all();
            })
        });
    }
}

// ---------------------------------------------------------------- receive side

/// Buffered reader over a socket.
struct Reader {
    fd: RawFd,
    buf: Option<Vec<u8>>,
    start: usize,
    end: usize,
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "client closed the connection")
}

impl Reader {
    fn new(fd: RawFd) -> Reader {
        Reader {
            fd,
            buf: Some(vec![0u8; RECV_BUF]),
            start: 0,
            end: 0,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Receives at least once more into the free tail (compacting first).
    async fn fill(&mut self) -> io::Result<()> {
        let mut buf = self.buf.take().expect("reader buffer present");
        if self.start > 0 {
            buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let (r, buf) = net::recv(self.fd, buf, self.end).await;
        self.buf = Some(buf);
        match r? {
            0 => Err(eof()),
            n => {
                self.end += n;
                Ok(())
            }
        }
    }

    /// The next `n` bytes (n <= RECV_BUF).
    async fn exact(&mut self, n: usize) -> io::Result<&[u8]> {
        while self.buffered() < n {
            self.fill().await?;
        }
        let s = self.start;
        self.start += n;
        let b = self.buf.as_ref().expect("reader buffer present");
        Ok(&b[s..s + n])
    }

    /// The next `n` bytes (payloads of any size up to MAX_PAYLOAD) in an aligned buffer that
    /// the array writes to the members as it is (no zeroing, no copy after the receive).
    async fn take_buf(&mut self, n: usize) -> io::Result<IoBuf> {
        let have = self.buffered().min(n);
        let mut v = buf::alloc(n);
        {
            let b = self.buf.as_ref().expect("reader buffer present");
            v[..have].copy_from_slice(&b[self.start..self.start + have]);
        }
        self.start += have;
        let mut got = have;
        while got < n {
            let (r, back) = net::recv(self.fd, v, got).await;
            v = back;
            match r? {
                0 => return Err(eof()),
                k => got += k,
            }
        }
        Ok(v)
    }

    /// Reads and drops `n` bytes without holding more than the receive buffer.
    async fn skip(&mut self, mut n: usize) -> io::Result<()> {
        while n > 0 {
            if self.buffered() == 0 {
                self.fill().await?;
            }
            let k = self.buffered().min(n);
            self.start += k;
            n -= k;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- send side

/// Per-connection reply queue and the reader's accounting.
struct Conn {
    fd: RawFd,
    queue: RefCell<VecDeque<OutPart>>,
    sending: Cell<bool>,
    broken: Cell<bool>,
    inflight: Cell<usize>,
    /// Payload bytes of the requests in flight (write data held, read data requested).
    payload: Cell<usize>,
    /// Reply bytes queued or in the sendmsg under way.
    queued: Cell<usize>,
    stats: Arc<ServerStats>,
    /// The reader (waiting for room) or the closer (waiting for the end).
    waiter: RefCell<Option<Waker>>,
}

impl Conn {
    fn new(fd: RawFd, stats: Arc<ServerStats>) -> Conn {
        Conn {
            fd,
            queue: RefCell::new(VecDeque::new()),
            sending: Cell::new(false),
            broken: Cell::new(false),
            inflight: Cell::new(0),
            payload: Cell::new(0),
            queued: Cell::new(0),
            stats,
            waiter: RefCell::new(None),
        }
    }

    fn wake(&self) {
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    fn add_payload(&self, n: usize) {
        let p = self.payload.get() + n;
        self.payload.set(p);
        self.stats
            .payload_high_water
            .fetch_max(p as u64, Ordering::Relaxed);
    }

    /// Queues one whole reply; starts a sender if the socket is idle.
    fn send(self: &Rc<Self>, parts: Vec<OutPart>) {
        if self.broken.get() {
            return;
        }
        let bytes: usize = parts.iter().map(OutPart::len).sum();
        let q = self.queued.get() + bytes;
        self.queued.set(q);
        self.stats
            .reply_queue_high_water
            .fetch_max(q as u64, Ordering::Relaxed);
        self.queue.borrow_mut().extend(parts);
        if !self.sending.get() {
            self.sending.set(true);
            let c = self.clone();
            reactor::spawn_local(async move {
                loop {
                    let batch: Vec<OutPart> = c.queue.borrow_mut().drain(..).collect();
                    if batch.is_empty() || c.broken.get() {
                        break;
                    }
                    let n: usize = batch.iter().map(OutPart::len).sum();
                    if let Err(e) = net::send_all(c.fd, batch).await {
                        tracing::debug!("send failed: {e}");
                        c.broken.set(true);
                        c.queue.borrow_mut().clear();
                        c.queued.set(0);
                        break;
                    }
                    c.queued.set(c.queued.get() - n);
                    // The reader may be waiting for the queue to shrink.
                    c.wake();
                }
                c.sending.set(false);
                c.wake();
            });
        }
    }

    async fn wait_until(&self, cond: impl Fn(&Conn) -> bool) {
        std::future::poll_fn(|cx| {
            if cond(self) {
                Poll::Ready(())
            } else {
                *self.waiter.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// Sends bytes during the handshake (nothing else is in flight then).
async fn send_now(fd: RawFd, v: Vec<u8>) -> io::Result<()> {
    net::send_all(fd, vec![OutPart::Bytes(v)]).await
}

// ---------------------------------------------------------------- handshake

/// What the client negotiated.
struct Session {
    structured: bool,
    meta: bool,
}

fn transmission_flags<D: BlockDev>(inner: &Inner<D>, structured: bool) -> u16 {
    use proto::*;
    let mut f = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN | FLAG_SEND_CACHE;
    if inner.cfg.read_only {
        f |= FLAG_READ_ONLY;
    } else {
        f |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    }
    if structured {
        f |= FLAG_SEND_DF;
    }
    f
}

/// (minimum, preferred, maximum) block sizes: sector, one full stripe (as a power of two),
/// MAX_PAYLOAD.
pub fn block_sizes<D: BlockDev>(array: &Volume<D>) -> (u32, u32, u32) {
    let stripe = array.geometry().stripe_data_bytes();
    let preferred = stripe.next_power_of_two().clamp(4096, MAX_PAYLOAD as u64) as u32;
    (SECTOR as u32, preferred, MAX_PAYLOAD)
}

fn name_ok<D: BlockDev>(inner: &Inner<D>, name: &str) -> bool {
    name.is_empty() || name == inner.cfg.export
}

/// Runs option haggling. Ok(Some) = enter transmission; Ok(None) = client aborted.
async fn handshake<D: BlockDev>(inner: &Inner<D>, rd: &mut Reader) -> io::Result<Option<Session>> {
    use proto::*;
    let fd = rd.fd;
    send_now(fd, greeting()).await?;
    let cflags = {
        let b = rd.exact(4).await?;
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    };
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown client flags {cflags:#x}"),
        ));
    }
    let no_zeroes = cflags & FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    let mut meta = false;
    let size = inner.array.size();
    loop {
        let hdr: [u8; 16] = rd.exact(16).await?.try_into().expect("16 bytes");
        let (opt, len) = parse_option_header(&hdr)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        if len > MAX_OPTION_LEN {
            if opt == OPT_EXPORT_NAME {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "option too long",
                ));
            }
            rd.skip(len as usize).await?;
            send_now(
                fd,
                option_reply(opt, REP_ERR_TOO_BIG, b"option data too long"),
            )
            .await?;
            continue;
        }
        let data = rd.take_buf(len as usize).await?;
        if inner.stopping.load(Ordering::SeqCst) {
            send_now(
                fd,
                option_reply(opt, REP_ERR_SHUTDOWN, b"server shutting down"),
            )
            .await?;
            return Ok(None);
        }
        let reply = |t: u32, d: &[u8]| option_reply(opt, t, d);
        let invalid = |msg: &str| option_reply(opt, REP_ERR_INVALID, msg.as_bytes());
        match opt {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                if !name_ok(inner, &name) {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("unknown export '{name}'"),
                    ));
                }
                let flags = transmission_flags(inner, structured);
                send_now(fd, export_name_reply(size, flags, no_zeroes)).await?;
                return Ok(Some(Session { structured, meta }));
            }
            OPT_ABORT => {
                let _ = send_now(fd, reply(REP_ACK, &[])).await;
                return Ok(None);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_now(fd, invalid("NBD_OPT_LIST takes no data")).await?;
                    continue;
                }
                let mut v = reply(
                    REP_SERVER,
                    &rep_server(&inner.cfg.export, &inner.cfg.description),
                );
                v.extend(reply(REP_ACK, &[]));
                send_now(fd, v).await?;
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send_now(fd, invalid("NBD_OPT_STRUCTURED_REPLY takes no data")).await?;
                    continue;
                }
                structured = true;
                send_now(fd, reply(REP_ACK, &[])).await?;
            }
            OPT_INFO | OPT_GO => {
                let go = match parse_go(&data) {
                    Ok(g) => g,
                    Err(e) => {
                        send_now(fd, invalid(&e.to_string())).await?;
                        continue;
                    }
                };
                if !name_ok(inner, &go.name) {
                    let msg = format!("no export named '{}'", go.name);
                    send_now(fd, reply(REP_ERR_UNKNOWN, msg.as_bytes())).await?;
                    continue;
                }
                let flags = transmission_flags(inner, structured);
                let mut v = reply(REP_INFO, &info_export(size, flags));
                let (min, pref, max) = block_sizes(&inner.array);
                v.extend(reply(REP_INFO, &info_block_size(min, pref, max)));
                if go.info.contains(&INFO_NAME) {
                    v.extend(reply(REP_INFO, &info_string(INFO_NAME, &inner.cfg.export)));
                }
                if go.info.contains(&INFO_DESCRIPTION) {
                    v.extend(reply(
                        REP_INFO,
                        &info_string(INFO_DESCRIPTION, &inner.cfg.description),
                    ));
                }
                v.extend(reply(REP_ACK, &[]));
                send_now(fd, v).await?;
                if opt == OPT_GO {
                    return Ok(Some(Session { structured, meta }));
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if !structured {
                    send_now(fd, invalid("negotiate structured replies first")).await?;
                    continue;
                }
                let m = match parse_meta(&data) {
                    Ok(m) => m,
                    Err(e) => {
                        send_now(fd, invalid(&e.to_string())).await?;
                        continue;
                    }
                };
                if !name_ok(inner, &m.name) {
                    let msg = format!("no export named '{}'", m.name);
                    send_now(fd, reply(REP_ERR_UNKNOWN, msg.as_bytes())).await?;
                    continue;
                }
                let listing = opt == OPT_LIST_META_CONTEXT;
                let matches = if listing && m.queries.is_empty() {
                    true
                } else {
                    m.queries
                        .iter()
                        .any(|q| q == BASE_ALLOCATION || (listing && q == "base:"))
                };
                if !listing {
                    meta = matches;
                }
                let mut v = Vec::new();
                if matches {
                    let id = if listing { 0 } else { META_ID };
                    v.extend(reply(
                        REP_META_CONTEXT,
                        &rep_meta_context(id, BASE_ALLOCATION),
                    ));
                }
                v.extend(reply(REP_ACK, &[]));
                send_now(fd, v).await?;
            }
            OPT_STARTTLS => {
                send_now(
                    fd,
                    reply(REP_ERR_UNSUP, b"TLS is not supported by this server"),
                )
                .await?;
            }
            _ => {
                let msg = format!("option {opt} is not supported");
                send_now(fd, reply(REP_ERR_UNSUP, msg.as_bytes())).await?;
            }
        }
    }
}

// ---------------------------------------------------------------- transmission

async fn connection<D: BlockDev>(inner: Arc<Inner<D>>, fd: RawFd) -> io::Result<()> {
    let mut rd = Reader::new(fd);
    let Some(sess) = handshake(&inner, &mut rd).await? else {
        return Ok(());
    };
    let sess = Rc::new(sess);
    let conn = Rc::new(Conn::new(fd, inner.stats.clone()));
    let r = transmission(&inner, &sess, &conn, &mut rd).await;
    // Finish what was read: every request answered, every reply sent.
    conn.wait_until(|c| c.inflight.get() == 0 && !c.sending.get())
        .await;
    r
}

async fn transmission<D: BlockDev>(
    inner: &Arc<Inner<D>>,
    sess: &Rc<Session>,
    conn: &Rc<Conn>,
    rd: &mut Reader,
) -> io::Result<()> {
    let broken = || io::Error::new(io::ErrorKind::BrokenPipe, "send failed");
    let (budget, max_queue) = (inner.cfg.max_payload_in_flight, inner.cfg.max_reply_queue);
    loop {
        // Take no new request while too many are in flight or their replies pile up unsent.
        conn.wait_until(|c| {
            c.broken.get() || (c.inflight.get() < MAX_INFLIGHT && c.queued.get() <= max_queue)
        })
        .await;
        if conn.broken.get() {
            return Err(broken());
        }
        let req = match proto::parse_request(rd.exact(proto::REQUEST_LEN).await?) {
            Ok(r) => r,
            Err(e) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
        };
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        // Payload this request holds while in flight; it starts (and a write's data is read
        // off the socket) only once that fits the connection's budget.
        let cost = match req.typ {
            proto::CMD_WRITE | proto::CMD_READ if req.length <= MAX_PAYLOAD => req.length as usize,
            _ => 0,
        };
        if cost > 0 {
            conn.wait_until(|c| {
                c.broken.get() || c.payload.get() == 0 || c.payload.get() + cost <= budget
            })
            .await;
            if conn.broken.get() {
                return Err(broken());
            }
            conn.add_payload(cost);
        }
        let release = move |conn: &Conn| {
            conn.payload.set(conn.payload.get() - cost);
            conn.wake();
        };
        let payload = if req.typ == proto::CMD_WRITE {
            if req.length > MAX_PAYLOAD {
                // Drain it in bounded pieces and refuse.
                rd.skip(req.length as usize).await?;
                if let Some(i) = op_index(req.typ) {
                    inner.stats.ops[i]
                        .local()
                        .count
                        .fetch_add(1, Ordering::Relaxed);
                }
                reply_error(
                    inner,
                    sess,
                    conn,
                    &req,
                    Errno::Inval,
                    "write exceeds 32 MiB",
                );
                continue;
            }
            match rd.take_buf(req.length as usize).await {
                Ok(v) => Some(v),
                Err(e) => {
                    release(conn);
                    return Err(e);
                }
            }
        } else {
            None
        };
        if req.typ == proto::CMD_DISC {
            return Ok(());
        }
        conn.inflight.set(conn.inflight.get() + 1);
        let (inner, sess, conn) = (inner.clone(), sess.clone(), conn.clone());
        reactor::spawn_local(async move {
            let (t0, typ, len) = (Instant::now(), req.typ, req.length);
            let ok = handle(&inner, &sess, &conn, req, payload).await;
            if let Some(i) = op_index(typ) {
                // Error replies were counted by reply_error; bytes only for served requests.
                let c = inner.stats.ops[i].local();
                shard::add(&c.count, 1);
                if ok {
                    shard::add(&c.bytes, len as u64);
                }
                c.observe(t0.elapsed());
            }
            conn.inflight.set(conn.inflight.get() - 1);
            release(&conn);
        });
    }
}

fn errno_of(e: &ArrayError) -> Errno {
    match e {
        ArrayError::OutOfRange { .. } | ArrayError::Misaligned { .. } => Errno::Inval,
        ArrayError::Failed { .. } | ArrayError::Unreadable { .. } | ArrayError::Refused(_) => {
            Errno::Io
        }
        ArrayError::Shutdown => Errno::Shutdown,
    }
}

/// Error reply: structured for commands that negotiated it (READ, BLOCK_STATUS), else simple.
fn reply_error<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: &Request,
    err: Errno,
    msg: &str,
) {
    inner.stats.errors.fetch_add(1, Ordering::Relaxed);
    if let Some(i) = op_index(req.typ) {
        inner.stats.ops[i]
            .local()
            .errors
            .fetch_add(1, Ordering::Relaxed);
    }
    tracing::debug!(
        "request type {} at {} len {}: {:?} ({msg})",
        req.typ,
        req.offset,
        req.length,
        err
    );
    let structured =
        sess.structured && matches!(req.typ, proto::CMD_READ | proto::CMD_BLOCK_STATUS);
    if structured {
        conn.send(vec![OutPart::Bytes(proto::error_chunk(
            req.handle, err, msg,
        ))]);
    } else {
        conn.send(vec![OutPart::Bytes(
            proto::simple_reply(err as u32, req.handle).to_vec(),
        )]);
    }
}

fn reply_ok(conn: &Rc<Conn>, req: &Request) {
    conn.send(vec![OutPart::Bytes(
        proto::simple_reply(0, req.handle).to_vec(),
    )]);
}

async fn handle<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: Request,
    payload: Option<IoBuf>,
) -> bool {
    use proto::*;
    let array = &inner.array;
    let size = array.size();
    let (off, len) = (req.offset, req.length as u64);
    let end = off.checked_add(len);
    let in_range = end.is_some_and(|e| e <= size);
    let aligned = off.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR);
    let allowed = match req.typ {
        CMD_READ => CMD_FLAG_FUA | if sess.structured { CMD_FLAG_DF } else { 0 },
        CMD_WRITE | CMD_TRIM | CMD_FLUSH | CMD_CACHE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        _ => 0,
    };
    let err = |e: Errno, m: &str| {
        reply_error(inner, sess, conn, &req, e, m);
        false
    };
    if !matches!(
        req.typ,
        CMD_READ
            | CMD_WRITE
            | CMD_FLUSH
            | CMD_TRIM
            | CMD_CACHE
            | CMD_WRITE_ZEROES
            | CMD_BLOCK_STATUS
    ) {
        return err(Errno::Inval, "unknown command");
    }
    if req.flags & !allowed != 0 {
        return err(Errno::Inval, "command flag not valid for this command");
    }
    let writes = matches!(req.typ, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && inner.cfg.read_only {
        return err(Errno::Perm, "export is read-only");
    }
    if req.typ != CMD_FLUSH && !in_range {
        let e = if matches!(req.typ, CMD_WRITE | CMD_WRITE_ZEROES) {
            Errno::NoSpc
        } else {
            Errno::Inval
        };
        return err(e, "request beyond the end of the export");
    }
    if req.typ == CMD_FLUSH && (off != 0 || len != 0) {
        return err(Errno::Inval, "flush with nonzero offset or length");
    }
    if matches!(
        req.typ,
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE
    ) && !aligned
    {
        return err(
            Errno::Inval,
            "request not aligned to the 512-byte minimum block size",
        );
    }
    let fua = req.flags & CMD_FLAG_FUA != 0 && writes;
    let result: Result<(), ArrayError> = match req.typ {
        CMD_READ => {
            if req.length > MAX_PAYLOAD {
                // Larger than the advertised maximum block size: EINVAL. The spec reserves
                // EOVERFLOW for a DF read (structured replies) too large for one chunk.
                return if req.flags & CMD_FLAG_DF != 0 {
                    err(
                        Errno::Overflow,
                        "read exceeds 32 MiB and cannot be sent unfragmented",
                    )
                } else {
                    err(Errno::Inval, "read exceeds the 32 MiB maximum block size")
                };
            }
            return read(inner, sess, conn, &req).await;
        }
        CMD_WRITE => {
            let data = payload.unwrap_or_else(|| buf::alloc(0));
            array.write(off, data).await
        }
        CMD_FLUSH => array.flush().await,
        CMD_TRIM => array.trim(off, len).await,
        CMD_WRITE_ZEROES => {
            let fast = req.flags & CMD_FLAG_FAST_ZERO != 0;
            let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
            if fast && (no_hole || !array.zero_is_fast(off, len).unwrap_or(false)) {
                return err(
                    Errno::NotSup,
                    "zeroing this range is not faster than writing",
                );
            }
            if no_hole {
                array.write_zeros(off, len).await
            } else {
                array.trim(off, len).await
            }
        }
        CMD_CACHE => Ok(()),
        CMD_BLOCK_STATUS => {
            if !sess.meta {
                return err(Errno::Inval, "no metadata context was negotiated");
            }
            if len == 0 {
                return err(Errno::Inval, "zero-length block status");
            }
            let runs = match array.allocation(off, len) {
                Ok(r) => r,
                Err(e) => return err(errno_of(&e), &e.to_string()),
            };
            let limit = if req.flags & CMD_FLAG_REQ_ONE != 0 {
                1
            } else {
                1 << 20
            };
            let ext: Vec<(u32, u32)> = runs
                .iter()
                .take(limit)
                .map(|r| {
                    let flags = if r.allocated {
                        0
                    } else {
                        STATE_HOLE | STATE_ZERO
                    };
                    (r.len as u32, flags)
                })
                .collect();
            conn.send(vec![OutPart::Bytes(block_status(
                REPLY_FLAG_DONE,
                req.handle,
                META_ID,
                &ext,
            ))]);
            return true;
        }
        _ => return err(Errno::Inval, "unknown command"),
    };
    let result = match result {
        Ok(()) if fua => array.flush().await,
        r => r,
    };
    match result {
        Ok(()) => {
            reply_ok(conn, &req);
            true
        }
        Err(e) => err(errno_of(&e), &e.to_string()),
    }
}

/// Answers a READ; false if it got an error reply.
async fn read<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: &Request,
) -> bool {
    use proto::*;
    let array = &inner.array;
    let (off, len) = (req.offset, req.length as u64);
    if !sess.structured {
        return match array.read(off, len).await {
            Ok(seg) => {
                let mut parts = Vec::with_capacity(seg.parts.len() + 1);
                parts.push(OutPart::Bytes(simple_reply(0, req.handle).to_vec()));
                parts.extend(seg.parts.into_iter().map(|(b, r)| OutPart::Shared(b, r)));
                conn.send(parts);
                true
            }
            Err(e) => {
                reply_error(inner, sess, conn, req, errno_of(&e), &e.to_string());
                false
            }
        };
    }
    if len == 0 {
        conn.send(vec![OutPart::Bytes(done_chunk(req.handle).to_vec())]);
        return true;
    }
    let df = req.flags & CMD_FLAG_DF != 0;
    let pieces = if df {
        array
            .read(off, len)
            .await
            .map(|data| vec![ReadPiece::Data { off, data }])
    } else {
        array.read_sparse(off, len).await
    };
    let pieces = match pieces {
        Ok(p) => p,
        Err(e) => {
            reply_error(inner, sess, conn, req, errno_of(&e), &e.to_string());
            return false;
        }
    };
    let n = pieces.len();
    let mut parts = Vec::new();
    for (i, p) in pieces.into_iter().enumerate() {
        let flags = if i + 1 == n { REPLY_FLAG_DONE } else { 0 };
        match p {
            ReadPiece::Data { off, data } => {
                parts.push(OutPart::Bytes(offset_data_header(
                    flags,
                    req.handle,
                    off,
                    data.len() as u32,
                )));
                parts.extend(data.parts.into_iter().map(|(b, r)| OutPart::Shared(b, r)));
            }
            ReadPiece::Hole { off, len } => {
                parts.push(OutPart::Bytes(offset_hole(
                    flags, req.handle, off, len as u32,
                )));
            }
        }
    }
    conn.send(parts);
    true
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
