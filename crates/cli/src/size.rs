//! Sizes with binary suffixes, as mdadm and fio write them: 4096, 64K, 1M, 2G, 1T.

pub fn parse(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(format!(
                        "'{s}': unknown size suffix '{c}' (use K, M, G or T)"
                    ))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 4096, 64K, 1M, 2G)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

pub fn human(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (u, m) in UNITS {
        if n >= m {
            return if n.is_multiple_of(m) {
                format!("{}{u}", n / m)
            } else {
                format!("{:.2}{u}", n as f64 / m as f64)
            };
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("64K"), Ok(65536));
        assert_eq!(parse("64k"), Ok(65536));
        assert_eq!(parse("1M"), Ok(1 << 20));
        assert_eq!(parse("2G"), Ok(2 << 30));
        assert!(parse("12X").is_err());
        assert!(parse("K").is_err());
        assert!(parse("").is_err());
        assert!(parse("99999999999T").is_err());
        assert_eq!(human(65536), "64K");
        assert_eq!(human(1536), "1.50K");
    }
}
