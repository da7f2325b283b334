//! Power-cut trials: seeded concurrent workloads on members with volatile write caches, the
//! power cut at a random member operation (superblock rounds, failure handling and map
//! persistence included), the array reassembled from what the members' media held, every
//! sector checked against the history (`uraid_sim::crash`). `URAID_CRASH_TRIALS=N` sets the
//! trials per case for a soak (default below).

use uraid_core::Level;
use uraid_sim::crash::{run_trial, run_two_stage, TrialConfig};

fn trials(default: u64) -> u64 {
    std::env::var("URAID_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const LEVELS: [(Level, usize); 7] = [
    (Level::Raid0, 3),
    (Level::Raid1, 2),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid6, 6),
    (Level::Raid7, 6),
    (Level::Ec { parity: 4 }, 7),
];

fn config(level: Level, members: usize, seed: u64) -> TrialConfig {
    TrialConfig {
        level,
        members,
        chunk: 4096,
        rows: 8,
        seed,
        tasks: 4,
        ops_per_task: 14,
        fail_members: false,
        lose_after: 0,
        resync: false,
    }
}

fn run_cases(name: &str, per_level: u64, tweak: impl Fn(&mut TrialConfig)) {
    let mut ran = 0;
    let mut acked = 0;
    let mut hole = 0;
    for (li, &(level, members)) in LEVELS.iter().enumerate() {
        for t in 0..per_level {
            let mut cfg = config(level, members, 1 + li as u64 * 1_000_003 + t);
            tweak(&mut cfg);
            match run_trial(&cfg, None) {
                Ok(r) => {
                    ran += 1;
                    acked += r.acked_writes;
                    hole += r.hole_sectors;
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }
    println!(
        "{name}: {ran} crash trials passed ({acked} acknowledged writes checked; {hole} \
         sectors of torn stripes on degraded parity arrays exempt: the write hole, issue 10)"
    );
}

/// Power cut at a random moment, every member present afterwards.
#[test]
fn power_cut_loses_no_flushed_write() {
    run_cases("power cut", trials(200), |_| {});
}

/// Members fail during the workload (within tolerance), then the power is cut: crashes land
/// inside failure handling and its superblock rounds.
#[test]
fn power_cut_during_member_failures() {
    run_cases("power cut with failures", trials(150), |c| {
        c.fail_members = true;
        c.ops_per_task = 18;
    });
}

/// The RAID write hole: power cut, then one member lost before reassembly. A stripe whose
/// update the cut tore has parity that does not match its data, and rebuilding the lost
/// member's chunk from it can return garbage for data flushed long before. That is issue
/// 10's (write-intent bitmap + resync, journal). Every trial must still pass everything
/// else (assembly, every sector of present members and of untouched stripes exact); the
/// wrong sectors of torn stripes on the lost member are counted, and the test fails if
/// there are none, so that the fix turns it into a must-pass test instead of leaving it
/// silently green.
#[test]
fn write_hole_power_cut_then_member_lost_is_open() {
    let mut with_hole = 0;
    let mut sectors = 0;
    let mut total = 0;
    for (li, &(level, members)) in LEVELS.iter().enumerate().skip(3) {
        for t in 0..trials(60) {
            let mut cfg = config(level, members, 77 + li as u64 * 7919 + t);
            cfg.lose_after = 1;
            total += 1;
            match run_trial(&cfg, None) {
                Ok(r) if r.hole_sectors > 0 => {
                    with_hole += 1;
                    sectors += r.hole_sectors;
                    // The product never serves this state unasked: it is dirty and degraded.
                    assert_eq!(
                        r.dirty_degraded_refused,
                        Some(true),
                        "{cfg:?}: wrong data after a power cut and a member loss, and serve \
                         would start it without --start-dirty-degraded"
                    );
                }
                Ok(_) => {}
                Err(e) => panic!("beyond the write hole: {e}"),
            }
        }
    }
    println!(
        "write hole (expected until issue 10): {with_hole} of {total} trials returned wrong \
         data ({sectors} sectors) after a power cut and the loss of one member"
    );
    assert!(
        with_hole > 0,
        "the write hole no longer reproduces: make this a must-pass test (issue 10)"
    );
}

/// The write hole closed: power cut, reassembly with every member and a resync to the end
/// (what `uraid serve` does after an unclean stop), then one member lost: every sector must
/// be right, with no exemption, on every parity level.
#[test]
fn write_hole_is_closed_by_resync_before_a_member_is_lost() {
    let mut n = 0;
    for (li, &(level, members)) in LEVELS.iter().enumerate().skip(3) {
        for t in 0..trials(60) {
            let mut cfg = config(level, members, 77 + li as u64 * 7919 + t);
            cfg.lose_after = 1;
            cfg.resync = true;
            let r = run_trial(&cfg, None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.hole_sectors, 0);
            n += 1;
        }
    }
    println!("{n} trials: power cut, resync, member lost: no wrong sector");
}

/// Mirrors too: after a resync every copy of every row is the same, so any one may be lost.
#[test]
fn mirror_copies_agree_after_resync() {
    for (li, &(level, members)) in LEVELS.iter().enumerate().take(3) {
        if !matches!(level, Level::Raid1 | Level::Raid10) {
            continue;
        }
        for t in 0..trials(20) {
            let mut cfg = config(level, members, 4242 + li as u64 * 31 + t);
            cfg.lose_after = 1;
            cfg.resync = true;
            run_trial(&cfg, None).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// Two power cuts in a row, both among the first operations of their session (superblock
/// rounds, first fills), every pair of points: whatever the first cut left must survive a
/// torn round of the next session. (Writing the slot `events % 2` fails this: a member
/// that missed the first round loses its only valid superblock in the second.)
#[test]
fn two_power_cuts_in_a_row() {
    let mut n = 0;
    for (li, (level, members)) in [(Level::Raid0, 3usize), (Level::Raid5, 4), (Level::Raid6, 6)]
        .into_iter()
        .enumerate()
    {
        for seed in 0..trials(1) {
            let mut cfg = config(level, members, 900 + li as u64 * 100 + seed);
            cfg.ops_per_task = 3;
            // Stage 1: inside its first round (two member ops each); stage 2: inside the
            // catch-up of members left behind and its first round.
            for crash1 in 1..=2 * members as u64 {
                for crash2 in 1..=2 * members as u64 + 4 {
                    if let Err(e) = run_two_stage(&cfg, crash1, Some(crash2)) {
                        panic!("{e}");
                    }
                    n += 1;
                }
            }
        }
    }
    println!("{n} double power cuts passed");
}

/// Every crash point of the first operations of short workloads, exhaustively: the first
/// superblock round (dirty), the first fills and their map pages. A round torn on every
/// member at once must still assemble (two superblock slots), and a page torn on every copy
/// must still read (per-sector map checksums).
#[test]
fn every_early_crash_point() {
    let mut n = 0;
    for (li, &(level, members)) in LEVELS.iter().enumerate() {
        for seed in 0..trials(4) {
            let mut cfg = config(level, members, 500 + li as u64 * 100 + seed);
            cfg.ops_per_task = 4;
            for crash_at in 1..=(4 * members as u64 + 12) {
                if let Err(e) = run_trial(&cfg, Some(crash_at)) {
                    panic!("{e}");
                }
                n += 1;
            }
        }
    }
    println!("{n} early crash points passed");
}

/// Bug 3 of the foundation issue: a second writer into a granule whose fill is still
/// persisting its map page must not be acknowledged (nor its FLUSH) before the page is
/// written. The page write is slowed down on purpose; the second writer writes and flushes
/// meanwhile, then the power goes: its data must read back after reassembly.
#[test]
fn second_writer_waits_for_the_fill_page() {
    use futures::executor::block_on;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use uraid_sim::crash::{cached_volume, reassemble, Clock};
    for level in [Level::Raid5, Level::Raid1, Level::Raid0] {
        let clock = Clock::new(0, 9);
        let (vol, faults) = cached_volume(level, 3, 4096, 8, &clock);
        for f in &faults {
            f.yield_ops.store(true, Ordering::Relaxed);
            f.slow_meta_writes.store(200, Ordering::Relaxed);
        }
        let b_done = std::cell::Cell::new(false);
        let a_done = std::cell::Cell::new(false);
        let a = async {
            let _ = vol.write(0, Arc::new(vec![0xAA; 512])).await;
            a_done.set(true);
        };
        let b = async {
            // B arrives the moment the granule shows as allocated (or A is done).
            while !a_done.get() && !vol.allocation(0, 512).unwrap()[0].allocated {
                uraid_engine::reactor::yield_now().await;
            }
            vol.write(1024, Arc::new(vec![0xBB; 512])).await.unwrap();
            vol.flush().await.unwrap();
            b_done.set(true);
            clock.power_cut();
        };
        block_on(futures::future::join(a, b));
        assert!(b_done.get());
        let images = clock.images().unwrap();
        let back = reassemble(&images, &[true; 3]).unwrap();
        let got = block_on(back.read(1024, 512)).unwrap().to_vec();
        assert!(
            got.iter().all(|&x| x == 0xBB),
            "{level}: a write acknowledged and flushed read back as {:#x}",
            got[0]
        );
    }
}
