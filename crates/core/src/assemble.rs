//! The assembly decision: which of the members found on disk an array may use, and whether
//! it can start (`decide`, `Plan`). Pure: the engine reads the superblocks (and logs what
//! `decide` notes); the crash simulator calls `decide` on member images.

use crate::format::{uuid_string, MemberState, Superblock};
use crate::geometry::Level;
use std::path::PathBuf;

/// Who a member is on disk: its device uuid, and which superblock slot holds its freshest
/// valid superblock (the next round writes the *other* slot, so a torn round can never
/// destroy a member's only valid copy, also on a member that missed the previous round).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberId {
    pub uuid: [u8; 16],
    pub sb_slot: usize,
    /// The event count of that superblock (members taken one event behind, or forced, are
    /// behind the array's).
    pub events: u64,
}

/// One member as found on disk.
#[derive(Debug)]
pub struct Found {
    pub path: PathBuf,
    pub sb: Superblock,
    /// The superblock slot `sb` was read from.
    pub slot: usize,
}

/// Something `decide` wants logged (it does no I/O; the engine's `assemble::decide` logs
/// these, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Info(String),
    Warn(String),
}

/// Why an assembly cannot start (or was refused as asked).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
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
    #[error(
        "not starting {level} array '{name}' degraded: {absent} not among the devices given \
         or refused (above), though the array has {them} in service. Give every member, or \
         pass --run to start without {them} (mdadm --run); once the array writes, {them} \
         {is} recorded failed, and `uraid add` of it while the array serves puts it back \
         (re-add: rebuilt where it missed writes)"
    )]
    Incomplete {
        level: Level,
        name: String,
        /// "member 2 (device UUID)", ...
        absent: String,
        them: &'static str,
        is: &'static str,
    },
    #[error("cannot start {level} array '{name}': {missing} of {members} members missing or failed, it tolerates {tolerates}")]
    TooManyMissing {
        level: Level,
        name: String,
        missing: usize,
        members: usize,
        tolerates: usize,
    },
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
    /// Replacements of a replace in progress found among the paths given (the slot, the
    /// path, the device uuid the array's superblock records for it): the replace resumes
    /// (recovery/replace.rs). A recorded replace (`sb.replaces`) whose replacement is not
    /// here is dropped by the array that serves (logged there: a plan of a running array
    /// is not a start).
    pub replacements: Vec<(usize, PathBuf, [u8; 16])>,
    /// What `decide` noted for the log.
    pub notes: Vec<Note>,
    /// Slots whose member `--force` took although stale or marked failed: its metadata
    /// copies (allocation map) may predate trims the others recorded.
    pub forced: Vec<usize>,
}

impl Plan {
    /// Member identities for `Array::new`.
    pub fn ids(&self) -> Vec<MemberId> {
        (0..self.slots.len())
            .map(|i| MemberId {
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

    /// Slots the array has in service (active, or being rebuilt) whose member is not among
    /// the devices given, or was refused: a start without them would be degraded although
    /// the superblocks record no failure.
    pub fn absent(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_none() && !self.sb.is_failed(i) && !self.sb.is_removed(i))
            .collect()
    }

    /// mdadm's rule for an explicit member list: an array that would start with fewer
    /// members than it has in service (a typo, a device slow to appear, a member of another
    /// array given by mistake) is refused unless `run`. Members already recorded failed do
    /// not count: the array was degraded before.
    pub fn check_complete(&self, run: bool) -> Result<(), PlanError> {
        let absent = self.absent();
        if run || absent.is_empty() {
            return Ok(());
        }
        let one = absent.len() == 1;
        Err(PlanError::Incomplete {
            level: self.sb.geometry.level,
            name: self.sb.name.clone(),
            absent: absent
                .iter()
                .map(|&i| {
                    let uuid = self.sb.slot_uuids.get(i).copied().unwrap_or_default();
                    format!("member {i} (device {})", uuid_string(&uuid))
                })
                .collect::<Vec<_>>()
                .join(", "),
            them: if one { "it" } else { "them" },
            is: if one { "is" } else { "are" },
        })
    }

    /// md's rule for parity levels: an array that was not stopped cleanly and is degraded
    /// cannot be trusted where writes were in flight (the write hole): refused unless
    /// `allow`. The write-intent bitmap says where that was; with no dirty region the start
    /// is safe, without a bitmap it could be anywhere.
    pub fn check_dirty_degraded(&self, allow: bool) -> Result<(), PlanError> {
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
        Err(PlanError::DirtyDegraded {
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
            crate::bitmap::dirty_units(g, bc, words)
                .into_iter()
                .map(|u| u.start * sdb..u.end * sdb)
                .collect(),
        )
    }

    pub fn can_start(&self) -> Result<(), PlanError> {
        let g = self.sb.geometry;
        let mask = self.missing().iter().fold(0u64, |m, &i| m | 1 << i);
        if g.can_serve(mask) {
            Ok(())
        } else {
            Err(PlanError::TooManyMissing {
                level: g.level,
                name: self.sb.name.clone(),
                missing: mask.count_ones() as usize,
                members: g.members,
                tolerates: g.fault_tolerance(),
            })
        }
    }
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

/// Decides an assembly from the superblocks found. Members may be given in any order.
/// Foreign members (another array), stale members (event count more than one behind) and
/// members the array marked failed are refused with a reason. A member exactly one event
/// behind missed only the last superblock round (a round is written to all members at once
/// and a crash can tear it): it is taken, as md does (its data is current: a round completes
/// before anything that depends on it). `force` also takes stale members and members the
/// array marked failed, the freshest first, as far as needed to start (mdadm --assemble
/// --force), never one that was being rebuilt.
pub fn decide(found: Vec<Found>, refused: Vec<String>, force: bool) -> Result<Plan, PlanError> {
    let Some(best) = array_truth(&found) else {
        return Err(PlanError::NoMembers(refused.join("; ")));
    };
    let n = best.sb.geometry.members;
    let mut plan = Plan {
        sb: best.sb.clone(),
        slots: vec![None; n],
        device_uuids: vec![[0u8; 16]; n],
        sb_slots: vec![0usize; n],
        member_events: vec![0u64; n],
        refused,
        bitmap: None,
        journal: None,
        spares: Vec::new(),
        replacements: Vec::new(),
        notes: Vec::new(),
        forced: Vec::new(),
    };
    // Two copies of one slot: the fresher is considered first.
    let mut found = found;
    found.sort_by_key(|f| std::cmp::Reverse(f.sb.events));
    // Refused for staleness or a failed mark: candidates for --force.
    let mut forceable: Vec<(&Found, String)> = Vec::new();
    for f in &found {
        if let Some(why) = plan.consider(f) {
            forceable.push((f, why));
        }
    }
    forceable.sort_by_key(|(f, _)| std::cmp::Reverse(f.sb.events));
    for (f, why) in forceable {
        plan.consider_forced(f, why, force);
    }
    Ok(plan)
}

/// The member whose superblock is the array's truth: the array is the one most of the given
/// members belong to (ties: the freshest); its truth is its member with the highest event
/// count. Spares and replacements carry a copy of the superblock of when they were added:
/// never the truth.
fn array_truth(found: &[Found]) -> Option<&Found> {
    let member = |f: &&Found| !f.sb.spare && !f.sb.replacement;
    let votes = |u: &[u8; 16]| {
        found
            .iter()
            .filter(member)
            .filter(|f| &f.sb.array_uuid == u)
            .count()
    };
    found
        .iter()
        .filter(member)
        .max_by_key(|f| (votes(&f.sb.array_uuid), f.sb.events))
}

impl Plan {
    /// Takes member `f` into its slot, records it as a spare, or refuses it with a reason;
    /// returns the reason instead when only `--force` could take it (stale, or marked
    /// failed).
    fn consider(&mut self, f: &Found) -> Option<String> {
        let sb = &self.sb;
        let p = f.path.display();
        if f.sb.spare {
            if f.sb.array_uuid != sb.array_uuid || f.sb.geometry != sb.geometry {
                self.refused.push(format!(
                    "{p}: a spare of array {} ('{}'), not of this one",
                    uuid_string(&f.sb.array_uuid),
                    f.sb.name
                ));
            } else if sb.slot_uuids.contains(&f.sb.device_uuid) {
                self.refused
                    .push(format!("{p}: a spare that became a member since"));
            } else {
                self.spares.push((f.path.clone(), f.sb.device_uuid));
            }
            return None;
        }
        if f.sb.replacement {
            self.consider_replacement(f);
            return None;
        }
        let i = f.sb.index;
        if f.sb.array_uuid != sb.array_uuid {
            self.refused.push(format!(
                "{p}: belongs to array {} ('{}'), not {} ('{}')",
                uuid_string(&f.sb.array_uuid),
                f.sb.name,
                uuid_string(&sb.array_uuid),
                sb.name
            ));
        } else if f.sb.geometry != sb.geometry {
            self.refused.push(format!(
                "{p}: geometry disagrees with the array's freshest superblock"
            ));
        } else if sb.is_removed(i) {
            self.refused.push(format!(
                "{p}: was member {i} but was removed from the array (uraid add takes it back \
                 as a new member)"
            ));
        } else if sb.slot_uuids[i] != [0; 16] && sb.slot_uuids[i] != f.sb.device_uuid {
            self.refused.push(format!(
                "{p}: was member {i} (device {}) but the array replaced it with device {}",
                uuid_string(&f.sb.device_uuid),
                uuid_string(&sb.slot_uuids[i])
            ));
        } else if self.slots[i].is_some() {
            self.refused.push(format!("{p}: duplicate of member {i}"));
        } else if sb.is_failed(i) {
            return Some(format!(
                "{p}: member {i} is marked failed in the array (events {})",
                sb.events
            ));
        } else if f.sb.events + 1 < sb.events {
            return Some(format!(
                "{p}: stale member {i} (events {} < array's {})",
                f.sb.events, sb.events
            ));
        } else {
            if f.sb.events < sb.events {
                self.notes.push(Note::Info(format!(
                    "{p}: member {i} is one event behind ({} < {}): it missed the last \
                     superblock round; taking it",
                    f.sb.events, sb.events
                )));
            }
            self.take(f);
        }
        None
    }

    /// A member refused for `why` (stale, or marked failed): with `force` taken into its
    /// empty slot if the array cannot start without it, unless its own superblock says it
    /// was being rebuilt; refused otherwise.
    fn consider_forced(&mut self, f: &Found, why: String, force: bool) {
        let i = f.sb.index;
        let startable = self.can_start().is_ok();
        if f.sb.is_rebuilding(i) {
            // Its own superblock says it holds only part of the data: never forced in.
            self.refused.push(format!(
                "{why}; it was being rebuilt (rebuilt {} of {} units), so it is not taken even \
                 with --force",
                f.sb.rebuilt[i],
                self.sb.geometry.units()
            ));
        } else if self.sb.is_rebuilding(i) {
            // The array records its slot being rebuilt (a re-add whose naming round it
            // missed): what it holds is decided by that rebuild, never forced in as active.
            self.refused.push(format!(
                "{why}; the array records its slot being rebuilt, so it is not taken even with \
                 --force"
            ));
        } else if force && !startable && self.slots[i].is_none() {
            self.notes.push(Note::Warn(format!(
                "--force: {why}; taking it anyway (its data may be out of date)"
            )));
            self.refused.push(format!("{why}; FORCED into the array"));
            self.sb.states[i] = MemberState::Active;
            self.forced.push(i);
            self.take(f);
        } else if self.sb.bitmap_chunk != 0 {
            self.refused.push(format!(
                "{why}; once the array serves, `uraid add {}` puts it back into its slot and \
                 rebuilds only the write-intent regions written since it left (re-add)",
                f.path.display()
            ));
        } else {
            self.refused.push(why);
        }
    }

    /// A replacement (FLAG_REPLACEMENT): taken if the array's superblock records the replace
    /// of its slot by this device; refused with the reason otherwise.
    fn consider_replacement(&mut self, f: &Found) {
        let (sb, i, u) = (&self.sb, f.sb.index, f.sb.device_uuid);
        let p = f.path.display();
        let why = if f.sb.array_uuid != sb.array_uuid || f.sb.geometry != sb.geometry {
            format!(
                "{p}: a replacement for array {} ('{}'), not this one",
                uuid_string(&f.sb.array_uuid),
                f.sb.name
            )
        } else if sb.slot_uuids[i] == u {
            format!("{p}: a replacement that became member {i} since")
        } else if sb.replaces[i].is_none_or(|r| r.uuid != u) {
            format!(
                "{p}: was the replacement of member {i} in a replace that has ended \
                 (cancelled, failed or dropped); not used"
            )
        } else if self.replacements.iter().any(|r| r.0 == i) {
            format!("{p}: duplicate of member {i}'s replacement")
        } else {
            self.replacements.push((i, f.path.clone(), u));
            return;
        };
        self.refused.push(why);
    }

    /// Puts member `f` into its slot.
    fn take(&mut self, f: &Found) {
        let i = f.sb.index;
        self.slots[i] = Some(f.path.clone());
        self.device_uuids[i] = f.sb.device_uuid;
        self.sb_slots[i] = f.slot;
        self.member_events[i] = f.sb.events;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::DATA_OFFSET;
    use crate::geometry::Geometry;

    /// Member `i` of a four-member RAID5 whose superblock has event count `events`.
    fn member(i: usize, events: u64) -> Found {
        let n = 4;
        let sb = Superblock {
            array_uuid: [7; 16],
            name: "t".into(),
            geometry: Geometry::new(Level::Raid5, n, 4096, 1 << 20).unwrap(),
            index: i,
            clean: true,
            spare: false,
            data_offset: DATA_OFFSET,
            events,
            ctime: 0,
            utime: 0,
            device_uuid: [i as u8 + 1; 16],
            states: vec![MemberState::Active; n],
            rebuilt: vec![0; n],
            slot_uuids: (0..n).map(|s| [s as u8 + 1; 16]).collect(),
            replacement: false,
            replaces: vec![None; n],
            bitmap_chunk: 0,
            journal: None,
            bad: Default::default(),
            served: Default::default(),
        };
        Found {
            path: format!("m{i}").into(),
            sb,
            slot: 0,
        }
    }

    /// mdadm's --run: a member the array has in service but not given is refused by name;
    /// one recorded failed is not (the array was degraded before); `run` starts anyway.
    #[test]
    fn a_start_without_a_member_in_service_needs_run() {
        let plan = decide(
            vec![member(0, 5), member(1, 5), member(3, 5)],
            vec![],
            false,
        )
        .unwrap();
        assert_eq!(plan.absent(), vec![2]);
        assert!(plan.can_start().is_ok());
        let e = plan.check_complete(false).unwrap_err().to_string();
        assert!(
            e.contains("member 2 (device 03030303-0303-0303-0303-030303030303)")
                && e.contains("--run"),
            "{e}"
        );
        assert!(plan.check_complete(true).is_ok());
        // Recorded failed: degraded already, no --run needed.
        let failed = |i| {
            let mut m = member(i, 6);
            m.sb.states[2] = MemberState::Failed;
            m
        };
        let plan = decide(vec![failed(0), failed(1), failed(3)], vec![], false).unwrap();
        assert!(plan.absent().is_empty());
        assert_eq!(plan.missing(), vec![2]);
        assert!(plan.check_complete(false).is_ok());
        // Every member given: nothing to say.
        let all = (0..4).map(|i| member(i, 5)).collect();
        assert!(decide(all, vec![], false)
            .unwrap()
            .check_complete(false)
            .is_ok());
    }

    #[test]
    fn decide_notes_what_the_log_must_say_instead_of_logging() {
        let behind = vec![member(0, 5), member(1, 5), member(2, 4), member(3, 5)];
        let plan = decide(behind, Vec::new(), false).unwrap();
        assert!(plan.missing().is_empty(), "{:?}", plan.refused);
        assert!(
            matches!(&plan.notes[..], [Note::Info(m)] if m.contains("m2: member 2 is one event behind")),
            "{:?}",
            plan.notes
        );
        // Two stale members: the fresher is forced in (enough to start), the other refused.
        let stale = vec![member(0, 5), member(1, 5), member(2, 3), member(3, 2)];
        let plan = decide(stale, Vec::new(), true).unwrap();
        plan.can_start().unwrap();
        assert_eq!(plan.missing(), vec![3]);
        assert!(
            matches!(&plan.notes[..], [Note::Warn(m)] if m.starts_with("--force: m2: stale member 2")),
            "{:?}",
            plan.notes
        );
    }

    /// A replace in progress: its replacement is found among the devices given and kept for
    /// the array; another device claiming the slot's replacement, or one of an ended
    /// replace, is refused.
    #[test]
    fn replacements_are_found_or_refused() {
        let record = crate::format::ReplaceRecord {
            uuid: [0x99; 16],
            copied: 7,
        };
        let with_record = |i: usize| {
            let mut f = member(i, 5);
            f.sb.replaces[2] = Some(record);
            f
        };
        let replacement = |uuid: [u8; 16]| {
            let mut f = member(2, 4);
            f.sb.replacement = true;
            f.sb.device_uuid = uuid;
            f.path = "r".into();
            f
        };
        let mut found: Vec<Found> = (0..4).map(with_record).collect();
        found.push(replacement([0x99; 16]));
        let plan = decide(found, Vec::new(), false).unwrap();
        assert_eq!(plan.replacements, vec![(2, PathBuf::from("r"), [0x99; 16])]);
        assert!(
            plan.missing().is_empty() && plan.notes.is_empty(),
            "{:?}",
            plan.notes
        );
        // Another device claiming to be the replacement: refused.
        let mut found: Vec<Found> = (0..4).map(with_record).collect();
        found.push(replacement([0x98; 16]));
        let plan = decide(found, Vec::new(), false).unwrap();
        assert!(plan.replacements.is_empty());
        assert!(plan
            .refused
            .iter()
            .any(|r| r.contains("replace that has ended")));
        assert_eq!(
            plan.sb.replaces[2],
            Some(record),
            "still recorded: the array drops it"
        );
        // A replacement whose copy of the array's superblock is as fresh as the members',
        // or fresher, is never the array's truth.
        let mut found: Vec<Found> = (0..4).map(with_record).collect();
        let mut fresh = replacement([0x99; 16]);
        fresh.sb.events = 9;
        found.push(fresh);
        let plan = decide(found, Vec::new(), false).unwrap();
        assert!(!plan.sb.replacement && plan.sb.events == 5);
        assert_eq!(plan.replacements.len(), 1);
        // No replace recorded (cancelled): the old replacement is refused, nothing noted.
        let mut found: Vec<Found> = (0..4).map(|i| member(i, 5)).collect();
        found.push(replacement([0x99; 16]));
        let plan = decide(found, Vec::new(), false).unwrap();
        assert!(plan.replacements.is_empty() && plan.notes.is_empty());
        assert_eq!(plan.refused.len(), 1);
    }
}
