//! The member error policy, the I/O timeout, and fairness of the stripe lock, with
//! injected faults on in-memory members.

use futures::executor::block_on;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::format::DATA_OFFSET;
use uraid_core::Level;
use uraid_engine::{ArrayError, ArrayOptions, ErrorPolicy};
use uraid_sim::{mem_array, mem_array_with, payload, sim_options};

const CHUNK: u64 = 4096;

/// A bad sector on a member of a degraded RAID5 used to take the whole array down (any
/// errno failed the member). Now the chunk is reconstructed from the stripe, the request
/// answered, the chunk rewritten in place, and the member stays in the array.
#[test]
fn read_error_is_reconstructed_and_rewritten() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid1, 2)] {
        let (vol, faults) = mem_array(level, members, CHUNK, 8 * CHUNK, None);
        let size = vol.size();
        let data = payload(7, size as usize);
        block_on(vol.write(0, data.clone())).unwrap();
        let g = *vol.geometry();
        // Bad sectors under volume offset 0 on the member holding it.
        let victim = if matches!(level, Level::Raid1) {
            0
        } else {
            g.data_member(0, 0)
        };
        faults[victim].bad_range(DATA_OFFSET, DATA_OFFSET + 1024);
        if level.parity() >= 2 {
            // Degraded as well, where the level allows one more loss.
            let other = (victim + 1) % members;
            faults[other].kill();
        }
        let got = block_on(vol.read(0, size)).unwrap().to_vec();
        assert!(got == data[..], "{level}: wrong data after a read error");
        assert!(
            !vol.array().is_failed(victim),
            "{level}: member failed for one bad sector"
        );
        assert!(
            vol.array().stats.snapshot().corrected_reads >= 1,
            "{level}: nothing rewritten"
        );
        // Rewritten: the sector reads directly again (the sim repairs sectors on write).
        let again = block_on(vol.read(0, 1024)).unwrap().to_vec();
        assert!(again == data[..1024]);
    }
}

/// Without redundancy the request fails with a media error, but the array keeps serving:
/// RAID0, and a degraded RAID5 (which one bad sector used to take down entirely).
#[test]
fn read_error_without_redundancy_fails_only_the_request() {
    let (vol, faults) = mem_array(Level::Raid5, 4, CHUNK, 8 * CHUNK, None);
    block_on(vol.write(0, payload(3, vol.size() as usize))).unwrap();
    let m = vol.geometry().data_member(0, 0);
    faults[(m + 1) % 4].kill();
    faults[m].bad_range(DATA_OFFSET, DATA_OFFSET + 512);
    assert!(matches!(
        block_on(vol.read(0, 512)),
        Err(ArrayError::Unreadable { .. })
    ));
    assert!(vol.is_serving() && !vol.array().is_failed(m));
    assert!(block_on(vol.read(512, 512)).is_ok());

    let (vol, faults) = mem_array(Level::Raid0, 2, CHUNK, 8 * CHUNK, None);
    block_on(vol.write(0, payload(4, vol.size() as usize))).unwrap();
    faults[0].bad_range(DATA_OFFSET, DATA_OFFSET + 512);
    assert!(matches!(
        block_on(vol.read(0, 512)),
        Err(ArrayError::Unreadable { .. })
    ));
    assert!(vol.is_serving());
    assert!(block_on(vol.read(CHUNK, 512)).is_ok());
}

/// Past the error budget the member is failed; write errors fail it at once.
#[test]
fn error_budget_and_write_errors_fail_the_member() {
    let opts = ArrayOptions {
        policy: ErrorPolicy {
            max_read_errors: 3,
            io_timeout: None,
        },
        ..sim_options()
    };
    let (vol, faults) = mem_array_with(Level::Raid5, 4, CHUNK, 8 * CHUNK, None, opts);
    let data = payload(5, vol.size() as usize);
    block_on(vol.write(0, data.clone())).unwrap();
    let m = vol.geometry().data_member(0, 0);
    for i in 0..4 {
        // A fresh bad sector each time (rewrites repair the previous one).
        faults[m].bad_range(DATA_OFFSET, DATA_OFFSET + 512);
        let got = block_on(vol.read(0, 512)).unwrap().to_vec();
        assert!(got == data[..512]);
        assert_eq!(vol.array().is_failed(m), i == 3, "after {} errors", i + 1);
    }
    let (vol, faults) = mem_array(Level::Raid6, 5, CHUNK, 8 * CHUNK, None);
    faults[2].kill_after(1);
    block_on(vol.write(0, payload(1, vol.size() as usize))).unwrap();
    assert!(vol.array().is_failed(2));
}

/// A member that stops answering is timed out and failed; the request completes from the
/// rest of the stripe.
#[test]
fn hung_member_times_out() {
    let opts = ArrayOptions {
        policy: ErrorPolicy {
            io_timeout: Some(Duration::from_millis(200)),
            ..ErrorPolicy::default()
        },
        ..sim_options()
    };
    let (vol, faults) = mem_array_with(Level::Raid6, 5, CHUNK, 8 * CHUNK, None, opts);
    let data = payload(9, vol.size() as usize);
    block_on(vol.write(0, data.clone())).unwrap();
    let m = vol.geometry().data_member(0, 0);
    faults[m].hang.store(true, Ordering::SeqCst);
    let t = Instant::now();
    // On a thread, so that a missing timeout fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let v = vol.clone();
    std::thread::spawn(move || {
        let _ = tx.send(block_on(v.read(0, v.size())).map(|s| s.to_vec()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("read on a hung member never finished: no I/O timeout")
        .unwrap();
    assert!(got == data[..]);
    assert!(vol.array().is_failed(m), "hung member not failed");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    // Writes go on without it.
    block_on(vol.write(0, payload(10, 4096))).unwrap();
}

/// A released stripe lock used to run every queued write before letting anyone else in: a
/// degraded reader waited until the writers stopped. Now a holder runs one batch and hands
/// the stripe to a waiting reader.
#[test]
fn stripe_lock_does_not_starve_degraded_readers() {
    let (vol, faults) = mem_array(Level::Raid5, 3, CHUNK, 4 * CHUNK, None);
    block_on(vol.write(0, Arc::new(vec![0x11; vol.size() as usize]))).unwrap();
    let gone = vol.geometry().data_member(0, 1);
    faults[gone].kill();
    for f in &faults {
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let done = std::cell::Cell::new(0u64);
    let total = 16 * 40;
    let reader_at = std::cell::Cell::new(None);
    let writers = (0..16u64).map(|w| {
        let (vol, done) = (vol.clone(), &done);
        async move {
            for i in 0..40u64 {
                let s = (w * 40 + i) % 8;
                vol.write(s * 512, Arc::new(vec![0x80 | w as u8; 512]))
                    .await
                    .unwrap();
                done.set(done.get() + 1);
            }
        }
    });
    let reader = async {
        for _ in 0..5 {
            uraid_engine::reactor::yield_now().await;
        }
        let got = vol.read(CHUNK, 512).await.unwrap().to_vec();
        assert!(got.iter().all(|&b| b == 0x11));
        reader_at.set(Some(done.get()));
    };
    block_on(futures::future::join(
        futures::future::join_all(writers),
        reader,
    ));
    let at = reader_at.get().unwrap();
    assert!(
        at < total / 2,
        "degraded reader finished only after {at} of {total} writes"
    );
}

/// Overlapping concurrent writes to a mirror used to be able to land in different orders on
/// the copies; now a mirror row is written under its lock and the copies always agree.
#[test]
fn mirror_copies_agree_after_overlapping_writes() {
    for (level, members) in [(Level::Raid1, 3), (Level::Raid10, 4)] {
        let (vol, faults) = mem_array(level, members, CHUNK, 4 * CHUNK, None);
        block_on(vol.write(0, Arc::new(vec![0; vol.size() as usize]))).unwrap();
        for f in &faults {
            f.yield_ops.store(true, Ordering::Relaxed);
            f.jitter.store(true, Ordering::Relaxed);
        }
        let writes = (0..24u64).map(|i| {
            let vol = vol.clone();
            async move {
                // Different yields per writer so their member writes interleave.
                for _ in 0..(i * 7 % 5) {
                    uraid_engine::reactor::yield_now().await;
                }
                vol.write(0, Arc::new(vec![i as u8 + 1; 2048]))
                    .await
                    .unwrap();
            }
        });
        block_on(futures::future::join_all(writes));
        // Every copy of chunk 0 holds the same bytes.
        let copies = vol.geometry().mirror_copies(0);
        let mut seen = Vec::new();
        for (m, base) in copies {
            let mut v = vec![0u8; 2048];
            v.copy_from_slice(
                &uraid_sim::member_bytes(&vol, m)[(DATA_OFFSET + base) as usize..][..2048],
            );
            seen.push(v);
        }
        assert!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "{level}: copies differ"
        );
    }
}

/// Requests outside the volume are refused by every entry point, the map's included.
#[test]
fn every_entry_point_validates_its_range() {
    let (vol, _) = mem_array(Level::Raid5, 3, CHUNK, 4 * CHUNK, None);
    let size = vol.size();
    for (off, len) in [
        (size, 512),
        (size - 512, 1024),
        (u64::MAX - 511, 1024),
        (0, size + 512),
    ] {
        let out = |r: Result<(), ArrayError>| matches!(r, Err(ArrayError::OutOfRange { .. }));
        assert!(
            out(vol.allocation(off, len).map(|_| ())),
            "allocation {off}+{len}"
        );
        assert!(
            out(vol.zero_is_fast(off, len).map(|_| ())),
            "zero_is_fast {off}+{len}"
        );
        assert!(
            out(block_on(vol.write_zeros(off, len))),
            "write_zeros {off}+{len}"
        );
        assert!(out(block_on(vol.trim(off, len))), "trim {off}+{len}");
        assert!(
            out(block_on(vol.read(off, len)).map(|_| ())),
            "read {off}+{len}"
        );
        assert!(
            out(block_on(
                vol.write(off, payload(1, len.min(1 << 20) as usize))
            )) || len > 1 << 20
        );
    }
    assert!(matches!(
        vol.allocation(1, 512),
        Err(ArrayError::Misaligned { .. })
    ));
}

/// The other direction: a stream of degraded readers on one stripe must not keep a writer
/// out (turns alternate between lockers and queued writes).
#[test]
fn stripe_lock_does_not_starve_writers_behind_degraded_readers() {
    let (vol, faults) = mem_array(Level::Raid5, 3, CHUNK, 4 * CHUNK, None);
    block_on(vol.write(0, Arc::new(vec![0x11; vol.size() as usize]))).unwrap();
    let gone = vol.geometry().data_member(0, 1);
    faults[gone].kill();
    for f in &faults {
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let reads = std::cell::Cell::new(0u64);
    let total = 8 * 60;
    let writer_at = std::cell::Cell::new(None);
    let readers = (0..8u64).map(|_| {
        let (vol, reads) = (vol.clone(), &reads);
        async move {
            for _ in 0..60 {
                // Chunk 1 of stripe 0 is on the lost member: every read takes the lock.
                vol.read(CHUNK, 512).await.unwrap();
                reads.set(reads.get() + 1);
            }
        }
    });
    let writer = async {
        for _ in 0..3 {
            uraid_engine::reactor::yield_now().await;
        }
        for i in 0..5u8 {
            vol.write(0, Arc::new(vec![0x40 | i; 512])).await.unwrap();
        }
        writer_at.set(Some(reads.get()));
    };
    block_on(futures::future::join(
        futures::future::join_all(readers),
        writer,
    ));
    let at = writer_at.get().unwrap();
    assert!(
        at < total / 2,
        "5 writes finished only after {at} of {total} degraded reads"
    );
}

/// A session that only reads (and flushes) records nothing in the superblocks, not even a
/// member that was absent at assembly: its data is still current.
#[test]
fn a_read_only_session_leaves_absent_members_alone() {
    let g = uraid_core::Geometry::new(Level::Raid5, 4, CHUNK, 8 * CHUNK).unwrap();
    let images = uraid_sim::fresh_images(g);
    let vol = uraid_sim::crash::reassemble(&images, &[true, false, true, true]).unwrap();
    block_on(vol.read(0, vol.size())).unwrap();
    block_on(vol.flush()).unwrap();
    block_on(vol.close()).unwrap();
    assert_eq!(
        vol.array().status().events,
        1,
        "a superblock round was written"
    );
    // The first write does record it.
    block_on(vol.write(0, payload(2, 512))).unwrap();
    assert_eq!(vol.array().status().events, 2);
    assert!(vol.array().status().durable_failed.contains(1));
}

/// A journal device that stops answering is timed out like a member (`--io-timeout`): the
/// write waiting on it completes, the array records "no journal" in its superblocks and goes
/// on in bitmap mode, and everything written reads back.
#[test]
fn hung_journal_is_timed_out_and_the_array_falls_back_to_the_bitmap() {
    let opts = ArrayOptions {
        policy: ErrorPolicy {
            io_timeout: Some(Duration::from_millis(200)),
            ..ErrorPolicy::default()
        },
        frozen_metadata: false,
        no_discard: false,
        merge_wait: Duration::ZERO,
        read_ahead: 0,
        read_ahead_always: false,
    };
    let (vol, faults, journal) = uraid_sim::mem_array_with_journal(
        Level::Raid6,
        6,
        CHUNK,
        8 * CHUNK,
        None,
        opts,
        uraid_core::format::JournalMode::WriteBack,
    );
    let a = payload(1, 8192);
    block_on(vol.write(0, a.clone())).unwrap();
    assert_eq!(vol.array().journal_status().unwrap().state, "active");
    journal.hold();
    let b = payload(2, 8192);
    let t0 = Instant::now();
    block_on(vol.write(4 * CHUNK * 4, b.clone())).unwrap();
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(vol.array().journal_status().unwrap().state, "failed");
    block_on(vol.flush()).unwrap();
    assert_eq!(block_on(vol.read(0, 8192)).unwrap().to_vec(), a[..]);
    assert_eq!(
        block_on(vol.read(4 * CHUNK * 4, 8192)).unwrap().to_vec(),
        b[..]
    );
    // The superblocks no longer name the journal; the members were never failed.
    assert!(vol.array().failed().is_empty());
    for i in 0..6 {
        let img = vol.array().member_dev(i).unwrap().snapshot();
        let sb = uraid_core::format::pick_superblock(&img[..4096], &img[4096..8192]).unwrap();
        assert_eq!(sb.journal, None, "member {i}");
    }
    journal.release();
    drop(faults);
}

/// A round written before the session's first write (here: the operator fails another
/// member of a RAID6 while one is absent since assembly) leaves the absent member's slot as
/// the superblocks had it: it comes back as an ordinary member next time, one event behind,
/// and only the member that really failed is recorded failed. Before, every such round
/// (also a recorded replace dropped at start, or a replace begun) recorded it failed, so it
/// could only come back through a full rebuild.
#[test]
fn a_round_before_the_first_write_leaves_absent_members_alone() {
    let g = uraid_core::Geometry::new(Level::Raid6, 6, CHUNK, 8 * CHUNK).unwrap();
    let images = uraid_sim::fresh_images(g);
    let present = [true, false, true, true, true, true];
    let vol = uraid_sim::crash::reassemble(&images, &present).unwrap();
    block_on(vol.array().fail_by_operator(3, true)).unwrap();
    assert_eq!(vol.array().status().events, 2, "the failure's round");
    block_on(vol.read(0, vol.size())).unwrap();
    block_on(vol.close()).unwrap();
    let mut images = uraid_sim::member_images(&vol);
    images[1] = uraid_sim::fresh_images(g)[1].clone();
    let again = uraid_sim::crash::reassemble(&images, &[true; 6]).unwrap();
    let failed = again.array().failed();
    assert!(failed.contains(3), "the failed member stays failed");
    assert!(!failed.contains(1), "the absent member is back: {failed}");
    // The first write's round records an absent member failed, as before.
    drop(again);
    let vol = uraid_sim::crash::reassemble(&images, &present).unwrap();
    block_on(vol.write(0, payload(2, 512))).unwrap();
    assert!(vol.array().status().durable_failed.contains(1));
}
