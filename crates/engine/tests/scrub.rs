//! Scrub (recovery/scrub.rs): a corruption planted behind the array's back is found; with two
//! or more parities (or three mirror copies) the member and offset are named and `repair`
//! restores exactly the lost bytes; RAID5 and two-way mirrors report without a culprit and
//! `repair` makes the stripe consistent again; a scrub under client writes finds nothing (it
//! never sees a half-done stripe update); `check` writes nothing.

use futures::executor::block_on;
use std::sync::atomic::{AtomicBool, Ordering};
use uraid_core::format::DATA_OFFSET;
use uraid_core::{Level, Role};
use uraid_engine::{ScrubMode, ScrubReport, Volume};
use uraid_sim::crash::reassemble;
use uraid_sim::rng::Rng;
use uraid_sim::{mem_array, member_bytes, member_images, payload, read_all, written_whole, MemDev};

const CHUNK: u64 = 16384;
const ROWS: u64 = 16;
/// A volume written end to end and stopped cleanly: member images and contents.
fn written(level: Level, members: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    written_rows(level, members, ROWS)
}

fn written_rows(level: Level, members: usize, rows: u64) -> (Vec<Vec<u8>>, Vec<u8>) {
    written_whole(level, members, CHUNK, rows, members as u64 * 13)
}

fn scrub(vol: &Volume<MemDev>, mode: ScrubMode) -> ScrubReport {
    let stop = AtomicBool::new(false);
    block_on(vol.array().scrub_run(mode, &stop)).expect("scrub runs")
}

/// Flips `len` bytes of member `m`'s data area at `at` in its image.
fn corrupt(images: &mut [Vec<u8>], m: usize, at: u64, len: usize) {
    let o = (DATA_OFFSET + at) as usize;
    for b in &mut images[m][o..o + len] {
        *b ^= 0x5a;
    }
}

#[test]
fn a_planted_corruption_is_located_and_repaired_with_two_or_more_parities() {
    for (level, members) in [
        (Level::Raid6, 6),
        (Level::Raid7, 7),
        (Level::Ec { parity: 4 }, 8),
    ] {
        let (images, want) = written(level, members);
        let vol0 = reassemble(&images, &vec![true; members]).unwrap();
        let g = *vol0.array().geometry();
        drop(vol0);
        // Stripe 5: a data chunk, 300 bytes into its second 4 KiB column; stripe 9: a
        // parity chunk.
        for (stripe, role) in [(5u64, Role::Data(1)), (9, Role::Parity(g.parity() - 1))] {
            let m = match role {
                Role::Data(i) => g.data_member(stripe, i),
                Role::Parity(j) => g.parity_member(stripe, j),
            };
            let at = g.member_offset(stripe, 4096 + 300);
            let mut bad = images.clone();
            corrupt(&mut bad, m, at, 100);
            let vol = reassemble(&bad, &vec![true; members]).unwrap();
            let r = scrub(&vol, ScrubMode::Check);
            assert_eq!(
                (r.units, r.mismatches, r.located, r.repaired),
                (g.units(), 1, 1, 0),
                "{level} {role:?}: {r:?}"
            );
            assert!(
                member_bytes(&vol, m) == bad[m],
                "{level}: check wrote to the members"
            );
            let (mode, live, _, _) = vol.array().scrub_state();
            assert_eq!((mode, live), (Some(ScrubMode::Check), r));
            let r = scrub(&vol, ScrubMode::Repair);
            assert_eq!((r.located, r.repaired), (1, 1), "{level}: {r:?}");
            assert!(
                member_bytes(&vol, m)[DATA_OFFSET as usize..] == images[m][DATA_OFFSET as usize..],
                "{level} {role:?}: repair restored exactly the planted bytes"
            );
            assert_eq!(scrub(&vol, ScrubMode::Check).mismatches, 0);
            assert!(read_all(&vol) == want);
        }
    }
}

#[test]
fn raid5_and_two_way_mirrors_report_without_a_culprit() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid10, 4), (Level::Raid1, 2)] {
        let (mut images, _) = written(level, members);
        // Member 1, unit 3's chunk (parity levels) or mirror row 3.
        let at = 3 * CHUNK + 4096;
        corrupt(&mut images, 1, at, 64);
        let vol = reassemble(&images, &vec![true; members]).unwrap();
        let r = scrub(&vol, ScrubMode::Check);
        assert_eq!((r.mismatches, r.located), (1, 0), "{level}: {r:?}");
        let r = scrub(&vol, ScrubMode::Repair);
        assert_eq!(
            (r.mismatches, r.located, r.repaired),
            (1, 0, 1),
            "{level}: {r:?}"
        );
        assert_eq!(
            scrub(&vol, ScrubMode::Check).mismatches,
            0,
            "{level}: repair made it consistent"
        );
    }
}

#[test]
fn three_way_mirror_names_the_bad_copy() {
    let (mut images, want) = written(Level::Raid1, 3);
    corrupt(&mut images, 2, 7 * CHUNK, 10);
    let vol = reassemble(&images, &[true; 3]).unwrap();
    let r = scrub(&vol, ScrubMode::Repair);
    assert_eq!((r.mismatches, r.located, r.repaired), (1, 1, 1), "{r:?}");
    // Read with only the repaired copy left.
    block_on(vol.close()).unwrap();
    let after = member_images(&vol);
    let only2 = reassemble(&after, &[false, false, true]).unwrap();
    assert!(read_all(&only2) == want);
}

/// Client writes run while scrubs check, over and over: every stripe a scrub looks at is
/// whole (it holds the stripe lock), so none reports anything, and the data is what the
/// writes left. (Fails without the lock: a scrub then sees half-done stripe updates.)
#[test]
fn no_false_mismatches_under_writes() {
    let (images, mut want) = written_rows(Level::Raid6, 6, 8);
    let vol = reassemble(&images, &[true; 6]).unwrap();
    let a = vol.array().clone();
    for m in 0..6 {
        let f = &a.member_dev(m).unwrap().faults;
        f.jitter.store(true, Ordering::Relaxed);
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let (found, scrubs) = scrubs_under_writes(&vol, 3, 300, 64, |off, d| {
        want[off as usize..off as usize + d.len()].copy_from_slice(d)
    });
    assert!(scrubs > 3, "the scrubs overlapped the writes: {scrubs}");
    assert_eq!(found, 0, "{scrubs} scrubs under writes found mismatches");
    assert_eq!(scrub(&vol, ScrubMode::Check).mismatches, 0);
    assert!(read_all(&vol) == want);
}

/// Trims of whole granules are discarded on the members (junk left behind: uraid_sim's
/// MemDev) while scrubs run: a scrub never sees a unit half discarded (the discard holds the
/// unit's stripe lock, array/discard.rs), so it finds nothing; what is written back after a
/// trim reads back.
#[test]
fn no_false_mismatches_under_trims() {
    let (images, mut want) = written_rows(Level::Raid6, 6, 8);
    let vol = reassemble(&images, &[true; 6]).unwrap();
    let a = vol.array().clone();
    for m in 0..6 {
        let f = &a.member_dev(m).unwrap().faults;
        f.jitter.store(true, Ordering::Relaxed);
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let gr = vol.granule();
    let granules = vol.size() / gr;
    let stop = AtomicBool::new(false);
    let done = std::cell::Cell::new(false);
    let mut rng = Rng::new(7);
    let (found, scrubs) = block_on(async {
        let s = async {
            let (mut found, mut scrubs) = (0, 0);
            while !done.get() {
                let r = a.scrub_run(ScrubMode::Check, &stop).await.unwrap();
                found += r.mismatches;
                scrubs += 1;
                uraid_engine::reactor::yield_now().await;
            }
            (found, scrubs)
        };
        let w = async {
            for i in 0..120u64 {
                let n = 1 + rng.below(2);
                let off = rng.below(granules - n + 1) * gr;
                let len = n * gr;
                vol.trim(off, len).await.unwrap();
                want[off as usize..(off + len) as usize].fill(0);
                if i % 3 != 0 {
                    // Written back, partly: the first write fills the granule again.
                    let d = payload(900 + i, 4096);
                    vol.write(off + 512, d.clone()).await.unwrap();
                    want[off as usize + 512..off as usize + 512 + 4096].copy_from_slice(&d);
                }
            }
            done.set(true);
        };
        futures::join!(s, w).0
    });
    let discarded: u64 = (0..6)
        .map(|m| {
            a.member_dev(m)
                .unwrap()
                .faults
                .discarded
                .load(Ordering::Relaxed)
        })
        .sum();
    assert!(discarded > 0, "no trim reached the members");
    assert!(scrubs > 3, "the scrubs overlapped the trims: {scrubs}");
    assert_eq!(found, 0, "{scrubs} scrubs under trims found mismatches");
    assert_eq!(scrub(&vol, ScrubMode::Check).mismatches, 0);
    assert!(read_all(&vol) == want);
}

/// A degraded array is refused (nothing to check against); a stopped scrub ends early.
#[test]
fn degraded_is_refused_and_stop_ends_it() {
    let (images, _) = written(Level::Raid6, 6);
    let vol = reassemble(&images, &[true, true, false, true, true, true]).unwrap();
    let stop = AtomicBool::new(false);
    assert!(block_on(vol.array().scrub_run(ScrubMode::Check, &stop)).is_err());
    let vol = reassemble(&images, &[true; 6]).unwrap();
    stop.store(true, Ordering::Release);
    let r = block_on(vol.array().scrub_run(ScrubMode::Check, &stop)).unwrap();
    assert_eq!(r.units, 0);
}

/// RAID0 has nothing to check: refused, never a panic.
#[test]
fn raid0_is_refused() {
    let (images, _) = written(Level::Raid0, 3);
    let vol = reassemble(&images, &[true; 3]).unwrap();
    let stop = AtomicBool::new(false);
    let e = block_on(vol.array().scrub_run(ScrubMode::Check, &stop)).unwrap_err();
    assert!(e.to_string().contains("no redundancy"), "{e}");
}

/// After an unclean stop, a stripe torn by the cut (a data chunk written, its parity not)
/// is resynced before it is checked (resync's rule: parity from the data), never blamed on
/// the member that got the newer data.
#[test]
fn a_torn_stripe_is_resynced_not_blamed() {
    let (mut images, mut want) = written(Level::Raid6, 6);
    let vol0 = reassemble(&images, &[true; 6]).unwrap();
    let g = *vol0.array().geometry();
    drop(vol0);
    let stripe = 4;
    let m = g.data_member(stripe, 2);
    corrupt(&mut images, m, g.member_offset(stripe, 0), 4096);
    // What reads return from that chunk now (the "new" data the cut left on it).
    let vo = (stripe * g.stripe_data_bytes() + 2 * CHUNK) as usize;
    let o = (DATA_OFFSET + g.member_offset(stripe, 0)) as usize;
    want[vo..vo + 4096].copy_from_slice(&images[m][o..o + 4096]);
    uraid_sim::make_dirty(&mut images);
    let vol = reassemble(&images, &[true; 6]).unwrap();
    let r = scrub(&vol, ScrubMode::Check);
    assert_eq!((r.mismatches, r.located), (0, 0), "{r:?}");
    assert!(read_all(&vol) == want);
}

/// A chunk with a media error is rebuilt from the rest of its stripe and rewritten (the
/// unit is counted, not verified); the next scrub reads it fine.
#[test]
fn an_unreadable_chunk_is_rewritten() {
    let (images, want) = written(Level::Raid6, 6);
    let vol = reassemble(&images, &[true; 6]).unwrap();
    let g = *vol.array().geometry();
    let m = g.parity_member(6, 0);
    let at = DATA_OFFSET + g.member_offset(6, 0);
    vol.array()
        .member_dev(m)
        .unwrap()
        .faults
        .bad_range(at + 512, at + 1024);
    let r = scrub(&vol, ScrubMode::Check);
    assert_eq!((r.unreadable, r.mismatches), (1, 0), "{r:?}");
    let r = scrub(&vol, ScrubMode::Check);
    assert_eq!((r.unreadable, r.mismatches), (0, 0), "rewritten: {r:?}");
    assert!(!vol.array().is_failed(m));
    assert!(read_all(&vol) == want);
}

/// A data chunk with a media error in a stripe resync could not make consistent (torn
/// parity after an unclean stop): a scrub never rebuilds it from that parity, writes
/// nothing there and leaves the stripe unsynced; reads of it stay refused, never wrong.
/// Found by the interaction simulator (seed 480: the scrub wrote the decoded chunk and
/// marked the stripe synced, and reads returned it).
#[test]
fn an_unreadable_data_chunk_of_an_unsynced_stripe_is_not_rebuilt_from_its_parity() {
    let (mut images, want) = written(Level::Raid6, 6);
    let vol0 = reassemble(&images, &[true; 6]).unwrap();
    let g = *vol0.array().geometry();
    drop(vol0);
    let stripe = 5;
    // Torn parity: both parities disagree with the data.
    for j in 0..2 {
        corrupt(
            &mut images,
            g.parity_member(stripe, j),
            g.member_offset(stripe, 0),
            4096,
        );
    }
    uraid_sim::make_dirty(&mut images);
    let vol = reassemble(&images, &[true; 6]).unwrap();
    let a = vol.array().clone();
    let m = g.data_member(stripe, 1);
    let at = DATA_OFFSET + g.member_offset(stripe, 0);
    a.member_dev(m).unwrap().faults.bad_range(at, at + 512);
    let r = scrub(&vol, ScrubMode::Repair);
    assert_eq!(r.unreadable, 1, "{r:?}");
    assert!(a.stripe_unsynced(stripe), "the stripe was marked synced");
    let img = uraid_sim::member_bytes(&vol, m);
    let o = at as usize;
    let vo = (stripe * g.stripe_data_bytes() + CHUNK) as usize;
    assert!(
        img[o..o + 4096] == want[vo..vo + 4096],
        "member {m} holds a chunk decoded from torn parity"
    );
    match block_on(vol.read(vo as u64, 4096)) {
        Ok(got) => assert!(
            got.to_vec() == want[vo..vo + 4096],
            "read returned wrong bytes"
        ),
        Err(e) => assert!(
            matches!(e, uraid_engine::ArrayError::Unreadable { .. }),
            "{e}"
        ),
    }
}

/// A scrub that meets a granule while its first write is still filling it (the members hold
/// whatever they held before: garbage on these fresh members) verifies nothing there: the
/// unit is checked again under its lock (found by the interaction simulator: scrubs racing
/// first writes counted mismatches, and repair rewrote the garbage).
#[test]
fn scrub_racing_first_writes_reports_no_mismatch() {
    for (level, members) in [(Level::Raid1, 3), (Level::Raid5, 4), (Level::Raid6, 6)] {
        // Fresh members: their data areas hold different garbage, the allocation map is empty.
        let (vol, faults) = mem_array(level, members, 4096, 32 * 4096, None);
        for f in &faults {
            f.jitter.store(true, Ordering::Relaxed);
            f.yield_ops.store(true, Ordering::Relaxed);
        }
        let (found, scrubs) = scrubs_under_writes(&vol, 11, 200, 8, |_, _| {});
        assert!(
            scrubs > 3,
            "{level}: the scrubs overlapped the writes: {scrubs}"
        );
        assert_eq!(
            found, 0,
            "{level}: {scrubs} scrubs under first writes found mismatches"
        );
        assert_eq!(scrub(&vol, ScrubMode::Check).mismatches, 0, "{level}");
    }
}

/// Check-mode scrubs, one after another, while `writes` seeded writes (up to `max_sectors`
/// each; `wrote` sees each one) go to `vol`: the mismatches found and the scrubs run.
fn scrubs_under_writes(
    vol: &Volume<MemDev>,
    seed: u64,
    writes: u64,
    max_sectors: u64,
    mut wrote: impl FnMut(u64, &[u8]),
) -> (u64, u64) {
    let a = vol.array().clone();
    let stop = AtomicBool::new(false);
    let done = std::cell::Cell::new(false);
    let size = vol.size();
    let mut rng = Rng::new(seed);
    block_on(async {
        let s = async {
            let (mut found, mut scrubs) = (0, 0);
            while !done.get() {
                let r = a.scrub_run(ScrubMode::Check, &stop).await.unwrap();
                found += r.mismatches;
                scrubs += 1;
                // A scrub of a volume with nothing allocated yet never waits.
                uraid_engine::reactor::yield_now().await;
            }
            (found, scrubs)
        };
        let w = async {
            for i in 0..writes {
                let len = (1 + rng.below(max_sectors)) * 512;
                let off = rng.below((size - len) / 512) * 512;
                let d = payload(seed * 1000 + i, len as usize);
                vol.write(off, d.clone()).await.unwrap();
                wrote(off, &d);
            }
            done.set(true);
        };
        futures::join!(s, w).0
    })
}
