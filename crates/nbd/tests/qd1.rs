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
