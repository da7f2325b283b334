//! The HTTP/1.1 of the control socket: one request head in (parsed by
//! `uraid_core::http`), one response out, then the connection closes.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use uraid_core::http::{parse_head, Head, MAX_HEAD};

/// An HTTP response: status, content type, body.
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) content_type: &'static str,
    pub(super) body: String,
}

impl Response {
    /// A JSON body, pretty-printed.
    pub(super) fn json(status: u16, v: &Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
        }
    }

    /// `{"error": msg}`.
    pub(super) fn error(status: u16, msg: &str) -> Response {
        Response::json(status, &json!({ "error": msg }))
    }
}

/// The reason phrase of a status code.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        500 => "Internal Server Error",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A connected stream of either listener.
pub(super) trait ReadWrite: Read + Write {
    fn set_timeouts(&mut self, t: Duration);
}

impl ReadWrite for UnixStream {
    fn set_timeouts(&mut self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
        let _ = self.set_write_timeout(Some(t));
    }
}

impl ReadWrite for std::net::TcpStream {
    fn set_timeouts(&mut self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
        let _ = self.set_write_timeout(Some(t));
    }
}

/// Reads and parses a request head (request line and headers, up to `MAX_HEAD` bytes),
/// all of it before `deadline` (a client trickling bytes does not hold a slot longer).
pub(super) fn read_head(s: &mut dyn ReadWrite, deadline: Instant) -> Result<Head, Response> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        match parse_head(&buf) {
            Ok(Some(h)) => return Ok(h),
            Ok(None) => {}
            Err(r) => return Err(Response::error(r.status, &r.message)),
        }
        if buf.len() >= MAX_HEAD {
            return Err(Response::error(431, "request head larger than 16 KiB"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Response::error(408, "timed out reading the request"));
        }
        s.set_timeouts(left);
        match s.read(&mut chunk) {
            Ok(0) => return Err(Response::error(400, "connection closed mid-request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Response::error(408, "timed out reading the request"))
            }
            Err(_) => return Err(Response::error(400, "read error")),
        }
    }
}

/// Writes `r` with `Connection: close` (and `Allow` on 405).
pub(super) fn write_response(s: &mut dyn Write, r: &Response) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len(),
        match r.status {
            // The metrics listener takes GET only; the control socket GET and POST.
            405 if r.body.contains("/metrics only") => "Allow: GET\r\n",
            405 => "Allow: GET, POST\r\n",
            _ => "",
        }
    );
    s.write_all(head.as_bytes())?;
    s.write_all(r.body.as_bytes())?;
    s.flush()
}
