//! Control plane: creating an array on members, reading superblocks back, and deciding which
//! members an assembly may use. One file per concern: `create.rs`, `discover.rs` (reading
//! superblocks, `plan`; the pure decision is `uraid_core::assemble`), `admin.rs` (offline member administration),
//! `journal.rs` (offline journal edits), `open.rs` (opening an assembly, journal replay),
//! `scan.rs` (finding an array's devices by superblock);
//! this file has the error type and the helpers they share.

use crate::dev::{device_size, open_exclusive, Access, BlockDev, FileDev, Holder, OpenError};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use uraid_core::format::{
    self, uuid_string, FormatError, JournalMode, MemberState, Superblock, DATA_OFFSET, SB_SIZE,
    SB_SLOTS,
};
use uraid_core::journal::{JournalSuper, JSB_SIZE, JSB_SLOTS};
use uraid_core::{Geometry, Level, MemberSet};

mod admin;
mod create;
mod discover;
mod journal;
mod open;
mod scan;

pub use admin::*;
pub use create::*;
pub use discover::*;
pub use journal::*;
pub use open::*;
pub use scan::*;

#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("{path}: {err}")]
    Io { path: String, err: io::Error },
    #[error("{path}: {err}")]
    Format { path: String, err: FormatError },
    /// A member that is write-protected, opened for writing.
    #[error(
        "{} is write-protected (a read-only block device: blockdev --getro says 1); {}",
        who(*member, path),
        crate::dev::READ_ONLY_HINT
    )]
    ReadOnly { member: usize, path: String },
    /// A member another process holds (a running `uraid serve` or `bench`, a mount, md/dm).
    #[error("{} is in use {holder}", who(*member, path))]
    Busy {
        member: usize,
        path: String,
        holder: Holder,
    },
    /// Transparent: with `{0}` and `#[from]` the message printed twice (itself, then as its
    /// own source).
    #[error(transparent)]
    Geometry(#[from] uraid_core::geometry::GeometryError),
    #[error("{path} already holds a uraid superblock (array {uuid}, '{name}'); use --force to overwrite")]
    InUse {
        path: String,
        uuid: String,
        name: String,
    },
    #[error("{path} is given twice")]
    Duplicate { path: String },
    #[error("{path}: too small ({size} bytes); a member needs at least {need}")]
    TooSmall { path: String, size: u64, need: u64 },
    /// The assembly decision refused (`uraid_core::assemble`: no members, too many
    /// missing, dirty and degraded).
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("--bitmap-chunk: {0}")]
    BitmapChunk(String),
    #[error(
        "array '{name}' uses journal device {uuid} ({mode}) and it was not given (or could not \
         be read): give its path with the members, or remove it from the array with `uraid \
         journal remove` (a dirty array then resyncs from its write-intent bitmap)"
    )]
    JournalMissing {
        name: String,
        uuid: String,
        mode: &'static str,
    },
    #[error("journal: {0}")]
    Journal(String),
    #[error("cannot add {path}: {why}")]
    AddRefused { path: String, why: String },
    #[error("{0}")]
    Refused(String),
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AssembleError + '_ {
    move |err| AssembleError::Io {
        path: path.display().to_string(),
        err,
    }
}

/// "member N (PATH)", or PATH alone for a device that is not a member slot (`usize::MAX`:
/// a journal, a spare, a device being created).
fn who(member: usize, path: &str) -> String {
    if member == usize::MAX {
        path.to_string()
    } else {
        format!("member {member} ({path})")
    }
}

/// Whether two paths name the same file (both resolve to one canonical path).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Rewrites the superblocks of a stopped array's members (offline: `uraid journal add`,
/// `remove`): `change` edits the array's superblock, which is written with the next event
/// count into each usable member's other slot and synced. Every member and `claim_also`
/// are held exclusively meanwhile (a running server is refused).
pub(super) fn rewrite_superblocks(
    plan: &Plan,
    claim_also: Option<&Path>,
    change: impl FnOnce(&mut Superblock),
) -> Result<Superblock, AssembleError> {
    rewrite_superblocks_but(plan, claim_also, None, change)
}

/// `rewrite_superblocks` leaving slot `skip` alone (a member being failed: its device may
/// not take writes, and its superblock no longer counts).
pub(super) fn rewrite_superblocks_but(
    plan: &Plan,
    claim_also: Option<&Path>,
    skip: Option<usize>,
    change: impl FnOnce(&mut Superblock),
) -> Result<Superblock, AssembleError> {
    let mut claims = Vec::new();
    for (i, p) in plan.slots.iter().enumerate() {
        if let Some(p) = p {
            claims.push(open_exclusive(p, Access::ReadWrite, false).map_err(member_open_err(i))?);
        }
    }
    if let Some(p) = claim_also {
        claims.push(
            open_exclusive(p, Access::ReadWrite, false).map_err(member_open_err(usize::MAX))?,
        );
    }
    let mut sb = plan.sb.clone();
    change(&mut sb);
    sb.events += 1;
    sb.utime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (i, p) in plan.slots.iter().enumerate() {
        let Some(p) = p else { continue };
        if plan.sb.is_failed(i) || skip == Some(i) {
            continue;
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map_err(io_err(p))?;
        let mut m = sb.clone();
        m.index = i;
        m.device_uuid = plan.device_uuids[i];
        let slot = 1 - plan.sb_slots[i];
        f.write_all_at(&m.encode(), (slot * SB_SIZE) as u64)
            .map_err(io_err(p))?;
        f.sync_all().map_err(io_err(p))?;
    }
    drop(claims);
    Ok(sb)
}

/// `len` bytes at member offset `at` of every usable member of a plan (metadata copies).
pub(super) fn read_copies(plan: &Plan, at: u64, len: usize) -> Result<Vec<Vec<u8>>, AssembleError> {
    read_copies_but(plan, at, len, &[])
}

/// `read_copies`, leaving out the members of slots `skip`.
pub(super) fn read_copies_but(
    plan: &Plan,
    at: u64,
    len: usize,
    skip: &[usize],
) -> Result<Vec<Vec<u8>>, AssembleError> {
    let mut copies = Vec::new();
    for (i, slot) in plan.slots.iter().enumerate() {
        let Some(p) = slot else { continue };
        if plan.sb.is_failed(i) || skip.contains(&i) {
            continue;
        }
        let f = File::open(p).map_err(io_err(p))?;
        let mut v = vec![0u8; len];
        if let Err(e) = f.read_exact_at(&mut v, at) {
            // A bad sector is what the copies are for: read sector by sector, and leave the
            // unreadable ones zero (no valid checksum: missing in this copy).
            tracing::warn!(
                "{}: cannot read {len} bytes of metadata at offset {at}: {e}; reading it \
                 sector by sector",
                p.display()
            );
            v.fill(0);
            for (s, sec) in v.chunks_mut(512).enumerate() {
                if f.read_exact_at(sec, at + s as u64 * 512).is_err() {
                    sec.fill(0);
                }
            }
        }
        copies.push(v);
    }
    Ok(copies)
}
