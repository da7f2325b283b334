//! Offline journal edits: adding a journal device to a stopped array, removing it.

use super::*;

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
pub(super) fn check_journal_target(
    level: Level,
    path: &Path,
    force: bool,
) -> Result<(), AssembleError> {
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
pub(super) fn write_new_journal(
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
