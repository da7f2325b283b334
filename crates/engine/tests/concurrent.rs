//! Concurrency on the real reactors: many request loops on two reactors write interleaved
//! sectors of the same stripes (so stripe locks, write merging, cross-reactor routing and
//! degraded reads all contend), members fail mid-run, and everything must read back as the
//! model says. A watchdog turns a hang (lost wake-up) into a failure.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use uraid_core::geometry::SECTOR;
use uraid_core::Level;
use uraid_engine::assemble::{self, CreateOptions};
use uraid_engine::{ArrayOptions, BlockDev, Runtime, Volume};
use uraid_sim::mem_array;
use uraid_sim::rng::Rng;

const LOOPS: u64 = 12;
const GROUPS: u64 = 3;

/// Each loop `t` owns sectors s with s % LOOPS == t; it writes them and checks reads of its own
/// sectors against what it wrote (or `base`, the volume's prior image). Returns the new image.
fn hammer<D: BlockDev>(
    rt: &Runtime,
    array: &Arc<Volume<D>>,
    ops_per_loop: u64,
    base: &[u8],
) -> Vec<u8> {
    let base = Arc::new(base.to_vec());
    let size = array.size();
    let sectors = size / SECTOR;
    let handle = rt.handle();
    let (tx, rx) = mpsc::channel();
    // Loops run in groups joined into one task each, so a task is re-polled while some of its
    // loops wait: the pattern that once lost wake-ups.
    for g in 0..GROUPS {
        let a = array.clone();
        let tx = tx.clone();
        let base = base.clone();
        handle.run_on((g % handle.reactors() as u64) as usize, move || {
            uraid_engine::reactor::spawn_local(async move {
                let loops = (g..LOOPS).step_by(GROUPS as usize).map(|t| {
                    let (a, tx, base) = (a.clone(), tx.clone(), base.clone());
                    async move {
                        let mut mine: Vec<(u64, u8)> = Vec::new();
                        let mut rng = Rng::new(t * 7919 + 1);
                        for i in 0..ops_per_loop {
                            let x = rng.next_u64();
                            let s = ((x >> 20) % (sectors / LOOPS)) * LOOPS + t;
                            if i % 3 == 2 {
                                let got = a.read(s * SECTOR, SECTOR).await.map(|g| g.to_vec());
                                let want = mine
                                    .iter()
                                    .rev()
                                    .find(|(ms, _)| *ms == s)
                                    .map_or(base[(s * SECTOR) as usize], |m| m.1);
                                match got {
                                    Ok(g) if g.iter().all(|&b| b == want) => {}
                                    other => {
                                        let _ = tx.send(Err(format!(
                                            "loop {t}: sector {s}: {:?}, want {want}",
                                            other.map(|g| g[0])
                                        )));
                                        return;
                                    }
                                }
                            } else {
                                let v = (x >> 40) as u8 | 1;
                                if let Err(e) = a
                                    .write(s * SECTOR, Arc::new(vec![v; SECTOR as usize]))
                                    .await
                                {
                                    let _ = tx.send(Err(format!("loop {t}: write: {e}")));
                                    return;
                                }
                                mine.push((s, v));
                            }
                        }
                        let _ = tx.send(Ok(mine));
                    }
                });
                futures::future::join_all(loops).await;
            })
        });
    }
    drop(tx);
    let mut image = base.to_vec();
    for _ in 0..LOOPS {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(mine)) => {
                for (s, v) in mine {
                    image[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize].fill(v);
                }
            }
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => panic!("request loops hung: a wake-up was lost"),
        }
    }
    image
}

fn read_all<D: BlockDev>(rt: &Runtime, array: &Arc<Volume<D>>) -> Vec<u8> {
    let a = array.clone();
    let size = array.size();
    rt.handle().block_on(0, move || async move {
        a.read(0, size).await.expect("read-back").to_vec()
    })
}

#[test]
fn contended_stripes_in_memory_with_failures() {
    for (level, members) in [
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid7, 7),
        (Level::Raid10, 4),
        (Level::Raid1, 3),
    ] {
        let rt = Runtime::new(2, 256, true).unwrap();
        let (array, faults) = mem_array(level, members, 4096, 24 * 4096, Some(rt.handle()));
        // Member I/O yields once per operation, so requests on both reactors really overlap
        // their stripe updates and degraded reads (in-memory I/O would otherwise complete
        // synchronously and hide every interleaving).
        for f in &faults {
            f.yield_ops
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let image = hammer(&rt, &array, 300, &vec![0; array.size() as usize]);
        assert!(read_all(&rt, &array) == image, "{level}: healthy read-back");
        // Fail members mid-run, up to the tolerance, and keep going.
        for f in 0..array.geometry().fault_tolerance().min(2) {
            faults[(2 * f + 1) % members].kill_after(7);
        }
        let image2 = hammer(&rt, &array, 300, &image);
        assert!(array.is_serving(), "{level}: array failed within tolerance");
        assert!(
            read_all(&rt, &array) == image2,
            "{level}: degraded read-back"
        );
        drop(array);
        rt.shutdown();
    }
}

/// A write-back journal on the reactors: writes are acknowledged once their record is
/// durable and their member writes finish in the background, holding the stripe. Every
/// read after an acknowledgement (each loop reads back its own sectors) must see the write,
/// with members yielding on every I/O so the deferred writes are really still in flight;
/// then with members failing; then a clean close must leave nothing in the journal.
#[test]
fn write_back_journal_reads_see_acknowledged_writes() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let rt = Runtime::new(2, 256, true).unwrap();
        let (array, faults, _journal) = uraid_sim::mem_array_with_journal(
            level,
            members,
            4096,
            24 * 4096,
            Some(rt.handle()),
            uraid_sim::sim_options(),
            uraid_core::format::JournalMode::WriteBack,
        );
        for f in &faults {
            f.yield_ops
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let image = hammer(&rt, &array, 300, &vec![0; array.size() as usize]);
        assert!(read_all(&rt, &array) == image, "{level}: read-back");
        faults[1].kill_after(9);
        let image2 = hammer(&rt, &array, 300, &image);
        assert!(
            read_all(&rt, &array) == image2,
            "{level}: degraded read-back"
        );
        let j = array.array().journal_status().unwrap();
        assert_eq!(j.state, "active", "{level}");
        assert!(j.records > 300, "{level}: {j:?}");
        let a = array.clone();
        rt.handle()
            .block_on(0, move || async move { a.close().await })
            .unwrap();
        assert_eq!(
            array.array().journal_status().unwrap().used_bytes,
            0,
            "{level}: a clean close empties the journal"
        );
        drop(array);
        rt.shutdown();
    }
}

/// Opens the array a plan describes on the runtime's reactors.
fn open(plan: &assemble::Plan, rt: &Runtime) -> Arc<Volume<uraid_engine::FileDev>> {
    assemble::open_volume(plan, Some(rt.handle()), ArrayOptions::default()).unwrap()
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uraid-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The same on real files through io_uring and O_DIRECT, then again after reassembly with two
/// members of a RAID6 gone.
#[test]
fn files_through_io_uring_and_reassembly() {
    let dir = temp_dir("files");
    let paths: Vec<PathBuf> = (0..6).map(|i| dir.join(format!("m{i}"))).collect();
    for p in &paths {
        std::fs::File::create(p)
            .unwrap()
            .set_len((1 << 20) + 64 * 4096)
            .unwrap();
    }
    assemble::create(
        &paths,
        &CreateOptions {
            level: Level::Raid6,
            chunk: 4096,
            name: "t".into(),
            force: false,
            bitmap_chunk: None,
            journal: None,
        },
    )
    .unwrap();
    let image = {
        let plan = assemble::plan(&paths).unwrap();
        let rt = Runtime::new(2, 256, true).unwrap();
        let array = open(&plan, &rt);
        let mut image = hammer(&rt, &array, 400, &vec![0; array.size() as usize]);
        // A run of whole stripes: every member gets one gather write (writev through the
        // ring when the temp dir is not tmpfs, as on CI; pwritev on tmpfs) of the payload's
        // chunks and the parity, checked by the read below and by
        // the degraded reassembly, which decodes what two missing members held from it.
        // (Each sector one byte value: `hammer` expects uniform sectors.)
        let sdb = 4 * 4096usize; // four data chunks of 4 KiB per stripe
        let run: Vec<u8> = (0..3 * sdb).map(|i| (i / 512 * 7 + 3) as u8).collect();
        let off = 2 * sdb as u64;
        let (a, r) = (array.clone(), run.clone());
        let before = array.array().stats.snapshot().full_stripe_writes;
        rt.handle()
            .block_on(0, move || async move { a.write(off, r).await })
            .unwrap();
        let runs = array.array().stats.snapshot().full_stripe_writes - before;
        assert_eq!(runs, 3, "the run was written as whole stripes");
        image[off as usize..off as usize + run.len()].copy_from_slice(&run);
        assert!(read_all(&rt, &array) == image);
        let a = array.clone();
        rt.handle()
            .block_on(0, move || async move { a.close().await })
            .unwrap();
        rt.shutdown();
        image
    };
    let sb = assemble::read_superblock(&paths[0]).unwrap();
    assert!(sb.clean, "close() records a clean shutdown");
    // Reassemble from members given out of order, two of them missing.
    let some = vec![
        paths[5].clone(),
        paths[0].clone(),
        paths[3].clone(),
        paths[2].clone(),
    ];
    let plan = assemble::plan(&some).unwrap();
    assert_eq!(plan.missing(), vec![1, 4]);
    plan.can_start().unwrap();
    let rt = Runtime::new(2, 256, true).unwrap();
    let array = open(&plan, &rt);
    assert!(
        read_all(&rt, &array) == image,
        "degraded reassembly reads back the same data"
    );
    // A write while degraded bumps events and records the missing members as failed, so
    // they are refused as stale if they come back.
    let image2 = hammer(&rt, &array, 600, &image);
    let a = array.clone();
    rt.handle()
        .block_on(0, move || async move { a.close().await })
        .unwrap();
    drop(array);
    rt.shutdown();
    let plan = assemble::plan(&paths).unwrap();
    assert_eq!(plan.missing(), vec![1, 4]);
    assert_eq!(plan.refused.len(), 2, "{:?}", plan.refused);
    assert!(
        plan.refused.iter().all(|r| r.contains("marked failed")),
        "{:?}",
        plan.refused
    );
    let rt = Runtime::new(1, 64, false).unwrap();
    let array = open(&plan, &rt);
    assert!(
        read_all(&rt, &array) == image2,
        "pread fallback reads the same"
    );
    drop(array);
    rt.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A degraded read must never reconstruct from a stripe whose update is half done. One stripe
/// of a RAID5 3 (two data chunks) with the member of data chunk 1 gone: loops on reactor 0
/// keep rewriting chunk 0 (data write + parity write, member I/O yielding in between) while
/// loops on reactor 1 read chunk 1, which only exists as chunk 0 XOR parity. Every read must
/// return chunk 1's original bytes. (Taking the stripe lock out of degraded reads fails this.)
#[test]
fn degraded_reads_never_see_half_written_stripes() {
    degraded_reads_racing_writes(false);
}

/// The same with reads of the whole stripe, chunk 0 and chunk 1 in one request: the path that
/// reads the stripe once and decodes from it (`read_stripe_decoded`) must hold the lock too.
/// (Taking the lock out of that path fails this.)
#[test]
fn degraded_stripe_reads_never_see_half_written_stripes() {
    degraded_reads_racing_writes(true);
}

/// `whole`: read `[0, 2 chunks)` (both data chunks) instead of one sector of chunk 1.
fn degraded_reads_racing_writes(whole: bool) {
    // Whole-stripe reads meet a half-written stripe less often (each one waits for two
    // member reads): more rounds (with the lock taken out of that path it failed 5 runs of 5).
    let iters: u64 = if whole { 20_000 } else { 3_000 };
    let rt = Runtime::new(2, 256, true).unwrap();
    let chunk = 4096u64;
    let (array, faults) = mem_array(Level::Raid5, 3, chunk, 4 * chunk, Some(rt.handle()));
    let h = rt.handle();
    // Known contents everywhere, then lose the member holding stripe 0's data chunk 1.
    let size = array.size();
    let a = array.clone();
    h.block_on(0, move || async move {
        a.write(0, Arc::new(vec![0x11; size as usize]))
            .await
            .expect("initial write")
    });
    let gone = array.geometry().data_member(0, 1);
    faults[gone].kill();
    for f in &faults {
        f.yield_ops
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let (tx, rx) = mpsc::channel();
    for r in 0..2usize {
        let (a, tx) = (array.clone(), tx.clone());
        h.run_on(r, move || {
            uraid_engine::reactor::spawn_local(async move {
                let loops = (0..8u64).map(|l| {
                    let (a, tx) = (a.clone(), tx.clone());
                    async move {
                        for i in 0..iters {
                            let sector = (i * 7 + l) % (chunk / SECTOR);
                            let res = if r == 0 {
                                let v = (i as u8).wrapping_mul(31).wrapping_add(l as u8) | 0x80;
                                a.write(sector * SECTOR, Arc::new(vec![v; SECTOR as usize]))
                                    .await
                                    .map_err(|e| format!("write: {e}"))
                            } else {
                                let (off, len) = if whole {
                                    (0, 2 * chunk)
                                } else {
                                    (chunk + sector * SECTOR, SECTOR)
                                };
                                // Chunk 1's bytes of the result (chunk 0's keep changing).
                                let skip = if whole { chunk as usize } else { 0 };
                                match a.read(off, len).await.map(|g| g.to_vec()) {
                                    Ok(g) if g[skip..].iter().all(|&b| b == 0x11) => Ok(()),
                                    Ok(g) => Err(format!(
                                        "degraded read at {off} saw {:#x} in chunk 1",
                                        g[skip..].iter().find(|&&b| b != 0x11).unwrap_or(&0)
                                    )),
                                    Err(e) => Err(format!("read: {e}")),
                                }
                            };
                            if let Err(e) = res {
                                let _ = tx.send(Err(e));
                                return;
                            }
                        }
                        let _ = tx.send(Ok(()));
                    }
                });
                futures::future::join_all(loops).await;
            })
        });
    }
    drop(tx);
    for _ in 0..16 {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => panic!("request loops hung"),
        }
    }
    drop(array);
    rt.shutdown();
}

/// A RAID5 of four in-memory members with a write-back journal, on `rt`'s reactors.
fn write_back_raid5(rt: &Runtime) -> uraid_sim::JournalledArray {
    uraid_sim::mem_array_with_journal(
        Level::Raid5,
        4,
        4096,
        24 * 4096,
        Some(rt.handle()),
        uraid_sim::sim_options(),
        uraid_core::format::JournalMode::WriteBack,
    )
}

/// Waits until the deferred member writes of `[off, off + len)` completed: a read of a stripe
/// waits for its deferred writer (holding a member before that would hold them too).
fn settle(rt: &Runtime, vol: &Arc<Volume<uraid_sim::MemDev>>, off: u64, len: u64) {
    let v = vol.clone();
    rt.handle()
        .block_on(0, move || async move { v.read(off, len).await.map(|_| ()) })
        .unwrap();
}

/// Writes ones over `[0, base)`, lets their deferred member writes land, holds member 1,
/// then writes W (twos over stripe 0): acknowledged, its member-1 write still in flight.
fn held_write(
    rt: &Runtime,
    vol: &Arc<Volume<uraid_sim::MemDev>>,
    faults: &[Arc<uraid_sim::Faults>],
    base: usize,
) {
    let write = |byte: u8, len: usize| {
        let v = vol.clone();
        rt.handle()
            .block_on(0, move || async move {
                v.write(0, Arc::new(vec![byte; len])).await
            })
            .unwrap();
    };
    write(1, base);
    settle(rt, vol, 0, base as u64);
    faults[1].hold();
    write(2, 3 * 4096);
}

/// The write-intent bit of a region stays set while a deferred (write-back) member write into
/// it is still in flight: if the journal were lost afterwards, the bitmap is all that says
/// where stripes may be torn (found by a cold review; fails without the deferred count).
#[test]
fn bitmap_is_not_cleared_under_a_deferred_write() {
    use std::sync::atomic::Ordering;
    let rt = Runtime::new(1, 64, true).unwrap();
    let (vol, faults, _j) = write_back_raid5(&rt);
    let sw = 3 * 4096usize; // one full stripe
    held_write(&rt, &vol, &faults, sw);
    let a = vol.array().clone();
    eprintln!("acknowledged; bitmap {:?}", a.bitmap_state());
    assert!(faults[1].held.load(Ordering::SeqCst));
    let t = a.clone();
    let _ = futures::executor::block_on(t.bitmap_tick());
    eprintln!("tick 1: bitmap {:?}", a.bitmap_state());
    let t = a.clone();
    let h = std::thread::spawn(move || futures::executor::block_on(t.bitmap_tick()));
    std::thread::sleep(Duration::from_millis(300));
    let st = a.bitmap_state();
    eprintln!("tick 2 (member 1 still held): bitmap {st:?}");
    let m1 = uraid_sim::member_bytes(&vol, 1);
    let d = uraid_core::format::DATA_OFFSET as usize;
    let still_old = m1[d..d + 4096].iter().all(|&b| b != 2);
    eprintln!("member 1 data still old: {still_old}");
    faults[1].release();
    let _ = h.join();
    assert!(
        !(st.2 == 0 && still_old),
        "write-intent bit cleared while the deferred member write was in flight"
    );
}

/// A FLUSH answered after the journal failed covers every acknowledged write, also one whose
/// member writes were deferred (found by a cold review; fails without the fallback wait).
#[test]
fn flush_after_a_journal_failure_covers_deferred_writes() {
    let rt = Runtime::new(2, 64, true).unwrap();
    let (vol, faults, jf) = write_back_raid5(&rt);
    let sw = 3 * 4096usize;
    held_write(&rt, &vol, &faults, 4 * sw);
    eprintln!("W acknowledged (member 1 held)");
    jf.kill();
    // Another write meets the dead journal: the fallback starts (and waits for W).
    let v = vol.clone();
    let _w2 = rt.handle().spawn_on(0, move || async move {
        v.write(3 * sw as u64, Arc::new(vec![3u8; sw])).await
    });
    let t0 = std::time::Instant::now();
    while vol.array().journal_status().map(|j| j.state) != Some("failed") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the write never met the dead journal"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let v = vol.clone();
    let f1 = faults[1].clone();
    let rel = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        f1.release();
    });
    // Member 1's bytes are looked at the moment the FLUSH returns (its member writes may
    // land any time after the release).
    let d = uraid_core::format::DATA_OFFSET as usize;
    let (r, still_old) = rt.handle().block_on(1, move || async move {
        let r = v.flush().await;
        let m1 = uraid_sim::member_bytes(&v, 1);
        (r, m1[d..d + 4096].iter().all(|&b| b != 2))
    });
    rel.join().unwrap();
    eprintln!(
        "FLUSH returned {r:?}; member 1 still without W: {still_old}; journal {:?}",
        vol.array().journal_status().map(|j| j.state)
    );
    assert!(
        !(r.is_ok() && still_old),
        "FLUSH succeeded before an acknowledged write reached the members, journal failed"
    );
}

/// Runs of whole stripes (written as one I/O per member per run) race each other and small
/// read-modify-write updates of the same stripes on both reactors, member I/O yielding and
/// completing out of order. Afterwards every stripe's parity agrees with its data (a scrub finds nothing),
/// every sector holds one of the values written to it, and with members failed the array
/// decodes exactly what it read healthy. Whole runs that skipped a stripe lock, or encoded
/// from data another write was changing, would leave parity behind.
#[test]
fn whole_stripe_runs_racing_small_writes_keep_parity() {
    for (level, members) in [
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Ec { parity: 3 }, 8),
    ] {
        let rt = Runtime::new(2, 256, true).unwrap();
        let (array, faults) = mem_array(level, members, 4096, 24 * 4096, Some(rt.handle()));
        for f in &faults {
            f.yield_ops
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // Member writes finish in varying orders, as on real devices.
            f.jitter.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let sdb = array.geometry().stripe_data_bytes();
        let stripes = array.size() / sdb;
        let size = array.size();
        let (tx, rx) = mpsc::channel();
        const TASKS: u64 = 6;
        const OPS: u64 = 800;
        for t in 0..TASKS {
            let (a, tx) = (array.clone(), tx.clone());
            rt.handle().run_on((t % 2) as usize, move || {
                uraid_engine::reactor::spawn_local(async move {
                    let mut rng = Rng::new(t * 7919 + 3);
                    let mut r = Ok(());
                    for i in 0..OPS {
                        let x = rng.next_u64();
                        // Sector values carry the writer and its op: (t, i) fits a byte pair.
                        let v = (t * OPS + i + 1) as u16;
                        let (off, len) = if t % 3 != 2 {
                            let n = 2 + (x >> 33) % 4;
                            let s = (x >> 20) % (stripes - n + 1);
                            (s * sdb, n * sdb)
                        } else {
                            let s = (x >> 20) % (size / SECTOR - 3);
                            (s * SECTOR, (1 + (x >> 40) % 3) * SECTOR)
                        };
                        let data: Vec<u8> =
                            (0..len as usize).map(|j| v.to_le_bytes()[j % 2]).collect();
                        if let Err(e) = a.write(off, Arc::new(data)).await {
                            r = Err(format!("task {t}: write: {e}"));
                            break;
                        }
                    }
                    let _ = tx.send(r);
                })
            });
        }
        drop(tx);
        for _ in 0..TASKS {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(r) => r.unwrap(),
                Err(_) => panic!("{level}: writers hung"),
            }
        }
        let healthy = read_all(&rt, &array);
        for (s, sector) in healthy.chunks(SECTOR as usize).enumerate() {
            let first = u16::from_le_bytes([sector[0], sector[1]]);
            assert!(
                sector
                    .chunks(2)
                    .all(|p| u16::from_le_bytes([p[0], p[1]]) == first),
                "{level}: sector {s} mixes two writes"
            );
            assert!(first as u64 <= TASKS * OPS, "{level}: sector {s}: {first}");
        }
        let a = array.array().clone();
        let report = rt.handle().block_on(0, move || async move {
            let stop = std::sync::atomic::AtomicBool::new(false);
            a.scrub_run(uraid_engine::ScrubMode::Check, &stop).await
        });
        let report = report.expect("scrub runs");
        assert_eq!(
            report.mismatches, 0,
            "{level}: parity left behind: {report:?}"
        );
        for m in 0..array.geometry().fault_tolerance() {
            faults[m * 2 + 1].kill();
        }
        assert!(
            read_all(&rt, &array) == healthy,
            "{level}: degraded read differs"
        );
        drop(array);
        rt.shutdown();
    }
}

/// Request loops whose member I/O completes inline (memory members, like tmpfs files) share
/// their reactors: each loop is its own task, and every one gets a fair share of a fixed number
/// of sequential whole-stripe writes. Round 1 is a fresh volume's first writes: nearly every
/// write first takes the allocation-map and write-intent locks (the simulated bitmap has a
/// region per two stripe rows), which a fair lock hands over in turn (futures' Mutex let the
/// releasing task take it straight back while the woken waiter was still queued: 189 and 197
/// writes for two loops, 1 or 2 for most others). Round 2 rewrites the same blocks with
/// every bit set, so no lock is taken: only the cooperative budget makes a loop yield (without
/// it, the first loop polled on a reactor ran every write inside one poll). Then everything
/// reads back as written.
#[test]
fn loops_with_inline_io_share_their_reactors_fairly() {
    const TASKS: usize = 8;
    const OPS: u64 = 400;
    let rt = Runtime::new(2, 64, true).unwrap();
    let (vol, _faults) = mem_array(Level::Raid6, 10, 4096, 8 << 20, Some(rt.handle()));
    let bs = 2 * 8 * 4096u64;
    let per = vol.size() / 2 / bs;
    assert!(
        per >= OPS,
        "each reactor's slice holds its writes without wrapping"
    );
    let block = move |round: u64, r: usize, i: u64| {
        let n = r as u64 * per + i;
        (n * bs, ((n + round * 101) % 251) as u8 + 1)
    };
    for round in 1..=2 {
        let (tx, rx) = mpsc::channel();
        for r in 0..2 {
            let (vol, tx) = (vol.clone(), tx.clone());
            rt.handle().run_on(r, move || {
                let next = std::rc::Rc::new(std::cell::Cell::new(0u64));
                for t in 0..TASKS {
                    let (vol, tx, next) = (vol.clone(), tx.clone(), next.clone());
                    uraid_engine::reactor::spawn_local(async move {
                        let mut done = 0u64;
                        loop {
                            let i = next.get();
                            if i >= OPS {
                                break;
                            }
                            next.set(i + 1);
                            let (off, v) = block(round, r, i);
                            if let Err(e) = vol.write(off, Arc::new(vec![v; bs as usize])).await {
                                let _ = tx.send(Err(format!("reactor {r} loop {t}: {e}")));
                                return;
                            }
                            done += 1;
                        }
                        let _ = tx.send(Ok((r, t, done)));
                    });
                }
            });
        }
        drop(tx);
        let mut shares = vec![vec![0u64; TASKS]; 2];
        for _ in 0..2 * TASKS {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Ok((r, t, done))) => shares[r][t] = done,
                Ok(Err(e)) => panic!("round {round}: {e}"),
                Err(_) => panic!("round {round}: request loops hung"),
            }
        }
        for (r, s) in shares.iter().enumerate() {
            assert_eq!(
                s.iter().sum::<u64>(),
                OPS,
                "round {round}, reactor {r}: {s:?}"
            );
            // A fair share is OPS / TASKS = 50 each; a loop shut out gets 0 or 1.
            assert!(
                s.iter().all(|&n| n >= OPS / TASKS as u64 / 4),
                "round {round}, reactor {r}: writes per loop {s:?}"
            );
        }
    }
    let v = vol.clone();
    let size = vol.size();
    let image = rt
        .handle()
        .block_on(0, move || async move {
            v.read(0, size).await.map(|b| b.to_vec())
        })
        .expect("read back");
    for r in 0..2 {
        for i in 0..OPS {
            let (off, v) = block(2, r, i);
            assert!(
                image[off as usize..(off + bs) as usize]
                    .iter()
                    .all(|&b| b == v),
                "reactor {r} write {i} at {off} reads back wrong"
            );
        }
    }
    drop(vol);
    rt.shutdown();
}

/// Write-back's deferred member writes are bounded in bytes: with one member holding every
/// write (a slow member) and a bound of three stripe records, writes over every stripe on
/// both reactors are acknowledged until the held bytes reach the bound, then wait (none
/// fails); the held bytes never pass the bound; once the member answers every write
/// completes and reads back, and nothing stays held.
#[test]
fn write_back_deferred_bytes_stay_under_their_bound() {
    let rt = Runtime::new(2, 64, true).unwrap();
    let (vol, faults, _j) = write_back_raid5(&rt);
    let (sw, stripes) = (3 * 4096usize, vol.size() / (3 * 4096));
    let record = 4 * 4096u64; // a full-stripe record: three data chunks and P
    let limit = 3 * record;
    vol.array().set_deferred_limit(limit);
    let held = move |v: &Volume<uraid_sim::MemDev>| {
        let j = v.array().journal_status().unwrap();
        assert_eq!(j.deferred_limit, limit);
        j.deferred_bytes
    };
    // Allocate every granule first (map pages bypass the journal), then let it settle.
    let v = vol.clone();
    rt.handle()
        .block_on(0, move || async move {
            v.write(0, Arc::new(vec![1u8; v.size() as usize])).await
        })
        .unwrap();
    settle(&rt, &vol, 0, vol.size());
    faults[2].hold();
    let mut image = vec![1u8; vol.size() as usize];
    let mut done = Vec::new();
    for s in 0..stripes {
        let data = vec![10 + s as u8; sw];
        image[s as usize * sw..(s as usize + 1) * sw].copy_from_slice(&data);
        let v = vol.clone();
        done.push(rt.handle().spawn_on(s as usize % 2, move || async move {
            v.write(s * sw as u64, Arc::new(data)).await
        }));
    }
    let mut peak = 0;
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        peak = peak.max(held(&vol));
        assert!(peak <= limit, "{peak} bytes deferred, bound {limit}");
        std::thread::sleep(Duration::from_millis(1));
    }
    let results: Vec<Option<Result<(), uraid_engine::ArrayError>>> = done
        .iter_mut()
        .map(|rx| rx.try_recv().ok().flatten())
        .collect();
    let acked = results.iter().filter(|r| r.is_some()).count();
    eprintln!("member 2 held: {acked} of {stripes} writes acknowledged, {peak} bytes deferred");
    assert_eq!(peak, limit, "the deferred writes never reached the bound");
    assert!(
        acked < stripes as usize,
        "every write was acknowledged: nothing waited at the bound"
    );
    faults[2].release();
    let watch = std::thread::spawn({
        let vol = vol.clone();
        move || {
            let mut peak = 0;
            for _ in 0..200 {
                peak = peak.max(held(&vol));
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        }
    });
    for (rx, r) in done.into_iter().zip(results) {
        let r = r.unwrap_or_else(|| futures::executor::block_on(rx).expect("write task"));
        r.expect("a write at the bound failed");
    }
    assert!(watch.join().unwrap() <= limit);
    assert!(
        read_all(&rt, &vol) == image,
        "read-back after the member answered"
    );
    let v = vol.clone();
    rt.handle()
        .block_on(0, move || async move { v.close().await })
        .unwrap();
    assert_eq!(held(&vol), 0, "deferred bytes left after a clean close");
    drop(vol);
    rt.shutdown();
}
