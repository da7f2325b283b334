//! One file per command of `uraid` (`bench` and `serve` have theirs at the top of the
//! crate): its arguments and what it does. Here: what several of them share, which array a
//! command acts on and how it reaches the array's running server.

pub mod add;
pub mod create;
pub mod examine;
pub mod fail;
pub mod journal;
pub mod list;
pub mod monitor;
pub mod remove;
pub mod replace;
pub mod scrub;
pub mod status;
pub mod throttle;
pub mod tls;
pub mod watch;

use crate::{client, size, DEFAULT_DIR};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use uraid_core::geometry::CHUNK_DEFAULT;
use uraid_core::Level;
use uraid_engine::assemble::{self, CreateOptions, Plan};

const DEFAULT_MEMBERS: usize = 10;
const DEFAULT_MEMBER_SIZE: u64 = 1 << 30;

/// Which array, and where its server's control socket is.
#[derive(clap::Args, Clone)]
pub struct Target {
    /// Control socket of the server: unix:PATH. Default: unix:/run/uraid/NAME.sock, or
    /// unix:uraid-data/control.sock for the embedded default volume.
    #[arg(long, value_name = "unix:PATH")]
    pub control: Option<String>,
    #[command(flatten)]
    pub scan: ScanArgs,
    /// Member devices or files. None: the embedded default volume under ./uraid-data.
    pub members: Vec<PathBuf>,
}

/// Finding an array's devices by superblock instead of naming them.
#[derive(clap::Args, Clone, Default)]
pub struct ScanArgs {
    /// Find the array's devices by their superblocks: NAME or UUID. Reads the block devices
    /// in /proc/partitions and the directories given with --scan-dir; device names and
    /// order do not matter (mdadm --assemble --scan). Two arrays of one name, or two
    /// devices holding one member's superblock, are refused.
    #[arg(long, value_name = "NAME|UUID", conflicts_with = "members")]
    pub scan: Option<String>,
    /// A directory whose files and block devices --scan also reads (member files); repeat
    /// for several. Needs --scan (or `uraid serve NAME`).
    #[arg(long = "scan-dir", value_name = "DIR")]
    pub scan_dir: Vec<PathBuf>,
}

/// The devices `--scan` finds for its array (None without `--scan`), said on stderr; a
/// device that has not answered within `timeout` is left out.
pub fn scan_members(s: &ScanArgs, timeout: std::time::Duration) -> Result<Option<Vec<PathBuf>>> {
    let Some(which) = &s.scan else {
        if !s.scan_dir.is_empty() {
            bail!("--scan-dir is where --scan NAME|UUID looks; give --scan too");
        }
        return Ok(None);
    };
    let scan = assemble::scan(&s.scan_dir, true, timeout)?;
    for p in &scan.unanswered {
        eprintln!(
            "uraid: --scan: {}: no answer within {timeout:?}; left out",
            p.display()
        );
    }
    let a = scan.select(which)?;
    let paths = a.paths();
    let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    eprintln!(
        "uraid: --scan {which}: array '{}' ({}) on {}",
        a.sb.name,
        uraid_core::format::uuid_string(&a.uuid),
        list.join(", ")
    );
    Ok(Some(paths))
}

/// The members of `target` (found by `--scan`; the embedded default when none are named)
/// and whether they are the embedded default.
pub fn target_members(t: &Target) -> Result<(Vec<PathBuf>, bool)> {
    if let Some(found) = scan_members(&t.scan, assemble::DISCOVERY_TIMEOUT)? {
        return Ok((found, false));
    }
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
pub fn live_socket(plan: &Plan, t: &Target, embedded: bool) -> Result<Option<PathBuf>> {
    let Some(sock) = client::socket_for(plan, t.control.as_deref(), embedded)? else {
        return Ok(None);
    };
    Ok(client::live_status(plan, &sock)?.map(|_| sock))
}

/// A device path for a control-socket command: absolute (the server's working directory is
/// not ours) and percent-encoded.
pub fn path_query(dev: &Path) -> String {
    let abs = std::fs::canonicalize(dev).unwrap_or_else(|_| dev.to_path_buf());
    uraid_core::http::percent_encode(&abs.display().to_string())
}

/// Assembles a stopped array in this process (offline scrub and replace), with reactors.
pub fn open_here(
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
