//! The supervisor (supervisor.rs): it owns the walks' threads, steers a running scrub
//! (pause, resume, cancel), refuses what cannot be done with a typed refusal whose message is
//! the operator's, and `stop` joins everything and lets nothing start afterwards. The walk
//! driver's guard: a walk that ends (here, cancelled) is no longer "running".

use futures::executor::block_on;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::Level;
use uraid_engine::supervisor::{ResyncStart, ScrubCommand};
use uraid_engine::{RefusalKind, ScrubMode, Supervisor, Throttle, Volume};
use uraid_sim::{mem_array, payload, MemDev};

const CHUNK: u64 = 16384;

/// A RAID5 volume written end to end.
fn written() -> Arc<Volume<MemDev>> {
    let (vol, _) = mem_array(Level::Raid5, 4, CHUNK, 64 * CHUNK, None);
    block_on(vol.write(0, payload(7, vol.size() as usize))).unwrap();
    vol
}

/// Waits until `f` holds (at most 10 s).
fn wait_for(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_scrub_is_paused_resumed_and_cancelled_on_its_own_thread() {
    let vol = written();
    // A crawl: after its first batch the walk waits (in slices that notice a stop).
    vol.array().set_throttle(Throttle {
        max_bytes_per_second: 1,
        ..Throttle::UNLIMITED
    });
    let sup = Arc::new(Supervisor::new(vol.clone(), false));
    assert_eq!(sup.start_resync().unwrap(), ResyncStart::NotNeeded);
    assert!(!sup.ensure_rebuild(), "nothing to rebuild");
    assert_eq!(
        sup.start_scrub(ScrubMode::Check).unwrap(),
        "scrub (check) started"
    );
    let again = sup.start_scrub(ScrubMode::Check).unwrap_err();
    assert_eq!(again.kind, RefusalKind::Conflict);
    assert_eq!(
        again.to_string(),
        "a scrub is running: pause, resume or cancel it, or wait for it"
    );
    assert_eq!(
        sup.scrub_command(ScrubCommand::Pause).unwrap(),
        "scrub pause: done"
    );
    assert!(vol.array().scrub_state().3, "paused");
    sup.scrub_command(ScrubCommand::Resume).unwrap();
    assert!(!vol.array().scrub_state().3, "resumed");
    wait_for("the scrub runs", || vol.array().scrub_state().2.running);
    assert_eq!(
        sup.scrub_command(ScrubCommand::Cancel).unwrap(),
        "scrub cancel: done"
    );
    wait_for("the scrub ends", || !vol.array().scrub_state().2.running);
    let v = vol.array().scrub_state().2;
    assert!(v.done < v.total, "cancelled before the end: {v:?}");
    // Once its thread is finished, no scrub runs.
    wait_for("no scrub is running", || {
        sup.scrub_command(ScrubCommand::Resume)
            .is_err_and(|r| r.to_string() == "no scrub is running")
    });
    sup.stop();
    let r = sup.start_scrub(ScrubMode::Check).unwrap_err();
    assert_eq!(
        (r.kind, r.message.as_str()),
        (RefusalKind::Stopping, "the server is stopping")
    );
}

#[test]
fn stop_ends_a_running_scrub_and_waits_for_it() {
    let vol = written();
    vol.array().set_throttle(Throttle {
        max_bytes_per_second: 1,
        ..Throttle::UNLIMITED
    });
    let sup = Arc::new(Supervisor::new(vol.clone(), false));
    sup.start_scrub(ScrubMode::Repair).unwrap();
    wait_for("the scrub runs", || vol.array().scrub_state().2.running);
    sup.scrub_command(ScrubCommand::Pause).unwrap();
    // A paused scrub is stopped too (its pause is lifted), and joined.
    sup.stop();
    assert!(!vol.array().scrub_state().2.running, "joined: not running");
}

#[test]
fn refusals_carry_the_operators_messages() {
    let vol = written();
    let ro = Arc::new(Supervisor::new(vol.clone(), true));
    for (r, msg) in [
        (
            ro.start_scrub(ScrubMode::Repair),
            "the server is read-only: a scrub writes (it rewrites what it cannot read)",
        ),
        (
            ro.fail(1, false),
            "the server is read-only: failing a member writes",
        ),
        (ro.replace_cancel(), "no replace is running"),
    ] {
        let r = r.unwrap_err();
        assert_eq!(
            (r.kind, r.to_string().as_str()),
            (RefusalKind::Conflict, msg)
        );
    }
    let sup = Arc::new(Supervisor::new(vol.clone(), false));
    assert_eq!(sup.fail(1, true).unwrap(), "member 1 marked failed");
    let r = sup.fail(1, true).unwrap_err();
    assert_eq!(
        (r.kind, r.message.as_str()),
        (
            RefusalKind::Conflict,
            "member 1 is already failed or missing"
        )
    );
    let r = sup.start_scrub(ScrubMode::Check).unwrap_err();
    assert_eq!(r.kind, RefusalKind::Conflict);
    assert!(
        r.message.starts_with("the array is degraded (member(s) ")
            && r.message.ends_with("scrub needs every member"),
        "{r}"
    );
    assert!(
        !vol.array().scrub_state().2.running,
        "a refused scrub never ran"
    );
    sup.stop();
    ro.stop();
}

/// After `stop` nothing starts: a resync owed by an unclean stop and the bitmap daemon are
/// refused (their threads would never be joined), and the array is left as it was.
#[test]
fn nothing_starts_after_stop() {
    let (mut images, _) = uraid_sim::written_whole(Level::Raid5, 4, CHUNK, 64, 7);
    uraid_sim::make_dirty(&mut images);
    let vol = uraid_sim::crash::reassemble(&images, &[true; 4]).unwrap();
    assert!(vol.array().needs_resync());
    let sup = Arc::new(Supervisor::new(vol.clone(), false));
    sup.stop();
    assert_eq!(sup.start_resync().unwrap(), ResyncStart::NotNeeded);
    assert!(!sup.start_bitmap_daemon(None).unwrap());
    assert!(!vol.array().recovery_progress().running);
    assert!(vol.array().needs_resync(), "no resync ran");
}
