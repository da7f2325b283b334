//! At queue depth 1 a request costs the server one io_uring_enter: the reactor runs every
//! task that can run (parse, serve, reply) before it enters the ring, the reply goes out
//! inline when the socket has room, and the one enter submits the next receive and sleeps
//! until it completes. Each extra enter is a sleep/wake-up pair on the request's latency.

mod common;

use common::{block, Fixture};
use std::io::{Read, Write};
use std::time::Duration;
use uraid_nbd::proto::{CMD_READ, CMD_WRITE};
use uraid_nbd::Config;
use uraid_testkit::nbd::{header, Client};

const BS: usize = 4096;
const N: u64 = 200;

#[test]
fn a_request_at_queue_depth_one_costs_one_ring_enter() {
    let f = Fixture::start("qd1", 16, Config::default());
    let rt = f.rt.as_ref().expect("runtime").handle();
    let mut c = Client::connect(&f.sock);
    c.go();
    // Warm up (first touches of the members, task slabs growing).
    c.request(0, CMD_READ, 0, 0, BS as u32, &[]);
    let mut data = vec![0u8; BS];
    assert_eq!(c.simple(), (0, 0));
    c.s.read_exact(&mut data).unwrap();

    let before = rt.ring_enters();
    for i in 0..N {
        // Header and payload in one send, as a client with the whole request at hand does.
        let mut msg = header(0, CMD_WRITE, i, i * BS as u64, BS as u32);
        msg.extend_from_slice(&block(i, BS));
        c.s.write_all(&msg).unwrap();
        assert_eq!(c.simple(), (0, i));
        c.request(0, CMD_READ, N + i, i * BS as u64, BS as u32, &[]);
        assert_eq!(c.simple(), (0, N + i));
        c.s.read_exact(&mut data).unwrap();
        assert!(data == block(i, BS), "block {i} read back wrong");
    }
    let enters = rt.ring_enters() - before;
    let requests = 2 * N;
    println!("{enters} io_uring_enter calls for {requests} requests at queue depth 1");
    // A little slack for a wake-up that lands between a reply and the next request.
    assert!(
        enters <= requests + requests / 20,
        "{enters} io_uring_enter calls for {requests} requests at queue depth 1 (want about one each)"
    );
    drop(c);
    f.stop_within(Duration::from_secs(20));
}

/// With a busy-poll budget the reactor spins for the next request instead of sleeping while
/// requests arrive back to back (a wake-up saved per request), still at about one enter per
/// request and with every read right; once the client goes quiet it sleeps again rather
/// than spinning through idle turns.
#[test]
fn busy_poll_catches_back_to_back_requests_and_stops_when_idle() {
    let f = Fixture::start("busypoll", 16, Config::default());
    let rt = f.rt.as_ref().expect("runtime").handle();
    // Generous budget so that a loaded test machine still sees requests inside it.
    rt.set_busy_poll(Duration::from_millis(2));
    let mut c = Client::connect(&f.sock);
    c.go();
    let mut data = vec![0u8; BS];
    let before = (rt.ring_enters(), rt.idle_turns());
    for i in 0..N {
        let mut msg = header(0, CMD_WRITE, i, i * BS as u64, BS as u32);
        msg.extend_from_slice(&block(i + 7, BS));
        c.s.write_all(&msg).unwrap();
        assert_eq!(c.simple(), (0, i));
        c.request(0, CMD_READ, N + i, i * BS as u64, BS as u32, &[]);
        assert_eq!(c.simple(), (0, N + i));
        c.s.read_exact(&mut data).unwrap();
        assert!(data == block(i + 7, BS), "block {i} read back wrong");
    }
    let (enters, (polled, slept)) = (rt.ring_enters(), rt.idle_turns());
    let (enters, polled, slept) = (enters - before.0, polled - before.1 .0, slept - before.1 .1);
    let requests = 2 * N;
    println!("{requests} requests: {enters} enters, {polled} idle turns polled, {slept} slept");
    assert!(
        polled > 0,
        "busy-poll never found the next request ({slept} sleeps)"
    );
    // An idle turn that polled successfully costs one enter (handing over the reply and the
    // next receive); one that slept, at most two (the poll's submit, then the wait).
    assert!(
        enters <= polled + 2 * slept + requests / 20,
        "{enters} io_uring_enter calls for {requests} requests ({polled} polled, {slept} slept)"
    );
    // Idle: after at most a couple of polls that run out, the reactor sleeps until woken,
    // neither turning through idle polls nor entering the ring over and over.
    std::thread::sleep(Duration::from_millis(50));
    let (idle0, enters0) = (rt.idle_turns(), rt.ring_enters());
    std::thread::sleep(Duration::from_millis(300));
    let (idle1, enters1) = (rt.idle_turns(), rt.ring_enters());
    assert!(
        idle1.0 - idle0.0 + idle1.1 - idle0.1 <= 4 && enters1 - enters0 <= 4,
        "an idle reactor kept turning: idle turns {idle0:?} -> {idle1:?}, enters {enters0} -> {enters1}"
    );
    drop(c);
    f.stop_within(Duration::from_secs(20));
}

/// The rest of a large write payload is received as a bulk transfer: the reactor sleeps
/// between its segments instead of busy-polling for them (the client streams at its own
/// pace and nothing is answered before the last byte, so a spin would save a wake-up per
/// segment of one request and burn a core between them).
#[test]
fn a_write_payload_arriving_in_pieces_is_not_busy_polled_for() {
    const LEN: usize = 4 << 20;
    const PIECE: usize = 16 << 10;
    let f = Fixture::start("bulkpoll", 16, Config::default());
    let rt = f.rt.as_ref().expect("runtime").handle();
    // A budget far above the gaps between pieces: without the rule every piece is polled for.
    rt.set_busy_poll(Duration::from_millis(2));
    let mut c = Client::connect(&f.sock);
    c.go();
    let payload = block(99, LEN);
    let before = rt.idle_turns();
    c.s.write_all(&header(0, CMD_WRITE, 1, 0, LEN as u32))
        .unwrap();
    for p in payload.chunks(PIECE) {
        c.s.write_all(p).unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(c.simple(), (0, 1));
    let after = rt.idle_turns();
    let (polled, slept) = (after.0 - before.0, after.1 - before.1);
    let pieces = (LEN / PIECE) as u64;
    println!("{pieces} pieces of one write: {polled} idle turns polled, {slept} slept");
    // Polls at the ends only (the header's turn, a poll that finds the first piece and so
    // stops polling); none between the pieces.
    assert!(
        polled <= 2,
        "the reactor busy-polled {polled} times for one write's payload ({slept} sleeps)"
    );
    assert!(
        slept >= pieces / 8,
        "only {slept} idle turns for {pieces} pieces sent apart: the test did not see the gaps"
    );
    c.request(0, CMD_READ, 2, 0, LEN as u32, &[]);
    assert_eq!(c.simple(), (0, 2));
    let mut back = vec![0u8; LEN];
    c.s.read_exact(&mut back).unwrap();
    assert!(back == payload, "the write read back wrong");
    drop(c);
    f.stop_within(Duration::from_secs(20));
}
