//! Finding an array's devices by their superblocks (`--scan`, `uraid list`; mdadm
//! --assemble --scan): the block devices the kernel lists in /proc/partitions (whole disks
//! and partitions) and the files and devices in directories named, read at once
//! (`read_all`), grouped by array UUID. Device names and the order they are found in never
//! matter; the superblocks say which slot each device fills (`decide`).
//!
//! Rules:
//! * An array is chosen by its UUID, or by its name if exactly one array found has it; two
//!   arrays of one name are refused, naming both UUIDs and their devices.
//! * Devices of other arrays are left out of the choice (`uraid list` shows them).
//! * Two devices carrying one device's superblock (same device UUID: a copy made with `dd`
//!   or `cp`) are refused, naming both paths: which of them is the member cannot be known
//!   from the superblocks alone when both are equally fresh, and a wrong guess serves old
//!   data.
//! * A device that does not answer within the timeout is left out and named; then a name
//!   chooses nothing (the device may hold another array of that name), a UUID still does.
//! * Two journal devices carrying one journal are refused like member copies.

use super::*;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;
use uraid_core::journal::JournalSuper;

/// One array's devices found by a scan.
#[derive(Debug, Clone)]
pub struct FoundArray {
    pub uuid: [u8; 16],
    /// The freshest member superblock found (a spare's or replacement's if no member was
    /// found): the array's name, level and state as far as the scan can tell.
    pub sb: Superblock,
    /// Members, spares and replacements: path and superblock, by path.
    pub devices: Vec<(PathBuf, Superblock)>,
    /// Journal devices of this array, with their journal UUIDs.
    pub journals: Vec<(PathBuf, [u8; 16])>,
}

impl FoundArray {
    /// Every device of the array found: members, spares, replacements and journals (what
    /// `plan` takes).
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.devices.iter().map(|(p, _)| p.clone()).collect();
        v.extend(self.journals.iter().map(|j| j.0.clone()));
        v
    }

    /// Refuses two devices that carry the same device's superblock, or the same journal (a
    /// copy).
    pub fn check_copies(&self) -> Result<(), AssembleError> {
        let mut by_uuid: HashMap<[u8; 16], Vec<&(PathBuf, Superblock)>> = HashMap::new();
        for d in &self.devices {
            by_uuid.entry(d.1.device_uuid).or_default().push(d);
        }
        let mut dups: Vec<String> = by_uuid
            .values()
            .filter(|v| v.len() > 1)
            .map(|v| {
                let role = if v[0].1.spare {
                    "a spare".to_string()
                } else {
                    format!("member {}", v[0].1.index)
                };
                let paths: Vec<String> = v
                    .iter()
                    .map(|(p, sb)| format!("{} (events {})", p.display(), sb.events))
                    .collect();
                format!(
                    "{} all carry the superblock of {role} (device {})",
                    paths.join(", "),
                    uuid_string(&v[0].1.device_uuid)
                )
            })
            .collect();
        let mut journals: HashMap<[u8; 16], Vec<&PathBuf>> = HashMap::new();
        for (p, u) in &self.journals {
            journals.entry(*u).or_default().push(p);
        }
        dups.extend(journals.iter().filter(|(_, v)| v.len() > 1).map(|(u, v)| {
            let paths: Vec<String> = v.iter().map(|p| p.display().to_string()).collect();
            format!("{} all carry journal {}", paths.join(", "), uuid_string(u))
        }));
        if dups.is_empty() {
            return Ok(());
        }
        dups.sort();
        Err(AssembleError::Refused(format!(
            "array '{}' ({}): {}: one device was copied onto another, and the superblocks \
             cannot tell which one is the member. Remove or wipe the copy, or name the \
             members explicitly instead of --scan",
            self.sb.name,
            uuid_string(&self.uuid),
            dups.join("; ")
        )))
    }
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Arrays, by name then UUID.
    pub arrays: Vec<FoundArray>,
    /// Devices and files read.
    pub scanned: usize,
    /// Where: "block devices" and the directories.
    pub places: Vec<String>,
    /// Devices that did not answer within the timeout.
    pub unanswered: Vec<PathBuf>,
}

/// The block devices in /proc/partitions (whole disks and partitions) that exist under /dev.
pub fn block_devices() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/partitions") else {
        return Vec::new();
    };
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(3))
        .map(|n| Path::new("/dev").join(n))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
        .collect()
}

/// Regular files and block devices directly in `dir` (not in its subdirectories), by name.
fn dir_entries(dir: &Path) -> Result<Vec<PathBuf>, AssembleError> {
    let rd = std::fs::read_dir(dir).map_err(io_err(dir))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            std::fs::metadata(p)
                .is_ok_and(|m| m.file_type().is_file() || m.file_type().is_block_device())
        })
        .collect();
    v.sort();
    Ok(v)
}

/// Scans the block devices (if `block`) and the directories `dirs` for uraid superblocks
/// and journal headers, reading for at most `timeout`. A file or device reached twice (a
/// symlink, a directory named twice) is read once.
pub fn scan(dirs: &[PathBuf], block: bool, timeout: Duration) -> Result<Scan, AssembleError> {
    let mut places = Vec::new();
    let mut cands = Vec::new();
    if block {
        places.push("the block devices in /proc/partitions".to_string());
        cands.extend(block_devices());
    }
    for d in dirs {
        places.push(d.display().to_string());
        cands.extend(dir_entries(d)?);
    }
    let mut seen = HashSet::new();
    cands.retain(|p| match std::fs::metadata(p) {
        Ok(m) if m.file_type().is_block_device() => seen.insert((0, m.rdev())),
        Ok(m) => seen.insert((m.dev(), m.ino())),
        Err(_) => false,
    });
    let got = read_all(&cands, timeout);
    let mut scan = Scan {
        scanned: cands.len(),
        places,
        ..Default::default()
    };
    let mut journals: Vec<(PathBuf, JournalSuper)> = Vec::new();
    let mut by_uuid: HashMap<[u8; 16], FoundArray> = HashMap::new();
    for (p, r) in cands.into_iter().zip(got) {
        match r {
            Some(Ok((sb, _))) => {
                let a = by_uuid.entry(sb.array_uuid).or_insert_with(|| FoundArray {
                    uuid: sb.array_uuid,
                    sb: sb.clone(),
                    devices: Vec::new(),
                    journals: Vec::new(),
                });
                let member = |s: &Superblock| !s.spare && !s.replacement;
                if (member(&sb), sb.events) > (member(&a.sb), a.sb.events) {
                    a.sb = sb.clone();
                }
                a.devices.push((p, sb));
            }
            Some(Err((_, Some(j)))) => journals.push((p, j)),
            Some(Err((_, None))) => {}
            None => scan.unanswered.push(p),
        }
    }
    for (p, j) in journals {
        if let Some(a) = by_uuid.get_mut(&j.array_uuid) {
            a.journals.push((p, j.journal_uuid));
        }
    }
    scan.arrays = by_uuid.into_values().collect();
    for a in &mut scan.arrays {
        a.devices.sort_by(|(p, x), (q, y)| {
            (x.spare, x.replacement, x.index, p).cmp(&(y.spare, y.replacement, y.index, q))
        });
    }
    scan.arrays
        .sort_by(|a, b| (&a.sb.name, a.uuid).cmp(&(&b.sb.name, b.uuid)));
    Ok(scan)
}

/// Whether `which` names array UUID `uuid`: its usual form (with dashes) or 32 hex digits,
/// any case.
fn names_uuid(which: &str, uuid: &[u8; 16]) -> bool {
    let s = uuid_string(uuid);
    let w = which.to_ascii_lowercase();
    w == s || w == s.replace('-', "")
}

impl Scan {
    /// The array `which` names (UUID or name), with its devices checked for copies.
    pub fn select(&self, which: &str) -> Result<&FoundArray, AssembleError> {
        if let Some(a) = self.arrays.iter().find(|a| names_uuid(which, &a.uuid)) {
            a.check_copies()?;
            return Ok(a);
        }
        let named: Vec<&FoundArray> = self.arrays.iter().filter(|a| a.sb.name == which).collect();
        match named.as_slice() {
            [_] if !self.unanswered.is_empty() => Err(AssembleError::Refused(format!(
                "--scan {which}: device(s) did not answer{}, so another array named '{which}'                  may be among them: name the array by its UUID",
                self.unanswered_note()
                    .trim_start_matches("; did not answer")
            ))),
            [a] => {
                a.check_copies()?;
                Ok(a)
            }
            [] => {
                let found: Vec<String> = self
                    .arrays
                    .iter()
                    .map(|a| format!("'{}' ({})", a.sb.name, uuid_string(&a.uuid)))
                    .collect();
                Err(AssembleError::Refused(format!(
                    "--scan {which}: no array of that name or UUID among {} device(s) scanned \
                     in {}{}{}",
                    self.scanned,
                    self.places.join(", "),
                    if found.is_empty() {
                        "; no uraid array found at all".to_string()
                    } else {
                        format!("; found {}", found.join(", "))
                    },
                    self.unanswered_note()
                )))
            }
            many => {
                let each: Vec<String> = many
                    .iter()
                    .map(|a| {
                        let paths: Vec<String> =
                            a.paths().iter().map(|p| p.display().to_string()).collect();
                        format!("{} on {}", uuid_string(&a.uuid), paths.join(", "))
                    })
                    .collect();
                Err(AssembleError::Refused(format!(
                    "--scan {which}: {} arrays are named '{which}': {}. Name one by its UUID",
                    many.len(),
                    each.join("; ")
                )))
            }
        }
    }

    fn unanswered_note(&self) -> String {
        if self.unanswered.is_empty() {
            return String::new();
        }
        let p: Vec<String> = self
            .unanswered
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!("; did not answer: {}", p.join(", "))
    }
}
