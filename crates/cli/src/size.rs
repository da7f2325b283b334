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

/// A rate in MB/s (MiB per second): a plain number is MB/s, a size with a suffix is that
/// much per second (`500M`, `5G` = 5120 MB/s, `/s` optional), rounded down to whole MB/s
/// (at least 1 unless it is 0).
pub fn parse_rate_mb(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    if t.chars().last().is_some_and(|c| c.is_ascii_alphabetic()) {
        let b = parse(t)
            .map_err(|_| format!("'{s}' is not a rate (MB/s: 50, or with a suffix: 500M, 2G)"))?;
        return Ok(if b == 0 { 0 } else { (b >> 20).max(1) });
    }
    t.parse()
        .map_err(|_| format!("'{s}' is not a rate (MB/s: 50, or with a suffix: 500M, 2G)"))
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
    fn rates_take_plain_mb_or_sizes_per_second() {
        assert_eq!(parse_rate_mb("50"), Ok(50));
        assert_eq!(parse_rate_mb("0"), Ok(0));
        assert_eq!(parse_rate_mb("5G"), Ok(5120));
        assert_eq!(parse_rate_mb("500M/s"), Ok(500));
        assert_eq!(parse_rate_mb("64K"), Ok(1));
        assert!(parse_rate_mb("fast").unwrap_err().contains("not a rate"));
        assert!(parse_rate_mb("5X").is_err());
    }

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
