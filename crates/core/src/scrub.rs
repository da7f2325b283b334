//! Scrub verdicts: does a stripe's parity match its data, and if not, which chunk is wrong?
//!
//! A stripe is checked in columns of `COLUMN` bytes (each a slice at the same offset of every
//! chunk), so two corruptions in different places of one stripe are located separately. In a
//! column whose parity disagrees with its data:
//! * with one parity (RAID5) nothing says which chunk is wrong: `Unlocatable`;
//! * with two or more, the column is tried with each chunk in turn assumed wrong: a data
//!   chunk is decoded from the other data and the first parity that is not itself the
//!   suspect, a parity chunk recomputed from the data; the suspect is *located* when every
//!   other chunk then agrees, and no other suspect does. This is what H. P. Anvin's
//!   z = log Q* − log P* computes for RAID6 (md's raid6check), done generally for any number
//!   of parities (one decode per suspect: the cost is paid only for mismatching columns).
//!
//! Mirrors: copies are compared column by column; with three or more copies a single copy
//! that differs from the others is located by majority, with two nothing is located.
//!
//! Pure: no I/O. The engine reads the chunks and writes the repairs (recovery/scrub.rs).

use crate::codec::Codec;

/// Bytes per column.
pub const COLUMN: usize = 4096;

/// What one column holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Column {
    Consistent,
    /// Shard `shard` (data 0..k, parity k..k+m; mirrors: the copy index) is wrong here:
    /// `good` is what it should hold, `bytes` how many bytes of it differ.
    Located {
        shard: usize,
        good: Vec<u8>,
        bytes: usize,
        /// Offset in the column of the first byte that differs.
        first: usize,
    },
    /// Parity disagrees and no single shard explains it.
    Unlocatable,
}

/// Verdicts for each column of one stripe. `shards`: k data chunks then m parity chunks,
/// equally long (a multiple of `COLUMN`, or shorter than one column).
pub fn check_stripe(codec: &Codec, shards: &[&[u8]]) -> Vec<Column> {
    let (k, m) = (codec.data_shards(), codec.parity_shards());
    assert_eq!(shards.len(), k + m);
    let len = shards[0].len();
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let end = (at + COLUMN).min(len);
        let col: Vec<&[u8]> = shards.iter().map(|s| &s[at..end]).collect();
        out.push(check_column(codec, &col));
        at = end;
    }
    out
}

fn encode(codec: &Codec, data: &[&[u8]]) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut parity: Vec<Vec<u8>> = (0..codec.parity_shards()).map(|_| vec![0; len]).collect();
    let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
    codec.encode(data, &mut out);
    parity
}

/// How many bytes differ, and where the first one is.
fn differing(a: &[u8], b: &[u8]) -> (usize, usize) {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    let first = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    (n, first)
}

fn check_column(codec: &Codec, col: &[&[u8]]) -> Column {
    let (k, m) = (codec.data_shards(), codec.parity_shards());
    let parity = encode(codec, &col[..k]);
    let bad_parity: Vec<usize> = (0..m).filter(|&j| parity[j][..] != *col[k + j]).collect();
    if bad_parity.is_empty() {
        return Column::Consistent;
    }
    if m < 2 {
        return Column::Unlocatable;
    }
    let mut found: Option<(usize, Vec<u8>)> = None;
    // A parity chunk alone wrong: the data agree with every other parity.
    if bad_parity.len() == 1 {
        let j = bad_parity[0];
        found = Some((k + j, parity[j].clone()));
    }
    // A data chunk wrong: decoded from the other data and one parity, everything agrees.
    for s in 0..k {
        let avail: Vec<usize> = (0..k).filter(|&i| i != s).chain([k]).collect();
        let shards: Vec<&[u8]> = avail.iter().map(|&i| col[i]).collect();
        let mut fixed = vec![0u8; col[0].len()];
        if codec
            .decode(&avail, &shards, &[s], &mut [&mut fixed[..]])
            .is_err()
        {
            continue;
        }
        if fixed[..] == *col[s] {
            continue;
        }
        let data: Vec<&[u8]> = (0..k)
            .map(|i| if i == s { &fixed[..] } else { col[i] })
            .collect();
        let p = encode(codec, &data);
        if (0..m).all(|j| p[j][..] == *col[k + j]) {
            if found.is_some() {
                return Column::Unlocatable;
            }
            found = Some((s, fixed));
        }
    }
    match found {
        Some((shard, good)) => {
            let (bytes, first) = differing(&good, col[shard]);
            Column::Located {
                shard,
                bytes,
                first,
                good,
            }
        }
        None => Column::Unlocatable,
    }
}

/// Verdicts for each column of a mirror row: `copies` of one chunk.
pub fn check_copies(copies: &[&[u8]]) -> Vec<Column> {
    let len = copies[0].len();
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let end = (at + COLUMN).min(len);
        let col: Vec<&[u8]> = copies.iter().map(|c| &c[at..end]).collect();
        out.push(if col.iter().all(|c| *c == col[0]) {
            Column::Consistent
        } else {
            // A copy that differs from all the others while those agree.
            let odd: Vec<usize> = (0..col.len())
                .filter(|&i| {
                    let rest: Vec<&[u8]> =
                        (0..col.len()).filter(|&j| j != i).map(|j| col[j]).collect();
                    rest.iter().all(|r| *r == rest[0]) && rest[0] != col[i]
                })
                .collect();
            match odd[..] {
                [i] if col.len() >= 3 => {
                    let good = col[(i + 1) % col.len()].to_vec();
                    let (bytes, first) = differing(&good, col[i]);
                    Column::Located {
                        shard: i,
                        bytes,
                        first,
                        good,
                    }
                }
                _ => Column::Unlocatable,
            }
        });
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stripe(codec: &Codec, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut x = seed | 1;
        let data: Vec<Vec<u8>> = (0..codec.data_shards())
            .map(|_| {
                (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let mut all = data.clone();
        all.extend(encode(codec, &refs));
        all
    }

    fn verdicts(codec: &Codec, s: &[Vec<u8>]) -> Vec<Column> {
        let refs: Vec<&[u8]> = s.iter().map(|c| &c[..]).collect();
        check_stripe(codec, &refs)
    }

    #[test]
    fn consistent_stripes_pass() {
        for (k, m) in [(3, 1), (4, 2), (5, 3), (6, 4)] {
            let c = Codec::new(k, m).unwrap();
            let s = stripe(&c, 2 * COLUMN, 9);
            assert!(verdicts(&c, &s).iter().all(|v| *v == Column::Consistent));
        }
    }

    #[test]
    fn raid5_mismatch_is_reported_not_located() {
        let c = Codec::new(3, 1).unwrap();
        let mut s = stripe(&c, COLUMN, 3);
        s[1][100] ^= 0x40;
        assert_eq!(verdicts(&c, &s), vec![Column::Unlocatable]);
    }

    #[test]
    fn two_corrupt_chunks_in_one_column_of_raid6_are_not_blamed_on_one() {
        let c = Codec::new(4, 2).unwrap();
        let mut s = stripe(&c, COLUMN, 4);
        s[0][7] ^= 1;
        s[2][9] ^= 0x80;
        assert_eq!(verdicts(&c, &s), vec![Column::Unlocatable]);
    }

    proptest! {
        /// Any single corrupted chunk (data or parity) in any column is located, with the
        /// exact bytes it should hold, on every code with two or more parities; other
        /// columns stay consistent.
        #[test]
        fn one_corrupt_chunk_is_located(
            km in prop::sample::select(vec![(2usize, 2usize), (4, 2), (8, 2), (5, 3), (6, 4)]),
            seed in any::<u64>(),
            col in 0usize..3,
            pos in 0usize..COLUMN,
            span in 1usize..300,
            flip in 1u8..=255,
            who in any::<prop::sample::Index>(),
        ) {
            let (k, m) = km;
            let c = Codec::new(k, m).unwrap();
            let good = stripe(&c, 3 * COLUMN, seed);
            let mut bad = good.clone();
            let shard = who.index(k + m);
            let end = (pos + span).min(COLUMN);
            for b in &mut bad[shard][col * COLUMN + pos..col * COLUMN + end] {
                *b ^= flip;
            }
            let v = verdicts(&c, &bad);
            for (i, x) in v.iter().enumerate() {
                if i == col {
                    prop_assert_eq!(x, &Column::Located {
                        shard,
                        good: good[shard][col * COLUMN..(col + 1) * COLUMN].to_vec(),
                        bytes: end - pos,
                        first: pos,
                    });
                } else {
                    prop_assert_eq!(x, &Column::Consistent);
                }
            }
        }

        /// Three or more mirror copies: a single bad copy is located; two copies: reported.
        #[test]
        fn one_bad_mirror_copy(n in 2usize..5, who in any::<prop::sample::Index>(), pos in 0usize..COLUMN) {
            let good = vec![0x5au8; COLUMN];
            let mut copies = vec![good.clone(); n];
            let i = who.index(n);
            copies[i][pos] ^= 0xff;
            let refs: Vec<&[u8]> = copies.iter().map(|c| &c[..]).collect();
            let v = check_copies(&refs);
            if n >= 3 {
                prop_assert_eq!(&v[0], &Column::Located { shard: i, good, bytes: 1, first: pos });
            } else {
                prop_assert_eq!(&v[0], &Column::Unlocatable);
            }
        }
    }
}
