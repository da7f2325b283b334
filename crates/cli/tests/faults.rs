//! Real faulty members for error-policy tests: a member file is served by nbdkit through its
//! error and delay filters on a Unix socket and mounted back as a file with nbdfuse, so the
//! array opens an ordinary file (O_DIRECT, io_uring, flock) whose reads or writes start
//! failing with EIO the moment the test creates a trigger file.
//!
//! Every process and mount a `FaultyMember` starts is torn down when it is dropped, also when
//! the test panics (nbdkit additionally exits with the test process).

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// Polls `ok` every 20 ms until it holds or `limit` passes.
fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ok()
}

/// Waits for a child to exit on its own, then kills it.
fn reap(child: &mut Child, limit: Duration) {
    if !wait_for(limit, || !matches!(child.try_wait(), Ok(None))) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// A member file behind nbdkit's error and delay filters, seen through nbdfuse:
///
/// ```text
/// nbdkit --exit-with-parent -f -U DIR/nbdkit.sock --filter=error --filter=delay \
///     file DIR/backing \
///     error-pread-rate=1 error-pread-file=DIR/fail-reads \
///     error-pwrite-rate=1 error-pwrite-file=DIR/fail-writes \
///     error-zero-rate=1 error-zero-file=DIR/fail-writes \
///     error-trim-rate=1 error-trim-file=DIR/fail-writes \
///     delay-read=D delay-write=D \
///     --filter=rate rate=100G rate-file=DIR/rate
/// nbdfuse DIR/mnt/member --unix DIR/nbdkit.sock
/// ```
///
/// The array uses `DIR/mnt/member`. The error filter (outermost) fails every read while
/// `fail-reads` exists and every write, zero and trim while `fail-writes` exists, with EIO.
/// The rate filter (innermost) limits its bandwidth to what `DIR/rate` says (bits per
/// second, read every second): a slow member on demand.
struct FaultyMember {
    dir: PathBuf,
    mnt: PathBuf,
    file: PathBuf,
    nbdkit: Child,
    nbdfuse: Option<Child>,
}

impl FaultyMember {
    /// Creates `dir/backing` (sparse, `size` bytes) and exposes it as `dir/mnt/member`.
    /// `delay` is the delay filter's per-request delay for reads and writes ("0ms", "2ms").
    fn start(dir: &Path, size: u64, delay: &str) -> FaultyMember {
        FaultyMember::start_with(dir, size, delay, false, true)
    }

    /// `start`; `cache`: nbdkit's cache filter in writeback mode innermost (a volatile
    /// write cache: writes reach the backing file only on flush, and killing nbdkit loses
    /// the rest — a power cut); `fresh`: create the backing file (else reuse it as it is).
    fn start_with(dir: &Path, size: u64, delay: &str, cache: bool, fresh: bool) -> FaultyMember {
        std::fs::create_dir_all(dir).unwrap();
        let backing = dir.join("backing");
        if fresh {
            std::fs::File::create(&backing)
                .unwrap()
                .set_len(size)
                .unwrap();
        }
        let sock = dir.join("nbdkit.sock");
        let _ = std::fs::remove_file(&sock);
        let (r, w) = (dir.join("fail-reads"), dir.join("fail-writes"));
        let _ = std::fs::remove_file(&r);
        let _ = std::fs::remove_file(&w);
        let rate = dir.join("rate");
        std::fs::write(&rate, "100G\n").unwrap();
        let log = std::fs::File::create(dir.join("nbdkit.log")).unwrap();
        let cache_args: &[&str] = if cache {
            &["--filter=cache", "cache=writeback"]
        } else {
            &[]
        };
        let nbdkit = Command::new("nbdkit")
            .args(["--exit-with-parent", "-f", "-U"])
            .arg(&sock)
            .args(["--filter=error", "--filter=delay", "--filter=rate"])
            .args(&cache_args[..cache_args.len().min(1)])
            .arg("file")
            .arg(&backing)
            .args(&cache_args[cache_args.len().min(1)..])
            .arg("error-pread-rate=1")
            .arg(format!("error-pread-file={}", r.display()))
            .arg("error-pwrite-rate=1")
            .arg(format!("error-pwrite-file={}", w.display()))
            .arg("error-zero-rate=1")
            .arg(format!("error-zero-file={}", w.display()))
            .arg("error-trim-rate=1")
            .arg(format!("error-trim-file={}", w.display()))
            .arg(format!("delay-read={delay}"))
            .arg(format!("delay-write={delay}"))
            .arg("rate=100G")
            .arg(format!("rate-file={}", rate.display()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nbdkit");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let file = mnt.join("member");
        let mut m = FaultyMember {
            dir: dir.to_path_buf(),
            mnt,
            file,
            nbdkit,
            nbdfuse: None,
        };
        // The socket file appears at bind(), a moment before nbdkit listens: wait until a
        // connection is accepted (nbdfuse gives up on a refused one).
        assert!(
            wait_for(Duration::from_secs(30), || {
                std::os::unix::net::UnixStream::connect(&sock).is_ok()
            }),
            "nbdkit did not listen on {}: {}",
            sock.display(),
            m.nbdkit_log()
        );
        let fuse_log = std::fs::File::create(dir.join("nbdfuse.log")).unwrap();
        m.nbdfuse = Some(
            Command::new("nbdfuse")
                .arg(&m.file)
                .arg("--unix")
                .arg(&sock)
                .stdout(Stdio::null())
                .stderr(fuse_log)
                .spawn()
                .expect("start nbdfuse"),
        );
        assert!(
            wait_for(Duration::from_secs(30), || std::fs::metadata(&m.file)
                .is_ok_and(|md| md.len() == size)),
            "nbdfuse did not mount {}: {}",
            m.file.display(),
            std::fs::read_to_string(dir.join("nbdfuse.log")).unwrap_or_default()
        );
        m
    }

    /// The file the array opens.
    fn path(&self) -> &Path {
        &self.file
    }

    fn trigger(&self, name: &str, on: bool) {
        let t = self.dir.join(name);
        if on {
            std::fs::write(t, b"").unwrap();
        } else {
            let _ = std::fs::remove_file(t);
        }
    }

    /// Limits its bandwidth to `rate` bits per second ("100M"; "100G": unlimited here),
    /// within a second.
    fn set_rate(&self, rate: &str) {
        std::fs::write(self.dir.join("rate"), format!("{rate}\n")).unwrap();
    }

    /// From now on every read fails with EIO (until `fail_reads(false)`).
    fn fail_reads(&self, on: bool) {
        self.trigger("fail-reads", on);
    }

    /// From now on every write, zero and trim fails with EIO (until `fail_writes(false)`).
    fn fail_writes(&self, on: bool) {
        self.trigger("fail-writes", on);
    }

    /// A power cut for this member: nbdkit is killed, losing what its cache held.
    fn power_cut(&mut self) {
        let _ = self.nbdkit.kill();
        let _ = self.nbdkit.wait();
    }

    /// nbdkit's stderr: it logs every injected error ("injecting EIO error into pwrite").
    fn nbdkit_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nbdkit.log")).unwrap_or_default()
    }
}

impl Drop for FaultyMember {
    /// Unmount (retrying while the file is still held briefly, lazily as a last resort),
    /// then stop nbdfuse and nbdkit.
    fn drop(&mut self) {
        if let Some(mut fuse) = self.nbdfuse.take() {
            let unmounted = wait_for(Duration::from_secs(3), || {
                Command::new("fusermount3")
                    .arg("-u")
                    .arg(&self.mnt)
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
            if !unmounted {
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.mnt)
                    .output();
            }
            reap(&mut fuse, Duration::from_secs(5));
        }
        let _ = self.nbdkit.kill();
        let _ = self.nbdkit.wait();
    }
}

/// A 4 KiB-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: the layout has a non-zero size (callers pass len > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to layout.size() initialized bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The harness itself: O_DIRECT I/O works on the nbdfuse file, and the triggers turn reads
/// and writes into EIO and back.
#[test]
fn faulty_member_takes_o_direct_io_and_fails_on_demand() {
    let dir = tmp("harness");
    let m = FaultyMember::start(&dir.join("f"), 8 << 20, "0ms");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path())
        .expect("O_DIRECT open of the nbdfuse file");
    let mut w = Aligned::new(64 << 10);
    for (i, b) in w.bytes().iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mut r = Aligned::new(64 << 10);
    f.write_all_at(w.bytes(), 1 << 20).unwrap();
    f.read_exact_at(r.bytes(), 1 << 20).unwrap();
    assert!(r.bytes() == w.bytes(), "O_DIRECT read-back differs");
    // Direct, not cached: after a buffered read has cached the range, the backing file is
    // changed behind nbdkit; an O_DIRECT read sees the change (it goes to the server). FUSE
    // does not enforce O_DIRECT alignment, so misaligned I/O is not caught here as on a disk.
    let mut cached = vec![0u8; 4096];
    std::fs::File::open(m.path())
        .unwrap()
        .read_exact_at(&mut cached, 1 << 20)
        .unwrap();
    assert!(cached[..] == w.bytes()[..4096]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.dir.join("backing"))
        .unwrap()
        .write_all_at(&[0xee; 4096], 1 << 20)
        .unwrap();
    f.read_exact_at(r.bytes(), 1 << 20).unwrap();
    assert!(
        r.bytes()[..4096].iter().all(|&b| b == 0xee),
        "O_DIRECT read was served from a cache"
    );
    f.write_all_at(w.bytes(), 1 << 20).unwrap();

    m.fail_writes(true);
    let e = f.write_all_at(w.bytes(), 2 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    f.read_exact_at(r.bytes(), 1 << 20).unwrap();
    m.fail_reads(true);
    let e = f.read_exact_at(r.bytes(), 1 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    m.fail_reads(false);
    m.fail_writes(false);
    f.write_all_at(w.bytes(), 2 << 20).unwrap();
    f.read_exact_at(r.bytes(), 2 << 20).unwrap();
    assert!(r.bytes() == w.bytes());
    let log = m.nbdkit_log();
    assert!(
        log.contains("injecting EIO error into pwrite")
            && log.contains("injecting EIO error into pread"),
        "{log}"
    );
    drop(f);
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `uraid serve` of `members` in `dir` on the Unix socket `sock`, its stderr in `log`, with
/// `extra` options.
fn serve(dir: &Path, sock: &Path, log: &Path, members: &[PathBuf], extra: &[&str]) -> Server {
    Serve::new(dir)
        .sock(sock)
        .log(log)
        .args(extra)
        .members(members)
        .start()
}

/// Fills `v[off..off + len]` with xorshift bytes.
fn random_into(v: &mut [u8], off: usize, len: usize, seed: u64) {
    let mut x = seed | 1;
    for b in &mut v[off..off + len] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Writes the non-zero ranges of `image` (given as `ranges`) to the export: a sparse file
/// holding just them, copied with nbdcopy --destination-is-zero, which sends only the data
/// extents (a holey source's holes are skipped).
fn write_ranges(dir: &Path, uri: &str, image: &[u8], ranges: &[(usize, usize)], tag: &str) {
    let p = dir.join(format!("{tag}.img"));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(image.len() as u64).unwrap();
    for &(off, len) in ranges {
        f.write_all_at(&image[off..off + len], off as u64).unwrap();
    }
    drop(f);
    run(Command::new("nbdcopy")
        .arg("--destination-is-zero")
        .arg(&p)
        .arg(uri));
    std::fs::remove_file(&p).unwrap();
}

fn read_volume(dir: &Path, uri: &str) -> Vec<u8> {
    let p = dir.join("readback.img");
    let _ = std::fs::remove_file(&p);
    run(Command::new("nbdcopy").arg(uri).arg(&p));
    let v = std::fs::read(&p).unwrap();
    std::fs::remove_file(&p).unwrap();
    v
}

/// Today's error policy, on a real I/O error: a RAID5 of four members, member 3 behind the
/// error filter. Data written while it works; then its writes fail; more data written. The
/// write error marks member 3 faulty (logged, recorded in the survivors' superblocks), every
/// client write still succeeds, and everything written reads back intact, also after a
/// restart with all four members given (member 3 is refused as failed).
#[test]
fn raid5_member_write_errors_mark_it_faulty_and_data_survives() {
    let t0 = Instant::now();
    let dir = tmp("raid5");
    const SIZE: u64 = 32 << 20;
    let faulty = FaultyMember::start(&dir.join("faulty"), SIZE, "1ms");
    let mut members: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{i}"))).collect();
    members.push(faulty.path().to_path_buf());
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args([
            "create", "--level", "5", "--chunk", "64K", "-N", "f", "--size", "32M",
        ])
        .args(&members));
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let s = serve(&dir, &sock, &log, &members, &[]);
    let vol = 3 * (SIZE as usize - (1 << 20));
    let mut image = vec![0u8; vol];
    const MIB: usize = 1 << 20;

    // Phase 1: all members healthy.
    let first = [(0, 4 * MIB), (30 * MIB, 3 * MIB), (60 * MIB, 3 * MIB / 2)];
    for (i, &(off, len)) in first.iter().enumerate() {
        random_into(&mut image, off, len, 11 + i as u64);
    }
    write_ranges(&dir, &uri, &image, &first, "first");
    assert!(
        !std::fs::read_to_string(&log).unwrap().contains("faulty"),
        "a member failed before any fault was injected"
    );

    // Phase 2: member 3's writes fail. Overlapping and new ranges, every one touching it.
    faulty.fail_writes(true);
    let second = [
        (2 * MIB, 4 * MIB),
        (45 * MIB, 2 * MIB),
        (80 * MIB, MIB + 4096),
    ];
    for (i, &(off, len)) in second.iter().enumerate() {
        random_into(&mut image, off, len, 101 + i as u64);
    }
    write_ranges(&dir, &uri, &image, &second, "second");
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        server_log.lines().any(|l| l.contains("member 3 (")
            && l.contains("failed: Input/output error")
            && l.contains("marking it faulty")),
        "server log: {server_log}"
    );
    assert!(faulty
        .nbdkit_log()
        .contains("injecting EIO error into pwrite"));
    // The survivors' superblocks record it, while the array still runs.
    let st = run_health(
        Command::new(env!("CARGO_BIN_EXE_uraid"))
            .arg("status")
            .args(&members[..3]),
    );
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(st.contains("[3/4] [UUU_]"), "{st}");
    assert!(
        read_volume(&dir, &uri) == image,
        "degraded read-back differs from what was written"
    );
    s.stop();

    // Restart with every member given: member 3 is refused as failed, the data is all there.
    faulty.fail_writes(false);
    let s = serve(&dir, &sock, &log, &members, &[]);
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        server_log.contains("member 3 is marked failed"),
        "server log: {server_log}"
    );
    assert!(
        read_volume(&dir, &uri) == image,
        "read-back after restart differs"
    );
    s.stop();
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
}

/// A RAID5 of four with member 3 behind the error filter, written while healthy.
fn raid5_with_faulty_member(tag: &str) -> (PathBuf, FaultyMember, Vec<PathBuf>, Vec<u8>) {
    let dir = tmp(tag);
    const SIZE: u64 = 32 << 20;
    let faulty = FaultyMember::start(&dir.join("faulty"), SIZE, "0ms");
    let mut members: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{i}"))).collect();
    members.push(faulty.path().to_path_buf());
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args([
            "create", "--level", "5", "--chunk", "64K", "-N", "f", "--size", "32M",
        ])
        .args(&members));
    let vol = 3 * (SIZE as usize - (1 << 20));
    let mut image = vec![0u8; vol];
    const MIB: usize = 1 << 20;
    let ranges = [(0, 6 * MIB), (40 * MIB, 2 * MIB)];
    for (i, &(off, len)) in ranges.iter().enumerate() {
        random_into(&mut image, off, len, 500 + i as u64);
    }
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let s = serve(&dir, &sock, &dir.join("setup.log"), &members, &[]);
    write_ranges(&dir, &uri, &image, &ranges, "setup");
    s.stop();
    (dir, faulty, members, image)
}

fn status_of(members: &[PathBuf]) -> String {
    let st = run_health(
        Command::new(env!("CARGO_BIN_EXE_uraid"))
            .arg("status")
            .args(members),
    );
    String::from_utf8_lossy(&st.stdout).into_owned()
}

/// md's read-error correction with a real EIO: every read of member 3 fails, yet every
/// client read returns the right bytes (reconstructed from the stripe), the bytes are
/// rewritten in place, and the member stays in the array while its error budget lasts; with
/// a budget of 2 the third error fails it. Either way no client read fails.
#[test]
fn raid5_member_read_errors_are_corrected_until_the_budget_is_spent() {
    let (dir, faulty, members, image) = raid5_with_faulty_member("readerr");
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");

    // Generous budget: corrected, member kept.
    let s = serve(
        &dir,
        &sock,
        &log,
        &members,
        &["--max-read-errors", "100000"],
    );
    faulty.fail_reads(true);
    assert!(
        read_volume(&dir, &uri) == image,
        "read-back with read errors differs"
    );
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        server_log.contains("member 3 (") && server_log.contains("reconstructing from the stripe"),
        "server log: {server_log}"
    );
    assert!(server_log.contains("rewrote"), "server log: {server_log}");
    assert!(
        !server_log.contains("marking it faulty"),
        "server log: {server_log}"
    );
    assert!(faulty
        .nbdkit_log()
        .contains("injecting EIO error into pread"));
    s.stop();
    faulty.fail_reads(false);
    let st = status_of(&members);
    assert!(st.contains("[4/4] [UUUU]"), "{st}");

    // Budget of 2: the member is failed on the third error, reads still all right.
    let log2 = dir.join("serve2.log");
    let s = serve(&dir, &sock, &log2, &members, &["--max-read-errors", "2"]);
    faulty.fail_reads(true);
    assert!(
        read_volume(&dir, &uri) == image,
        "read-back after the budget differs"
    );
    let server_log = std::fs::read_to_string(&log2).unwrap();
    assert!(
        server_log.contains("more than --max-read-errors 2: failing it"),
        "server log: {server_log}"
    );
    s.stop();
    faulty.fail_reads(false);
    let st = status_of(&members);
    assert!(
        st.contains("[3/4] [UUU_]") && st.contains("member 3 is marked failed"),
        "{st}"
    );
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member that stops answering (its nbdkit stopped with SIGSTOP: every I/O to it hangs in
/// FUSE) is timed out after --io-timeout and failed; client reads complete from the rest of
/// the stripe; after the device wakes up the server still stops cleanly.
#[test]
fn hung_member_is_timed_out_and_reads_complete() {
    let (dir, faulty, members, image) = raid5_with_faulty_member("hang");
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let s = serve(&dir, &sock, &log, &members, &["--io-timeout", "1"]);
    let pid = faulty.nbdkit.id() as i32;
    // SAFETY: kill(2) on the pid of a child this test spawned.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let t = Instant::now();
    // Bounded: without a timeout (or with the reactor itself stuck in the hung device) the
    // copy would never finish; `timeout` turns that into a failure.
    let p = dir.join("readback.img");
    let o = Command::new("timeout")
        .args(["60", "nbdcopy", &uri])
        .arg(&p)
        .output()
        .unwrap();
    // SAFETY: kill(2) on the pid of a child this test spawned.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(o.status.success(), "nbdcopy with a hung member: {o:?}");
    let got = std::fs::read(&p).unwrap();
    let took = t.elapsed();
    assert!(got == image, "read-back with a hung member differs");
    assert!(took < Duration::from_secs(30), "reads took {took:?}");
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        server_log.contains("member 3 (") && server_log.contains("timing it out"),
        "server log: {server_log}"
    );

    s.stop();
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 10's real-process trial: a RAID6 4+2 whose members sit behind volatile write
/// caches (nbdkit's cache filter in writeback mode, through nbdfuse). A base pattern is
/// written and flushed; then random 4 KiB writes run with a FLUSH every 8, and the server
/// and every nbdkit are killed (a power cut: what the caches held is lost, and members
/// differ in which of the last writes they kept). Restarted on the backing files (no cache):
/// started with a member missing it is refused (dirty and degraded); with every member it
/// resyncs; after that, with a member missing, every block the unflushed writes did not
/// touch reads back as the flushed base pattern (the write hole is closed).
#[test]
fn power_cut_behind_volatile_caches_then_resync_then_member_lost() {
    let dir = tmp("powercut");
    const SIZE: u64 = 16 << 20;
    const N: usize = 6;
    let mems: Vec<FaultyMember> = (0..N)
        .map(|i| FaultyMember::start_with(&dir.join(format!("c{i}")), SIZE, "5ms", true, true))
        .collect();
    let paths: Vec<PathBuf> = mems.iter().map(|m| m.path().to_path_buf()).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["create", "--level", "6", "--chunk", "16K", "-N", "pc"])
        .args(&paths));
    let (sock, log) = (dir.join("nbd.sock"), dir.join("serve.log"));
    let uri = format!("nbd+unix:///pc?socket={}", sock.display());
    let vol_len: usize = 4 << 20;
    let (base, touched) = base_then_power_cut(&dir, &uri, &paths, mems, vol_len, 11);
    // Power back: the backing files as they are, no cache.
    let mems: Vec<FaultyMember> = (0..N)
        .map(|i| FaultyMember::start_with(&dir.join(format!("c{i}")), SIZE, "0ms", false, false))
        .collect();
    let paths: Vec<PathBuf> = mems.iter().map(|m| m.path().to_path_buf()).collect();
    let status = status_of(&paths);
    assert!(status.contains("not stopped cleanly"), "{status}");
    // Degraded at once: refused.
    let o = Command::new(env!("CARGO_BIN_EXE_uraid"))
        .arg("serve")
        .arg(format!("--listen=unix:{}", dir.join("x.sock").display()))
        .args(["--control", "none"])
        .args(&paths[1..])
        .current_dir(&dir)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("not stopped cleanly and is degraded"), "{e}");
    // Whole: resync, then a clean stop.
    let srv = serve(&dir, &sock, &log, &paths, &[]);
    assert!(
        wait_for(Duration::from_secs(60), || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("resync finished"))
                || !status_live_resyncing(&dir)
        }),
        "resync did not finish"
    );
    srv.stop();
    let status = status_of(&paths);
    assert!(!status.contains("not stopped cleanly"), "{status}");
    // Degraded after the resync: every member left out in turn, the untouched blocks read
    // the flushed base.
    for lost in 0..N {
        let some: Vec<PathBuf> = (0..N)
            .filter(|&i| i != lost)
            .map(|i| paths[i].clone())
            .collect();
        let srv = serve(&dir, &sock, &log, &some, &["--read-only", "--run"]);
        let got = read_volume(&dir, &uri);
        srv.stop();
        for blk in 0..vol_len / 4096 {
            if touched.contains(&blk) {
                continue;
            }
            let r = blk * 4096..(blk + 1) * 4096;
            assert!(
                got[r.clone()] == base[r],
                "member {lost} lost: block {blk} (flushed, never rewritten) reads wrong"
            );
        }
    }
    drop(mems);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Serves `paths` (members behind volatile caches, `mems`), writes a random base pattern
/// (seeded) over the first `vol_len` bytes and FLUSHes it; then unflushed random 4 KiB writes
/// of 0xc3 from one qemu-io process with a FLUSH every 8, and a power cut while they run:
/// the server SIGKILLed first (it must not see its members vanish one by one and record
/// failures, which a real power cut gives it no time for), then every cache. Returns the
/// base and the 4 KiB blocks the writes touched. The caches are gone afterwards.
fn base_then_power_cut(
    dir: &Path,
    uri: &str,
    paths: &[PathBuf],
    mut mems: Vec<FaultyMember>,
    vol_len: usize,
    seed: u64,
) -> (Vec<u8>, std::collections::BTreeSet<usize>) {
    let (sock, log) = (dir.join("nbd.sock"), dir.join("serve.log"));
    let mut base = vec![0u8; vol_len];
    random_into(&mut base, 0, vol_len, seed);
    let srv = serve(dir, &sock, &log, paths, &[]);
    write_ranges(dir, uri, &base, &[(0, vol_len)], "base");
    // nbdcopy does not flush unless asked: an explicit NBD FLUSH makes the base durable.
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "flush"])
        .arg(uri));
    let mut x = 0x9e37_79b9_u64 ^ seed;
    let mut touched = std::collections::BTreeSet::new();
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", "-t", "none"]);
    for i in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let blk = (x % (vol_len as u64 / 4096)) as usize;
        touched.insert(blk);
        cmd.arg("-c")
            .arg(format!("aio_write -P 0xc3 {} 4k", blk * 4096));
        // A FLUSH now and then: each member's cache writes back at its own moment, so a
        // cut lands with some members holding a stripe's new chunks and others not.
        if i % 8 == 7 {
            cmd.arg("-c").arg("flush");
        }
    }
    // Stay connected (closing would flush everything).
    cmd.arg("-c").arg("sleep 100000");
    let mut writer = cmd
        .arg(uri)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    srv.kill();
    for m in &mut mems {
        m.power_cut();
    }
    let _ = writer.kill();
    let _ = writer.wait();
    drop(mems); // unmounts nbdfuse
    (base, touched)
}

/// Whether the server in `dir` (control socket ctl.sock) still reports a resync.
fn status_live_resyncing(dir: &Path) -> bool {
    let o = Command::new("curl")
        .args(["-s", "--unix-socket"])
        .arg(dir.join("ctl.sock"))
        .arg("http://uraid/status")
        .output();
    match o {
        Ok(o) => serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .map(|v| v["background"].as_array().is_some_and(|b| !b.is_empty()))
            .unwrap_or(true),
        Err(_) => true,
    }
}

/// The journal closes the write hole in real processes: the same power cut as above (members
/// *and* the journal behind volatile write caches, killed together) on a RAID6 4+2 with a
/// write-back journal, FLUSH every 8 writes. Then, from copies of the backing files as the
/// cut left them, the array is started with a member missing at once (no resync, no
/// --start-dirty-degraded): it must start, replay the journal, and read every block as
/// either the flushed base or the new pattern (never anything else), for several members
/// left out in turn.
#[test]
fn power_cut_with_a_journal_then_degraded_at_once() {
    let dir = tmp("journalcut");
    const SIZE: u64 = 16 << 20;
    const N: usize = 6;
    let mems: Vec<FaultyMember> = (0..=N)
        .map(|i| FaultyMember::start_with(&dir.join(format!("c{i}")), SIZE, "2ms", true, true))
        .collect();
    let paths: Vec<PathBuf> = mems.iter().map(|m| m.path().to_path_buf()).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["create", "--level", "6", "--chunk", "16K", "-N", "jc"])
        .args(["--journal-mode", "write-back", "--journal"])
        .arg(&paths[N])
        .args(&paths[..N]));
    let (sock, log) = (dir.join("nbd.sock"), dir.join("serve.log"));
    let uri = format!("nbd+unix:///jc?socket={}", sock.display());
    let vol_len: usize = 4 << 20;
    let (base, touched) = base_then_power_cut(&dir, &uri, &paths, mems, vol_len, 12);
    for lost in [0, 3, 5] {
        // A fresh copy of what the cut left, for each start (a replay changes the members).
        let run_dir = dir.join(format!("after{lost}"));
        for i in 0..=N {
            let d = run_dir.join(format!("c{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::copy(dir.join(format!("c{i}/backing")), d.join("backing")).unwrap();
        }
        let mems: Vec<FaultyMember> = (0..=N)
            .map(|i| {
                FaultyMember::start_with(&run_dir.join(format!("c{i}")), SIZE, "0ms", false, false)
            })
            .collect();
        let paths: Vec<PathBuf> = mems.iter().map(|m| m.path().to_path_buf()).collect();
        let status = status_of(&paths);
        assert!(status.contains("replays the journal"), "{status}");
        let some: Vec<PathBuf> = (0..=N)
            .filter(|&i| i != lost)
            .map(|i| paths[i].clone())
            .collect();
        let srv = serve(&run_dir, &sock, &log, &some, &["--run"]);
        let got = read_volume(&run_dir, &uri);
        srv.stop();
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(l.contains("replayed"), "no replay logged: {l}");
        let new = vec![0xc3u8; 4096];
        let mut changed = 0;
        for blk in 0..vol_len / 4096 {
            let r = blk * 4096..(blk + 1) * 4096;
            if touched.contains(&blk) && got[r.clone()] == new[..] {
                changed += 1;
                continue;
            }
            assert!(
                got[r.clone()] == base[r],
                "member {lost} lost at once after the cut: block {blk} reads neither the \
                 flushed base nor the new write"
            );
        }
        assert!(
            changed > 0,
            "no new write survived: the cut came too early to test"
        );
        drop(mems);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `uraid status --json` of a running server through its control socket in `dir`.
fn live_status(dir: &Path, members: &[PathBuf]) -> serde_json::Value {
    let o = run_health(
        Command::new(env!("CARGO_BIN_EXE_uraid"))
            .args(["status", "--json", "--control", "unix:ctl.sock"])
            .args(members)
            .current_dir(dir),
    );
    serde_json::from_slice(&o.stdout).expect("status JSON")
}

/// The issue's scenario with a device that really fails: RAID6 of six with member 2 behind
/// nbdkit's error filter and a hot spare; fio writes with crc32c verification, and mid-run
/// every read and write of member 2 starts failing with EIO (nbdkit's `error-file`, no test
/// code in uraid). The array fails it, the spare takes its slot and is rebuilt while fio goes
/// on; fio verifies every block; the array ends fully redundant; and with two other members
/// taken away afterwards fio verifies every block again, so the spare holds the right data.
#[test]
fn raid6_member_returning_eio_under_fio_verify_is_rebuilt_onto_a_spare() {
    let dir = tmp("eio-spare");
    const SIZE: u64 = 32 << 20;
    let faulty = FaultyMember::start(&dir.join("faulty"), SIZE, "0ms");
    let mut members: Vec<PathBuf> = (0..6).map(|i| dir.join(format!("m{i}"))).collect();
    members[2] = faulty.path().to_path_buf();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["create", "--level", "6", "-N", "f", "--size", "32M"])
        .args(&members)
        .current_dir(&dir));
    let spare = dir.join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let out = run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .arg("add")
        .arg(&spare)
        .args(&members)
        .current_dir(&dir));
    assert!(String::from_utf8_lossy(&out.stdout).contains("hot spare"));
    let mut all = members.clone();
    all.push(spare.clone());
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let s = serve(&dir, &sock, &log, &all, &["--resync-min", "20"]);
    let writer = {
        let (dir, uri) = (dir.clone(), uri.clone());
        std::thread::spawn(move || fio_job(&dir, "w", &uri, "rw=randwrite\ndo_verify=1"))
    };
    std::thread::sleep(Duration::from_millis(800));
    faulty.fail_writes(true);
    faulty.fail_reads(true);
    writer.join().expect("fio verified every block");
    assert!(
        faulty.nbdkit_log().contains("injecting EIO"),
        "nbdkit injected errors"
    );
    let ok = wait_for(Duration::from_secs(60), || {
        let j = live_status(&dir, &members);
        j["slots"]
            .as_array()
            .is_some_and(|v| v.iter().all(|x| x["state"] == "active"))
            && j["background"].as_array().is_some_and(|v| v.is_empty())
            && j["slots"][2]["path"] == spare.display().to_string().as_str()
    });
    assert!(
        ok,
        "never back to full redundancy on the spare: {}\n{}",
        live_status(&dir, &members),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let serve_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(serve_log.contains("member 2"), "{serve_log}");
    s.stop();
    faulty.fail_writes(false);
    faulty.fail_reads(false);
    // Members 0 and 1 away (and the failed device): every stripe needs the spare.
    let mut rest: Vec<PathBuf> = members[3..].to_vec();
    rest.push(spare.clone());
    let s = serve(&dir, &sock, &dir.join("verify.log"), &rest, &["--run"]);
    fio_job(&dir, "w", &uri, "rw=randwrite\nverify_only=1");
    s.stop();
    drop(faulty);
}

/// A fail-slow member on a real device stack: RAID6 of six members, each behind nbdkit and
/// nbdfuse; while a reader copies the volume over and over, member 2's bandwidth is cut to
/// 20 Mbit/s (nbdkit's rate filter, mid-run: many times slower than its peers). The server
/// flags it slow (status, metrics, events), serves reads of its chunks around it, every copy
/// reads back exactly, it is never failed, and it stays flagged while it is slow under the
/// load (its probation finds it slow and reads around it again).
#[test]
fn a_member_made_slow_mid_run_is_read_around_not_failed() {
    let dir = tmp("slow");
    const SIZE: u64 = 24 << 20;
    let mems: Vec<FaultyMember> = (0..6)
        .map(|i| FaultyMember::start(&dir.join(format!("f{i}")), SIZE, "0ms"))
        .collect();
    let paths: Vec<PathBuf> = mems.iter().map(|m| m.path().to_path_buf()).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["create", "--level", "6", "--chunk", "16K", "-N", "f"])
        .args(&paths)
        .current_dir(&dir));
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let s = serve(&dir, &sock, &log, &paths, &["--slow-factor", "5"]);
    let image_path = dir.join("image");
    let vol_len = 16 << 20;
    let mut image = vec![0u8; vol_len];
    random_into(&mut image, 0, vol_len, 41);
    std::fs::write(&image_path, &image).unwrap();
    run(Command::new("nbdcopy").arg(&image_path).arg(&uri));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (dir, uri, stop) = (dir.clone(), uri.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut copies = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let got = read_volume(&dir, &uri);
                assert!(got[..vol_len] == image[..], "copy {copies} differs");
                copies += 1;
            }
            copies
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let j = live_status(&dir, &paths);
    assert_eq!(j["slots"][2]["slow"], false, "before: {j}");
    mems[2].set_rate("20M");
    let flagged = wait_for(Duration::from_secs(30), || {
        live_status(&dir, &paths)["slots"][2]["slow"] == true
    });
    assert!(
        flagged,
        "member 2 never flagged slow: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let before = live_status(&dir, &paths)["stripe_operations"]["slow_reads_around"]
        .as_u64()
        .unwrap();
    // Flagged it stays while it is slow under the load: after 3 s of fast probes (a few
    // isolated reads find a bandwidth-limited member idle and fast) it is on probation, a
    // growing share of the reads of its chunks goes to it (3 s per stage), at the last stage
    // all of them, the load that flagged it; it is found slow under one of them and read
    // around again ("still slow under load"); it is never unflagged (read again, it would be
    // flagged again: flapping). Watched until that relapse, at most 45 s (it came 18-19 s
    // after the flag with both cores busy elsewhere).
    let t = std::time::Instant::now();
    let relapsed =
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("still slow under load"));
    while t.elapsed() < Duration::from_secs(45) && !relapsed() {
        let j = live_status(&dir, &paths);
        assert_eq!(
            j["slots"][2]["slow"],
            true,
            "unflagged after {:?}: {}",
            t.elapsed(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        relapsed(),
        "no probation found member 2 slow under load in 45 s: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let copies = reader.join().expect("every copy read back exactly");
    let j = live_status(&dir, &paths);
    let around = j["stripe_operations"]["slow_reads_around"]
        .as_u64()
        .unwrap();
    assert!(around > before, "no read went around the slow member: {j}");
    assert!(copies >= 3, "only {copies} copies");
    assert_eq!(j["slots"][2]["state"], "active", "slow is not failed: {j}");
    for (i, slot) in j["slots"].as_array().unwrap().iter().enumerate() {
        assert_eq!(slot["slow"], i == 2, "slot {i}: {j}");
    }
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        server_log.contains("member 2 (") && server_log.contains("is slow"),
        "{server_log}"
    );
    mems[2].set_rate("100G");
    s.stop();
    drop(mems);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (at most 20 s) until no process claims `members`: ring I/O a server left on a
/// device that hung holds its file, and so its `flock`, until the device answers it.
fn wait_unclaimed(members: &[PathBuf]) {
    for m in members {
        let free = wait_for(Duration::from_secs(20), || {
            let Ok(f) = std::fs::File::open(m) else {
                return false;
            };
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor this closure owns; closing it releases the lock.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
        });
        assert!(free, "{} still claimed", m.display());
    }
}

/// Stops `pid` (SIGSTOP: every I/O to its member hangs in FUSE) or lets it go on (SIGCONT).
fn freeze(pid: u32, on: bool) {
    let sig = if on { libc::SIGSTOP } else { libc::SIGCONT };
    // SAFETY: kill(2) on the pid of a child this test spawned.
    unsafe { libc::kill(pid as i32, sig) };
}

/// SIGTERM while a member hangs (its nbdkit stopped), during a scrub and a client's reads:
/// the member is timed out and failed, the server exits 0 within --io-timeout plus a few
/// seconds, and the next start (the member back) serves every byte with it recorded failed.
#[test]
fn sigterm_with_a_hung_member_during_a_scrub_stops_within_the_timeout() {
    let (dir, faulty, members, image) = raid5_with_faulty_member("hungstop");
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let mut s = serve(
        &dir,
        &sock,
        &log,
        &members,
        &["--io-timeout", "2", "--resync-max", "8"],
    );
    let mut args = vec!["scrub".to_string(), "--control=unix:ctl.sock".into()];
    args.extend(members.iter().map(|p| p.display().to_string()));
    ok(&uraid(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir,
    ));
    let mut reader = Command::new("nbdcopy")
        .arg(&uri)
        .arg(dir.join("during.img"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = faulty.nbdkit.id();
    let j = live_status(&dir, &members);
    assert_eq!(j["scrub"]["state"], "running", "{j}");
    freeze(pid, true);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    s.signal(libc::SIGTERM);
    let st = s.exit_within(Duration::from_secs(30));
    let took = t.elapsed();
    freeze(pid, false);
    kill_if_running(&mut reader);
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(st.success(), "exit status {st}: {server_log}");
    assert!(
        took < Duration::from_secs(2 + 3),
        "stop took {took:?}: {server_log}"
    );
    assert!(
        server_log.contains("member 3 (") && server_log.contains("timing it out"),
        "{server_log}"
    );
    let st = status_of(&members);
    assert!(st.contains("[3/4] [UUU_]"), "{st}");

    wait_unclaimed(&members);
    let s = serve(&dir, &sock, &dir.join("serve2.log"), &members, &[]);
    assert!(read_volume(&dir, &uri) == image, "read-back after the stop");
    s.stop();
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A host stall with real processes: every member of a RAID5 of three stops answering (their
/// nbdkits stopped) for three I/O timeouts while a client reads. No member is failed (the
/// log says it is taken for a host stall) and the read completes with the right bytes once
/// they answer. A stop during a stall that does not end exits (status 1) within
/// 2 x --io-timeout + 5 s; the next start has every member and serves every byte.
#[test]
fn host_stall_fails_no_member_and_a_stop_during_one_is_bounded() {
    let dir = tmp("stall");
    const SIZE: u64 = 16 << 20;
    let faulty: Vec<FaultyMember> = (0..3)
        .map(|i| FaultyMember::start(&dir.join(format!("f{i}")), SIZE, "0ms"))
        .collect();
    let members: Vec<PathBuf> = faulty.iter().map(|f| f.path().to_path_buf()).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args([
            "create", "--level", "5", "--chunk", "64K", "-N", "f", "--size", "16M",
        ])
        .args(&members));
    let vol = 2 * (SIZE as usize - (1 << 20));
    let mut image = vec![0u8; vol];
    const MIB: usize = 1 << 20;
    let ranges = [(0, 12 * MIB), (20 * MIB, 6 * MIB)];
    for (i, &(off, len)) in ranges.iter().enumerate() {
        random_into(&mut image, off, len, 900 + i as u64);
    }
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let mut s = serve(&dir, &sock, &log, &members, &["--io-timeout", "1"]);
    write_ranges(&dir, &uri, &image, &ranges, "base");
    let pids: Vec<u32> = faulty.iter().map(|f| f.nbdkit.id()).collect();

    // A stall of three timeouts under a reader (whose reads all wait on it).
    let out = dir.join("during.img");
    pids.iter().for_each(|&p| freeze(p, true));
    let mut reader = Command::new("nbdcopy")
        .arg(&uri)
        .arg(&out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    let during = std::fs::read_to_string(&log).unwrap();
    let still = matches!(reader.try_wait(), Ok(None));
    pids.iter().for_each(|&p| freeze(p, false));
    assert!(still, "the read finished during the stall: {during}");
    assert!(
        during.contains("treating it as a host stall"),
        "no stall logged: {during}"
    );
    let st = reader.wait().unwrap();
    assert!(st.success(), "the read failed after the stall: {during}");
    assert!(
        std::fs::read(&out).unwrap() == image,
        "read-back after a stall"
    );
    // The watchdog says the stall is over at its next round after the I/O answered.
    wait_for(Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("host stall over"))
    });
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !server_log.contains("marking it faulty") && server_log.contains("host stall over"),
        "{server_log}"
    );

    // A stall that does not end, and a stop.
    pids.iter().for_each(|&p| freeze(p, true));
    let mut reader = Command::new("nbdcopy")
        .arg(&uri)
        .arg(&out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    s.signal(libc::SIGTERM);
    let st = s.exit_within(Duration::from_secs(30));
    let took = t.elapsed();
    pids.iter().for_each(|&p| freeze(p, false));
    kill_if_running(&mut reader);
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(1), "{server_log}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(2 + 5 + 2),
        "stop took {took:?}: {server_log}"
    );
    assert!(
        server_log.contains("the stop did not finish within"),
        "{server_log}"
    );
    let st = status_of(&members);
    assert!(st.contains("[3/3] [UUU]"), "{st}");
    wait_unclaimed(&members);
    let s = serve(&dir, &sock, &dir.join("serve2.log"), &members, &[]);
    assert!(read_volume(&dir, &uri) == image, "read-back after the stop");
    s.stop();
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `qemu-io` `cmd` ("read 0 4k", "write -P 7 0 192k") on the export: its output.
fn qemu_io_out(uri: &str, cmd: &str) -> String {
    let o = Command::new("qemu-io")
        .args(["-f", "raw", "-c", cmd, uri])
        .output()
        .expect("qemu-io");
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Bad blocks with a real fault (md's bad-block log): a RAID5 of four loses member 0 and a
/// new device is rebuilt into its slot while every read of member 3 fails with EIO (nbdkit's
/// error filter). The rebuild cannot produce any written unit, records them as bad blocks
/// on member 0 and completes (it used to stop, leaving the member rebuilding); status shows
/// the list; a read that needs a bad chunk gets EIO; a full-stripe write clears its stripe,
/// which then reads back what was written (member 3's chunk reconstructed from the others).
#[test]
fn rebuild_past_a_survivor_returning_eio_completes_with_bad_blocks_a_write_clears() {
    let (dir, faulty, members, image) = raid5_with_faulty_member("badblk");
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    const MIB: usize = 1 << 20;
    // Member 0 missing: a write records it failed.
    let s = serve(
        &dir,
        &sock,
        &dir.join("degraded.log"),
        &members[1..],
        &["--run"],
    );
    write_ranges(&dir, &uri, &image, &[(0, MIB)], "degraded");
    s.stop();
    let new = dir.join("new0");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .arg("add")
        .arg(&new)
        .args(&members[1..]));
    let mut members = members;
    members[0] = new;
    let log = dir.join("serve.log");
    // A slow rebuild (1 MB/s of member I/O): member 3's reads fail from just after the start
    // (assembly reads its superblock), long before the walk reaches the data at 40 MiB.
    let s = serve(
        &dir,
        &sock,
        &log,
        &members,
        &["--max-read-errors", "1000000", "--resync-max", "1"],
    );
    faulty.fail_reads(true);
    assert!(
        wait_for(Duration::from_secs(60), || {
            live_status(&dir, &members)["slots"][0]["state"] == "active"
        }),
        "the rebuild did not complete: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let j = live_status(&dir, &members);
    let bad = &j["slots"][0]["bad_blocks"];
    assert!(
        bad["ranges"].as_array().is_some_and(|r| !r.is_empty()) && bad["bytes"].as_u64() > Some(0),
        "{j}"
    );
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        server_log.contains("recorded as bad blocks"),
        "{server_log}"
    );
    // Stripe 214 (volume bytes 42074112.., written at setup): member 0's chunk is bad and
    // member 3's unreadable, so a read of the stripe needs one or the other: EIO.
    let unit = 214u64;
    let at = unit * 3 * 65536;
    let out = qemu_io_out(&uri, &format!("read {at} 192k"));
    assert!(out.contains("Input/output error"), "{out}");
    let listed = |j: &serde_json::Value| {
        j["slots"][0]["bad_blocks"]["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| {
                let (f, n) = (
                    r["first_unit"].as_u64().unwrap(),
                    r["units"].as_u64().unwrap(),
                );
                f <= unit && unit < f + n
            })
    };
    assert!(listed(&live_status(&dir, &members)));
    // A full-stripe write (3 x 64K) rewrites member 0's chunk whole: cleared, and it reads
    // back (member 3's chunk, unreadable, is reconstructed from the others now).
    let out = qemu_io_out(&uri, &format!("write -P 0x5a {at} 192k"));
    assert!(out.contains("wrote 196608"), "{out}");
    let out = qemu_io_out(&uri, &format!("read -P 0x5a {at} 192k"));
    assert!(out.contains("read 196608"), "{out}");
    assert!(!listed(&live_status(&dir, &members)), "unit {unit} cleared");
    s.stop();
    faulty.fail_reads(false);
    // On disk: every member's superblock holds the list (md's --examine-badblocks).
    let ex = run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .arg("examine")
        .arg(&members[1]));
    let ex = String::from_utf8_lossy(&ex.stdout);
    assert!(ex.contains("Bad Blocks [ 0] :"), "{ex}");
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member that hangs before the server starts (its nbdkit stopped): assembly does not wait
/// for it past --io-timeout. The server starts without it (the log says why), serves every
/// byte from the other members, and stops; the session wrote nothing, so the member is not
/// recorded failed and is back next time.
#[test]
fn serve_starts_without_a_member_that_hangs_at_assembly() {
    let (dir, faulty, members, image) = raid5_with_faulty_member("hungstart");
    let sock = dir.join("uraid.sock");
    let uri = format!("nbd+unix:///f?socket={}", sock.display());
    let log = dir.join("serve.log");
    let pid = faulty.nbdkit.id();
    freeze(pid, true);
    let t = Instant::now();
    let s = serve(&dir, &sock, &log, &members, &["--io-timeout", "2", "--run"]);
    let took = t.elapsed();
    let got = read_volume(&dir, &uri);
    s.stop();
    freeze(pid, false);
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        took < Duration::from_secs(15),
        "start took {took:?}: {server_log}"
    );
    assert!(got == image, "read-back without the hung member differs");
    assert!(
        server_log.contains("did not arrive within 2s"),
        "{server_log}"
    );
    wait_unclaimed(&members);
    let st = status_of(&members);
    assert!(st.contains("[4/4] [UUUU]"), "{st}");
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}
