//! Offline member administration on a stopped array: add, spares, fail, remove, erase.

use super::*;

/// A random device uuid for a new member.
pub fn new_device_uuid() -> [u8; 16] {
    *uuid::Uuid::new_v4().as_bytes()
}

/// The array's superblock after `new_uuid` was added into `slot`: the slot rebuilding from
/// unit 0 (pure; `add_member` and the simulator's images use it). Events are not moved.
pub fn with_new_member(sb: &Superblock, slot: usize, new_uuid: [u8; 16]) -> Superblock {
    let mut sb = sb.clone();
    drop_checkpoint(&mut sb, slot);
    sb.states[slot] = MemberState::Rebuilding;
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
pub(super) fn check_new_device(plan: &Plan, path: &Path, force: bool) -> Result<(), AssembleError> {
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
pub(super) fn check_index(plan: &Plan, i: usize) -> Result<(), AssembleError> {
    let n = plan.sb.geometry.members;
    if i >= n {
        return Err(AssembleError::Refused(format!(
            "no member {i}: the array has {n}"
        )));
    }
    Ok(())
}

/// Slot `i` is failed or given a new device offline: its rebuild checkpoint goes. On an array not stopped
/// cleanly that checkpoint bounded what the device served while resync was due, so the slot
/// joins the served set (docs/format.md, "Served while out of sync").
fn drop_checkpoint(sb: &mut Superblock, i: usize) {
    if !sb.clean && sb.is_rebuilding(i) && sb.rebuilt[i] > 0 {
        sb.served = sb.served.with(i);
    }
    sb.rebuilt[i] = 0;
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
        drop_checkpoint(sb, i);
        sb.states[i] = MemberState::Failed;
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
    if !plan.sb.is_failed(i) && plan.slots[i].is_some() && !force {
        return Err(refuse(crate::array::admin::in_service(i)));
    }
    if !plan.sb.is_failed(i) {
        // Active, rebuilding, or missing without a failure on disk: it is failed too.
        let lost: uraid_core::MemberSet = missing.into_iter().filter(|&x| x != i).collect();
        g.check_fail(lost, i, force).map_err(refuse)?;
    }
    rewrite_superblocks_but(plan, None, Some(i), |sb| {
        drop_checkpoint(sb, i);
        sb.states[i] = MemberState::Failed;
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
pub(super) fn claim_for_writing(path: &Path, slot: usize) -> Result<File, AssembleError> {
    open_exclusive(path, Access::ReadWrite, false).map_err(member_open_err(slot))
}

/// Zeroes both superblock slots of `path` and syncs (a removed spare).
pub fn erase_superblocks(path: &Path) -> Result<(), AssembleError> {
    let f = claim_for_writing(path, usize::MAX)?;
    f.write_all_at(&vec![0u8; SB_SIZE * SB_SLOTS], 0)
        .map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}
