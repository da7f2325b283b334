//! The NBD wire format (NetworkBlockDevice/nbd doc/proto.md): constants, parsers for what
//! clients send, and encoders for what the server sends. Pure code with no I/O; every parser
//! takes untrusted bytes and returns an error rather than panicking (fuzz target
//! `nbd_wire` and the tests below).

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Extended headers (the spec's `EXTENDED_HEADERS` extension): 32-byte requests and replies
/// with 64-bit lengths.
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_TLS_REQD: u32 = 0x8000_0005;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_SHUTDOWN: u32 = 0x8000_0007;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;
pub const REP_ERR_EXT_HEADER_REQD: u32 = 0x8000_000a;

// NBD_INFO types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands and command flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Extended headers: the length is a payload that follows (WRITE always sets it).
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply chunk types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// base:allocation status bits.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

pub const BASE_ALLOCATION: &str = "base:allocation";

/// NBD error values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Errno {
    Perm = 1,
    Io = 5,
    NoMem = 12,
    Inval = 22,
    NoSpc = 28,
    Overflow = 75,
    NotSup = 95,
    Shutdown = 108,
}

/// Longest option payload the server reads (names and queries are ≤ 4096 bytes each; a
/// client listing many meta contexts stays far below this).
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Longest string (export name, query) the spec allows.
pub const MAX_STRING: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    BadMagic(u64),
    Short { need: usize, got: usize },
    TooLong(usize),
    Invalid(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::BadMagic(m) => write!(f, "bad magic {m:#x}"),
            WireError::Short { need, got } => write!(f, "truncated: need {need} bytes, got {got}"),
            WireError::TooLong(n) => write!(f, "string of {n} bytes exceeds {MAX_STRING}"),
            WireError::Invalid(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for WireError {}

/// A little cursor over untrusted bytes.
struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(WireError::Short {
                need: n,
                got: self.b.len(),
            });
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn string(&mut self, len: usize) -> Result<String, WireError> {
        if len > MAX_STRING {
            return Err(WireError::TooLong(len));
        }
        let raw = self.take(len)?;
        let s = std::str::from_utf8(raw).map_err(|_| WireError::Invalid("string is not UTF-8"))?;
        if s.contains('\0') {
            return Err(WireError::Invalid("string contains NUL"));
        }
        Ok(s.to_string())
    }
    fn done(&self) -> Result<(), WireError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(WireError::Invalid("trailing bytes in option"))
        }
    }
}

/// An option request header (16 bytes): magic, option, length.
pub fn parse_option_header(b: &[u8; 16]) -> Result<(u32, u32), WireError> {
    let magic = u64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
    if magic != IHAVEOPT {
        return Err(WireError::BadMagic(magic));
    }
    Ok((
        u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
        u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
    ))
}

/// NBD_OPT_INFO / NBD_OPT_GO data: export name and the information types requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub info: Vec<u16>,
}

pub fn parse_go(data: &[u8]) -> Result<GoRequest, WireError> {
    let mut c = Cur { b: data };
    let nlen = c.u32()? as usize;
    let name = c.string(nlen)?;
    let n = c.u16()? as usize;
    let mut info = Vec::with_capacity(n.min(16));
    for _ in 0..n {
        info.push(c.u16()?);
    }
    c.done()?;
    Ok(GoRequest { name, info })
}

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data: export name and queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub name: String,
    pub queries: Vec<String>,
}

pub fn parse_meta(data: &[u8]) -> Result<MetaRequest, WireError> {
    let mut c = Cur { b: data };
    let nlen = c.u32()? as usize;
    let name = c.string(nlen)?;
    let n = c.u32()? as usize;
    let mut queries = Vec::with_capacity(n.min(16));
    for _ in 0..n {
        let l = c.u32()? as usize;
        queries.push(c.string(l)?);
    }
    c.done()?;
    Ok(MetaRequest { name, queries })
}

/// A transmission-phase request header: compact (28 bytes) or extended (32 bytes, a
/// 64-bit length: the payload's with `CMD_FLAG_PAYLOAD_LEN`, else the effect length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub typ: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u64,
}

pub const REQUEST_LEN: usize = 28;
pub const EXT_REQUEST_LEN: usize = 32;

/// Parses a request header: extended (`ext`, after NBD_OPT_EXTENDED_HEADERS) or compact.
pub fn parse_request_as(b: &[u8], ext: bool) -> Result<Request, WireError> {
    let (need, magic_want) = if ext {
        (EXT_REQUEST_LEN, EXTENDED_REQUEST_MAGIC)
    } else {
        (REQUEST_LEN, REQUEST_MAGIC)
    };
    if b.len() < need {
        return Err(WireError::Short { need, got: b.len() });
    }
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
    if magic != magic_want {
        return Err(WireError::BadMagic(magic as u64));
    }
    Ok(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().expect("2 bytes")),
        typ: u16::from_be_bytes(b[6..8].try_into().expect("2 bytes")),
        handle: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        length: if ext {
            u64::from_be_bytes(b[24..32].try_into().expect("8 bytes"))
        } else {
            u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")) as u64
        },
    })
}

/// A compact request header (28 bytes).
pub fn parse_request(b: &[u8]) -> Result<Request, WireError> {
    parse_request_as(b, false)
}

// ---------------------------------------------------------------- encoders

/// The server's greeting: NBDMAGIC, IHAVEOPT, handshake flags.
/// Fuzz entry point (`fuzz/`, and the corpus replay test): every parser of client bytes
/// (option headers, GO/INFO data, meta-context queries, request headers). None may panic;
/// whatever parses must be within the spec's limits.
pub fn fuzz_wire(data: &[u8]) {
    if let Ok(g) = parse_go(data) {
        assert!(g.name.len() <= MAX_STRING);
    }
    if let Ok(m) = parse_meta(data) {
        assert!(m.queries.iter().all(|q| q.len() <= MAX_STRING));
    }
    let _ = parse_request(data);
    if let Ok(r) = parse_request_as(data, true) {
        assert_eq!(r.length.to_be_bytes(), data[24..32]);
    }
    if let Some(h) = data.get(..16).and_then(|h| <&[u8; 16]>::try_from(h).ok()) {
        let _ = parse_option_header(h);
    }
}

pub fn greeting() -> Vec<u8> {
    let mut v = Vec::with_capacity(18);
    v.extend_from_slice(&NBDMAGIC.to_be_bytes());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    v
}

/// An option reply.
pub fn option_reply(option: u32, typ: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&typ.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = INFO_EXPORT.to_be_bytes().to_vec();
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

pub fn info_string(typ: u16, s: &str) -> Vec<u8> {
    let mut v = typ.to_be_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for x in [min, preferred, max] {
        v.extend_from_slice(&x.to_be_bytes());
    }
    v
}

/// NBD_REP_SERVER payload.
pub fn rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut v = (name.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(description.as_bytes());
    v
}

/// NBD_REP_META_CONTEXT payload.
pub fn rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut v = id.to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v
}

/// Reply to NBD_OPT_EXPORT_NAME: size, transmission flags, and 124 zeros unless NO_ZEROES.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut v = size.to_be_bytes().to_vec();
    v.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        v.extend_from_slice(&[0u8; 124]);
    }
    v
}

pub fn simple_reply(error: u32, handle: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    v[4..8].copy_from_slice(&error.to_be_bytes());
    v[8..16].copy_from_slice(&handle.to_be_bytes());
    v
}

/// Whom a reply chunk answers: the request's cookie, and with extended headers (`ext`) its
/// offset, which every extended reply echoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyTo {
    pub handle: u64,
    pub offset: u64,
    pub ext: bool,
}

impl ReplyTo {
    pub fn of(req: &Request, ext: bool) -> ReplyTo {
        ReplyTo {
            handle: req.handle,
            offset: req.offset,
            ext,
        }
    }
}

/// A reply chunk header: structured (20 bytes) or extended (32 bytes); `len` is the
/// payload length that follows.
pub fn chunk_header(flags: u16, typ: u16, to: &ReplyTo, len: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(32 + 16);
    if to.ext {
        v.extend_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
    } else {
        v.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    }
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&typ.to_be_bytes());
    v.extend_from_slice(&to.handle.to_be_bytes());
    if to.ext {
        v.extend_from_slice(&to.offset.to_be_bytes());
        v.extend_from_slice(&(len as u64).to_be_bytes());
    } else {
        v.extend_from_slice(&len.to_be_bytes());
    }
    v
}

/// Header of an OFFSET_DATA chunk for `data_len` bytes at `offset` (data follows).
pub fn offset_data_header(flags: u16, to: &ReplyTo, offset: u64, data_len: u32) -> Vec<u8> {
    let mut v = chunk_header(flags, REPLY_TYPE_OFFSET_DATA, to, data_len + 8);
    v.extend_from_slice(&offset.to_be_bytes());
    v
}

pub fn offset_hole(flags: u16, to: &ReplyTo, offset: u64, len: u32) -> Vec<u8> {
    let mut v = chunk_header(flags, REPLY_TYPE_OFFSET_HOLE, to, 12);
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

pub fn error_chunk(to: &ReplyTo, err: Errno, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(MAX_STRING)];
    let mut v = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, to, 6 + msg.len() as u32);
    v.extend_from_slice(&(err as u32).to_be_bytes());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

pub fn done_chunk(to: &ReplyTo) -> Vec<u8> {
    chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, to, 0)
}

/// A BLOCK_STATUS chunk for one context: (length, flags) descriptors; with extended
/// headers the 64-bit form (BLOCK_STATUS_EXT: a descriptor count, then 64-bit lengths and
/// status).
pub fn block_status(flags: u16, to: &ReplyTo, context: u32, extents: &[(u64, u32)]) -> Vec<u8> {
    let n = extents.len() as u32;
    let mut v = if to.ext {
        let mut v = chunk_header(flags, REPLY_TYPE_BLOCK_STATUS_EXT, to, 8 + 16 * n);
        v.extend_from_slice(&context.to_be_bytes());
        v.extend_from_slice(&n.to_be_bytes());
        v
    } else {
        let mut v = chunk_header(flags, REPLY_TYPE_BLOCK_STATUS, to, 4 + 8 * n);
        v.extend_from_slice(&context.to_be_bytes());
        v
    };
    for &(l, f) in extents {
        if to.ext {
            v.extend_from_slice(&l.to_be_bytes());
            v.extend_from_slice(&(f as u64).to_be_bytes());
        } else {
            v.extend_from_slice(&(l as u32).to_be_bytes());
            v.extend_from_slice(&f.to_be_bytes());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn go_bytes(name: &str, info: &[u16]) -> Vec<u8> {
        let mut v = (name.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&(info.len() as u16).to_be_bytes());
        for i in info {
            v.extend_from_slice(&i.to_be_bytes());
        }
        v
    }

    #[test]
    fn go_round_trip_and_malformed() {
        let b = go_bytes("vol", &[INFO_BLOCK_SIZE, INFO_NAME]);
        assert_eq!(
            parse_go(&b).unwrap(),
            GoRequest {
                name: "vol".into(),
                info: vec![3, 1]
            }
        );
        // Name length beyond the data.
        let mut bad = b.clone();
        bad[3] = 200;
        assert!(matches!(parse_go(&bad), Err(WireError::Short { .. })));
        // Info count beyond the data.
        let mut bad = go_bytes("vol", &[]);
        bad[8] = 5;
        assert!(matches!(parse_go(&bad), Err(WireError::Short { .. })));
        // Trailing garbage.
        let mut bad = b.clone();
        bad.push(0);
        assert!(parse_go(&bad).is_err());
        // Huge name length: refused without allocating.
        assert_eq!(
            parse_go(&[0xff, 0xff, 0xff, 0xff]),
            Err(WireError::TooLong(0xffff_ffff))
        );
        assert!(parse_go(&go_bytes("a\0b", &[])).is_err());
        assert!(
            parse_go(&[0, 0, 0, 1, 0xc3, 0, 0]).is_err(),
            "invalid UTF-8"
        );
        assert!(parse_go(&[]).is_err());
    }

    #[test]
    fn meta_round_trip_and_malformed() {
        let mut b = 3u32.to_be_bytes().to_vec();
        b.extend_from_slice(b"vol");
        b.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        let m = parse_meta(&b).unwrap();
        assert_eq!(m.name, "vol");
        assert_eq!(m.queries, vec!["base:allocation", "qemu:dirty-bitmap:x"]);
        let mut bad = b.clone();
        bad.truncate(b.len() - 1);
        assert!(parse_meta(&bad).is_err());
        let mut bad = b[..7].to_vec();
        bad.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta(&bad).is_err(), "query count beyond the data");
    }

    #[test]
    fn request_header() {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        b.extend_from_slice(&CMD_WRITE.to_be_bytes());
        b.extend_from_slice(&7u64.to_be_bytes());
        b.extend_from_slice(&4096u64.to_be_bytes());
        b.extend_from_slice(&512u32.to_be_bytes());
        assert_eq!(
            parse_request(&b).unwrap(),
            Request {
                flags: 1,
                typ: 1,
                handle: 7,
                offset: 4096,
                length: 512
            }
        );
        assert!(matches!(
            parse_request(&b[..27]),
            Err(WireError::Short { .. })
        ));
        b[0] ^= 1;
        assert!(matches!(parse_request(&b), Err(WireError::BadMagic(_))));
        // Extended: its own magic, a 64-bit length.
        let mut x = EXTENDED_REQUEST_MAGIC.to_be_bytes().to_vec();
        x.extend_from_slice(&CMD_FLAG_PAYLOAD_LEN.to_be_bytes());
        x.extend_from_slice(&CMD_WRITE.to_be_bytes());
        x.extend_from_slice(&7u64.to_be_bytes());
        x.extend_from_slice(&4096u64.to_be_bytes());
        x.extend_from_slice(&(5u64 << 32).to_be_bytes());
        let r = parse_request_as(&x, true).unwrap();
        assert_eq!((r.flags, r.length), (CMD_FLAG_PAYLOAD_LEN, 5 << 32));
        assert!(
            parse_request_as(&x, false).is_err(),
            "extended magic in compact mode"
        );
        assert!(parse_request_as(&x[..31], true).is_err());
        assert!(
            parse_request_as(&b, true).is_err(),
            "compact magic in extended mode"
        );
        let mut h = [0u8; 16];
        assert!(parse_option_header(&h).is_err());
        h[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        h[11] = OPT_GO as u8;
        h[15] = 9;
        assert_eq!(parse_option_header(&h).unwrap(), (OPT_GO, 9));
    }

    #[test]
    fn encoders_have_the_spec_layout() {
        assert_eq!(&greeting()[..8], b"NBDMAGIC");
        assert_eq!(&greeting()[8..16], b"IHAVEOPT");
        let r = option_reply(OPT_GO, REP_ACK, &[]);
        assert_eq!(r.len(), 20);
        assert_eq!(&r[..8], &OPT_REPLY_MAGIC.to_be_bytes());
        assert_eq!(info_export(1, 2).len(), 12);
        assert_eq!(info_block_size(1, 2, 3).len(), 14);
        assert_eq!(export_name_reply(1, 1, false).len(), 134);
        assert_eq!(export_name_reply(1, 1, true).len(), 10);
        let to = ReplyTo {
            handle: 9,
            offset: 4096,
            ext: false,
        };
        assert_eq!(offset_hole(0, &to, 2, 3).len(), 32);
        assert_eq!(offset_data_header(0, &to, 2, 4096).len(), 28);
        let e = error_chunk(&to, Errno::Inval, "x");
        assert_eq!(e.len(), 20 + 7);
        assert_eq!(&e[16..20], &7u32.to_be_bytes());
        assert_eq!(block_status(0, &to, 1, &[(4096, 3)]).len(), 20 + 12);
        // Extended: 32-byte headers echoing the request's offset, 64-bit lengths.
        let x = ReplyTo { ext: true, ..to };
        let e = error_chunk(&x, Errno::Inval, "x");
        assert_eq!(e.len(), 32 + 7);
        assert_eq!(&e[..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&e[16..24], &4096u64.to_be_bytes());
        assert_eq!(&e[24..32], &7u64.to_be_bytes());
        assert_eq!(done_chunk(&x).len(), 32);
        assert_eq!(offset_data_header(0, &x, 2, 4096).len(), 40);
        let b = block_status(REPLY_FLAG_DONE, &x, 1, &[(5 << 32, 3), (512, 0)]);
        assert_eq!(b.len(), 32 + 8 + 32);
        assert_eq!(&b[6..8], &REPLY_TYPE_BLOCK_STATUS_EXT.to_be_bytes());
        assert_eq!(&b[24..32], &40u64.to_be_bytes());
        assert_eq!(&b[36..40], &2u32.to_be_bytes());
        assert_eq!(&b[40..48], &(5u64 << 32).to_be_bytes());
        assert_eq!(&b[48..56], &3u64.to_be_bytes());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_go(&b);
            let _ = parse_meta(&b);
            let _ = parse_request(&b);
            let _ = parse_request_as(&b, true);
            if b.len() >= 16 {
                let _ = parse_option_header(b[..16].try_into().unwrap());
            }
        }
    }
}
