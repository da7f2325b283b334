//! Hung members and host stalls (members.rs, the I/O watchdog), on in-memory members whose
//! I/O can be made to hang, with the array on reactors as the server runs it:
//! * a background walk (scrub, rebuild, resync) that meets a hung member times it out: the
//!   member is failed, the walk goes on (the level has redundancy left), its stripe locks are
//!   released, and stopping the supervisor takes at most about one timeout;
//! * a host stall (every member's I/O waits past the timeout at once, more members than the
//!   level tolerates) fails no member: the I/O waits and completes when the stall ends;
//!   timeouts on no more members than the level tolerates still fail them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::{Level, MemberSet};
use uraid_engine::buf::WriteBuf;
use uraid_engine::{ArrayOptions, ErrorPolicy, Runtime, ScrubMode, Supervisor, Throttle, Volume};
use uraid_sim::crash::reassemble_on;
use uraid_sim::{
    add_member_images, make_dirty, mem_array_with, payload, sim_options, written_images, MemDev,
};

const CHUNK: u64 = 4096;
const ROWS: u64 = 32;
const TIMEOUT: Duration = Duration::from_millis(200);

fn opts() -> ArrayOptions {
    ArrayOptions {
        policy: ErrorPolicy {
            io_timeout: Some(TIMEOUT),
            ..ErrorPolicy::default()
        },
        ..sim_options()
    }
}

/// Runs `f` on a thread and returns its result, failing the test if it takes longer than
/// `limit` (a hang without a timeout fails instead of hanging the test).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: not finished within {limit:?}"))
}

fn read_all(rt: &Runtime, vol: &Arc<Volume<MemDev>>) -> Vec<u8> {
    let v = vol.clone();
    rt.handle()
        .block_on(0, move || async move {
            v.read(0, v.size()).await.map(|s| s.to_vec())
        })
        .expect("read")
}

fn write(rt: &Runtime, vol: &Arc<Volume<MemDev>>, off: u64, data: WriteBuf) {
    let v = vol.clone();
    rt.handle()
        .block_on(0, move || async move { v.write(off, data).await })
        .expect("write")
}

fn hang(vol: &Volume<MemDev>, m: usize, on: bool) {
    vol.array()
        .member_dev(m)
        .expect("present")
        .faults
        .hang
        .store(on, Ordering::SeqCst);
}

/// A RAID6 of 6 on reactors written end to end, with its model.
fn written_raid6(rt: &Runtime, images: Option<Vec<Vec<u8>>>) -> Arc<Volume<MemDev>> {
    let images = images.unwrap_or_else(|| written_images(Level::Raid6, 6, CHUNK, ROWS, 40, 3).0);
    reassemble_on(
        &images,
        &[true; 6],
        None,
        Some(rt.handle()),
        opts(),
        |i, img| MemDev::from_image(format!("mem{i}"), img),
    )
    .expect("reassembles")
}

/// Scrub, rebuild and resync each meet a member that stops answering: it is failed after
/// the timeout, the walk goes on to its end (RAID6 has redundancy left), every byte reads
/// back (scrub, rebuild; a resync left degraded leaves its stripes to a rebuild), and a
/// write into the stripes the walk held completes (their locks were released).
#[test]
fn walks_time_out_a_hung_member_and_go_on() {
    let rt = Runtime::new(2, 256, true).unwrap();

    // Scrub: member 3 hangs.
    let (images, model) = written_images(Level::Raid6, 6, CHUNK, ROWS, 40, 3);
    let vol = written_raid6(&rt, Some(images.clone()));
    hang(&vol, 3, true);
    let v = vol.clone();
    let t = Instant::now();
    let r = within(
        "scrub with a hung member",
        Duration::from_secs(20),
        move || {
            let stop = AtomicBool::new(false);
            futures::executor::block_on(v.array().scrub_run(ScrubMode::Check, &stop))
        },
    );
    assert!(vol.array().is_failed(3), "hung member not failed: {r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(read_all(&rt, &vol) == model.bytes, "scrub: wrong data");
    write(&rt, &vol, 0, payload(11, 4 * CHUNK as usize));
    drop(vol);

    // Rebuild of member 2: member 4 (a source) hangs; the rebuild finishes from the rest.
    let mut added = images.clone();
    add_member_images(&mut added, 2, 0xEE);
    let vol = written_raid6(&rt, Some(added));
    hang(&vol, 4, true);
    let v = vol.clone();
    let r = within(
        "rebuild with a hung member",
        Duration::from_secs(20),
        move || {
            let stop = AtomicBool::new(false);
            futures::executor::block_on(v.array().rebuild(&stop))
        },
    )
    .expect("the rebuild goes on without the hung member");
    assert_eq!(r.finished, MemberSet::EMPTY.with(2));
    assert!(vol.array().is_failed(4) && !vol.array().is_failed(2));
    assert!(read_all(&rt, &vol) == model.bytes, "rebuild: wrong data");
    write(&rt, &vol, 0, payload(12, 4 * CHUNK as usize));
    drop(vol);

    // Resync after an unclean stop: member 1 hangs.
    let mut dirty = images.clone();
    make_dirty(&mut dirty);
    let vol = written_raid6(&rt, Some(dirty));
    assert!(vol.array().needs_resync());
    hang(&vol, 1, true);
    let v = vol.clone();
    let r = within(
        "resync with a hung member",
        Duration::from_secs(20),
        move || {
            let stop = AtomicBool::new(false);
            futures::executor::block_on(v.array().resync(&stop))
        },
    )
    .expect("the resync goes on without the hung member");
    // Degraded now: the stripes left are the rebuild's to resync (deferred), not verified.
    assert!(vol.array().is_failed(1), "{r:?}");
    assert_eq!(
        r.stripes + r.deferred + r.skipped + r.unreadable,
        ROWS,
        "{r:?}"
    );
    write(&rt, &vol, 0, payload(13, 4 * CHUNK as usize));
}

/// The server's stop joins the walks: with a scrub and a rebuild waiting on a member that
/// stopped answering, `Supervisor::stop` returns within about one timeout (the member is
/// failed; nothing waits for its I/O).
#[test]
fn stopping_with_a_hung_member_takes_about_one_timeout() {
    let rt = Runtime::new(2, 256, true).unwrap();
    for rebuild in [false, true] {
        let (mut images, model) = written_images(Level::Raid6, 6, CHUNK, ROWS, 40, 5);
        if rebuild {
            add_member_images(&mut images, 0, 0xEE);
        }
        let vol = written_raid6(&rt, Some(images));
        // Slow walks, so that the stop finds them running.
        vol.array().set_throttle(Throttle {
            max_bytes_per_second: 64 << 10,
            ..Throttle::UNLIMITED
        });
        let sup = Arc::new(Supervisor::new(vol.clone(), false));
        if rebuild {
            assert!(sup.ensure_rebuild());
        } else {
            sup.start_scrub(ScrubMode::Check).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        hang(&vol, 5, true);
        std::thread::sleep(TIMEOUT / 4);
        let t = Instant::now();
        let s = sup.clone();
        within(
            "stop with a hung member",
            Duration::from_secs(20),
            move || s.stop(),
        );
        let took = t.elapsed();
        assert!(
            took < TIMEOUT + Duration::from_secs(2),
            "stop took {took:?} (rebuild {rebuild})"
        );
        hang(&vol, 5, false);
        assert!(read_all(&rt, &vol) == model.bytes, "rebuild {rebuild}");
    }
}

/// A host stall: every member's I/O waits five timeouts, then answers. No member is failed
/// (failing them would exceed what RAID6 tolerates), the writes waiting on them complete and
/// read back. A hang on one member is still a dead member: it is failed, as are two at once
/// (within the tolerance).
#[test]
fn a_host_stall_fails_no_member_and_every_write_completes() {
    let rt = Runtime::new(2, 256, true).unwrap();
    let (vol, faults) = mem_array_with(
        Level::Raid6,
        6,
        CHUNK,
        ROWS * CHUNK,
        Some(rt.handle()),
        opts(),
    );
    let size = vol.size() as usize;
    write(&rt, &vol, 0, payload(1, size));
    for f in &faults {
        f.hang.store(true, Ordering::SeqCst);
    }
    let data = payload(2, size);
    let (v, d, h) = (vol.clone(), data.clone(), rt.handle());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(h.block_on(0, move || async move { v.write(0, d).await }));
    });
    std::thread::sleep(5 * TIMEOUT);
    assert!(rx.try_recv().is_err(), "a write completed during the stall");
    assert_eq!(
        vol.array().failed(),
        MemberSet::EMPTY,
        "members failed by a stall"
    );
    for f in &faults {
        f.hang.store(false, Ordering::SeqCst);
    }
    rx.recv_timeout(Duration::from_secs(10))
        .expect("writes still waiting after the stall")
        .expect("write after the stall");
    assert_eq!(
        vol.array().failed(),
        MemberSet::EMPTY,
        "members failed by a stall"
    );
    assert!(
        read_all(&rt, &vol)[..] == data[..],
        "wrong data after a stall"
    );

    // One member hangs: failed after the timeout, the write completes without it.
    faults[2].hang.store(true, Ordering::SeqCst);
    let more = payload(3, size);
    let (v, d) = (vol.clone(), more.clone());
    let h = rt.handle();
    within(
        "a write with one member hung",
        Duration::from_secs(20),
        move || h.block_on(0, move || async move { v.write(0, d).await }),
    )
    .expect("write with a hung member");
    assert_eq!(vol.array().failed(), MemberSet::EMPTY.with(2));
    assert!(read_all(&rt, &vol)[..] == more[..]);

    // Two at once on a fresh RAID6: within the tolerance, both failed.
    let (vol, faults) = mem_array_with(
        Level::Raid6,
        6,
        CHUNK,
        ROWS * CHUNK,
        Some(rt.handle()),
        opts(),
    );
    write(&rt, &vol, 0, payload(4, size));
    faults[0].hang.store(true, Ordering::SeqCst);
    faults[3].hang.store(true, Ordering::SeqCst);
    let (v, d) = (vol.clone(), payload(5, size));
    let h = rt.handle();
    within(
        "a write with two members hung",
        Duration::from_secs(20),
        move || h.block_on(0, move || async move { v.write(0, d).await }),
    )
    .expect("write with two hung members");
    assert_eq!(vol.array().failed(), MemberSet::EMPTY.with(0).with(3));
    assert!(read_all(&rt, &vol)[..] == payload(5, size)[..]);
}

/// A member read dropped before it answered (a hedged read keeps the first answers it needs
/// and drops the rest) leaves nothing behind for the watchdog: the member, answering again,
/// is not failed as hung one timeout later. Before, the dropped I/O's registration stayed
/// and aged, and the watchdog failed the member.
#[test]
fn a_dropped_member_read_is_not_taken_for_a_hung_one() {
    let rt = Runtime::new(1, 64, true).unwrap();
    let vol = written_raid6(&rt, None);
    let m = vol.geometry().data_member(0, 0);
    hang(&vol, m, true);
    let v = vol.clone();
    let pending = rt.handle().block_on(0, move || async move {
        let mut f = Box::pin(v.read(0, CHUNK));
        let mut pending = true;
        for _ in 0..64 {
            if futures::poll!(&mut f).is_ready() {
                pending = false;
                break;
            }
            uraid_engine::reactor::yield_now().await;
        }
        pending
    });
    assert!(pending, "the read of a hung member answered");
    hang(&vol, m, false);
    std::thread::sleep(4 * TIMEOUT);
    assert!(
        !vol.array().is_failed(m),
        "the member was failed for a read nobody waits for"
    );
    let _ = read_all(&rt, &vol);
    assert!(!vol.array().is_failed(m));
}
