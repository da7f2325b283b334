//! `uraid serve`: assemble an array (degraded if it must) and export it over NBD until
//! SIGINT, SIGTERM or SIGHUP, then finish in-flight requests, flush and mark the array clean.

use crate::control;
use crate::events::Events;
use crate::size;
use anyhow::{bail, Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use uraid_engine::supervisor::ResyncStart;
use uraid_engine::{
    assemble, Access, ArrayOptions, ErrorPolicy, FileDev, Priority, Runtime, Supervisor, Throttle,
};
use uraid_nbd::tls::{Mode, Tls};
use uraid_nbd::{Config, Server};

/// `println!` that never panics: stdout may be a pipe whose reader went away (`uraid serve
/// | head`, a closed log reader); a panic there would leave the server half stopped
/// (`main` also makes any panic in `serve` end the process).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `eprintln!` that never panics (as `say!`, for stderr).
macro_rules! esay {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

pub const DEFAULT_LISTEN: &str = "tcp:127.0.0.1:10809";

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// Where to listen: tcp:HOST:PORT or unix:PATH; repeat for several. Default
    /// tcp:127.0.0.1:10809 (plus unix:uraid-data/uraid.sock for the embedded default).
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Export name clients ask for (the empty default name also works). Default: the
    /// array's name.
    #[arg(long)]
    pub export: Option<String>,
    /// Refuse writes (NBD_FLAG_READ_ONLY; writes get EPERM) and open the members read-only
    /// (read-write only for one superblock update if the array was not stopped cleanly).
    #[arg(long)]
    pub read_only: bool,
    /// TLS (NBD STARTTLS; nbdkit's meanings): off refuses it; on lets each client choose;
    /// require serves only clients that switch to TLS first. Default: on when
    /// --tls-certificates or --tls-psk is given, else off.
    #[arg(long, value_name = "MODE", value_parser = ["off", "on", "require"])]
    pub tls: Option<String>,
    /// Directory with server-cert.pem and server-key.pem (and ca-cert.pem, optionally
    /// ca-crl.pem, for --tls-verify-peer): the names nbdkit and qemu use.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys instead of certificates: a psktool file of identity:hexkey lines.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Require a client certificate signed by the directory's ca-cert.pem (and not revoked
    /// in ca-crl.pem).
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Clients let in, whatever --deny says (nbdkit's ip filter): comma-separated
    /// addresses, ADDRESS/BITS, all, anyipv4, anyipv6, anyunix, uid:N, gid:N, pid:N.
    #[arg(long, value_name = "LIST")]
    pub allow: Vec<String>,
    /// Clients refused unless --allow lets them in (same entries); checked before any byte
    /// is read. E.g. --allow 10.0.0.0/8 --deny all.
    #[arg(long, value_name = "LIST")]
    pub deny: Vec<String>,
    /// Seconds a client may take from connecting to choosing the export (options, STARTTLS
    /// and the TLS handshake) before it is cut off.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub handshake_timeout: f64,
    /// Connections that may be in the handshake at once; more are closed unserved.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_handshakes: u64,
    /// Reactor threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Busy-poll: a reactor with nothing to do spins this many microseconds for the next
    /// completion before it sleeps, while requests keep arriving within a few of them (queue
    /// depth 1 saves a wake-up per request), and not after a wait that only the pieces of a
    /// large write payload ended. 0 turns it off.
    #[arg(long, value_name = "USECS", default_value_t = 50)]
    pub busy_poll: u64,
    /// Write merging: a partial-stripe write of a sequential stream with enough requests in
    /// flight waits at most this many microseconds for the rest of its stripe, so the stripe
    /// is written whole instead of by read-modify-write (FUA writes and FLUSH never wait).
    /// 0 turns it off.
    #[arg(long, value_name = "USECS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub merge_wait: u64,
    /// Read-ahead: sequential read streams (also reordered, or spread over several
    /// connections) are detected as requests arrive, and whole stripes are read ahead of them
    /// into a cache of at most --read-ahead-memory. auto: on unless every member is memory
    /// (tmpfs), where there is no latency to hide; on: always; off: never.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub read_ahead: String,
    /// Memory for read-ahead's cache (K, M, G suffixes); data read ahead and not yet read
    /// never takes more.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = crate::size::parse)]
    pub read_ahead_memory: u64,
    /// Fail a member whose I/O has had no completion for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub io_timeout: f64,
    /// Safe mode (md's safe_mode_delay): once no write has been in flight for this many
    /// seconds, make everything durable and record the array clean in the superblocks, so
    /// a crash while idle needs no resync; the next write marks it dirty again first.
    /// 0 turns it off (clean only at a clean stop).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub safe_mode_delay: f64,
    /// Fail-slow members: a member whose mean I/O latency stays above this many times the
    /// median of the members for 3 s in a row (and above 200 µs) is reported slow, and reads
    /// of its chunks are served by reconstruction from the others while the level has
    /// redundancy to spare (it is still written). 0 turns it off.
    #[arg(long, value_name = "FACTOR", default_value_t = uraid_engine::slow::DEFAULT_FACTOR)]
    pub slow_factor: f64,
    /// TRIM and WRITE_ZEROES that cover whole allocation granules reach the members as
    /// discards (a hole punched in a member file, BLKDISCARD on a block device), so files
    /// give their space back and SSDs learn what is free. off keeps the bytes (the range
    /// still reads as zeros: the allocation map says so).
    #[arg(long, value_name = "MODE", default_value = "on", value_parser = ["on", "off"])]
    pub discard: String,
    /// Media (read) errors a member may have, decaying by half per hour, before the next one
    /// fails it; each one is reconstructed from the stripe and rewritten in place.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub max_read_errors: u32,
    /// Start even if members are stale or marked failed, taking the freshest of them as
    /// needed (mdadm --assemble --force). Their data may be out of date; logged.
    #[arg(long)]
    pub force: bool,
    /// Start although members the array has in service are not among the devices given
    /// (or were refused): degraded, and once it writes they are recorded failed and need a
    /// rebuild. Refused otherwise, naming each one (mdadm --run).
    #[arg(long)]
    pub run: bool,
    /// Start a parity array that was not stopped cleanly although members are missing or
    /// failed (refused otherwise: stripes being written at the stop may rebuild wrong data
    /// for the missing members). md's start_dirty_degraded.
    #[arg(long)]
    pub start_dirty_degraded: bool,
    /// Background work (resync, rebuild, scrub) in flight while clients are active: stripes
    /// at a time, each reading one chunk of the members it needs, then a pause set by
    /// --priority (OpenZFS's rule: about one background I/O per member; full speed when
    /// clients are idle). 0: md's --resync-min rate instead. `uraid throttle` changes it
    /// while serving.
    #[arg(long, value_name = "STRIPES", default_value_t = 1)]
    pub background_budget: usize,
    /// How much of the time background work holds its budget while clients are active:
    /// low (a third: pauses twice each round's time), normal (two thirds), high (always).
    #[arg(long, value_name = "PRIORITY", default_value = "normal",
          value_parser = ["low", "normal", "high"])]
    pub priority: String,
    /// Resync, rebuild and scrub rate while clients are active, MB/s of member I/O (md's
    /// sync_speed_min), with --background-budget 0.
    #[arg(long, value_name = "MB/S", default_value = "50", value_parser = crate::size::parse_rate_mb)]
    pub resync_min: u64,
    /// Resync rate while clients are idle, MB/s (or a size per second: 500M, 2G); 0:
    /// unlimited (md's sync_speed_max).
    #[arg(long, value_name = "MB/S", default_value = "0", value_parser = crate::size::parse_rate_mb)]
    pub resync_max: u64,
    /// Write-back journal: memory held for acknowledged writes on their way to the members
    /// (data and parity). At this bound new writes wait for the members, as in write-through
    /// mode, until the slow members catch up.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = size::parse)]
    pub write_back_memory: u64,
    /// Control socket (HTTP/JSON, `uraid status`, `uraid watch`, curl): unix:PATH or none.
    /// Default: unix:/run/uraid/NAME.sock, or unix:uraid-data/control.sock for the
    /// embedded default volume.
    #[arg(long, value_name = "unix:PATH|none")]
    pub control: Option<String>,
    /// Also serve Prometheus metrics (GET /metrics only) on TCP, e.g. tcp:127.0.0.1:9469.
    /// Use a loopback address unless the network is trusted: the metrics carry device paths.
    #[arg(long, value_name = "tcp:HOST:PORT")]
    pub metrics: Option<String>,
    /// Log format on stderr: human or json (one JSON object per line).
    #[arg(long, value_name = "FORMAT", default_value = "human", value_parser = ["human", "json"])]
    pub log_format: String,
    #[command(flatten)]
    pub scan: crate::cmd::ScanArgs,
    /// The config file for `uraid serve NAME` (NAME a section of it: that array, with the
    /// options the file gives; options given here win). Default /etc/uraid/uraid.conf.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Member devices or files. None: the embedded default volume under ./uraid-data.
    pub members: Vec<PathBuf>,
}

enum Listen {
    Tcp(TcpListener, String),
    Unix(UnixListener, PathBuf),
}

fn bind(addr: &str) -> Result<Listen> {
    if let Some(hp) = addr.strip_prefix("tcp:") {
        let l = TcpListener::bind(hp).with_context(|| format!("--listen {addr}: cannot bind"))?;
        let local = l.local_addr()?.to_string();
        Ok(Listen::Tcp(l, local))
    } else if let Some(p) = addr.strip_prefix("unix:") {
        let path = PathBuf::from(p);
        // A socket left by a previous run is replaced; a live server's socket, or a file
        // that is not a socket, is not.
        control::remove_stale_socket(&path, &format!("--listen {addr}:"))?;
        let l =
            UnixListener::bind(&path).with_context(|| format!("--listen {addr}: cannot bind"))?;
        Ok(Listen::Unix(l, path))
    } else {
        bail!("--listen {addr}: expected tcp:HOST:PORT or unix:PATH")
    }
}

/// An assembly warning: a plain `uraid: warning:` line on stderr (a JSON line with
/// `--log-format json`), and an event in the ring either way.
fn warn(args: &ServeArgs, events: &Events, msg: String) {
    if args.log_format == "json" {
        // Through tracing: the JSON layer prints it and the ring layer keeps it.
        tracing::warn!(target: "uraid::assemble", "{msg}");
    } else {
        esay!("uraid: warning: {msg}");
        events.push(tracing::Level::WARN, "uraid::assemble", msg);
    }
}

/// The NBD URI of a listener (`nbds` when TLS is required).
fn uri(l: &Listen, export: &str, tls: Mode) -> String {
    let s = if tls == Mode::Require { "s" } else { "" };
    match l {
        Listen::Tcp(_, a) => format!("nbd{s}://{a}/{export}"),
        Listen::Unix(_, p) => {
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            format!("nbd{s}+unix:///{export}?socket={}", abs.display())
        }
    }
}

/// `--tls` and the credentials it needs, loaded (before anything is opened: a bad file
/// starts nothing).
fn tls_settings(args: &ServeArgs) -> Result<(Mode, Option<Arc<Tls>>)> {
    let have_creds = args.tls_certificates.is_some() || args.tls_psk.is_some();
    let mode = match args.tls.as_deref() {
        Some(m) => m.parse::<Mode>().map_err(|e| anyhow::anyhow!("{e}"))?,
        None if have_creds => Mode::On,
        None => Mode::Off,
    };
    if args.tls_verify_peer && (args.tls_certificates.is_none() || args.tls_psk.is_some()) {
        bail!(
            "--tls-verify-peer checks client certificates: give --tls-certificates DIR (and \
             not --tls-psk, which overrides certificates)"
        );
    }
    if mode == Mode::Off {
        return Ok((mode, None));
    }
    if !have_creds {
        bail!("--tls {mode} needs --tls-certificates DIR or --tls-psk FILE");
    }
    let settings = uraid_nbd::tls::Settings {
        certificates: args.tls_certificates.clone(),
        psk: args.tls_psk.clone(),
        verify_peer: args.tls_verify_peer,
    };
    let t = Tls::new(settings).map_err(|e| anyhow::anyhow!("--tls: {e}"))?;
    Ok((mode, Some(Arc::new(t))))
}

pub fn run(args: &ServeArgs, members: &[PathBuf], embedded: bool, events: Events) -> Result<()> {
    let started = Instant::now();
    let plan = checked_plan(args, members, &events)?;
    let g = plan.sb.geometry;
    let missing = plan.missing();
    // The control spec and the metrics port are checked before anything is opened.
    let explicit_control = args.control.is_some();
    let control_path = control_socket_path(args, &events, &plan, embedded)?;
    let (tls_mode, tls) = tls_settings(args)?;
    let access = uraid_nbd::access::Access::parse(&args.allow, &args.deny)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !(args.handshake_timeout > 0.0 && args.handshake_timeout <= 3600.0) {
        bail!(
            "--handshake-timeout {}: must be a number of seconds above 0 and at most 3600",
            args.handshake_timeout
        );
    }
    let metrics_listener = args
        .metrics
        .as_deref()
        .map(control::bind_metrics)
        .transpose()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // Register the signals before any thread starts, so none of them takes the default action.
    // SIGHUP (the terminal or session went away) stops the server cleanly too: its default
    // action would kill the process with the array still marked dirty.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing signal handlers")?;
    let rt = Runtime::new(threads, 1024, true).context("starting reactors")?;
    if !rt.uses_uring() {
        bail!("uraid serve needs io_uring (kernel 5.19 or later, not blocked by seccomp)");
    }
    rt.handle()
        .set_busy_poll(std::time::Duration::from_micros(args.busy_poll));
    let opts = ArrayOptions {
        policy: ErrorPolicy {
            max_read_errors: args.max_read_errors,
            io_timeout: Some(Duration::from_secs_f64(args.io_timeout)),
        },
        frozen_metadata: false,
        no_discard: args.discard == "off",
        merge_wait: Duration::from_micros(args.merge_wait),
        read_ahead: if args.read_ahead == "off" {
            0
        } else {
            args.read_ahead_memory
        },
        read_ahead_always: args.read_ahead == "on",
    };
    // Members first: a member another process holds is refused before any socket is bound.
    // Read-only: opened read-only, and nothing is ever written (superblocks frozen: a
    // failure stays in memory; no read repair), unless the array was not stopped cleanly:
    // then one superblock round, before the first read, records which members serve while
    // it is out of sync, and the members are opened read-write for it.
    let read_only_opens = args.read_only && plan.sb.clean;
    if args.read_only && !plan.sb.clean {
        say!(
            "uraid: '{}' was not stopped cleanly: --read-only opens the members read-write for \
             the one superblock update that records which members serve while it is out of \
             sync (and journal replay, failures, read repair)",
            plan.sb.name
        );
    }
    let array = if read_only_opens {
        let opts = ArrayOptions {
            frozen_metadata: true,
            ..opts
        };
        assemble::open_volume_with(&plan, Some(rt.handle()), opts, Access::ReadOnly)?
    } else {
        assemble::open_volume(&plan, Some(rt.handle()), opts)?
    };
    array.array().set_deferred_limit(args.write_back_memory);
    // Then the control socket, before any NBD socket: nothing has been served if it fails.
    // The default one is optional (a non-root user cannot create /run/uraid): without it the
    // server runs and says so. One a live server answers on is refused (checked before the
    // members were opened, `control_socket_path`, and again here: two servers of the same
    // name started together both pass the first check).
    let control_listener = match control_path {
        None => None,
        Some(p) => match control::bind_unix(&p) {
            Ok(l) => Some((l, p)),
            Err(_) if !explicit_control && control::is_live(&p) => {
                return Err(control_taken(&p, &plan.sb.name))
            }
            Err(e) if !explicit_control => {
                warn(
                    args,
                    &events,
                    format!("no control socket: {e:#} (pass --control unix:PATH)"),
                );
                None
            }
            Err(e) => return Err(e),
        },
    };
    let mut addrs = args.listen.clone();
    if addrs.is_empty() {
        addrs.push(DEFAULT_LISTEN.to_string());
        if embedded {
            addrs.push(format!("unix:{}/uraid.sock", crate::DEFAULT_DIR));
        }
    }
    let listeners = addrs.iter().map(|a| bind(a)).collect::<Result<Vec<_>>>()?;
    let export = args.export.clone().unwrap_or_else(|| plan.sb.name.clone());
    let description = format!(
        "uraid {} on {} members, chunk {}, {}",
        g.level,
        g.members,
        size::human(g.chunk),
        if missing.is_empty() {
            "optimal"
        } else {
            "degraded"
        }
    );
    let server = Arc::new(Server::new(
        array.clone(),
        rt.handle(),
        Config {
            export: export.clone(),
            description,
            read_only: args.read_only,
            tls_mode,
            tls: tls.clone(),
            access,
            handshake_timeout: Duration::from_secs_f64(args.handshake_timeout),
            max_handshakes: args.max_handshakes as usize,
            ..Config::default()
        },
    ));
    array.array().set_slow_factor(args.slow_factor);
    array.array().set_throttle(Throttle {
        budget: args.background_budget,
        min_bytes_per_second: args.resync_min.saturating_mul(1 << 20),
        max_bytes_per_second: args.resync_max.saturating_mul(1 << 20),
        priority: Priority::parse(&args.priority).unwrap_or(Priority::Normal),
    });
    let sup = Arc::new(Supervisor::new(array.clone(), args.read_only));
    // Recorded replaces resume before any client can write (a write's round would clear a
    // record whose replacement is not attached yet, and the copy would start over).
    resume_replaces(args, &events, &plan, &sup);
    for l in &listeners {
        match l {
            Listen::Tcp(t, _) => server.listen(t.as_raw_fd(), true),
            Listen::Unix(u, _) => server.listen(u.as_raw_fd(), false),
        }
    }
    say!(
        "uraid: serving '{}' ({} {} members, {} = {} bytes{}) as export '{export}'",
        plan.sb.name,
        g.level,
        g.members,
        size::human(g.volume_size()),
        g.volume_size(),
        if args.read_only { ", read-only" } else { "" }
    );
    for l in &listeners {
        say!("uraid: listening on {}", uri(l, &export, tls_mode));
    }
    if let Some(t) = &tls {
        say!("uraid: TLS {tls_mode}: {}", t.describe());
    }
    if let Some(t) = crate::copies::current() {
        say!("uraid: copies: GLIBC_TUNABLES sets {t}");
    }
    match (array.read_ahead_stats(), args.read_ahead.as_str()) {
        (Some(r), _) => say!(
            "uraid: read-ahead on, {} of memory",
            crate::size::human(r.budget)
        ),
        (None, "auto") => say!(
            "uraid: read-ahead off: every member is memory (tmpfs), with no latency to hide \
             (--read-ahead on forces it)"
        ),
        (None, _) => {}
    }
    let state = Arc::new(control::State {
        jobs: Arc::new(crate::jobs::Jobs::new(sup.clone())),
        volume: array.clone(),
        server: server.clone(),
        members: plan.slots.clone(),
        listen: listeners
            .iter()
            .map(|l| uri(l, &export, tls_mode))
            .collect(),
        events: events.clone(),
        started,
    });
    start_spares_and_rebuild(args, &events, &plan, &sup);
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
    // From here an error return stops the supervisor's threads first (a walk must not run
    // on while the process exits).
    let notify_state = state.clone();
    let mut ctl = match control::Control::start(state, control_listener, metrics_listener) {
        Ok(c) => c,
        Err(e) => {
            sup.stop();
            return Err(e);
        }
    };
    if let Some(p) = ctl.path() {
        say!(
            "uraid: control socket at {} (uraid status, uraid watch, curl --unix-socket)",
            p.display()
        );
    }
    if let Some(a) = metrics_addr {
        say!("uraid: Prometheus metrics at http://{a}/metrics");
    }
    tracing::info!(
        target: "uraid::serve",
        "serving array '{}' ({} {} members) as export '{export}'",
        plan.sb.name,
        g.level,
        g.members
    );
    if let Err(e) = start_resync_and_daemon(args, &events, &plan.sb.name, &sup) {
        ctl.stop();
        sup.stop();
        return Err(e);
    }
    say!("uraid: stop with Ctrl-C, SIGTERM or SIGHUP");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let notifier = crate::notify::Notifier::from_env().map(Arc::new);
    let notify_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(n) = &notifier {
        notify_status(n.clone(), notify_state, notify_stop.clone());
    }
    let sig = signals.forever().next().unwrap_or(SIGTERM);
    notify_stop.store(true, Ordering::Release);
    if let Some(n) = &notifier {
        n.send("STOPPING=1\nSTATUS=stopping: finishing in-flight requests");
    }
    let name = match sig {
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        _ => "SIGTERM",
    };
    esay!("uraid: {name} received: finishing in-flight requests");
    tracing::info!(target: "uraid::serve", "{name} received: stopping");
    stop_deadline(args.io_timeout);
    ctl.stop();
    sup.stop();
    let r = server.shutdown();
    let st = server.stats();
    let (conns, reqs, errs) = (
        st.connections.load(Ordering::Relaxed),
        st.requests.load(Ordering::Relaxed),
        st.errors.load(Ordering::Relaxed),
    );
    for l in &listeners {
        if let Listen::Unix(_, p) = l {
            let _ = std::fs::remove_file(p);
        }
    }
    drop(listeners);
    let resync_due = array.array().needs_resync();
    r.context("flushing the array at shutdown")?;
    drop(server);
    drop(array);
    rt.shutdown();
    esay!(
        "uraid: stopped after {conns} connection(s), {reqs} request(s), {errs} error reply(ies); array flushed{}",
        if resync_due {
            " (resync unfinished: left marked not clean)"
        } else {
            " and marked clean"
        }
    );
    Ok(())
}

/// Tells the service manager the server is ready (READY=1, once every listener is up), then
/// keeps its STATUS= line current (state and background progress, checked every 2 s, sent
/// when it changes) until `stop`.
fn notify_status(
    n: Arc<crate::notify::Notifier>,
    state: Arc<control::State>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let first = crate::notify::status_text(&control::status_document(&state));
    n.send(&format!(
        "READY=1\nMAINPID={}\nSTATUS={first}",
        std::process::id()
    ));
    let spawned = std::thread::Builder::new()
        .name("uraid-notify".into())
        .spawn(move || {
            let mut last = first;
            while !stop.load(Ordering::Acquire) {
                for _ in 0..20 {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                let now = crate::notify::status_text(&control::status_document(&state));
                if now != last {
                    n.send(&format!("STATUS={now}"));
                    last = now;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(target: "uraid::serve", "no STATUS= updates (cannot start the thread: {e})");
    }
}

/// The longest a stop may take, for an I/O timeout of `io_timeout` seconds: a member that
/// hangs is failed after one timeout, a stop that meets a second one takes another.
fn stop_bound(io_timeout: f64) -> Duration {
    Duration::from_secs_f64(2.0 * io_timeout + 5.0)
}

/// Past `stop_bound` after the signal, the process exits (status 1) without finishing the
/// stop: member I/O still waits (a host stall beyond the level's tolerance, which fails no
/// member, or members that stop answering one after another). What it leaves is what a
/// crash leaves: the superblocks still say "not clean" and the next start resyncs (and
/// replays the journal); nothing acknowledged is lost (docs/invariants.md).
fn stop_deadline(io_timeout: f64) {
    let bound = stop_bound(io_timeout);
    let spawned = std::thread::Builder::new()
        .name("uraid-stop-deadline".into())
        .spawn(move || {
            std::thread::sleep(bound);
            tracing::error!(
                target: "uraid::serve",
                "the stop did not finish within {bound:?} (2 x --io-timeout + 5 s): member \
                 I/O is still waiting (a host stall?); exiting without marking the array \
                 clean: the next start resyncs, as after a crash"
            );
            esay!("uraid: stop timed out after {bound:?}: exiting without a clean stop");
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        tracing::warn!(target: "uraid::serve", "no stop deadline (cannot start its thread: {e})");
    }
}

/// The assembly plan for `members`, after the checks that refuse to start, with a warning
/// for each member refused and for a degraded or dirty start.
fn checked_plan(args: &ServeArgs, members: &[PathBuf], events: &Events) -> Result<assemble::Plan> {
    if !(args.io_timeout > 0.0 && args.io_timeout <= 86_400.0) {
        bail!(
            "--io-timeout {}: must be a number of seconds above 0 and at most 86400",
            args.io_timeout
        );
    }
    if !(args.slow_factor == 0.0 || (args.slow_factor >= 1.5 && args.slow_factor <= 1000.0)) {
        bail!(
            "--slow-factor {}: must be 0 (off) or from 1.5 to 1000",
            args.slow_factor
        );
    }
    if !(args.safe_mode_delay >= 0.0 && args.safe_mode_delay <= 86_400.0) {
        bail!(
            "--safe-mode-delay {}: must be a number of seconds from 0 to 86400",
            args.safe_mode_delay
        );
    }
    let plan = assemble::plan_within(
        members,
        args.force,
        Duration::from_secs_f64(args.io_timeout),
    )?;
    for r in &plan.refused {
        warn(args, events, r.to_string());
    }
    plan.can_start()?;
    plan.check_dirty_degraded(args.start_dirty_degraded)?;
    plan.check_complete(args.run)?;
    let g = plan.sb.geometry;
    if plan.check_dirty_degraded(false).is_err() {
        warn(
            args,
            events,
            format!(
                "array '{}' was not stopped cleanly and is degraded; started anyway \
                 (--start-dirty-degraded): stripes that were being written ({}) are not \
                 trusted: reads that would rebuild data there fail with EIO and are logged",
                plan.sb.name,
                match plan.dirty_ranges() {
                    Some(r) => assemble::describe_ranges(&r),
                    None => "anywhere: no write-intent bitmap".into(),
                }
            ),
        );
    }
    let missing = plan.missing();
    if !missing.is_empty() {
        let msg = format!(
            "array '{}' is degraded: member(s) {:?} missing or failed ({} of {} tolerated)",
            plan.sb.name,
            missing,
            missing.len(),
            g.fault_tolerance()
        );
        warn(args, events, msg);
    }
    Ok(plan)
}

/// The control socket's path: `--control`, or the default one (none if the array's name
/// cannot name one). Checked before anything is opened: a default one where another server
/// answers (an array of the same name) is refused, as this server could not be managed and
/// commands meant for it would reach the other one.
fn control_socket_path(
    args: &ServeArgs,
    events: &Events,
    plan: &assemble::Plan,
    embedded: bool,
) -> Result<Option<PathBuf>> {
    Ok(match &args.control {
        Some(spec) => control::parse_endpoint(spec)?,
        None => {
            let p = control::default_path(&plan.sb.name, embedded);
            if let Some(p) = p.as_ref().filter(|p| control::is_live(p)) {
                return Err(control_taken(p, &plan.sb.name));
            }
            if p.is_none() {
                warn(
                    args,
                    events,
                    format!(
                        "array name {:?} cannot name a control socket; none started (pass \
                         --control unix:PATH)",
                        plan.sb.name
                    ),
                );
            }
            p
        }
    })
}

/// The refusal of a default control socket another server answers on.
fn control_taken(p: &std::path::Path, name: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "control socket {}: another server is listening there (an array named {name:?} is \
         served already); give this one its own socket with --control unix:PATH, or serve it \
         without one with --control none",
        p.display()
    )
}

/// Replaces the superblocks record (interrupted by a crash or a stop): each whose
/// replacement was given resumes from its checkpoint; the others are dropped (the members
/// stay). Right after assembly, before the other background work starts.
fn resume_replaces(
    args: &ServeArgs,
    events: &Events,
    plan: &assemble::Plan,
    sup: &Arc<Supervisor<FileDev>>,
) {
    if plan.sb.replaces.iter().all(Option::is_none) {
        return;
    }
    let mut found = Vec::new();
    for (i, p, uuid) in &plan.replacements {
        match FileDev::open(p) {
            Ok(dev) => found.push((*i, dev, *uuid)),
            Err(e) => warn(
                args,
                events,
                format!("replacement {} of member {i}: {e}; not used", p.display()),
            ),
        }
    }
    for line in sup.resume_replaces(found) {
        say!("uraid: {line}");
    }
}

/// Hot spares given with the members (opened exclusively now, waiting for a failure), and
/// the rebuild of members added in place of failed ones, on its own thread
/// (recovery/rebuild.rs), resuming from each one's checkpoint.
fn start_spares_and_rebuild(
    args: &ServeArgs,
    events: &Events,
    plan: &assemble::Plan,
    sup: &Arc<Supervisor<FileDev>>,
) {
    // Hot spares given with the members: opened exclusively now, waiting for a failure.
    if !args.read_only {
        for (p, uuid) in &plan.spares {
            match FileDev::open(p) {
                Ok(dev) => {
                    sup.add_spare(dev, *uuid);
                    say!("uraid: {} is a hot spare", p.display());
                }
                Err(e) => warn(
                    args,
                    events,
                    format!("spare {}: {e}; not used", p.display()),
                ),
            }
        }
    }
    // Rebuild of members added in place of failed ones, on its own thread
    // (recovery/rebuild.rs), resuming from each one's checkpoint.
    if !sup.volume().array().rebuild_state().is_empty() {
        if args.read_only {
            warn(
                args,
                events,
                "members to rebuild: rebuild deferred while serving read-only".to_string(),
            );
        } else if sup.ensure_rebuild() {
            say!(
                "uraid: '{}': rebuilding member(s) {:?} in the background (uraid status shows \
                 progress)",
                plan.sb.name,
                sup.volume()
                    .array()
                    .rebuild_state()
                    .iter()
                    .map(|r| r.0)
                    .collect::<Vec<_>>()
            );
        }
    }
}

/// Resync after an unclean stop, and the write-intent bitmap daemon, each on its own thread
/// (the supervisor's).
fn start_resync_and_daemon(
    args: &ServeArgs,
    events: &Events,
    name: &str,
    sup: &Supervisor<FileDev>,
) -> Result<()> {
    // Resync after an unclean stop, in the background on its own thread (recovery/resync.rs).
    match sup.start_resync().context("starting the resync thread")? {
        ResyncStart::NotNeeded => {}
        ResyncStart::Started => say!(
            "uraid: '{name}' was not stopped cleanly: resyncing parity in the background \
             (uraid status shows progress)"
        ),
        ResyncStart::ReadOnly => warn(
            args,
            events,
            "not stopped cleanly: resync deferred while serving read-only".to_string(),
        ),
        ResyncStart::Degraded => warn(
            args,
            events,
            "no resync: it needs every member, and the array is degraded".to_string(),
        ),
    }
    // The metadata daemon: clears the bitmap bits of regions idle for a tick, checkpoints
    // the journal, and marks an idle array clean (safe mode).
    let safe_mode =
        (args.safe_mode_delay > 0.0).then(|| Duration::from_secs_f64(args.safe_mode_delay));
    sup.start_bitmap_daemon(safe_mode)
        .context("starting the bitmap thread")?;
    Ok(())
}
