//! TRIM passed down to the members (array/discard.rs): trims of whole granules are discarded
//! on every member that is not failed, exactly the units' chunks; partial granules are not;
//! a unit is discarded only under its stripe lock; a device that cannot discard is not asked
//! again and the trim still succeeds; `no_discard` keeps the bytes. What a discarded range
//! holds afterwards (junk, in uraid_sim's MemDev) is never read as data.

use futures::executor::block_on;
use std::sync::atomic::Ordering;
use uraid_core::format::DATA_OFFSET;
use uraid_core::Level;
use uraid_engine::ArrayOptions;
use uraid_sim::fixtures::sim_options;
use uraid_sim::{mem_array, mem_array_with, payload, read_all};

const CHUNK: u64 = 4096;
const ROWS: u64 = 32;

fn discarded(faults: &[std::sync::Arc<uraid_sim::Faults>]) -> Vec<u64> {
    faults
        .iter()
        .map(|f| f.discarded.load(Ordering::Relaxed))
        .collect()
}

/// Every level: a trim of two whole granules discards exactly their units' chunks on every
/// member (compared byte by byte with the images before), the volume reads zeros there and
/// everything else unchanged, and a write afterwards reads back.
#[test]
fn whole_granules_are_discarded_exactly_and_read_as_zeros() {
    for (level, members) in [
        (Level::Raid0, 3),
        (Level::Raid1, 3),
        (Level::Raid10, 3),
        (Level::Raid10, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 6),
        (Level::Ec { parity: 4 }, 7),
    ] {
        let (vol, faults) = mem_array(level, members, CHUNK, ROWS * CHUNK, None);
        let size = vol.size();
        let all = payload(level.code() as u64 + members as u64, size as usize);
        block_on(vol.write(0, all.clone())).unwrap();
        let mut want = all.to_vec();
        let a = vol.array().clone();
        let before: Vec<Vec<u8>> = (0..members)
            .map(|m| a.member_dev(m).unwrap().snapshot())
            .collect();
        let gr = vol.granule();
        let g = *a.geometry();
        let (off, len) = (3 * gr, 2 * gr);
        // A partial granule on each side: written as zeros, not discarded.
        block_on(vol.trim(off - 512, len + 1024)).unwrap();
        want[(off - 512) as usize..(off + len + 512) as usize].fill(0);
        let sdb = g.stripe_data_bytes();
        let ranges = g.unit_ranges(off / sdb..(off + len) / sdb);
        for (m, old) in before.iter().enumerate() {
            let after = a.member_dev(m).unwrap().snapshot();
            let (lo, hi) = ranges
                .iter()
                .find(|r| r.0 == m)
                .map(|&(_, o, l)| (DATA_OFFSET + o, DATA_OFFSET + o + l))
                .unwrap_or((0, 0));
            let changed: Vec<usize> = (DATA_OFFSET as usize..after.len())
                .filter(|&b| after[b] != old[b])
                .collect();
            // Junk replaced the discarded range (a few bytes may match by chance); the
            // partial granules' zero writes changed the neighbouring stripes' chunks too.
            let inside = changed
                .iter()
                .filter(|&&b| (lo..hi).contains(&(b as u64)))
                .count();
            assert!(
                hi == lo || inside as u64 > (hi - lo) / 2,
                "{level} n={members}: member {m} range {lo}..{hi} not discarded"
            );
        }
        let total: u64 = discarded(&faults).iter().sum();
        let want_total: u64 = ranges.iter().map(|r| r.2).sum();
        assert_eq!(total, want_total, "{level} n={members}");
        assert!(read_all(&vol) == want, "{level} n={members}: contents");
        let d = payload(77, 8192);
        block_on(vol.write(off + 4096, d.clone())).unwrap();
        want[(off + 4096) as usize..(off + 4096 + 8192) as usize].copy_from_slice(&d);
        assert!(read_all(&vol) == want, "{level} n={members}: written back");
        // A trim inside one granule discards nothing.
        block_on(vol.trim(off + gr + 512, gr - 1024)).unwrap();
        assert_eq!(discarded(&faults).iter().sum::<u64>(), total, "{level}");
    }
}

/// A unit is discarded only while its stripe lock is held: a holder (a scrub, a rebuild, a
/// write-back journal's deferred writes) never sees its chunks change under it.
#[test]
fn a_discard_waits_for_the_stripe_lock() {
    let (vol, faults) = mem_array(Level::Raid6, 6, CHUNK, ROWS * CHUNK, None);
    let size = vol.size();
    block_on(vol.write(0, payload(5, size as usize))).unwrap();
    let a = vol.array().clone();
    let gr = vol.granule();
    let unit = 2 * gr / a.geometry().stripe_data_bytes();
    let guard = block_on(a.hold_stripe_for_test(unit));
    block_on(async {
        let t = async { vol.trim(2 * gr, gr).await.unwrap() };
        let c = async {
            for _ in 0..100 {
                uraid_engine::reactor::yield_now().await;
            }
            assert_eq!(
                discarded(&faults).iter().sum::<u64>(),
                0,
                "discarded while the stripe was held"
            );
            drop(guard);
        };
        futures::join!(t, c)
    });
    assert!(discarded(&faults).iter().sum::<u64>() > 0);
}

/// Failed members are skipped; a device that cannot discard answers once and is not asked
/// again, and the trim succeeds; with `no_discard` nothing is discarded.
#[test]
fn failed_and_unsupported_members_and_the_off_switch() {
    let (vol, faults) = mem_array(Level::Raid6, 6, CHUNK, ROWS * CHUNK, None);
    let size = vol.size();
    block_on(vol.write(0, payload(6, size as usize))).unwrap();
    let a = vol.array().clone();
    block_on(a.fail_by_operator(1, true)).unwrap();
    faults[2].no_discard.store(true, Ordering::Relaxed);
    let gr = vol.granule();
    for i in 0..3 {
        block_on(vol.trim(i * 2 * gr, gr)).unwrap();
    }
    let d = discarded(&faults);
    assert_eq!((d[1], d[2]), (0, 0), "{d:?}");
    assert!(
        d.iter().enumerate().all(|(m, &b)| m == 1
            || m == 2
            || b == 3 * CHUNK * (gr / a.geometry().stripe_data_bytes())),
        "{d:?}"
    );
    let s = a.status().members[2].io;
    assert_eq!(
        (s.discard.count, s.discard.errors),
        (0, 0),
        "an unsupported device is not counted"
    );
    let asked = |m: usize| faults[m].discard_calls.load(Ordering::Relaxed);
    assert_eq!(
        (asked(1), asked(2), asked(0)),
        (0, 1, 3),
        "asked once, then not again"
    );
    let s0 = a.status().members[0].io;
    assert_eq!((s0.discard.count, s0.discard.bytes), (3, d[0]));

    let opts = ArrayOptions {
        no_discard: true,
        ..sim_options()
    };
    let (vol, faults) = mem_array_with(Level::Raid5, 4, CHUNK, ROWS * CHUNK, None, opts);
    block_on(vol.write(0, payload(7, vol.size() as usize))).unwrap();
    block_on(vol.trim(0, vol.size())).unwrap();
    assert_eq!(discarded(&faults), vec![0; 4]);
    assert!(read_all(&vol).iter().all(|&b| b == 0));
}

/// A read in flight while a trim of its range clears the bit and discards the units never
/// returns what the discard left: the read takes no stripe lock, so it is read again
/// (`DiscardLog`; without that the healthy case returns junk) and comes back as zeros, or as
/// the bytes from before the trim. Degraded, the decode of the missing chunks holds the
/// stripe lock the discard waits for.
#[test]
fn a_read_racing_a_discard_returns_old_bytes_or_zeros() {
    for degraded in [false, true] {
        let (vol, faults) = mem_array(Level::Raid5, 4, CHUNK, ROWS * CHUNK, None);
        let size = vol.size();
        let data = payload(8, size as usize);
        block_on(vol.write(0, data.clone())).unwrap();
        let a = vol.array().clone();
        if degraded {
            block_on(a.fail_by_operator(1, true)).unwrap();
        }
        let gr = vol.granule();
        for f in &faults {
            f.read_yields.store(200, Ordering::Relaxed);
        }
        let (got, ()) = block_on(async {
            let r = async { vol.read(gr, gr).await.unwrap().to_vec() };
            let t = async {
                uraid_engine::reactor::yield_now().await;
                vol.trim(gr, gr).await.unwrap();
            };
            futures::join!(r, t)
        });
        assert!(
            discarded(&faults).iter().sum::<u64>() > 0,
            "degraded {degraded}"
        );
        let old = &data[gr as usize..2 * gr as usize];
        for (i, (s, o)) in got.chunks(512).zip(old.chunks(512)).enumerate() {
            assert!(
                s == o || s.iter().all(|&b| b == 0),
                "degraded {degraded}: sector {i} of the read is neither old nor zeros"
            );
        }
    }
}
