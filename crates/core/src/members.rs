//! Typed member sets and member health, so that the engine never tests raw bit masks.
//!
//! A `MemberSet` is a set of member slots (at most `codec::MAX_SHARDS` = 64, one bit each).
//! The engine keeps its failed set as one of these (in an atomic, see engine `members.rs`);
//! assembly computes the missing set as one.

use crate::codec::MAX_SHARDS;
use std::fmt;

/// A set of member slots `0..64`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemberSet(u64);

impl MemberSet {
    pub const EMPTY: MemberSet = MemberSet(0);

    pub const fn from_bits(bits: u64) -> MemberSet {
        MemberSet(bits)
    }

    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Every slot `0..n`.
    pub fn all(n: usize) -> MemberSet {
        assert!(n <= MAX_SHARDS);
        if n == 64 {
            MemberSet(u64::MAX)
        } else {
            MemberSet((1u64 << n) - 1)
        }
    }

    pub fn one(i: usize) -> MemberSet {
        MemberSet(1 << i)
    }

    pub fn contains(self, i: usize) -> bool {
        i < 64 && self.0 & (1 << i) != 0
    }

    #[must_use]
    pub fn with(self, i: usize) -> MemberSet {
        MemberSet(self.0 | 1 << i)
    }

    #[must_use]
    pub fn without(self, i: usize) -> MemberSet {
        MemberSet(self.0 & !(1 << i))
    }

    #[must_use]
    pub fn union(self, o: MemberSet) -> MemberSet {
        MemberSet(self.0 | o.0)
    }

    #[must_use]
    pub fn intersect(self, o: MemberSet) -> MemberSet {
        MemberSet(self.0 & o.0)
    }

    #[must_use]
    pub fn minus(self, o: MemberSet) -> MemberSet {
        MemberSet(self.0 & !o.0)
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Slots in ascending order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut b = self.0;
        std::iter::from_fn(move || {
            if b == 0 {
                None
            } else {
                let i = b.trailing_zeros() as usize;
                b &= b - 1;
                Some(i)
            }
        })
    }
}

impl FromIterator<usize> for MemberSet {
    fn from_iter<I: IntoIterator<Item = usize>>(it: I) -> Self {
        it.into_iter().fold(MemberSet::EMPTY, MemberSet::with)
    }
}

impl fmt::Debug for MemberSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl fmt::Display for MemberSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<String> = self.iter().map(|i| i.to_string()).collect();
        write!(f, "[{}]", v.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let s: MemberSet = [0, 3, 63].into_iter().collect();
        assert_eq!(s.len(), 3);
        assert!(s.contains(3) && s.contains(63) && !s.contains(1) && !s.contains(64));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 3, 63]);
        assert_eq!(
            s.without(3).with(1).iter().collect::<Vec<_>>(),
            vec![0, 1, 63]
        );
        assert_eq!(MemberSet::all(4).minus(s), [1, 2].into_iter().collect());
        assert_eq!(MemberSet::all(64).len(), 64);
        assert_eq!(format!("{}", s), "[0, 3, 63]");
        assert!(MemberSet::EMPTY.is_empty());
    }
}
