//! Reading superblocks back and deciding an assembly from them (`decide`: the pure decision
//! is `uraid_core::assemble`, re-exported here with its types).

use super::*;
pub use uraid_core::assemble::{describe_ranges, Found, Note, Plan, PlanError};

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

/// Decides an assembly from the superblocks found (`uraid_core::assemble::decide`: pure,
/// the crash tests call it on member images) and logs what it noted (members taken one event
/// behind, members forced in).
pub fn decide(found: Vec<Found>, refused: Vec<String>, force: bool) -> Result<Plan, AssembleError> {
    let plan = uraid_core::assemble::decide(found, refused, force)?;
    for n in &plan.notes {
        match n {
            Note::Info(m) => tracing::info!("{m}"),
            Note::Warn(m) => tracing::warn!("{m}"),
        }
    }
    Ok(plan)
}
