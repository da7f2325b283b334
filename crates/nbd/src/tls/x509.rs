//! X.509 certificates on rustls with the *ring* provider: TLS 1.3 and 1.2, AES-128-GCM
//! first in the server's order (GnuTLS clients otherwise pick ChaCha20, several times
//! slower where AES-NI exists), client certificates checked against `ca-cert.pem` (and
//! `ca-crl.pem` when present) with `--tls-verify-peer`.

use super::{Info, Plain, Session, TlsError, CA_CERT, CA_CRL, SERVER_CERT, SERVER_KEY};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

pub(super) struct X509 {
    config: Arc<ServerConfig>,
    subject: String,
    verify_peer: bool,
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let v = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if v.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(v)
}

/// A certificate's subject, one line (OpenSSL's parser: rustls does not read names).
pub(super) fn subject(der: &[u8]) -> String {
    match openssl::x509::X509::from_der(der) {
        Ok(c) => {
            let name = c.subject_name();
            let cn = name
                .entries_by_nid(openssl::nid::Nid::COMMONNAME)
                .next()
                .and_then(|e| e.data().to_string().ok());
            cn.map(|cn| format!("CN={cn}"))
                .unwrap_or_else(|| "(no common name)".into())
        }
        Err(_) => "(unreadable certificate)".into(),
    }
}

impl X509 {
    pub(super) fn load(dir: &Path, verify_peer: bool) -> Result<X509, String> {
        let chain = certs(&dir.join(SERVER_CERT))?;
        let key_path = dir.join(SERVER_KEY);
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .map_err(|e| format!("{}: {e}", key_path.display()))?;
        let mut provider = rustls::crypto::ring::default_provider();
        {
            use rustls::crypto::ring::cipher_suite::*;
            provider.cipher_suites = vec![
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256,
                TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
                TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ];
        }
        let provider = Arc::new(provider);
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("TLS configuration: {e}"))?;
        let builder = if verify_peer {
            let ca_path = dir.join(CA_CERT);
            let mut roots = RootCertStore::empty();
            for c in certs(&ca_path)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: {e}", ca_path.display()))?;
            }
            let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let crl_path = dir.join(CA_CRL);
            if crl_path.exists() {
                let crls = CertificateRevocationListDer::pem_file_iter(&crl_path)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("{}: {e}", crl_path.display()))?;
                v = v.with_crls(crls);
            }
            let v = v
                .build()
                .map_err(|e| format!("{}: {e}", ca_path.display()))?;
            builder.with_client_cert_verifier(v)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(chain.clone(), key).map_err(|e| {
            format!(
                "{} and {}: {e}",
                dir.join(SERVER_CERT).display(),
                key_path.display()
            )
        })?;
        config.ignore_client_order = true;
        // Clients reconnect rarely; no resumption tickets to send with every handshake.
        config.send_tls13_tickets = 0;
        Ok(X509 {
            config: Arc::new(config),
            subject: subject(&chain[0]),
            verify_peer,
        })
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "X.509 certificate {}{}",
            self.subject,
            if self.verify_peer {
                ", client certificates verified"
            } else {
                ""
            }
        )
    }

    pub(super) fn session(&self) -> Result<Box<dyn Session>, TlsError> {
        let mut c = ServerConnection::new(self.config.clone()).map_err(|e| TlsError {
            reason: "setup",
            message: e.to_string(),
        })?;
        // Each reply batch is sealed whole and taken at once (the reply queue is what
        // bounds it), so no limit of rustls's own.
        c.set_buffer_limit(None);
        Ok(Box::new(Rustls { c }))
    }
}

struct Rustls {
    c: ServerConnection,
}

/// Short stable names for the metrics.
fn reason(e: &rustls::Error) -> &'static str {
    use rustls::Error::*;
    match e {
        InvalidCertificate(_) => "bad_certificate",
        NoCertificatesPresented => "no_certificate",
        AlertReceived(_) => "alert_received",
        PeerIncompatible(_) => "incompatible",
        DecryptError => "decrypt_error",
        InvalidMessage(_) | InappropriateMessage { .. } | InappropriateHandshakeMessage { .. } => {
            "bad_message"
        }
        PeerMisbehaved(_) => "misbehaved",
        _ => "other",
    }
}

fn err(e: rustls::Error) -> TlsError {
    TlsError {
        reason: reason(&e),
        message: e.to_string(),
    }
}

impl Session for Rustls {
    fn feed(&mut self, ct: &[u8]) -> Result<usize, TlsError> {
        let mut r = ct;
        let n = self.c.read_tls(&mut r).map_err(|e| TlsError {
            reason: "bad_message",
            message: e.to_string(),
        })?;
        self.c.process_new_packets().map_err(err)?;
        Ok(n)
    }

    fn read(&mut self, out: &mut [u8]) -> Result<Plain, TlsError> {
        match self.c.reader().read(out) {
            Ok(0) => Ok(Plain::Closed),
            Ok(n) => Ok(Plain::Data(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Plain::NeedMore),
            Err(e) => Err(TlsError {
                reason: "eof",
                message: e.to_string(),
            }),
        }
    }

    fn write(&mut self, plain: &[u8]) -> Result<(), TlsError> {
        self.c.writer().write_all(plain).map_err(|e| TlsError {
            reason: "other",
            message: e.to_string(),
        })
    }

    fn take_output(&mut self, out: &mut Vec<u8>) {
        while self.c.wants_write() {
            // Writing into a Vec cannot fail.
            if self.c.write_tls(out).is_err() {
                break;
            }
        }
    }

    fn wants_write(&self) -> bool {
        self.c.wants_write()
    }

    fn close(&mut self) {
        self.c.send_close_notify();
    }

    fn handshaking(&self) -> bool {
        self.c.is_handshaking()
    }

    fn info(&self) -> Info {
        Info {
            version: self
                .c
                .protocol_version()
                .map(|v| match v {
                    rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3".to_string(),
                    rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2".to_string(),
                    v => format!("{v:?}"),
                })
                .unwrap_or_default(),
            cipher: self
                .c
                .negotiated_cipher_suite()
                .map(|s| format!("{:?}", s.suite()).replacen("TLS13_", "TLS_", 1))
                .unwrap_or_default(),
            peer: self
                .c
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| subject(c)),
        }
    }
}
