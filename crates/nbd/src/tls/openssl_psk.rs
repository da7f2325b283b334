//! Pre-shared keys on OpenSSL (TLS 1.3 external PSK with the legacy server callback, which
//! GnuTLS clients interoperate with; TLS 1.2 PSK cipher suites for older clients), run
//! over memory buffers: the connection feeds ciphertext in and takes ciphertext out.

use super::psk::PskKeys;
use super::{Info, Plain, Session, TlsError};
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{ErrorCode, Ssl, SslContext, SslMethod, SslOptions, SslStream, SslVersion};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::{Arc, OnceLock};

pub(super) struct Psk {
    ctx: SslContext,
    keys: Arc<PskKeys>,
}

/// Where the callback leaves the identity a connection authenticated with.
fn identity_index() -> Result<Index<Ssl, String>, ErrorStack> {
    static INDEX: OnceLock<Index<Ssl, String>> = OnceLock::new();
    if let Some(i) = INDEX.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index()?;
    Ok(*INDEX.get_or_init(|| i))
}

fn stack(what: &str, e: ErrorStack) -> String {
    format!("{what}: {e}")
}

impl Psk {
    pub(super) fn load(path: &Path) -> Result<Psk, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let keys =
            Arc::new(PskKeys::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
        let idx = identity_index().map_err(|e| stack("OpenSSL", e))?;
        let mut b =
            SslContext::builder(SslMethod::tls_server()).map_err(|e| stack("OpenSSL", e))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| stack("OpenSSL", e))?;
        // AES-GCM first, in the server's order (see x509.rs); SHA-256 suites only: a TLS 1.3
        // external PSK from the legacy callback is bound to SHA-256.
        b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")
            .map_err(|e| stack("OpenSSL TLS 1.3 cipher suites", e))?;
        b.set_cipher_list(
            "ECDHE-PSK-AES128-GCM-SHA256:DHE-PSK-AES128-GCM-SHA256:PSK-AES128-GCM-SHA256:\
             ECDHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384",
        )
        .map_err(|e| stack("OpenSSL TLS 1.2 cipher list", e))?;
        b.set_options(
            SslOptions::CIPHER_SERVER_PREFERENCE
                | SslOptions::NO_TICKET
                | SslOptions::NO_RENEGOTIATION,
        );
        let k = keys.clone();
        b.set_psk_server_callback(move |ssl, identity, out| {
            let Some(id) = identity else { return Ok(0) };
            let Some(key) = k.key(id) else {
                // Unknown identity: 0 fails the handshake (counted by the caller).
                return Ok(0);
            };
            if key.len() > out.len() {
                return Ok(0);
            }
            out[..key.len()].copy_from_slice(key);
            ssl.set_ex_data(idx, String::from_utf8_lossy(id).into_owned());
            Ok(key.len())
        });
        Ok(Psk {
            ctx: b.build(),
            keys,
        })
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "pre-shared keys for {} identit{} ({})",
            self.keys.len(),
            if self.keys.len() == 1 { "y" } else { "ies" },
            self.keys.identities().collect::<Vec<_>>().join(", ")
        )
    }

    pub(super) fn session(&self) -> Result<Box<dyn Session>, TlsError> {
        let setup = |e: ErrorStack| TlsError {
            reason: "setup",
            message: e.to_string(),
        };
        let ssl = Ssl::new(&self.ctx).map_err(setup)?;
        let s = SslStream::new(ssl, Pipe::default()).map_err(setup)?;
        Ok(Box::new(OpenSsl { s, done: false }))
    }
}

/// The memory "socket" under the OpenSSL stream: ciphertext in, ciphertext out.
#[derive(Default)]
struct Pipe {
    input: Vec<u8>,
    pos: usize,
    output: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.input.len() - self.pos).min(buf.len());
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        if self.pos == self.input.len() {
            self.input.clear();
            self.pos = 0;
        }
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct OpenSsl {
    s: SslStream<Pipe>,
    done: bool,
}

/// The ciphertext a pipe holds before it stops taking more (decrypt first).
const PIPE_MAX: usize = 1 << 20;

fn failure(e: &openssl::ssl::Error, handshake: bool) -> TlsError {
    let text = e.to_string();
    let reason = if text.contains("psk identity not found") || text.contains("PSK") {
        "unknown_psk_identity"
    } else if text.contains("decrypt") || text.contains("bad record mac") || text.contains("binder")
    {
        "decrypt_error"
    } else if text.contains("wrong version number")
        || text.contains("packet length")
        || text.contains("record layer")
    {
        "bad_message"
    } else if text.contains("alert") {
        "alert_received"
    } else if handshake {
        "handshake"
    } else {
        "other"
    };
    TlsError {
        reason,
        message: text,
    }
}

impl OpenSsl {
    fn handshake(&mut self) -> Result<(), TlsError> {
        if self.done {
            return Ok(());
        }
        match self.s.accept() {
            Ok(()) => {
                self.done = true;
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(()),
            Err(e) => Err(failure(&e, true)),
        }
    }
}

impl Session for OpenSsl {
    fn feed(&mut self, ct: &[u8]) -> Result<usize, TlsError> {
        let p = self.s.get_mut();
        let n = ct.len().min(PIPE_MAX.saturating_sub(p.input.len() - p.pos));
        p.input.extend_from_slice(&ct[..n]);
        self.handshake()?;
        Ok(n)
    }

    fn read(&mut self, out: &mut [u8]) -> Result<Plain, TlsError> {
        if !self.done {
            return Ok(Plain::NeedMore);
        }
        match self.s.ssl_read(out) {
            Ok(0) => Ok(Plain::Closed),
            Ok(n) => Ok(Plain::Data(n)),
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(Plain::NeedMore),
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Ok(Plain::Closed),
            Err(e) => Err(failure(&e, false)),
        }
    }

    fn write(&mut self, mut plain: &[u8]) -> Result<(), TlsError> {
        while !plain.is_empty() {
            match self.s.ssl_write(plain) {
                Ok(n) => plain = &plain[n..],
                Err(e) => return Err(failure(&e, false)),
            }
        }
        Ok(())
    }

    fn take_output(&mut self, out: &mut Vec<u8>) {
        let o = &mut self.s.get_mut().output;
        if out.is_empty() {
            // Swap buffers: the filled one goes, the caller's (empty, kept from an earlier
            // batch) takes the next records; no copy, no fresh allocation.
            std::mem::swap(out, o);
        } else {
            out.append(o);
        }
    }

    fn wants_write(&self) -> bool {
        !self.s.get_ref().output.is_empty()
    }

    fn close(&mut self) {
        if self.done {
            // Writes the alert into the pipe; the peer's answer is not awaited.
            let _ = self.s.shutdown();
        }
    }

    fn handshaking(&self) -> bool {
        !self.done
    }

    fn info(&self) -> Info {
        let ssl = self.s.ssl();
        Info {
            version: ssl.version_str().to_string(),
            cipher: ssl
                .current_cipher()
                .map(|c| c.standard_name().unwrap_or(c.name()).to_string())
                .unwrap_or_default(),
            peer: identity_index().ok().and_then(|i| ssl.ex_data(i).cloned()),
        }
    }
}
