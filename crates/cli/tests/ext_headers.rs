//! NBD extended headers (NBD_OPT_EXTENDED_HEADERS: 32-byte requests and replies, 64-bit
//! lengths) with the client on this machine that asks for them (qemu-io 10), the fallback
//! for one that does not (libnbd 1.14's nbdinfo). Under TLS: tls.rs (qemu-io negotiates
//! them again after STARTTLS).

mod common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A RAID5 of four sparse members with a volume past 4 GiB (so one block status extent
/// needs 64 bits).
fn create(dir: &Path) -> Vec<PathBuf> {
    let m: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("m{i}"))).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args([
            "create", "--level", "5", "--chunk", "64K", "-N", "vol", "--size", "2G",
        ])
        .args(&m));
    m
}

fn status(srv: &Server) -> Value {
    let o = Command::new("curl")
        .args([
            "-sf",
            "--unix-socket",
            srv.ctl.to_str().unwrap(),
            "http://uraid/status",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Waits until the server lists a client in transmission; returns its "headers".
fn headers_of_client(srv: &Server) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = status(srv);
        let c = st["connections"]["clients"].as_array().unwrap().clone();
        if let Some(c) = c.iter().find(|c| c["phase"] == "transmission") {
            return c["headers"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no client in transmission: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// qemu-io kept open on its stdin (so its connection stays up) after `cmds`.
fn qemu_io(opts: &str, objects: &[String], cmds: &[&str]) -> Child {
    let mut c = Command::new("qemu-io");
    for o in objects {
        c.args(["--object", o]);
    }
    let mut child = c
        .args(["--image-opts", opts])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.as_mut().unwrap();
    for cmd in cmds {
        writeln!(stdin, "{cmd}").unwrap();
    }
    child
}

fn finish(mut child: Child) -> String {
    writeln!(child.stdin.as_mut().unwrap(), "quit").unwrap();
    let o = child.wait_with_output().unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "qemu-io: {t}");
    t
}

#[test]
fn qemu_negotiates_extended_headers_and_old_clients_fall_back() {
    let dir = tmp("ext");
    let ms = create(&dir);
    let srv = Serve::new(&dir).tcp().members(&ms).start();
    let port = srv.tcp_addr().rsplit(':').next().unwrap().to_string();
    let opts =
        format!("driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export=vol");
    // Data, zeroes, a trim, and a map whose one hole extent is longer than 4 GiB (a
    // 64-bit block status descriptor).
    let child = qemu_io(
        &opts,
        &[],
        &[
            "write -P 0x5a 0 3M",
            "read -P 0x5a 0 3M",
            "write -z 1M 1M",
            "read -P 0 1M 1M",
            "discard 2M 1M",
            "read -P 0 2M 1M",
            "read -P 0x5a 0 1M",
            "map",
        ],
    );
    assert_eq!(headers_of_client(&srv), "extended");
    let out = finish(child);
    assert!(
        !out.contains("fail") && !out.contains("Pattern verification"),
        "{out}"
    );
    let o = Command::new("qemu-img")
        .args(["map", "--output=json", "--image-opts", &opts])
        .output()
        .unwrap();
    let map: Value = serde_json::from_slice(&o.stdout).unwrap();
    let longest = map
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["length"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(longest > 4 << 30, "an extent longer than 4 GiB: {map}");
    let total: u64 = map
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["length"].as_u64().unwrap())
        .sum();
    let size: u64 = String::from_utf8(
        Command::new("nbdinfo")
            .args(["--size", &srv.tcp_uri()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert_eq!(total, size, "the map covers the volume");

    // libnbd 1.14 does not ask: structured replies, compact headers.
    let mut nbdinfo = Command::new("nbdinfo")
        .args(["--map", &srv.uri()])
        .output()
        .unwrap();
    assert!(nbdinfo.status.success());
    let m = String::from_utf8_lossy(&nbdinfo.stdout).into_owned();
    assert!(m.contains("data") && m.contains("hole,zero"), "{m}");
    nbdinfo = Command::new("nbdinfo").arg(srv.uri()).output().unwrap();
    assert!(String::from_utf8_lossy(&nbdinfo.stdout).contains("using structured packets"));
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
