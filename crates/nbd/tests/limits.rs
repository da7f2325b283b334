//! One connection's memory is bounded: a client that pipelines large writes while the array
//! is slow, or large reads without reading the replies, stops being read once the
//! connection's payload budget or reply queue is full, and everything completes correctly
//! once the array catches up and the client reads.

mod common;

use common::{block, Fixture};
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;
use uraid_nbd::proto::{CMD_DISC, CMD_READ, CMD_WRITE};
use uraid_nbd::server::{DEFAULT_MAX_PAYLOAD_IN_FLIGHT, DEFAULT_MAX_REPLY_QUEUE};
use uraid_nbd::Config;
use uraid_testkit::nbd::{header, Client};

const MIB: usize = 1 << 20;
const BUDGET: usize = 4 * MIB;
const REPLY_QUEUE: usize = 2 * MIB;
/// Requests per phase, 1 MiB each: eight times the payload budget.
const N: u64 = 32;

#[test]
fn default_limits() {
    let cfg = Config::default();
    assert_eq!(cfg.max_payload_in_flight, DEFAULT_MAX_PAYLOAD_IN_FLIGHT);
    assert_eq!(cfg.max_payload_in_flight, 64 * MIB);
    assert_eq!(cfg.max_reply_queue, DEFAULT_MAX_REPLY_QUEUE);
    assert_eq!(cfg.max_reply_queue, 32 * MIB);
}

#[test]
fn pipelined_large_requests_stay_within_the_connection_budget() {
    let f = Fixture::start(
        "limits",
        16,
        Config {
            max_payload_in_flight: BUDGET,
            max_reply_queue: REPLY_QUEUE,
            ..Config::default()
        },
    );
    let stats = f.server().stats();
    let mut c = Client::connect(&f.sock);
    c.go();

    // Writes: the members hold every operation, so nothing completes; the client sends all
    // 32 MiB of writes without reading a reply (from another thread: the socket stops
    // taking bytes once the server stops reading).
    for fl in &f.faults {
        fl.hold();
    }
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            let mut v = header(0, CMD_WRITE, i, i * MIB as u64, MIB as u32);
            v.extend_from_slice(&block(i, MIB));
            w.write_all(&v).unwrap();
        }
    });
    let taken = f.wait_stalled(Duration::from_millis(500));
    let high = stats.payload_high_water.load(Ordering::SeqCst) as usize;
    assert_eq!(
        high, BUDGET,
        "write payload held by the connection: {high} bytes (budget {BUDGET})"
    );
    assert!(
        taken <= (BUDGET / MIB) as u64 + 1,
        "{taken} requests taken off the socket with the budget full"
    );
    for fl in &f.faults {
        fl.release();
    }
    let mut done: Vec<u64> = (0..N)
        .map(|_| c.simple())
        .map(|(e, h)| {
            assert_eq!(e, 0, "write {h}");
            h
        })
        .collect();
    done.sort();
    assert_eq!(done, (0..N).collect::<Vec<_>>());
    writer.join().unwrap();
    assert_eq!(
        stats.payload_high_water.load(Ordering::SeqCst) as usize,
        BUDGET
    );

    // Reads: the client asks for 32 MiB and reads no reply until the server stops taking
    // requests; then the replies must all arrive, with the data written above.
    for i in 0..N {
        c.request(0, CMD_READ, 100 + i, i * MIB as u64, MIB as u32, &[]);
    }
    let taken = f.wait_stalled(Duration::from_millis(500)) - N;
    let queued = stats.reply_queue_high_water.load(Ordering::SeqCst) as usize;
    assert!(
        queued <= REPLY_QUEUE + BUDGET + 64 * 1024,
        "replies queued on the connection: {queued} bytes (bound {REPLY_QUEUE} + budget {BUDGET})"
    );
    assert!(
        taken < N,
        "all {taken} reads were taken with the reply queue full"
    );
    let mut seen = vec![false; N as usize];
    for _ in 0..N {
        let (e, h) = c.simple();
        assert_eq!(e, 0, "read {h}");
        let i = h.checked_sub(100).expect("a read handle");
        let mut d = vec![0u8; MIB];
        c.s.read_exact(&mut d).unwrap();
        assert!(d == block(i, MIB), "read {i} returned other bytes");
        seen[i as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
    assert!(stats.payload_high_water.load(Ordering::SeqCst) as usize <= BUDGET);
    c.request(0, CMD_DISC, 999, 0, 0, &[]);
    assert!(c.closed());
    f.stop_within(Duration::from_secs(10));
}

/// BLOCK_STATUS is charged to the connection's budget and its reply and work are capped: a
/// client that pipelines thousands of whole-volume BLOCK_STATUS requests over an
/// alternating allocated/hole volume and reads no reply stops being read once the reply
/// queue is full (the server's memory for it stays within the reply queue plus the payload
/// budget); then every reply arrives, right. Malformed ones get their error; the run list
/// behind a reply is capped in runs and granules (a reply for a prefix of the range).
#[test]
fn block_status_requests_stay_within_the_connection_budget() {
    use uraid_nbd::proto::{
        CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, OPT_SET_META_CONTEXT, OPT_STRUCTURED_REPLY,
        REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, REP_ACK, REP_META_CONTEXT,
    };
    let f = Fixture::start(
        "limits-bs",
        16,
        Config {
            max_payload_in_flight: BUDGET,
            max_reply_queue: REPLY_QUEUE,
            ..Config::default()
        },
    );
    let stats = f.server().stats();
    let (size, gr) = (f.array.size(), f.array.granule());
    let granules = size / gr;
    // Every other granule allocated.
    let rt = f.rt.as_ref().unwrap().handle();
    for g in (0..granules).step_by(2) {
        let a = f.array.clone();
        rt.block_on(
            0,
            move || async move { a.write(g * gr, vec![1u8; 512]).await },
        )
        .unwrap();
    }
    // The run list is capped in runs and in granules looked at.
    assert_eq!(
        f.array
            .allocation_prefix(0, size, 3, u64::MAX)
            .unwrap()
            .len(),
        3
    );
    let p = f.array.allocation_prefix(0, size, usize::MAX, 5).unwrap();
    assert_eq!(p.iter().map(|r| r.len).sum::<u64>(), 5 * gr, "{p:?}");

    let mut c = Client::connect(&f.sock);
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply().0, REP_ACK);
    let q = b"base:allocation";
    let mut d = 3u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"vol");
    d.extend_from_slice(&1u32.to_be_bytes());
    d.extend_from_slice(&(q.len() as u32).to_be_bytes());
    d.extend_from_slice(q);
    c.option(OPT_SET_META_CONTEXT, &d);
    let (typ, ctx) = c.opt_reply();
    assert_eq!(typ, REP_META_CONTEXT);
    let id = u32::from_be_bytes(ctx[..4].try_into().unwrap());
    assert_eq!(c.opt_reply().0, REP_ACK);
    c.go();

    // Malformed and huge ones: zero length, past the end, a 4 GiB range.
    c.request(0, CMD_BLOCK_STATUS, 1, 0, 0, &[]);
    c.request(0, CMD_BLOCK_STATUS, 2, size, 512, &[]);
    c.request(0, CMD_BLOCK_STATUS, 3, 0, u32::MAX, &[]);
    for h in 1..=3 {
        let (e, got) = c.error_chunk();
        assert_eq!(got, h);
        assert_eq!(e, 22, "EINVAL for malformed block status {h}");
    }
    // REQ_ONE: one extent.
    c.request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 4, 0, size as u32, &[]);
    let (_, typ, _, p) = c.chunk();
    assert_eq!(typ, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(p.len(), 4 + 8, "one extent with REQ_ONE");

    // Thousands of whole-volume requests, no reply read.
    const M: u64 = 4000;
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..M {
            w.write_all(&header(0, CMD_BLOCK_STATUS, 100 + i, 0, size as u32))
                .unwrap();
        }
    });
    let taken = f.wait_stalled(Duration::from_millis(500));
    let queued = stats.reply_queue_high_water.load(Ordering::SeqCst) as usize;
    let payload = stats.payload_high_water.load(Ordering::SeqCst) as usize;
    eprintln!("{taken} requests taken, replies queued {queued} bytes, budget in use {payload}");
    assert!(
        payload <= BUDGET,
        "block status held {payload} bytes of budget"
    );
    assert!(
        payload >= 8 * granules as usize,
        "block status is not charged to the budget"
    );
    assert!(
        queued <= REPLY_QUEUE + BUDGET + 64 * 1024,
        "replies queued on the connection: {queued} bytes"
    );
    assert!(
        taken < M,
        "all {taken} requests were taken with the reply queue full"
    );
    for _ in 0..M {
        let (flags, typ, h, p) = c.chunk();
        assert_eq!(flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
        assert_eq!(typ, REPLY_TYPE_BLOCK_STATUS, "reply {h}");
        assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), id);
        let ext: Vec<(u32, u32)> = p[4..]
            .chunks(8)
            .map(|e| {
                (
                    u32::from_be_bytes(e[..4].try_into().unwrap()),
                    u32::from_be_bytes(e[4..].try_into().unwrap()),
                )
            })
            .collect();
        assert_eq!(ext.len() as u64, granules, "reply {h}");
        for (i, &(len, fl)) in ext.iter().enumerate() {
            assert_eq!(len as u64, gr, "reply {h} extent {i}");
            assert_eq!(fl == 0, i % 2 == 0, "reply {h} extent {i}: flags {fl}");
        }
    }
    writer.join().unwrap();
    c.request(0, CMD_DISC, 999, 0, 0, &[]);
    assert!(c.closed());
    f.stop_within(Duration::from_secs(10));
}
