//! Replace of an active member while it serves (recovery/replace.rs), checked against the
//! reference model:
//! * under client reads and writes on every level with redundancy: every read during the
//!   replace returns the model's bytes; afterwards the new device is the slot's member, the
//!   old one is refused at assembly, and the array serves every byte with other members
//!   taken away (the new member holds exactly what it should);
//! * chunks the old member cannot read are reconstructed onto the new one;
//! * the old member failing mid-replace makes the new device its slot's member, rebuilt;
//!   the new one failing ends the replace with the member kept; cancel drops it;
//! * power cuts anywhere in a replace under writes and flushes: the members left on the
//!   media assemble (old or new device in the slot) and hold every flushed write;
//! * a replace cut by a power cut resumes at its persisted checkpoint once reassembled with
//!   its replacement and completes with the right data; without its replacement it is
//!   dropped (the member stays); several replaces of different slots run at once.

use futures::executor::block_on;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use uraid_core::Level;
use uraid_engine::{BlockDev, ReplaceOutcome, Volume};
use uraid_sim::crash::{cached_dev, reassemble, reassemble_with, Clock};
use uraid_sim::rng::Rng;
use uraid_sim::{
    member_images, new_device_uuid, payload, random_range, read_all, written_images, MemDev, Model,
};

const CHUNK: u64 = 4096;
const ROWS: u64 = 48;
const LEVELS: &[(Level, usize)] = &[
    (Level::Raid1, 3),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid6, 6),
    (Level::Raid7, 7),
    (Level::Ec { parity: 4 }, 7),
];

fn written(level: Level, members: usize, seed: u64) -> (Vec<Vec<u8>>, Model) {
    written_images(level, members, CHUNK, ROWS, 60, seed)
}

/// A device for the replacement, its data area full of 0xEE (a read that used it before the
/// copy reached there would show).
fn new_dev(images: &[Vec<u8>]) -> MemDev {
    MemDev::from_image(format!("mem{}", images.len()), vec![0xEE; images[0].len()])
}

/// Every byte reads back with up to `tolerance` other members than `keep` taken away.
fn check_without_others(images: &[Vec<u8>], keep: usize, model: &Model, tolerance: usize) {
    let n = images.len();
    for lost in (0..n).filter(|&m| m != keep).take(4) {
        let mut present = vec![true; n];
        present[lost] = tolerance == 0;
        if tolerance >= 2 {
            present[(lost + 1) % n] = (lost + 1) % n == keep;
        }
        let vol = reassemble(images, &present).expect("reassembles");
        assert!(
            read_all(&vol) == model.bytes,
            "wrong data without member {lost} after replacing {keep}"
        );
    }
}

fn replace_under_load(level: Level, members: usize, slot: usize, seed: u64) {
    let (images, mut model) = written(level, members, seed);
    let vol = reassemble(&images, &vec![true; members]).expect("reassembles");
    let a = vol.array().clone();
    let old = a.member_dev(slot).unwrap().share();
    let new = new_dev(&images);
    let new_handle = new.share();
    block_on(vol.replace_member(slot, new, new_device_uuid(7))).expect("replace starts");
    assert_eq!(a.replace_state().map(|r| r.0), Some(slot));
    for m in 0..members {
        a.member_dev(m)
            .unwrap()
            .faults
            .jitter
            .store(true, Ordering::Relaxed);
    }
    let stop = AtomicBool::new(false);
    let size = vol.size();
    let mut rng = Rng::new(seed ^ 0x5eed);
    let (outcome, model) = block_on(async {
        let run = vol.replace_run(&stop);
        let client = async {
            for i in 0..80 {
                let (off, len) = random_range(&mut rng, size, 24);
                if rng.below(2) == 0 {
                    let data = payload(seed * 7777 + i, len as usize);
                    vol.write(off, data.clone()).await.unwrap();
                    model.write(off, &data);
                } else {
                    let got = vol.read(off, len).await.unwrap().to_vec();
                    assert!(
                        got == model.read(off, len),
                        "{level} replacing {slot}: read {off}+{len} differs during the replace"
                    );
                }
            }
            model
        };
        futures::join!(run, client)
    });
    assert_eq!(
        outcome.expect("replace finishes"),
        ReplaceOutcome::Replaced { slot }
    );
    assert!(a.replace_state().is_none());
    assert_eq!(a.member_dev(slot).unwrap().name(), new_handle.name());
    assert!(a.failed().is_empty() && a.rebuild_state().is_empty());
    assert!(
        read_all(&vol) == model.bytes,
        "{level}: wrong data after replace"
    );
    block_on(vol.close()).unwrap();
    let mut after = member_images(&vol);
    assert!(after[slot] == new_handle.snapshot());
    check_without_others(&after, slot, &model, a.geometry().fault_tolerance());
    // The old device is no longer the slot's: given in its place it is refused (and the
    // array assembles degraded without it).
    after[slot] = old.snapshot();
    let vol = reassemble(&after, &vec![true; members]).expect("assembles without it");
    assert!(
        vol.array().is_failed(slot),
        "{level}: the old device was taken"
    );
}

#[test]
fn replace_under_load_on_every_level() {
    for (n, &(level, members)) in LEVELS.iter().enumerate() {
        replace_under_load(level, members, 1, 11 + n as u64);
        replace_under_load(level, members, members - 1, 31 + n as u64);
    }
}

/// Chunks the old member cannot read are reconstructed from the rest of the stripe and
/// written to the new device; the old member stays within its read-error budget.
#[test]
fn unreadable_chunks_of_the_old_member_are_reconstructed() {
    for &(level, members) in &[(Level::Raid6, 6), (Level::Raid5, 4), (Level::Raid1, 3)] {
        let (images, model) = written(level, members, 3);
        let vol = reassemble(&images, &vec![true; members]).expect("reassembles");
        let a = vol.array().clone();
        let data_offset = images[0].len() as u64 - a.geometry().member_data;
        let old = a.member_dev(2).unwrap().share();
        // Three chunks' worth of the old member's data area cannot be read.
        for k in [1u64, 9, 20] {
            let lo = data_offset + k * CHUNK;
            old.faults.bad_range(lo, lo + CHUNK);
        }
        let new = new_dev(&images);
        let handle = new.share();
        block_on(vol.replace_member(2, new, new_device_uuid(9))).unwrap();
        let stop = AtomicBool::new(false);
        assert_eq!(
            block_on(vol.replace_run(&stop)).unwrap(),
            ReplaceOutcome::Replaced { slot: 2 }
        );
        assert!(!a.is_failed(2));
        block_on(vol.close()).unwrap();
        let after = member_images(&vol);
        assert!(after[2] == handle.snapshot());
        check_without_others(&after, 2, &model, a.geometry().fault_tolerance());
    }
}

/// The old member dying mid-replace: the replacement takes its slot and is rebuilt (from
/// unit 0: writes while the slot was failed did not reach it); the array ends whole.
#[test]
fn the_old_member_failing_hands_its_slot_to_the_replacement() {
    for &(level, members) in &[(Level::Raid6, 6), (Level::Raid10, 4), (Level::Raid5, 4)] {
        let (images, mut model) = written(level, members, 21);
        let vol = reassemble(&images, &vec![true; members]).expect("reassembles");
        let a = vol.array().clone();
        a.member_dev(3).unwrap().faults.kill_after(40);
        let new = new_dev(&images);
        let handle = new.share();
        block_on(vol.replace_member(3, new, new_device_uuid(3))).unwrap();
        let stop = AtomicBool::new(false);
        let mut rng = Rng::new(99);
        let size = vol.size();
        let outcome = block_on(async {
            let run = vol.replace_run(&stop);
            let client = async {
                for i in 0..40 {
                    let (off, len) = random_range(&mut rng, size, 24);
                    let data = payload(500 + i, len as usize);
                    vol.write(off, data.clone()).await.unwrap();
                    model.write(off, &data);
                }
            };
            futures::join!(run, client).0
        });
        assert_eq!(
            outcome.expect("handed over"),
            ReplaceOutcome::Rebuilding { slot: 3 }
        );
        assert_eq!(a.rebuild_state(), vec![(3, 0)]);
        assert!(read_all(&vol) == model.bytes);
        block_on(a.rebuild(&stop)).expect("rebuild");
        assert!(a.failed().is_empty() && a.rebuild_state().is_empty());
        block_on(vol.close()).unwrap();
        let after = member_images(&vol);
        assert!(after[3] == handle.snapshot());
        check_without_others(&after, 3, &model, a.geometry().fault_tolerance());
    }
}

/// The replacement dying ends the replace with the member kept and nothing failed;
/// a cancelled replace is dropped the same way; the same slot can be replaced again.
#[test]
fn a_failing_or_cancelled_replacement_leaves_the_member() {
    let (images, model) = written(Level::Raid6, 6, 8);
    let vol = reassemble(&images, &[true; 6]).expect("reassembles");
    let a = vol.array().clone();
    let new = new_dev(&images);
    new.faults.kill_after(30);
    block_on(vol.replace_member(0, new, new_device_uuid(1))).unwrap();
    let stop = AtomicBool::new(false);
    assert!(block_on(vol.replace_run(&stop)).is_err());
    assert!(a.replace_state().is_none());
    assert!(a.failed().is_empty());
    assert!(read_all(&vol) == model.bytes);
    // A second replace of the slot is refused while one runs (replaces of other slots may
    // run at once: `several_replaces_run_at_once`), and cancel.
    block_on(vol.replace_member(0, new_dev(&images), new_device_uuid(2))).unwrap();
    let e = block_on(vol.replace_member(0, new_dev(&images), new_device_uuid(4))).unwrap_err();
    assert!(e.contains("member 0 is being replaced already"), "{e}");
    stop.store(true, Ordering::Release);
    assert_eq!(
        block_on(vol.replace_run(&stop)).unwrap(),
        ReplaceOutcome::Cancelled { slot: 0 }
    );
    assert!(a.replace_state().is_none());
    let stop = AtomicBool::new(false);
    block_on(vol.replace_member(0, new_dev(&images), new_device_uuid(5))).unwrap();
    assert_eq!(
        block_on(vol.replace_run(&stop)).unwrap(),
        ReplaceOutcome::Replaced { slot: 0 }
    );
    assert!(read_all(&vol) == model.bytes);
}

/// What `replace_until_cut` leaves: the media (None: the power never went), the model of
/// the flushed writes, the write in flight at the cut, the operations counted, and whether
/// the replace finished.
struct CutRun {
    media: Option<Vec<Vec<u8>>>,
    model: Model,
    torn: Option<(u64, u64)>,
    ops: u64,
    replaced: bool,
}

/// Runs a replace of `slot` under writes (each followed by a FLUSH) on members with
/// volatile caches until the power goes at member operation `cut` (0: never). Returns the
/// media afterwards (members, then the replacement), the model of every write whose FLUSH
/// returned, the range of the write in flight at the cut, and the operations counted.
fn replace_until_cut(images: &[Vec<u8>], model: &Model, slot: usize, cut: u64) -> CutRun {
    replace_until_cut_with(images, model, slot, cut, None)
}

/// `replace_until_cut`, the copy checkpoint persisted every `persist_every` (None: the
/// default, through `replace_run`).
fn replace_until_cut_with(
    images: &[Vec<u8>],
    model: &Model,
    slot: usize,
    cut: u64,
    persist_every: Option<Duration>,
) -> CutRun {
    let clock = Clock::new(cut, cut);
    let n = images.len();
    // Every operation yields (and writes a varying number of extra times), so the client's
    // writes and flushes interleave with every step of the replace.
    let interleaved = |d: MemDev| {
        d.faults.jitter.store(true, Ordering::Relaxed);
        d.faults.yield_ops.store(true, Ordering::Relaxed);
        d
    };
    let vol = reassemble_with(images, &vec![true; n], |i, img| {
        interleaved(cached_dev(format!("mem{i}"), img, &clock))
    })
    .expect("reassembles");
    let new = interleaved(cached_dev(
        format!("mem{n}"),
        vec![0xEE; images[0].len()],
        &clock,
    ));
    let mut model = Model {
        bytes: model.bytes.clone(),
    };
    let mut torn = None;
    let mut replaced = false;
    if block_on(vol.replace_member(slot, new, new_device_uuid(6))).is_ok() {
        let stop = AtomicBool::new(false);
        let mut rng = Rng::new(0xabc);
        let size = vol.size();
        let done = AtomicBool::new(false);
        let (r, _) = block_on(async {
            let run = async {
                let r = match persist_every {
                    None => vol.replace_run(&stop).await,
                    Some(every) => vol.replace_run_slot(slot, &stop, every).await,
                };
                done.store(true, Ordering::Release);
                r
            };
            let client = async {
                // Writes until the replace has ended, and a few after.
                let mut after = 0;
                for i in 0..400 {
                    if done.load(Ordering::Acquire) {
                        after += 1;
                        if after > 3 {
                            break;
                        }
                    }
                    let (off, len) = random_range(&mut rng, size, 24);
                    let data = payload(cut * 100 + i, len as usize);
                    let ok =
                        vol.write(off, data.clone()).await.is_ok() && vol.flush().await.is_ok();
                    if !ok {
                        torn = Some((off, len));
                        break;
                    }
                    model.write(off, &data);
                }
            };
            futures::join!(run, client)
        });
        replaced = r == Ok(ReplaceOutcome::Replaced { slot });
    }
    CutRun {
        media: clock.images(),
        model,
        torn,
        ops: clock.ops(),
        replaced,
    }
}

/// Power cuts at every member operation of whole replaces under flushed writes, on three
/// levels: the media
/// (old member, other members and the replacement all given) assemble, with the old device
/// or the new one in the slot, and every flushed write reads back. A cut after the swap
/// round finds the new device in the slot; before it, the old one.
#[test]
fn power_cuts_during_a_replace_lose_no_flushed_write() {
    for &(level, members, slot) in &[
        (Level::Raid6, 6, 2),
        (Level::Raid5, 4, 0),
        (Level::Raid10, 4, 3),
    ] {
        let (images, model) = written(level, members, 41);
        let full = replace_until_cut(&images, &model, slot, 0);
        assert!(full.replaced, "{level}: the uncut run replaces");
        let total = full.ops;
        let (mut saw_old, mut saw_new) = (0, 0);
        // Every member operation of the run is a cut point (a few hundred).
        for cut in 1..total {
            let run = replace_until_cut(&images, &model, slot, cut);
            let (want, torn) = (run.model, run.torn);
            let mut media = run.media.expect("the power went");
            // Every device is given; assembly decides which one is the slot's member. Odd
            // cuts put the replacement first (in the slot's place, the old member last), so
            // a tie between the two would go the wrong way.
            if cut % 2 == 1 {
                media.swap(slot, members);
            }
            let vol = reassemble(&media, &vec![true; members + 1]).unwrap_or_else(|e| {
                panic!("{level}: a cut at op {cut} of {total} does not assemble: {e}")
            });
            let a = vol.array().clone();
            assert!(
                a.failed().is_empty(),
                "{level}: cut at {cut}: slot left without a member ({:?})",
                a.failed()
            );
            let new_name = format!("mem{}", if cut % 2 == 1 { slot } else { members });
            if a.member_dev(slot).unwrap().name() == new_name {
                saw_new += 1;
            } else {
                saw_old += 1;
            }
            let got = read_all(&vol);
            for (k, (g, w)) in got.iter().zip(want.bytes.iter()).enumerate() {
                let in_torn = torn.is_some_and(|(o, l)| (k as u64) >= o && (k as u64) < o + l);
                assert!(
                    in_torn || g == w,
                    "{level}: cut at op {cut} of {total}: byte {k} lost (torn write {torn:?})"
                );
            }
        }
        assert!(
            saw_old >= 1 && saw_new >= 1,
            "{level}: cuts found the old device {saw_old} times, the new {saw_new}"
        );
    }
}

/// Another member, or the replacement itself, dying at each of its last operations of a
/// replace (so also inside the swap round, whose superblock writes may go round twice): the
/// array keeps serving, and afterwards — writes made after the replace included — the
/// devices assemble (old and new given, in both orders) with every byte in place: the old
/// device is never named with the new one's identity, and a replacement that failed is
/// never taken for a member that missed writes.
#[test]
fn a_device_dying_during_the_swap_leaves_the_right_member_named() {
    let (images, model) = written(Level::Raid6, 6, 13);
    let (slot, other) = (1, 4);
    // Operations of each device over a whole replace.
    let count = |which: usize| {
        let vol = reassemble(&images, &[true; 6]).expect("reassembles");
        let new = new_dev(&images);
        let h = new.share();
        let o = vol.array().member_dev(other).unwrap().share();
        block_on(vol.replace_member(slot, new, new_device_uuid(3))).unwrap();
        let stop = AtomicBool::new(false);
        block_on(vol.replace_run(&stop)).unwrap();
        let d = if which == 0 { &o } else { &h };
        d.faults.ops.load(Ordering::SeqCst)
    };
    for which in 0..2 {
        let total = count(which);
        for k in total.saturating_sub(14)..=total + 1 {
            let vol = reassemble(&images, &[true; 6]).expect("reassembles");
            let a = vol.array().clone();
            let originals: Vec<MemDev> = (0..6).map(|m| a.member_dev(m).unwrap().share()).collect();
            let new = new_dev(&images);
            let handle = new.share();
            let dying = if which == 0 {
                &originals[other]
            } else {
                &handle
            };
            let before = dying.faults.ops.load(Ordering::SeqCst);
            dying.faults.kill_after((k - before.min(k)) as i64 + 1);
            if block_on(vol.replace_member(slot, new, new_device_uuid(4))).is_err() {
                continue;
            }
            let stop = AtomicBool::new(false);
            let _ = block_on(vol.replace_run(&stop));
            let swapped = a.member_dev(slot).map(|d| d.name()) == Some(handle.name());
            // A replacement that dies before it was swapped in never costs the member.
            assert!(
                which == 0 || swapped || !a.is_failed(slot),
                "replacement dying at op {k} of {total}: the healthy member {slot} was failed"
            );
            // As a power cut right after the replace would leave the media, and again after
            // a write that only the slot's device of the end holds.
            let check = |stage: &str, want: &Model| {
                let mut media: Vec<Vec<u8>> = originals.iter().map(|d| d.snapshot()).collect();
                media.push(handle.snapshot());
                for order in 0..2 {
                    let mut m = media.clone();
                    if order == 1 {
                        m.swap(slot, 6);
                    }
                    let what = format!(
                        "device {which} dying at op {k} of {total}, {stage}, order {order}"
                    );
                    let v = reassemble(&m, &[true; 7])
                        .unwrap_or_else(|e| panic!("{what}: does not assemble: {e}"));
                    // The slot's device at the end is the one named (or the slot is left
                    // out); never the other.
                    let new_name = format!("mem{}", if order == 1 { slot } else { 6 });
                    if let Some(n) = v.array().member_dev(slot).map(|d| d.name().to_string()) {
                        assert_eq!(
                            n == new_name,
                            swapped,
                            "{what}: slot {slot} assembled from {n}"
                        );
                    }
                    // Every block that reads (a degraded dirty stripe may be refused) is right.
                    let mut off = 0;
                    while off < v.size() {
                        if let Ok(b) = block_on(v.read(off, CHUNK)) {
                            assert!(
                                b.to_vec() == want.read(off, CHUNK),
                                "{what}: wrong data at {off}"
                            );
                        }
                        off += CHUNK;
                    }
                }
            };
            check("right after the replace", &model);
            let _ = block_on(a.rebuild(&stop));
            let mut want = Model {
                bytes: model.bytes.clone(),
            };
            let late = payload(900 + k, 64 << 10);
            block_on(vol.write(8192, late.clone())).expect("serves after the replace");
            want.write(8192, &late);
            assert!(
                read_all(&vol) == want.bytes,
                "k {k}: wrong data while serving"
            );
            block_on(vol.flush()).expect("flush");
            check("after a later write", &want);
        }
    }
}

/// A reassembled volume, the model it must read back (but for the torn range), the range of
/// the write in flight at the cut, and the media it came from.
type Reassembled = (
    std::sync::Arc<uraid_engine::Volume<MemDev>>,
    Model,
    Option<(u64, u64)>,
    Vec<Vec<u8>>,
);

/// The torn write's range as it reads now goes into `want` (either version of a write in
/// flight at the cut may read back). Called after a recorded replace was resumed or
/// dropped, as a server serves only then: with resync due, the first read writes a
/// superblock round (the served set), and a round drops a replace record whose
/// replacement is not attached.
fn settle_torn(vol: &Volume<MemDev>, want: &mut Model, torn: Option<(u64, u64)>) {
    if let Some((o, l)) = torn {
        let got = block_on(vol.read(o, l))
            .expect("the torn range reads")
            .to_vec();
        want.write(o, &got);
    }
}

/// The media of a replace of `slot` cut by a power cut at member operation `cut`, the copy
/// checkpoint persisted after every batch, reassembled with every device (members, then the
/// replacement: `present` says which are given). Returns the volume, the model of what must
/// read back (flushed writes: `settle_torn` adds the torn write's range), and the media.
fn cut_and_reassemble(
    images: &[Vec<u8>],
    model: &Model,
    slot: usize,
    cut: u64,
    present: &[bool],
) -> Option<Reassembled> {
    let run = replace_until_cut_with(images, model, slot, cut, Some(Duration::ZERO));
    let media = run.media?;
    let given: Vec<Vec<u8>> = media
        .iter()
        .zip(present)
        .filter(|(_, &p)| p)
        .map(|(m, _)| m.clone())
        .collect();
    let vol = reassemble(&given, &vec![true; given.len()])
        .unwrap_or_else(|e| panic!("cut at {cut}: does not assemble: {e}"));
    Some((vol, run.model, run.torn, media))
}

/// A replace cut by a power cut (the array dropped mid-copy, no clean stop) resumes at its
/// persisted checkpoint when the devices are reassembled with the replacement: it walks
/// only what the checkpoint does not cover (plus the units the write-intent bitmap marks
/// dirty below it), completes, and the new member holds exactly the right data (read
/// with other members taken away).
#[test]
fn a_replace_cut_by_a_crash_resumes_at_its_checkpoint() {
    let (level, members, slot) = (Level::Raid6, 6, 2);
    let (images, model) = written(level, members, 43);
    let full = replace_until_cut_with(&images, &model, slot, 0, Some(Duration::ZERO));
    assert!(full.replaced, "the uncut run replaces");
    let units = reassemble(&images, &[true; 6]).unwrap().geometry().units();
    let mut partway = 0;
    for k in 3..9 {
        let cut = full.ops * k / 10;
        let Some((vol, mut want, torn, media)) =
            cut_and_reassemble(&images, &model, slot, cut, &[true; 7])
        else {
            continue;
        };
        let a = vol.array().clone();
        let Some(&(s, uuid, copied)) = a.resumable_replaces().first() else {
            // Cut before the replace was recorded, or after its swap.
            continue;
        };
        assert_eq!(s, slot);
        assert!(a.failed().is_empty(), "cut at {cut}: {:?}", a.failed());
        let dev = MemDev::from_image(format!("mem{members}"), media[members].clone());
        let handle = dev.share();
        block_on(vol.resume_replace(slot, dev, uuid)).expect("the replace resumes");
        assert_eq!(a.replace_state().map(|r| r.0), Some(slot));
        settle_torn(&vol, &mut want, torn);
        let stop = AtomicBool::new(false);
        // The cut left the array unclean: resync, as a server starts it (after the resume;
        // its writes reach the replacement too).
        if a.needs_resync() {
            block_on(a.resync(&stop)).expect("resync");
        }
        assert_eq!(
            block_on(vol.replace_run_slot(slot, &stop, Duration::ZERO)).unwrap(),
            ReplaceOutcome::Replaced { slot },
            "cut at {cut}"
        );
        let walked = a.replace_progress_of(slot).total;
        if copied > 0 {
            partway += 1;
            assert!(
                walked < units,
                "cut at {cut}: checkpoint {copied}, but the resumed copy walked {walked} of \
                 {units} units"
            );
        }
        assert!(read_all(&vol) == want.bytes, "cut at {cut}: wrong data");
        block_on(vol.close()).unwrap();
        let after = member_images(&vol);
        assert!(after[slot] == handle.snapshot());
        check_without_others(&after, slot, &want, 2);
    }
    assert!(partway >= 2, "only {partway} cuts resumed past unit 0");
}

/// A replace recorded in the superblocks whose replacement is not given at the next start
/// is dropped: the member stays, the record is cleared, and the replacement given later is
/// refused (its copy missed what was written meanwhile).
#[test]
fn a_replace_whose_replacement_is_missing_at_restart_is_dropped() {
    let (level, members, slot) = (Level::Raid6, 6, 4);
    let (images, model) = written(level, members, 47);
    let full = replace_until_cut_with(&images, &model, slot, 0, Some(Duration::ZERO));
    let mut present = vec![true; members + 1];
    present[members] = false;
    let mut tried = 0;
    for k in [4, 5, 6] {
        let cut = full.ops * k / 10;
        let Some((vol, mut want, torn, media)) =
            cut_and_reassemble(&images, &model, slot, cut, &present)
        else {
            continue;
        };
        let a = vol.array().clone();
        if a.resumable_replaces().is_empty() {
            continue;
        }
        tried += 1;
        block_on(a.drop_unresumed_replaces());
        settle_torn(&vol, &mut want, torn);
        assert!(a.resumable_replaces().is_empty());
        assert!(a.replace_state().is_none() && a.failed().is_empty());
        assert!(read_all(&vol) == want.bytes, "cut at {cut}: wrong data");
        // A write the replacement never saw.
        let late = payload(700 + k, 32 << 10);
        block_on(vol.write(4096, late.clone())).unwrap();
        want.write(4096, &late);
        block_on(vol.close()).unwrap();
        let mut after = member_images(&vol);
        after.push(media[members].clone());
        let vol = reassemble(&after, &[true; 7]).expect("reassembles");
        let a = vol.array();
        assert!(
            a.resumable_replaces().is_empty(),
            "cut at {cut}: the dropped replace came back"
        );
        assert_eq!(a.member_dev(slot).unwrap().name(), format!("mem{slot}"));
        assert!(a.failed().is_empty());
        assert!(
            read_all(&vol) == want.bytes,
            "cut at {cut}: wrong data after"
        );
    }
    assert!(tried >= 1, "no cut left a replace recorded");
}

/// Replaces of two slots run at once under client reads and writes, each with its own
/// progress in status; a second replace of a slot being replaced is refused. Both end
/// replaced and each new member holds exactly its data.
#[test]
fn several_replaces_run_at_once() {
    let (level, members) = (Level::Raid6, 6);
    let (images, mut model) = written(level, members, 17);
    let vol = reassemble(&images, &[true; 6]).expect("reassembles");
    let a = vol.array().clone();
    let one = MemDev::from_image("mem6", vec![0xEE; images[0].len()]);
    let two = MemDev::from_image("mem7", vec![0xEE; images[0].len()]);
    let (h1, h2) = (one.share(), two.share());
    block_on(vol.replace_member(1, one, new_device_uuid(21))).unwrap();
    block_on(vol.replace_member(4, two, new_device_uuid(22))).unwrap();
    let e = block_on(vol.replace_member(4, new_dev(&images), new_device_uuid(23))).unwrap_err();
    assert!(e.contains("member 4 is being replaced already"), "{e}");
    assert_eq!(
        a.replace_states(),
        vec![(1, "mem6".to_string()), (4, "mem7".to_string())]
    );
    for m in 0..members {
        a.member_dev(m)
            .unwrap()
            .faults
            .jitter
            .store(true, Ordering::Relaxed);
    }
    let stop = AtomicBool::new(false);
    let size = vol.size();
    let mut rng = Rng::new(0x2a2a);
    let (r1, r2, model) = block_on(async {
        let client = async {
            let st = a.status();
            let shown: Vec<usize> = st.replaces().iter().map(|r| r.0).collect();
            assert_eq!(shown, vec![1, 4], "status shows both replaces");
            for i in 0..80 {
                let (off, len) = random_range(&mut rng, size, 24);
                if rng.below(2) == 0 {
                    let data = payload(4242 + i, len as usize);
                    vol.write(off, data.clone()).await.unwrap();
                    model.write(off, &data);
                } else {
                    let got = vol.read(off, len).await.unwrap().to_vec();
                    assert!(got == model.read(off, len), "read {off}+{len} differs");
                }
            }
            model
        };
        futures::join!(
            vol.replace_run_slot(1, &stop, Duration::ZERO),
            vol.replace_run_slot(4, &stop, Duration::ZERO),
            client
        )
    });
    assert_eq!(r1.unwrap(), ReplaceOutcome::Replaced { slot: 1 });
    assert_eq!(r2.unwrap(), ReplaceOutcome::Replaced { slot: 4 });
    assert!(a.replace_states().is_empty());
    assert_eq!(a.replace_progress_of(1).total, a.geometry().units());
    assert_eq!(a.member_dev(1).unwrap().name(), "mem6");
    assert_eq!(a.member_dev(4).unwrap().name(), "mem7");
    assert!(read_all(&vol) == model.bytes);
    block_on(vol.close()).unwrap();
    let after = member_images(&vol);
    assert!(after[1] == h1.snapshot() && after[4] == h2.snapshot());
    check_without_others(&after, 1, &model, 2);
    check_without_others(&after, 4, &model, 2);
}

/// Yields once to the executor (the client side of a test that waits on a walk).
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// A replace stopped with the server (`keep_replaces_on_stop`, as SIGTERM does) is kept:
/// its checkpoint is recorded, the replacement stays attached until the clean close, and
/// the next start given the replacement resumes it from that checkpoint to the end.
#[test]
fn a_replace_stopped_with_the_server_resumes_at_the_next_start() {
    let (images, model) = written(Level::Raid5, 4, 29);
    let vol = reassemble(&images, &[true; 4]).expect("reassembles");
    let a = vol.array().clone();
    let units = a.geometry().units();
    for m in 0..4 {
        let f = &a.member_dev(m).unwrap().faults;
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let new = new_dev(&images);
    let handle = new.share();
    let uuid = new_device_uuid(31);
    block_on(vol.replace_member(1, new, uuid)).unwrap();
    a.keep_replaces_on_stop();
    let stop = AtomicBool::new(false);
    let (o, ()) = block_on(async {
        futures::join!(vol.replace_run_slot(1, &stop, Duration::ZERO), async {
            while a.replace_progress_of(1).done < units / 2 {
                YieldOnce(false).await;
            }
            stop.store(true, Ordering::Release);
        })
    });
    assert_eq!(o.unwrap(), ReplaceOutcome::Stopped { slot: 1 });
    assert_eq!(a.replace_state().map(|r| r.0), Some(1), "still attached");
    block_on(vol.close()).unwrap();
    let mut media = member_images(&vol);
    media.push(handle.snapshot());
    let vol = reassemble(&media, &[true; 5]).expect("reassembles");
    let a = vol.array().clone();
    let recorded = a.resumable_replaces();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let (slot, u, copied) = recorded[0];
    assert_eq!((slot, u), (1, uuid));
    assert!(
        copied >= units / 2 && copied < units,
        "checkpoint {copied} of {units}"
    );
    let dev = MemDev::from_image("mem4", media[4].clone());
    let h = dev.share();
    block_on(vol.resume_replace(1, dev, uuid)).expect("resumes");
    let stop = AtomicBool::new(false);
    assert_eq!(
        block_on(vol.replace_run_slot(1, &stop, Duration::ZERO)).unwrap(),
        ReplaceOutcome::Replaced { slot: 1 }
    );
    // Clean stop: exactly what the checkpoint did not cover was walked.
    assert_eq!(a.replace_progress_of(1).total, units - copied);
    assert!(read_all(&vol) == model.bytes);
    block_on(vol.close()).unwrap();
    let after = member_images(&vol);
    assert!(after[1] == h.snapshot());
    check_without_others(&after, 1, &model, 1);
}
