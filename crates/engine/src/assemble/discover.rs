//! Reading superblocks back and deciding an assembly from them (`decide`: the pure decision
//! is `uraid_core::assemble`, re-exported here with its types).

use super::*;
use std::time::Duration;
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

/// How long discovery waits for a device's superblock when no I/O timeout is given (the
/// array's default `--io-timeout`).
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Like `plan`; `force` also takes stale members and members the array marked failed, the
/// freshest first, as far as needed to start (mdadm --assemble --force). Logged.
pub fn plan_with(paths: &[PathBuf], force: bool) -> Result<Plan, AssembleError> {
    plan_within(paths, force, DISCOVERY_TIMEOUT)
}

/// What one device's metadata says: an array member's superblock, or a journal's.
pub type Discovered = Result<(Superblock, usize), (AssembleError, Option<JournalSuper>)>;

/// Reads every path's superblock (or journal header) at once, each on its own thread; None
/// for a device that has not answered within `timeout` (a hung drive, a stopped FUSE
/// server). Its thread stays blocked in the read until the device answers or the process
/// exits.
pub fn read_all(paths: &[PathBuf], timeout: Duration) -> Vec<Option<Discovered>> {
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Discovered)>();
    for (i, p) in paths.iter().enumerate() {
        let (tx, p) = (tx.clone(), p.clone());
        let read = move || {
            let r = read_superblock_slot(&p).map_err(|e| (e, read_journal_super(&p).ok()));
            let _ = tx.send((i, r));
        };
        if std::thread::Builder::new()
            .name("uraid-discover".into())
            .spawn(read.clone())
            .is_err()
        {
            read();
        }
    }
    drop(tx);
    let deadline = std::time::Instant::now() + timeout;
    let mut got: Vec<Option<Discovered>> = paths.iter().map(|_| None).collect();
    while got.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, r)) => got[i] = Some(r),
            Err(_) => break,
        }
    }
    got
}

/// Like `plan_with`, reading every device's superblock at once (`read_all`): a device that
/// has not answered within `timeout` is left out like a missing one, with a reason that
/// says so, instead of hanging the command.
pub fn plan_within(
    paths: &[PathBuf],
    force: bool,
    timeout: Duration,
) -> Result<Plan, AssembleError> {
    let got = read_all(paths, timeout);
    let mut found = Vec::new();
    let mut refused = Vec::new();
    let mut journals = Vec::new();
    for (p, r) in paths.iter().zip(got) {
        match r {
            Some(Ok((sb, slot))) => found.push(Found {
                path: p.clone(),
                sb,
                slot,
            }),
            Some(Err((_, Some(j)))) => journals.push((p.clone(), j)),
            Some(Err((e, None))) => refused.push(format!("{e}")),
            None => {
                let why = format!(
                    "{}: its superblock did not arrive within {:?} (a hung device, or its \
                     reader failed): left out",
                    p.display(),
                    timeout
                );
                tracing::error!("{why}");
                refused.push(why);
            }
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
