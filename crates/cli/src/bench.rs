//! `uraid bench`: drives the engine in-process, like fio drives a device: a number of reactor
//! threads, each running its share of the queue depth as concurrent request loops, one task
//! per loop (`as_tasks`).

use crate::size;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde_json::json;
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_engine::assemble;
use uraid_engine::{Access, ArrayOptions, FileDev, Runtime, Volume, WriteBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    Rand,
    Seq,
}

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// Access pattern.
    #[arg(long, value_enum, default_value = "rand")]
    pub pattern: Pattern,
    /// Request size.
    #[arg(long, default_value = "4K", value_parser = size::parse)]
    pub bs: u64,
    /// Total requests in flight, spread over the threads.
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Percentage of requests that are reads (100 = all reads, 0 = all writes).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub read_pct: u32,
    /// Measurement time in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub runtime: f64,
    /// Reactor threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Use blocking pread/pwrite instead of io_uring.
    #[arg(long)]
    pub no_uring: bool,
    /// Write the whole volume sequentially (1M requests) before measuring.
    #[arg(long)]
    pub precondition: bool,
    /// Leave these member indices out, to measure degraded operation. In a read-only run
    /// the failure exists only in memory; a run that writes records it in the superblocks
    /// (the member stays failed until replaced with `uraid add`), so it needs --allow-writes.
    #[arg(long = "fail", value_name = "INDEX")]
    pub fail: Vec<usize>,
    /// Let a run that writes (--read-pct below 100, --precondition) change an array: it
    /// overwrites the volume's data, marks the array dirty while it runs and clean after, and
    /// records --fail members as failed. Needed for writes to members you name and for
    /// writes with --fail; not for read-only runs (members are opened read-only) or plain
    /// writes to the embedded default volume.
    #[arg(long)]
    pub allow_writes: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    pub members: Vec<PathBuf>,
}

struct Outcome {
    ops: u64,
    errors: u64,
    hist: Histogram<u64>,
}

/// Runs each request loop as its own task on this reactor and returns their outputs; an error
/// if any task ended without one (only a panic does). Not one task joining them all: a join
/// polls its futures in order, so when I/O completes inline (tmpfs members) the first loop
/// spends the task's whole cooperative budget on every poll and the others never run
/// (`uraid_engine::reactor::coop`).
async fn as_tasks<T: 'static>(
    futs: impl Iterator<Item = impl std::future::Future<Output = T> + 'static>,
) -> Result<Vec<T>> {
    let rxs: Vec<_> = futs
        .map(uraid_engine::reactor::spawn_local_output)
        .collect();
    let outs: Vec<_> = futures::future::join_all(rxs).await;
    let lost = outs.iter().filter(|o| o.is_err()).count();
    if lost > 0 {
        bail!("{lost} request loop(s) ended without a result");
    }
    Ok(outs.into_iter().flatten().collect())
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

pub fn run(args: &BenchArgs, members: &[PathBuf], embedded: bool) -> Result<()> {
    if args.bs == 0 || !args.bs.is_multiple_of(512) {
        bail!("--bs {} must be a non-zero multiple of 512", args.bs);
    }
    if args.qd == 0 {
        bail!("--qd must be at least 1");
    }
    let mut plan = assemble::plan(members)?;
    for r in &plan.refused {
        eprintln!("uraid: warning: {r}");
    }
    for &i in &args.fail {
        if i >= plan.slots.len() {
            bail!(
                "--fail {i}: the array has only {} members",
                plan.slots.len()
            );
        }
        plan.slots[i] = None;
    }
    plan.can_start()?;
    let writes = args.read_pct < 100 || args.precondition;
    if writes && !args.allow_writes {
        let what = if args.precondition {
            "bench --precondition".to_string()
        } else {
            format!("bench --read-pct {}", args.read_pct)
        };
        let name = &plan.sb.name;
        if !args.fail.is_empty() {
            bail!(
                "{what} with --fail would record member(s) {:?} of array '{name}' as failed (until \
                 replaced with `uraid add` and rebuilt); pass --allow-writes to accept that, or \
                 run read-only \
                 (--read-pct 100), which leaves every member untouched",
                args.fail
            );
        }
        if !embedded {
            bail!(
                "{what} writes to array '{name}' and would overwrite its data; pass \
                 --allow-writes if it is disposable (read-only runs need no flag)"
            );
        }
    }
    let access = if writes {
        Access::ReadWrite
    } else {
        Access::ReadOnly
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rt = Runtime::new(threads, 1024, !args.no_uring).context("starting reactors")?;
    let handle = rt.handle();
    // A read-only run opens the members read-only and never writes a superblock: a member
    // left out with --fail (or failing during the run) stays failed in memory only.
    let opts = ArrayOptions {
        frozen_metadata: !writes,
        ..ArrayOptions::default()
    };
    let array: Arc<Volume<FileDev>> =
        assemble::open_volume_with(&plan, Some(handle.clone()), opts, access)?;
    let size = array.size();
    if args.bs > size {
        bail!("--bs {} exceeds the volume ({size} bytes)", args.bs);
    }
    let g = *array.geometry();
    let engine = if rt.uses_uring() {
        "io_uring"
    } else {
        "pread/pwrite"
    };

    if args.precondition {
        let t0 = Instant::now();
        let chunk: u64 = 1 << 20;
        let per = size.div_ceil(threads as u64);
        // Progress: a bar on a terminal (not with --json), nothing otherwise.
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let bar = (!args.json && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
            let pb = indicatif::ProgressBar::new(size);
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "uraid: preconditioning [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            pb
        });
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = bar.clone().map(|pb| {
            let (w, d) = (written.clone(), done.clone());
            std::thread::spawn(move || {
                while !d.load(Ordering::Relaxed) {
                    pb.set_position(w.load(Ordering::Relaxed));
                    std::thread::sleep(Duration::from_millis(100));
                }
                pb.finish_and_clear();
            })
        });
        let futs: Vec<_> = (0..threads)
            .map(|r| {
                let a = array.clone();
                let written = written.clone();
                handle.spawn_on(r, move || async move {
                    let lo = r as u64 * per;
                    let hi = (lo + per).min(size);
                    let next = Rc::new(Cell::new(lo));
                    let data = WriteBuf::from(vec![0x5au8; chunk as usize]);
                    let loops = (0..8).map(|_| {
                        let (a, next, data) = (a.clone(), next.clone(), data.clone());
                        let written = written.clone();
                        async move {
                            loop {
                                let off = next.get();
                                if off >= hi {
                                    return Ok::<(), uraid_engine::ArrayError>(());
                                }
                                let len = chunk.min(hi - off);
                                next.set(off + len);
                                let buf = if len == chunk {
                                    data.clone()
                                } else {
                                    WriteBuf::from(&data[..len as usize])
                                };
                                a.write(off, buf).await?;
                                written.fetch_add(len, Ordering::Relaxed);
                            }
                        }
                    });
                    for r in as_tasks(loops).await? {
                        r.context("preconditioning write failed")?;
                    }
                    Ok::<(), anyhow::Error>(())
                })
            })
            .collect();
        let results = futures::executor::block_on(futures::future::join_all(futs));
        done.store(true, Ordering::Relaxed);
        if let Some(t) = ticker {
            let _ = t.join();
        }
        for r in results {
            r.context("reactor stopped")??;
        }
        if !args.json {
            eprintln!(
                "uraid: preconditioned {} in {:.1}s",
                size::human(size),
                t0.elapsed().as_secs_f64()
            );
        }
    }

    let before = array.array().stats.snapshot();
    let sets_before = array.array().status().bitmap.set_rounds;
    let deadline = Instant::now() + Duration::from_secs_f64(args.runtime);
    let start = Instant::now();
    let blocks = size / args.bs;
    let futs: Vec<_> = (0..threads)
        .map(|r| {
            let a = array.clone();
            let qd = args.qd / threads + usize::from(r < args.qd % threads);
            let (bs, pattern, read_pct) = (args.bs, args.pattern, args.read_pct);
            handle.spawn_on(r, move || async move {
                // Sequential streams: each reactor walks its own slice of the volume.
                let per = blocks / threads as u64;
                let cursor = Rc::new(Cell::new(r as u64 * per));
                let wbuf = WriteBuf::from(
                    (0..bs)
                        .map(|i| (i * 7 + r as u64) as u8)
                        .collect::<Vec<u8>>(),
                );
                let loops = (0..qd).map(|q| {
                    let (a, cursor, wbuf) = (a.clone(), cursor.clone(), wbuf.clone());
                    async move {
                        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                            .expect("valid bounds");
                        let mut seed = 0x2545_F491_4F6C_DD1D ^ ((r as u64) << 32 | q as u64);
                        let (mut ops, mut errors) = (0u64, 0u64);
                        while Instant::now() < deadline {
                            let blk = match pattern {
                                Pattern::Rand => xorshift(&mut seed) % blocks,
                                Pattern::Seq => {
                                    let b = cursor.get();
                                    let lo = r as u64 * per;
                                    cursor.set(if b + 1 >= lo + per.max(1) { lo } else { b + 1 });
                                    b
                                }
                            };
                            let read = (xorshift(&mut seed) % 100) < read_pct as u64;
                            let t0 = Instant::now();
                            let ok = if read {
                                a.read(blk * bs, bs).await.is_ok()
                            } else {
                                a.write(blk * bs, wbuf.clone()).await.is_ok()
                            };
                            let _ = hist.record(t0.elapsed().as_nanos() as u64);
                            ops += 1;
                            if !ok {
                                errors += 1;
                                if !a.is_serving() {
                                    break;
                                }
                            }
                        }
                        Outcome { ops, errors, hist }
                    }
                });
                let outs = as_tasks(loops).await?;
                let mut total = Outcome {
                    ops: 0,
                    errors: 0,
                    hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
                };
                for o in outs {
                    total.ops += o.ops;
                    total.errors += o.errors;
                    let _ = total.hist.add(&o.hist);
                }
                Ok::<Outcome, anyhow::Error>(total)
            })
        })
        .collect();
    let mut total = Outcome {
        ops: 0,
        errors: 0,
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
    };
    for r in futures::executor::block_on(futures::future::join_all(futs)) {
        let o = r.context("reactor stopped")??;
        total.ops += o.ops;
        total.errors += o.errors;
        total.hist.add(&o.hist)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let d = array.array().stats.snapshot().since(&before);
    let bitmap_sets = array.array().status().bitmap.set_rounds - sets_before;
    let a2 = array.clone();
    handle.block_on(0, move || async move { a2.close().await })?;
    drop(array);
    rt.shutdown();

    let iops = total.ops as f64 / secs;
    let mbps = iops * args.bs as f64 / 1e6;
    let h = &total.hist;
    let us = |ns: u64| ns as f64 / 1000.0;
    let (avg, p99, p999, max) = (
        h.mean() / 1000.0,
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999)),
        us(h.max()),
    );
    let desc = format!(
        "{} {}+{} chunk {}",
        g.level,
        g.data_chunks(),
        g.parity(),
        size::human(g.chunk)
    );
    if args.json {
        let v = json!({
            "array": desc, "volume_size": size, "threads": threads, "engine": engine,
            "pattern": format!("{:?}", args.pattern).to_lowercase(), "bs": args.bs, "qd": args.qd,
            "read_pct": args.read_pct, "seconds": secs, "ops": total.ops, "errors": total.errors,
            "iops": iops, "mb_per_s": mbps, "lat_avg_us": avg, "lat_p99_us": p99, "lat_p999_us": p999, "lat_max_us": max,
            "degraded_members": args.fail,
            "planner": { "full_stripe_writes": d.full_stripe_writes, "rcw_writes": d.rcw_writes, "rmw_writes": d.rmw_writes, "merged_writes": d.merged_writes, "degraded_reads": d.degraded_reads },
            "bitmap_set_rounds": bitmap_sets,
        });
        println!("{v}");
    } else {
        println!(
            "uraid bench: {desc}, volume {}, {threads} reactors ({engine}), {:?} {} {}% read, QD{}, {:.1}s{}",
            size::human(size),
            args.pattern,
            size::human(args.bs),
            args.read_pct,
            args.qd,
            secs,
            if args.fail.is_empty() { String::new() } else { format!(", degraded (members {:?} out)", args.fail) }
        );
        println!("  IOPS {iops:.0}   MB/s {mbps:.1}   lat avg {avg:.1}us  p99 {p99:.1}us  p99.9 {p999:.1}us  max {max:.1}us");
        println!(
            "  planner: full-stripe {}, reconstruct-write {}, read-modify-write {}, merged {}, degraded reads {}; bitmap set rounds {bitmap_sets}; errors {}",
            d.full_stripe_writes, d.rcw_writes, d.rmw_writes, d.merged_writes, d.degraded_reads, total.errors
        );
    }
    if total.errors > 0 {
        bail!("{} requests failed", total.errors);
    }
    Ok(())
}
