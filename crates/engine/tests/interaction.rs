//! The interaction simulator (`uraid_sim::interaction`): seeded runs that drive the whole
//! engine on its reactors with every fault class mixed in. A bounded number of seeds here;
//! `scripts/soak.sh` runs many more and prints the seed of any failure
//! (`URAID_SIM_SEED=N cargo test -p uraid-engine --test interaction one_seed` reruns one).

use uraid_sim::interaction::{run, run_seed, SimConfig};

/// Seeds of the CI range left out because they fail on a known, open bug. Empty today.
const OPEN_FINDINGS: &[u64] = &[];

/// Open finding (the durability issue's "rebuild decodes unsynced units"): with no journal in
/// service, a member lost while stripes wait for resync and a device added into its slot,
/// the rebuild decodes those stripes from parity that may not match and then serves the
/// result where the promise is EIO. Seeds that show it with `rebuild_unsynced` on (off in
/// the CI runs above, so they test everything else): 159 (RAID5), 196 (EC 3 parities), 290
/// (RAID5, journal failed earlier). Run: `cargo test -p uraid-engine --test interaction
/// open_findings -- --ignored`.
const REBUILD_UNSYNCED: &[u64] = &[159, 196, 290];

#[test]
#[ignore = "open finding: rebuild over unsynced stripes (see REBUILD_UNSYNCED)"]
fn open_findings() {
    let failing: Vec<String> = REBUILD_UNSYNCED
        .iter()
        .filter_map(|&seed| {
            let cfg = SimConfig {
                rebuild_unsynced: true,
                ..SimConfig::from_seed(seed)
            };
            run(&cfg).err()
        })
        .collect();
    assert!(failing.is_empty(), "{}", failing.join("\n\n"));
}

/// Regression: journal replay wrote records made before a member failed onto the device
/// that took the slot since (here a RAID5 with a write-back journal: member 2's device dies,
/// a new device is added into slot 2 and rebuilt, the power is cut before the journal's next
/// checkpoint; replay wrote the old member's parity over the rebuilt chunk, and the stripe
/// read with member 1 left out came back wrong). Found by this simulator; fixed by
/// `Array::journal_retire_slot` before a device goes into a failed slot.
#[test]
fn journal_replay_never_writes_onto_a_device_that_took_the_slot_since() {
    let cfg = SimConfig::journal_focus(266);
    let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        r.actions
            .iter()
            .any(|a| a.contains("added into a failed slot: Ok")),
        "the scenario changed: {:?}",
        r.actions
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
    // The mix really happened (a configuration change that drops a fault class fails here).
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
        assert!(count(what) > 0, "no '{what}' in {} stages", total.stages);
    }
    assert!(total.power_cuts * 2 > total.stages, "{total:?}");
    eprintln!(
        "{} stages, {} power cuts, {} writes acknowledged, {} reads checked; adds {}, \
         replaces {}, rebuilds {}, resyncs {}, scrubs {}, removes {}, planted {}",
        total.stages,
        total.power_cuts,
        total.acked_writes,
        total.reads_checked,
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
    if let Err(e) = run_seed(seed) {
        panic!("{e}");
    }
}

/// Past the tolerance (three of six RAID6 members lost, say) the array must fail cleanly.
/// Ignored: its first runs found reassemblies after such a failure that serve bytes the
/// history does not allow (seed 7, not every run: stage 3 of a RAID6 with a write-through
/// journal); not analysed yet (the closing note). Run with `-- --ignored`.
#[test]
#[ignore = "open finding: wrong bytes after a failure past the tolerance (seed 7), not analysed yet"]
fn past_the_tolerance_the_array_fails_cleanly() {
    for seed in seeds("URAID_SIM_BEYOND_SEEDS", 8) {
        let cfg = SimConfig {
            beyond: true,
            ..SimConfig::from_seed(seed)
        };
        if let Err(e) = run(&cfg) {
            panic!("beyond the tolerance: {e}");
        }
    }
}
