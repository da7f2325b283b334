//! Pure mapping between volume byte ranges and member extents, for every RAID level.
//!
//! Terms: a *chunk* is the contiguous run of bytes one member holds for one stripe; a *stripe*
//! (row) is one chunk on every member. For parity levels a stripe holds k data chunks and m
//! parity chunks; parity rotates md-style (left-symmetric): in stripe s the first parity chunk
//! sits on member `pd = n - 1 - (s mod n)`, parity j on `(pd + j) mod n`, and data chunk i on
//! `(pd + m + i) mod n`. For m = 1 and m = 2 this is exactly md's left-symmetric RAID5/RAID6.
//! Member offsets are relative to the member's data area (see `format::DATA_OFFSET`).

use crate::codec::{MAX_PARITY, MAX_SHARDS};
use std::fmt;

/// Volume sector: requests are multiples of this, at offsets that are multiples of it.
pub const SECTOR: u64 = 512;
pub const CHUNK_MIN: u64 = 4 << 10;
pub const CHUNK_MAX: u64 = 1 << 20;
pub const CHUNK_DEFAULT: u64 = 64 << 10;
/// Largest data area per member (64 PiB). With at most 64 members the volume size stays far
/// below u64::MAX, so size arithmetic cannot overflow.
pub const MEMBER_DATA_MAX: u64 = 1 << 56;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    /// n-way mirror.
    Raid1,
    /// md "near 2" layout: two copies of each chunk on adjacent positions.
    Raid10,
    Raid5,
    Raid6,
    /// Triple parity ("RAID 7.3").
    Raid7,
    /// General N+M erasure code with M parities.
    Ec {
        parity: u8,
    },
}

impl Level {
    /// Parity shards per stripe for parity levels; 0 otherwise.
    pub fn parity(self) -> usize {
        match self {
            Level::Raid0 | Level::Raid1 | Level::Raid10 => 0,
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            Level::Raid7 => 3,
            Level::Ec { parity } => parity as usize,
        }
    }

    pub fn is_parity(self) -> bool {
        self.parity() > 0
    }

    pub fn min_members(self) -> usize {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 | Level::Raid10 => 2,
            other => other.parity() + 2,
        }
    }

    /// Parses mdadm-style names: 0, 1, 10, 5, 6, 7 (or raid0..raid7) and "ec" with a parity.
    pub fn parse(s: &str, parity: Option<usize>) -> Result<Level, GeometryError> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix("raid").unwrap_or(&t);
        let lvl = match t {
            "0" => Level::Raid0,
            "1" => Level::Raid1,
            "10" => Level::Raid10,
            "5" => Level::Raid5,
            "6" => Level::Raid6,
            "7" | "7.3" => Level::Raid7,
            "ec" => {
                let p = parity.ok_or(GeometryError::EcNeedsParity)?;
                if p == 0 || p > MAX_PARITY {
                    return Err(GeometryError::Parity(p));
                }
                return Ok(Level::Ec { parity: p as u8 });
            }
            _ => return Err(GeometryError::UnknownLevel(s.to_string())),
        };
        if parity.is_some() {
            return Err(GeometryError::ParityOnlyForEc);
        }
        Ok(lvl)
    }

    /// Stable numeric code stored in the superblock.
    pub fn code(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid7 => 7,
            Level::Ec { .. } => 100,
        }
    }

    pub fn from_code(code: u32, parity: u32) -> Option<Level> {
        let l = match code {
            0 => Level::Raid0,
            1 => Level::Raid1,
            10 => Level::Raid10,
            5 => Level::Raid5,
            6 => Level::Raid6,
            7 => Level::Raid7,
            100 if (1..=MAX_PARITY as u32).contains(&parity) => Level::Ec {
                parity: parity as u8,
            },
            _ => return None,
        };
        (l.parity() as u32 == parity).then_some(l)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Raid0 => write!(f, "raid0"),
            Level::Raid1 => write!(f, "raid1"),
            Level::Raid10 => write!(f, "raid10"),
            Level::Raid5 => write!(f, "raid5"),
            Level::Raid6 => write!(f, "raid6"),
            Level::Raid7 => write!(f, "raid7"),
            Level::Ec { parity } => write!(f, "ec+{parity}"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("unknown RAID level '{0}' (expected 0, 1, 10, 5, 6, 7 or ec)")]
    UnknownLevel(String),
    #[error("--level ec needs --parity M")]
    EcNeedsParity,
    #[error("--parity is only valid with --level ec")]
    ParityOnlyForEc,
    #[error("parity count {0} out of range 1..={MAX_PARITY}")]
    Parity(usize),
    #[error("{level} needs at least {min} members, got {got}")]
    TooFewMembers {
        level: Level,
        min: usize,
        got: usize,
    },
    #[error("at most {MAX_SHARDS} members are supported, got {0}")]
    TooManyMembers(usize),
    #[error("chunk size {0} must be a power of two between 4K and 1M")]
    Chunk(u64),
    #[error("members are too small: each needs at least one {0}-byte chunk of data space")]
    TooSmall(u64),
    #[error("member data size {0} exceeds the supported maximum of 2^56 bytes")]
    TooLarge(u64),
}

/// A fully validated array shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub members: usize,
    pub chunk: u64,
    /// Data-area bytes used on each member: a whole number of chunks.
    pub member_data: u64,
}

/// One contiguous piece of a volume range that lies inside a single data chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Stripe (row) for striped and parity levels; chunk number for raid1/raid10.
    pub stripe: u64,
    /// Data chunk index within the stripe (0 for raid1/raid10).
    pub index: usize,
    /// Offset inside the chunk.
    pub chunk_off: u64,
    pub len: u64,
    /// Offset of this piece inside the caller's range.
    pub buf_off: u64,
}

/// What a member holds in a given stripe of a parity (or raid0) array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Data(usize),
    Parity(usize),
}

impl Geometry {
    pub fn new(
        level: Level,
        members: usize,
        chunk: u64,
        member_bytes: u64,
    ) -> Result<Self, GeometryError> {
        let min = level.min_members();
        if members < min {
            return Err(GeometryError::TooFewMembers {
                level,
                min,
                got: members,
            });
        }
        if members > MAX_SHARDS {
            return Err(GeometryError::TooManyMembers(members));
        }
        if !chunk.is_power_of_two() || !(CHUNK_MIN..=CHUNK_MAX).contains(&chunk) {
            return Err(GeometryError::Chunk(chunk));
        }
        let member_data = member_bytes / chunk * chunk;
        if member_data == 0 {
            return Err(GeometryError::TooSmall(chunk));
        }
        // Sizes come from untrusted superblocks too: the volume must fit in a u64 (with room
        // for the data offset on every member), or the shape is refused.
        if member_data > MEMBER_DATA_MAX {
            return Err(GeometryError::TooLarge(member_data));
        }
        Ok(Geometry {
            level,
            members,
            chunk,
            member_data,
        })
    }

    pub fn parity(&self) -> usize {
        self.level.parity()
    }

    /// Data chunks per stripe (k).
    pub fn data_chunks(&self) -> usize {
        match self.level {
            Level::Raid1 | Level::Raid10 => 1,
            Level::Raid0 => self.members,
            _ => self.members - self.parity(),
        }
    }

    /// Rows of chunks on each member.
    pub fn rows(&self) -> u64 {
        self.member_data / self.chunk
    }

    /// Members that may fail with every byte still readable, whatever the pattern.
    pub fn fault_tolerance(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid1 => self.members - 1,
            Level::Raid10 => 1,
            _ => self.parity(),
        }
    }

    pub fn volume_size(&self) -> u64 {
        match self.level {
            Level::Raid1 => self.member_data,
            Level::Raid10 => self.members as u64 * self.rows() / 2 * self.chunk,
            _ => self.data_chunks() as u64 * self.member_data,
        }
    }

    /// Volume bytes covered by one stripe (one chunk for raid1/raid10).
    pub fn stripe_data_bytes(&self) -> u64 {
        self.data_chunks() as u64 * self.chunk
    }

    /// Units of redundancy that resync and the write-intent bitmap track: stripes on parity
    /// levels, volume chunks (mirror rows, `mirror_copies`) on RAID1/10, chunk rows on RAID0.
    /// Unit u covers volume bytes `u * stripe_data_bytes() ..`, as `map` numbers `stripe`.
    pub fn units(&self) -> u64 {
        self.volume_size() / self.stripe_data_bytes()
    }

    /// Offset in each member's data area where unit `u` starts (non-decreasing in u).
    pub fn unit_member_offset(&self, u: u64) -> u64 {
        match self.level {
            Level::Raid10 => 2 * u / self.members as u64 * self.chunk,
            _ => u * self.chunk,
        }
    }

    /// The units whose member offset lies in `[lo, hi)` (member data-area bytes, multiples
    /// of the chunk): the inverse of `unit_member_offset` over a range.
    pub fn units_in(&self, lo: u64, hi: u64) -> std::ops::Range<u64> {
        let (a, b) = (lo / self.chunk, hi.div_ceil(self.chunk));
        let r = match self.level {
            // floor(2u / n) in [a, b)  <=>  u in [ceil(a n / 2), ceil(b n / 2)).
            Level::Raid10 => {
                let n = self.members as u64;
                (a * n).div_ceil(2)..(b * n).div_ceil(2)
            }
            _ => a..b,
        };
        r.start.min(self.units())..r.end.min(self.units())
    }

    /// Splits `[off, off + len)` into per-chunk extents. The range must lie inside the volume.
    pub fn map(&self, off: u64, len: u64) -> impl Iterator<Item = Extent> + '_ {
        debug_assert!(off
            .checked_add(len)
            .is_some_and(|e| e <= self.volume_size()));
        let sdb = self.stripe_data_bytes();
        let mut pos = off;
        let end = off + len;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let stripe = pos / sdb;
            let in_stripe = pos % sdb;
            let index = (in_stripe / self.chunk) as usize;
            let chunk_off = in_stripe % self.chunk;
            let l = (self.chunk - chunk_off).min(end - pos);
            let e = Extent {
                stripe,
                index,
                chunk_off,
                len: l,
                buf_off: pos - off,
            };
            pos += l;
            Some(e)
        })
    }

    /// First parity member of a stripe (parity levels).
    fn parity_start(&self, stripe: u64) -> usize {
        let n = self.members as u64;
        (n - 1 - stripe % n) as usize
    }

    /// Member holding data chunk `index` of `stripe` (raid0 and parity levels).
    pub fn data_member(&self, stripe: u64, index: usize) -> usize {
        match self.level {
            Level::Raid0 => index,
            _ => (self.parity_start(stripe) + self.parity() + index) % self.members,
        }
    }

    /// The most stripes in a row in which one member holds data: its data chunks there lie
    /// back to back, so one member read covers them. Parity levels: `data_chunks` (parity
    /// rotates by one member per stripe, so each member holds parity in `parity` stripes in a
    /// row, then data in the rest of the `members`). None when unbounded: raid0, and mirrors,
    /// where every chunk of a member follows the one before.
    pub fn data_run(&self) -> Option<u64> {
        match self.level {
            Level::Raid0 | Level::Raid1 | Level::Raid10 => None,
            _ => Some(self.data_chunks() as u64),
        }
    }

    /// Member holding parity `j` of `stripe`.
    pub fn parity_member(&self, stripe: u64, j: usize) -> usize {
        debug_assert!(j < self.parity());
        (self.parity_start(stripe) + j) % self.members
    }

    /// Inverse of data_member/parity_member.
    pub fn role(&self, stripe: u64, member: usize) -> Role {
        match self.level {
            Level::Raid0 => Role::Data(member),
            _ => {
                let m = self.parity();
                let rel = (member + self.members - self.parity_start(stripe)) % self.members;
                if rel < m {
                    Role::Parity(rel)
                } else {
                    Role::Data(rel - m)
                }
            }
        }
    }

    /// Offset in a member's data area of `chunk_off` within `stripe`.
    pub fn member_offset(&self, stripe: u64, chunk_off: u64) -> u64 {
        stripe * self.chunk + chunk_off
    }

    /// Copies of volume chunk `chunk` for mirror levels: (member, offset of the chunk's start).
    pub fn mirror_copies(&self, chunk: u64) -> Vec<(usize, u64)> {
        match self.level {
            Level::Raid1 => (0..self.members).map(|m| (m, chunk * self.chunk)).collect(),
            Level::Raid10 => {
                let n = self.members as u64;
                (0..2)
                    .map(|c| {
                        let p = 2 * chunk + c;
                        ((p % n) as usize, (p / n) * self.chunk)
                    })
                    .collect()
            }
            _ => panic!("mirror_copies on a non-mirror level"),
        }
    }

    /// The member data-area bytes that hold units `units` (every chunk of them: data, parity
    /// and mirror copies) and nothing else: at most one `(member, offset, len)` range per
    /// member, in member order. What a discard of those units sends each member.
    pub fn unit_ranges(&self, units: std::ops::Range<u64>) -> Vec<(usize, u64, u64)> {
        let (u0, u1) = (units.start.min(self.units()), units.end.min(self.units()));
        if u0 >= u1 {
            return Vec::new();
        }
        let n = self.members as u64;
        (0..self.members)
            .filter_map(|m| {
                let (r0, r1) = match self.level {
                    // Copy positions p = 2u, 2u + 1 of unit u lie on member p % n, row p / n:
                    // member m holds the rows r with r * n + m in [2 u0, 2 u1).
                    Level::Raid10 => {
                        let first = |p: u64| p.saturating_sub(m as u64).div_ceil(n);
                        (first(2 * u0), first(2 * u1))
                    }
                    _ => (u0, u1),
                };
                (r1 > r0).then(|| (m, r0 * self.chunk, (r1 - r0) * self.chunk))
            })
            .collect()
    }

    /// Whether every volume byte is still readable with the members in `failed` (bit i =
    /// member i) gone.
    /// Whether every byte can still be served with the members in `lost` gone.
    pub fn survives(&self, lost: crate::MemberSet) -> bool {
        self.can_serve(lost.bits())
    }

    /// Whether an operator may fail member `i` when the members in `lost` are already lost
    /// (missing, failed or being rebuilt): never when the array could not survive it, and
    /// without `force` not when it would leave no redundancy. The refusal says why.
    pub fn check_fail(&self, lost: crate::MemberSet, i: usize, force: bool) -> Result<(), String> {
        let after = lost.with(i);
        if !self.survives(after) {
            return Err(format!(
                "failing member {i} would fail the array ({} of {} members lost, {} tolerates {})",
                after.len(),
                self.members,
                self.level,
                self.fault_tolerance()
            ));
        }
        if after.len() >= self.fault_tolerance() && !force {
            return Err(format!(
                "failing member {i} would leave the array without redundancy; pass --force"
            ));
        }
        Ok(())
    }

    pub fn can_serve(&self, failed: u64) -> bool {
        let lost = failed.count_ones() as usize;
        match self.level {
            Level::Raid0 => lost == 0,
            Level::Raid1 => lost < self.members,
            Level::Raid10 => {
                // Copy pairs repeat with a period of n chunks.
                let chunks = (self.volume_size() / self.chunk).min(self.members as u64);
                (0..chunks).all(|c| {
                    self.mirror_copies(c)
                        .iter()
                        .any(|(m, _)| failed & (1 << m) == 0)
                })
            }
            _ => lost <= self.parity(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn levels() -> Vec<Level> {
        vec![
            Level::Raid0,
            Level::Raid1,
            Level::Raid10,
            Level::Raid5,
            Level::Raid6,
            Level::Raid7,
            Level::Ec { parity: 4 },
        ]
    }

    /// `unit_ranges` covers exactly the chunks of the units, checked chunk by chunk against
    /// `mirror_copies` and `role` (every chunk of a parity or raid0 stripe is its unit's).
    #[test]
    fn unit_ranges_are_exactly_the_units_chunks() {
        for level in levels() {
            for n in [level.min_members(), level.min_members() + 1, 7] {
                if n < level.min_members() || matches!(level, Level::Ec { .. }) && n < 6 {
                    continue;
                }
                let g = Geometry::new(level, n, 4096, 4096 * 13).unwrap();
                for u0 in 0..=g.units() {
                    for u1 in u0..=g.units() + 1 {
                        let mut want = std::collections::BTreeSet::new();
                        for u in u0..u1.min(g.units()) {
                            match level {
                                Level::Raid1 | Level::Raid10 => {
                                    want.extend(g.mirror_copies(u));
                                }
                                _ => want.extend((0..n).map(|m| (m, u * g.chunk))),
                            }
                        }
                        let mut got = std::collections::BTreeSet::new();
                        let ranges = g.unit_ranges(u0..u1);
                        for &(m, off, len) in &ranges {
                            assert!(len > 0 && off % g.chunk == 0 && len % g.chunk == 0);
                            assert!(off + len <= g.member_data, "{level} {n} {u0}..{u1}");
                            for c in 0..len / g.chunk {
                                got.insert((m, off + c * g.chunk));
                            }
                        }
                        assert_eq!(got, want, "{level} n={n} units {u0}..{u1}");
                        let members: Vec<usize> = ranges.iter().map(|r| r.0).collect();
                        assert!(members.windows(2).all(|w| w[0] < w[1]));
                    }
                }
            }
        }
    }

    #[test]
    fn raid5_is_md_left_symmetric() {
        // md raid5, 4 disks, left-symmetric: stripe 0 parity on disk 3, data 0,1,2 on 0,1,2;
        // stripe 1 parity on disk 2, data 0 on disk 3, then 0, 1.
        let g = Geometry::new(Level::Raid5, 4, 65536, 1 << 20).unwrap();
        assert_eq!(g.parity_member(0, 0), 3);
        assert_eq!(
            (0..3).map(|i| g.data_member(0, i)).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(g.parity_member(1, 0), 2);
        assert_eq!(
            (0..3).map(|i| g.data_member(1, i)).collect::<Vec<_>>(),
            vec![3, 0, 1]
        );
    }

    #[test]
    fn raid6_q_follows_p() {
        let g = Geometry::new(Level::Raid6, 5, 65536, 1 << 20).unwrap();
        assert_eq!((g.parity_member(0, 0), g.parity_member(0, 1)), (4, 0));
        assert_eq!(
            (0..3).map(|i| g.data_member(0, i)).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn shapes_are_validated() {
        assert!(matches!(
            Geometry::new(Level::Raid6, 3, 65536, 1 << 20),
            Err(GeometryError::TooFewMembers { .. })
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 4, 3000, 1 << 20),
            Err(GeometryError::Chunk(3000))
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 4, 2 << 20, 8 << 20),
            Err(GeometryError::Chunk(_))
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 4, 65536, 1000),
            Err(GeometryError::TooSmall(_))
        ));
        assert!(matches!(
            Geometry::new(Level::Raid0, 65, 65536, 1 << 20),
            Err(GeometryError::TooManyMembers(65))
        ));
        assert_eq!(Level::parse("raid6", None), Ok(Level::Raid6));
        assert_eq!(Level::parse("ec", Some(4)), Ok(Level::Ec { parity: 4 }));
        assert_eq!(Level::parse("ec", None), Err(GeometryError::EcNeedsParity));
        assert_eq!(
            Level::parse("5", Some(2)),
            Err(GeometryError::ParityOnlyForEc)
        );
        assert!(Level::parse("4", None).is_err());
        for l in levels() {
            assert_eq!(Level::from_code(l.code(), l.parity() as u32), Some(l));
        }
        assert_eq!(Level::from_code(6, 1), None);
    }

    #[test]
    fn raid10_tolerates_non_adjacent_losses_only() {
        let g = Geometry::new(Level::Raid10, 4, 65536, 1 << 20).unwrap();
        assert!(g.can_serve(0b0101)); // members 0 and 2: one of each pair
        assert!(!g.can_serve(0b0011)); // pair (0,1) lost
        let g = Geometry::new(Level::Raid10, 3, 65536, 1 << 20).unwrap();
        assert!(g.can_serve(0b001));
        assert!(!g.can_serve(0b101));
    }

    proptest! {
        /// Extents tile the range exactly and each lies within one chunk.
        #[test]
        fn map_tiles_range(li in 0usize..7, n in 2usize..17, chunk_shift in 12u32..21,
                           a in any::<u64>(), b in any::<u64>()) {
            let level = levels()[li];
            prop_assume!(n >= level.min_members());
            let g = Geometry::new(level, n, 1 << chunk_shift, 16 << 20).unwrap();
            let vs = g.volume_size();
            let off = a % vs;
            let len = b % (vs - off + 1);
            let mut next = 0;
            for e in g.map(off, len) {
                prop_assert_eq!(e.buf_off, next);
                prop_assert!(e.len > 0 && e.chunk_off + e.len <= g.chunk);
                prop_assert!(e.index < g.data_chunks());
                prop_assert_eq!(e.stripe * g.stripe_data_bytes() + e.index as u64 * g.chunk + e.chunk_off, off + e.buf_off);
                next += e.len;
            }
            prop_assert_eq!(next, len);
        }

        /// Every member plays exactly one role in every stripe, and role() inverts the maps.
        #[test]
        fn roles_are_a_permutation(li in 0usize..7, n in 2usize..65, stripe in any::<u64>()) {
            let level = levels()[li];
            prop_assume!(n >= level.min_members() && !matches!(level, Level::Raid1 | Level::Raid10));
            let g = Geometry::new(level, n, 65536, 1 << 20).unwrap();
            let mut seen = vec![false; n];
            for i in 0..g.data_chunks() {
                let m = g.data_member(stripe, i);
                prop_assert!(!seen[m]);
                seen[m] = true;
                prop_assert_eq!(g.role(stripe, m), Role::Data(i));
            }
            for j in 0..g.parity() {
                let m = g.parity_member(stripe, j);
                prop_assert!(!seen[m]);
                seen[m] = true;
                prop_assert_eq!(g.role(stripe, m), Role::Parity(j));
            }
            prop_assert!(seen.iter().all(|&s| s));
        }

        /// `data_run` is the longest run of stripes in which one member holds data (counted
        /// over three rotations, so a run across the period's end counts whole).
        #[test]
        fn data_run_is_the_longest_run_of_data(li in 0usize..7, n in 2usize..20, m in 0usize..20) {
            let level = levels()[li];
            prop_assume!(n >= level.min_members() && !matches!(level, Level::Raid0 | Level::Raid1 | Level::Raid10));
            let g = Geometry::new(level, n, 65536, 1 << 20).unwrap();
            let m = m % n;
            let (mut run, mut longest) = (0u64, 0u64);
            for stripe in 0..3 * n as u64 {
                run = if matches!(g.role(stripe, m), Role::Data(_)) { run + 1 } else { 0 };
                longest = longest.max(run);
            }
            prop_assert_eq!(Some(longest), g.data_run());
        }

        /// Mirror copies land on distinct members, inside the data area, and no two volume
        /// chunks share a member location.
        #[test]
        fn mirror_copies_are_distinct(n in 2usize..9, raid10 in any::<bool>()) {
            let level = if raid10 { Level::Raid10 } else { Level::Raid1 };
            let g = Geometry::new(level, n, 4096, 64 * 4096).unwrap();
            let mut used = std::collections::HashSet::new();
            for c in 0..g.volume_size() / g.chunk {
                let copies = g.mirror_copies(c);
                let members: std::collections::HashSet<_> = copies.iter().map(|c| c.0).collect();
                prop_assert_eq!(members.len(), copies.len());
                for (m, o) in copies {
                    prop_assert!(o + g.chunk <= g.member_data);
                    if raid10 { prop_assert!(used.insert((m, o))); }
                }
            }
        }
    }
}
