//! Resync after an unclean stop (recovery/resync.rs): parity (and mirror copies) that
//! disagree with the data are rewritten; a client write into an unsynced stripe resyncs it
//! first; the throttle paces it; a stopped resync leaves the array "not clean" so the next
//! start resyncs again. The crash-model version (power cut, resync, member lost) is in
//! crash.rs.

use futures::executor::block_on;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use uraid_core::format::{pick_superblock_slot, DATA_OFFSET, SB_SIZE};
use uraid_core::Level;
use uraid_engine::Volume;
use uraid_sim::crash::reassemble;
use uraid_sim::{make_dirty, make_dirty_regions, member_images, payload, written_whole, MemDev};

const CHUNK: u64 = 4096;
/// A volume written end to end and stopped cleanly, as member images, and its contents.
fn written(level: Level, members: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    written_whole(level, members, CHUNK, 16, 7)
}

/// A RAID5 of four, written end to end, then left "not clean" and reassembled: resync due.
fn dirty_raid5() -> (std::sync::Arc<Volume<MemDev>>, Vec<u8>) {
    let (mut images, want) = written(Level::Raid5, 4);
    make_dirty(&mut images);
    (reassemble(&images, &[true; 4]).unwrap(), want)
}

/// `written` with stripe `s`'s parity P torn (junk, as a cut can leave it), left "not clean"
/// and reassembled: the images (torn), the bytes written, and the volume.
type Torn = (Vec<Vec<u8>>, Vec<u8>, std::sync::Arc<Volume<MemDev>>);
fn torn_parity(level: Level, members: usize, s: u64) -> Torn {
    let (mut images, want) = written(level, members);
    let g = *reassemble(&images, &vec![true; members])
        .unwrap()
        .geometry();
    corrupt(
        &mut images,
        g.parity_member(s, 0),
        g.member_offset(s, 0),
        CHUNK,
    );
    make_dirty(&mut images);
    let vol = reassemble(&images, &vec![true; members]).unwrap();
    assert!(vol.array().stripe_unsynced(s));
    (images, want, vol)
}

fn clean_flag(img: &[u8]) -> bool {
    pick_superblock_slot(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE])
        .unwrap()
        .0
        .clean
}

/// Overwrites `len` bytes of member `m`'s data area at `at` with garbage.
fn corrupt(images: &mut [Vec<u8>], m: usize, at: u64, len: u64) {
    let s = (DATA_OFFSET + at) as usize;
    let junk = payload(0xbad + at, len as usize);
    images[m][s..s + len as usize].copy_from_slice(&junk);
}

/// Every member left out in turn: the whole volume reads back as `want`.
fn check_each_member_lost(images: &[Vec<u8>], want: &[u8]) {
    for lost in 0..images.len() {
        let present: Vec<bool> = (0..images.len()).map(|i| i != lost).collect();
        let vol = reassemble(images, &present).unwrap();
        let got = block_on(vol.read(0, vol.size())).unwrap().to_vec();
        let bad = got.iter().zip(want).position(|(a, b)| a != b);
        assert_eq!(bad, None, "member {lost} lost: first wrong byte");
    }
}

#[test]
fn resync_rewrites_inconsistent_parity_and_writes_resync_their_stripe_first() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 6)] {
        let (mut images, mut want) = written(level, members);
        let vol = reassemble(&images, &vec![true; members]).unwrap();
        let g = *vol.geometry();
        drop(vol);
        // Torn stripe updates: parity of stripes 3 and 7 no longer matches their data.
        for stripe in [3u64, 7] {
            corrupt(
                &mut images,
                g.parity_member(stripe, 0),
                stripe * CHUNK,
                CHUNK,
            );
        }
        make_dirty(&mut images);
        let vol = reassemble(&images, &vec![true; members]).unwrap();
        let a = vol.array().clone();
        assert!(a.needs_resync(), "{level}: dirty array must ask for resync");
        assert!(a.stripe_unsynced(3) && a.stripe_unsynced(7));
        // A client write into stripe 3 (one data chunk, read-modify-write sized): it must
        // resync the stripe first, or the new parity would carry the old inconsistency.
        let off = 3 * g.stripe_data_bytes();
        let w = payload(99, 512);
        block_on(vol.write(off, w.clone())).unwrap();
        want[off as usize..off as usize + 512].copy_from_slice(&w);
        assert!(
            !a.stripe_unsynced(3),
            "{level}: the write resynced its stripe"
        );
        assert!(a.stripe_unsynced(7));
        let stop = AtomicBool::new(false);
        let r = block_on(a.resync(&stop)).unwrap();
        assert_eq!(
            r.repaired, 1,
            "{level}: stripe 7 only (3 was resynced by the write)"
        );
        assert_eq!(r.skipped, 1, "{level}");
        assert_eq!(r.stripes, g.rows() - 1);
        assert!(!a.needs_resync());
        assert_eq!(
            a.recovery_progress().repaired,
            2,
            "{level}: the write's repair counts too"
        );
        block_on(vol.close()).unwrap();
        let after = member_images(&vol);
        assert!(
            after.iter().all(|i| clean_flag(i)),
            "{level}: clean after a finished resync"
        );
        check_each_member_lost(&after, &want);
    }
}

#[test]
fn mirror_resync_makes_every_copy_equal() {
    for (level, members) in [(Level::Raid1, 3), (Level::Raid10, 4)] {
        let (mut images, want) = written(level, members);
        let vol = reassemble(&images, &vec![true; members]).unwrap();
        let g = *vol.geometry();
        drop(vol);
        let copies = g.mirror_copies(5);
        let (m, base) = copies[1];
        corrupt(&mut images, m, base, CHUNK);
        make_dirty(&mut images);
        let vol = reassemble(&images, &vec![true; members]).unwrap();
        // Before resync an unsynced row reads its first copy (the one resync keeps), so a
        // read does not change when resync runs.
        let off = 5 * CHUNK;
        let before = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
        assert_eq!(
            &before[..],
            &want[off as usize..(off + CHUNK) as usize],
            "{level}"
        );
        let stop = AtomicBool::new(false);
        let r = block_on(vol.array().resync(&stop)).unwrap();
        assert_eq!(r.repaired, 1, "{level}");
        let imgs = member_images(&vol);
        let copy = |&(m, base): &(usize, u64)| {
            let s = (DATA_OFFSET + base) as usize;
            imgs[m][s..s + CHUNK as usize].to_vec()
        };
        assert!(
            copies.iter().all(|c| copy(c) == copy(&copies[0])),
            "{level}: copies differ"
        );
        check_each_member_lost(&imgs, &want);
    }
}

#[test]
fn throttle_paces_and_a_stopped_resync_leaves_the_array_not_clean() {
    let members = 4;
    let (vol, _) = dirty_raid5();
    let a = vol.array().clone();
    let p = a.recovery_progress();
    // 16 stripes of 4 x 4 KiB = 256 KiB of reads at 1 MiB/s: about 0.25 s.
    let total = p.total * 4 * CHUNK;
    assert_eq!(total, 256 << 10);
    a.set_throttle(uraid_engine::Throttle {
        min_bytes_per_second: 1 << 20,
        max_bytes_per_second: 1 << 20,
        ..uraid_engine::Throttle::UNLIMITED
    });
    let t0 = Instant::now();
    let stop = AtomicBool::new(false);
    block_on(a.resync(&stop)).unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "throttled resync took {took:?}"
    );
    let v = a.recovery_progress();
    assert_eq!((v.done, v.running, v.fraction), (v.total, false, 1.0));

    // Stopped at once: still due, and a clean stop does not record "clean".
    let mut images = member_images(&vol);
    make_dirty(&mut images);
    let vol = reassemble(&images, &vec![true; members]).unwrap();
    let a = vol.array().clone();
    let stop = AtomicBool::new(true);
    let r = block_on(a.resync(&stop)).unwrap();
    assert_eq!(r.stripes, 0);
    assert!(a.needs_resync());
    block_on(vol.close()).unwrap();
    assert!(
        member_images(&vol).iter().all(|i| !clean_flag(i)),
        "an unfinished resync must leave the superblocks not clean"
    );
}

/// A chunk resync cannot read (media error): that stripe stays unsynced and reported, the
/// rest is resynced, and the array stays "not clean" so the next start tries again.
#[test]
fn unreadable_chunk_leaves_its_stripe_unsynced_and_the_array_not_clean() {
    let (vol, _) = dirty_raid5();
    let a = vol.array().clone();
    let g = *vol.geometry();
    let m = g.data_member(5, 0);
    let at = DATA_OFFSET + g.member_offset(5, 0);
    a.member_dev(m).unwrap().faults.bad_range(at, at + 512);
    let stop = AtomicBool::new(false);
    let r = block_on(a.resync(&stop)).unwrap();
    assert_eq!(r.unreadable, 1);
    assert_eq!(r.stripes, g.rows() - 1);
    assert!(a.stripe_unsynced(5) && !a.stripe_unsynced(4));
    assert!(a.needs_resync());
    assert!(!a.is_failed(m), "one media error does not fail the member");
    block_on(vol.close()).unwrap();
    assert!(member_images(&vol).iter().all(|i| !clean_flag(i)));
}

/// A media error on a parity chunk does not stop resync: parity is recomputed from the data
/// and written over it (which repairs the sector).
#[test]
fn bad_parity_sector_is_rewritten_by_resync() {
    let (vol, want) = dirty_raid5();
    let a = vol.array().clone();
    let g = *vol.geometry();
    let p = g.parity_member(5, 0);
    let at = DATA_OFFSET + g.member_offset(5, 0);
    a.member_dev(p).unwrap().faults.bad_range(at, at + 512);
    let stop = AtomicBool::new(false);
    let r = block_on(a.resync(&stop)).unwrap();
    assert_eq!((r.unreadable, r.repaired), (0, 1));
    assert!(!a.needs_resync() && !a.is_failed(p));
    block_on(vol.close()).unwrap();
    check_each_member_lost(&member_images(&vol), &want);
}

/// Writes into a stripe resync cannot read (a data chunk with a media error) succeed, and
/// do not retry the resync every time (which would spend the member's read-error budget
/// and fail it).
#[test]
fn writes_into_an_unreadable_unsynced_stripe_succeed_without_failing_the_member() {
    let (vol, _) = dirty_raid5();
    let a = vol.array().clone();
    let g = *vol.geometry();
    let m = g.data_member(5, 1);
    let at = DATA_OFFSET + g.member_offset(5, 0);
    a.member_dev(m).unwrap().faults.bad_range(at, at + 512);
    let off = 5 * g.stripe_data_bytes() + 2 * CHUNK; // data chunk 2: not the bad one
    for i in 0..30 {
        block_on(vol.write(off, payload(i, 512))).unwrap();
    }
    assert!(!a.is_failed(m), "30 writes spent the read-error budget");
    assert!(a.stripe_unsynced(5));
}

/// A write into an unsynced stripe whose plan must decode a data chunk with a media error
/// (the parity it would decode from may disagree with the data) never writes the decoded
/// bytes back: the sector keeps its old data or stays unreadable, never garbage. Found by
/// the interaction simulator's beyond-tolerance mode (seed 476: the decoded chunk went to
/// the member, and reads after reassembly returned it).
#[test]
fn a_write_into_an_unsynced_stripe_never_writes_back_a_chunk_decoded_from_its_parity() {
    let s = 5;
    // Parity torn at the cut: it no longer matches the data.
    let (_, want, vol) = torn_parity(Level::Raid5, 4, s);
    let a = vol.array().clone();
    let g = *a.geometry();
    let m0 = g.data_member(s, 0);
    let at = DATA_OFFSET + g.member_offset(s, 0);
    a.member_dev(m0).unwrap().faults.bad_range(at, at + 512);
    // Data chunks 1 and 2 whole: the plan reads chunk 0 (reconstruct-write), meets the
    // media error, and would decode chunk 0 from the torn parity.
    let sdb = g.stripe_data_bytes();
    let off = s * sdb + CHUNK;
    let new = payload(9, 2 * CHUNK as usize);
    let _ = block_on(vol.write(off, new.clone()));
    let chunk0 = (s * sdb) as usize..(s * sdb + CHUNK) as usize;
    match block_on(vol.read(s * sdb, CHUNK)) {
        Ok(got) => assert!(
            got.to_vec() == want[chunk0],
            "chunk 0 holds bytes never written"
        ),
        Err(e) => assert!(
            matches!(e, uraid_engine::ArrayError::Unreadable { .. }),
            "{e}"
        ),
    }
    // What is on the member itself (the media error aside) is still the old data.
    let img = uraid_sim::member_bytes(&vol, m0);
    let lo = (DATA_OFFSET + g.member_offset(s, 0)) as usize;
    let old = &want[(s * sdb) as usize..(s * sdb + CHUNK) as usize];
    assert!(
        img[lo..lo + CHUNK as usize] == *old,
        "member {m0} holds bytes decoded from torn parity"
    );
}

/// A member fails (after it served) while stripes wait for resync, and a write covers the
/// rest of a torn stripe: the chunk on the failed member must not be decoded from the torn
/// parity and encoded into the new parity. Before, the reconstruct-write did exactly that,
/// the stripe became a codeword around the wrong decode, and after a restart without the
/// failed member the spare-parity check passed it and a read served bytes never written.
/// Found by the interaction simulator (29 of the 30 wrong-data seeds of the 11,550-seed
/// soak: RAID6, ec, RAID5). Now the plan is a read-modify-write (parity carried forward by
/// difference, the mismatch kept), or the write is refused.
#[test]
fn a_write_into_an_unsynced_degraded_stripe_never_encodes_a_decode_into_parity() {
    for (level, members) in [(Level::Raid6, 6), (Level::Ec { parity: 3 }, 7)] {
        let s = 5;
        let (images, want, vol) = torn_parity(level, members, s);
        let a = vol.array().clone();
        let g = *a.geometry();
        let k = g.data_chunks();
        let victim = g.data_member(s, k - 1);
        block_on(a.fail_by_operator(victim, true)).unwrap();
        // Every data chunk but the victim's, whole: a reconstruct-write would read the
        // others' k shards (the torn parity among them) to decode the victim's chunk.
        let sdb = g.stripe_data_bytes();
        let mut want = want;
        let off = s * sdb;
        let new = payload(11, ((k - 1) as u64 * CHUNK) as usize);
        if block_on(vol.write(off, new.clone())).is_ok() {
            want[off as usize..off as usize + new.len()].copy_from_slice(&new);
        }
        let images: Vec<Vec<u8>> = (0..members)
            .map(|m| {
                if m == victim {
                    images[m].clone()
                } else {
                    uraid_sim::member_bytes(&vol, m)
                }
            })
            .collect();
        drop(a);
        drop(vol);
        let present: Vec<bool> = (0..members).map(|m| m != victim).collect();
        let vol = reassemble(&images, &present).unwrap();
        let lost = off + (k - 1) as u64 * CHUNK;
        match block_on(vol.read(lost, CHUNK)) {
            Ok(got) => assert!(
                got.to_vec() == want[lost as usize..(lost + CHUNK) as usize],
                "{level:?}: the failed member's chunk reads back as bytes never written"
            ),
            Err(e) => assert!(
                matches!(e, uraid_engine::ArrayError::Unreadable { .. }),
                "{level:?}: {e}"
            ),
        }
        let got = block_on(vol.read(off, (k - 1) as u64 * CHUNK))
            .unwrap()
            .to_vec();
        assert!(
            got[..] == want[off as usize..lost as usize],
            "{level:?}: written data"
        );
    }
}

/// A member dying while a write resyncs its stripe: the write still succeeds (as it would
/// on a degraded stripe), it is not an I/O error.
#[test]
fn member_failing_during_a_writes_resync_does_not_fail_the_write() {
    let (vol, _) = dirty_raid5();
    let a = vol.array().clone();
    let g = *vol.geometry();
    let victim = g.parity_member(5, 0);
    a.member_dev(victim).unwrap().faults.kill();
    block_on(vol.write(5 * g.stripe_data_bytes(), payload(3, 512))).unwrap();
    assert!(a.is_failed(victim));
}

/// With a write-intent bitmap, resync walks the dirty regions only: torn parity in a region
/// the bitmap does not mark stays as it is (nothing was written there at the cut, so on a
/// real array it cannot be torn), the marked one is repaired, progress counts its stripes,
/// and a restart after a stopped resync resumes with the regions it had not finished.
#[test]
fn resync_walks_only_dirty_regions_and_resumes_region_wise() {
    let members = 4;
    let (mut images, want) = written(Level::Raid5, members);
    let vol = reassemble(&images, &[true; 4]).unwrap();
    let g = *vol.geometry();
    let (bc, regions, dirty) = vol.array().bitmap_state();
    assert_eq!(
        (bc, dirty),
        (2 * CHUNK, 0),
        "a clean stop leaves no bit set"
    );
    assert_eq!(regions, 8, "16 rows in regions of 2");
    drop(vol);
    for stripe in [2u64, 9] {
        corrupt(
            &mut images,
            g.parity_member(stripe, 0),
            stripe * CHUNK,
            CHUNK,
        );
    }
    // Regions 1 (stripes 2, 3) and 6 (12, 13) dirty; stripe 9 is in region 4.
    make_dirty_regions(&mut images, |r| r == 1 || r == 6);
    let vol = reassemble(&images, &[true; 4]).unwrap();
    let a = vol.array().clone();
    assert_eq!(a.bitmap_state().2, 2);
    assert!(a.stripe_unsynced(2) && a.stripe_unsynced(13));
    assert!(!a.stripe_unsynced(9), "clean region: nothing to resync");
    let stop = AtomicBool::new(false);
    let r = block_on(a.resync(&stop)).unwrap();
    assert_eq!(
        (r.stripes, r.repaired),
        (4, 1),
        "two regions of two stripes"
    );
    assert_eq!(a.recovery_progress().total, 4);
    for _ in 0..2 {
        block_on(a.bitmap_tick());
    }
    assert_eq!(
        a.bitmap_state().2,
        0,
        "resynced regions are cleared by the daemon"
    );
    let after = member_images(&vol);
    let sdb = g.stripe_data_bytes() as usize;
    let lost = g.data_member(2, 0);
    let present: Vec<bool> = (0..members).map(|i| i != lost).collect();
    let back = reassemble(&after, &present).unwrap();
    let got = block_on(back.read(2 * sdb as u64, sdb as u64))
        .unwrap()
        .to_vec();
    assert_eq!(got[..], want[2 * sdb..3 * sdb], "stripe 2 repaired");
    drop((vol, a, back));

    // Resume: dirty regions 1 and 6, resync stopped after region 1; the bitmap daemon
    // clears what it finished; a crash; the next start resyncs region 6 only.
    let mut images = after;
    make_dirty_regions(&mut images, |r| r == 1 || r == 6);
    let vol = reassemble(&images, &[true; 4]).unwrap();
    let a = vol.array().clone();
    block_on(async {
        a.resync_unit_for_test(2).await;
        a.resync_unit_for_test(3).await;
    });
    for _ in 0..2 {
        block_on(a.bitmap_tick());
    }
    assert_eq!(
        a.bitmap_state().2,
        1,
        "region 1 resynced and cleared, region 6 kept"
    );
    let crashed = member_images(&vol);
    drop((vol, a));
    let vol = reassemble(&crashed, &[true; 4]).unwrap();
    let a = vol.array().clone();
    assert!(!a.stripe_unsynced(2) && a.stripe_unsynced(12));
    let r = block_on(a.resync(&stop)).unwrap();
    assert_eq!(r.stripes, 2, "only region 6 was left");
}

/// `--start-dirty-degraded` made useful (md serves nothing it cannot trust; uraid checks
/// what it can): every region dirty, as after a power cut in the middle of a load, torn
/// stripes planted on members that stay (a data chunk rewritten without its parity, or a
/// parity chunk without its data, as a write cut short leaves them), then one member lost.
/// With a parity to spare, exactly the torn stripes refuse the lost member's chunk (EIO);
/// every other stripe's lost chunk is checked against the spare parity and served right,
/// and the status counts both.
#[test]
fn dirty_degraded_refuses_exactly_the_torn_stripes_where_a_parity_is_spare() {
    for (level, members) in [
        (Level::Raid6, 6),
        (Level::Raid7, 6),
        (Level::Ec { parity: 3 }, 7),
    ] {
        let (mut images, want) = written(level, members);
        let g = *reassemble(&images, &vec![true; members])
            .unwrap()
            .geometry();
        make_dirty(&mut images);
        let lost = 2usize;
        let sdb = g.stripe_data_bytes();
        // Stripes where the lost member holds data: (stripe, its data index there).
        let decoded: Vec<(u64, usize)> = (0..g.rows())
            .filter_map(|s| {
                (0..g.data_chunks())
                    .find(|&i| g.data_member(s, i) == lost)
                    .map(|i| (s, i))
            })
            .collect();
        assert!(decoded.len() >= 6, "{level:?}: too few stripes to plant in");
        // Tear three of them: a data chunk of a member that stays, a parity chunk, and the
        // last parity chunk.
        let torn: Vec<u64> = [1usize, 3, 5].iter().map(|&n| decoded[n].0).collect();
        for (n, &s) in torn.iter().enumerate() {
            let m = match n {
                0 => (0..g.data_chunks())
                    .map(|i| g.data_member(s, i))
                    .find(|&m| m != lost)
                    .unwrap(),
                1 => g.parity_member(s, 0),
                _ => g.parity_member(s, g.parity() - 1),
            };
            assert_ne!(m, lost);
            corrupt(&mut images, m, g.member_offset(s, 0), CHUNK);
        }
        let present: Vec<bool> = (0..members).map(|i| i != lost).collect();
        let vol = reassemble(&images, &present).unwrap();
        assert!(vol.array().needs_resync());
        for &(s, i) in &decoded {
            let off = s * sdb + i as u64 * CHUNK;
            let got = block_on(vol.read(off, CHUNK));
            if torn.contains(&s) {
                assert!(got.is_err(), "{level:?}: torn stripe {s} served");
            } else {
                let got = got
                    .unwrap_or_else(|e| panic!("{level:?}: intact stripe {s} refused: {e}"))
                    .to_vec();
                assert!(
                    got[..] == want[off as usize..(off + CHUNK) as usize],
                    "{level:?}: stripe {s} served wrong bytes"
                );
            }
        }
        let a = vol.array();
        assert_eq!(a.unsynced_stripes_refused(), torn.len() as u64, "{level:?}");
        assert_eq!(
            a.unsynced_stripes_verified(),
            (decoded.len() - torn.len()) as u64,
            "{level:?}"
        );
    }
}

/// Soak seed 68629 (EC 3+3, a write-back journal that died, then a power cut, two data
/// members out): a write of one data chunk was cut short with two of the three parity
/// chunks new and the data chunk and the third parity old. The four chunks left are one
/// more than k, and that one spare check passed the torn stripe: the difference (old to
/// new, in the chunks that got it) has the code's own shape, so it fits for every byte of
/// the chunk, and the two lost data chunks decoded as garbage. Every way such a write can
/// be torn (any of its chunks new, the others old), with each pair of the other data
/// members out: the lost chunks are refused or served right, never garbage.
#[test]
fn a_torn_write_never_passes_the_spare_parity_check() {
    // Vandermonde rows (RAID6, ec 3+3) and Cauchy (ec 3+4).
    for (level, n) in [
        (Level::Ec { parity: 3 }, 6),
        (Level::Raid6, 6),
        (Level::Ec { parity: 4 }, 7),
    ] {
        torn_writes_never_pass(level, n);
    }
}

fn torn_writes_never_pass(level: Level, n: usize) {
    let (before, want) = written(level, n);
    let vol = reassemble(&before, &vec![true; n]).unwrap();
    let g = *vol.geometry();
    let sdb = g.stripe_data_bytes();
    let s = 5u64;
    let new = payload(0x68629, CHUNK as usize);
    block_on(vol.write(s * sdb + CHUNK, new.to_vec())).unwrap();
    block_on(vol.close()).unwrap();
    let after = member_images(&vol);
    // The chunks the write changed: data chunk 1 and every parity chunk.
    let written: Vec<usize> = std::iter::once(g.data_member(s, 1))
        .chain((0..g.parity()).map(|j| g.parity_member(s, j)))
        .collect();
    let at = (DATA_OFFSET + g.member_offset(s, 0)) as usize;
    let chunk = at..at + CHUNK as usize;
    // The members' images with the write on the written members whose bit is set in
    // `torn_set` only, marked dirty (a power cut in the middle of the write).
    let tear = |torn_set: u32| {
        let mut torn = before.clone();
        for (b, &m) in written.iter().enumerate() {
            if torn_set & (1 << b) != 0 {
                torn[m][chunk.clone()].copy_from_slice(&after[m][chunk.clone()]);
            }
        }
        make_dirty(&mut torn);
        torn
    };
    let mut served = 0;
    for torn_set in 1..(1u32 << written.len()) - 1 {
        let torn = tear(torn_set);
        // Every set of one or two members out (three parities: two leave one to spare).
        for out in (0..n).flat_map(|a| (a..n).map(move |b| [a, b])) {
            let present: Vec<bool> = (0..n).map(|m| !out.contains(&m)).collect();
            let vol = reassemble(&torn, &present).unwrap();
            assert!(vol.array().needs_resync());
            for i in 0..g.data_chunks() as u64 {
                let off = (s * sdb + i * CHUNK) as usize;
                let Ok(got) = block_on(vol.read(off as u64, CHUNK)) else {
                    continue;
                };
                served += 1;
                let got = got.to_vec();
                // The chunk written may read old or new (the write was cut short).
                let ok =
                    got[..] == want[off..off + CHUNK as usize] || (i == 1 && got[..] == new[..]);
                assert!(
                    ok,
                    "{level:?}: stripe {s} torn (new on members {:?}), members {out:?} out: \
                     data chunk {i} served wrong",
                    written
                        .iter()
                        .enumerate()
                        .filter(|(b, _)| torn_set & (1 << b) != 0)
                        .map(|(_, m)| m)
                        .collect::<Vec<_>>()
                );
            }
        }
    }
    // Stripes were still served where that is sound (one member out, or the chunks a
    // read needs untouched by the tear).
    assert!(served > 0);
    // The rebuild's own check (`unsynced_decode_verified`): one of data chunks 0 and 2
    // missing and a new device rebuilding the other, both decoded: the rebuilt chunk is
    // refused (listed bad) or right, never garbage.
    let (d0, d2) = (g.data_member(s, 0), g.data_member(s, 2));
    for torn_set in 1..(1u32 << written.len()) - 1 {
        let torn = tear(torn_set);
        let present: Vec<bool> = (0..n).map(|m| m != d0 && m != d2).collect();
        let vol = reassemble(&torn, &present).unwrap();
        let dev = MemDev::from_image("new", vec![0xEE; torn[d2].len()]);
        let slot = block_on(vol.add_member(dev, uraid_sim::new_device_uuid(9))).unwrap();
        assert!(slot == d0 || slot == d2);
        block_on(vol.array().rebuild(&AtomicBool::new(false))).unwrap();
        for i in [0u64, 2] {
            let off = (s * sdb + i * CHUNK) as usize;
            if let Ok(got) = block_on(vol.read(off as u64, CHUNK)) {
                assert!(
                    got.to_vec()[..] == want[off..off + CHUNK as usize],
                    "{level:?}: stripe {s} torn (set {torn_set:b}), slot {slot} rebuilt: data \
                     chunk {i} served wrong"
                );
            }
        }
    }
}

/// Units on a bad-block list in dirty regions: resync reads around the listed chunks. A
/// listed parity chunk is recomputed from the data, written, and comes off the list; a
/// listed data chunk leaves its stripe unsynced and reported unreadable. Neither is left
/// "to the rebuild" (no rebuild will pass them): before, resync deferred both and stayed
/// pending for ever.
#[test]
fn resync_rewrites_listed_parity_and_reports_listed_data() {
    use uraid_core::badblocks::{BadBlocks, BadRange};
    let (mut images, want) = written(Level::Raid5, 4);
    let g = *reassemble(&images, &[true; 4]).unwrap().geometry();
    let (p, d) = (g.parity_member(5, 0), g.data_member(9, 0));
    let bad = BadBlocks::from_ranges(vec![
        BadRange {
            member: p,
            start: 5,
            len: 1,
        },
        BadRange {
            member: d,
            start: 9,
            len: 1,
        },
    ]);
    for img in images.iter_mut() {
        let (mut sb, _) =
            pick_superblock_slot(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE]).unwrap();
        sb.bad = bad.clone();
        for slot in 0..2 {
            img[slot * SB_SIZE..(slot + 1) * SB_SIZE].copy_from_slice(&sb.encode());
        }
    }
    // The listed parity chunk holds garbage (what a rebuild that could not produce it
    // left there).
    corrupt(&mut images, p, g.member_offset(5, 0), CHUNK);
    make_dirty(&mut images);
    let vol = reassemble(&images, &[true; 4]).unwrap();
    let a = vol.array().clone();
    let stop = AtomicBool::new(false);
    let r = block_on(a.resync(&stop)).unwrap();
    assert_eq!((r.unreadable, r.deferred), (1, 0), "{r:?}");
    assert!(!a.stripe_unsynced(5), "the listed parity was rewritten");
    assert!(
        a.stripe_unsynced(9),
        "the listed data chunk leaves its stripe unsynced"
    );
    let left = a.bad_blocks();
    assert!(!left.contains(p, 5) && left.contains(d, 9), "{left:?}");
    // Stripe 5 survives the loss of any member now (its parity is right).
    block_on(vol.close()).unwrap();
    let images = member_images(&vol);
    let sdb = g.stripe_data_bytes() as usize;
    for lost in 0..4 {
        let present: Vec<bool> = (0..4).map(|m| m != lost).collect();
        let v = reassemble(&images, &present).unwrap();
        let got = block_on(v.read(5 * sdb as u64, sdb as u64))
            .unwrap()
            .to_vec();
        assert!(
            got == want[5 * sdb..6 * sdb],
            "stripe 5 with member {lost} lost"
        );
    }
}

/// A read of a chunk that served `served` in an earlier session: the same bytes again, or a
/// refusal (EIO), never other bytes (`old`: what the members other than the one that
/// served agree on).
fn same_or_refused(
    got: Result<uraid_engine::Segments, uraid_engine::ArrayError>,
    served: &[u8],
    old: &[u8],
    what: &str,
) {
    match got {
        Ok(got) => {
            let got = got.to_vec();
            assert!(
                got[..] == served[..],
                "{what}: read back other bytes than served (the old ones: {})",
                got[..] == old[..]
            );
        }
        Err(e) => assert!(
            matches!(e, uraid_engine::ArrayError::Unreadable { .. }),
            "{what}: {e}"
        ),
    }
}

/// A device that served a torn stripe's bytes in one session is never decoded around as if
/// the other members' agreement settled that stripe in a later session (simulator seed
/// 68923; docs/format.md, "Served while out of sync"). RAID6: a write cut short left new
/// bytes in one data chunk only, on member `m`; the other five members agree on the old
/// bytes (one codeword). Session 2, healthy but resync still due, serves the new bytes from
/// `m`. Session 3 lacks `m` (left out at the start; or failed by the operator in session 2
/// and then replaced by a new device that is rebuilt): a read of that chunk must return
/// the bytes session 2 served, or refuse, never the old ones. Before the superblocks
/// recorded who served, "unseen" was per session: session 3 found the five consistent,
/// marked the stripe synced and decoded the old bytes.
#[test]
fn a_member_that_served_a_torn_stripe_is_never_decoded_around_in_a_later_session() {
    use uraid_sim::new_device_uuid;
    for failed_by_operator in [false, true] {
        let (level, members) = (Level::Raid6, 6);
        let (mut images, want) = written(level, members);
        let g = *reassemble(&images, &vec![true; members])
            .unwrap()
            .geometry();
        let sdb = g.stripe_data_bytes();
        let (s, i) = (5u64, 1usize);
        let m = g.data_member(s, i);
        let off = s * sdb + i as u64 * CHUNK;
        corrupt(&mut images, m, g.member_offset(s, 0), CHUNK);
        make_dirty(&mut images);
        // Session 2: every member present, resync due and not run; the new bytes are read.
        let vol = reassemble(&images, &vec![true; members]).unwrap();
        assert!(vol.array().stripe_unsynced(s));
        let served = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
        assert!(served[..] != want[off as usize..(off + CHUNK) as usize]);
        if failed_by_operator {
            block_on(vol.array().fail_by_operator(m, true)).unwrap();
        }
        let images = member_images(&vol);
        drop(vol);
        // Session 3 without `m`.
        let present: Vec<bool> = (0..members).map(|j| j != m).collect();
        let vol = reassemble(&images, &present).unwrap();
        assert!(vol.array().needs_resync());
        if failed_by_operator {
            let dev = MemDev::from_image("new", vec![0xEE; images[m].len()]);
            assert_eq!(block_on(vol.add_member(dev, new_device_uuid(9))), Ok(m));
            block_on(vol.array().rebuild(&AtomicBool::new(false))).unwrap();
        }
        same_or_refused(
            block_on(vol.read(off, CHUNK)),
            &served,
            &want[off as usize..(off + CHUNK) as usize],
            &format!("operator fail {failed_by_operator}, stripe {s}"),
        );
    }
}

/// Writes every member's superblocks (both slots) with `edit` applied.
fn edit_superblocks(images: &mut [Vec<u8>], edit: impl Fn(&mut uraid_core::format::Superblock)) {
    for img in images.iter_mut() {
        let (mut sb, _) =
            pick_superblock_slot(&img[..SB_SIZE], &img[SB_SIZE..2 * SB_SIZE]).unwrap();
        edit(&mut sb);
        for slot in 0..2 {
            img[slot * SB_SIZE..(slot + 1) * SB_SIZE].copy_from_slice(&sb.encode());
        }
    }
}

/// The served set's other two routes (the cold review of the fix for seed 68923), RAID6,
/// stripe `s` torn with new bytes on member `m` only:
/// * `m` is being rebuilt (its checkpoint past `s`), serves the new bytes in session 2, is
///   absent in session 3, where a write records it failed (its checkpoint goes): session 4
///   without it must not decode the old bytes. Before, only a failure online counted.
/// * the same member fails in session 2 after serving, and a spare takes its slot: the
///   spare's rebuild must not decode `s` (below the checkpoint the slot had at assembly).
/// * `m` is absent in session 2, whose read decodes `s` around it (the other five agree on
///   the old bytes) and serves that: `m` is recorded failed before the bytes go out, so
///   session 3 with `m` given again does not read its new bytes back.
#[test]
fn a_rebuilding_member_that_served_and_an_absent_member_decoded_around_stay_accounted_for() {
    use uraid_core::format::MemberState;
    let (level, members) = (Level::Raid6, 6);
    let (s, i) = (5u64, 1usize);
    let prepare = || {
        let (mut images, want) = written(level, members);
        let g = *reassemble(&images, &vec![true; members])
            .unwrap()
            .geometry();
        let m = g.data_member(s, i);
        let off = s * g.stripe_data_bytes() + i as u64 * CHUNK;
        corrupt(&mut images, m, g.member_offset(s, 0), CHUNK);
        make_dirty(&mut images);
        (images, want, m, off)
    };
    let without = |m: usize| -> Vec<bool> { (0..members).map(|j| j != m).collect() };
    let old_bytes = |want: &[u8], off: u64| want[off as usize..(off + CHUNK) as usize].to_vec();

    // Rebuilding member.
    let (mut images, want, m, off) = prepare();
    edit_superblocks(&mut images, |sb| {
        sb.states[m] = MemberState::Rebuilding;
        sb.rebuilt[m] = s + 1;
    });
    let vol = reassemble(&images, &vec![true; members]).unwrap();
    let served = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
    assert!(served != old_bytes(&want, off), "m served the torn bytes");
    let images = member_images(&vol);
    drop(vol);
    let vol = reassemble(&images, &without(m)).unwrap();
    // A write elsewhere records the absent member failed (its checkpoint dropped).
    block_on(vol.write(0, payload(77, CHUNK as usize))).unwrap();
    block_on(vol.flush()).unwrap();
    let images = member_images(&vol);
    drop(vol);
    let vol = reassemble(&images, &without(m)).unwrap();
    same_or_refused(
        block_on(vol.read(off, CHUNK)),
        &served,
        &old_bytes(&want, off),
        "rebuilding",
    );
    drop(vol);

    // Rebuilding member that serves, fails, and whose slot a spare takes in the same
    // session: the spare's rebuild must not decode below the old checkpoint.
    let (mut images, want, m, off) = prepare();
    edit_superblocks(&mut images, |sb| {
        sb.states[m] = MemberState::Rebuilding;
        sb.rebuilt[m] = s + 1;
    });
    let vol = reassemble(&images, &vec![true; members]).unwrap();
    let served = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
    block_on(vol.array().fail_by_operator(m, true)).unwrap();
    let dev = MemDev::from_image("spare", vec![0xEE; images[m].len()]);
    assert_eq!(
        block_on(vol.add_member(dev, uraid_sim::new_device_uuid(5))),
        Ok(m)
    );
    block_on(vol.array().rebuild(&AtomicBool::new(false))).unwrap();
    same_or_refused(
        block_on(vol.read(off, CHUNK)),
        &served,
        &old_bytes(&want, off),
        "spare",
    );
    drop(vol);

    // Absent member decoded around.
    let (images, want, m, off) = prepare();
    let vol = reassemble(&images, &without(m)).unwrap();
    let served = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
    assert!(
        served == old_bytes(&want, off),
        "the five agree on the old bytes"
    );
    let mut after = member_images(&vol);
    drop(vol);
    after[m] = images[m].clone();
    let vol = reassemble(&after, &vec![true; members]).unwrap();
    assert!(vol.array().failed().contains(m), "m was recorded failed");
    let got = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
    assert!(got == served, "absent: read back other bytes than served");
}

/// The mirror form of seed 68923's bug: a row not in sync reads its first copy (the one
/// resync keeps). If that copy served a torn write's new bytes in session 2 and its member
/// is gone in session 3 (missing; or failed and its slot rebuilt from another copy), the
/// other copies still hold the old bytes: a read must refuse, never serve them.
#[test]
fn a_mirror_row_never_reads_another_copy_than_the_one_that_served_it() {
    use uraid_sim::new_device_uuid;
    for (level, members) in [(Level::Raid1, 3), (Level::Raid10, 4)] {
        for failed_by_operator in [false, true] {
            let (mut images, want) = written(level, members);
            let g = *reassemble(&images, &vec![true; members])
                .unwrap()
                .geometry();
            let row = 3u64;
            let (m0, base) = g.mirror_copies(row)[0];
            corrupt(&mut images, m0, base, CHUNK);
            make_dirty(&mut images);
            let off = row * CHUNK;
            let old = want[off as usize..(off + CHUNK) as usize].to_vec();
            let vol = reassemble(&images, &vec![true; members]).unwrap();
            let served = block_on(vol.read(off, CHUNK)).unwrap().to_vec();
            assert!(served != old, "{level:?}: copy 0 served the torn bytes");
            if failed_by_operator {
                block_on(vol.array().fail_by_operator(m0, true)).unwrap();
            }
            let images = member_images(&vol);
            drop(vol);
            let present: Vec<bool> = (0..members).map(|j| j != m0).collect();
            let vol = reassemble(&images, &present).unwrap();
            if failed_by_operator {
                let dev = MemDev::from_image("new", vec![0xEE; images[m0].len()]);
                assert_eq!(block_on(vol.add_member(dev, new_device_uuid(3))), Ok(m0));
                block_on(vol.array().rebuild(&AtomicBool::new(false))).unwrap();
            }
            // Then a write into the other half of the row, and a resync where it can run
            // (every member present): neither may copy another copy over the first.
            let half = CHUNK / 2;
            let check = |when: &str| {
                same_or_refused(
                    block_on(vol.read(off, half)),
                    &served[..half as usize],
                    &old[..half as usize],
                    &format!("{level:?} operator fail {failed_by_operator}, {when}"),
                )
            };
            check("at once");
            block_on(vol.write(off + half, payload(31, half as usize))).unwrap();
            check("after a write into the row");
            let _ = block_on(vol.array().resync(&AtomicBool::new(false)));
            check("after resync");
        }
    }
}
