//! systemd's readiness protocol (sd_notify(3)) for `uraid serve` under a `Type=notify`
//! unit: datagrams to the socket in `$NOTIFY_SOCKET` (a path, or an abstract name written
//! with a leading `@`). READY=1 once every listener is up, STATUS= with the array's state
//! and background progress while it changes, STOPPING=1 at the stop. Without
//! `$NOTIFY_SOCKET` nothing is sent. Written here rather than linking libsystemd: the
//! protocol is one datagram per message.

use std::os::unix::net::{SocketAddr, UnixDatagram};

pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier for `$NOTIFY_SOCKET`, if it is set and names a usable socket address.
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)
            }
            None => SocketAddr::from_pathname(&path),
        };
        let made = addr.and_then(|addr| {
            Ok(Notifier {
                sock: UnixDatagram::unbound()?,
                addr,
            })
        });
        match made {
            Ok(n) => Some(n),
            Err(e) => {
                // The service manager waits for READY=1 in vain: say why.
                tracing::error!(
                    target: "uraid::serve",
                    "NOTIFY_SOCKET={}: not usable ({e}); no readiness notification is sent",
                    path.to_string_lossy()
                );
                None
            }
        }
    }

    /// Sends `msg` (newline-separated `KEY=value` lines). Best effort: a failure is logged,
    /// never fatal (the service manager may have gone away).
    pub fn send(&self, msg: &str) {
        if let Err(e) = self.sock.send_to_addr(msg.as_bytes(), &self.addr) {
            tracing::warn!(target: "uraid::serve", "NOTIFY_SOCKET: cannot send {msg:?}: {e}");
        }
    }
}

/// A STATUS= text from a `/status` document: the state words, then each background
/// operation's progress (`client::background_lines`).
pub fn status_text(v: &serde_json::Value) -> String {
    let mut s = format!(
        "{}: {}",
        v["name"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?")
    );
    for b in crate::client::background_lines(v) {
        s.push_str("; ");
        s.push_str(&b);
    }
    s
}
