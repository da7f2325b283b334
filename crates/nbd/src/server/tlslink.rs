//! A connection's TLS session, shared by its reader and its reply sender (one reactor,
//! never borrowed across an await), with the server's TLS counters.

use super::ServerStats;
use crate::tls::{Info, Plain, Session, TlsError};
use std::cell::RefCell;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_engine::net::OutPart;

/// Plaintext of one full TLS record.
const RECORD: usize = 16 << 10;

/// Largest ciphertext buffer a connection keeps for its next batch.
const KEEP: usize = 2 << 20;

pub(super) struct TlsLink {
    s: RefCell<Box<dyn Session>>,
    stats: Arc<ServerStats>,
    /// The ciphertext buffer of the last batch sent, emptied, for the next one: a fresh
    /// megabyte per batch costs more in page faults than its encryption.
    spare: RefCell<Vec<u8>>,
}

impl TlsLink {
    pub(super) fn new(s: Box<dyn Session>, stats: Arc<ServerStats>) -> TlsLink {
        TlsLink {
            s: RefCell::new(s),
            stats,
            spare: RefCell::new(Vec::new()),
        }
    }

    fn failed(&self, e: TlsError) -> io::Error {
        self.stats.tls_failure(e.reason);
        e.into()
    }

    pub(super) fn feed(&self, ct: &[u8]) -> io::Result<usize> {
        let r = self.s.borrow_mut().feed(ct);
        r.map_err(|e| self.failed(e))
    }

    pub(super) fn read(&self, out: &mut [u8]) -> io::Result<Plain> {
        let r = self.s.borrow_mut().read(out);
        match r {
            Ok(Plain::Data(n)) => {
                self.stats
                    .tls_bytes_decrypted
                    .fetch_add(n as u64, Ordering::Relaxed);
                Ok(Plain::Data(n))
            }
            Ok(p) => Ok(p),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Encrypts a batch of reply parts; returns the ciphertext to send (with anything else
    /// the session had waiting, in order).
    ///
    /// Small parts (reply headers, 4 KiB reads) are gathered into one record's worth before
    /// they are written: each write is at least one record (its header, tag and cipher call),
    /// so a header and its data in two writes would cost two. Large parts go as they are.
    pub(super) fn seal(&self, parts: &[OutPart]) -> io::Result<Vec<u8>> {
        let mut s = self.s.borrow_mut();
        let mut n = 0;
        let mut staged: Vec<u8> = Vec::new();
        let mut r = Ok(());
        for p in parts {
            let b = p.as_slice();
            n += b.len();
            if staged.len() + b.len() <= RECORD {
                staged.extend_from_slice(b);
                continue;
            }
            if !staged.is_empty() {
                r = r.and_then(|()| s.write(&staged));
                staged.clear();
            }
            if b.len() < RECORD {
                staged.extend_from_slice(b);
            } else {
                r = r.and_then(|()| s.write(b));
            }
        }
        if !staged.is_empty() {
            r = r.and_then(|()| s.write(&staged));
        }
        if let Err(e) = r {
            drop(s);
            return Err(self.failed(e));
        }
        let mut out = std::mem::take(&mut *self.spare.borrow_mut());
        out.clear();
        s.take_output(&mut out);
        self.stats
            .tls_bytes_encrypted
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// A sent batch's buffer, kept (emptied) for the next one unless it is large.
    pub(super) fn give_back(&self, mut v: Vec<u8>) {
        if v.capacity() <= KEEP {
            v.clear();
            *self.spare.borrow_mut() = v;
        }
    }

    /// The close_notify alert to send before the connection closes.
    pub(super) fn close(&self) -> Vec<u8> {
        self.s.borrow_mut().close();
        self.take_output()
    }

    pub(super) fn take_output(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.s.borrow_mut().take_output(&mut v);
        v
    }

    pub(super) fn wants_write(&self) -> bool {
        self.s.borrow().wants_write()
    }

    pub(super) fn handshaking(&self) -> bool {
        self.s.borrow().handshaking()
    }

    pub(super) fn info(&self) -> Info {
        self.s.borrow().info()
    }
}
