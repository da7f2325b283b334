//! The parity codec: k data shards, m parity shards, any m erasures recoverable.
//!
//! ## The math
//! Parity j of a stripe is `P_j = sum_i A[j][i] * D_i` over GF(2^8) (see `gf`), byte by byte.
//! The coefficient matrix A (m x k) is chosen so every square submatrix is invertible, which is
//! exactly the condition for the code [I; A] to recover any m lost shards:
//!
//! * m <= 3: `A[j][i] = (2^i)^j`. Row 0 is all ones (P = XOR), row 1 is `2^i` (Q, identical to
//!   Linux md's RAID6 Q), row 2 is `4^i` (R, as in ZFS raidz3). This is a Vandermonde matrix on
//!   the distinct nodes x_i = 2^i (i < 255); its 1x1 minors are non-zero, its 2x2 minors are
//!   (x+y)^2, xy(x+y) or (y+x) times a power, all non-zero for distinct non-zero x, y, and the
//!   3x3 minor is a Vandermonde determinant. So every erasure pattern of <= 3 is decodable.
//! * m >= 4: Vandermonde matrices can have singular submatrices (isa-l#46), so A is a Cauchy
//!   matrix `1 / (x_j + y_i)` with x_j = j, y_i = m + i, each column scaled so row 0 is all ones
//!   (P stays XOR). Every square submatrix of a Cauchy matrix is invertible, and scaling columns
//!   by non-zero constants preserves that.
//!
//! Decoding picks k surviving shards, inverts the k x k rows of [I; A] they correspond to, and
//! multiplies the wanted rows of the inverse with the survivors. The fast path runs in ISA-L;
//! `reference` holds a scalar implementation of the same math that tests compare against.

use crate::gf;
pub use uraid_isal::Tables;

/// Largest parity count supported (`--level ec --parity M`).
pub const MAX_PARITY: usize = 8;
/// Largest total shard count (N + M).
pub const MAX_SHARDS: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("parity count {0} out of range 1..={MAX_PARITY}")]
    Parity(usize),
    #[error("{k} data + {m} parity shards exceed {MAX_SHARDS}")]
    TooWide { k: usize, m: usize },
    #[error("only {have} of the {need} shards needed to decode are available")]
    TooFewShards { have: usize, need: usize },
}

/// Builds the m x k coefficient matrix described in the module documentation.
pub fn parity_matrix(k: usize, m: usize) -> Vec<u8> {
    let mut a = vec![0u8; m * k];
    if m <= 3 {
        for j in 0..m {
            for i in 0..k {
                a[j * k + i] = gf::pow(gf::exp2(i), j);
            }
        }
    } else {
        for j in 0..m {
            for i in 0..k {
                a[j * k + i] = gf::inv((j as u8) ^ ((m + i) as u8));
            }
        }
        for i in 0..k {
            let s = gf::inv(a[i]);
            for j in 0..m {
                a[j * k + i] = gf::mul(a[j * k + i], s);
            }
        }
    }
    a
}

/// Row `shard` of the generator [I; A]: the coefficients that produce it from the k data shards.
fn generator_row(matrix: &[u8], k: usize, shard: usize) -> Vec<u8> {
    if shard < k {
        let mut r = vec![0u8; k];
        r[shard] = 1;
        r
    } else {
        matrix[(shard - k) * k..(shard - k + 1) * k].to_vec()
    }
}

/// For survivors `avail` (exactly k shard indices) returns, for each wanted data index, the row
/// of coefficients over the survivors that reproduces it: a `wanted.len() x k` matrix.
pub fn decode_matrix(
    matrix: &[u8],
    k: usize,
    avail: &[usize],
    wanted: &[usize],
) -> Result<Vec<u8>, CodecError> {
    if avail.len() < k {
        return Err(CodecError::TooFewShards {
            have: avail.len(),
            need: k,
        });
    }
    let mut sq = Vec::with_capacity(k * k);
    for &s in &avail[..k] {
        sq.extend(generator_row(matrix, k, s));
    }
    // Invertible by construction (MDS code); a failure here is a bug in parity_matrix.
    let inv = gf::invert(&sq, k).expect("coding matrix is MDS: every k x k selection inverts");
    let mut out = Vec::with_capacity(wanted.len() * k);
    for &w in wanted {
        assert!(w < k, "decode_matrix recovers data shards only");
        out.extend_from_slice(&inv[w * k..(w + 1) * k]);
    }
    Ok(out)
}

/// The ISA-L backed codec for one (k, m) shape.
#[derive(Debug, Clone)]
pub struct Codec {
    k: usize,
    m: usize,
    matrix: Vec<u8>,
    enc: Tables,
}

impl Codec {
    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        if m == 0 || m > MAX_PARITY {
            return Err(CodecError::Parity(m));
        }
        if k == 0 || k + m > MAX_SHARDS {
            return Err(CodecError::TooWide { k, m });
        }
        let matrix = parity_matrix(k, m);
        let enc = Tables::new(k, m, &matrix);
        Ok(Codec { k, m, matrix, enc })
    }

    pub fn data_shards(&self) -> usize {
        self.k
    }

    pub fn parity_shards(&self) -> usize {
        self.m
    }

    pub fn matrix(&self) -> &[u8] {
        &self.matrix
    }

    /// Computes all m parities of k equally long data buffers. For one and two parities the
    /// dedicated RAID kernels (xor_gen, pq_gen) are used when the buffers suit them; they
    /// compute exactly rows 0 and 1 of the matrix and run about twice as fast.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        let fast = match parity {
            [p] => uraid_isal::xor_parity(data, p),
            [p, q] => uraid_isal::pq_parity(data, p, q),
            _ => false,
        };
        if !fast {
            self.enc.encode(data, parity);
        }
    }

    /// Read-modify-write: `parity[j] ^= A[j][index] * delta` where delta = old XOR new data.
    pub fn update(&self, index: usize, delta: &[u8], parity: &mut [&mut [u8]]) {
        self.enc.encode_update(index, delta, parity);
    }

    /// Recovers data shards `wanted` (indices < k) from survivors. `avail` lists the shard
    /// indices (data 0..k, parity k..k+m) of `shards`, in the same order; at least k needed.
    pub fn decode(
        &self,
        avail: &[usize],
        shards: &[&[u8]],
        wanted: &[usize],
        out: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        self.decode_using(avail, shards, wanted, out, |a, w| {
            self.decode_tables(a, w).map(Box::new)
        })
    }

    /// The ISA-L tables that recover `wanted` from the first k survivors of `avail` (a k x k
    /// inversion and table expansion: microseconds). They depend only on (k, m), the
    /// survivors used and `wanted`, so a caller may keep them per erasure pattern and hand
    /// them to `decode_using`.
    pub fn decode_tables(&self, avail: &[usize], wanted: &[usize]) -> Result<Tables, CodecError> {
        let rows = decode_matrix(&self.matrix, self.k, avail, wanted)?;
        Ok(Tables::new(self.k, wanted.len(), &rows))
    }

    /// `decode`, taking the decode tables (when the XOR path does not apply) from
    /// `tables(avail, wanted)`: `decode_tables`' result, fresh or kept.
    pub fn decode_using<T: std::ops::Deref<Target = Tables>>(
        &self,
        avail: &[usize],
        shards: &[&[u8]],
        wanted: &[usize],
        out: &mut [&mut [u8]],
        tables: impl FnOnce(&[usize], &[usize]) -> Result<T, CodecError>,
    ) -> Result<(), CodecError> {
        assert_eq!(avail.len(), shards.len());
        assert_eq!(wanted.len(), out.len());
        if wanted.is_empty() {
            return Ok(());
        }
        // One lost data shard rebuilt from the other data shards and P: P is the XOR of the
        // data (row 0 of A is all ones), so the lost shard is the XOR of the k survivors. This
        // is every single-failure read on RAID5/RAID6; xor_gen does it without building
        // decode tables (it declines unaligned buffers, which take the general path).
        if let ([w], [out0]) = (wanted, &mut *out) {
            let xor_set = avail.len() >= self.k
                && avail[..self.k]
                    .iter()
                    .all(|&s| s == self.k || (s < self.k && s != *w))
                && avail[..self.k].contains(&self.k);
            if xor_set && uraid_isal::xor_parity(&shards[..self.k], out0) {
                return Ok(());
            }
        }
        if avail.len() < self.k {
            return Err(CodecError::TooFewShards {
                have: avail.len(),
                need: self.k,
            });
        }
        let t = tables(avail, wanted)?;
        t.encode(&shards[..self.k], out);
        Ok(())
    }
}

/// Scalar reference implementation of the same code, for cross-checking ISA-L in tests.
pub mod reference {
    use super::*;

    pub fn encode(k: usize, m: usize, data: &[&[u8]]) -> Vec<Vec<u8>> {
        let a = parity_matrix(k, m);
        let len = data[0].len();
        (0..m)
            .map(|j| {
                let mut p = vec![0u8; len];
                for (i, d) in data.iter().enumerate() {
                    let c = a[j * k + i];
                    for (pb, db) in p.iter_mut().zip(d.iter()) {
                        *pb ^= gf::mul(c, *db);
                    }
                }
                p
            })
            .collect()
    }

    pub fn decode(
        k: usize,
        m: usize,
        avail: &[usize],
        shards: &[&[u8]],
        wanted: &[usize],
    ) -> Result<Vec<Vec<u8>>, CodecError> {
        let a = parity_matrix(k, m);
        let rows = decode_matrix(&a, k, avail, wanted)?;
        let len = shards[0].len();
        Ok((0..wanted.len())
            .map(|w| {
                let mut o = vec![0u8; len];
                for (s, sh) in shards.iter().take(k).enumerate() {
                    let c = rows[w * k + s];
                    for (ob, b) in o.iter_mut().zip(sh.iter()) {
                        *ob ^= gf::mul(c, *b);
                    }
                }
                o
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn shards(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..k)
            .map(|_| (0..len).map(|_| r.gen()).collect())
            .collect()
    }

    fn combinations(n: usize, r: usize) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        let mut cur = Vec::new();
        fn go(start: usize, n: usize, r: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
            if cur.len() == r {
                out.push(cur.clone());
                return;
            }
            for i in start..n {
                cur.push(i);
                go(i + 1, n, r, cur, out);
                cur.pop();
            }
        }
        go(0, n, r, &mut cur, &mut out);
        out
    }

    #[test]
    fn p_is_xor_and_q_is_md_raid6_q() {
        let a = parity_matrix(6, 2);
        assert!(a[..6].iter().all(|&c| c == 1));
        assert_eq!(&a[6..], &[1, 2, 4, 8, 16, 32]);
        for m in 4..=MAX_PARITY {
            let a = parity_matrix(10, m);
            assert!(a[..10].iter().all(|&c| c == 1), "m={m}: P must stay XOR");
        }
    }

    /// Every k <= 16, m <= 4, every erasure pattern of up to m shards: ISA-L encode equals the
    /// scalar reference, and ISA-L decode recovers exactly the lost data.
    #[test]
    fn isal_matches_reference_for_every_erasure_pattern() {
        let len = 67; // odd length exercises ISA-L's tail handling
        for k in 1..=16 {
            for m in 1..=4 {
                let codec = Codec::new(k, m).unwrap();
                let data = shards(k, len, (k * 31 + m) as u64);
                let drefs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                let mut parity = vec![vec![0u8; len]; m];
                {
                    let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
                    codec.encode(&drefs, &mut prefs);
                }
                assert_eq!(
                    parity,
                    reference::encode(k, m, &drefs),
                    "encode k={k} m={m}"
                );
                let all: Vec<&[u8]> = drefs
                    .iter()
                    .copied()
                    .chain(parity.iter().map(|p| &p[..]))
                    .collect();
                for lost in 1..=m {
                    for erased in combinations(k + m, lost) {
                        let avail: Vec<usize> =
                            (0..k + m).filter(|i| !erased.contains(i)).collect();
                        let survivors: Vec<&[u8]> = avail.iter().map(|&i| all[i]).collect();
                        let wanted: Vec<usize> =
                            erased.iter().copied().filter(|&i| i < k).collect();
                        let mut out = vec![vec![0u8; len]; wanted.len()];
                        {
                            let mut orefs: Vec<&mut [u8]> =
                                out.iter_mut().map(|o| &mut o[..]).collect();
                            codec
                                .decode(&avail, &survivors, &wanted, &mut orefs)
                                .unwrap();
                        }
                        let refd = reference::decode(k, m, &avail, &survivors, &wanted).unwrap();
                        for (w, o) in wanted.iter().zip(&out) {
                            assert_eq!(o, &data[*w], "k={k} m={m} erased={erased:?}");
                        }
                        assert_eq!(out, refd);
                    }
                }
            }
        }
    }

    /// The xor_gen / pq_gen fast paths (taken for aligned, 32-byte-multiple buffers) agree
    /// with the reference for every k.
    #[test]
    fn raid_kernel_fast_paths_match_reference() {
        for k in 1..=16 {
            for m in 1..=2 {
                let codec = Codec::new(k, m).unwrap();
                // Vec<u64> storage gives 8-byte alignment; offset to a 32-byte boundary.
                let data = shards(k, 4096, (k * 7 + m) as u64);
                let mut store: Vec<Vec<u8>> = data
                    .iter()
                    .map(|d| {
                        let mut v = vec![0u8; 4096 + 32];
                        let o = v.as_ptr().align_offset(32);
                        v[o..o + 4096].copy_from_slice(d);
                        v
                    })
                    .collect();
                let drefs: Vec<&[u8]> = store
                    .iter_mut()
                    .map(|v| {
                        let o = v.as_ptr().align_offset(32);
                        &v[o..o + 4096]
                    })
                    .collect();
                let mut pstore: Vec<Vec<u8>> = (0..m).map(|_| vec![0u8; 4096 + 32]).collect();
                let mut prefs: Vec<&mut [u8]> = pstore
                    .iter_mut()
                    .map(|v| {
                        let o = v.as_ptr().align_offset(32);
                        &mut v[o..o + 4096]
                    })
                    .collect();
                if k >= 2 {
                    // The kernel must really take these buffers, or this test checks nothing new.
                    let took = match &mut prefs[..] {
                        [p] => uraid_isal::xor_parity(&drefs, p),
                        [p, q] => uraid_isal::pq_parity(&drefs, p, q),
                        _ => unreachable!(),
                    };
                    assert!(took, "k={k} m={m}: RAID kernel refused aligned buffers");
                }
                codec.encode(&drefs, &mut prefs);
                let want = reference::encode(k, m, &drefs);
                for (j, p) in prefs.iter().enumerate() {
                    assert_eq!(&p[..], &want[j][..], "k={k} m={m} parity {j}");
                }
            }
        }
    }

    /// Single data-shard loss with P among the survivors takes the xor_gen path for aligned
    /// buffers; it must agree with the reference decode for every k and every lost shard.
    #[test]
    fn single_loss_xor_fast_path_matches_reference() {
        fn aligned(v: &mut [u8], len: usize) -> &mut [u8] {
            let o = v.as_ptr().align_offset(32);
            &mut v[o..o + len]
        }
        let len = 4096;
        for k in 2..=16 {
            for m in 1..=3 {
                let codec = Codec::new(k, m).unwrap();
                let data = shards(k, len, (k * 13 + m) as u64);
                let drefs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                let parity = reference::encode(k, m, &drefs);
                let mut store: Vec<Vec<u8>> = drefs
                    .iter()
                    .copied()
                    .chain(parity.iter().map(|p| &p[..]))
                    .map(|d| {
                        let mut v = vec![0u8; len + 32];
                        aligned(&mut v, len).copy_from_slice(d);
                        v
                    })
                    .collect();
                let all: Vec<&[u8]> = store.iter_mut().map(|v| &*aligned(v, len)).collect();
                for (lost, want) in data.iter().enumerate() {
                    let avail: Vec<usize> = (0..k + m).filter(|&i| i != lost).collect();
                    let survivors: Vec<&[u8]> = avail.iter().map(|&i| all[i]).collect();
                    // The decoder uses the first k survivors (data, then P); the kernel must
                    // accept them, or this test would only exercise the general path.
                    let mut scratch = vec![0u8; len + 32];
                    assert!(
                        uraid_isal::xor_parity(&survivors[..k], aligned(&mut scratch, len)),
                        "k={k}: xor_gen refused aligned buffers"
                    );
                    let mut ostore = vec![0u8; len + 32];
                    let o = aligned(&mut ostore, len);
                    codec.decode(&avail, &survivors, &[lost], &mut [o]).unwrap();
                    assert_eq!(
                        aligned(&mut ostore, len),
                        &want[..],
                        "k={k} m={m} lost={lost}"
                    );
                }
            }
        }
    }

    /// Tables built once per erasure pattern and reused (what the engine keeps per
    /// reactor) decode other data with that pattern exactly as fresh ones and the reference.
    #[test]
    fn kept_decode_tables_equal_fresh_ones() {
        for &(k, m) in &[(8usize, 2usize), (4, 4), (5, 3)] {
            let codec = Codec::new(k, m).unwrap();
            for lost in combinations(k + m, m) {
                let avail: Vec<usize> = (0..k + m).filter(|s| !lost.contains(s)).collect();
                let wanted: Vec<usize> = lost.iter().copied().filter(|&s| s < k).collect();
                if wanted.is_empty() {
                    continue;
                }
                let kept = codec.decode_tables(&avail, &wanted).unwrap();
                for seed in 0..3u64 {
                    let data = shards(k, 64, seed * 31 + k as u64);
                    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
                    let parity = reference::encode(k, m, &refs);
                    let all: Vec<&[u8]> = refs
                        .iter()
                        .copied()
                        .chain(parity.iter().map(|p| &p[..]))
                        .collect();
                    let srcs: Vec<&[u8]> = avail.iter().map(|&s| all[s]).collect();
                    let mut out: Vec<Vec<u8>> = wanted.iter().map(|_| vec![0u8; 64]).collect();
                    let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|o| &mut o[..]).collect();
                    codec
                        .decode_using(&avail, &srcs, &wanted, &mut outs, |_, _| {
                            Ok::<_, CodecError>(&kept)
                        })
                        .unwrap();
                    for (w, o) in wanted.iter().zip(&out) {
                        assert_eq!(o, &data[*w], "k {k} m {m} lost {lost:?} seed {seed}");
                    }
                }
            }
        }
    }

    #[test]
    fn wide_codes_decode_worst_patterns() {
        // Largest shapes: spot-check that k x k inversion works for the biggest widths.
        for (k, m) in [(56, 8), (61, 3), (62, 2), (60, 4)] {
            let codec = Codec::new(k, m).unwrap();
            let data = shards(k, 32, 7);
            let drefs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let parity = reference::encode(k, m, &drefs);
            let all: Vec<&[u8]> = drefs
                .iter()
                .copied()
                .chain(parity.iter().map(|p| &p[..]))
                .collect();
            let erased: Vec<usize> = (0..m).map(|i| i * (k / m)).collect();
            let avail: Vec<usize> = (0..k + m).filter(|i| !erased.contains(i)).collect();
            let survivors: Vec<&[u8]> = avail.iter().map(|&i| all[i]).collect();
            let mut out = vec![vec![0u8; 32]; m];
            let mut orefs: Vec<&mut [u8]> = out.iter_mut().map(|o| &mut o[..]).collect();
            codec
                .decode(&avail, &survivors, &erased, &mut orefs)
                .unwrap();
            for (w, o) in erased.iter().zip(&out) {
                assert_eq!(o, &data[*w]);
            }
        }
    }

    #[test]
    fn update_equals_reencode() {
        let (k, m, len) = (8, 3, 4096);
        let codec = Codec::new(k, m).unwrap();
        let mut data = shards(k, len, 1);
        let old_parity = {
            let d: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            reference::encode(k, m, &d)
        };
        let newd: Vec<u8> = shards(1, len, 2).remove(0);
        let delta: Vec<u8> = data[5].iter().zip(&newd).map(|(a, b)| a ^ b).collect();
        let mut parity = old_parity.clone();
        {
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
            codec.update(5, &delta, &mut p);
        }
        data[5] = newd;
        let d: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        assert_eq!(parity, reference::encode(k, m, &d));
    }

    #[test]
    fn rejects_bad_shapes() {
        assert_eq!(Codec::new(4, 0).unwrap_err(), CodecError::Parity(0));
        assert_eq!(Codec::new(4, 9).unwrap_err(), CodecError::Parity(9));
        assert!(matches!(Codec::new(60, 5), Err(CodecError::TooWide { .. })));
        let c = Codec::new(4, 2).unwrap();
        let s = [&[0u8][..]; 3];
        let mut o = [0u8];
        assert!(matches!(
            c.decode(&[0, 1, 2], &s, &[3], &mut [&mut o[..]]),
            Err(CodecError::TooFewShards { .. })
        ));
    }
}
