//! A blocking NBD client over a Unix socket for tests: the fixed-newstyle handshake, options,
//! requests and both reply forms, written byte by byte from `uraid_nbd::proto`'s constants
//! (never its encoders or parsers, so a test still checks what the server puts on the wire).
//! Every call panics on an I/O error, a timeout or a reply that breaks the protocol.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use uraid_nbd::proto::{
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT,
    INFO_EXPORT, NBDMAGIC, OPT_GO, OPT_REPLY_MAGIC, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, REP_ACK,
    REP_INFO, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};

/// How long a read or write on the socket may block before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The export every test server serves.
pub const EXPORT: &str = "vol";

/// One client connection; `s` is the socket, for tests that send or read raw bytes.
pub struct Client {
    pub s: UnixStream,
}

impl Client {
    /// Connects, checks the greeting (NBDMAGIC, IHAVEOPT, fixed newstyle and no zeroes) and
    /// sends the client flags (the same two).
    pub fn connect(sock: &Path) -> Client {
        let mut s = UnixStream::connect(sock)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display()));
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).expect("greeting");
        assert_eq!(be64(&g[..8]), NBDMAGIC, "greeting: NBDMAGIC");
        assert_eq!(be64(&g[8..16]), IHAVEOPT, "greeting: IHAVEOPT");
        assert_eq!(
            be16(&g[16..18]),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES,
            "handshake flags"
        );
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        Client { s }
    }

    /// Sends option `opt` with payload `data`.
    pub fn option(&mut self, opt: u32, data: &[u8]) {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        self.s.write_all(&v).unwrap();
    }

    /// One option reply: (reply type, payload).
    pub fn opt_reply(&mut self) -> (u32, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(be64(&h[..8]), OPT_REPLY_MAGIC, "option reply magic");
        let typ = be32(&h[12..16]);
        let mut d = vec![0u8; be32(&h[16..20]) as usize];
        self.s.read_exact(&mut d).unwrap();
        (typ, d)
    }

    /// NBD_OPT_GO on [`EXPORT`] with no information requests; returns the transmission
    /// flags from the NBD_INFO_EXPORT reply.
    pub fn go(&mut self) -> u16 {
        let mut d = (EXPORT.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(EXPORT.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.option(OPT_GO, &d);
        let mut flags = 0;
        loop {
            let (typ, d) = self.opt_reply();
            match typ {
                // NBD_INFO_EXPORT: type (2 bytes), size (8), transmission flags (2).
                REP_INFO if be16(&d[..2]) == INFO_EXPORT => flags = be16(&d[10..12]),
                REP_INFO => {}
                REP_ACK => return flags,
                _ => panic!("GO failed: {typ:#x}"),
            }
        }
    }

    /// Sends a request header and `data` (the payload of a write).
    pub fn request(&mut self, flags: u16, typ: u16, handle: u64, off: u64, len: u32, data: &[u8]) {
        let mut v = header(flags, typ, handle, off, len);
        v.extend_from_slice(data);
        self.s.write_all(&v).unwrap();
    }

    /// A simple reply: (error, handle). A read's data follows it on `s`.
    pub fn simple(&mut self) -> (u32, u64) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(be32(&h[..4]), SIMPLE_REPLY_MAGIC, "simple reply magic");
        (be32(&h[4..8]), be64(&h[8..16]))
    }

    /// One structured reply chunk: (flags, type, handle, payload).
    pub fn chunk(&mut self) -> (u16, u16, u64, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(
            be32(&h[..4]),
            STRUCTURED_REPLY_MAGIC,
            "structured reply magic"
        );
        let mut d = vec![0u8; be32(&h[16..20]) as usize];
        self.s.read_exact(&mut d).unwrap();
        (be16(&h[4..6]), be16(&h[6..8]), be64(&h[8..16]), d)
    }

    /// A structured error chunk that ends its reply: (error, handle).
    pub fn error_chunk(&mut self) -> (u32, u64) {
        let (flags, typ, handle, d) = self.chunk();
        assert_eq!(
            flags & REPLY_FLAG_DONE,
            REPLY_FLAG_DONE,
            "error chunk ends the reply"
        );
        assert_eq!(typ, REPLY_TYPE_ERROR, "NBD_REPLY_TYPE_ERROR");
        (be32(&d[..4]), handle)
    }

    /// Whether the server closed the connection (EOF or reset, within the read timeout).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

/// A request header: magic, command flags, type, handle, offset, length.
pub fn header(flags: u16, typ: u16, handle: u64, off: u64, len: u32) -> Vec<u8> {
    let mut v = REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&typ.to_be_bytes());
    v.extend_from_slice(&handle.to_be_bytes());
    v.extend_from_slice(&off.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b.try_into().expect("2 bytes"))
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().expect("4 bytes"))
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}
