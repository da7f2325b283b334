//! Opening an assembly: members, allocation map, journal replay, the volume.

use super::*;

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
pub(super) fn member_open_err(member: usize) -> impl FnOnce(OpenError) -> AssembleError {
    move |e| match e {
        OpenError::Busy { path, holder } => AssembleError::Busy {
            member,
            path,
            holder,
        },
        OpenError::Io { path, err } => AssembleError::Io { path, err },
        OpenError::ReadOnly { path } => AssembleError::ReadOnly { member, path },
    }
}

/// Reads the allocation map from every usable member of a plan and merges the copies
/// (`alloc::merge_map_copies`). Returns the map words and how many pages had no valid copy.
pub fn load_map(plan: &Plan) -> Result<(Vec<u64>, usize), AssembleError> {
    let g = plan.sb.geometry;
    let len = uraid_core::alloc::pages(&g) * uraid_core::alloc::PAGE;
    // A member `--force` took (stale, or marked failed) may hold a map from before trims the
    // others recorded, and the union would bring those granules back over what their
    // discards left (array/discard.rs): its copy counts only when no other member has one.
    let others = (0..plan.slots.len())
        .any(|i| plan.slots[i].is_some() && !plan.sb.is_failed(i) && !plan.forced.contains(&i));
    let skip: &[usize] = if others { &plan.forced } else { &[] };
    let copies = read_copies_but(plan, uraid_core::alloc::MAP_OFFSET, len, skip)?;
    Ok(crate::alloc::merge_map_copies(&g, &copies))
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
pub(super) fn open_journal(
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
    clean.served = MemberSet::EMPTY;
    if walk.records > 0 || !sb.clean {
        // Replayed records went to the members only, and a replay may have happened in an
        // earlier start that crashed before recording it: a replacement being copied
        // (format version 7) may lack them, so after an unclean stop its copy starts over.
        for r in clean.replaces.iter_mut().flatten() {
            r.copied = 0;
        }
    }
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
