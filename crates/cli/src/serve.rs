//! `uraid serve`: assemble an array (degraded if it must) and export it over NBD until
//! SIGINT, SIGTERM or SIGHUP, then finish in-flight requests, flush and mark the array clean.

use crate::size;
use anyhow::{bail, Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use uraid_engine::{assemble, ArrayOptions, ErrorPolicy, Runtime};
use uraid_nbd::{Config, Server};

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
    /// Refuse writes (NBD_FLAG_READ_ONLY; writes get EPERM).
    #[arg(long)]
    pub read_only: bool,
    /// Reactor threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Fail a member whose I/O has had no completion for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub io_timeout: f64,
    /// Media (read) errors a member may have, decaying by half per hour, before the next one
    /// fails it; each one is reconstructed from the stripe and rewritten in place.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub max_read_errors: u32,
    /// Start even if members are stale or marked failed, taking the freshest of them as
    /// needed (mdadm --assemble --force). Their data may be out of date; logged.
    #[arg(long)]
    pub force: bool,
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
        if path.exists() {
            // A socket left by a previous run is replaced; a live server there is not.
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                bail!("--listen {addr}: another server is listening on {p}");
            }
            std::fs::remove_file(&path)
                .with_context(|| format!("--listen {addr}: cannot remove stale {p}"))?;
        }
        let l =
            UnixListener::bind(&path).with_context(|| format!("--listen {addr}: cannot bind"))?;
        Ok(Listen::Unix(l, path))
    } else {
        bail!("--listen {addr}: expected tcp:HOST:PORT or unix:PATH")
    }
}

fn uri(l: &Listen, export: &str) -> String {
    match l {
        Listen::Tcp(_, a) => format!("nbd://{a}/{export}"),
        Listen::Unix(_, p) => {
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            format!("nbd+unix:///{export}?socket={}", abs.display())
        }
    }
}

pub fn run(args: &ServeArgs, members: &[PathBuf], embedded: bool) -> Result<()> {
    if !(args.io_timeout > 0.0 && args.io_timeout <= 86_400.0) {
        bail!(
            "--io-timeout {}: must be a number of seconds above 0 and at most 86400",
            args.io_timeout
        );
    }
    let plan = assemble::plan_with(members, args.force)?;
    for r in &plan.refused {
        eprintln!("uraid: warning: {r}");
    }
    plan.can_start()?;
    let g = plan.sb.geometry;
    let missing = plan.missing();
    if !missing.is_empty() {
        eprintln!(
            "uraid: warning: array '{}' is degraded: member(s) {:?} missing or failed ({} of {} tolerated)",
            plan.sb.name,
            missing,
            missing.len(),
            g.fault_tolerance()
        );
    }
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
    let opts = ArrayOptions {
        policy: ErrorPolicy {
            max_read_errors: args.max_read_errors,
            io_timeout: Some(Duration::from_secs_f64(args.io_timeout)),
        },
        frozen_metadata: false,
    };
    // Members first: a member another process holds is refused before any socket is bound.
    let array = assemble::open_volume(&plan, Some(rt.handle()), opts)?;
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
    let server = Server::new(
        array.clone(),
        rt.handle(),
        Config {
            export: export.clone(),
            description,
            read_only: args.read_only,
            ..Config::default()
        },
    );
    for l in &listeners {
        match l {
            Listen::Tcp(t, _) => server.listen(t.as_raw_fd(), true),
            Listen::Unix(u, _) => server.listen(u.as_raw_fd(), false),
        }
    }
    println!(
        "uraid: serving '{}' ({} {} members, {} = {} bytes{}) as export '{export}'",
        plan.sb.name,
        g.level,
        g.members,
        size::human(g.volume_size()),
        g.volume_size(),
        if args.read_only { ", read-only" } else { "" }
    );
    for l in &listeners {
        println!("uraid: listening on {}", uri(l, &export));
    }
    println!("uraid: stop with Ctrl-C, SIGTERM or SIGHUP");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let sig = signals.forever().next().unwrap_or(SIGTERM);
    let name = match sig {
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        _ => "SIGTERM",
    };
    eprintln!("uraid: {name} received: finishing in-flight requests");
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
    r.context("flushing the array at shutdown")?;
    drop(server);
    drop(array);
    rt.shutdown();
    eprintln!(
        "uraid: stopped after {conns} connection(s), {reqs} request(s), {errs} error reply(ies); array flushed and marked clean"
    );
    Ok(())
}
