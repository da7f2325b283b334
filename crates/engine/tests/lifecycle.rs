//! Seeded simulation of the whole failure lifecycle against the reference model: on members
//! with volatile write caches, a random sequence of client writes, reads and flushes, member
//! failures (also in the middle of a rebuild or a replace), online adds that are rebuilt,
//! replaces, and one power cut at a random member operation; then reassembly from what the
//! media hold (every device given, old and new).
//!
//! Checked: a read while serving returns the model's bytes (or an error, never other bytes);
//! after the cut the array assembles, and every byte a FLUSH covered reads back (bytes of
//! writes not yet flushed may be old or new); a read after the cut may fail only where the
//! array itself says stripes are unsynced and a member is missing (the write-hole rule).

use futures::executor::block_on;
use std::sync::atomic::{AtomicBool, Ordering};
use uraid_core::Level;
use uraid_engine::{ReplaceOutcome, Volume};
use uraid_sim::crash::{cached_dev, reassemble, reassemble_with, Clock};
use uraid_sim::rng::Rng;
use uraid_sim::{new_device_uuid, payload, random_range, written_images, MemDev, Model};

const CHUNK: u64 = 4096;
const ROWS: u64 = 32;
const LEVELS: &[(Level, usize)] = &[
    (Level::Raid1, 3),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid6, 6),
    (Level::Ec { parity: 3 }, 6),
];

fn written(level: Level, members: usize, seed: u64) -> (Vec<Vec<u8>>, Model) {
    written_images(level, members, CHUNK, ROWS, 40, seed)
}

/// What the client knows: the latest bytes (reads while serving) and the bytes a FLUSH
/// covered, with the ranges written since the last FLUSH.
struct Truth {
    latest: Model,
    flushed: Model,
    unflushed: Vec<(u64, u64)>,
    /// Ranges of failed writes whose bytes could not be read back: unknown while serving.
    unknown: Vec<(u64, u64)>,
}

fn overlaps(list: &[(u64, u64)], off: u64, len: u64) -> bool {
    list.iter().any(|&(o, l)| off < o + l && o < off + len)
}

/// One step's client load: writes, reads (checked against `latest`), and a flush; fails a
/// member on the way when `fail` says which.
async fn client(
    vol: &Volume<MemDev>,
    t: &mut Truth,
    rng: &mut Rng,
    ops: u64,
    fail: Option<usize>,
    tag: u64,
) {
    let size = vol.size();
    for i in 0..ops {
        if let Some(f) = fail.filter(|_| i == ops / 2) {
            let _ = vol.array().fail_by_operator(f, true).await;
        }
        match rng.below(5) {
            0 | 1 => {
                let (off, len) = random_range(rng, size, 16);
                let data = payload(tag * 1000 + i, len as usize);
                if vol.write(off, data.clone()).await.is_ok() {
                    t.latest.write(off, &data);
                    t.unflushed.push((off, len));
                } else {
                    // Not acknowledged: it may or may not be there.
                    t.unflushed.push((off, len));
                    match block_read(vol, off, len).await {
                        Some(b) => t.latest.write(off, &b),
                        None => t.unknown.push((off, len)),
                    }
                }
            }
            2 | 3 => {
                let (off, len) = random_range(rng, size, 16);
                if let Ok(b) = vol.read(off, len).await {
                    if overlaps(&t.unknown, off, len) {
                        continue;
                    }
                    assert!(
                        b.to_vec() == t.latest.read(off, len),
                        "read {off}+{len} while serving returned other bytes"
                    );
                }
            }
            _ => {
                if vol.flush().await.is_ok() {
                    t.flushed.bytes.clone_from(&t.latest.bytes);
                    t.unflushed.clear();
                }
            }
        }
    }
}

async fn block_read(vol: &Volume<MemDev>, off: u64, len: u64) -> Option<Vec<u8>> {
    vol.read(off, len).await.ok().map(|b| b.to_vec())
}

/// One seeded trial: returns whether the power was cut, and what happened (for messages).
fn trial(seed: u64) -> (bool, Vec<&'static str>) {
    let mut rng = Rng::new(seed);
    let (level, members) = LEVELS[rng.below(LEVELS.len() as u64) as usize];
    let (images, model) = written(level, members, seed);
    // The power goes at a random member operation (a trial takes a few hundred to about 1,300), or at
    // the end if the trial is shorter.
    let clock = Clock::new(1 + rng.below(1200), seed);
    let jitter = |d: MemDev| {
        d.faults.jitter.store(true, Ordering::Relaxed);
        d.faults.yield_ops.store(true, Ordering::Relaxed);
        d
    };
    let vol = reassemble_with(&images, &vec![true; members], |i, img| {
        jitter(cached_dev(format!("mem{i}"), img, &clock))
    })
    .expect("reassembles");
    let a = vol.array().clone();
    let tolerance = a.geometry().fault_tolerance();
    let mut t = Truth {
        latest: Model {
            bytes: model.bytes.clone(),
        },
        flushed: model,
        unflushed: Vec::new(),
        unknown: Vec::new(),
    };
    let mut devices = members;
    let steps = 10;
    let mut log = Vec::new();
    let stop = AtomicBool::new(false);
    for step in 0..steps {
        if clock.is_off() {
            break;
        }
        let degraded = a
            .failed()
            .union(a.rebuild_state().iter().map(|r| r.0).collect());
        let live: Vec<usize> = (0..members).filter(|&m| !degraded.contains(m)).collect();
        let can_fail = degraded.len() < tolerance;
        let victim = || live[rng_pick(seed, step, live.len())];
        let tag = seed * 100 + step;
        match rng.below(6) {
            0 if can_fail => {
                let v = victim();
                log.push("fail");
                block_on(a.fail_by_operator(v, true)).ok();
            }
            1 if !a.failed().is_empty() => {
                log.push("add+rebuild");
                let dev = jitter(cached_dev(
                    format!("mem{devices}"),
                    vec![0xEE; images[0].len()],
                    &clock,
                ));
                devices += 1;
                if block_on(vol.add_member(dev, new_device_uuid(tag))).is_ok() {
                    // Sometimes another member fails during the rebuild.
                    let fail = (degraded.len() + 1 < tolerance && rng.below(2) == 0)
                        .then(|| live[rng_pick(seed, step + 50, live.len())]);
                    let mut r2 = Rng::new(tag);
                    let _ = block_on(async {
                        futures::join!(
                            a.rebuild(&stop),
                            client(&vol, &mut t, &mut r2, 12, fail, tag)
                        )
                    });
                }
            }
            2 if !live.is_empty() && degraded.is_empty() => {
                let v = victim();
                log.push("replace");
                let dev = jitter(cached_dev(
                    format!("mem{devices}"),
                    vec![0xEE; images[0].len()],
                    &clock,
                ));
                devices += 1;
                if block_on(vol.replace_member(v, dev, new_device_uuid(tag))).is_ok() {
                    // Sometimes the member being replaced fails meanwhile.
                    let fail = (rng.below(3) == 0).then_some(v);
                    let mut r2 = Rng::new(tag);
                    let (o, _) = block_on(async {
                        futures::join!(
                            vol.replace_run(&stop),
                            client(&vol, &mut t, &mut r2, 12, fail, tag)
                        )
                    });
                    if let Ok(ReplaceOutcome::Rebuilding { .. }) = o {
                        log.push("takeover+rebuild");
                        let mut r3 = Rng::new(tag ^ 1);
                        let _ = block_on(async {
                            futures::join!(
                                a.rebuild(&stop),
                                client(&vol, &mut t, &mut r3, 6, None, tag ^ 1)
                            )
                        });
                    }
                }
            }
            _ => {
                log.push("io");
                let mut r2 = Rng::new(tag);
                block_on(client(&vol, &mut t, &mut r2, 10, None, tag));
            }
        }
    }
    let cut = clock.is_off();
    if std::env::var("URAID_LIFECYCLE_OPS").is_ok() {
        eprintln!("seed {seed}: {} ops, cut {cut}, {log:?}", clock.ops());
    }
    if !cut {
        clock.power_cut();
    }
    let media = clock.images().expect("the power went");
    drop(vol);
    // Every device is given; assembly picks each slot's member.
    let vol = reassemble(&media, &vec![true; media.len()]).unwrap_or_else(|e| {
        panic!("seed {seed} ({level}, {log:?}): does not assemble after the cut: {e}")
    });
    let a = vol.array().clone();
    let size = vol.size();
    // The write-hole rule: a stripe not resynced since the cut, read while a member it
    // needs is missing or not rebuilt there, is refused (and counted), never guessed.
    let unsynced_ok = (!a.failed().is_empty() || !a.rebuild_state().is_empty()) && a.needs_resync();
    let mut refused = std::collections::HashSet::new();
    let mut blk = 0;
    while blk < size {
        let len = CHUNK.min(size - blk);
        let refused_before = a.unsynced_stripes_refused();
        match block_on(vol.read(blk, len)) {
            Ok(b) => {
                let b = b.to_vec();
                for (k, (&got, &want)) in b.iter().zip(t.flushed.read(blk, len)).enumerate() {
                    let at = blk + k as u64;
                    let exempt = t.unflushed.iter().any(|&(o, l)| at >= o && at < o + l);
                    assert!(
                        exempt || got == want,
                        "seed {seed} ({level}, {log:?}): byte {at} lost after the cut"
                    );
                }
            }
            Err(e) => {
                // Refused stripes are counted once each.
                let stripe = blk / a.geometry().stripe_data_bytes();
                if a.unsynced_stripes_refused() > refused_before {
                    refused.insert(stripe);
                }
                assert!(
                    unsynced_ok && refused.contains(&stripe),
                    "seed {seed} ({level}, {log:?}): read {blk}+{len} failed after the cut: {e}"
                );
            }
        }
        blk += len;
    }
    (cut, log)
}

/// A pick in 0..n that does not consume the trial's generator.
fn rng_pick(seed: u64, step: u64, n: usize) -> usize {
    (Rng::new(seed ^ (step << 32)).below(n as u64)) as usize
}

#[test]
fn failures_adds_replaces_and_power_cuts_against_the_model() {
    let seeds: u64 = std::env::var("URAID_LIFECYCLE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let (mut cuts, mut adds, mut replaces) = (0, 0, 0);
    for seed in 0..seeds {
        let (cut, log) = trial(seed);
        cuts += usize::from(cut);
        adds += log.iter().filter(|l| **l == "add+rebuild").count();
        replaces += log.iter().filter(|l| **l == "replace").count();
    }
    // The mix really happened.
    assert!(
        cuts * 3 >= seeds as usize,
        "{cuts} power cuts in {seeds} trials"
    );
    assert!(
        adds >= 5 && replaces >= 5,
        "{adds} adds, {replaces} replaces"
    );
}
