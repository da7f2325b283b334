//! Read-ahead's memory, not only its count: the buffers its prefetches hold, and those kept
//! spare for reuse, never pass the budget (docs/design/readahead.md, "Distance and memory").
//! Its own test binary: `buf::unpooled_bytes` is process-wide.

use std::sync::atomic::Ordering;
use uraid_core::Level;
use uraid_engine::reactor::spawn_local_output;
use uraid_engine::{buf, ArrayOptions, Runtime};
use uraid_sim::{mem_array_with, sim_options};

/// 64 KiB chunks: a prefetch's member reads are runs of whole chunks, mapped (at least
/// `UNPOOLED_MIN`), not pooled.
const CHUNK: u64 = 64 << 10;
const BUDGET: u64 = 2 << 20;
const READ: u64 = 128 << 10;

#[test]
fn prefetch_buffers_stay_within_the_budget() {
    let rt = Runtime::new(2, 256, false).unwrap();
    let opts = ArrayOptions {
        read_ahead: BUDGET,
        ..sim_options()
    };
    let (vol, faults) = mem_array_with(Level::Raid6, 6, CHUNK, 16 << 20, Some(rt.handle()), opts);
    for f in &faults {
        // Member I/O yields once: prefetches are in flight while reads arrive.
        f.yield_ops.store(true, Ordering::Relaxed);
    }
    let v = vol.clone();
    rt.handle().block_on(0, move || async move {
        let size = v.size();
        v.write(0, vec![0x5a; size as usize])
            .await
            .expect("precondition");
        // One stream read in order, then the same split over 16 readers one read deep each
        // (reordered), twice over the volume: prefetches evict each other's jobs all along.
        for pass in 0..2 {
            let mut off = 0;
            while off < size {
                let got = v.read(off, READ).await.unwrap().to_vec();
                assert!(got.iter().all(|&b| b == 0x5a), "pass {pass} at {off}");
                off += READ;
            }
            let mut done = Vec::new();
            for j in 0..16u64 {
                let v = v.clone();
                done.push(spawn_local_output(async move {
                    let mut off = j * READ;
                    while off < size {
                        let got = v.read(off, READ).await.unwrap().to_vec();
                        assert!(got.iter().all(|&b| b == 0x5a), "at {off}");
                        off += 16 * READ;
                    }
                }));
            }
            for d in done {
                d.await.unwrap();
            }
        }
    });
    let s = vol.read_ahead_stats().expect("read-ahead on");
    let (now, _) = buf::unpooled_bytes();
    drop(vol);
    drop(rt);
    // After the runtime stopped: every prefetch has finished.
    let (after, peak) = buf::unpooled_bytes();
    assert!(
        s.hits + s.late_hits > 0 && s.prefetched_bytes > 4 * BUDGET,
        "the stream was read ahead, past the budget several times: {s:?}"
    );
    assert!(
        peak > 0,
        "prefetch buffers were mapped outside the pools (else this bound says nothing)"
    );
    assert!(
        peak as u64 <= BUDGET,
        "prefetch memory peaked at {peak} bytes with a budget of {BUDGET}: {s:?}"
    );
    assert_eq!(
        after, 0,
        "bytes still mapped after the volume went (were {now})"
    );
}
