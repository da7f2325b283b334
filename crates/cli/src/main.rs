//! `uraid`: create, inspect and benchmark uraid arrays (mdadm conventions).
//!
//! This file is the command line: the commands and their arguments (each command's own are
//! in its file under `cmd/`, `bench.rs` or `serve.rs`), logging, and the dispatch.

mod bench;
mod client;
mod cmd;
mod config;
mod control;
mod copies;
mod events;
mod jobs;
mod notify;
mod serve;
mod size;

use anyhow::{anyhow, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// Where `uraid serve` and `uraid bench` keep the embedded default volume.
pub const DEFAULT_DIR: &str = "uraid-data";

#[derive(Parser)]
#[command(
    name = "uraid",
    version,
    about = "Software RAID for NVMe in user space",
    // A later option replaces an earlier one: `uraid serve NAME` puts the config file's
    // options first and the command line's after them.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create an array on MEMBERs (files or block devices), writing a superblock to each.
    Create(cmd::create::CreateArgs),
    /// Add DEV to the array formed by MEMBERs in place of a failed member (mdadm --add): on
    /// a running server through its control socket (rebuilt at once, while serving), or on
    /// a stopped array in the superblocks (rebuilt by the next `serve`); a rebuild resumes
    /// from its checkpoint after a restart. Refused: RAID0, an array with no failed member
    /// (a merely missing one needs --force when stopped), a device smaller than the
    /// members, one that holds a uraid superblock or journal (unless --force).
    Add(cmd::add::AddArgs),
    /// Verify every stripe's redundancy (md's check), or fix it with --repair: with two or
    /// more parities (or three mirror copies) a corrupt chunk is located and its member and
    /// offset reported. On a running server (through its control socket) it runs in the
    /// background (progress in `uraid status`; --wait to wait for it); on a stopped array
    /// it runs here. --pause, --resume and --cancel act on a running server's scrub.
    Scrub(cmd::scrub::ScrubArgs),
    /// Mark member INDEX failed (mdadm --fail): on a running server through its control
    /// socket, else in the superblocks of the stopped array. Refused when the array could
    /// not survive it, and without --force when it would leave no redundancy.
    Fail(cmd::fail::FailArgs),
    /// Replace member INDEX by the device given --with while it keeps serving (mdadm --replace, md's
    /// want_replacement): its data is copied onto DEVICE (chunks it cannot read are rebuilt
    /// from the others), then DEVICE takes its slot and the old device is out; redundancy is
    /// never reduced on the way. If the member fails meanwhile, DEVICE takes its slot and is
    /// rebuilt. On a running server in the background (--wait waits; --cancel stops it);
    /// on a stopped array here. Not resumed after a restart: run it again.
    Replace(cmd::replace::ReplaceArgs),
    /// Remove member INDEX from the array (mdadm --remove), or the hot spare at a path: the
    /// slot is left with no device (the old one is refused from then on) until `uraid add`
    /// fills it; an active member is failed first (refused when the array could not lose
    /// it, and without --force when that would leave no redundancy). A removed spare's
    /// superblock is erased. On a running server through its control socket, else in the
    /// superblocks of the stopped array.
    Remove(cmd::remove::RemoveArgs),
    /// Show or change how hard background work (rebuild, resync, scrub) runs on a running
    /// server while clients are active (its serve flags --background-budget, --priority,
    /// --resync-min, --resync-max set the start values; a stopped array has none).
    Throttle(cmd::throttle::ThrottleArgs),
    /// Show a running server's TLS (mode, credentials, each client's session), or --reload
    /// its certificate or PSK files without dropping connections.
    Tls(cmd::tls::TlsArgs),
    /// Add a journal device to a stopped array, or remove it (mdadm --add-journal).
    Journal {
        #[command(subcommand)]
        cmd: cmd::journal::JournalCmd,
    },
    /// Print the superblock of one member.
    Examine(cmd::examine::ExamineArgs),
    /// Show the state of the array formed by MEMBERs (none: the embedded default volume).
    /// Asks the running server over its control socket when there is one (live state, I/O
    /// counts, connections), else reads the superblocks (missing, failed, stale, foreign);
    /// the output says which.
    Status(cmd::status::StatusArgs),
    /// Like status, mdadm --detail style: per-member I/O, errors and latency, requests by
    /// command, stripe operations.
    Detail(cmd::status::StatusArgs),
    /// Every array whose devices are found (block devices, and --scan-dir directories) and
    /// every running server (control sockets in /run/uraid): mdadm --detail --scan,
    /// zpool list.
    List(cmd::list::ListArgs),
    /// Follow running servers and report what happens to their arrays (mdadm --monitor):
    /// a line per event (Fail, DegradedArray, RebuildStarted, RebuildFinished, ...), and
    /// --program run for each; --oneshot reports degraded arrays once.
    Monitor(cmd::monitor::MonitorArgs),
    /// Live view of a running server: request and member rates every interval, progress of
    /// background operations (bars on a terminal, plain lines otherwise).
    Watch(cmd::watch::WatchArgs),
    /// Drive the engine directly (no network) and report IOPS, bandwidth and latency.
    /// With no MEMBERs, uses the embedded default volume under ./uraid-data.
    Bench(bench::BenchArgs),
    /// Export the array formed by MEMBERs over NBD (TCP and/or Unix sockets) until SIGINT,
    /// SIGTERM or SIGHUP. `uraid serve NAME`: the array NAME (or UUID) found by its
    /// superblocks, with the options of the config file's [NAME] section. With no MEMBERs,
    /// serves the embedded default volume under ./uraid-data.
    Serve(Box<serve::ServeArgs>),
    /// The config file (/etc/uraid/uraid.conf): `uraid config check`.
    Config {
        #[command(subcommand)]
        cmd: config::ConfigCmd,
    },
    /// Writes the man pages (section 8: uraid.8 and uraid-COMMAND.8) and the bash, zsh and
    /// fish completions, from these argument definitions (scripts/package.sh).
    #[command(hide = true)]
    GenerateDocs {
        /// Directory for the man pages.
        #[arg(long, value_name = "DIR")]
        man: PathBuf,
        /// Directory for the completions (uraid.bash, _uraid, uraid.fish).
        #[arg(long, value_name = "DIR")]
        completions: PathBuf,
    },
}

/// Man pages for `cmd` and its subcommands (`uraid.8`, `uraid-serve.8`, ...) into `dir`.
fn write_man(cmd: &clap::Command, dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = cmd.clone().disable_help_subcommand(true);
    let top = cmd.get_name().to_string();
    let mut pages = vec![(top.clone(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        // A page's title is its command's name (a &'static str for clap: this runs once).
        let name: &'static str = Box::leak(format!("{top}-{}", sub.get_name()).into_boxed_str());
        pages.push((name.to_string(), sub.clone().name(name)));
    }
    for (name, c) in pages {
        let mut buf = Vec::new();
        clap_mangen::Man::new(c.version(env!("CARGO_PKG_VERSION")))
            .section("8")
            .render(&mut buf)?;
        std::fs::write(dir.join(format!("{name}.8")), buf)?;
    }
    Ok(())
}

/// `uraid generate-docs`.
fn generate_docs(man: &std::path::Path, completions: &std::path::Path) -> Result<()> {
    use clap_complete::Shell;
    let mut cmd = Cli::command();
    write_man(&cmd, man)?;
    std::fs::create_dir_all(completions)?;
    for (shell, file) in [
        (Shell::Bash, "uraid.bash"),
        (Shell::Zsh, "_uraid"),
        (Shell::Fish, "uraid.fish"),
    ] {
        let mut f = std::fs::File::create(completions.join(file))?;
        clap_complete::generate(shell, &mut cmd, "uraid", &mut f);
    }
    Ok(())
}

/// A clap error's message, one line, without its "error: " prefix.
fn clap_message(e: &clap::Error) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or("").trim();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// Whether `argv` is a command line `uraid` takes.
fn parses(argv: Vec<OsString>) -> Result<(), String> {
    Cli::try_parse_from(argv)
        .map(|_| ())
        .map_err(|e| clap_message(&e))
}

/// `args` (a subcommand's, after its name) without the one clap's `ArgMatches::index_of`
/// gave as `at`: clap counts from the subcommand's name (1 is the first argument), counts
/// `--opt=value` as two and does not count `--`.
fn without_index(args: Vec<OsString>, at: Option<usize>) -> Vec<OsString> {
    let mut idx = 1;
    let mut out = Vec::with_capacity(args.len());
    let mut rest = false;
    for a in args {
        if !rest && a == "--" {
            rest = true;
            out.push(a);
            continue;
        }
        let b = a.as_encoded_bytes();
        let width = if !rest && b.starts_with(b"--") && b.contains(&b'=') {
            2
        } else {
            1
        };
        if Some(idx) != at {
            out.push(a);
        }
        idx += width;
    }
    out
}

/// `uraid serve NAME` with NAME not a file: the array NAME found by its superblocks, with
/// the options the config file gives it (`config::for_name`, `config::serve_args`) and this
/// command line's own options after them (they win).
fn from_config(cli: Cli, m: &clap::ArgMatches) -> Result<Cli> {
    let Cmd::Serve(args) = &cli.cmd else {
        return Ok(cli);
    };
    if args.scan.scan.is_some() || args.members.len() != 1 {
        return Ok(cli);
    }
    let Some((path, cfg, section)) = config::for_name(&args.members[0], args.config.as_deref())?
    else {
        return Ok(cli);
    };
    let name = section.name.clone();
    let full = Cli::command();
    let serve = full
        .find_subcommand("serve")
        .context("uraid has a serve command")?;
    let from_file = config::serve_args(&path, &cfg, &section, serve, &parses)
        .map_err(|v| anyhow!("{}", v.join("\nuraid: ")))?;
    // This command line's own options: everything after `serve` but NAME (clap counts a
    // subcommand's arguments from the subcommand's name, which is argv[1]).
    let at = m
        .subcommand_matches("serve")
        .and_then(|s| s.index_of("members"));
    let own = without_index(std::env::args_os().skip(2).collect(), at);
    let argv: Vec<OsString> = ["uraid".into(), "serve".into()]
        .into_iter()
        .chain(from_file)
        .chain(own)
        .collect();
    Cli::try_parse_from(argv).map_err(|e| {
        anyhow!(
            "serving [{name}] of {}: {}",
            path.display(),
            clap_message(&e)
        )
    })
}

fn main() {
    let serving = std::env::args_os().nth(1).is_some_and(|a| a == "serve");
    // First thing, before any thread or file: on AMD, start again with glibc's vector
    // copies (copies.rs). Returns only if it did not exec.
    let not_restarted = if serving {
        copies::vector_copies_on_amd()
    } else {
        None
    };
    // Commands that print (status, list, examine ...) end quietly when their reader goes
    // away (`uraid status | head`), as other Unix tools do; `serve` keeps SIGPIPE ignored
    // and ignores failed prints (a server must not die of its log reader).
    if serving {
        // A panic on the main thread of a server ends the process (status 101) after its
        // message, instead of unwinding into the runtime's drop while the reactors keep
        // running (a server half stopped, spinning): what it leaves is what a crash leaves
        // (the next start resyncs, replays the journal).
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            if std::thread::current().name() == Some("main") {
                std::process::exit(101);
            }
        }));
    }
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let cli = from_config(cli, &matches).unwrap_or_else(|e| {
        eprintln!("uraid: {e:#}");
        std::process::exit(1)
    });
    let events = events::Events::default();
    init_logging(&cli, &events);
    if let Some(why) = not_restarted {
        tracing::warn!(
            "AMD CPU: not started again with {} ({why}): copies use glibc's defaults; set \
             GLIBC_TUNABLES={} to choose",
            copies::TUNABLE,
            copies::SETTING
        );
    }
    // `status` and `detail` answer with their exit status too (mdadm --detail --test):
    // their own failure is a code of its own, not the "degraded" of 1.
    let health = matches!(cli.cmd, Cmd::Status(_) | Cmd::Detail(_));
    match run(cli, events) {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("uraid: {e:#}");
            std::process::exit(if health { cmd::status::EXIT_UNKNOWN } else { 1 });
        }
    }
}

/// stderr logging (`URAID_LOG` filter, default warn; human or JSON lines) plus the event
/// ring the control socket serves.
fn init_logging(cli: &Cli, events: &events::Events) {
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("URAID_LOG").unwrap_or_else(|_| "warn".into())
    };
    let json = matches!(&cli.cmd, Cmd::Serve(a) if a.log_format == "json");
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(events.layer());
    if json {
        registry.with(fmt.json().with_filter(filter())).init();
    } else {
        registry.with(fmt.with_filter(filter())).init();
    }
}

/// Runs the command; Ok: the exit status (0 unless the command's answer is in it: `status`,
/// `detail`, `scrub --wait`).
fn run(cli: Cli, events: events::Events) -> Result<i32> {
    let ok = |r: Result<()>| r.map(|()| 0);
    match cli.cmd {
        Cmd::Create(a) => ok(cmd::create::run(a)),
        Cmd::Add(a) => ok(cmd::add::run(a)),
        Cmd::Journal { cmd } => ok(cmd::journal::run(cmd)),
        Cmd::Examine(a) => ok(cmd::examine::run(a)),
        Cmd::Status(a) => cmd::status::run(&a, false),
        Cmd::Scrub(a) => cmd::scrub::run(a),
        Cmd::Fail(a) => ok(cmd::fail::run(a)),
        Cmd::Replace(a) => ok(cmd::replace::run(a)),
        Cmd::Remove(a) => ok(cmd::remove::run(a)),
        Cmd::Throttle(a) => ok(cmd::throttle::run(a)),
        Cmd::Tls(a) => ok(cmd::tls::run(a)),
        Cmd::Detail(a) => cmd::status::run(&a, true),
        Cmd::Watch(a) => ok(cmd::watch::run(a)),
        Cmd::List(a) => ok(cmd::list::run(a)),
        Cmd::Monitor(a) => cmd::monitor::run(a),
        Cmd::GenerateDocs { man, completions } => ok(generate_docs(&man, &completions)),
        Cmd::Config {
            cmd: config::ConfigCmd::Check { config },
        } => {
            let path = config.unwrap_or_else(|| config::DEFAULT_PATH.into());
            let full = Cli::command();
            let serve = full
                .find_subcommand("serve")
                .context("uraid has a serve command")?;
            config::check(&path, serve, &parses)
        }
        Cmd::Bench(args) => {
            let embedded = args.members.is_empty();
            let members = if embedded {
                cmd::default_volume()?
            } else {
                args.members.clone()
            };
            ok(bench::run(&args, &members, embedded))
        }
        Cmd::Serve(args) => {
            // Devices get --io-timeout to answer (checked again with the other options).
            let timeout = if args.io_timeout > 0.0 && args.io_timeout <= 86_400.0 {
                std::time::Duration::from_secs_f64(args.io_timeout)
            } else {
                uraid_engine::assemble::DISCOVERY_TIMEOUT
            };
            if let Some(found) = cmd::scan_members(&args.scan, timeout)? {
                return ok(serve::run(&args, &found, false, events));
            }
            let embedded = args.members.is_empty();
            let members = if embedded {
                cmd::default_volume()?
            } else {
                args.members.clone()
            };
            ok(serve::run(&args, &members, embedded, events))
        }
    }
}
