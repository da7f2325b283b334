//! TLS for NBD's STARTTLS: the settings (`--tls`, `--tls-certificates`, `--tls-psk`,
//! `--tls-verify-peer`), the credentials loaded from them (reloadable while serving), and
//! one `Session` per connection that turns ciphertext into plaintext and back in memory
//! (the connection's reactor does the socket I/O, as for plaintext).
//!
//! Two engines, one per kind of credential (ARCHITECTURE.md, "TLS"): X.509 certificates
//! run on rustls with *ring* (AES-GCM about twice as fast as OpenSSL 3.0 here); pre-shared
//! keys run on OpenSSL, as rustls has no TLS 1.3 external PSK and libnbd and qemu clients
//! bring psktool key files. As in nbdkit, a PSK file overrides certificates.

mod openssl_psk;
pub mod psk;
mod x509;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

pub use psk::{PskError, PskKeys};

/// `--tls`: nbdkit's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// STARTTLS is refused, as by a server without TLS.
    #[default]
    Off,
    /// The client chooses: STARTTLS or plaintext.
    On,
    /// Every option but STARTTLS (and ABORT) is refused with NBD_REP_ERR_TLS_REQD until the
    /// client has switched to TLS.
    Require,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "on" => Ok(Mode::On),
            "require" => Ok(Mode::Require),
            _ => Err(format!("--tls {s}: expected off, on or require")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::On => "on",
            Mode::Require => "require",
        })
    }
}

/// Where the credentials come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// A directory with `server-cert.pem`, `server-key.pem` and, for `verify_peer`,
    /// `ca-cert.pem` (and optionally `ca-crl.pem`): nbdkit's and qemu's names.
    pub certificates: Option<PathBuf>,
    /// A psktool key file; overrides `certificates`.
    pub psk: Option<PathBuf>,
    /// Client certificates are required and checked against `ca-cert.pem`.
    pub verify_peer: bool,
}

/// The file names in a certificate directory.
pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_CRL: &str = "ca-crl.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";

/// What a TLS connection negotiated (for `/status`, logs and metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    pub version: String,
    pub cipher: String,
    /// The PSK identity, or the client certificate's subject (verified with
    /// `--tls-verify-peer`); never a key.
    pub peer: Option<String>,
}

/// What a session could not do: the connection ends, after the alert (if any) in the
/// session's output is sent. `reason` is a short stable name counted in the metrics.
#[derive(Debug)]
pub struct TlsError {
    pub reason: &'static str,
    pub message: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS {}: {}", self.reason.replace('_', " "), self.message)
    }
}

impl From<TlsError> for io::Error {
    fn from(e: TlsError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e.to_string())
    }
}

/// What `Session::read` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Plain {
    /// This many plaintext bytes were copied out.
    Data(usize),
    /// Nothing until more ciphertext is fed.
    NeedMore,
    /// The client closed the TLS session (close_notify).
    Closed,
}

/// One connection's TLS state, fed and drained by the connection's own I/O.
pub trait Session {
    /// Takes ciphertext the client sent; returns how much was taken (less than given when
    /// decrypted data waits to be read: read it, then feed the rest).
    fn feed(&mut self, ct: &[u8]) -> Result<usize, TlsError>;
    /// Copies decrypted data into `out` (non-empty).
    fn read(&mut self, out: &mut [u8]) -> Result<Plain, TlsError>;
    /// Encrypts `plain` (after the handshake).
    fn write(&mut self, plain: &[u8]) -> Result<(), TlsError>;
    /// Appends the ciphertext waiting to be sent (handshake messages, records, alerts).
    fn take_output(&mut self, out: &mut Vec<u8>);
    /// Ciphertext waits to be taken.
    fn wants_write(&self) -> bool;
    fn handshaking(&self) -> bool;
    fn info(&self) -> Info;
    /// Queues the close_notify alert (the spec: the server closes the TLS session before the
    /// connection).
    fn close(&mut self);
}

/// Loaded credentials: what new connections are served with.
enum Creds {
    X509(x509::X509),
    Psk(openssl_psk::Psk),
}

/// The TLS side of a server: settings and the current credentials.
pub struct Tls {
    settings: Settings,
    creds: RwLock<Arc<Creds>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("settings", &self.settings)
            .finish()
    }
}

fn load(s: &Settings) -> Result<Creds, String> {
    if let Some(p) = &s.psk {
        return Ok(Creds::Psk(openssl_psk::Psk::load(p)?));
    }
    match &s.certificates {
        Some(dir) => Ok(Creds::X509(x509::X509::load(dir, s.verify_peer)?)),
        None => Err("TLS needs --tls-certificates DIR or --tls-psk FILE".into()),
    }
}

impl Tls {
    /// Loads the credentials; an error names the file and what is wrong with it.
    pub fn new(settings: Settings) -> Result<Tls, String> {
        let creds = load(&settings)?;
        Ok(Tls {
            settings,
            creds: RwLock::new(Arc::new(creds)),
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Reads the files again; new connections use them, established ones keep theirs. On
    /// an error the credentials in use stay. Returns a description of what is loaded.
    pub fn reload(&self) -> Result<String, String> {
        let creds = load(&self.settings)?;
        let what = describe(&creds);
        *self.creds.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(creds);
        Ok(what)
    }

    /// What is loaded now, in a line.
    pub fn describe(&self) -> String {
        describe(&self.current())
    }

    fn current(&self) -> Arc<Creds> {
        self.creds.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A session for a connection that just asked for STARTTLS.
    pub fn session(&self) -> Result<Box<dyn Session>, TlsError> {
        match &*self.current() {
            Creds::X509(x) => x.session(),
            Creds::Psk(p) => p.session(),
        }
    }
}

fn describe(c: &Creds) -> String {
    match c {
        Creds::X509(x) => x.describe(),
        Creds::Psk(p) => p.describe(),
    }
}
