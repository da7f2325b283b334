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
