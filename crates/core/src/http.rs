//! The request-head parser of the control socket (untrusted bytes from any local process):
//! request line and headers through `httparse`, size-limited, with the HTTP status a bad
//! head earns. Pure: the server in `uraid serve` does the I/O.

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD: usize = 16 << 10;
/// Most header fields accepted.
pub const MAX_HEADERS: usize = 32;

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    pub path: String,
    pub query: String,
}

/// Why a head was refused: the HTTP status to answer with, and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

fn refuse(status: u16, message: impl Into<String>) -> Refused {
    Refused {
        status,
        message: message.into(),
    }
}

/// Parses a request head from the bytes received so far: `Ok(None)` while incomplete,
/// 431 once it exceeds `MAX_HEAD` bytes or `MAX_HEADERS` fields, 400 when malformed.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, Refused> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n > MAX_HEAD => {
            return Err(refuse(431, "request head larger than 16 KiB"))
        }
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return if buf.len() > MAX_HEAD {
                Err(refuse(431, "request head larger than 16 KiB"))
            } else {
                Ok(None)
            }
        }
        Err(httparse::Error::TooManyHeaders) => return Err(refuse(431, "too many header fields")),
        Err(e) => return Err(refuse(400, format!("malformed request: {e}"))),
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err(refuse(400, "malformed request line"));
    };
    // Origin form only ("/path?query"); the fuzzer found httparse passing an empty target.
    if !target.starts_with('/') {
        return Err(refuse(400, "request target must be an absolute path"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Some(Head {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_and_malformed_ones_are_refused() {
        let h = parse_head(b"GET /events?since=3 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            h,
            Head {
                method: "GET".into(),
                path: "/events".into(),
                query: "since=3".into()
            }
        );
        assert_eq!(parse_head(b"GET /status HTTP/1.1\r\nHo"), Ok(None));
        assert_eq!(parse_head(b""), Ok(None));
        for bad in [
            &b"\x00\x01\x02 garbage\r\n\r\n"[..],
            b"GET /status HTTP/9.9\r\n\r\n",
            b"GET  HTTP/1.1\r\n\r\n",
            b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n",
            b"GET http://host/x HTTP/1.1\r\n\r\n",
        ] {
            let r = parse_head(bad);
            assert_eq!(
                r.as_ref().err().map(|r| r.status),
                Some(400),
                "{:?}: {r:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            parse_head(req.as_bytes()).err().map(|r| r.status),
            Some(431)
        );
        let big = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD + 10));
        assert_eq!(
            parse_head(big.as_bytes()).err().map(|r| r.status),
            Some(431)
        );
        let big_complete = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(
            parse_head(big_complete.as_bytes()).err().map(|r| r.status),
            Some(431)
        );
    }
}

/// `key=value` pairs of a query string, each key one of `known` and at most once; anything
/// else (no '=', an unknown or repeated key) is an error naming the parameter.
pub fn query_pairs<'a>(q: &'a str, known: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for kv in q.split('&').filter(|s| !s.is_empty()) {
        match kv.split_once('=') {
            Some((k, v)) if known.contains(&k) && !out.iter().any(|(x, _)| *x == k) => {
                out.push((k, v))
            }
            _ => return Err(format!("unknown parameter {kv:?}")),
        }
    }
    Ok(out)
}

/// `%XX`-decodes a query value (None: a bad escape, or not UTF-8).
pub fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = b.get(i + 1..i + 3)?;
            if !h.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `%XX`-encodes every byte but unreserved characters and '/'.
pub fn percent_encode(v: &str) -> String {
    v.bytes()
        .map(|c| {
            if c.is_ascii_alphanumeric() || b"-._~/".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn queries_refuse_unknown_repeated_and_malformed_parameters() {
        assert_eq!(query_pairs("", &["mode"]), Ok(vec![]));
        assert_eq!(
            query_pairs("member=3&force=1", &["member", "force"]),
            Ok(vec![("member", "3"), ("force", "1")])
        );
        // No '=', unknown key, repeated key, empty key, a key known elsewhere only.
        for bad in ["mode", "x=1", "mode=a&mode=b", "=", "&&mode", "member=1&"] {
            assert!(query_pairs(bad, &["mode"]).is_err(), "{bad}");
        }
    }

    #[test]
    fn percent_coding_round_trips_and_refuses_bad_escapes() {
        for s in ["/tmp/a b/c%d", "", "é/ü", "/dev/nvme0n1"] {
            assert_eq!(percent_decode(&percent_encode(s)).as_deref(), Some(s));
        }
        for bad in ["%", "%4", "%zz", "%+f", "%ff%fe"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
    }
}
