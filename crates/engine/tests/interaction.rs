//! The interaction simulator (`uraid_sim::interaction`): seeded runs that drive the whole
//! engine on its reactors with every fault class mixed in. A bounded number of seeds here;
//! `scripts/soak.sh` runs many more and prints the seed of any failure
//! (`URAID_SIM_SEED=N cargo test -p uraid-engine --test interaction one_seed` reruns one).

use uraid_sim::interaction::{run, run_seed, SimConfig};

/// Seeds that fail on a known, open bug: left out of the CI range (`seeds`), run by the
/// ignored `open_findings_still_failing`. None today.
const OPEN_FINDINGS: &[u64] = &[];

/// Closed finding: 68923 (RAID6, no journal) read stripe 14's old bytes in stage 3 where
/// stage 2 had served a torn write's new ones. The stripe was torn at stage 1's cut with the
/// new bytes on member 2; stage 2 (resync still due when it ended) served them from member
/// 2, then the operator failed it; in stage 3 member 2 counted as "unseen" (per session),
/// so `verify_unsynced` found the other five consistent, marked the stripe synced, and the
/// rebuild of slot 2 decoded the old bytes. Fixed: the superblocks record which slots served
/// reads while resync was due (format version 8, `served`), and no later session decodes
/// around them on an unsynced stripe (test resync.rs
/// `a_member_that_served_a_torn_stripe_is_never_decoded_around_in_a_later_session`).
const SERVED_ACROSS_SESSIONS: &[u64] = &[68923];

/// Closed finding: wrong bytes after reassembly in 30 of the 11,550 seeds of
/// `scripts/soak.sh 9 5000` (RAID6, ec with 3 parities, RAID5; with and without a journal).
/// A member failed after it had served, so the spare-parity check could not vouch for its
/// chunks, while stripes waited for resync; a write into a torn one was planned as a
/// reconstruct-write, decoded the failed member's chunk from the stale parity and encoded
/// new parity from it. The stripe became a codeword around the wrong decode, and after the
/// next assembly (the member absent, hence "unseen") the check passed it and a read served
/// bytes never written. Fixed: on an unsynced stripe no decoded chunk feeds parity (such a
/// write is refused, like a read of the chunk); test
/// resync.rs `a_write_into_an_unsynced_degraded_stripe_never_encodes_a_decode_into_parity`.
/// 12739 was the simulator's own: its leave-one-out check left out the only member that held
/// the newest superblock (a round the power cut short), and refused assembly is right then.
const UNSYNCED_DEGRADED_WRITE: &[u64] = &[
    6783, 6824, 6852, 6891, 7259, 7718, 7915, 8426, 8466, 8761, 9374, 10018, 10033, 10148, 10676,
    10753, 10968, 11063, 11245, 11563, 12070, 12170, 12498, 12662, 12739, 13675, 15466, 15661,
    16016, 16259,
];

/// Closed finding: a new member's fill read back after a power cut (26233 RAID5, 35945
/// RAID6, 34172 ec with 3 parities; each in a stage whose rebuild skipped units). A trim
/// clears a granule's map bit with its page written, not flushed; a rebuild (or a replace's
/// copy) skipped the hole, and its completion round flushed the new member and wrote the
/// superblocks. A cut in that round kept the new member's "rebuilt" while the others lost
/// the cached clear: the bit came back and the unit read the new member's stale bytes.
/// Fixed: every live member is flushed before a walk's checkpoint or completion is recorded
/// (test rebuild.rs `a_walk_that_skipped_a_trimmed_unit_is_recorded_only_after_the_trim_is_durable`).
/// 34172 failed every time only with a read-modify-write preference on unsynced stripes,
/// which changed the timing; 26233 and 35945 did not fail again when rerun.
const SKIPPED_HOLE: &[u64] = &[26233, 34172, 35945];

/// Closed finding (the durability issue's "rebuild decodes unsynced units"): with no journal
/// in service, a member lost while stripes wait for resync and a device added into its slot,
/// the rebuild decoded those stripes from parity that may not match and then served the
/// result where the promise is EIO. Seeds that showed it: 159 (RAID5), 196 (EC 3 parities),
/// 290 (RAID5, journal failed earlier). Fixed by the bad-block lists: the rebuild records
/// such a chunk bad unless a spare parity confirms its decode (recovery/rebuild.rs), and
/// `rebuild_unsynced` is now on in every seeded run. Kept under its old name.
///
/// 29 (RAID6, no journal): a replace whose old member died became a rebuild of slot 4;
/// after a cut with resync due the operator failed member 0. Stripe 8 was torn (P stale)
/// and slot 4 holds its Q: the rebuild decoded member 0's chunk from the stale P, encoded Q
/// from it and wrote it, and rewrote P to match, so the torn stripe looked consistent and
/// served the wrong decode. Fixed: every data chunk decoded on an unsynced unit needs the
/// spare-parity confirmation, whether it is written or only feeds parity.
const REBUILD_UNSYNCED: &[u64] = &[159, 196, 290, 29];

/// Closed finding: 153130 (3 data + 3 parity chunks; resync due, member 4 rebuilt onto a
/// spare with bad blocks recorded, member 0 with a media error) never finished a
/// client write to stripe 4. The write's first plan (a reconstruct-write that would decode
/// on the unsynced stripe) was refused and planned again with the members resync had
/// noted unreadable let back in; member 4 was one of them but also behind (its chunk on the
/// bad-block list), so every later plan fetched it, `fetch_data` decoded it instead, and
/// the unplanned decode made the plan again, forever. Fixed: members behind are never let
/// back in, and every plan sees the members that went behind. Run with a time limit: a hang
/// is the failure.
const PLAN_SEES_BEHIND: &[u64] = &[153130];

/// `run_seed`, failing (instead of hanging the test) if the seed does not finish within
/// `limit`.
fn run_seed_within(seed: u64, limit: std::time::Duration) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_seed(seed).map(|_| ()));
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(_) => Err(format!(
            "seed {seed}: did not finish within {limit:?} (a hang)"
        )),
    }
}

#[test]
fn open_findings() {
    let failing: Vec<String> =
        REBUILD_UNSYNCED
            .iter()
            .filter_map(|&seed| {
                let cfg = SimConfig {
                    rebuild_unsynced: true,
                    ..SimConfig::from_seed(seed)
                };
                run(&cfg).err()
            })
            .chain(
                UNSYNCED_DEGRADED_WRITE
                    .iter()
                    .chain(SKIPPED_HOLE)
                    .chain(SERVED_ACROSS_SESSIONS)
                    .filter_map(|&seed| run_seed(seed).err()),
            )
            .chain(PLAN_SEES_BEHIND.iter().filter_map(|&seed| {
                run_seed_within(seed, std::time::Duration::from_secs(120)).err()
            }))
            .collect();
    assert!(failing.is_empty(), "{}", failing.join("\n\n"));
}

/// The seeds in `OPEN_FINDINGS`, which fail today: ignored until fixed (run with
/// `--ignored`).
#[test]
#[ignore]
fn open_findings_still_failing() {
    let failing: Vec<String> = OPEN_FINDINGS
        .iter()
        .filter_map(|&seed| run_seed(seed).err())
        .collect();
    assert!(failing.is_empty(), "{}", failing.join("\n\n"));
}

/// Regression: journal replay wrote records made before a member failed onto the device
/// that took the slot since, undoing its rebuild. The sequence (the issue's): RAID5 with a
/// journal; record R1 writes stripe 0 including slot 2; slot 2 fails; record R2 writes the
/// stripe again and leaves slot 2 out; a new device takes slot 2 and the rebuild writes the
/// right chunk to it; the power goes before the journal's next checkpoint. Replay then wrote
/// R1's slot-2 entry over the rebuilt chunk: stale data, or parity that no longer matches (a
/// read with another member left out). Found by the simulator (seeds 266 and 67 of
/// `SimConfig::journal_focus`); fixed by `Journal::retire_slot` before a device goes into a
/// failed slot. Fails without the fix, in both journal modes.
#[test]
fn journal_replay_never_writes_onto_a_device_that_took_the_slot_since() {
    use futures::executor::block_on;
    use std::sync::atomic::AtomicBool;
    use uraid_core::format::JournalMode;
    use uraid_core::{Geometry, Level};
    use uraid_engine::{Array, Volume};
    use uraid_sim::crash::{cached_dev, reassemble_on, Clock};
    use uraid_sim::{fresh_images_with, journal_image, payload, sim_ids, sim_options};
    for mode in [JournalMode::WriteThrough, JournalMode::WriteBack] {
        let g = Geometry::new(Level::Raid5, 4, 4096, 8 * 4096).unwrap();
        let clock = Clock::new(0, 7);
        let mut images = fresh_images_with(g, Some(mode));
        // A journal far larger than this test's records: no checkpoint on its own.
        images.push(journal_image(
            (uraid_core::journal::LOG_START + 64 * uraid_core::journal::max_record(4, 4096))
                as usize,
        ));
        let devs: Vec<_> = images
            .iter()
            .enumerate()
            .map(|(i, img)| cached_dev(format!("mem{i}"), img.clone(), &clock))
            .collect();
        let mut sb = uraid_sim::sim_superblock(g);
        sb.journal = Some((uraid_sim::SIM_JOURNAL_UUID, mode));
        let mut devs = devs.into_iter();
        let members: Vec<_> = (0..4).map(|_| devs.next()).collect();
        let jdev = devs.next().unwrap();
        let jsb = uraid_engine::journal::check_journal(&jdev, &sb).unwrap();
        let array = Array::new(
            sb,
            sim_ids(4),
            members,
            None,
            sim_options(),
            Some(Vec::new()),
        );
        array.attach_journal(uraid_engine::journal::Journal::new(jdev, mode, jsb, 0));
        let vol = Volume::new(array, Some(Vec::new()));
        let a = vol.array().clone();
        let sdb = g.stripe_data_bytes();
        let r2 = payload(2, sdb as usize);
        block_on(async {
            vol.write(0, payload(1, sdb as usize)).await.unwrap();
            vol.flush().await.unwrap();
            a.fail_by_operator(2, true).await.unwrap();
            vol.write(0, r2.clone()).await.unwrap();
            vol.flush().await.unwrap();
            let new = cached_dev("mem5".into(), vec![0xEE; images[0].len()], &clock);
            assert_eq!(vol.add_member(new, [9; 16]).await, Ok(2));
            a.rebuild(&AtomicBool::new(false)).await.unwrap();
            vol.flush().await.unwrap();
        });
        assert!(a.rebuild_state().is_empty() && a.failed().is_empty());
        // Everything written reaches the media; the journal was not checkpointed by itself.
        clock.power_cut_with(|_, _| true);
        let media = clock.images().unwrap();
        drop((vol, a));
        let read_with = |present: Vec<bool>| {
            let v = reassemble_on(&media, &present, Some(4), None, sim_options(), |i, img| {
                uraid_sim::MemDev::from_image(format!("mem{i}"), img)
            })
            .unwrap();
            block_on(v.read(0, sdb)).unwrap().to_vec()
        };
        assert!(
            read_with(vec![true; 6]) == r2.to_vec(),
            "{mode:?}: stripe 0 after replay"
        );
        for out in [0, 1, 3, 5] {
            let mut present = vec![true; 6];
            present[out] = false;
            assert!(
                read_with(present) == r2.to_vec(),
                "{mode:?}: stripe 0 after replay with mem{out} left out"
            );
        }
    }
}

/// The simulator still finds its way to the scenario above: seeds of the journal focus that
/// put a new device into a failed slot of a journalled array, every run checked as usual.
/// The interleaving is not a function of the seed (module docs of `uraid_sim::interaction`):
/// on one host these five seeds make eight such adds, on a loaded CI host they made none, so
/// further seeds run until one happens (bounded).
#[test]
fn journal_focus_seeds_with_new_devices_in_failed_slots() {
    let mut adds = 0;
    let mut ran = 0;
    for seed in [266, 67, 138, 264, 295].into_iter().chain(1000..1200) {
        if adds > 0 && ran >= 5 {
            break;
        }
        let r = run(&SimConfig::journal_focus(seed)).unwrap_or_else(|e| panic!("{e}"));
        ran += 1;
        adds += r
            .actions
            .iter()
            .filter(|a| a.contains("added into a failed slot: Ok") || a.contains("takes over: Ok"))
            .count();
    }
    assert!(
        adds > 0,
        "no new device went into a failed slot in {ran} seeds"
    );
}

fn seeds(var: &str, default: u64) -> std::ops::Range<u64> {
    let start: u64 = std::env::var("URAID_SIM_START")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let n: u64 = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    start..start + n
}

#[test]
fn seeded_runs_within_the_tolerance_match_the_model() {
    let mut total = uraid_sim::interaction::SimReport::default();
    let mut failures = Vec::new();
    for seed in seeds("URAID_SIM_SEEDS", 64).filter(|s| !OPEN_FINDINGS.contains(s)) {
        match run_seed(seed) {
            Ok(r) => {
                total.stages += r.stages;
                total.power_cuts += r.power_cuts;
                total.acked_writes += r.acked_writes;
                total.reads_checked += r.reads_checked;
                total.discarded += r.discarded;
                total.plugged += r.plugged;
                total.plug_filled += r.plug_filled;
                total.read_ahead_hits += r.read_ahead_hits;
                total.read_ahead_dropped += r.read_ahead_dropped;
                total.slow_reads_around += r.slow_reads_around;
                total.actions.extend(r.actions);
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing seeds:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    let count = |what: &str| total.actions.iter().filter(|a| a.contains(what)).count();
    // The mix really happened (a configuration change that drops a fault class fails here),
    // checked on the CI range: a soak batch elsewhere (`URAID_SIM_START`) may lack a class.
    let ci_range = std::env::var_os("URAID_SIM_START").is_none();
    for what in [
        "added into a failed slot: Ok",
        "takes over: Ok",
        "replace run: Ok",
        "rebuild: Ok",
        "resync: Ok",
        "scrub Repair: Ok",
        "planted corruption",
        "dies after",
        "media error",
        "journal device dies",
        "clean stop: Ok",
        "operator fails",
        "remove",
    ] {
        assert!(
            !ci_range || count(what) > 0,
            "no '{what}' in {} stages",
            total.stages
        );
    }
    assert!(
        !ci_range || total.power_cuts * 2 > total.stages,
        "{total:?}"
    );
    // Trims of whole granules reached the members (discards that leave junk behind).
    assert!(!ci_range || total.discarded > 0, "no discards: {total:?}");
    // Sequential streams were plugged, and some of their stripes filled.
    assert!(
        !ci_range || total.plug_filled > 0,
        "no plugs filled: {total:?}"
    );
    // Streams were read ahead, and changes dropped units read ahead.
    assert!(
        !ci_range || total.read_ahead_hits > 0 && total.read_ahead_dropped > 0,
        "read-ahead did not serve and drop: {total:?}"
    );
    // Members made slow were flagged, read around, and some read again after recovering.
    assert!(
        !ci_range
            || total.slow_reads_around > 0
                && count("flagged slow after") > 0
                && count("read again after") > 0,
        "fail-slow not exercised: {} reads around, flagged {}, read again {}",
        total.slow_reads_around,
        count("flagged slow after"),
        count("read again after")
    );
    eprintln!(
        "{} reads around slow members ({} flagged, {} read again)",
        total.slow_reads_around,
        count("flagged slow after"),
        count("read again after")
    );
    eprintln!(
        "{} stages, {} power cuts, {} writes acknowledged, {} reads checked, {} member bytes \
         discarded, {} plugged stripe writes ({} filled), {} reads from read-ahead ({} bytes \
         dropped by changes); adds {}, replaces {}, rebuilds {}, resyncs {}, scrubs {}, removes {}, \
         planted {}",
        total.stages,
        total.power_cuts,
        total.acked_writes,
        total.reads_checked,
        total.discarded,
        total.plugged,
        total.plug_filled,
        total.read_ahead_hits,
        total.read_ahead_dropped,
        count("added"),
        count("replace run"),
        count("rebuild:"),
        count("resync:"),
        count("scrub"),
        count("remove"),
        count("planted")
    );
}

#[test]
fn one_seed() {
    // Reruns one seed when asked (soak.sh prints the command); otherwise seed 0 once more.
    let seed = std::env::var("URAID_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // URAID_SIM_BEYOND=1: the seed in beyond mode (soak.sh --beyond prints it so).
    let r = if std::env::var_os("URAID_SIM_BEYOND").is_some_and(|v| !v.is_empty()) {
        run(&beyond(seed))
    } else {
        run_seed(seed)
    };
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// Past the tolerance (three of six RAID6 members lost, say) the array must fail cleanly:
/// refuse to assemble, refuse reads (EIO), never serve bytes the history does not allow.
/// `URAID_SIM_BEYOND_SEEDS=N` runs more seeds (`scripts/soak.sh --beyond`).
#[test]
fn past_the_tolerance_the_array_fails_cleanly() {
    let (mut refused, mut unassembled, mut runs) = (0, 0, 0);
    let mut failures = Vec::new();
    for seed in seeds("URAID_SIM_BEYOND_SEEDS", 16) {
        match run(&beyond(seed)) {
            Ok(r) => {
                runs += 1;
                refused += r.reads_refused;
                unassembled += r
                    .actions
                    .iter()
                    .filter(|a| a.starts_with("assembly refused"))
                    .count();
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing seeds past the tolerance:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // The runs really went past what the array can serve: it refused reads (a
    // configuration change that keeps every run healthy fails here).
    assert!(refused > 0, "{runs} runs and not one read refused");
    eprintln!("{runs} runs: {refused} reads refused, {unassembled} assemblies refused");
}

/// Seed `seed`'s configuration in `beyond` mode.
fn beyond(seed: u64) -> SimConfig {
    SimConfig {
        beyond: true,
        ..SimConfig::from_seed(seed)
    }
}
