//! Reading superblocks back and deciding an assembly from them (`decide`, pure).

use super::*;

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
