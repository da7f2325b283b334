//! The fixed-newstyle handshake: greeting, client flags, then option haggling until the
//! client picks the export (`NBD_OPT_EXPORT_NAME`, `NBD_OPT_GO`) or aborts. `option`
//! decides the reply to each option without I/O; `handshake` receives and sends.
//!
//! STARTTLS (NBD spec, "TLS support"): with `--tls on` or `require` the server acknowledges
//! it, drops any bytes the client sent after it (they were not encrypted), runs the TLS
//! handshake and forgets every option negotiated before it (structured replies, meta
//! contexts: CVE-2021-3716). With `require`, every option before it but ABORT is answered
//! NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME (which cannot be refused) ends the
//! connection.

use super::recv::Reader;
use super::send::send_now;
use super::tlslink::TlsLink;
use super::{Inner, MAX_PAYLOAD, META_ID};
use crate::proto::{self, GoRequest, MetaRequest};
use crate::tls::Mode;
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use uraid_core::geometry::SECTOR;
use uraid_engine::{BlockDev, Volume};

/// What the client negotiated (so far, during the haggling). After STARTTLS it starts
/// over from the default.
#[derive(Default)]
pub(super) struct Session {
    /// Structured replies (also set by extended headers, which imply them).
    pub(super) structured: bool,
    pub(super) meta: bool,
    /// Extended headers: 32-byte requests and replies, 64-bit lengths.
    pub(super) extended: bool,
    /// The client set NBD_FLAG_C_FIXED_NEWSTYLE (TLS needs it).
    pub(super) fixed: bool,
}

/// What the handshake does after an option.
enum Step {
    /// Send this reply and read the next option.
    Reply(Vec<u8>),
    /// Send this reply and enter transmission.
    Enter(Vec<u8>),
    /// The client aborted: send this acknowledgement (if it still listens) and close.
    Abort(Vec<u8>),
    /// Send this acknowledgement, then the TLS handshake.
    StartTls(Vec<u8>),
}

/// What the option phase knows of the export and the server: a plain view, so `option`
/// decides without I/O or an array (and is fuzzed so, `fuzz_options`).
pub(super) struct Export<'a> {
    pub(super) name: &'a str,
    pub(super) description: &'a str,
    pub(super) size: u64,
    pub(super) read_only: bool,
    /// (minimum, preferred, maximum).
    pub(super) block_sizes: (u32, u32, u32),
    pub(super) tls_mode: Mode,
    /// TLS credentials are loaded.
    pub(super) tls_ready: bool,
}

impl<'a> Export<'a> {
    fn of<D: BlockDev>(inner: &'a Inner<D>) -> Export<'a> {
        Export {
            name: &inner.cfg.export,
            description: &inner.cfg.description,
            size: inner.array.size(),
            read_only: inner.cfg.read_only,
            block_sizes: block_sizes(&inner.array),
            tls_mode: inner.cfg.tls_mode,
            tls_ready: inner.tls.is_some(),
        }
    }
}

fn transmission_flags(x: &Export, structured: bool) -> u16 {
    use proto::*;
    let mut f = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN | FLAG_SEND_CACHE;
    if x.read_only {
        f |= FLAG_READ_ONLY;
    } else {
        f |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    }
    if structured {
        f |= FLAG_SEND_DF;
    }
    f
}

/// (minimum, preferred, maximum) block sizes: sector, one full stripe (as a power of two),
/// MAX_PAYLOAD.
pub fn block_sizes<D: BlockDev>(array: &Volume<D>) -> (u32, u32, u32) {
    let stripe = array.geometry().stripe_data_bytes();
    let preferred = stripe.next_power_of_two().clamp(4096, MAX_PAYLOAD as u64) as u32;
    (SECTOR as u32, preferred, MAX_PAYLOAD)
}

fn name_ok(x: &Export, name: &str) -> bool {
    name.is_empty() || name == x.name
}

fn invalid_data(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Runs option haggling. Ok(Some) = enter transmission; Ok(None) = client aborted.
/// `id`: the connection's key in the server's client list (its TLS state is recorded there).
pub(super) async fn handshake<D: BlockDev>(
    inner: &Inner<D>,
    rd: &mut Reader,
    id: u64,
) -> io::Result<Option<Session>> {
    use proto::*;
    send_now(rd.fd, greeting()).await?;
    let cflags = {
        let b = rd.exact(4).await?;
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    };
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(invalid_data(format!("unknown client flags {cflags:#x}")));
    }
    let no_zeroes = cflags & FLAG_C_NO_ZEROES != 0;
    let fixed = cflags & FLAG_C_FIXED_NEWSTYLE != 0;
    if !fixed && inner.cfg.tls_mode == Mode::Require {
        // The spec: TLS needs fixed newstyle; such a client can only be served in plaintext.
        return Err(invalid_data(
            "client without fixed newstyle on a server that requires TLS",
        ));
    }
    let mut h = Session {
        fixed,
        ..Session::default()
    };
    loop {
        let hdr: [u8; 16] = rd.exact(16).await?.try_into().expect("16 bytes");
        let (opt, len) = parse_option_header(&hdr).map_err(|e| invalid_data(e.to_string()))?;
        if len > MAX_OPTION_LEN {
            if opt == OPT_EXPORT_NAME {
                return Err(invalid_data("option too long"));
            }
            rd.skip(len as usize).await?;
            rd.send(option_reply(opt, REP_ERR_TOO_BIG, b"option data too long"))
                .await?;
            continue;
        }
        let data = rd.take_buf(len as usize).await?;
        if inner.stopping.load(Ordering::SeqCst) {
            rd.send(option_reply(opt, REP_ERR_SHUTDOWN, b"server shutting down"))
                .await?;
            return Ok(None);
        }
        let step = option(
            &Export::of(inner),
            &mut h,
            opt,
            &data[..],
            no_zeroes,
            rd.tls().is_some(),
        )?;
        match step {
            Step::Reply(v) => rd.send(v).await?,
            Step::StartTls(v) => {
                rd.send(v).await?;
                start_tls(inner, rd, id).await?;
                // Nothing negotiated in plaintext carries over.
                h = Session {
                    fixed,
                    ..Session::default()
                };
            }
            Step::Enter(v) => {
                rd.send(v).await?;
                return Ok(Some(h));
            }
            Step::Abort(v) => {
                let _ = rd.send(v).await;
                return Ok(None);
            }
        }
    }
}

/// After STARTTLS's acknowledgement: drops plaintext the client sent too early, runs the
/// TLS handshake (counted; a failure ends the connection after the session's alert) and
/// records what was negotiated.
async fn start_tls<D: BlockDev>(inner: &Inner<D>, rd: &mut Reader, id: u64) -> io::Result<()> {
    let early = rd.discard_buffered();
    if early > 0 {
        tracing::debug!("dropped {early} byte(s) sent after STARTTLS before its reply");
    }
    let tls = inner
        .tls
        .as_ref()
        .ok_or_else(|| invalid_data("STARTTLS without TLS credentials"))?;
    let session = tls.session().map_err(|e| {
        inner.stats.tls_failure(e.reason);
        io::Error::from(e)
    })?;
    let link = Rc::new(TlsLink::new(session, inner.stats.clone()));
    rd.start_tls(link.clone());
    if let Err(e) = rd.tls_handshake().await {
        if e.kind() != io::ErrorKind::InvalidData {
            // Not the session's verdict (counted by reason): the client went away or was
            // cut off.
            inner.stats.tls_failure("closed");
        }
        inner.warn_client(format!("TLS handshake with {} failed: {e}", inner.peer(id)));
        return Err(e);
    }
    let info = link.info();
    inner.stats.tls_handshake(info.peer.as_deref());
    let (version, cipher, who) = (info.version.clone(), info.cipher.clone(), info.peer.clone());
    let addr = inner.set_client_tls(id, info);
    tracing::info!(
        "TLS session with {addr} ({}): {version}, {cipher}",
        who.as_deref().unwrap_or("no client identity")
    );
    Ok(())
}

/// The answer to option `opt` with its `data`; an error ends the connection (an export
/// name that does not exist: `NBD_OPT_EXPORT_NAME` has no way to refuse). `tls`: the
/// connection has switched to TLS.
fn option(
    x: &Export,
    h: &mut Session,
    opt: u32,
    data: &[u8],
    no_zeroes: bool,
    tls: bool,
) -> io::Result<Step> {
    use proto::*;
    let reply = |t: u32, d: &[u8]| option_reply(opt, t, d);
    let invalid = |msg: &str| Step::Reply(option_reply(opt, REP_ERR_INVALID, msg.as_bytes()));
    let mode = x.tls_mode;
    if mode == Mode::Require && !tls && opt != OPT_STARTTLS && opt != OPT_ABORT {
        if opt == OPT_EXPORT_NAME {
            return Err(invalid_data(
                "NBD_OPT_EXPORT_NAME before STARTTLS on a server that requires TLS",
            ));
        }
        return Ok(Step::Reply(reply(
            REP_ERR_TLS_REQD,
            b"this server requires TLS: send NBD_OPT_STARTTLS first",
        )));
    }
    Ok(match opt {
        OPT_EXPORT_NAME => {
            if h.extended {
                return Err(invalid_data(
                    "NBD_OPT_EXPORT_NAME after extended headers were negotiated",
                ));
            }
            let name = String::from_utf8_lossy(data);
            if !name_ok(x, &name) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("unknown export '{name}'"),
                ));
            }
            let flags = transmission_flags(x, h.structured);
            Step::Enter(export_name_reply(x.size, flags, no_zeroes))
        }
        OPT_ABORT => Step::Abort(reply(REP_ACK, &[])),
        OPT_LIST => {
            if !data.is_empty() {
                return Ok(invalid("NBD_OPT_LIST takes no data"));
            }
            let mut v = reply(REP_SERVER, &rep_server(x.name, x.description));
            v.extend(reply(REP_ACK, &[]));
            Step::Reply(v)
        }
        OPT_STRUCTURED_REPLY => {
            if !data.is_empty() {
                return Ok(invalid("NBD_OPT_STRUCTURED_REPLY takes no data"));
            }
            if h.extended {
                return Ok(Step::Reply(reply(
                    REP_ERR_EXT_HEADER_REQD,
                    b"extended headers are on: no going back to structured replies",
                )));
            }
            h.structured = true;
            Step::Reply(reply(REP_ACK, &[]))
        }
        OPT_EXTENDED_HEADERS => {
            if !data.is_empty() {
                return Ok(invalid("NBD_OPT_EXTENDED_HEADERS takes no data"));
            }
            if h.extended {
                return Ok(invalid("extended headers are already on"));
            }
            h.extended = true;
            h.structured = true;
            Step::Reply(reply(REP_ACK, &[]))
        }
        OPT_INFO | OPT_GO => match parse_go(data) {
            Ok(go) => info(x, h, opt, &go),
            Err(e) => invalid(&e.to_string()),
        },
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            if !h.structured {
                return Ok(invalid("negotiate structured replies first"));
            }
            match parse_meta(data) {
                Ok(m) => meta_context(x, h, opt, &m),
                Err(e) => invalid(&e.to_string()),
            }
        }
        OPT_STARTTLS => {
            if mode == Mode::Off || !x.tls_ready {
                Step::Reply(reply(REP_ERR_UNSUP, b"TLS is off on this server"))
            } else if !h.fixed {
                Step::Reply(reply(
                    REP_ERR_UNSUP,
                    b"TLS needs fixed newstyle negotiation",
                ))
            } else if tls {
                invalid("TLS is already on")
            } else if !data.is_empty() {
                invalid("NBD_OPT_STARTTLS takes no data")
            } else {
                Step::StartTls(reply(REP_ACK, &[]))
            }
        }
        _ => {
            let msg = format!("option {opt} is not supported");
            Step::Reply(reply(REP_ERR_UNSUP, msg.as_bytes()))
        }
    })
}

/// `NBD_OPT_INFO` and `NBD_OPT_GO`: the export's size, flags and block sizes (and the
/// name and description when asked); GO then enters transmission.
fn info(x: &Export, h: &Session, opt: u32, go: &GoRequest) -> Step {
    use proto::*;
    let reply = |t: u32, d: &[u8]| option_reply(opt, t, d);
    if !name_ok(x, &go.name) {
        let msg = format!("no export named '{}'", go.name);
        return Step::Reply(reply(REP_ERR_UNKNOWN, msg.as_bytes()));
    }
    let flags = transmission_flags(x, h.structured);
    let mut v = reply(REP_INFO, &info_export(x.size, flags));
    let (min, pref, max) = x.block_sizes;
    v.extend(reply(REP_INFO, &info_block_size(min, pref, max)));
    if go.info.contains(&INFO_NAME) {
        v.extend(reply(REP_INFO, &info_string(INFO_NAME, x.name)));
    }
    if go.info.contains(&INFO_DESCRIPTION) {
        v.extend(reply(
            REP_INFO,
            &info_string(INFO_DESCRIPTION, x.description),
        ));
    }
    v.extend(reply(REP_ACK, &[]));
    if opt == OPT_GO {
        Step::Enter(v)
    } else {
        Step::Reply(v)
    }
}

/// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`: the one context served,
/// `base:allocation`; SET records whether the client selected it.
fn meta_context(x: &Export, h: &mut Session, opt: u32, m: &MetaRequest) -> Step {
    use proto::*;
    let reply = |t: u32, d: &[u8]| option_reply(opt, t, d);
    if !name_ok(x, &m.name) {
        let msg = format!("no export named '{}'", m.name);
        return Step::Reply(reply(REP_ERR_UNKNOWN, msg.as_bytes()));
    }
    let listing = opt == OPT_LIST_META_CONTEXT;
    let matches = if listing && m.queries.is_empty() {
        true
    } else {
        m.queries
            .iter()
            .any(|q| q == BASE_ALLOCATION || (listing && q == "base:"))
    };
    if !listing {
        h.meta = matches;
    }
    let mut v = Vec::new();
    if matches {
        let id = if listing { 0 } else { META_ID };
        v.extend(reply(
            REP_META_CONTEXT,
            &rep_meta_context(id, BASE_ALLOCATION),
        ));
    }
    v.extend(reply(REP_ACK, &[]));
    Step::Reply(v)
}

/// The option replies in `v`, as (option, type) pairs; panics unless `v` is whole replies.
fn replies(v: &[u8]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut rest = v;
    while !rest.is_empty() {
        assert!(rest.len() >= 20, "a torn option reply");
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(rest[..8], proto::OPT_REPLY_MAGIC.to_be_bytes());
        let len = be32(&rest[16..20]) as usize;
        assert!(
            rest.len() >= 20 + len,
            "an option reply longer than its bytes"
        );
        out.push((be32(&rest[8..12]), be32(&rest[12..16])));
        rest = &rest[20 + len..];
    }
    out
}

/// Fuzz body: the option phase as a client drives it, STARTTLS included. The first byte
/// picks the server (TLS mode, credentials loaded, read-only, no-zeroes); the rest is a
/// stream of options. Checks what the phase promises: every answer is whole replies to
/// the option asked; before TLS on a server that requires it, nothing but STARTTLS and
/// ABORT gets anything but NBD_REP_ERR_TLS_REQD (EXPORT_NAME ends the connection);
/// STARTTLS is taken only once, only with credentials and TLS not off.
pub fn fuzz_options(data: &[u8]) {
    use proto::*;
    let Some((&cfg, mut rest)) = data.split_first() else {
        return;
    };
    let mode = [Mode::Off, Mode::On, Mode::Require][(cfg % 3) as usize];
    let x = Export {
        name: "vol",
        description: "fuzz",
        size: 1 << 30,
        read_only: cfg & 4 != 0,
        block_sizes: (512, 1 << 20, MAX_PAYLOAD),
        tls_mode: mode,
        tls_ready: cfg & 8 == 0,
    };
    let no_zeroes = cfg & 16 != 0;
    let fixed = cfg & 32 == 0;
    if !fixed && mode == Mode::Require {
        return; // the connection ends at the client's flags
    }
    let mut h = Session {
        fixed,
        ..Session::default()
    };
    let mut tls = false;
    while let Some(hdr) = rest.get(..16) {
        let hdr: [u8; 16] = hdr.try_into().expect("16 bytes");
        rest = &rest[16..];
        let Ok((opt, len)) = parse_option_header(&hdr) else {
            return;
        };
        let len = (len as usize).min(rest.len()).min(MAX_OPTION_LEN as usize);
        let (d, r) = rest.split_at(len);
        rest = r;
        let gated = mode == Mode::Require && !tls && opt != OPT_STARTTLS && opt != OPT_ABORT;
        let step = match option(&x, &mut h, opt, d, no_zeroes, tls) {
            Ok(s) => s,
            Err(_) => {
                assert!(opt == OPT_EXPORT_NAME);
                return;
            }
        };
        match step {
            Step::Reply(v) => {
                let r = replies(&v);
                assert!(!r.is_empty() && r.iter().all(|&(o, _)| o == opt));
                if gated {
                    assert_eq!(r, [(opt, REP_ERR_TLS_REQD)]);
                }
                if r[0].1 == REP_ACK && opt == OPT_EXTENDED_HEADERS {
                    assert!(h.extended && h.structured);
                }
                if opt == OPT_STRUCTURED_REPLY && h.extended && d.is_empty() {
                    assert_eq!(r, [(opt, REP_ERR_EXT_HEADER_REQD)]);
                }
            }
            Step::StartTls(v) => {
                assert_eq!(replies(&v), [(OPT_STARTTLS, REP_ACK)]);
                assert!(mode != Mode::Off && x.tls_ready && !tls && fixed);
                tls = true;
                h = Session {
                    fixed,
                    ..Session::default()
                };
            }
            Step::Enter(v) => {
                assert!(!gated);
                if opt != OPT_EXPORT_NAME {
                    assert!(replies(&v).iter().all(|&(o, _)| o == opt));
                }
                return;
            }
            Step::Abort(_) => return,
        }
    }
}
