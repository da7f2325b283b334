//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D), the field
//! Linux md uses for RAID6 and ISA-L uses for all its codes. Generator 2.
//!
//! This is the scalar "golden" reference: slow, obvious, and the thing every ISA-L result
//! is checked against in tests.

const POLY: u16 = 0x11D;

const fn build_tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // Duplicate so exp[a + b] needs no modulo for a, b < 255.
    let mut j = 255;
    while j < 512 {
        exp[j] = exp[j - 255];
        j += 1;
    }
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = build_tables();
const EXP: [u8; 512] = TABLES.0;
const LOG: [u8; 256] = TABLES.1;

pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// Multiplicative inverse; `a` must be non-zero.
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

pub fn div(a: u8, b: u8) -> u8 {
    mul(a, inv(b))
}

/// 2^e in the field.
pub fn exp2(e: usize) -> u8 {
    EXP[e % 255]
}

pub fn pow(a: u8, e: usize) -> u8 {
    let mut r = 1u8;
    for _ in 0..e {
        r = mul(r, a);
    }
    r
}

/// Inverts a row-major n x n matrix by Gauss-Jordan elimination. None if singular.
pub fn invert(m: &[u8], n: usize) -> Option<Vec<u8>> {
    assert_eq!(m.len(), n * n);
    let mut a = m.to_vec();
    let mut out = vec![0u8; n * n];
    for i in 0..n {
        out[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r * n + col] != 0)?;
        if pivot != col {
            for c in 0..n {
                a.swap(pivot * n + c, col * n + c);
                out.swap(pivot * n + c, col * n + c);
            }
        }
        let p = inv(a[col * n + col]);
        for c in 0..n {
            a[col * n + c] = mul(a[col * n + c], p);
            out[col * n + c] = mul(out[col * n + c], p);
        }
        for r in 0..n {
            if r != col {
                let f = a[r * n + col];
                if f != 0 {
                    for c in 0..n {
                        a[r * n + c] ^= mul(f, a[col * n + c]);
                        out[r * n + c] ^= mul(f, out[col * n + c]);
                    }
                }
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_axioms_hold_for_every_element() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "a={a}");
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 0), 0);
        }
        // 0x11D reduction: 0x80 * 2 = 0x100 ^ 0x11D = 0x1D.
        assert_eq!(mul(0x80, 2), 0x1D);
        assert_eq!(exp2(8), 0x1D);
    }

    #[test]
    fn multiplication_distributes() {
        for a in (0..=255u8).step_by(7) {
            for b in (0..=255u8).step_by(5) {
                for c in (0..=255u8).step_by(11) {
                    assert_eq!(mul(a, b ^ c), mul(a, b) ^ mul(a, c));
                }
            }
        }
    }

    #[test]
    fn inversion_round_trips_and_detects_singular() {
        let m = [1, 2, 3, 4, 5, 6, 7, 8, 10];
        let i = invert(&m, 3).expect("invertible");
        let mut prod = [0u8; 9];
        for r in 0..3 {
            for c in 0..3 {
                prod[r * 3 + c] = (0..3).fold(0, |acc, k| acc ^ mul(m[r * 3 + k], i[k * 3 + c]));
            }
        }
        assert_eq!(prod, [1, 0, 0, 0, 1, 0, 0, 0, 1]);
        assert!(invert(&[1, 1, 1, 1], 2).is_none());
    }
}
