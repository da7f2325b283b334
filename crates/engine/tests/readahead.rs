//! Read-ahead (readahead.rs) on the real reactors: a sequential stream is served from it, in
//! order or reordered over several tasks; random reads start none; the cache stays within its
//! budget; and a read never returns data older than a write acknowledged before it began,
//! with prefetches in flight while writes, write-zeroes and trims run.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::reactor::{spawn_local_output, yield_now};
use uraid_engine::{ArrayOptions, ReadAheadStats, Runtime, Volume};
use uraid_sim::rng::Rng;
use uraid_sim::{mem_array_with, sim_options, Faults, MemDev};

const CHUNK: u64 = 4096;
/// A block of the tests: 4 KiB; a stripe of RAID6 over 6 members is 16 KiB, a read-ahead
/// unit 128 KiB.
const BLOCK: u64 = 4096;
const BUDGET: u64 = 1 << 20;

/// RAID6 over 6 in-memory members of `member` bytes, written end to end at version 0.
fn volume(rt: &Runtime, budget: u64, member: u64) -> (Arc<Volume<MemDev>>, Vec<Arc<Faults>>) {
    let opts = ArrayOptions {
        read_ahead: budget,
        ..sim_options()
    };
    let (vol, faults) = mem_array_with(Level::Raid6, 6, CHUNK, member, Some(rt.handle()), opts);
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let n = v.size() / BLOCK;
        let mut all = Vec::with_capacity(v.size() as usize);
        for b in 0..n {
            all.extend(block(b, 0));
        }
        v.write(0, all).await.expect("precondition");
    });
    (vol, faults)
}

/// Block `b` at version `v`: every 8 bytes say (b, v).
fn block(b: u64, v: u32) -> Vec<u8> {
    let word = (b << 32 | v as u64).to_le_bytes();
    word.iter().copied().cycle().take(BLOCK as usize).collect()
}

/// The version each block of `data` (starting at block `b0`) holds, checked whole.
fn versions(b0: u64, data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK as usize)
        .enumerate()
        .map(|(i, d)| {
            let b = b0 + i as u64;
            if d.iter().all(|&x| x == 0) {
                return 0; // zeroed or trimmed: version 0 by the tests' convention
            }
            let w = u64::from_le_bytes(d[..8].try_into().unwrap());
            assert_eq!(w >> 32, b, "block {b} holds another block's data");
            assert!(d.chunks(8).all(|c| c == &d[..8]), "block {b} torn");
            w as u32
        })
        .collect()
}

fn stats(v: &Volume<MemDev>) -> ReadAheadStats {
    v.read_ahead_stats().expect("read-ahead on")
}

/// Reads blocks `[b0, b0 + n)` in requests of `per` blocks, one after another, and checks
/// every block is at version 0; returns the largest cache size seen.
async fn stream(v: &Volume<MemDev>, b0: u64, n: u64, per: u64, stride: u64) -> u64 {
    let mut peak = 0;
    let mut b = b0;
    while b < b0 + n {
        let got = v.read(b * BLOCK, per * BLOCK).await.unwrap().to_vec();
        assert!(versions(b, &got).iter().all(|&x| x == 0));
        peak = peak.max(stats(v).cache_bytes);
        b += stride;
    }
    peak
}

#[test]
fn a_sequential_stream_is_served_from_read_ahead_within_its_budget() {
    let rt = Runtime::new(1, 256, false).unwrap();
    let (vol, _) = volume(&rt, BUDGET, 1 << 20);
    let v = vol.clone();
    let peak = rt.handle().block_on(0, move || async move {
        // 128 KiB requests (32 blocks) at queue depth 1 over the whole volume.
        let n = v.size() / BLOCK;
        stream(&v, 0, n, 32, 32).await
    });
    let s = stats(&vol);
    let reads = vol.size() / (32 * BLOCK);
    assert!(peak <= BUDGET, "cache {peak} over its budget");
    assert!(
        s.hits + s.late_hits >= reads * 8 / 10,
        "{} of {reads} reads served from read-ahead: {s:?}",
        s.hits + s.late_hits
    );
    assert!(s.hits > 0, "no read found its data ready: {s:?}");
    assert_eq!(s.streams, 1, "{s:?}");

    // The same with read-ahead off: no counters, nothing changes for reads.
    let (off, _) = volume(&rt, 0, 1 << 20);
    assert!(off.read_ahead_stats().is_none());
}

#[test]
fn a_stream_split_over_interleaved_readers_is_followed() {
    let rt = Runtime::new(1, 256, false).unwrap();
    let (vol, faults) = volume(&rt, BUDGET, 4 << 20);
    for f in &faults {
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        // 4 readers, each 4 requests deep, reading every 4th 16 KiB piece: the server sees
        // one stream, reordered (fio's zonemode=strided, or nbdcopy's connections).
        let n = v.size() / BLOCK;
        let mut done = Vec::new();
        for j in 0..4u64 {
            for k in 0..4u64 {
                let v = v.clone();
                done.push(spawn_local_output(async move {
                    let mut b = (j * 4 + k) * 4;
                    while b < n {
                        let got = v.read(b * BLOCK, 4 * BLOCK).await.unwrap().to_vec();
                        assert!(versions(b, &got).iter().all(|&x| x == 0));
                        b += 64;
                    }
                }));
            }
        }
        for d in done {
            d.await.unwrap();
        }
    });
    let s = stats(&vol);
    let reads = vol.size() / (4 * BLOCK);
    assert!(
        s.hits + s.late_hits >= reads * 7 / 10,
        "{} of {reads} reordered reads served from read-ahead: {s:?}",
        s.hits + s.late_hits
    );
    assert!(s.cache_bytes <= BUDGET);
}

#[test]
fn random_reads_start_no_read_ahead() {
    let rt = Runtime::new(1, 256, false).unwrap();
    // 64 MiB: random reads of a tiny volume land next to each other often enough to look
    // like streams.
    let (vol, _) = volume(&rt, BUDGET, 16 << 20);
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let mut rng = Rng::new(7);
        let n = v.size() / BLOCK;
        for _ in 0..3000 {
            let b = rng.below(n);
            let got = v.read(b * BLOCK, BLOCK).await.unwrap().to_vec();
            assert_eq!(versions(b, &got), [0]);
        }
    });
    let s = stats(&vol);
    // A few false streams may start (reads that land next to each other by chance); each
    // costs at most a few units.
    assert!(
        s.prefetched_bytes <= 16 * (128 << 10),
        "random reads read ahead {} bytes: {s:?}",
        s.prefetched_bytes
    );
}

/// What a reader may see of a block: at least the version acknowledged before it started,
/// at most the last one sent.
#[derive(Default)]
struct Model {
    /// Per group of readers, the block it read last (the writer aims just ahead of it).
    at: [u64; 2],
    /// Readers still reading (the writer writes until none is).
    readers: usize,
    acked: Vec<u32>,
    sent: Vec<u32>,
    /// Per block, the versions that were a write-zeroes or a trim (they read as zeros).
    zeroed: Vec<Vec<u32>>,
}

#[test]
fn read_ahead_never_serves_data_older_than_an_acknowledged_change() {
    let mut total = ReadAheadStats::default();
    for seed in 0..8u64 {
        let rt = Runtime::new(1, 256, false).unwrap();
        // A small budget (units are evicted as well as dropped), one that lets units wait
        // ready for their reads, or one whose refills make jobs over 1 MiB (up to 8 MiB; 1.4
        // to 4 MiB were seen here, on a 16 MiB volume).
        let (budget, member) = match seed % 3 {
            0 => (512 << 10, 1 << 20),
            1 => (4 << 20, 1 << 20),
            _ => (32 << 20, 4 << 20),
        };
        let (vol, faults) = volume(&rt, budget, member);
        for f in &faults {
            f.yield_ops.store(true, Ordering::Relaxed);
            f.jitter.store(true, Ordering::Relaxed);
            // Member reads are slow: prefetches stay in flight while writes complete.
            f.read_yields.store(1 + seed % 4, Ordering::Relaxed);
        }
        let v = vol.clone();
        let checked = rt.handle().block_on(0, move || async move {
            let n = v.size() / BLOCK;
            let model = Rc::new(RefCell::new(Model {
                at: [0, n / 2],
                readers: 8,
                acked: vec![0; n as usize],
                sent: vec![0; n as usize],
                zeroed: vec![Vec::new(); n as usize],
            }));
            let checked = Rc::new(RefCell::new(0u64));
            let mut done = Vec::new();
            // Readers: sequential streams of 16 KiB, two of them 4 deep, over the volume,
            // four times.
            for r in 0..2u64 {
                for k in 0..4u64 {
                    let (v, model, checked) = (v.clone(), model.clone(), checked.clone());
                    done.push(spawn_local_output(async move {
                        for pass in 0..4u64 {
                            let mut b = (r * n / 2 + k * 4 + pass * 8) % n;
                            for _ in 0..n / 16 {
                                let len = 4.min(n - b);
                                let lo: Vec<u32> =
                                    model.borrow().acked[b as usize..(b + len) as usize].to_vec();
                                model.borrow_mut().at[r as usize] = b;
                                let got = v.read(b * BLOCK, len * BLOCK).await.unwrap().to_vec();
                                let m = model.borrow();
                                for (i, x) in versions(b, &got).into_iter().enumerate() {
                                    let at = b as usize + i;
                                    // Zeros are what a trim or write-zeroes leaves: fine
                                    // if one at or after the acknowledged version was sent.
                                    let zeros_ok = m.zeroed[at].iter().any(|&z| z >= lo[i]);
                                    assert!(
                                        x >= lo[i] || x == 0 && zeros_ok,
                                        "seed {seed}: block {at} read version {x}, but \
                                         version {} was acknowledged before the read began",
                                        lo[i]
                                    );
                                    assert!(x <= m.sent[at], "block {at}: version {x} never sent");
                                }
                                *checked.borrow_mut() += len;
                                b = (b + 16) % n;
                                if b + 4 > n {
                                    b = 0;
                                }
                            }
                        }
                        model.borrow_mut().readers -= 1;
                    }));
                }
            }
            // The writer: random blocks just ahead of the readers; now and then a
            // write-zeroes or a trim (both leave zeros, by convention version 0, which the
            // readers accept once it was sent).
            for w in 0..4u64 {
                let (v2, model2) = (v.clone(), model.clone());
                done.push(spawn_local_output(async move {
                    let mut rng = Rng::new(seed * 4 + w);
                    while model2.borrow().readers > 0 {
                        // Just ahead of a group of readers, where read-ahead has units; each
                        // writer its own blocks, so a block's versions are written in order.
                        let at = model2.borrow().at[rng.below(2) as usize];
                        let b = ((at + rng.below(48)) / 4 * 4 + w) % n;
                        let ver = model2.borrow().sent[b as usize] + 1;
                        model2.borrow_mut().sent[b as usize] = ver;
                        let op = rng.below(10);
                        if op < 2 {
                            model2.borrow_mut().zeroed[b as usize].push(ver);
                        }
                        match op {
                            0 => v2.write_zeros(b * BLOCK, BLOCK).await.unwrap(),
                            1 => v2.trim(b * BLOCK, BLOCK).await.unwrap(),
                            _ => v2.write(b * BLOCK, block(b, ver)).await.unwrap(),
                        }
                        // Acknowledged: from now on a read must not see older data.
                        model2.borrow_mut().acked[b as usize] = ver;
                        if rng.below(2) == 0 {
                            yield_now().await;
                        }
                    }
                }));
            }
            for d in done {
                d.await.unwrap();
            }
            let c = *checked.borrow();
            c
        });
        let s = stats(&vol);
        eprintln!("seed {seed}: {checked} blocks checked, {s:?}");
        assert!(checked > 0);
        total.hits += s.hits + s.late_hits;
        total.dropped_bytes += s.dropped_bytes;
    }
    assert!(
        total.hits > 0 && total.dropped_bytes > 0,
        "the test needs reads served from read-ahead and units dropped by changes: {total:?}"
    );
}

/// The two ways a unit could go stale, one at a time: a write acknowledged while the unit is
/// ready in the cache, and one acknowledged while its prefetch is still reading the members.
/// A read after either sees the write.
#[test]
fn a_change_drops_units_ready_and_in_flight() {
    for in_flight in [false, true] {
        let rt = Runtime::new(1, 256, false).unwrap();
        let (vol, faults) = volume(&rt, 4 << 20, 1 << 20);
        let v = vol.clone();
        rt.handle().block_on(0, move || async move {
            // A stream over the first unit: its eighth read (128 KiB read) confirms it, and
            // read-ahead fetches the next units.
            for b in 0..7 {
                v.read(b * 4 * BLOCK, 4 * BLOCK).await.unwrap();
            }
            if in_flight {
                // Member reads now take many turns, but member 0's: a prefetch copies its
                // chunks at once and waits for the others'. Whole-stripe writes read
                // nothing, so they complete meanwhile.
                for f in &faults[1..] {
                    f.read_yields.store(200, Ordering::Relaxed);
                }
            }
            let v4 = v.clone();
            let fourth = spawn_local_output(async move {
                v4.read(28 * BLOCK, 4 * BLOCK).await.unwrap();
            });
            for _ in 0..if in_flight { 3 } else { 100 } {
                yield_now().await;
            }
            let before = stats(&v);
            assert!(before.cache_bytes >= 2 * (128 << 10), "{before:?}");
            assert_eq!(before.prefetched_bytes > 0, !in_flight, "{before:?}");
            // A whole stripe (16 KiB) at the start of each unit ahead, and one block of
            // the second unit.
            for u in 1..10u64 {
                let mut data = Vec::new();
                for b in u * 32..u * 32 + 4 {
                    data.extend(block(b, 1));
                }
                v.write(u * 32 * BLOCK, data).await.unwrap();
            }
            v.write(40 * BLOCK, block(40, 1)).await.unwrap();
            for f in &faults {
                f.read_yields.store(0, Ordering::Relaxed);
            }
            fourth.await.unwrap();
            for u in 1..10u64 {
                let got = v.read(u * 32 * BLOCK, 4 * BLOCK).await.unwrap().to_vec();
                assert_eq!(
                    versions(u * 32, &got),
                    [1; 4],
                    "unit {u}, in flight: {in_flight}"
                );
            }
            let got = v.read(36 * BLOCK, 8 * BLOCK).await.unwrap().to_vec();
            assert_eq!(
                versions(36, &got),
                [0, 0, 0, 0, 1, 0, 0, 0],
                "in flight: {in_flight}"
            );
            let after = stats(&v);
            assert!(after.dropped_bytes > before.dropped_bytes, "{after:?}");
        });
    }
}

/// Reads longer than the detection window's bounds (2 MiB, and NBD's largest, 32 MiB) are
/// matched and served like any other, and random reads 32 deep start (almost) nothing.
#[test]
fn large_reads_and_deep_random_reads() {
    let rt = Runtime::new(1, 256, false).unwrap();
    let (vol, _) = volume(&rt, 8 << 20, 16 << 20);
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let n = v.size() / BLOCK;
        let per = (2 << 20) / BLOCK;
        stream(&v, 0, n / 2, per, per).await;
        let got = v.read(0, 32 << 20).await.unwrap().to_vec();
        assert!(versions(0, &got).iter().all(|&x| x == 0));
        let got = v.read_sparse(32 << 20, 32 << 20).await.unwrap();
        let mut all = Vec::new();
        for p in got {
            match p {
                uraid_engine::ReadPiece::Data { data, .. } => all.extend(data.to_vec()),
                uraid_engine::ReadPiece::Hole { len, .. } => all.extend(vec![0; len as usize]),
            }
        }
        assert!(versions((32 << 20) / BLOCK, &all).iter().all(|&x| x == 0));
    });
    let s = stats(&vol);
    assert!(s.hits + s.late_hits > 0, "{s:?}");

    let (vol, _) = volume(&rt, BUDGET, 16 << 20);
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let n = v.size() / BLOCK;
        let mut done = Vec::new();
        for t in 0..32u64 {
            let v = v.clone();
            done.push(spawn_local_output(async move {
                let mut rng = Rng::new(100 + t);
                for _ in 0..100 {
                    let b = rng.below(n);
                    let got = v.read(b * BLOCK, BLOCK).await.unwrap().to_vec();
                    assert_eq!(versions(b, &got), [0]);
                }
            }));
        }
        for d in done {
            d.await.unwrap();
        }
    });
    let s = stats(&vol);
    assert!(
        s.prefetched_bytes <= 16 * (128 << 10),
        "random reads 32 deep read ahead {} bytes: {s:?}",
        s.prefetched_bytes
    );
}

/// The stream table full of confirmed streams that ended: new streams still get read-ahead
/// (idle ones are replaced), even two read interleaved; afterwards, with every prefetch done,
/// a trim of the whole volume leaves nothing cached; and `read_sparse` served from the cache
/// returns holes as holes, in as few pieces as without read-ahead.
#[test]
fn ended_streams_leave_their_slots_and_sparse_reads_keep_their_holes() {
    let rt = Runtime::new(1, 256, false).unwrap();
    let (vol, _) = volume(&rt, 8 << 20, 16 << 20);
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let n = v.size() / BLOCK;
        // 16 streams of 16 reads of 32 KiB each, then nothing more of them.
        for k in 0..16 {
            stream(&v, k * (n / 16), 128, 8, 8).await;
        }
        // Idle long enough: random reads.
        let mut rng = Rng::new(3);
        for _ in 0..300 {
            let b = rng.below(n);
            v.read(b * BLOCK, BLOCK).await.unwrap();
        }
        let before = stats(&v);
        // Two new streams, read interleaved.
        let (a, b) = (n / 32, n / 2 + n / 32);
        for i in 0..64 {
            for s in [a, b] {
                let got = v
                    .read((s + i * 8) * BLOCK, 8 * BLOCK)
                    .await
                    .unwrap()
                    .to_vec();
                assert!(versions(s + i * 8, &got).iter().all(|&x| x == 0));
            }
        }
        let after = stats(&v);
        let served = after.hits + after.late_hits - before.hits - before.late_hits;
        assert!(
            served >= 64,
            "two new streams got {served} reads from read-ahead: {after:?}"
        );
        // Every prefetch done, then everything trimmed: nothing left cached.
        for _ in 0..200 {
            yield_now().await;
        }
        v.trim(0, v.size()).await.unwrap();
        assert_eq!(stats(&v).cache_bytes, 0, "{:?}", stats(&v));
        // Every other 256 KiB written again: data and holes alternate. A sparse stream over
        // them, served from the cache, returns the holes as holes.
        for g in (0..v.size() / (256 << 10)).step_by(2) {
            let b0 = g * 64;
            let mut data = Vec::new();
            for b in b0..b0 + 64 {
                data.extend(block(b, 1));
            }
            v.write(b0 * BLOCK, data).await.unwrap();
        }
        let hits0 = stats(&v).hits + stats(&v).late_hits;
        for r in 0..64u64 {
            let off = r * (128 << 10);
            let pieces = v.read_sparse(off, 128 << 10).await.unwrap();
            assert_eq!(pieces.len(), 1, "read {r}: {} pieces", pieces.len());
            let hole = (off / (256 << 10)) % 2 == 1;
            match &pieces[0] {
                uraid_engine::ReadPiece::Hole { len, .. } => {
                    assert!(hole && *len == 128 << 10, "read {r}")
                }
                uraid_engine::ReadPiece::Data { data, .. } => {
                    assert!(!hole, "read {r}: data where a hole is");
                    let b0 = off / BLOCK;
                    assert!(versions(b0, &data.to_vec()).iter().all(|&x| x == 1));
                }
            }
        }
        let s = stats(&v);
        assert!(s.hits + s.late_hits > hits0, "{s:?}");
    });
}
