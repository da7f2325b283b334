//! `uraid`: create, inspect and benchmark uraid arrays (mdadm conventions).

mod bench;
mod client;
mod control;
mod events;
mod jobs;
mod serve;
mod size;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::json;
use std::path::{Path, PathBuf};
use uraid_core::format::{uuid_string, JournalMode, Superblock};
use uraid_core::geometry::CHUNK_DEFAULT;
use uraid_core::Level;
use uraid_engine::assemble::{self, CreateOptions, Plan};

/// Where `uraid serve` and `uraid bench` keep the embedded default volume.
pub const DEFAULT_DIR: &str = "uraid-data";
const DEFAULT_MEMBERS: usize = 10;
const DEFAULT_MEMBER_SIZE: u64 = 1 << 30;

#[derive(Parser)]
#[command(
    name = "uraid",
    version,
    about = "Software RAID for NVMe in user space"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create an array on MEMBERs (files or block devices), writing a superblock to each.
    Create {
        /// RAID level: 0, 1, 10, 5, 6, 7 (triple parity) or ec (with --parity).
        #[arg(short, long)]
        level: String,
        /// Parity members for --level ec (1..=8).
        #[arg(long)]
        parity: Option<usize>,
        /// Chunk size, a power of two from 4K to 1M.
        #[arg(short, long, default_value = "64K", value_parser = size::parse)]
        chunk: u64,
        /// Array name (up to 32 bytes).
        #[arg(short = 'N', long, default_value = "uraid")]
        name: String,
        /// Overwrite members that already carry a uraid superblock.
        #[arg(short, long)]
        force: bool,
        /// Create missing member files of this size first (sparse).
        #[arg(long, value_parser = size::parse)]
        size: Option<u64>,
        /// Write-intent bitmap region size (bytes of each member), a power of two of at
        /// least one chunk, or "none". Default 64M (larger when the members are so big that
        /// 455,168 regions do not cover them); none on RAID0.
        #[arg(long, value_parser = parse_bitmap_chunk)]
        bitmap_chunk: Option<u64>,
        /// A journal device (a faster device or file, at least four full stripes plus 8 KiB):
        /// every stripe update is logged there before the members are written, which closes
        /// the RAID write hole (no resync after a crash, safe degraded start). Parity levels.
        /// Give it with the members to `serve`, `status`.
        #[arg(long, value_name = "DEV")]
        journal: Option<PathBuf>,
        /// write-through: FLUSH still flushes the members; write-back: FLUSH and FUA are
        /// satisfied by the journal (one journal write), members flushed at checkpoints.
        #[arg(long, default_value = "write-through", value_parser = parse_journal_mode)]
        journal_mode: JournalMode,
        /// A hot spare (repeat for several): it takes over the slot of the next member that
        /// fails while serving (give it with the members to `serve`). Levels with redundancy.
        #[arg(long, value_name = "DEV")]
        spare: Vec<PathBuf>,
        #[arg(required = true)]
        members: Vec<PathBuf>,
    },
    /// Add DEV to the array formed by MEMBERs in place of a failed member (mdadm --add): on
    /// a running server through its control socket (rebuilt at once, while serving), or on
    /// a stopped array in the superblocks (rebuilt by the next `serve`); a rebuild resumes
    /// from its checkpoint after a restart. Refused: RAID0, an array with no failed member
    /// (a merely missing one needs --force when stopped), a device smaller than the
    /// members, one that holds a uraid superblock or journal (unless --force).
    Add {
        /// Overwrite a device that holds a uraid superblock or journal.
        #[arg(short, long)]
        force: bool,
        /// Control socket of the server: unix:PATH (as for status).
        #[arg(long, value_name = "unix:PATH")]
        control: Option<String>,
        /// The new member.
        dev: PathBuf,
        /// The array's members (the embedded default volume when none are given).
        members: Vec<PathBuf>,
    },
    /// Verify every stripe's redundancy (md's check), or fix it with --repair: with two or
    /// more parities (or three mirror copies) a corrupt chunk is located and its member and
    /// offset reported. On a running server (through its control socket) it runs in the
    /// background (progress in `uraid status`; --wait to wait for it); on a stopped array
    /// it runs here. --pause, --resume and --cancel act on a running server's scrub.
    Scrub {
        #[command(flatten)]
        target: Target,
        /// Rewrite what does not match (located chunks; otherwise parity from the data).
        #[arg(long)]
        repair: bool,
        #[arg(long, conflicts_with_all = ["resume", "cancel", "repair"])]
        pause: bool,
        #[arg(long, conflicts_with_all = ["cancel", "repair"])]
        resume: bool,
        #[arg(long, conflicts_with = "repair")]
        cancel: bool,
        /// On a running server: wait until the scrub ends and print what it found.
        #[arg(long)]
        wait: bool,
    },
    /// Mark member INDEX failed (mdadm --fail): on a running server through its control
    /// socket, else in the superblocks of the stopped array. Refused when the array could
    /// not survive it, and without --force when it would leave no redundancy.
    Fail {
        index: usize,
        #[arg(short, long)]
        force: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Replace member INDEX by the device given --with while it keeps serving (mdadm --replace, md's
    /// want_replacement): its data is copied onto DEVICE (chunks it cannot read are rebuilt
    /// from the others), then DEVICE takes its slot and the old device is out; redundancy is
    /// never reduced on the way. If the member fails meanwhile, DEVICE takes its slot and is
    /// rebuilt. On a running server in the background (--wait waits; --cancel stops it);
    /// on a stopped array here. Not resumed after a restart: run it again.
    Replace {
        /// Member index.
        index: usize,
        /// The new device.
        #[arg(
            long = "with",
            value_name = "DEVICE",
            required_unless_present = "cancel"
        )]
        device: Option<PathBuf>,
        /// Overwrite a device holding a uraid superblock or journal.
        #[arg(short, long)]
        force: bool,
        /// Wait until it has finished (running server).
        #[arg(long)]
        wait: bool,
        /// Cancel the running replace of member INDEX (running server).
        #[arg(long, conflicts_with_all = ["device", "wait", "force"])]
        cancel: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Remove member INDEX from the array (mdadm --remove), or the hot spare at a path: the
    /// slot is left with no device (the old one is refused from then on) until `uraid add`
    /// fills it; an active member is failed first (refused when the array could not lose
    /// it, and without --force when that would leave no redundancy). A removed spare's
    /// superblock is erased. On a running server through its control socket, else in the
    /// superblocks of the stopped array.
    Remove {
        /// Member index, or a spare's path.
        what: String,
        #[arg(short, long)]
        force: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Show or change how hard background work (rebuild, resync, scrub) runs on a running
    /// server while clients are active (its serve flags --background-budget, --priority,
    /// --resync-min, --resync-max set the start values; a stopped array has none).
    Throttle {
        /// Stripes in flight while clients are active; 0: the --min rate instead.
        #[arg(long, value_name = "STRIPES")]
        budget: Option<usize>,
        /// low, normal or high: how much of the time the budget is used.
        #[arg(long, value_parser = ["low", "normal", "high"])]
        priority: Option<String>,
        /// Rate while clients are active with budget 0, MB/s of member I/O; 0: unlimited.
        #[arg(long, value_name = "MB/S")]
        min: Option<u64>,
        /// Rate while clients are idle, MB/s; 0: unlimited.
        #[arg(long, value_name = "MB/S")]
        max: Option<u64>,
        #[command(flatten)]
        target: Target,
    },
    /// Add a journal device to a stopped array, or remove it (mdadm --add-journal).
    Journal {
        #[command(subcommand)]
        cmd: JournalCmd,
    },
    /// Print the superblock of one member.
    Examine {
        member: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Show the state of the array formed by MEMBERs (none: the embedded default volume).
    /// Asks the running server over its control socket when there is one (live state, I/O
    /// counts, connections), else reads the superblocks (missing, failed, stale, foreign);
    /// the output says which.
    Status(StatusArgs),
    /// Like status, mdadm --detail style: per-member I/O, errors and latency, requests by
    /// command, stripe operations.
    Detail(StatusArgs),
    /// Live view of a running server: request and member rates every interval, progress of
    /// background operations (bars on a terminal, plain lines otherwise).
    Watch {
        #[command(flatten)]
        target: Target,
        /// Seconds between updates.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many updates (0: until interrupted).
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Drive the engine directly (no network) and report IOPS, bandwidth and latency.
    /// With no MEMBERs, uses the embedded default volume under ./uraid-data.
    Bench(bench::BenchArgs),
    /// Export the array formed by MEMBERs over NBD (TCP and/or Unix sockets) until SIGINT,
    /// SIGTERM or SIGHUP. With no MEMBERs, serves the embedded default volume under ./uraid-data.
    Serve(serve::ServeArgs),
}

#[derive(Subcommand)]
enum JournalCmd {
    /// Format DEV as the journal of the (cleanly stopped) array formed by MEMBERs.
    Add {
        #[arg(long, value_name = "DEV")]
        journal: PathBuf,
        #[arg(long, default_value = "write-through", value_parser = parse_journal_mode)]
        mode: JournalMode,
        /// Overwrite a device that holds a uraid superblock or journal.
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        members: Vec<PathBuf>,
    },
    /// Stop using the journal of the array formed by MEMBERs (and its journal device, if
    /// given among them). Refused after an unclean stop unless --force.
    Remove {
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        members: Vec<PathBuf>,
    },
}

/// Which array, and where its server's control socket is.
#[derive(clap::Args, Clone)]
struct Target {
    /// Control socket of the server: unix:PATH. Default: unix:/run/uraid/NAME.sock, or
    /// unix:uraid-data/control.sock for the embedded default volume.
    #[arg(long, value_name = "unix:PATH")]
    control: Option<String>,
    /// Member devices or files. None: the embedded default volume under ./uraid-data.
    members: Vec<PathBuf>,
}

#[derive(clap::Args, Clone)]
struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print JSON (schema in docs/control.md).
    #[arg(long)]
    json: bool,
    /// Read the superblocks even if a server is running.
    #[arg(long)]
    offline: bool,
}

fn main() {
    let cli = Cli::parse();
    let events = events::Events::default();
    init_logging(&cli, &events);
    if let Err(e) = run(cli, events) {
        eprintln!("uraid: {e:#}");
        std::process::exit(1);
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

/// The members of `target` (the embedded default when none are named) and whether they are
/// the embedded default.
fn target_members(t: &Target) -> Result<(Vec<PathBuf>, bool)> {
    if t.members.is_empty() {
        if !Path::new(DEFAULT_DIR).join("member0.img").exists() {
            bail!("no members given and no embedded default volume in ./{DEFAULT_DIR}");
        }
        Ok((default_volume()?, true))
    } else {
        Ok((t.members.clone(), false))
    }
}

/// The control socket of a running server of `plan`'s array, if one answers.
fn live_socket(plan: &Plan, t: &Target, embedded: bool) -> Result<Option<PathBuf>> {
    let Some(sock) = client::socket_for(plan, t.control.as_deref(), embedded)? else {
        return Ok(None);
    };
    Ok(client::live_status(plan, &sock)?.map(|_| sock))
}

fn scrub_cmd(
    t: &Target,
    repair: bool,
    pause: bool,
    resume: bool,
    cancel: bool,
    wait: bool,
) -> Result<()> {
    let (members, embedded) = target_members(t)?;
    let plan = assemble::plan(&members)?;
    let mode = if repair {
        uraid_engine::ScrubMode::Repair
    } else {
        uraid_engine::ScrubMode::Check
    };
    let Some(sock) = live_socket(&plan, t, embedded)? else {
        if pause || resume || cancel {
            bail!(
                "no running server of array '{}' to pause, resume or cancel a scrub on",
                plan.sb.name
            );
        }
        return scrub_offline(&plan, mode);
    };
    let path = match (pause, resume, cancel) {
        (true, _, _) => "/scrub/pause".to_string(),
        (_, true, _) => "/scrub/resume".to_string(),
        (_, _, true) => "/scrub/cancel".to_string(),
        _ => format!("/scrub?mode={}", mode.name()),
    };
    let msg = client::post(&sock, &path)?;
    println!("uraid: {msg} (server at {})", sock.display());
    if wait {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let v = client::get_json(&sock, "/status")?;
            let s = &v["scrub"];
            if s["state"] != "running" && s["state"] != "paused" {
                println!(
                    "uraid: scrub ({}) {}: {} units, {} mismatched column(s), {} located, {} \
                     repaired, {} unreadable (the events name members and offsets)",
                    s["mode"].as_str().unwrap_or("?"),
                    s["state"].as_str().unwrap_or("?"),
                    s["units"],
                    s["mismatches"],
                    s["located"],
                    s["repaired"],
                    s["unreadable"]
                );
                break;
            }
        }
    }
    Ok(())
}

/// A device path for a control-socket command: absolute (the server's working directory is
/// not ours) and percent-encoded.
fn path_query(dev: &Path) -> String {
    let abs = std::fs::canonicalize(dev).unwrap_or_else(|_| dev.to_path_buf());
    uraid_core::http::percent_encode(&abs.display().to_string())
}

fn replace_cmd(
    i: usize,
    device: Option<PathBuf>,
    force: bool,
    wait: bool,
    cancel: bool,
    t: &Target,
) -> Result<()> {
    let (members, embedded) = target_members(t)?;
    let plan = assemble::plan(&members)?;
    let sock = live_socket(&plan, t, embedded)?;
    if cancel {
        let Some(sock) = sock else {
            bail!(
                "no running server of array '{}' to cancel a replace on",
                plan.sb.name
            );
        };
        let st = client::get_json(&sock, "/status")?;
        if st["slots"][i]["state"] != "replacing" {
            bail!("member {i} is not being replaced");
        }
        let msg = client::post(&sock, "/replace/cancel")?;
        println!("uraid: {msg} (server at {})", sock.display());
        return Ok(());
    }
    let Some(dev) = device else {
        bail!("uraid replace INDEX --with DEVICE MEMBERS...: the new device");
    };
    let Some(sock) = sock else {
        return replace_offline(&plan, i, &dev, force);
    };
    let msg = client::post(
        &sock,
        &format!(
            "/replace?member={i}&path={}&force={}",
            path_query(&dev),
            u8::from(force)
        ),
    )?;
    println!("uraid: {msg} (server at {})", sock.display());
    if wait {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let v = client::get_json(&sock, "/status")?;
            let slot = &v["slots"][i];
            if slot["state"] != "replacing" {
                println!(
                    "uraid: member {i} is {} on {}",
                    slot["state"].as_str().unwrap_or("?"),
                    slot["path"].as_str().unwrap_or("?")
                );
                break;
            }
        }
    }
    Ok(())
}

/// Assembles a stopped array in this process (offline scrub and replace), with reactors.
fn open_here(
    plan: &Plan,
) -> Result<(
    uraid_engine::Runtime,
    std::sync::Arc<uraid_engine::Volume<uraid_engine::FileDev>>,
)> {
    let rt = uraid_engine::Runtime::new(
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        256,
        true,
    )?;
    let vol = assemble::open_volume(
        plan,
        Some(rt.handle()),
        uraid_engine::ArrayOptions::default(),
    )?;
    Ok((rt, vol))
}

/// Replace on a stopped array, in this process: assembled, copied, swapped, closed.
fn replace_offline(plan: &Plan, i: usize, dev: &Path, force: bool) -> Result<()> {
    plan.can_start()?;
    assemble::check_replacement(plan, i, dev, force)?;
    let (rt, vol) = open_here(plan)?;
    let new =
        uraid_engine::FileDev::open(dev).map_err(|e| anyhow::anyhow!("{}: {e}", dev.display()))?;
    let uuid = assemble::new_device_uuid();
    let started = futures::executor::block_on(vol.replace_member(i, new, uuid));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let r = match started {
        Ok(()) => futures::executor::block_on(vol.replace_run(&stop))
            .map_err(|e| anyhow::anyhow!("replace: {e}")),
        Err(e) => Err(anyhow::anyhow!("replace: {e}")),
    };
    let v = vol.clone();
    let closed = rt
        .handle()
        .block_on(0, move || async move { v.close().await });
    let r = r?;
    closed.map_err(|e| anyhow::anyhow!("closing the array: {e}"))?;
    match r {
        uraid_engine::ReplaceOutcome::Replaced { slot } => println!(
            "uraid: member {slot} of array '{}' replaced by {}",
            plan.sb.name,
            dev.display()
        ),
        uraid_engine::ReplaceOutcome::Rebuilding { slot } => println!(
            "uraid: member {slot} failed during the replace: {} took its slot and is rebuilt \
             when the array is served",
            dev.display()
        ),
        uraid_engine::ReplaceOutcome::Cancelled { slot } => {
            bail!("replace of member {slot} was stopped")
        }
    }
    Ok(())
}

/// Scrub of a stopped array, in this process (messages on stderr as they are found).
fn scrub_offline(plan: &Plan, mode: uraid_engine::ScrubMode) -> Result<()> {
    plan.can_start()?;
    let missing = plan.missing();
    if !missing.is_empty() {
        bail!(
            "array '{}' is degraded (member(s) {missing:?} missing, failed or rebuilding): scrub \
             needs every member",
            plan.sb.name
        );
    }
    let (rt, vol) = open_here(plan)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let r = futures::executor::block_on(vol.array().scrub_run(mode, &stop));
    let v = vol.clone();
    let closed = rt
        .handle()
        .block_on(0, move || async move { v.close().await });
    let r = r.map_err(|e| anyhow::anyhow!("scrub: {e}"))?;
    closed.map_err(|e| anyhow::anyhow!("closing the array: {e}"))?;
    println!(
        "uraid: scrub ({}) of array '{}': {} units, {} mismatched column(s), {} located, {} \
         repaired, {} unreadable",
        mode.name(),
        plan.sb.name,
        r.units,
        r.mismatches,
        r.located,
        r.repaired,
        r.unreadable
    );
    Ok(())
}

fn status_cmd(a: &StatusArgs, detail: bool) -> Result<()> {
    let (members, embedded) = target_members(&a.target)?;
    let plan = assemble::plan(&members)?;
    let sock = client::socket_for(&plan, a.target.control.as_deref(), embedded)?;
    let live = match (&sock, a.offline) {
        (Some(p), false) => client::live_status(&plan, p)?.map(|v| (v, p.clone())),
        _ => None,
    };
    match live {
        Some((v, p)) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                client::print_live(&v, &p, detail);
            }
        }
        None => {
            let why = match (&sock, a.offline) {
                (_, true) => "--offline".to_string(),
                (Some(p), _) => client::not_running_reason(p),
                (None, _) if a.target.control.is_some() => "--control none".to_string(),
                (None, _) => format!(
                    "array name {:?} names no control socket; pass --control unix:PATH",
                    plan.sb.name
                ),
            };
            if a.json {
                let mut v = status_json(&plan);
                v["schema"] = json!(control::SCHEMA);
                v["source"] = json!("superblocks");
                v["source_reason"] = json!(why);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_status(&plan);
                println!("      source: superblocks ({why})");
            }
        }
    }
    Ok(())
}

fn run(cli: Cli, events: events::Events) -> Result<()> {
    match cli.cmd {
        Cmd::Create {
            level,
            parity,
            chunk,
            name,
            force,
            size,
            bitmap_chunk,
            journal,
            journal_mode,
            spare,
            members,
        } => {
            let level = Level::parse(&level, parity)?;
            if !spare.is_empty() && level == Level::Raid0 {
                bail!("--spare: raid0 has no redundancy, a spare could never be rebuilt");
            }
            for (i, s) in spare.iter().enumerate() {
                if spare[..i].contains(s) || members.contains(s) {
                    bail!("{}: given twice", s.display());
                }
            }
            if let Some(sz) = size {
                for m in members.iter().chain(&spare) {
                    if !m.exists() {
                        let f = std::fs::File::create(m)
                            .with_context(|| format!("{}: cannot create", m.display()))?;
                        f.set_len(sz)?;
                    }
                }
            }
            let jpath = journal.clone();
            let sb = assemble::create_exclusive(
                &members,
                &CreateOptions {
                    level,
                    chunk,
                    name,
                    force,
                    bitmap_chunk,
                    journal: journal.map(|j| (j, journal_mode)),
                },
            )?;
            let g = sb.geometry;
            println!(
                "uraid: created {} array '{}' ({}) on {} members: chunk {}, volume {} ({} bytes)",
                g.level,
                sb.name,
                uuid_string(&sb.array_uuid),
                g.members,
                size::human(g.chunk),
                size::human(g.volume_size()),
                g.volume_size()
            );
            if let Some((u, m)) = sb.journal {
                println!("uraid: journal {} ({})", uuid_string(&u), m.name());
            }
            if !spare.is_empty() {
                let mut given = members.clone();
                given.extend(jpath.iter().cloned());
                let plan = assemble::plan(&given)?;
                for s in &spare {
                    assemble::add_spare(&plan, s, force)?;
                    println!("uraid: hot spare {}", s.display());
                }
            }
            Ok(())
        }
        Cmd::Add {
            force,
            control,
            dev,
            members,
        } => {
            let t = Target { control, members };
            let (members, embedded) = target_members(&t)?;
            let plan = assemble::plan(&members)?;
            if let Some(sock) = live_socket(&plan, &t, embedded)? {
                let msg = client::post(
                    &sock,
                    &format!("/add?path={}&force={}", path_query(&dev), u8::from(force)),
                )?;
                println!("uraid: {msg} (server at {})", sock.display());
                return Ok(());
            }
            if assemble::slot_to_fill(&plan).is_none() {
                let sb = assemble::add_spare(&plan, &dev, force)?;
                println!(
                    "uraid: {} added to array '{}' as a hot spare (give it with the members to \
                     serve: it takes over the next member that fails)",
                    dev.display(),
                    sb.name
                );
                return Ok(());
            }
            let (slot, sb) = assemble::add_member(&plan, &dev, force)?;
            println!(
                "uraid: {} added to array '{}' as member {slot} (events {}); it is rebuilt \
                 when the array is served (uraid status shows progress)",
                dev.display(),
                sb.name,
                sb.events
            );
            Ok(())
        }
        Cmd::Journal { cmd } => journal_cmd(cmd),
        Cmd::Examine { member, json } => {
            if let (Err(_), Ok(j)) = (
                assemble::read_superblock(&member),
                assemble::read_journal_super(&member),
            ) {
                return print_journal_examine(&member, &j, json);
            }
            let sb = assemble::read_superblock(&member)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&sb_json(&member, &sb))?);
            } else {
                print_examine(&member, &sb);
            }
            Ok(())
        }
        Cmd::Status(a) => status_cmd(&a, false),
        Cmd::Scrub {
            target,
            repair,
            pause,
            resume,
            cancel,
            wait,
        } => scrub_cmd(&target, repair, pause, resume, cancel, wait),
        Cmd::Fail {
            index,
            force,
            target,
        } => {
            let (members, embedded) = target_members(&target)?;
            let plan = assemble::plan(&members)?;
            match live_socket(&plan, &target, embedded)? {
                Some(sock) => {
                    let msg = client::post(
                        &sock,
                        &format!("/fail?member={index}&force={}", u8::from(force)),
                    )?;
                    println!("uraid: {msg} (server at {})", sock.display());
                }
                None => {
                    let sb = assemble::fail_member(&plan, index, force)?;
                    println!(
                        "uraid: member {index} of array '{}' marked failed (events {})",
                        sb.name, sb.events
                    );
                }
            }
            Ok(())
        }
        Cmd::Replace {
            index,
            device,
            force,
            wait,
            cancel,
            target,
        } => replace_cmd(index, device, force, wait, cancel, &target),
        Cmd::Remove {
            what,
            force,
            target,
        } => {
            let (members, embedded) = target_members(&target)?;
            let plan = assemble::plan(&members)?;
            let index = what.parse::<usize>().ok();
            match live_socket(&plan, &target, embedded)? {
                Some(sock) => {
                    let q = match index {
                        Some(i) => format!("member={i}"),
                        None => format!("path={}", path_query(Path::new(&what))),
                    };
                    let msg =
                        client::post(&sock, &format!("/remove?{q}&force={}", u8::from(force)))?;
                    println!("uraid: {msg} (server at {})", sock.display());
                }
                None => match index {
                    Some(i) => {
                        let sb = assemble::remove_member(&plan, i, force)?;
                        println!(
                            "uraid: member {i} removed from array '{}' (events {}); `uraid add` \
                             fills its slot",
                            sb.name, sb.events
                        );
                    }
                    None => {
                        assemble::remove_spare(&plan, Path::new(&what))?;
                        println!("uraid: spare {what} removed from array '{}'", plan.sb.name);
                    }
                },
            }
            Ok(())
        }
        Cmd::Throttle {
            budget,
            priority,
            min,
            max,
            target,
        } => {
            let (members, embedded) = target_members(&target)?;
            let plan = assemble::plan(&members)?;
            let Some(sock) = live_socket(&plan, &target, embedded)? else {
                bail!(
                    "no running server of array '{}': the throttle is set when serving                      (uraid serve --background-budget, --priority, --resync-min, --resync-max)",
                    plan.sb.name
                );
            };
            let mut q = Vec::new();
            if let Some(b) = budget {
                q.push(format!("budget={b}"));
            }
            if let Some(p) = priority {
                q.push(format!("priority={p}"));
            }
            if let Some(m) = min {
                q.push(format!("min={m}"));
            }
            if let Some(m) = max {
                q.push(format!("max={m}"));
            }
            if q.is_empty() {
                let st = client::get_json(&sock, "/status")?;
                let t = &st["throttle"];
                let rate = |v: &serde_json::Value| match v.as_u64() {
                    Some(0) | None => "unlimited".to_string(),
                    Some(b) => format!("{} MB/s", b >> 20),
                };
                println!(
                    "uraid: throttle: budget {} stripe(s) while clients are active, priority {}, \
                     min {}, max {} (server at {})",
                    t["budget"],
                    t["priority"].as_str().unwrap_or("?"),
                    rate(&t["min_bytes_per_second"]),
                    rate(&t["max_bytes_per_second"]),
                    sock.display()
                );
            } else {
                let msg = client::post(&sock, &format!("/throttle?{}", q.join("&")))?;
                println!("uraid: {msg} (server at {})", sock.display());
            }
            Ok(())
        }
        Cmd::Detail(a) => status_cmd(&a, true),
        Cmd::Watch {
            target,
            interval,
            count,
        } => {
            if !(interval > 0.0 && interval <= 3600.0) {
                bail!("--interval {interval}: must be above 0 and at most 3600 seconds");
            }
            let (members, embedded) = target_members(&target)?;
            let plan = assemble::plan(&members)?;
            let Some(sock) = client::socket_for(&plan, target.control.as_deref(), embedded)? else {
                bail!("uraid watch needs a control socket");
            };
            client::watch(
                &sock,
                &plan,
                std::time::Duration::from_secs_f64(interval),
                count,
            )
        }
        Cmd::Bench(args) => {
            let embedded = args.members.is_empty();
            let members = if embedded {
                default_volume()?
            } else {
                args.members.clone()
            };
            bench::run(&args, &members, embedded)
        }
        Cmd::Serve(args) => {
            let embedded = args.members.is_empty();
            let members = if embedded {
                default_volume()?
            } else {
                args.members.clone()
            };
            serve::run(&args, &members, embedded, events)
        }
    }
}

/// The embedded default: RAID6 8+2 over sparse 1 GiB files in ./uraid-data, created on
/// first use and reused afterwards.
pub fn default_volume() -> Result<Vec<PathBuf>> {
    let dir = Path::new(DEFAULT_DIR);
    let members: Vec<PathBuf> = (0..DEFAULT_MEMBERS)
        .map(|i| dir.join(format!("member{i}.img")))
        .collect();
    if members.iter().all(|m| m.exists()) {
        return Ok(members);
    }
    if members.iter().any(|m| m.exists()) {
        bail!("{}: some default member files exist and some do not; remove the directory or pass members", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    for m in &members {
        std::fs::File::create(m)?.set_len(DEFAULT_MEMBER_SIZE)?;
    }
    let sb = assemble::create_exclusive(
        &members,
        &CreateOptions {
            level: Level::Raid6,
            chunk: CHUNK_DEFAULT,
            name: "default".into(),
            force: false,
            bitmap_chunk: None,
            journal: None,
        },
    )?;
    eprintln!(
        "uraid: created the default raid6 8+2 volume ({}) in {}",
        size::human(sb.geometry.volume_size()),
        dir.display()
    );
    Ok(members)
}

fn parse_journal_mode(s: &str) -> Result<JournalMode, String> {
    match s {
        "write-through" | "wt" => Ok(JournalMode::WriteThrough),
        "write-back" | "wb" => Ok(JournalMode::WriteBack),
        _ => Err(format!("{s}: write-through or write-back")),
    }
}

fn journal_cmd(cmd: JournalCmd) -> Result<()> {
    match cmd {
        JournalCmd::Add {
            journal,
            mode,
            force,
            members,
        } => {
            let plan = assemble::plan(&members)?;
            let sb = assemble::add_journal(&plan, &journal, mode, force)?;
            let (u, m) = sb.journal.context("journal recorded")?;
            println!(
                "uraid: array '{}' now journals to {} (journal {}, {}); give it with the \
                 members when serving",
                sb.name,
                journal.display(),
                uuid_string(&u),
                m.name()
            );
            Ok(())
        }
        JournalCmd::Remove { force, members } => {
            let plan = assemble::plan(&members)?;
            let sb = assemble::remove_journal(&plan, force)?;
            println!(
                "uraid: array '{}' has no journal any more (events {})",
                sb.name, sb.events
            );
            Ok(())
        }
    }
}

fn print_journal_examine(
    path: &Path,
    j: &uraid_core::journal::JournalSuper,
    json: bool,
) -> Result<()> {
    if json {
        let v = json!({
            "path": path.display().to_string(),
            "kind": "journal",
            "array_uuid": uuid_string(&j.array_uuid),
            "journal_uuid": uuid_string(&j.journal_uuid),
            "epoch": j.epoch,
            "generation": j.gen,
            "log_start": j.log_start,
            "log_len": j.log_len,
            "tail": j.tail,
            "tail_seq": j.tail_seq,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{}:", path.display());
    println!("          Magic : uraid-jn (journal device)");
    println!("     Array UUID : {}", uuid_string(&j.array_uuid));
    println!("   Journal UUID : {}", uuid_string(&j.journal_uuid));
    println!(
        "       Log Area : {} ({} bytes at offset {})",
        size::human(j.log_len),
        j.log_len,
        j.log_start
    );
    println!("          Epoch : {}", j.epoch);
    println!(
        "     Checkpoint : record {} at log position {}",
        j.tail_seq, j.tail
    );
    Ok(())
}

fn journal_word(sb: &Superblock) -> String {
    match sb.journal {
        Some((u, m)) => format!("{} ({})", uuid_string(&u), m.name()),
        None => "none".into(),
    }
}

/// `--bitmap-chunk`: a size, or "none" (0).
fn parse_bitmap_chunk(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("none") {
        Ok(0)
    } else {
        size::parse(s)
    }
}

fn bitmap_word(sb: &Superblock) -> String {
    match sb.bitmap_chunk {
        0 => "none (no write-intent bitmap: an unclean stop resyncs everything)".into(),
        c => format!(
            "{} ({} regions)",
            size::human(c),
            uraid_core::bitmap::regions(&sb.geometry, c)
        ),
    }
}

fn state_word(sb: &Superblock) -> &'static str {
    if sb.clean {
        "clean"
    } else {
        "active (not cleanly stopped)"
    }
}

fn print_examine(path: &Path, sb: &Superblock) {
    let g = sb.geometry;
    println!("{}:", path.display());
    println!("          Magic : uraid-sb");
    println!("        Version : {}", uraid_core::format::VERSION);
    println!("     Array UUID : {}", uuid_string(&sb.array_uuid));
    println!("           Name : {}", sb.name);
    println!("     Raid Level : {}", g.level);
    println!("   Raid Devices : {}", g.members);
    println!("     Chunk Size : {}", size::human(g.chunk));
    println!("    Data Offset : {} bytes", sb.data_offset);
    println!(
        "    Member Data : {} ({} bytes)",
        size::human(g.member_data),
        g.member_data
    );
    println!(
        "    Volume Size : {} ({} bytes)",
        size::human(g.volume_size()),
        g.volume_size()
    );
    println!("    Device UUID : {}", uuid_string(&sb.device_uuid));
    if sb.spare {
        println!("    Device Role : hot spare");
    } else {
        println!("   Device Index : {}", sb.index);
    }
    println!("         Events : {}", sb.events);
    println!("   Bitmap Chunk : {}", bitmap_word(sb));
    println!("        Journal : {}", journal_word(sb));
    println!("          State : {}", state_word(sb));
    let states: String = (0..g.members)
        .map(|i| {
            if sb.is_failed(i) {
                'F'
            } else if sb.is_rebuilding(i) {
                'R'
            } else {
                'A'
            }
        })
        .collect();
    println!("   Array States : {states}  (A = active, F = failed, R = rebuilding)");
    for i in (0..g.members).filter(|&i| sb.is_rebuilding(i)) {
        println!(
            "    Rebuild [{i:>2}] : {} of {} units",
            sb.rebuilt[i],
            g.units()
        );
    }
}

fn sb_json(path: &Path, sb: &Superblock) -> serde_json::Value {
    let g = sb.geometry;
    json!({
        "path": path.display().to_string(),
        "version": uraid_core::format::VERSION,
        "array_uuid": uuid_string(&sb.array_uuid),
        "name": sb.name,
        "level": g.level.to_string(),
        "parity": g.parity(),
        "members": g.members,
        "chunk": g.chunk,
        "data_offset": sb.data_offset,
        "member_data": g.member_data,
        "volume_size": g.volume_size(),
        "device_uuid": uuid_string(&sb.device_uuid),
        "index": sb.index,
        "events": sb.events,
        "clean": sb.clean,
        "bitmap_chunk": sb.bitmap_chunk,
        "journal": sb.journal.map(|(u, m)| json!({"uuid": uuid_string(&u), "mode": m.name()})),
        "ctime": sb.ctime,
        "utime": sb.utime,
        "spare": sb.spare,
        "member_states": (0..g.members).map(|i| sb_state(sb, i)).collect::<Vec<_>>(),
        "rebuilt_units": sb.rebuilt,
    })
}

fn sb_state(sb: &Superblock, i: usize) -> &'static str {
    if sb.is_removed(i) {
        "removed"
    } else if sb.is_failed(i) {
        "failed"
    } else if sb.is_rebuilding(i) {
        "rebuilding"
    } else {
        "active"
    }
}

fn member_states(plan: &Plan) -> Vec<(usize, String, &'static str)> {
    (0..plan.slots.len())
        .map(|i| {
            let path = plan.slots[i]
                .as_ref()
                .map_or("-".to_string(), |p| p.display().to_string());
            let st = if plan.sb.is_removed(i) {
                "removed"
            } else if plan.sb.is_failed(i) {
                "failed"
            } else if plan.slots[i].is_none() {
                "missing"
            } else {
                sb_state(&plan.sb, i)
            };
            (i, path, st)
        })
        .collect()
}

fn health(plan: &Plan) -> String {
    let missing = plan.missing().len();
    match (plan.can_start(), missing) {
        (Err(_), _) => format!(
            "FAILED ({missing} of {} members unavailable)",
            plan.slots.len()
        ),
        (Ok(()), n) if !plan.sb.clean && plan.sb.journal.is_some() && plan.journal.is_some() => {
            format!(
                "{}not stopped cleanly: serve replays the journal first thing (no resync)",
                if n > 0 { "degraded; " } else { "healthy; " }
            )
        }
        (Ok(()), 0) if !plan.sb.clean => match plan.dirty_ranges() {
            Some(r) if r.is_empty() => "healthy; not stopped cleanly, but the write-intent \
                                        bitmap has no dirty region: nothing to resync"
                .into(),
            Some(r) => format!(
                "healthy; not stopped cleanly: serve resyncs {} bytes ({} dirty range(s) in the \
                 write-intent bitmap) first thing",
                r.iter().map(|x| x.end - x.start).sum::<u64>(),
                r.len()
            ),
            None => "healthy; not stopped cleanly: serve resyncs all of it first thing".into(),
        },
        (Ok(()), 0) => "healthy".into(),
        (Ok(()), n) if plan.check_dirty_degraded(false).is_err() => format!(
            "degraded ({n} of {} members unavailable) and not stopped cleanly: serve refuses \
             it without --start-dirty-degraded (give every member to resync)",
            plan.slots.len()
        ),
        (Ok(()), n) => format!("degraded ({n} of {} members unavailable)", plan.slots.len()),
    }
}

fn print_status(plan: &Plan) {
    let sb = &plan.sb;
    let g = sb.geometry;
    let marks: String = member_states(plan)
        .iter()
        .map(|(_, _, s)| if *s == "active" { 'U' } else { '_' })
        .collect();
    println!(
        "{} : {} {} members, chunk {}, volume {} [{}/{}] [{}]",
        sb.name,
        g.level,
        g.members,
        size::human(g.chunk),
        size::human(g.volume_size()),
        g.members - plan.missing().len(),
        g.members,
        marks
    );
    println!(
        "      uuid {}  events {}  {}  {}",
        uuid_string(&sb.array_uuid),
        sb.events,
        state_word(sb),
        health(plan)
    );
    for (i, path, st) in member_states(plan) {
        let extra = if st == "rebuilding" {
            format!(
                "  (rebuilt {} of {} units; serve resumes it)",
                sb.rebuilt[i],
                g.units()
            )
        } else {
            String::new()
        };
        println!("      [{i:>2}] {st:<10} {path}{extra}");
    }
    if sb.journal.is_some() {
        let at = plan
            .journal
            .as_ref()
            .map_or("MISSING (not given)".to_string(), |p| {
                p.display().to_string()
            });
        println!("      journal  {} {at}", journal_word(sb));
    }
    for (p, _) in &plan.spares {
        println!("      spare      {}", p.display());
    }
    for r in &plan.refused {
        println!("      refused: {r}");
    }
}

fn status_json(plan: &Plan) -> serde_json::Value {
    let sb = &plan.sb;
    let g = sb.geometry;
    json!({
        "name": sb.name,
        "array_uuid": uuid_string(&sb.array_uuid),
        "level": g.level.to_string(),
        "members": g.members,
        "chunk": g.chunk,
        "volume_size": g.volume_size(),
        "events": sb.events,
        "clean": sb.clean,
        "state": health(plan),
        "can_start": plan.can_start().is_ok(),
        "fault_tolerance": g.fault_tolerance(),
        "slots": member_states(plan).into_iter().map(|(i, p, s)| json!({"index": i, "path": p, "state": s, "rebuilt_units": (s == "rebuilding").then_some(sb.rebuilt[i])})).collect::<Vec<_>>(),
        "refused": plan.refused,
        "spares": plan.spares.iter().map(|s| s.0.display().to_string()).collect::<Vec<_>>(),
        "journal": sb.journal.map(|(u, m)| json!({
            "uuid": uuid_string(&u),
            "mode": m.name(),
            "path": plan.journal.as_ref().map(|p| p.display().to_string()),
        })),
    })
}
