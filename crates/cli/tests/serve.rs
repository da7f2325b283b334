//! `uraid serve` against real NBD clients (nbdinfo, qemu-img, nbdcopy, fio, nbdfuse + loop +
//! ext4) and against a hand-written client that sends malformed and out-of-range requests.
//! Every test starts its own server on a Unix socket and an ephemeral loopback port in a
//! temp dir, and stops it with SIGTERM (checking the clean exit).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::*;
use uraid_testkit::nbd::Client;

/// Creates a raid6 over `n` sparse member files of `size` bytes in `dir`.
fn create(dir: &Path, n: usize, size: &str) -> Vec<PathBuf> {
    let m: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("m{i}"))).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args([
            "create", "--level", "6", "--chunk", "64K", "-N", "vol", "--size", size,
        ])
        .args(&m));
    m
}

/// `uraid serve` of `members` in `dir` on `dir/nbd.sock` and a loopback TCP port, with
/// `extra` options.
fn serve(dir: &Path, members: &[PathBuf], extra: &[&str]) -> Server {
    Serve::new(dir).tcp().args(extra).members(members).start()
}

fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let v: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(path, v).unwrap();
}

#[test]
fn nbdinfo_shows_the_export_and_its_capabilities() {
    let dir = tmp("info");
    let m = create(&dir, 6, "64M");
    let s = serve(&dir, &m, &[]);
    let o = run(Command::new("nbdinfo").args(["--json", &s.tcp_uri()]));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let e = &j["exports"][0];
    assert_eq!(e["export-name"], "vol");
    assert_eq!(e["export-size"], 4 * (64 << 20) - 4 * (1 << 20));
    for cap in [
        "can_multi_conn",
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_df",
        "can_cache",
    ] {
        assert_eq!(e[cap], true, "{cap}: {e}");
    }
    assert_eq!(e["is_read_only"], false);
    assert_eq!(e["block_size_minimum"], 512);
    assert_eq!(
        e["block_size_preferred"],
        256 << 10,
        "one full stripe (4 x 64K)"
    );
    assert_eq!(e["block_size_maximum"], 32 << 20);
    assert!(e["contexts"].to_string().contains("base:allocation"));
    assert!(e["description"].as_str().unwrap().contains("raid6"));
    // NBD_OPT_LIST over the Unix socket.
    let o = run(Command::new("nbdinfo").args(["--list", "--json", &s.uri()]));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["exports"][0]["export-name"], "vol");
    // A fresh volume is one hole; nbdinfo --map reads base:allocation.
    let o = run(Command::new("nbdinfo").args(["--map", &s.tcp_uri()]));
    let map = String::from_utf8_lossy(&o.stdout);
    assert!(
        map.contains("hole,zero") && map.lines().count() == 1,
        "{map}"
    );
    s.stop();
    // Read-only serving advertises it.
    let s = serve(&dir, &m, &["--read-only"]);
    let o = run(Command::new("nbdinfo").args(["--json", &s.tcp_uri()]));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["exports"][0]["is_read_only"], true);
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qemu_img_and_nbdcopy_round_trip_with_holes_and_degraded_restart() {
    let dir = tmp("qemu");
    let m = create(&dir, 6, "64M");
    let size = 4 * (64u64 << 20) - 4 * (1 << 20);
    let img = dir.join("src.img");
    random_file(&img, 48 << 20, 7);
    let s = serve(&dir, &m, &[]);
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&img)
        .arg(s.tcp_uri()));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&img)
        .arg(s.uri()));
    // nbdcopy back out over 4 connections (multi-conn) and in again to another offset range
    // through a second file.
    let back = dir.join("back.img");
    run(Command::new("nbdcopy")
        .args(["--connections=4", &s.uri()])
        .arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len() as u64, size);
    let want = std::fs::read(&img).unwrap();
    assert!(
        got[..want.len()] == want[..],
        "nbdcopy read back different data"
    );
    assert!(
        got[want.len()..].iter().all(|&b| b == 0),
        "never-written tail must read as zeros"
    );
    let full = dir.join("full.img");
    random_file(&full, size as usize, 11);
    run(Command::new("nbdcopy")
        .args(["--connections=4", "--flush"])
        .arg(&full)
        .arg(s.tcp_uri()));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&full)
        .arg(s.tcp_uri()));
    // Zero a range with qemu-io (WRITE_ZEROES, may unmap) and check it reads back as zeros.
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -z -u 1M 8M", &s.tcp_uri()]));
    let mut expect = std::fs::read(&full).unwrap();
    expect[1 << 20..9 << 20].fill(0);
    std::fs::write(&full, &expect).unwrap();
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&full)
        .arg(s.tcp_uri()));
    s.stop();
    // Restart with two of the six members gone: same data.
    let s = serve(&dir, &m[2..], &["--run"]);
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&full)
        .arg(s.uri()));
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fio_random_writes_verify_over_tcp_and_unix() {
    let dir = tmp("fio");
    let m = create(&dir, 6, "64M");
    let s = serve(&dir, &m, &[]);
    for (name, uri) in [("tcp", s.tcp_uri()), ("unix", s.uri())] {
        // fio writes its verify state file into its working directory: keep it in the temp dir.
        let o = run(Command::new("fio").current_dir(&dir).args([
            &format!("--name={name}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=32m",
            "--verify=crc32c",
            "--do_verify=1",
            "--output-format=json",
        ]));
        let out = String::from_utf8_lossy(&o.stdout);
        let json = &out[out.find('{').expect("fio printed JSON")..];
        let j: serde_json::Value = serde_json::from_str(json).unwrap();
        let job = &j["jobs"][0];
        assert_eq!(job["error"], 0, "{name}: {job}");
        assert_eq!(job["write"]["io_bytes"], 32 << 20, "{name}");
        assert_eq!(
            job["read"]["io_bytes"],
            32 << 20,
            "{name}: verify pass read everything"
        );
    }
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// ext4 through nbdfuse + a loop device: mkfs, files, unmount, fsck, restart, verify; then
/// again with two members missing.
#[test]
fn ext4_on_the_volume_survives_restart_and_two_missing_members() {
    let dir = tmp("ext4");
    let m = create(&dir, 6, "96M");
    let files: Vec<(String, PathBuf)> = (0..5)
        .map(|i| {
            let p = dir.join(format!("f{i}"));
            random_file(&p, (1 << 20) + i * 4097, 100 + i as u64);
            (format!("f{i}"), p)
        })
        .collect();
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();

    let s = serve(&dir, &m, &[]);
    let fuse = Fuse::mount(&dir, &s.uri(), false);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&fuse.loopdev));
    run(Command::new("mount").arg(&fuse.loopdev).arg(&mnt));
    for (n, p) in &files {
        std::fs::copy(p, mnt.join(n)).unwrap();
    }
    run(Command::new("umount").arg(&mnt));
    run(Command::new("e2fsck").args(["-fn"]).arg(&fuse.loopdev));
    fuse.unmount();
    s.stop();

    for members in [&m[..], &m[2..]] {
        let s = serve(&dir, members, &["--read-only", "--run"]);
        let fuse = Fuse::mount(&dir, &s.uri(), true);
        run(Command::new("e2fsck").args(["-fn"]).arg(&fuse.loopdev));
        run(Command::new("mount")
            .args(["-o", "ro,noload"])
            .arg(&fuse.loopdev)
            .arg(&mnt));
        for (n, p) in &files {
            assert!(
                std::fs::read(mnt.join(n)).unwrap() == std::fs::read(p).unwrap(),
                "{n} differs with {} members",
                members.len()
            );
        }
        run(Command::new("umount").arg(&mnt));
        fuse.unmount();
        s.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// nbdfuse exposing the export as a file, and a loop device over that file.
struct Fuse {
    child: Child,
    dir: PathBuf,
    loopdev: String,
}

impl Fuse {
    fn mount(base: &Path, uri: &str, ro: bool) -> Fuse {
        let dir = base.join("fuse");
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("nbdfuse");
        if ro {
            cmd.arg("--readonly");
        }
        // Four connections: the kernel's requests go out over multi-conn.
        let child = cmd
            .args(["-C", "4"])
            .arg(&dir)
            .arg(uri)
            .stdout(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        let file = dir.join("nbd");
        for _ in 0..100 {
            if std::fs::metadata(&file).is_ok_and(|m| m.len() > 0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = vec!["--find", "--show", "--direct-io=on"];
        if ro {
            args.push("--read-only");
        }
        let o = run(Command::new("losetup").args(&args).arg(&file));
        let loopdev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        Fuse {
            child,
            dir,
            loopdev,
        }
    }

    fn unmount(mut self) {
        run(Command::new("losetup").args(["-d", &self.loopdev]));
        // The loop device lets go asynchronously; retry the unmount briefly.
        for i in 0..50 {
            let o = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.dir)
                .output();
            if o.is_ok_and(|o| o.status.success()) {
                break;
            }
            assert!(i < 49, "fusermount3 -u {} kept failing", self.dir.display());
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.wait();
    }
}

impl Drop for Fuse {
    /// Best-effort cleanup when a test fails with the device still set up.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("losetup").args(["-d", &self.loopdev]).output();
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.dir)
                .output();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn bad_input_gets_the_spec_errors_and_the_server_stays_up() {
    const EPERM: u32 = 1;
    const EINVAL: u32 = 22;
    const ENOSPC: u32 = 28;
    const EOVERFLOW: u32 = 75;
    let dir = tmp("bad");
    let m = create(&dir, 6, "16M");
    let size = 4 * (16u64 << 20) - 4 * (1 << 20);
    let s = serve(&dir, &m, &[]);

    // Handshake: unknown option, malformed GO, unknown export, then a good GO.
    let mut c = Client::connect(&s.sock);
    c.option(0x4242, b"xyz");
    assert_eq!(c.opt_reply().0, 0x8000_0001, "unknown option -> ERR_UNSUP");
    c.option(7, &[0, 0, 0, 200, b'v']);
    assert_eq!(c.opt_reply().0, 0x8000_0003, "truncated GO -> ERR_INVALID");
    c.option(3, b"junk");
    assert_eq!(
        c.opt_reply().0,
        0x8000_0003,
        "LIST with data -> ERR_INVALID"
    );
    let mut d = 4u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"nope");
    d.extend_from_slice(&0u16.to_be_bytes());
    c.option(7, &d);
    assert_eq!(
        c.opt_reply().0,
        0x8000_0006,
        "unknown export -> ERR_UNKNOWN"
    );
    let flags = c.go();
    assert!(flags & (1 << 8) != 0, "multi-conn advertised");

    let sector = vec![0xabu8; 512];
    // (what, flags, command, offset, length, payload, expected error)
    type Case<'a> = (&'a str, u16, u16, u64, u32, Vec<u8>, u32);
    let cases: Vec<Case> = vec![
        ("read past the end", 0, 0, size - 512, 1024, vec![], EINVAL),
        (
            "read with overflowing offset",
            0,
            0,
            u64::MAX - 511,
            1024,
            vec![],
            EINVAL,
        ),
        ("misaligned read", 0, 0, 100, 512, vec![], EINVAL),
        ("misaligned length", 0, 0, 0, 100, vec![], EINVAL),
        // Longer than the advertised maximum block size: EINVAL (EOVERFLOW is only for a
        // DF read too large for one chunk, checked below with structured replies).
        (
            "oversized simple read",
            0,
            0,
            0,
            (32 << 20) + 512,
            vec![],
            EINVAL,
        ),
        (
            "write past the end",
            0,
            1,
            size,
            512,
            sector.clone(),
            ENOSPC,
        ),
        ("misaligned write", 0, 1, 4, 512, sector.clone(), EINVAL),
        ("trim past the end", 0, 4, size, 512, vec![], EINVAL),
        (
            "zeroes past the end",
            0,
            6,
            size - 512,
            1024,
            vec![],
            ENOSPC,
        ),
        ("unknown command", 0, 99, 0, 0, vec![], EINVAL),
        ("unknown flag on read", 1 << 9, 0, 0, 512, vec![], EINVAL),
        (
            "DF without structured replies",
            1 << 2,
            0,
            0,
            512,
            vec![],
            EINVAL,
        ),
        ("flush with a length", 0, 3, 0, 512, vec![], EINVAL),
        (
            "block status without a context",
            0,
            7,
            0,
            512,
            vec![],
            EINVAL,
        ),
    ];
    for (i, (what, fl, typ, off, len, data, want)) in cases.iter().enumerate() {
        c.request(*fl, *typ, i as u64, *off, *len, data);
        assert_eq!(c.simple(), (*want, i as u64), "{what}");
    }
    // An oversized write's payload is drained (never buffered whole) and refused.
    let big = (33u32 << 20) + 512;
    c.request(0, 1, 77, 0, big, &vec![1u8; big as usize]);
    assert_eq!(c.simple(), (EINVAL, 77), "oversized write");
    // The connection still works: write, read back, flush with FUA, pipelined.
    c.request(1, 1, 100, 4096, 512, &sector);
    c.request(0, 3, 101, 0, 0, &[]);
    let mut got = [c.simple(), c.simple()];
    got.sort();
    assert_eq!(got, [(0, 100), (0, 101)]);
    c.request(0, 0, 102, 4096, 512, &[]);
    assert_eq!(c.simple(), (0, 102));
    let mut back = vec![0u8; 512];
    c.s.read_exact(&mut back).unwrap();
    assert_eq!(back, sector);
    // Bad request magic closes this connection only.
    c.s.write_all(&[0u8; 28]).unwrap();
    assert!(c.closed(), "bad magic must close the connection");
    // Unknown client flags close the handshake.
    let mut c2 = UnixStream::connect(&s.sock).unwrap();
    let mut g = [0u8; 18];
    c2.read_exact(&mut g).unwrap();
    c2.write_all(&0x80u32.to_be_bytes()).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(c2.read(&mut b), Ok(0) | Err(_)));
    // Garbage instead of an option header closes it too.
    let mut c3 = Client::connect(&s.sock);
    c3.s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(c3.closed());
    // With structured replies: an oversized read is EINVAL too, unless it asks not to be
    // fragmented (DF), which is EOVERFLOW; a DF read within the maximum is served whole.
    let mut c4 = Client::connect(&s.sock);
    c4.option(8, &[]);
    assert_eq!(c4.opt_reply().0, 1, "structured replies acknowledged");
    let flags = c4.go();
    assert!(flags & (1 << 7) != 0, "DF advertised");
    c4.request(0, 0, 1, 0, (32 << 20) + 512, &[]);
    assert_eq!(c4.error_chunk(), (EINVAL, 1), "oversized structured read");
    c4.request(1 << 2, 0, 2, 0, (32 << 20) + 512, &[]);
    assert_eq!(c4.error_chunk(), (EOVERFLOW, 2), "oversized DF read");
    c4.request(1 << 2, 0, 3, 4096, 512, &[]);
    let (fl, typ, h, d) = c4.chunk();
    assert_eq!((typ, h), (1, 3), "one OFFSET_DATA chunk");
    assert_eq!(&d[..8], &4096u64.to_be_bytes());
    assert_eq!(d[8..], sector[..]);
    if fl & 1 == 0 {
        let (fl, typ, h, _) = c4.chunk();
        assert_eq!(
            (fl & 1, typ, h),
            (1, 0, 3),
            "then NBD_REPLY_TYPE_NONE, done"
        );
    }
    // Everyone else is still served.
    let o = run(Command::new("nbdinfo").args(["--size", &s.uri()]));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), size.to_string());
    s.stop();

    // Read-only export: writes, trims and zeroes get EPERM.
    let s = serve(&dir, &m, &["--read-only"]);
    let mut c = Client::connect(&s.sock);
    let flags = c.go();
    assert!(flags & 2 != 0, "read-only flag");
    c.request(0, 1, 1, 0, 512, &sector);
    assert_eq!(c.simple(), (EPERM, 1));
    c.request(0, 4, 2, 0, 512, &[]);
    assert_eq!(c.simple(), (EPERM, 2));
    c.request(0, 6, 3, 0, 512, &[]);
    assert_eq!(c.simple(), (EPERM, 3));
    c.request(0, 2, 4, 0, 0, &[]); // NBD_CMD_DISC
    assert!(c.closed());
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGHUP (the session or terminal went away) stops the server like SIGTERM: exit 0 with
/// every member's superblock marked clean, and the data written before it is there after a
/// restart.
#[test]
fn sighup_stops_the_server_cleanly() {
    let dir = tmp("hup");
    let m = create(&dir, 6, "16M");
    let mut s = serve(&dir, &m, &[]);
    let mut c = Client::connect(&s.sock);
    c.go();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    c.request(0, 1, 1, 65536, data.len() as u32, &data);
    assert_eq!(c.simple(), (0, 1));
    // The write marked the array dirty on disk while it is being served.
    assert!(
        !examine_clean(&m[0]),
        "array dirty while serving after a write"
    );
    // The client stays connected (idle) across the signal.
    s.signal(libc::SIGHUP);
    let st = s.exit_within(Duration::from_secs(10));
    assert!(st.success(), "uraid serve exited with {st} after SIGHUP");
    assert!(c.closed(), "the idle connection was closed");
    for member in &m {
        assert!(examine_clean(member), "{} not clean", member.display());
    }
    let s = serve(&dir, &m, &[]);
    let mut c = Client::connect(&s.sock);
    c.go();
    c.request(0, 0, 2, 65536, data.len() as u32, &[]);
    assert_eq!(c.simple(), (0, 2));
    let mut back = vec![0u8; data.len()];
    c.s.read_exact(&mut back).unwrap();
    assert!(back == data, "data written before SIGHUP reads back");
    c.request(0, 2, 3, 0, 0, &[]);
    assert!(c.closed());
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the server said at start about its copies (copies.rs), if anything.
fn copies_line(s: &Server) -> Option<&str> {
    s.started
        .iter()
        .find_map(|l| l.strip_prefix("uraid: copies: GLIBC_TUNABLES sets "))
}

/// The process name (`/proc/PID/comm`: what ps, pgrep and the member lock's "in use by" show).
fn comm(s: &Server) -> String {
    std::fs::read_to_string(format!("/proc/{}/comm", s.pid()))
        .unwrap()
        .trim_end()
        .to_string()
}

fn amd_cpu() -> bool {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    cpuinfo
        .lines()
        .find(|l| l.starts_with("vendor_id"))
        .is_some_and(|l| l.ends_with("AuthenticAMD"))
}

const VECTOR_COPIES: &str = "glibc.cpu.x86_rep_movsb_threshold=1000000000";

/// On an AMD CPU `serve` runs with glibc's vector copies (it started itself again, same
/// process, same name, with the tunable: copies.rs) and says so; on others it leaves the
/// environment alone; a value the operator gave is kept either way, and the server serves.
/// Through a link, or with another argv[0], it execs the path it was started from (the
/// process keeps its name); started by the dynamic loader itself it does not, and warns.
#[test]
fn serve_on_amd_runs_with_vector_copies_and_keeps_an_operators_choice() {
    let dir = tmp("copies");
    let m = create(&dir, 4, "16M");
    let amd = amd_cpu();
    let s = Serve::new(&dir)
        .members(&m)
        .env_remove("GLIBC_TUNABLES")
        .start();
    assert_eq!(
        copies_line(&s),
        amd.then_some(VECTOR_COPIES),
        "AMD CPU: {amd}"
    );
    assert_eq!(comm(&s), "uraid");
    let mut c = Client::connect(&s.sock);
    c.go();
    c.request(0, 2, 1, 0, 0, &[]);
    assert!(c.closed());
    s.stop();
    // Other tunables do not stop it.
    let s = Serve::new(&dir)
        .members(&m)
        .env("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
        .start();
    assert_eq!(copies_line(&s), amd.then_some(VECTOR_COPIES));
    s.stop();
    // The operator's threshold is the one it runs with, on any CPU.
    let mine = "glibc.cpu.x86_rep_movsb_threshold=8192";
    let s = Serve::new(&dir)
        .members(&m)
        .env("GLIBC_TUNABLES", format!("glibc.malloc.arena_max=4:{mine}"))
        .start();
    assert_eq!(copies_line(&s), Some(mine));
    s.stop();
    // Through a link of another name (alternatives-style): the exec goes through the link,
    // so the process keeps the name it was started by.
    let link = dir.join("uraid-link");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_uraid"), &link).unwrap();
    let s = Serve::new(&dir)
        .bin(&link)
        .members(&m)
        .env_remove("GLIBC_TUNABLES")
        .start();
    assert_eq!(copies_line(&s), amd.then_some(VECTOR_COPIES));
    assert_eq!(comm(&s), "uraid-link");
    s.stop();
    // Started with an argv[0] that names another program (`exec -a`, systemd's `@`): the
    // exec goes through the path the kernel was given, so the name stays.
    let s = Serve::new(&dir)
        .wrap(["bash", "-c", r#"exec -a other-name "$0" "$@""#])
        .members(&m)
        .env_remove("GLIBC_TUNABLES")
        .start();
    assert_eq!(copies_line(&s), amd.then_some(VECTOR_COPIES));
    assert_eq!(comm(&s), "uraid");
    s.stop();
    // Started by the dynamic loader itself: no exec (it would run the loader), a warning on
    // AMD, and it serves.
    let log = dir.join("ldso.log");
    let s = Serve::new(&dir)
        .wrap(["/lib64/ld-linux-x86-64.so.2"])
        .members(&m)
        .env_remove("GLIBC_TUNABLES")
        .env_remove("URAID_LOG")
        .log(&log)
        .start();
    assert_eq!(copies_line(&s), None);
    s.stop();
    let warned = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        warned.contains("not started again with glibc.cpu.x86_rep_movsb_threshold"),
        amd,
        "{warned}"
    );
    if !amd {
        eprintln!("not an AMD CPU: only checked that serve leaves its environment alone");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A start with AT_SECURE (here: a binary with a file capability, run by an unprivileged
/// user) does not exec itself again: the loader drops the tunable from such a process's
/// environment, so every start would exec once more, forever. It serves as it is. Needs
/// root (chown, setcap, setpriv) and a temp dir on a mount that honours file capabilities.
#[test]
fn serve_with_a_file_capability_does_not_exec_itself_forever() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = tmp("copies-secure");
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs fills the struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0);
    if st.f_flag & libc::ST_NOSUID != 0 {
        eprintln!("skipped: {} is on a nosuid mount", dir.display());
        return;
    }
    let m = create(&dir, 4, "16M");
    let bin = dir.join("uraid");
    std::fs::copy(env!("CARGO_BIN_EXE_uraid"), &bin).unwrap();
    for p in m.iter().chain([&dir, &bin]) {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    // After the chown, which clears file capabilities.
    run(Command::new("setcap")
        .arg("cap_net_bind_service=ep")
        .arg(&bin));
    let s = Serve::new(&dir)
        .bin(&bin)
        .wrap([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .members(&m)
        .env_remove("GLIBC_TUNABLES")
        .start();
    // The premise: the kernel started it with AT_SECURE (type 23 in /proc/PID/auxv).
    let auxv = std::fs::read(format!("/proc/{}/auxv", s.pid())).unwrap();
    let secure = auxv.chunks_exact(16).find_map(|kv| {
        let k = u64::from_ne_bytes(kv[..8].try_into().unwrap());
        (k == 23).then(|| u64::from_ne_bytes(kv[8..].try_into().unwrap()))
    });
    if secure != Some(1) {
        // No new privileges, or a bounding set without the capability (some containers).
        s.stop();
        eprintln!("skipped: the file capability did not give AT_SECURE here");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    assert_eq!(copies_line(&s), None);
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Clients that never send (one right after the greeting, one after NBD_OPT_GO) and one
/// connecting while the server stops do not hold up SIGTERM: exit 0 within 5 s.
#[test]
fn idle_clients_do_not_hold_up_shutdown() {
    let dir = tmp("idle");
    let m = create(&dir, 6, "16M");
    let mut s = serve(&dir, &m, &[]);
    let quiet_tcp = std::net::TcpStream::connect(s.tcp_addr()).unwrap();
    let mut quiet_unix = UnixStream::connect(&s.sock).unwrap();
    quiet_unix
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut g = [0u8; 18];
    quiet_unix.read_exact(&mut g).unwrap();
    let mut idle = Client::connect(&s.sock);
    idle.go();
    // More clients keep connecting (and then say nothing) while the signal arrives.
    let sock = s.sock.clone();
    let tcp = s.tcp_addr().to_string();
    let late = std::thread::spawn(move || {
        let mut held = Vec::new();
        for i in 0..200 {
            if i % 2 == 0 {
                match UnixStream::connect(&sock) {
                    Ok(c) => held.push(Box::new(c) as Box<dyn std::any::Any + Send>),
                    Err(_) => break,
                }
            } else {
                match std::net::TcpStream::connect(&tcp) {
                    Ok(c) => held.push(Box::new(c)),
                    Err(_) => break,
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        held
    });
    std::thread::sleep(Duration::from_millis(50));
    s.signal(libc::SIGTERM);
    let st = s.exit_within(Duration::from_secs(5));
    assert!(st.success(), "uraid serve exited with {st}");
    assert!(idle.closed(), "the idle client was closed");
    drop((quiet_tcp, late.join().unwrap()));
    for member in &m {
        assert!(examine_clean(member), "{} not clean", member.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --read-only` opens the members read-only and writes nothing: it serves with a
/// write-protected member (a read-only loop device) and every member file is byte for byte
/// what it was, superblocks included. Without `--read-only` that member is refused at once,
/// named with its slot, and the way out is given.
#[test]
fn read_only_serves_write_protected_members_and_writes_nothing() {
    let dir = tmp("readonly");
    let m = create(&dir, 4, "16M");
    let srv = serve(&dir, &m, &[]);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 7 0 1M", &srv.uri()]));
    srv.stop();
    let before: Vec<Vec<u8>> = m.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let lo = Command::new("losetup")
        .args(["-r", "-f", "--show"])
        .arg(&m[3])
        .output();
    let loopdev = match lo {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            eprintln!("SKIPPED read_only_serves_write_protected_members: losetup: {other:?}");
            return;
        }
    };
    let members = [
        m[0].display().to_string(),
        m[1].display().to_string(),
        m[2].display().to_string(),
        loopdev.clone(),
    ];
    // Bounded: a server that starts anyway is stopped by the timeout, and the test fails.
    let listen = format!("unix:{}", dir.join("rw.sock").display());
    let refused = Command::new("timeout")
        .args([
            "20",
            env!("CARGO_BIN_EXE_uraid"),
            "serve",
            "--listen",
            &listen,
        ])
        .args(["--control", "none"])
        .args(&members)
        .current_dir(&dir)
        .output()
        .unwrap();
    let srv = Serve::new(&dir)
        .args(["--read-only"])
        .members(&members)
        .start();
    let read = Command::new("qemu-io")
        .args([
            "-r",
            "-f",
            "raw",
            "-c",
            "read -P 7 0 1M",
            "-c",
            "read -P 0 1M 1M",
        ])
        .arg(srv.uri())
        .output();
    srv.stop();
    run(Command::new("losetup").args(["-d", &loopdev]));
    let e = String::from_utf8_lossy(&refused.stderr).to_string();
    assert_eq!(refused.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!("member 3 ({loopdev}) is write-protected"))
            && e.contains("--read-only"),
        "{e}"
    );
    let read = read.unwrap();
    assert!(
        read.status.success() && !String::from_utf8_lossy(&read.stdout).contains("Pattern"),
        "{read:?}"
    );
    for (p, b) in m.iter().zip(&before) {
        assert!(
            std::fs::read(p).unwrap() == *b,
            "{} changed under a read-only server",
            p.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
