//! Write plugging (stripe/plug.rs) on the real reactors: a client that sends partial-stripe
//! sequential writes one after another with several outstanding, as an NBD client does,
//! gets full-stripe writes; a client at queue depth 1 almost never waits; FLUSH and FUA
//! are never held back by a plug; and everything reads back.

use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::Level;
use uraid_engine::reactor::{sleep, spawn_local_output};
use uraid_engine::{ArrayOptions, Runtime, Volume};
use uraid_sim::{mem_array_with, sim_options, MemDev};

const CHUNK: u64 = 4096;
/// RAID6 over 6 members: 4 data chunks, a 16 KiB stripe; writes of a quarter of it.
const PIECE: u64 = CHUNK;
const STRIPE: u64 = 4 * CHUNK;

fn array(rt: &Runtime, wait: Duration) -> Arc<Volume<MemDev>> {
    let opts = ArrayOptions {
        merge_wait: wait,
        ..sim_options()
    };
    let vol = mem_array_with(Level::Raid6, 6, CHUNK, 64 * STRIPE, Some(rt.handle()), opts).0;
    // Written end to end first (whole stripes), so every granule is allocated: the first
    // write into a granule writes it whole, which would hide the pattern under test.
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let size = v.size();
        v.write(0, vec![0xa5u8; size as usize])
            .await
            .expect("precondition");
    });
    vol
}

fn pattern(i: u64) -> Vec<u8> {
    (0..PIECE).map(|b| (i * 31 + b / 512) as u8).collect()
}

/// Writes pieces `0..n` in order, starting each `gap` after the previous, with at most
/// `depth` outstanding (each its own task, like NBD requests); returns once all are done.
fn stream(rt: &Runtime, vol: &Arc<Volume<MemDev>>, n: u64, depth: usize, gap: Duration) {
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let mut live = std::collections::VecDeque::new();
        for i in 0..n {
            if live.len() >= depth {
                let done: futures::channel::oneshot::Receiver<_> = live.pop_front().unwrap();
                done.await.unwrap();
            }
            let v = v.clone();
            live.push_back(spawn_local_output(async move {
                v.write(i * PIECE, pattern(i)).await.expect("write")
            }));
            sleep(gap).await;
        }
        for d in live {
            d.await.unwrap();
        }
    });
}

fn check(rt: &Runtime, vol: &Arc<Volume<MemDev>>, n: u64) {
    let v = vol.clone();
    let got = rt.handle().block_on(0, move || async move {
        v.read(0, n * PIECE).await.unwrap().to_vec()
    });
    for i in 0..n {
        let at = (i * PIECE) as usize;
        assert!(got[at..at + PIECE as usize] == pattern(i)[..], "piece {i}");
    }
}

#[test]
fn a_stream_of_partial_stripe_writes_at_depth_is_written_in_full_stripes() {
    let n = 256;
    for (wait, full_at_least) in [
        (Duration::ZERO, 0),
        // Long enough that a wait does not run out on a loaded host (one that does stops the
        // stream's waits for 64 writes: 16 stripes).
        (Duration::from_millis(50), n / 4 * 8 / 10),
    ] {
        let rt = Runtime::new(1, 64, true).unwrap();
        let vol = array(&rt, wait);
        let before = vol.array().stats.snapshot();
        stream(&rt, &vol, n, 8, Duration::from_micros(50));
        let st = vol.array().stats.snapshot().since(&before);
        check(&rt, &vol, n);
        if wait.is_zero() {
            assert_eq!(st.plugged_writes, 0);
            assert!(
                st.full_stripe_writes < n / 4 / 2,
                "without plugging the pieces run alone: {st:?}"
            );
        } else {
            assert!(st.full_stripe_writes >= full_at_least, "{st:?}");
            assert!(st.plug_filled >= full_at_least - 1, "{st:?}");
            // Whole-chunk pieces tile their stripes: written from the requests' bytes.
            assert!(st.tiled_writes >= full_at_least - 1, "{st:?}");
        }
        drop(vol);
        rt.shutdown();
    }
}

#[test]
fn a_stream_at_queue_depth_1_almost_never_waits() {
    let rt = Runtime::new(1, 64, true).unwrap();
    let vol = array(&rt, Duration::from_millis(2));
    let before = vol.array().stats.snapshot();
    let n = 400;
    let t0 = Instant::now();
    stream(&rt, &vol, n, 1, Duration::ZERO);
    let st = vol.array().stats.snapshot().since(&before);
    check(&rt, &vol, n);
    // Misses cool the stream down 64, 128, 256 writes: at most four waits in 400.
    assert!(st.plugged_writes <= 4, "{st:?}");
    assert!(st.plug_filled == 0, "{st:?}");
    // Each miss costs at most the 2 ms maximum.
    assert!(t0.elapsed() < Duration::from_secs(5));
    drop(vol);
    rt.shutdown();
}

/// A wait of at least half a second (`merge_wait` 1 s), so only a kick or an interruption
/// ends it within the test's 200 ms: a FLUSH; a FUA write elsewhere; a FUA write, a TRIM
/// (its zeroing write) and a run of whole stripes (a locker) on the plugged stripe itself.
#[test]
fn flush_fua_trim_and_lockers_end_a_wait_and_fua_writes_never_wait() {
    let rt = Runtime::new(1, 64, true).unwrap();
    let vol = array(&rt, Duration::from_secs(1));
    // A stream at depth whose every stripe fills (so its waits are allowed).
    stream(&rt, &vol, 64, 8, Duration::ZERO);
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let cases = [
            "flush",
            "fua elsewhere",
            "fua on the stripe",
            "trim",
            "locker",
        ];
        for (n, kick) in cases.into_iter().enumerate() {
            let base = v.array().stats.snapshot();
            // The first quarter of a fresh stripe, continuing the stream: it waits.
            let at = 64 + 4 * n as u64;
            let w = {
                let v = v.clone();
                spawn_local_output(async move { v.write(at * PIECE, pattern(at)).await })
            };
            while v.array().stats.snapshot().since(&base).plugged_writes == 0 {
                sleep(Duration::from_micros(100)).await;
            }
            let t0 = Instant::now();
            match kick {
                "flush" => v.flush().await.unwrap(),
                "fua elsewhere" => v.write_now(40 * STRIPE, pattern(999)).await.unwrap(),
                "fua on the stripe" => {
                    let w2 = {
                        let v = v.clone();
                        spawn_local_output(async move {
                            v.write_now((at + 1) * PIECE, pattern(at + 1)).await
                        })
                    };
                    w2.await.unwrap().unwrap();
                }
                "trim" => v.trim((at + 1) * PIECE, PIECE).await.unwrap(),
                _ => {
                    // Two whole stripes from the plugged one: their locks are taken in turn.
                    let data = vec![7u8; 2 * STRIPE as usize];
                    let w2 = {
                        let v = v.clone();
                        spawn_local_output(async move { v.write(at * PIECE, data).await })
                    };
                    w2.await.unwrap().unwrap();
                }
            }
            w.await.unwrap().unwrap();
            let took = t0.elapsed();
            assert!(took < Duration::from_millis(200), "{kick}: {took:?}");
            let st = v.array().stats.snapshot().since(&base);
            assert_eq!(st.plugged_writes, 1, "{kick}: {st:?}");
            assert_eq!(st.plug_filled, 0, "{kick}: {st:?}");
        }
    });
    // FUA writes continuing a stream never wait.
    let base = vol.array().stats.snapshot();
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let ws = (88..104).map(|i| {
            let v = v.clone();
            spawn_local_output(async move { v.write_now(i * PIECE, pattern(i)).await })
        });
        for w in ws.collect::<Vec<_>>() {
            w.await.unwrap().unwrap();
        }
    });
    assert_eq!(vol.array().stats.snapshot().since(&base).plugged_writes, 0);
    drop(vol);
    rt.shutdown();
}
