//! The config file (`/etc/uraid/uraid.conf`, or `--config FILE`): the arrays a host serves
//! and their `uraid serve` options, in nbd-server's INI style. Parsed here (pure: text in,
//! sections out); what each key means and whether its value is valid is `uraid serve`'s
//! own argument parser's business (the CLI checks every line with it).
//!
//! ```text
//! # a comment; blank lines are ignored
//! [defaults]                      # options for every array
//! scan-dir = /srv/uraid
//! [vol0]                          # `uraid serve vol0`: the array named vol0 ...
//! uuid = 2ca4341e-85f0-448d-9b39-52469b83e93c   # ... or, better, the one with this UUID
//! listen = tcp:0.0.0.0:10809      # a repeated key gives the option several times
//! listen = unix:/run/uraid/vol0.nbd
//! read-only = no                  # switches: yes or no
//! ```
//!
//! Rules: every `key = value` line is inside a section; keys are `uraid serve` long option
//! names (letters, digits, `-`), values are the rest of the line with surrounding blanks
//! removed (no quoting, no inline comments: a `#` inside a value is part of it); section
//! names are `[A-Za-z0-9._-]+` (the names arrays and control sockets use), each at most
//! once; `uuid` at most once per array and not in `[defaults]`. Errors carry the line
//! number (from 1).

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub line: usize,
    pub key: String,
    pub value: String,
}

/// One `[NAME]` section and its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub line: usize,
    pub name: String,
    pub entries: Vec<Entry>,
}

impl Section {
    /// The array's UUID line, if it has one.
    pub fn uuid(&self) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == "uuid")
    }

    /// The option lines (every line but `uuid`).
    pub fn options(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.key != "uuid")
    }
}

/// A parsed config file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `[defaults]`: options for every array (before the array's own).
    pub defaults: Vec<Entry>,
    /// The arrays, in file order.
    pub arrays: Vec<Section>,
}

impl Config {
    pub fn array(&self, name: &str) -> Option<&Section> {
        self.arrays.iter().find(|s| s.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct ConfigError {
    pub line: usize,
    pub msg: String,
}

fn err(line: usize, msg: impl Into<String>) -> ConfigError {
    ConfigError {
        line,
        msg: msg.into(),
    }
}

/// A name usable for an array, its control socket and its section.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn valid_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Parses a config file's text.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let mut cfg = Config::default();
    // Where lines go: nowhere yet, [defaults], or the last array.
    enum At {
        Nowhere,
        Defaults,
        Array,
    }
    let mut at = At::Nowhere;
    let mut seen_defaults = false;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        if let Some(rest) = l.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                return Err(err(line, format!("{l:?}: a section header ends with ']'")));
            };
            let name = name.trim();
            if name == "defaults" {
                if seen_defaults {
                    return Err(err(line, "[defaults] appears twice"));
                }
                seen_defaults = true;
                at = At::Defaults;
                continue;
            }
            if !valid_name(name) {
                return Err(err(
                    line,
                    format!(
                        "[{name}]: an array name is letters, digits, '.', '_' and '-' (not \
                         starting with '.'), at most 64"
                    ),
                ));
            }
            if let Some(s) = cfg.array(name) {
                return Err(err(
                    line,
                    format!("[{name}] appears twice (first on line {})", s.line),
                ));
            }
            cfg.arrays.push(Section {
                line,
                name: name.to_string(),
                entries: Vec::new(),
            });
            at = At::Array;
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            return Err(err(
                line,
                format!("{l:?}: expected 'key = value', '[array-name]' or a '#' comment"),
            ));
        };
        let (key, value) = (k.trim(), v.trim());
        if !valid_key(key) {
            return Err(err(
                line,
                format!("{key:?}: a key is a `uraid serve` option's long name, e.g. io-timeout"),
            ));
        }
        if value.is_empty() {
            return Err(err(line, format!("{key}: no value")));
        }
        let e = Entry {
            line,
            key: key.to_string(),
            value: value.to_string(),
        };
        match at {
            At::Nowhere => {
                return Err(err(
                    line,
                    format!("{key}: outside any section (put it under [defaults] or [array-name])"),
                ))
            }
            At::Defaults if key == "uuid" => {
                return Err(err(
                    line,
                    "uuid: belongs to an array's section, not [defaults]",
                ))
            }
            At::Defaults => cfg.defaults.push(e),
            At::Array => {
                let s = cfg.arrays.last_mut().expect("At::Array follows a section");
                if key == "uuid" {
                    if let Some(u) = s.uuid() {
                        return Err(err(
                            line,
                            format!(
                                "uuid: given twice for [{}] (first on line {})",
                                s.name, u.line
                            ),
                        ));
                    }
                }
                s.entries.push(e);
            }
        }
    }
    Ok(cfg)
}

/// Fuzz body (fuzz/fuzz_targets/config.rs): any bytes parse or fail with a line number in
/// range, never panic; what parses holds only valid names and keys, and unique sections.
pub fn fuzz_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.lines().count();
    match parse(text) {
        Ok(c) => {
            for s in &c.arrays {
                assert!(valid_name(&s.name));
                assert_eq!(c.array(&s.name).map(|x| x.line), Some(s.line));
                assert!(s.entries.iter().filter(|e| e.key == "uuid").count() <= 1);
                assert!(s
                    .entries
                    .iter()
                    .all(|e| valid_key(&e.key) && !e.value.is_empty()));
            }
            assert!(c.defaults.iter().all(|e| e.key != "uuid"));
        }
        Err(e) => assert!(e.line >= 1 && e.line <= lines, "{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_keys_and_repeated_options_parse() {
        let c = parse(
            "# host config\n[defaults]\nscan-dir = /srv/uraid\n\n[vol0]\nuuid = 2ca4341e-85f0-448d-9b39-52469b83e93c\nlisten = tcp:0.0.0.0:10809\n  listen=unix:/run/x.sock  \nread-only = no\n[vol1]\n; other\nexport = v1#x\n",
        )
        .unwrap();
        assert_eq!(c.defaults.len(), 1);
        assert_eq!(c.defaults[0].key, "scan-dir");
        assert_eq!(c.arrays.len(), 2);
        let v0 = c.array("vol0").unwrap();
        assert_eq!(v0.line, 5);
        assert_eq!(
            v0.uuid().unwrap().value,
            "2ca4341e-85f0-448d-9b39-52469b83e93c"
        );
        let opts: Vec<(&str, &str, usize)> = v0
            .options()
            .map(|e| (e.key.as_str(), e.value.as_str(), e.line))
            .collect();
        assert_eq!(
            opts,
            [
                ("listen", "tcp:0.0.0.0:10809", 7),
                ("listen", "unix:/run/x.sock", 8),
                ("read-only", "no", 9)
            ]
        );
        assert_eq!(c.array("vol1").unwrap().entries[0].value, "v1#x");
    }

    #[test]
    fn malformed_lines_are_refused_with_their_line_numbers() {
        let cases: &[(&str, usize, &str)] = &[
            ("listen = x\n", 1, "outside any section"),
            ("[vol0\n", 1, "ends with ']'"),
            ("[a]\n[a]\n", 2, "appears twice (first on line 1)"),
            ("[defaults]\n[defaults]\n", 2, "[defaults] appears twice"),
            ("[.hidden]\n", 1, "an array name"),
            ("[a b]\n", 1, "an array name"),
            ("[a]\nnot a pair\n", 2, "expected 'key = value'"),
            ("[a]\nIO_Timeout = 3\n", 2, "long name"),
            ("[a]\nio-timeout =\n", 2, "no value"),
            ("[defaults]\nuuid = x\n", 2, "not [defaults]"),
            (
                "[a]\nuuid = x\n\nuuid = y\n",
                4,
                "given twice for [a] (first on line 2)",
            ),
        ];
        for &(text, line, what) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.msg.contains(what), "{text:?}: {e}");
        }
        // Every case also passes the fuzz body's checks.
        for &(text, _, _) in cases {
            fuzz_config(text.as_bytes());
        }
    }
}
