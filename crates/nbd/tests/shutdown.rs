//! Shutdown is bounded: idle clients (in the handshake or after it) are closed at once, and a
//! client that stops reading its replies is cut off after the grace period, after which the
//! array is closed cleanly.

mod common;

use common::Fixture;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use uraid_nbd::proto::CMD_READ;
use uraid_nbd::Config;
use uraid_testkit::nbd::Client;

#[test]
fn shutdown_closes_idle_clients_and_cuts_off_one_that_does_not_read() {
    let f = Fixture::start(
        "shutdown",
        4,
        Config {
            shutdown_grace: Duration::from_millis(500),
            ..Config::default()
        },
    );
    // Connected, greeting read, nothing sent.
    let mut quiet = UnixStream::connect(&f.sock).unwrap();
    quiet
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut g = [0u8; 18];
    quiet.read_exact(&mut g).unwrap();
    // Through the handshake, then idle.
    let mut idle = Client::connect(&f.sock);
    idle.go();
    // Asks for 8 MiB and reads none of it: the server's send stays blocked on a full socket.
    let mut deaf = Client::connect(&f.sock);
    deaf.go();
    for i in 0..8u64 {
        deaf.request(0, CMD_READ, i, i << 20, 1 << 20, &[]);
    }
    let stats = f.server().stats();
    f.wait_for("the reads to be answered", Duration::from_secs(10), |_| {
        stats
            .reply_queue_high_water
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 4 << 20
    });

    let t = Instant::now();
    f.stop_within(Duration::from_secs(10));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "the non-reading client was given the grace period ({took:?})"
    );
    let mut b = [0u8; 1];
    assert!(matches!(quiet.read(&mut b), Ok(0)), "quiet client closed");
    assert!(idle.closed(), "idle client closed");
    // The deaf client gets some reply bytes, then the end of the stream (or a reset).
    let mut sink = Vec::new();
    let _ = deaf.s.read_to_end(&mut sink);
    assert!(
        sink.len() < 8 * ((1 << 20) + 16),
        "the server stopped sending"
    );
}
