//! Pre-shared key files in psktool's format (GnuTLS, read by libnbd's `tls-psk-file=` and
//! qemu's `tls-creds-psk`): one `identity:hexkey` per line. Pure: bytes in, keys out.
//!
//! Rules: identities are non-empty, at most `MAX_IDENTITY` bytes, printable ASCII without
//! `:`, and unique; keys are an even number of hex digits, 1 to `MAX_KEY` bytes. Blank lines
//! are skipped. Any other line is an error naming its line number, never its content (it
//! may hold a key).

use std::collections::BTreeMap;
use std::fmt;

/// Longest identity accepted (TLS allows 2^16 - 1; GnuTLS clients send short names).
pub const MAX_IDENTITY: usize = 255;
/// Longest key accepted, in bytes (psktool makes 32 by default; OpenSSL takes up to 512).
pub const MAX_KEY: usize = 256;

/// Keys by identity. `Debug` shows identities only.
#[derive(Clone, PartialEq, Eq)]
pub struct PskKeys(BTreeMap<String, Vec<u8>>);

impl fmt::Debug for PskKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// Why a PSK file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    #[error("line {0}: expected identity:hexkey")]
    NoColon(usize),
    #[error("line {0}: empty identity")]
    EmptyIdentity(usize),
    #[error("line {0}: identity longer than {MAX_IDENTITY} bytes or not printable ASCII")]
    BadIdentity(usize),
    #[error("line {line}: identity '{identity}' appears twice")]
    Duplicate { line: usize, identity: String },
    #[error("line {0}: the key is not an even number of hex digits")]
    BadKey(usize),
    #[error("line {0}: the key is empty or longer than {MAX_KEY} bytes")]
    KeyLength(usize),
    #[error("no identity:key line in the file")]
    Empty,
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|p| Some(hex_digit(p[0])? << 4 | hex_digit(p[1])?))
        .collect()
}

impl PskKeys {
    /// Parses a PSK file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<PskKeys, PskError> {
        let mut keys = BTreeMap::new();
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let line = i + 1;
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            if raw.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let colon = raw
                .iter()
                .position(|&b| b == b':')
                .ok_or(PskError::NoColon(line))?;
            let (id, key) = (&raw[..colon], &raw[colon + 1..]);
            if id.is_empty() {
                return Err(PskError::EmptyIdentity(line));
            }
            if id.len() > MAX_IDENTITY || !id.iter().all(|b| b.is_ascii_graphic()) {
                return Err(PskError::BadIdentity(line));
            }
            let key = unhex(key.trim_ascii()).ok_or(PskError::BadKey(line))?;
            if key.is_empty() || key.len() > MAX_KEY {
                return Err(PskError::KeyLength(line));
            }
            // Checked printable ASCII above.
            let id = String::from_utf8_lossy(id).into_owned();
            if keys.contains_key(&id) {
                return Err(PskError::Duplicate { line, identity: id });
            }
            keys.insert(id, key);
        }
        if keys.is_empty() {
            return Err(PskError::Empty);
        }
        Ok(PskKeys(keys))
    }

    /// The key of `identity`, if the file has it.
    pub fn key(&self, identity: &[u8]) -> Option<&[u8]> {
        let id = std::str::from_utf8(identity).ok()?;
        self.0.get(id).map(Vec::as_slice)
    }

    /// The identities, sorted.
    pub fn identities(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Fuzz body: any bytes parse or are refused; what parses holds only valid entries, and an
/// error never echoes the file's bytes past the identity.
pub fn fuzz_psk(data: &[u8]) {
    match PskKeys::parse(data) {
        Ok(k) => {
            assert!(!k.is_empty());
            for id in k.identities() {
                assert!(!id.is_empty() && id.len() <= MAX_IDENTITY && !id.contains(':'));
                let key = k.key(id.as_bytes()).expect("listed identity has a key");
                assert!(!key.is_empty() && key.len() <= MAX_KEY);
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_psktool_output() {
        let k = PskKeys::parse(b"alice:0123456789abcdefABCDEF00\nbob:ff\n").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(
            k.key(b"alice"),
            Some(&[0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xab, 0xcd, 0xef, 0][..])
        );
        assert_eq!(k.key(b"bob"), Some(&[0xff][..]));
        assert_eq!(k.key(b"carol"), None);
        assert_eq!(k.key(&[0xff, 0xfe]), None);
        assert_eq!(k.identities().collect::<Vec<_>>(), ["alice", "bob"]);
        // Windows line ends and blank lines.
        let k = PskKeys::parse(b"\r\nalice:00\r\n\n  \n").unwrap();
        assert_eq!(k.key(b"alice"), Some(&[0u8][..]));
        assert_eq!(format!("{k:?}"), "[\"alice\"]", "Debug never shows keys");
    }

    #[test]
    fn refuses_malformed_files_by_line_without_echoing_keys() {
        let cases: &[(&[u8], PskError)] = &[
            (b"", PskError::Empty),
            (b"\n\n", PskError::Empty),
            (b"alice\n", PskError::NoColon(1)),
            (b"alice:00\n:00\n", PskError::EmptyIdentity(2)),
            (b"al ice:00\n", PskError::BadIdentity(1)),
            (b"al\xffice:00\n", PskError::BadIdentity(1)),
            (b"alice:0\n", PskError::BadKey(1)),
            (b"alice:zz\n", PskError::BadKey(1)),
            (b"alice:\n", PskError::KeyLength(1)),
            (
                b"alice:00\nalice:01\n",
                PskError::Duplicate {
                    line: 2,
                    identity: "alice".into(),
                },
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(PskKeys::parse(bytes).unwrap_err(), *want, "{bytes:?}");
        }
        let long_key = format!("a:{}", "00".repeat(MAX_KEY + 1));
        assert_eq!(
            PskKeys::parse(long_key.as_bytes()).unwrap_err(),
            PskError::KeyLength(1)
        );
        let long_id = format!("{}:00", "a".repeat(MAX_IDENTITY + 1));
        assert_eq!(
            PskKeys::parse(long_id.as_bytes()).unwrap_err(),
            PskError::BadIdentity(1)
        );
        let e = PskKeys::parse(b"alice:00112233\nbob:zz99\n").unwrap_err();
        assert!(!e.to_string().contains("zz99"), "{e}");
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = PskKeys::parse(&bytes);
        }

        #[test]
        fn written_keys_read_back(
            entries in proptest::collection::btree_map("[a-zA-Z0-9._@-]{1,20}",
                proptest::collection::vec(any::<u8>(), 1..64), 1..8)
        ) {
            let mut text = String::new();
            for (id, key) in &entries {
                text.push_str(id);
                text.push(':');
                for b in key {
                    text.push_str(&format!("{b:02x}"));
                }
                text.push('\n');
            }
            let k = PskKeys::parse(text.as_bytes()).unwrap();
            prop_assert_eq!(k.len(), entries.len());
            for (id, key) in &entries {
                prop_assert_eq!(k.key(id.as_bytes()), Some(&key[..]));
            }
        }
    }
}
