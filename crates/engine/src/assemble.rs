//! Control plane: creating an array on members, reading superblocks back, and deciding which
//! members an assembly may use.

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

#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("{path}: {err}")]
    Io { path: String, err: io::Error },
    #[error("{path}: {err}")]
    Format { path: String, err: FormatError },
    /// A member another process holds (a running `uraid serve` or `bench`, a mount, md/dm).
    #[error("member {member} ({path}) is in use {holder}")]
    Busy {
        member: usize,
        path: String,
        holder: Holder,
    },
    #[error("{0}")]
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
    #[error("no usable members: {0}")]
    NoMembers(String),
    #[error(
        "cannot start {level} array '{name}': it was not stopped cleanly and is degraded \
         (member(s) {missing:?} missing or failed): the parity of stripes being written when it \
         stopped may not match their data ({regions}), so data rebuilt for the missing \
         member(s) there could be wrong. Start it with every member (it resyncs), or pass \
         --start-dirty-degraded to serve it anyway (md's start_dirty_degraded: reads that \
         would rebuild data there then fail instead)"
    )]
    DirtyDegraded {
        level: Level,
        name: String,
        missing: Vec<usize>,
        /// Where: the dirty regions of the write-intent bitmap, or "anywhere".
        regions: String,
    },
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
    #[error("cannot start {level} array '{name}': {missing} of {members} members missing or failed, it tolerates {tolerates}")]
    TooManyMissing {
        level: Level,
        name: String,
        missing: usize,
        members: usize,
        tolerates: usize,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AssembleError + '_ {
    move |err| AssembleError::Io {
        path: path.display().to_string(),
        err,
    }
}

/// Options for `create`.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub level: Level,
    pub chunk: u64,
    pub name: String,
    pub force: bool,
    /// Write-intent bitmap region size in member bytes: None picks the default
    /// (`uraid_core::bitmap::default_chunk`), Some(0) creates no bitmap.
    pub bitmap_chunk: Option<u64>,
    /// A journal device and its mode (parity levels only).
    pub journal: Option<(PathBuf, JournalMode)>,
}

/// Reads and validates the superblock of `path`: the fresher valid one of its two slots.
pub fn read_superblock(path: &Path) -> Result<Superblock, AssembleError> {
    read_superblock_slot(path).map(|(sb, _)| sb)
}

/// Like `read_superblock`, also saying which slot it came from.
pub fn read_superblock_slot(path: &Path) -> Result<(Superblock, usize), AssembleError> {
    let f = File::open(path).map_err(io_err(path))?;
    let mut b = vec![0u8; SB_SIZE * SB_SLOTS];
    f.read_exact_at(&mut b, 0).map_err(io_err(path))?;
    format::pick_superblock_slot(&b[..SB_SIZE], &b[SB_SIZE..]).map_err(|err| {
        AssembleError::Format {
            path: path.display().to_string(),
            err,
        }
    })
}

/// Writes a new array's superblocks to `paths` (in member order) and zeroes the data areas so
/// that parity starts consistent. Refuses members that hold a superblock unless `force`.
pub fn create(paths: &[PathBuf], opts: &CreateOptions) -> Result<Superblock, AssembleError> {
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].iter().any(|q| same_file(p, q)) {
            return Err(AssembleError::Duplicate {
                path: p.display().to_string(),
            });
        }
    }
    let mut files = Vec::with_capacity(paths.len());
    let mut min_size = u64::MAX;
    for p in paths {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map_err(io_err(p))?;
        let size = device_size(&f).map_err(io_err(p))?;
        let need = DATA_OFFSET + opts.chunk;
        if size < need {
            return Err(AssembleError::TooSmall {
                path: p.display().to_string(),
                size,
                need,
            });
        }
        if !opts.force {
            if let Ok(sb) = read_superblock(p) {
                return Err(AssembleError::InUse {
                    path: p.display().to_string(),
                    uuid: uuid_string(&sb.array_uuid),
                    name: sb.name,
                });
            }
        }
        min_size = min_size.min(size);
        files.push(f);
    }
    let geometry = Geometry::new(opts.level, paths.len(), opts.chunk, min_size - DATA_OFFSET)?;
    let bitmap_chunk = opts
        .bitmap_chunk
        .unwrap_or_else(|| uraid_core::bitmap::default_chunk(&geometry));
    uraid_core::bitmap::check_chunk(&geometry, bitmap_chunk).map_err(AssembleError::BitmapChunk)?;
    let array_uuid = *uuid::Uuid::new_v4().as_bytes();
    let journal = match &opts.journal {
        Some((jp, mode)) => {
            if paths.iter().any(|q| same_file(jp, q)) {
                return Err(AssembleError::Duplicate {
                    path: jp.display().to_string(),
                });
            }
            check_journal_target(geometry.level, jp, opts.force)?;
            let uuid = *uuid::Uuid::new_v4().as_bytes();
            write_new_journal(jp, &geometry, array_uuid, uuid)?;
            Some((uuid, *mode))
        }
        None => None,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut sb = Superblock {
        array_uuid,
        name: opts.name.chars().take(format::NAME_LEN).collect(),
        geometry,
        index: 0,
        clean: true,
        spare: false,
        data_offset: DATA_OFFSET,
        events: 1,
        ctime: now,
        utime: now,
        device_uuid: [0; 16],
        states: vec![MemberState::Active; paths.len()],
        rebuilt: vec![0; paths.len()],
        slot_uuids: (0..paths.len())
            .map(|_| *uuid::Uuid::new_v4().as_bytes())
            .collect(),
        bitmap_chunk,
        journal,
    };
    while sb.name.len() > format::NAME_LEN {
        sb.name.pop();
    }
    for (i, (f, p)) in files.iter().zip(paths).enumerate() {
        zero_range(f, DATA_OFFSET, geometry.member_data).map_err(io_err(p))?;
        f.write_all_at(
            &crate::alloc::empty_map_image(&geometry),
            uraid_core::alloc::MAP_OFFSET,
        )
        .map_err(io_err(p))?;
        f.write_all_at(
            &uraid_core::bitmap::empty_image(&geometry, bitmap_chunk),
            uraid_core::bitmap::BITMAP_OFFSET,
        )
        .map_err(io_err(p))?;
        sb.index = i;
        sb.device_uuid = sb.slot_uuids[i];
        for slot in 0..SB_SLOTS {
            f.write_all_at(&sb.encode(), (slot * SB_SIZE) as u64)
                .map_err(io_err(p))?;
        }
        f.sync_all().map_err(io_err(p))?;
    }
    sb.index = 0;
    Ok(sb)
}

/// Whether two paths name the same file (both resolve to one canonical path).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Zeroes `[off, off + len)`: hole punching on files (also extends sparse files), BLKZEROOUT
/// on block devices.
fn zero_range(f: &File, off: u64, len: u64) -> io::Result<()> {
    if f.metadata()?.file_type().is_block_device() {
        let range: [u64; 2] = [off, len];
        // SAFETY: BLKZEROOUT reads two u64s (start, length) through the pointer.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x127f, range.as_ptr()) };
        return if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
    }
    // SAFETY: plain fallocate syscall on an fd we own.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
    };
    if r < 0 {
        // Filesystems without hole punching: write zeros.
        let zeros = vec![0u8; 1 << 20];
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(zeros.len() as u64) as usize;
            f.write_all_at(&zeros[..n], pos)?;
            pos += n as u64;
        }
    }
    Ok(())
}

/// One member as found on disk.
#[derive(Debug)]
pub struct Found {
    pub path: PathBuf,
    pub sb: Superblock,
    /// The superblock slot `sb` was read from.
    pub slot: usize,
}

/// The outcome of examining a set of member paths: which members the array can use, and why
/// every other path is left out.
#[derive(Debug)]
pub struct Plan {
    /// The freshest superblock (highest event count) of the array.
    pub sb: Superblock,
    /// Path for each member slot, None when missing.
    pub slots: Vec<Option<PathBuf>>,
    pub device_uuids: Vec<[u8; 16]>,
    /// Per slot: the superblock slot its member's freshest superblock is in, and its events.
    pub sb_slots: Vec<usize>,
    pub member_events: Vec<u64>,
    /// Human-readable reasons for paths that were refused.
    pub refused: Vec<String>,
    /// The write-intent bitmap merged from the usable members (`load_bitmap`; bit r of word
    /// r/64: region r dirty). None: no bitmap, or not read.
    pub bitmap: Option<Vec<u64>>,
    /// The array's journal device among the paths given (its superblock names this
    /// array and the journal the array's superblock records).
    pub journal: Option<PathBuf>,
    /// Hot spares of this array among the paths given, with their device uuids.
    pub spares: Vec<(PathBuf, [u8; 16])>,
}

impl Plan {
    /// Member identities for `Array::new`.
    pub fn ids(&self) -> Vec<crate::MemberId> {
        (0..self.slots.len())
            .map(|i| crate::MemberId {
                uuid: self.device_uuids[i],
                sb_slot: self.sb_slots[i],
                events: self.member_events[i],
            })
            .collect()
    }

    /// Slots without a member that holds all of its data: missing, failed, or being
    /// rebuilt.
    pub fn missing(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| {
                self.slots[i].is_none() || self.sb.is_failed(i) || self.sb.is_rebuilding(i)
            })
            .collect()
    }

    /// md's rule for parity levels: an array that was not stopped cleanly and is degraded
    /// cannot be trusted where writes were in flight (the write hole): refused unless
    /// `allow`. The write-intent bitmap says where that was; with no dirty region the start
    /// is safe, without a bitmap it could be anywhere.
    pub fn check_dirty_degraded(&self, allow: bool) -> Result<(), AssembleError> {
        let missing = self.missing();
        if allow || self.sb.clean || !self.sb.geometry.level.is_parity() || missing.is_empty() {
            return Ok(());
        }
        if self.sb.journal.is_some() && self.journal.is_some() {
            // Replay makes every stripe consistent before anything is read (or the start
            // fails if the journal cannot be replayed).
            return Ok(());
        }
        // Members being rebuilt hold every unit below their checkpoint: dirty units there
        // are resynced with them, only those above count as degraded.
        let absent = (0..self.slots.len()).any(|i| self.slots[i].is_none() || self.sb.is_failed(i));
        let below = (0..self.slots.len())
            .filter(|&i| self.sb.is_rebuilding(i))
            .map(|i| self.sb.rebuilt[i])
            .min()
            .unwrap_or(0);
        let dirty = self.dirty_ranges().map(|r| {
            let sdb = self.sb.geometry.stripe_data_bytes();
            if absent {
                r
            } else {
                r.into_iter()
                    .filter(|x| x.end > below * sdb)
                    .collect::<Vec<_>>()
            }
        });
        let regions = match dirty {
            Some(r) if r.is_empty() => return Ok(()),
            Some(r) => describe_ranges(&r),
            None => "anywhere: the array has no write-intent bitmap".into(),
        };
        Err(AssembleError::DirtyDegraded {
            level: self.sb.geometry.level,
            name: self.sb.name.clone(),
            missing,
            regions,
        })
    }

    /// Volume byte ranges of the dirty bitmap regions; None without a bitmap.
    pub fn dirty_ranges(&self) -> Option<Vec<std::ops::Range<u64>>> {
        let bc = self.sb.bitmap_chunk;
        let words = self.bitmap.as_ref().filter(|_| bc > 0)?;
        let g = &self.sb.geometry;
        let sdb = g.stripe_data_bytes();
        Some(
            uraid_core::bitmap::dirty_units(g, bc, words)
                .into_iter()
                .map(|u| u.start * sdb..u.end * sdb)
                .collect(),
        )
    }

    pub fn can_start(&self) -> Result<(), AssembleError> {
        let g = self.sb.geometry;
        let mask = self.missing().iter().fold(0u64, |m, &i| m | 1 << i);
        if g.can_serve(mask) {
            Ok(())
        } else {
            Err(AssembleError::TooManyMissing {
                level: g.level,
                name: self.sb.name.clone(),
                missing: mask.count_ones() as usize,
                members: g.members,
                tolerates: g.fault_tolerance(),
            })
        }
    }
}

/// Reads every path's superblock and decides the assembly (`decide`, without `--force`).
pub fn plan(paths: &[PathBuf]) -> Result<Plan, AssembleError> {
    plan_with(paths, false)
}

/// Like `plan`; `force` also takes stale members and members the array marked failed, the
/// freshest first, as far as needed to start (mdadm --assemble --force). Logged.
pub fn plan_with(paths: &[PathBuf], force: bool) -> Result<Plan, AssembleError> {
    let mut found = Vec::new();
    let mut refused = Vec::new();
    let mut journals = Vec::new();
    for p in paths {
        match read_superblock_slot(p) {
            Ok((sb, slot)) => found.push(Found {
                path: p.clone(),
                sb,
                slot,
            }),
            Err(e) => match read_journal_super(p) {
                Ok(j) => journals.push((p.clone(), j)),
                Err(_) => refused.push(format!("{e}")),
            },
        }
    }
    let mut plan = decide(found, refused, force)?;
    for (p, j) in journals {
        let ours = plan
            .sb
            .journal
            .is_some_and(|(u, _)| u == j.journal_uuid && j.array_uuid == plan.sb.array_uuid);
        if ours && plan.journal.is_none() {
            plan.journal = Some(p);
        } else {
            plan.refused.push(format!(
                "{}: journal {} of array {}, not a journal of this array",
                p.display(),
                uuid_string(&j.journal_uuid),
                uuid_string(&j.array_uuid)
            ));
        }
    }
    plan.bitmap = load_bitmap(&plan)?;
    Ok(plan)
}

/// Reads the journal superblock of `path` (the fresher valid slot).
pub fn read_journal_super(path: &Path) -> Result<JournalSuper, AssembleError> {
    let f = File::open(path).map_err(io_err(path))?;
    let mut b = vec![0u8; JSB_SIZE * JSB_SLOTS];
    f.read_exact_at(&mut b, 0).map_err(io_err(path))?;
    uraid_core::journal::pick_super(&b[..JSB_SIZE], &b[JSB_SIZE..])
        .map_err(|e| AssembleError::Journal(format!("{}: {e}", path.display())))
}

/// Whether `path` may become a journal of a `level` array: parity levels only, and (unless
/// `force`) not a device that holds a uraid superblock or journal.
fn check_journal_target(level: Level, path: &Path, force: bool) -> Result<(), AssembleError> {
    if !level.is_parity() {
        return Err(AssembleError::Journal(format!(
            "{level} has no parity and so no write hole: a journal is for RAID5, RAID6, RAID7.3 \
             and ec levels"
        )));
    }
    if force {
        return Ok(());
    }
    let held = read_superblock(path)
        .map(|sb| (sb.array_uuid, sb.name))
        .or_else(|_| read_journal_super(path).map(|j| (j.array_uuid, "journal".to_string())));
    match held {
        Ok((uuid, name)) => Err(AssembleError::InUse {
            path: path.display().to_string(),
            uuid: uuid_string(&uuid),
            name,
        }),
        Err(_) => Ok(()),
    }
}

/// Formats `path` as a journal of the array `array_uuid` (both superblock slots, synced).
fn write_new_journal(
    path: &Path,
    g: &Geometry,
    array_uuid: [u8; 16],
    journal_uuid: [u8; 16],
) -> Result<JournalSuper, AssembleError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    let size = device_size(&f).map_err(io_err(path))?;
    let need = uraid_core::journal::LOG_START + uraid_core::journal::min_log(g.members, g.chunk);
    if size < need {
        return Err(AssembleError::TooSmall {
            path: path.display().to_string(),
            size,
            need,
        });
    }
    let mut sb = JournalSuper::new(array_uuid, journal_uuid, size);
    for gen in [2, 1] {
        sb.gen = gen;
        f.write_all_at(&sb.encode(), (sb.slot() * JSB_SIZE) as u64)
            .map_err(io_err(path))?;
    }
    // A stale record at the log start must never look like one of this journal's: the
    // journal uuid is new, but the epoch and sequence numbers start over.
    f.write_all_at(&[0u8; 4096], uraid_core::journal::LOG_START)
        .map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))?;
    Ok(sb)
}

/// Rewrites the superblocks of a stopped array's members (offline: `uraid journal add`,
/// `remove`): `change` edits the array's superblock, which is written with the next event
/// count into each usable member's other slot and synced. Every member and `claim_also`
/// are held exclusively meanwhile (a running server is refused).
fn rewrite_superblocks(
    plan: &Plan,
    claim_also: Option<&Path>,
    change: impl FnOnce(&mut Superblock),
) -> Result<Superblock, AssembleError> {
    rewrite_superblocks_but(plan, claim_also, None, change)
}

/// `rewrite_superblocks` leaving slot `skip` alone (a member being failed: its device may
/// not take writes, and its superblock no longer counts).
fn rewrite_superblocks_but(
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

/// Adds a journal device to a stopped, cleanly shut down parity array (`uraid journal
/// add`): formats it, then records it in the members' superblocks.
pub fn add_journal(
    plan: &Plan,
    path: &Path,
    mode: JournalMode,
    force: bool,
) -> Result<Superblock, AssembleError> {
    let g = plan.sb.geometry;
    if let Some((u, m)) = plan.sb.journal {
        return Err(AssembleError::Journal(format!(
            "array '{}' already has journal {} ({}); remove it first",
            plan.sb.name,
            uuid_string(&u),
            m.name()
        )));
    }
    if !plan.sb.clean {
        return Err(AssembleError::Journal(format!(
            "array '{}' was not stopped cleanly: serve it once with every member (it resyncs) \
             and stop it, then add the journal",
            plan.sb.name
        )));
    }
    if plan.slots.iter().flatten().any(|q| same_file(path, q)) {
        return Err(AssembleError::Duplicate {
            path: path.display().to_string(),
        });
    }
    check_journal_target(g.level, path, force)?;
    let uuid = *uuid::Uuid::new_v4().as_bytes();
    let _claim =
        open_exclusive(path, Access::ReadWrite, false).map_err(member_open_err(usize::MAX))?;
    write_new_journal(path, &g, plan.sb.array_uuid, uuid)?;
    drop(_claim);
    rewrite_superblocks(plan, None, |sb| sb.journal = Some((uuid, mode)))
}

/// Removes the journal from a stopped array (`uraid journal remove`). Refused unless the
/// array was stopped cleanly (its journal then holds nothing the members lack) or `force`
/// (a dirty array then resyncs from its bitmap; with a write-back journal, writes that were
/// acknowledged but only in the journal are lost).
pub fn remove_journal(plan: &Plan, force: bool) -> Result<Superblock, AssembleError> {
    let Some((u, mode)) = plan.sb.journal else {
        return Err(AssembleError::Journal(format!(
            "array '{}' has no journal",
            plan.sb.name
        )));
    };
    if !plan.sb.clean && !force {
        return Err(AssembleError::Journal(format!(
            "array '{}' was not stopped cleanly and its journal {} ({}) may hold updates the \
             members lack: serve it once with the journal (replay), stop it, then remove it; \
             --force removes it anyway (dirty regions are resynced from the bitmap{})",
            plan.sb.name,
            uuid_string(&u),
            mode.name(),
            if mode == JournalMode::WriteBack {
                "; writes acknowledged only to the write-back journal are lost"
            } else {
                ""
            }
        )));
    }
    rewrite_superblocks(plan, plan.journal.as_deref(), |sb| sb.journal = None)
}

/// A random device uuid for a new member.
pub fn new_device_uuid() -> [u8; 16] {
    *uuid::Uuid::new_v4().as_bytes()
}

/// The array's superblock after `new_uuid` was added into `slot`: the slot rebuilding from
/// unit 0 (pure; `add_member` and the simulator's images use it). Events are not moved.
pub fn with_new_member(sb: &Superblock, slot: usize, new_uuid: [u8; 16]) -> Superblock {
    let mut sb = sb.clone();
    sb.states[slot] = MemberState::Rebuilding;
    sb.rebuilt[slot] = 0;
    sb.slot_uuids[slot] = new_uuid;
    sb
}

/// The slot a new member goes into: the lowest failed or missing one (not one being rebuilt:
/// it has its member).
pub fn slot_to_fill(plan: &Plan) -> Option<usize> {
    (0..plan.slots.len()).find(|&i| plan.slots[i].is_none() || plan.sb.is_failed(i))
}

/// Adds `path` to a stopped array in its lowest failed or missing slot (`uraid add`, mdadm
/// --add): the member metadata (allocation map, write-intent bitmap) is copied from a
/// member, the other members' superblocks record the slot as rebuilding with `path`'s new
/// device uuid, then `path` gets its superblock. The next `serve` rebuilds it while serving
/// (recovery/rebuild.rs). A crash between the two steps leaves the slot rebuilding without
/// its member: missing, as before; `add` again. Refused: RAID0, no slot to fill, an array
/// that could not start, a device too small, one given twice, one holding a uraid
/// superblock or journal (unless `force`).
pub fn add_member(
    plan: &Plan,
    path: &Path,
    force: bool,
) -> Result<(usize, Superblock), AssembleError> {
    let g = plan.sb.geometry;
    let refuse = |why: String| AssembleError::AddRefused {
        path: path.display().to_string(),
        why,
    };
    if g.fault_tolerance() == 0 {
        return Err(refuse(format!(
            "{} has no redundancy: there is nothing to rebuild a member from",
            g.level
        )));
    }
    let Some(slot) = slot_to_fill(plan) else {
        return Err(refuse(format!(
            "array '{}' has no failed or missing member to replace (add it as a spare)",
            plan.sb.name
        )));
    };
    if !plan.sb.is_failed(slot) && !plan.sb.is_rebuilding(slot) && !force {
        // Missing only: perhaps just not given. Replacing it throws its data away.
        return Err(refuse(format!(
            "member {slot} of array '{}' is missing, not failed: give it with the others if it \
             still exists, or pass --force to replace it",
            plan.sb.name
        )));
    }
    check_new_device(plan, path, force)?;
    // The member metadata between the superblocks and the data area, from a member that
    // holds all of it.
    let src = (0..g.members)
        .find(|&i| plan.slots[i].is_some() && !plan.missing().contains(&i))
        .and_then(|i| plan.slots[i].clone())
        .ok_or_else(|| refuse("no member to copy the array metadata from".into()))?;
    let meta_at = (SB_SIZE * SB_SLOTS) as u64;
    let mut meta = vec![0u8; (plan.sb.data_offset - meta_at) as usize];
    File::open(&src)
        .and_then(|f| f.read_exact_at(&mut meta, meta_at))
        .map_err(io_err(&src))?;
    let uuid = new_device_uuid();
    let f = claim_for_writing(path, slot)?;
    // No stale superblock may survive in either slot while the others are rewritten.
    f.write_all_at(&vec![0u8; SB_SIZE * SB_SLOTS], 0)
        .map_err(io_err(path))?;
    f.write_all_at(&meta, meta_at).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))?;
    let sb = rewrite_superblocks(plan, None, |sb| *sb = with_new_member(sb, slot, uuid))?;
    let mut m = sb.clone();
    m.index = slot;
    m.device_uuid = uuid;
    for s in 0..SB_SLOTS {
        f.write_all_at(&m.encode(), (s * SB_SIZE) as u64)
            .map_err(io_err(path))?;
    }
    f.sync_all().map_err(io_err(path))?;
    Ok((slot, sb))
}

/// What a new member or spare must be: an array that could start, a device given once,
/// large enough, not a member of this array already, and (unless `force`) holding no uraid
/// superblock or journal.
fn check_new_device(plan: &Plan, path: &Path, force: bool) -> Result<(), AssembleError> {
    let g = plan.sb.geometry;
    let refuse = |why: String| AssembleError::AddRefused {
        path: path.display().to_string(),
        why,
    };
    plan.can_start()?;
    if plan
        .slots
        .iter()
        .flatten()
        .chain(plan.journal.iter())
        .chain(plan.spares.iter().map(|s| &s.0))
        .any(|q| same_file(path, q))
    {
        return Err(AssembleError::Duplicate {
            path: path.display().to_string(),
        });
    }
    let need = plan.sb.data_offset + g.member_data;
    let size = {
        let f = File::open(path).map_err(io_err(path))?;
        device_size(&f).map_err(io_err(path))?
    };
    if size < need {
        return Err(AssembleError::TooSmall {
            path: path.display().to_string(),
            size,
            need,
        });
    }
    if let Ok(sb) = read_superblock(path) {
        if sb.array_uuid == plan.sb.array_uuid
            && plan.sb.slot_uuids.get(sb.index) == Some(&sb.device_uuid)
            && !plan.sb.is_failed(sb.index)
        {
            return Err(refuse(format!(
                "it is already member {} of array '{}'; give it with the other members",
                sb.index, plan.sb.name
            )));
        }
    }
    if !force {
        if let Ok(sb) = read_superblock(path) {
            // A former member of this array (failed, replaced or removed) comes back as a
            // new member: its old data is never used (the slot is rebuilt from unit 0).
            let former = sb.array_uuid == plan.sb.array_uuid
                && !sb.spare
                && (plan.sb.is_failed(sb.index)
                    || plan.sb.slot_uuids.get(sb.index) != Some(&sb.device_uuid));
            if former {
                return Ok(());
            }
            return Err(refuse(format!(
                "it holds a uraid superblock (array {} '{}', member {}); --force overwrites it",
                uuid_string(&sb.array_uuid),
                sb.name,
                sb.index
            )));
        }
        if read_journal_super(path).is_ok() {
            return Err(refuse(
                "it holds a uraid journal; --force overwrites it".into(),
            ));
        }
    }
    Ok(())
}

/// What a replace of member `i` of a stopped array by `path` must meet: an active member
/// (not failed, missing or rebuilding), and a device `add` would take.
pub fn check_replacement(
    plan: &Plan,
    i: usize,
    path: &Path,
    force: bool,
) -> Result<(), AssembleError> {
    let g = plan.sb.geometry;
    let refuse = |why: String| AssembleError::AddRefused {
        path: path.display().to_string(),
        why,
    };
    if i >= g.members {
        return Err(refuse(format!(
            "no member {i}: the array has {}",
            g.members
        )));
    }
    if g.fault_tolerance() == 0 {
        return Err(refuse(format!(
            "{} has no redundancy: a chunk the member cannot read could not be rebuilt",
            g.level
        )));
    }
    if plan.missing().contains(&i) {
        return Err(refuse(format!(
            "member {i} is failed, missing or being rebuilt: add a device instead (uraid add)"
        )));
    }
    check_new_device(plan, path, force)
}

/// Adds `path` to a stopped array as a hot spare (`uraid add` when no member is failed or
/// missing): it gets a copy of the array's superblock marked spare, with its own device
/// uuid; given with the members to `serve`, it takes over the slot of the next member that
/// fails. The members' superblocks do not change.
pub fn add_spare(plan: &Plan, path: &Path, force: bool) -> Result<Superblock, AssembleError> {
    let g = plan.sb.geometry;
    if g.fault_tolerance() == 0 {
        return Err(AssembleError::AddRefused {
            path: path.display().to_string(),
            why: format!(
                "{} has no redundancy: a spare could never be rebuilt",
                g.level
            ),
        });
    }
    check_new_device(plan, path, force)?;
    let f = claim_for_writing(path, usize::MAX)?;
    let sb = spare_superblock(&plan.sb, new_device_uuid());
    for s in 0..SB_SLOTS {
        f.write_all_at(&sb.encode(), (s * SB_SIZE) as u64)
            .map_err(io_err(path))?;
    }
    f.sync_all().map_err(io_err(path))?;
    Ok(sb)
}

/// The superblock a spare of the array `sb` describes carries.
pub fn spare_superblock(sb: &Superblock, uuid: [u8; 16]) -> Superblock {
    let mut s = sb.clone();
    s.spare = true;
    s.index = 0;
    s.device_uuid = uuid;
    s
}

/// Refuses a member index the array does not have.
fn check_index(plan: &Plan, i: usize) -> Result<(), AssembleError> {
    let n = plan.sb.geometry.members;
    if i >= n {
        return Err(AssembleError::Refused(format!(
            "no member {i}: the array has {n}"
        )));
    }
    Ok(())
}

/// Marks member `i` of a stopped array failed in the superblocks (`uraid fail`, mdadm
/// --fail). Refused: an unknown, missing or already failed member, one the array cannot
/// lose, and without `force` one that would leave no redundancy.
pub fn fail_member(plan: &Plan, i: usize, force: bool) -> Result<Superblock, AssembleError> {
    let g = plan.sb.geometry;
    let refuse = AssembleError::Refused;
    check_index(plan, i)?;
    let missing = plan.missing();
    if missing.contains(&i) && !plan.sb.is_rebuilding(i) {
        return Err(refuse(format!("member {i} is already failed or missing")));
    }
    let lost: uraid_core::MemberSet = missing.into_iter().filter(|&x| x != i).collect();
    g.check_fail(lost, i, force).map_err(refuse)?;
    rewrite_superblocks_but(plan, None, Some(i), |sb| {
        sb.states[i] = MemberState::Failed;
        sb.rebuilt[i] = 0;
    })
}

/// Removes member `i` from a stopped array (`uraid remove`, mdadm --remove): the
/// superblocks record its slot failed with no device (`REMOVED_SLOT`), so the old device is
/// refused at assembly and the slot waits for `add`. An active member is failed in the same
/// round, with `fail_member`'s refusals. The removed device itself is not written (its
/// data stays as it was; `add` takes it back as a new member).
pub fn remove_member(plan: &Plan, i: usize, force: bool) -> Result<Superblock, AssembleError> {
    let g = plan.sb.geometry;
    let refuse = AssembleError::Refused;
    check_index(plan, i)?;
    if plan.sb.is_removed(i) {
        return Err(refuse(format!("member {i} was removed already")));
    }
    let missing = plan.missing();
    if !plan.sb.is_failed(i) {
        // Active, rebuilding, or missing without a failure on disk: it is failed too.
        let lost: uraid_core::MemberSet = missing.into_iter().filter(|&x| x != i).collect();
        g.check_fail(lost, i, force).map_err(refuse)?;
    }
    rewrite_superblocks_but(plan, None, Some(i), |sb| {
        sb.states[i] = MemberState::Failed;
        sb.rebuilt[i] = 0;
        sb.slot_uuids[i] = uraid_core::format::REMOVED_SLOT;
    })
}

/// Removes the hot spare at `path` from a stopped array: its superblocks are erased (a
/// spare holds no data). Refused: a path that is not one of the array's spares.
pub fn remove_spare(plan: &Plan, path: &Path) -> Result<(), AssembleError> {
    if !plan.spares.iter().any(|s| same_file(&s.0, path)) {
        return Err(AssembleError::Refused(format!(
            "{} is not a spare of array '{}' (give it with the members)",
            path.display(),
            plan.sb.name
        )));
    }
    erase_superblocks(path)
}

/// Opens a device that is to become (or stop being) part of the array for writing, claimed
/// exclusively (the claim lasts as long as the file). `slot`: for the message
/// (`usize::MAX`: not a member slot).
fn claim_for_writing(path: &Path, slot: usize) -> Result<File, AssembleError> {
    open_exclusive(path, Access::ReadWrite, false).map_err(member_open_err(slot))
}

/// Zeroes both superblock slots of `path` and syncs (a removed spare).
pub fn erase_superblocks(path: &Path) -> Result<(), AssembleError> {
    let f = claim_for_writing(path, usize::MAX)?;
    f.write_all_at(&vec![0u8; SB_SIZE * SB_SLOTS], 0)
        .map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// "N regions dirty: volume bytes a..b, c..d, ..." (the first few ranges).
pub fn describe_ranges(r: &[std::ops::Range<u64>]) -> String {
    let bytes: u64 = r.iter().map(|x| x.end - x.start).sum();
    let mut s = format!(
        "write-intent bitmap: {} dirty range(s), {bytes} bytes: volume bytes ",
        r.len()
    );
    let shown: Vec<String> = r
        .iter()
        .take(4)
        .map(|x| format!("{}..{}", x.start, x.end))
        .collect();
    s.push_str(&shown.join(", "));
    if r.len() > 4 {
        s.push_str(", ...");
    }
    s
}

/// Reads the write-intent bitmap from every usable member of a plan and merges the copies
/// (`uraid_core::bitmap::merge_copies`); None when the array has no bitmap. Sectors with no
/// valid copy count as dirty (logged).
pub fn load_bitmap(plan: &Plan) -> Result<Option<Vec<u64>>, AssembleError> {
    let g = plan.sb.geometry;
    let bc = plan.sb.bitmap_chunk;
    if bc == 0 {
        return Ok(None);
    }
    let len = uraid_core::bitmap::pages(&g, bc) * uraid_core::alloc::PAGE;
    let copies = read_copies(plan, uraid_core::bitmap::BITMAP_OFFSET, len)?;
    let (words, bad) = uraid_core::bitmap::merge_copies(&g, bc, &copies);
    if bad > 0 {
        tracing::warn!(
            "write-intent bitmap: {bad} sector(s) had no valid copy on any member; their regions \
             count as dirty"
        );
    }
    Ok(Some(words))
}

/// Decides an assembly from the superblocks found (pure; the crash tests call it on member
/// images). Members may be given in any order. Foreign members (another array), stale
/// members (event count more than one behind) and members the array marked failed are
/// refused with a reason. A member exactly one event behind missed only the last superblock
/// round (a round is written to all members at once and a crash can tear it): it is taken,
/// as md does (its data is current: a round completes before anything that depends on it).
pub fn decide(
    found: Vec<Found>,
    mut refused: Vec<String>,
    force: bool,
) -> Result<Plan, AssembleError> {
    // The array is the one most of the given members belong to (ties: the freshest); its
    // truth is its member with the highest event count.
    // Spares carry a copy of the superblock of when they were added: never the truth.
    let votes = |u: &[u8; 16]| {
        found
            .iter()
            .filter(|f| !f.sb.spare && &f.sb.array_uuid == u)
            .count()
    };
    let Some(best) = found
        .iter()
        .filter(|f| !f.sb.spare)
        .max_by_key(|f| (votes(&f.sb.array_uuid), f.sb.events))
    else {
        return Err(AssembleError::NoMembers(refused.join("; ")));
    };
    let mut sb = best.sb.clone();
    let mut slots: Vec<Option<PathBuf>> = vec![None; sb.geometry.members];
    let mut device_uuids = vec![[0u8; 16]; sb.geometry.members];
    let mut sb_slots = vec![0usize; sb.geometry.members];
    let mut member_events = vec![0u64; sb.geometry.members];
    // Two copies of one slot: the fresher is considered first.
    let mut found = found;
    found.sort_by_key(|f| std::cmp::Reverse(f.sb.events));
    // Refused for staleness or a failed mark: candidates for --force.
    let mut forceable: Vec<(&Found, String)> = Vec::new();
    let mut spares = Vec::new();
    for f in &found {
        let p = f.path.display();
        if f.sb.spare {
            if f.sb.array_uuid != sb.array_uuid || f.sb.geometry != sb.geometry {
                refused.push(format!(
                    "{p}: a spare of array {} ('{}'), not of this one",
                    uuid_string(&f.sb.array_uuid),
                    f.sb.name
                ));
            } else if sb.slot_uuids.contains(&f.sb.device_uuid) {
                refused.push(format!("{p}: a spare that became a member since"));
            } else {
                spares.push((f.path.clone(), f.sb.device_uuid));
            }
            continue;
        }
        if f.sb.array_uuid != sb.array_uuid {
            refused.push(format!(
                "{p}: belongs to array {} ('{}'), not {} ('{}')",
                uuid_string(&f.sb.array_uuid),
                f.sb.name,
                uuid_string(&sb.array_uuid),
                sb.name
            ));
        } else if f.sb.geometry != sb.geometry {
            refused.push(format!(
                "{p}: geometry disagrees with the array's freshest superblock"
            ));
        } else if sb.is_removed(f.sb.index) {
            refused.push(format!(
                "{p}: was member {} but was removed from the array (uraid add takes it back \
                 as a new member)",
                f.sb.index
            ));
        } else if sb.slot_uuids[f.sb.index] != [0; 16]
            && sb.slot_uuids[f.sb.index] != f.sb.device_uuid
        {
            refused.push(format!(
                "{p}: was member {} (device {}) but the array replaced it with device {}",
                f.sb.index,
                uuid_string(&f.sb.device_uuid),
                uuid_string(&sb.slot_uuids[f.sb.index])
            ));
        } else if slots[f.sb.index].is_some() {
            refused.push(format!("{p}: duplicate of member {}", f.sb.index));
        } else if sb.is_failed(f.sb.index) {
            forceable.push((
                f,
                format!(
                    "{p}: member {} is marked failed in the array (events {})",
                    f.sb.index, sb.events
                ),
            ));
        } else if f.sb.events + 1 < sb.events {
            forceable.push((
                f,
                format!(
                    "{p}: stale member {} (events {} < array's {})",
                    f.sb.index, f.sb.events, sb.events
                ),
            ));
        } else {
            if f.sb.events < sb.events {
                tracing::info!(
                    "{p}: member {} is one event behind ({} < {}): it missed the last \
                     superblock round; taking it",
                    f.sb.index,
                    f.sb.events,
                    sb.events
                );
            }
            slots[f.sb.index] = Some(f.path.clone());
            device_uuids[f.sb.index] = f.sb.device_uuid;
            sb_slots[f.sb.index] = f.slot;
            member_events[f.sb.index] = f.sb.events;
        }
    }
    forceable.sort_by_key(|(f, _)| std::cmp::Reverse(f.sb.events));
    for (f, why) in forceable {
        let i = f.sb.index;
        let startable = {
            let probe = Plan {
                sb: sb.clone(),
                slots: slots.clone(),
                device_uuids: device_uuids.clone(),
                sb_slots: sb_slots.clone(),
                member_events: member_events.clone(),
                refused: Vec::new(),
                bitmap: None,
                journal: None,
                spares: Vec::new(),
            };
            probe.can_start().is_ok()
        };
        if f.sb.is_rebuilding(i) {
            // Its own superblock says it holds only part of the data: never forced in.
            refused.push(format!(
                "{why}; it was being rebuilt (rebuilt {} of {} units), so it is not taken even \
                 with --force",
                f.sb.rebuilt[i],
                sb.geometry.units()
            ));
        } else if force && !startable && slots[i].is_none() {
            tracing::warn!("--force: {why}; taking it anyway (its data may be out of date)");
            refused.push(format!("{why}; FORCED into the array"));
            sb.states[i] = MemberState::Active;
            slots[i] = Some(f.path.clone());
            device_uuids[i] = f.sb.device_uuid;
            sb_slots[i] = f.slot;
            member_events[i] = f.sb.events;
        } else {
            refused.push(why);
        }
    }
    Ok(Plan {
        sb,
        slots,
        device_uuids,
        sb_slots,
        member_events,
        refused,
        bitmap: None,
        journal: None,
        spares,
    })
}

/// Opens the members of a plan with O_DIRECT for reading and writing, each exclusively
/// (`FileDev::open`): a member another process holds is `AssembleError::Busy`.
pub fn open_members(plan: &Plan) -> Result<Vec<Option<FileDev>>, AssembleError> {
    open_members_with(plan, Access::ReadWrite)
}

/// `open_members` with the access mode given; `Access::ReadOnly` members can never be
/// changed through this process (a run that only reads leaves them byte-identical).
pub fn open_members_with(
    plan: &Plan,
    access: Access,
) -> Result<Vec<Option<FileDev>>, AssembleError> {
    plan.slots
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            Some(p) if !plan.sb.is_failed(i) => FileDev::open_with(p, access)
                .map(Some)
                .map_err(member_open_err(i)),
            _ => Ok(None),
        })
        .collect()
}

/// Maps a member's open error to the assembly error that names its slot.
fn member_open_err(member: usize) -> impl FnOnce(OpenError) -> AssembleError {
    move |e| match e {
        OpenError::Busy { path, holder } => AssembleError::Busy {
            member,
            path,
            holder,
        },
        OpenError::Io { path, err } => AssembleError::Io { path, err },
    }
}

/// `create`, holding every member exclusively while it writes (the claim `FileDev::open`
/// takes): a member of a running array, a mounted device or one md/dm holds is refused
/// instead of overwritten, `--force` or not.
pub fn create_exclusive(
    paths: &[PathBuf],
    opts: &CreateOptions,
) -> Result<Superblock, AssembleError> {
    // Checked before claiming, or the second claim on the same file would report this
    // process as the holder.
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].iter().any(|q| same_file(p, q)) {
            return Err(AssembleError::Duplicate {
                path: p.display().to_string(),
            });
        }
    }
    let mut _claims = paths
        .iter()
        .enumerate()
        .map(|(i, p)| open_exclusive(p, Access::ReadWrite, false).map_err(member_open_err(i)))
        .collect::<Result<Vec<File>, _>>()?;
    if let Some((jp, _)) = &opts.journal {
        if !paths.iter().any(|q| same_file(jp, q)) {
            _claims.push(
                open_exclusive(jp, Access::ReadWrite, false)
                    .map_err(member_open_err(usize::MAX))?,
            );
        }
    }
    create(paths, opts)
}

/// Reads the allocation map from every usable member of a plan and merges the copies
/// (`alloc::merge_map_copies`). Returns the map words and how many pages had no valid copy.
pub fn load_map(plan: &Plan) -> Result<(Vec<u64>, usize), AssembleError> {
    let g = plan.sb.geometry;
    let len = uraid_core::alloc::pages(&g) * uraid_core::alloc::PAGE;
    let copies = read_copies(plan, uraid_core::alloc::MAP_OFFSET, len)?;
    Ok(crate::alloc::merge_map_copies(&g, &copies))
}

/// `len` bytes at member offset `at` of every usable member of a plan (metadata copies).
fn read_copies(plan: &Plan, at: u64, len: usize) -> Result<Vec<Vec<u8>>, AssembleError> {
    let mut copies = Vec::new();
    for (i, slot) in plan.slots.iter().enumerate() {
        let Some(p) = slot else { continue };
        if plan.sb.is_failed(i) {
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

/// Opens the members of a plan, loads its allocation map and builds the volume on `rt`.
pub fn open_volume(
    plan: &Plan,
    rt: Option<crate::RuntimeHandle>,
    opts: crate::ArrayOptions,
) -> Result<std::sync::Arc<crate::Volume<FileDev>>, AssembleError> {
    open_volume_with(plan, rt, opts, Access::ReadWrite)
}

/// `open_volume` with the members opened as `access`. Read-only members need
/// `opts.frozen_metadata` (nothing may write superblocks).
pub fn open_volume_with(
    plan: &Plan,
    rt: Option<crate::RuntimeHandle>,
    opts: crate::ArrayOptions,
    access: Access,
) -> Result<std::sync::Arc<crate::Volume<FileDev>>, AssembleError> {
    debug_assert!(access == Access::ReadWrite || opts.frozen_metadata);
    let devs = open_members_with(plan, access)?;
    let (map, bad) = load_map(plan)?;
    if bad > 0 {
        tracing::warn!(
            "allocation map: {bad} sector(s) had no valid copy on any member; their granules are \
             treated as allocated"
        );
    }
    let build = |sb: Superblock, devs: Vec<Option<FileDev>>| {
        crate::Array::new(sb, plan.ids(), devs, rt, opts, plan.bitmap.clone())
    };
    let array = match open_journal(plan, opts.frozen_metadata, access)? {
        Some((dev, mode)) => {
            replay(dev, mode, &plan.sb, devs, build).map_err(AssembleError::Journal)?
        }
        None => build(plan.sb.clone(), devs),
    };
    Ok(crate::Volume::new(array, Some(map)))
}

/// Opens the plan's journal device (`replay` replays it). None when the array has
/// no journal, or when nothing may be written (read-only or frozen metadata) and the array
/// was stopped cleanly (a clean stop leaves nothing in the journal the members lack).
fn open_journal(
    plan: &Plan,
    frozen: bool,
    access: Access,
) -> Result<Option<(FileDev, JournalMode)>, AssembleError> {
    let Some((uuid, mode)) = plan.sb.journal else {
        return Ok(None);
    };
    let path = plan
        .journal
        .as_ref()
        .ok_or_else(|| AssembleError::JournalMissing {
            name: plan.sb.name.clone(),
            uuid: uuid_string(&uuid),
            mode: mode.name(),
        })?;
    if frozen || access == Access::ReadOnly {
        // Nothing may be written, so nothing can be replayed: only an array whose journal
        // holds nothing the members lack opens this way.
        let pending = if plan.sb.clean {
            let dev =
                FileDev::open_with(path, Access::ReadOnly).map_err(member_open_err(usize::MAX))?;
            crate::journal::pending_records(&dev, &plan.sb).map_err(AssembleError::Journal)?
        } else {
            1
        };
        if pending > 0 {
            return Err(AssembleError::Journal(format!(
                "array '{}' has journal records to replay onto its members first, which this \
                 read-only open cannot do; serve it once",
                plan.sb.name
            )));
        }
        return Ok(None);
    }
    let dev = FileDev::open_with(path, access).map_err(member_open_err(usize::MAX))?;
    Ok(Some((dev, mode)))
}

/// Replays the journal `dev` onto the members and builds the array with it attached
/// (assembly; sync). The records after the checkpoint are written to the members present
/// and flushed (`journal::replay_records`); the array is built by `build` from `sb` marked
/// clean (every stripe is consistent now: nothing to resync); if records were replayed while
/// members were absent, a superblock round records them failed (they missed the replay:
/// their chunks are stale) before the journal is emptied; then the journal superblock starts
/// a new epoch with an empty log (`journal::new_epoch`), so the old records are never
/// replayed again. A crash anywhere in here replays the same records again next time
/// (idempotent).
pub fn replay<D: BlockDev>(
    dev: D,
    mode: JournalMode,
    sb: &Superblock,
    mut members: Vec<Option<D>>,
    build: impl FnOnce(Superblock, Vec<Option<D>>) -> std::sync::Arc<crate::Array<D>>,
) -> Result<std::sync::Arc<crate::Array<D>>, String> {
    let (j, walk) = crate::journal::replay_records(&dev, sb, &mut members)?;
    let g = &sb.geometry;
    let absent: MemberSet = (0..g.members).filter(|&i| members[i].is_none()).collect();
    let mut clean = sb.clone();
    clean.clean = true;
    let array = build(clean, members);
    if walk.records > 0 && !absent.is_empty() {
        // Marks the absent members failed (a forced round; also "not clean" until the
        // next clean stop, which is true from the first write on anyway).
        futures::executor::block_on(array.ensure_dirty());
    } else if !sb.clean && absent.is_empty() {
        // The superblocks still say "not clean": the next clean stop must say otherwise,
        // written or not (replayed, the array is consistent). Not while a member is
        // absent: that round would record it failed, and a session that wrote nothing
        // leaves absent members alone (their data is current).
        array.clean_round_due();
    }
    let next = crate::journal::new_epoch(&dev, &j, &walk)?;
    array.attach_journal(crate::journal::Journal::new(dev, mode, next, walk.records));
    Ok(array)
}
