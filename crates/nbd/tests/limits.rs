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
