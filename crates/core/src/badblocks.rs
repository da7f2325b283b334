//! Bad-block lists (md's bad-block log): per member slot, the units (stripes, mirror rows)
//! whose chunk on that member holds no valid data, because a rebuild, replace or repair could
//! not produce it (read errors past the level's tolerance, or a stripe not in sync when the
//! array was started dirty and degraded). Stored in every superblock (docs/format.md, "Bad
//! blocks"); the engine keeps the live copy (`Members`).
//!
//! Rules:
//! * A member's chunk in a listed unit is never read: the unit is served as if that member
//!   were behind a rebuild there (reconstructed from the others, or EIO when they cannot).
//! * The list is bounded (`MAX_BAD_RANGES` ranges over every slot together; adjacent units
//!   merge into one range). An addition that would need one more range fails (`Full`): the
//!   caller stops rather than lose track of a chunk it did not write.
//! * A unit leaves the list only once its chunk was written whole and flushed (engine).

use crate::MemberSet;

/// Ranges the superblock holds, over every slot together.
pub const MAX_BAD_RANGES: usize = 31;
/// Units one range holds at most (its length is a u32 on disk).
pub const MAX_RANGE_LEN: u64 = u32::MAX as u64;

/// Units `[start, start + len)` of member slot `member` hold no valid data there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BadRange {
    pub member: usize,
    pub start: u64,
    pub len: u64,
}

impl BadRange {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// The list is full: recording another unit would need a range past `MAX_BAD_RANGES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bad-block list is full ({MAX_BAD_RANGES} ranges)")]
pub struct Full;

/// Every slot's bad ranges: sorted by (member, start), never overlapping within a member,
/// each 1 to `MAX_RANGE_LEN` units long. Additions merge into touching ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BadBlocks {
    ranges: Vec<BadRange>,
}

impl BadBlocks {
    /// The list from ranges already in canonical order (`check` says whether they are).
    pub fn from_ranges(ranges: Vec<BadRange>) -> BadBlocks {
        BadBlocks { ranges }
    }

    /// Whether `ranges` is a canonical list for `members` slots of `units` units each:
    /// bounded, sorted, not overlapping, in range. The reason when not.
    pub fn check(ranges: &[BadRange], members: usize, units: u64) -> Result<(), String> {
        if ranges.len() > MAX_BAD_RANGES {
            return Err(format!(
                "{} ranges (at most {MAX_BAD_RANGES})",
                ranges.len()
            ));
        }
        for (i, r) in ranges.iter().enumerate() {
            if r.member >= members {
                return Err(format!("range {i} on member {} of {members}", r.member));
            }
            if r.len == 0
                || r.len > MAX_RANGE_LEN
                || r.start.checked_add(r.len).is_none_or(|e| e > units)
            {
                return Err(format!(
                    "range {i} (units {} +{}) outside 1..={units} units",
                    r.start, r.len
                ));
            }
            if i > 0 {
                let p = ranges[i - 1];
                if (p.member, p.end()) > (r.member, r.start) {
                    return Err(format!("range {i} overlaps or precedes range {}", i - 1));
                }
            }
        }
        Ok(())
    }

    pub fn ranges(&self) -> &[BadRange] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Slots with at least one bad unit.
    pub fn members(&self) -> MemberSet {
        self.ranges.iter().map(|r| r.member).collect()
    }

    /// Whether member `member`'s chunk of `unit` is bad.
    pub fn contains(&self, member: usize, unit: u64) -> bool {
        let i = self
            .ranges
            .partition_point(|r| (r.member, r.end()) <= (member, unit));
        self.ranges
            .get(i)
            .is_some_and(|r| r.member == member && r.start <= unit)
    }

    /// Member `member`'s ranges and units in total.
    pub fn count(&self, member: usize) -> (usize, u64) {
        self.ranges
            .iter()
            .filter(|r| r.member == member)
            .fold((0, 0), |(n, u), r| (n + 1, u + r.len))
    }

    /// Marks `unit` bad on `member`. Ok(true) if it was not yet; `Full` (nothing changed) if
    /// that needs a range past the bound.
    pub fn add(&mut self, member: usize, unit: u64) -> Result<bool, Full> {
        if self.contains(member, unit) {
            return Ok(false);
        }
        // The first range at or after (member, unit).
        let i = self
            .ranges
            .partition_point(|r| (r.member, r.start) < (member, unit));
        let joins_prev = i > 0 && {
            let p = self.ranges[i - 1];
            p.member == member && p.end() == unit && p.len < MAX_RANGE_LEN
        };
        let joins_next = self
            .ranges
            .get(i)
            .is_some_and(|n| n.member == member && n.start == unit + 1 && n.len < MAX_RANGE_LEN);
        let joins_both = joins_prev
            && joins_next
            && self.ranges[i - 1].len + 1 + self.ranges[i].len <= MAX_RANGE_LEN;
        match (joins_prev, joins_next) {
            (true, true) if joins_both => {
                let n = self.ranges.remove(i);
                self.ranges[i - 1].len += 1 + n.len;
            }
            (true, _) => self.ranges[i - 1].len += 1,
            (false, true) => {
                self.ranges[i].start -= 1;
                self.ranges[i].len += 1;
            }
            (false, false) => {
                if self.ranges.len() >= MAX_BAD_RANGES {
                    return Err(Full);
                }
                self.ranges.insert(
                    i,
                    BadRange {
                        member,
                        start: unit,
                        len: 1,
                    },
                );
            }
        }
        Ok(true)
    }

    /// Empties `member`'s list (a new device took the slot: the rebuild decides anew).
    pub fn forget(&mut self, member: usize) {
        self.ranges.retain(|r| r.member != member);
    }

    /// Takes `unit` off `member`'s list. True if it was there and is gone; false if it was
    /// not there, or taking it out of the middle of a range would need a range past the
    /// bound (then it stays bad: the list never loses a unit it cannot represent).
    pub fn remove(&mut self, member: usize, unit: u64) -> bool {
        if !self.contains(member, unit) {
            return false;
        }
        let i = self
            .ranges
            .partition_point(|r| (r.member, r.end()) <= (member, unit));
        let r = self.ranges[i];
        if r.len == 1 {
            self.ranges.remove(i);
        } else if unit == r.start {
            self.ranges[i].start += 1;
            self.ranges[i].len -= 1;
        } else if unit == r.end() - 1 {
            self.ranges[i].len -= 1;
        } else {
            if self.ranges.len() >= MAX_BAD_RANGES {
                return false;
            }
            self.ranges[i].len = unit - r.start;
            self.ranges.insert(
                i + 1,
                BadRange {
                    member,
                    start: unit + 1,
                    len: r.end() - unit - 1,
                },
            );
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn adds_merge_and_removes_split() {
        let mut b = BadBlocks::default();
        assert_eq!(b.add(2, 10), Ok(true));
        assert_eq!(b.add(2, 12), Ok(true));
        assert_eq!(b.add(2, 11), Ok(true));
        assert_eq!(b.add(2, 11), Ok(false));
        assert_eq!(b.add(0, 11), Ok(true));
        assert_eq!(
            b.ranges(),
            &[
                BadRange {
                    member: 0,
                    start: 11,
                    len: 1
                },
                BadRange {
                    member: 2,
                    start: 10,
                    len: 3
                }
            ]
        );
        assert!(b.contains(2, 12) && !b.contains(2, 13) && !b.contains(1, 11));
        assert_eq!(b.count(2), (1, 3));
        assert!(b.remove(2, 11));
        assert_eq!(b.count(2), (2, 2));
        assert!(!b.remove(2, 11));
        assert!(BadBlocks::check(b.ranges(), 3, 13).is_ok());
        assert!(BadBlocks::check(b.ranges(), 3, 12).is_err());
        assert!(BadBlocks::check(b.ranges(), 2, 13).is_err());
    }

    #[test]
    fn a_full_list_refuses_a_new_range_and_keeps_what_it_cannot_split() {
        let mut b = BadBlocks::default();
        for u in 0..MAX_BAD_RANGES as u64 {
            assert_eq!(b.add(1, 3 * u), Ok(true));
        }
        assert_eq!(b.add(1, 1000), Err(Full));
        assert!(!b.contains(1, 1000));
        // Growing a range needs no new one.
        assert_eq!(b.add(1, 1), Ok(true));
        assert_eq!(b.add(1, 2), Ok(true)); // joins 0..2 and 3: one range fewer
        assert_eq!(b.add(1, 1000), Ok(true));
        // Now full again: splitting 0..4 in the middle would need another range.
        assert!(!b.remove(1, 1));
        assert!(b.contains(1, 1));
        assert!(b.remove(1, 0));
    }

    proptest! {
        /// Against a set of (member, unit): every add and remove keeps the list canonical
        /// and says exactly what is in it.
        #[test]
        fn matches_a_set(ops in proptest::collection::vec((any::<bool>(), 0usize..3, 0u64..40), 0..200)) {
            let mut b = BadBlocks::default();
            let mut set = std::collections::BTreeSet::new();
            for (add, m, u) in ops {
                if add {
                    if b.add(m, u).is_ok() { set.insert((m, u)); }
                } else if b.remove(m, u) {
                    set.remove(&(m, u));
                }
                prop_assert!(BadBlocks::check(b.ranges(), 3, 40).is_ok());
            }
            for m in 0..3 { for u in 0..40 {
                prop_assert_eq!(b.contains(m, u), set.contains(&(m, u)));
            }}
        }
    }
}
