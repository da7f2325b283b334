//! The transmission phase: the reader takes requests off the socket within the
//! connection's budgets and spawns one task per request, which validates it
//! (`command::validate`), runs it on the array and queues the reply.

use super::command::{validate, Command};
use super::handshake::{handshake, Session};
use super::recv::Reader;
use super::send::{errno_of, reply_error, reply_ok, Conn};
use super::{op_index, Inner, MAX_INFLIGHT, MAX_PAYLOAD, META_ID};
use crate::proto::{self, Errno, Request};
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use uraid_engine::net::OutPart;
use uraid_engine::reactor;
use uraid_engine::shard;
use uraid_engine::{buf, ArrayError, BlockDev, IoBuf, ReadPiece};

/// One connection: the handshake, then transmission until the client disconnects or
/// breaks the protocol; returns once every request read is answered and sent.
pub(super) async fn connection<D: BlockDev>(
    inner: Arc<Inner<D>>,
    fd: RawFd,
    id: u64,
) -> io::Result<()> {
    let mut rd = Reader::new(fd);
    let Some(sess) = handshake(&inner, &mut rd, id).await? else {
        return Ok(());
    };
    let headers = match (sess.extended, sess.structured) {
        (true, _) => "extended",
        (false, true) => "structured",
        _ => "simple",
    };
    inner.handshake_done(id, headers);
    let sess = Rc::new(sess);
    let conn = Rc::new(Conn::new(fd, inner.stats.clone(), rd.tls().cloned()));
    rd.set_conn(conn.clone());
    let r = transmission(&inner, &sess, &conn, &mut rd).await;
    // Finish what was read: every request answered, every reply sent.
    conn.wait_until(|c| c.inflight.get() == 0 && !c.sending.get())
        .await;
    if let Some(t) = rd.tls() {
        if !conn.broken.get() {
            let _ = super::send::send_now(fd, t.close()).await;
        }
    }
    r
}

/// The reader loop of the transmission phase.
async fn transmission<D: BlockDev>(
    inner: &Arc<Inner<D>>,
    sess: &Rc<Session>,
    conn: &Rc<Conn>,
    rd: &mut Reader,
) -> io::Result<()> {
    let broken = || io::Error::new(io::ErrorKind::BrokenPipe, "send failed");
    let (budget, max_queue) = (inner.cfg.max_payload_in_flight, inner.cfg.max_reply_queue);
    loop {
        // Take no new request while too many are in flight or their replies pile up unsent.
        conn.wait_until(|c| {
            c.broken.get() || (c.inflight.get() < MAX_INFLIGHT && c.queued.get() <= max_queue)
        })
        .await;
        if conn.broken.get() {
            return Err(broken());
        }
        let hlen = if sess.extended {
            proto::EXT_REQUEST_LEN
        } else {
            proto::REQUEST_LEN
        };
        let req = match proto::parse_request_as(rd.exact(hlen).await?, sess.extended) {
            Ok(r) => r,
            Err(e) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
        };
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        // A WRITE's length is its data. With extended headers a request flagged
        // PAYLOAD_LEN carries data too; a WRITE should say so, but qemu's client (10.0) does
        // not, and qemu's server takes it anyway: so does this one.
        let flagged = sess.extended && req.flags & proto::CMD_FLAG_PAYLOAD_LEN != 0;
        let payload_len = if req.typ == proto::CMD_WRITE || flagged {
            req.length
        } else {
            0
        };
        if req.typ == proto::CMD_DISC {
            return Ok(());
        }
        if sess.extended && payload_len > MAX_PAYLOAD as u64 {
            // The spec's hard disconnect: a payload past the advertised maximum.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("request payload of {payload_len} bytes exceeds 32 MiB"),
            ));
        }
        // Payload this request holds while in flight; it starts (and a write's data is read
        // off the socket) only once that fits the connection's budget.
        let cost = match req.typ {
            proto::CMD_WRITE if payload_len <= MAX_PAYLOAD as u64 => payload_len as usize,
            proto::CMD_READ if req.length <= MAX_PAYLOAD as u64 => req.length as usize,
            // Its reply, at most (`answer_block_status`'s caps).
            proto::CMD_BLOCK_STATUS => block_status_cost(req.flags, req.length, sess.extended),
            _ => 0,
        };
        if cost > 0 {
            conn.wait_until(|c| {
                c.broken.get() || c.payload.get() == 0 || c.payload.get() + cost <= budget
            })
            .await;
            if conn.broken.get() {
                return Err(broken());
            }
            conn.add_payload(cost);
        }
        let release = move |conn: &Conn| {
            conn.payload.set(conn.payload.get() - cost);
            conn.wake();
        };
        if payload_len > 0 && req.typ != proto::CMD_WRITE {
            // A payload the command does not take (extended headers).
            let msg = "this command takes no payload";
            drain_and_refuse(inner, sess, conn, rd, &req, payload_len, msg).await?;
            release(conn);
            continue;
        }
        let payload = if req.typ == proto::CMD_WRITE {
            if payload_len > MAX_PAYLOAD as u64 {
                let msg = "write exceeds 32 MiB";
                drain_and_refuse(inner, sess, conn, rd, &req, payload_len, msg).await?;
                continue;
            }
            match rd.take_buf(payload_len as usize).await {
                Ok(v) => Some(v),
                Err(e) => {
                    release(conn);
                    return Err(e);
                }
            }
        } else {
            None
        };
        conn.inflight.set(conn.inflight.get() + 1);
        let (inner, sess, conn) = (inner.clone(), sess.clone(), conn.clone());
        reactor::spawn_local(async move {
            let (t0, typ, len) = (Instant::now(), req.typ, req.length);
            let ok = handle(&inner, &sess, &conn, req, payload).await;
            if let Some(i) = op_index(typ) {
                // Error replies were counted by reply_error; bytes only for served requests.
                let c = inner.stats.ops[i].local();
                shard::add(&c.count, 1);
                if ok {
                    // The range (64-bit with extended headers) within the volume.
                    shard::add(&c.bytes, len.min(inner.array.size()));
                }
                c.observe(t0.elapsed());
            }
            conn.inflight.set(conn.inflight.get() - 1);
            release(&conn);
        });
    }
}

/// Reads and drops a request's payload in bounded pieces, then refuses the request (EINVAL),
/// counted as one of its command.
async fn drain_and_refuse<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    rd: &mut Reader,
    req: &Request,
    len: u64,
    msg: &str,
) -> io::Result<()> {
    rd.skip(len as usize).await?;
    if let Some(i) = op_index(req.typ) {
        inner.stats.ops[i]
            .local()
            .count
            .fetch_add(1, Ordering::Relaxed);
    }
    reply_error(inner, sess, conn, req, Errno::Inval, msg);
    Ok(())
}

/// Runs one request: `validate` turns it into a `Command` (or its error reply), which
/// runs on the array; its reply is queued. False if the reply was an error.
async fn handle<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: Request,
    payload: Option<IoBuf>,
) -> bool {
    let err = |(e, m): (Errno, &str)| {
        reply_error(inner, sess, conn, &req, e, m);
        false
    };
    let cmd = match validate(&req, sess, inner.cfg.read_only, inner.array.size()) {
        Ok(c) => c,
        Err(e) => return err(e),
    };
    let array = &inner.array;
    let result: Result<(), ArrayError> = match cmd {
        Command::Read { off, len, df } => return read(inner, sess, conn, &req, off, len, df).await,
        Command::Write { off, fua } => {
            let data = payload.unwrap_or_else(|| buf::alloc(0));
            if fua {
                // Never held back to merge with the next write (stripe/plug.rs).
                array.write_now(off, data).await
            } else {
                array.write(off, data).await
            }
        }
        Command::Flush => array.flush().await,
        Command::Trim { off, len, .. } => in_slices(off, len, |o, n| array.trim(o, n)).await,
        Command::WriteZeroes {
            off,
            len,
            no_hole,
            fast,
            ..
        } => {
            if fast && (no_hole || !array.zero_is_fast(off, len).unwrap_or(false)) {
                return err((
                    Errno::NotSup,
                    "zeroing this range is not faster than writing",
                ));
            }
            if no_hole {
                in_slices(off, len, |o, n| array.write_zeros(o, n)).await
            } else {
                in_slices(off, len, |o, n| array.trim(o, n)).await
            }
        }
        Command::Cache => Ok(()),
        Command::BlockStatus { off, len, req_one } => {
            return answer_block_status(inner, sess, conn, &req, off, len, req_one)
        }
    };
    let result = match result {
        Ok(()) if cmd.fua() => array.flush().await,
        r => r,
    };
    match result {
        Ok(()) => {
            reply_ok(sess, conn, &req);
            true
        }
        Err(e) => err((errno_of(&e), &e.to_string())),
    }
}

/// Largest range one trim or zeroing runs on the array at once: an extended-header request
/// may cover the whole volume; in slices its memory and the time it holds its locks stay
/// what a compact request's (at most 4 GiB) were.
const ZERO_SLICE: u64 = 1 << 30;

/// Runs `op` over `off..off + len` in `ZERO_SLICE` pieces, in order, until one fails.
async fn in_slices<F, Fut>(off: u64, len: u64, op: F) -> Result<(), ArrayError>
where
    F: Fn(u64, u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), ArrayError>>,
{
    let end = off + len;
    let mut at = off;
    while at < end {
        let n = (end - at).min(ZERO_SLICE);
        op(at, n).await?;
        at += n;
    }
    Ok(())
}

/// Extents in one BLOCK_STATUS reply, at most (512 KiB of reply): a longer range is
/// answered for a prefix, as the spec allows (the client asks again from where it ends).
const MAX_STATUS_EXTENTS: usize = 1 << 16;
/// Allocation-map granules one BLOCK_STATUS looks at, at most (its work on the reactor).
const MAX_STATUS_GRANULES: u64 = 1 << 18;

/// The reply bytes a BLOCK_STATUS of `len` bytes may take (charged to the connection's
/// payload budget while it is in flight): a chunk header, the context id and 8 bytes per
/// extent; runs are whole sectors at least.
fn block_status_cost(flags: u16, len: u64, ext: bool) -> usize {
    let extents = if flags & proto::CMD_FLAG_REQ_ONE != 0 {
        1
    } else {
        len.div_ceil(512).clamp(1, MAX_STATUS_EXTENTS as u64) as usize
    };
    if ext {
        40 + 16 * extents
    } else {
        24 + 8 * extents
    }
}

/// Answers a BLOCK_STATUS (`base:allocation`): one extent per allocated or unallocated
/// run, at most one with `req_one`, at most `MAX_STATUS_EXTENTS` and `MAX_STATUS_GRANULES`
/// looked at (a reply for a prefix of the range); false if it got an error reply.
fn answer_block_status<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: &Request,
    off: u64,
    len: u64,
    req_one: bool,
) -> bool {
    use proto::*;
    let limit = if req_one { 1 } else { MAX_STATUS_EXTENTS };
    let runs = match inner
        .array
        .allocation_prefix(off, len, limit, MAX_STATUS_GRANULES)
    {
        Ok(r) => r,
        Err(e) => {
            reply_error(inner, sess, conn, req, errno_of(&e), &e.to_string());
            return false;
        }
    };
    // Runs lie within the request's range: below 2^32 bytes without extended headers.
    let ext: Vec<(u64, u32)> = runs
        .iter()
        .map(|r| {
            let flags = if r.allocated {
                0
            } else {
                STATE_HOLE | STATE_ZERO
            };
            (r.len, flags)
        })
        .collect();
    conn.send(vec![OutPart::Bytes(block_status(
        REPLY_FLAG_DONE,
        &ReplyTo::of(req, sess.extended),
        META_ID,
        &ext,
    ))]);
    true
}

/// Answers a READ of `len` bytes at `off` (`df`: in one chunk); false if it got an error
/// reply.
async fn read<D: BlockDev>(
    inner: &Inner<D>,
    sess: &Session,
    conn: &Rc<Conn>,
    req: &Request,
    off: u64,
    len: u64,
    df: bool,
) -> bool {
    use proto::*;
    let array = &inner.array;
    let to = ReplyTo::of(req, sess.extended);
    if !sess.structured {
        return match array.read(off, len).await {
            Ok(seg) => {
                let mut parts = Vec::with_capacity(seg.parts.len() + 1);
                parts.push(OutPart::Bytes(simple_reply(0, req.handle).to_vec()));
                parts.extend(seg.parts.into_iter().map(|(b, r)| OutPart::Shared(b, r)));
                conn.send(parts);
                true
            }
            Err(e) => {
                reply_error(inner, sess, conn, req, errno_of(&e), &e.to_string());
                false
            }
        };
    }
    if len == 0 {
        conn.send(vec![OutPart::Bytes(done_chunk(&to))]);
        return true;
    }
    let pieces = if df {
        array
            .read(off, len)
            .await
            .map(|data| vec![ReadPiece::Data { off, data }])
    } else {
        array.read_sparse(off, len).await
    };
    let pieces = match pieces {
        Ok(p) => p,
        Err(e) => {
            reply_error(inner, sess, conn, req, errno_of(&e), &e.to_string());
            return false;
        }
    };
    let n = pieces.len();
    let mut parts = Vec::new();
    for (i, p) in pieces.into_iter().enumerate() {
        let flags = if i + 1 == n { REPLY_FLAG_DONE } else { 0 };
        match p {
            ReadPiece::Data { off, data } => {
                parts.push(OutPart::Bytes(offset_data_header(
                    flags,
                    &to,
                    off,
                    data.len() as u32,
                )));
                parts.extend(data.parts.into_iter().map(|(b, r)| OutPart::Shared(b, r)));
            }
            ReadPiece::Hole { off, len } => {
                parts.push(OutPart::Bytes(offset_hole(flags, &to, off, len as u32)));
            }
        }
    }
    conn.send(parts);
    true
}
