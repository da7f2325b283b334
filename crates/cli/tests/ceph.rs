//! Ceph on a uraid volume: the recipe in docs/scale-out.md, run as written (a single-node
//! cluster with one bluestore OSD on a RAID6 volume through nbdfuse + a loop device; a member
//! failed in the middle of a `rados bench` write, a new device rebuilt while `rados bench seq`
//! reads everything back), then checked: both benches complete with every object, HEALTH_OK,
//! no error in the OSD's or the cluster's log, a deep scrub of every placement group clean,
//! the rebuild done, a uraid scrub clean, discards passed down to the members.

mod common;

use common::{run, tmp};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// The shell block between `<!-- NAME -->` and `<!-- /NAME -->` of `doc`.
fn block(doc: &str, name: &str) -> String {
    let start = format!("<!-- {name} -->");
    let end = format!("<!-- /{name} -->");
    let a = doc.find(&start).unwrap_or_else(|| panic!("no {start}")) + start.len();
    let b = a + doc[a..].find(&end).unwrap_or_else(|| panic!("no {end}"));
    let body = doc[a..b].trim();
    body.strip_prefix("```sh")
        .and_then(|s| s.strip_suffix("```"))
        .unwrap_or_else(|| panic!("{name}: not one ```sh block"))
        .to_string()
}

/// Runs `script` with bash (-e -u -o pipefail) from the repository's root, with the uraid
/// under test first on PATH and `WORK` (and `W`, for the teardown) set to `work`.
fn bash(script: &str, work: &Path) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_uraid")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(root())
        .env("PATH", path)
        .env("WORK", work)
        .env("W", work)
        .output()
        .expect("bash")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ceph(work: &Path, args: &[&str]) -> String {
    let o = run(Command::new("ceph")
        .arg("-c")
        .arg(work.join("ceph/ceph.conf"))
        .args(args));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// `/status` of the running server.
fn status(work: &Path) -> serde_json::Value {
    let o = run(Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(work.join("ctl.sock"))
        .arg("http://uraid/status"));
    json(&String::from_utf8_lossy(&o.stdout))
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What a bluestore OSD logs at level -1 (Ceph's `derr`) on every healthy start and stop
/// here: a fresh device has no fsid yet, the loopback host has no NUMA node for its
/// interface, and `down` sends SIGTERM.
const OSD_ROUTINE: [&str; 8] = [
    "_read_fsid unparsable uuid",
    "Falling back to public interface",
    "log_to_monitors",
    "waiting for initial osdmap",
    "set_numa_affinity unable to identify public interface",
    "received  signal: Terminated",
    "*** Got signal Terminated ***",
    "*** Immediate shutdown",
];

/// Lines of a daemon's log that report a problem: level -1 (Ceph's `derr`) other than the
/// `routine` ones, and any line saying "error" or "ERR" (not rocksdb's option dump).
fn error_lines(path: &Path, routine: &[&str]) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| {
            let level = l.split_whitespace().nth(2) == Some("-1");
            let says = (l.contains("ERR") || l.to_ascii_lowercase().contains("error"))
                && !l.contains("Options.error_if_exists");
            (level || says) && !routine.iter().any(|r| l.contains(r))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn ceph_osd_survives_a_member_failure_and_rebuild() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("SKIPPED ceph_osd_survives_a_member_failure_and_rebuild: needs root (FUSE, loop devices)");
        return;
    }
    assert!(
        Command::new("ceph-osd").arg("--version").output().is_ok(),
        "ceph-osd is not installed: scripts/setup.sh installs it (scripts/ceph-osd.sh install)"
    );
    let doc = std::fs::read_to_string(root().join("docs/scale-out.md")).unwrap();
    let (recipe, teardown) = (block(&doc, "recipe"), block(&doc, "teardown"));
    let work = tmp("ceph");
    let t0 = Instant::now();
    let out = bash(&recipe, &work);
    let log = text(&out);
    // From here on the cluster and the server run: every check below runs before the
    // teardown, whose result is asserted last.
    let checks = std::panic::catch_unwind(|| {
        assert!(out.status.success(), "the recipe failed:\n{log}");
        eprintln!("recipe ran in {:.0?}", t0.elapsed());
        let total = |what: &str| -> u64 {
            log.lines()
                .find_map(|l| l.strip_prefix(what))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no '{what}' in:\n{log}"))
        };
        assert_eq!(total("Total writes made:"), 200, "{log}");
        assert_eq!(total("Total reads made:"), 200, "{log}");
        assert!(
            log.lines().any(|l| l.trim() == "HEALTH_OK"),
            "health:\n{log}"
        );

        // The rebuild of the new device finishes; the array is whole again.
        wait_for("rebuild", Duration::from_secs(300), || {
            let s = status(&work);
            s["slots"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["state"] == "active")
                && s["background"]
                    .as_array()
                    .is_some_and(|b| b.iter().all(|w| w["op"] != "rebuild"))
        });
        // Discards reached the members (bluestore's mkfs discards the whole device).
        let s = status(&work);
        let discarded: u64 = s["slots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["discard"]["bytes"].as_u64().unwrap())
            .sum();
        assert!(
            discarded > 1 << 30,
            "members discarded only {discarded} bytes"
        );

        // Every object is there; a deep scrub of every placement group finds nothing.
        let objects = ceph(&work, &["df", "-f", "json"]);
        let pools = json(&objects);
        let bench = pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "bench")
            .expect("pool bench");
        assert!(
            bench["stats"]["objects"].as_u64().unwrap() >= 200,
            "{bench}"
        );
        let pgs = || json(&ceph(&work, &["pg", "ls", "-f", "json"]));
        let before: Vec<(String, String)> = pgs()["pg_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["pgid"].as_str().unwrap().to_string(),
                    p["last_deep_scrub_stamp"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        for (pg, _) in &before {
            ceph(&work, &["pg", "deep-scrub", pg]);
        }
        wait_for("deep scrub of every PG", Duration::from_secs(300), || {
            let now = pgs();
            before.iter().all(|(pg, stamp)| {
                now["pg_stats"].as_array().unwrap().iter().any(|p| {
                    p["pgid"] == pg.as_str()
                        && p["last_deep_scrub_stamp"].as_str() != Some(stamp)
                        && p["state"] == "active+clean"
                })
            })
        });
        for p in pgs()["pg_stats"].as_array().unwrap() {
            assert_eq!(p["stat_sum"]["num_scrub_errors"], 0, "{p}");
        }
        let inconsistent = run(Command::new("rados")
            .arg("-c")
            .arg(work.join("ceph/ceph.conf"))
            .args(["list-inconsistent-pg", "bench"]));
        assert_eq!(String::from_utf8_lossy(&inconsistent.stdout).trim(), "[]");
        assert_eq!(ceph(&work, &["health"]).trim(), "HEALTH_OK");
        let osd_errors = error_lines(&work.join("ceph/log/ceph-osd.0.log"), &OSD_ROUTINE);
        assert!(osd_errors.is_empty(), "OSD log:\n{}", osd_errors.join("\n"));
        // The cluster log: no error, and no health warning ever raised (but slow ops, which a
        // loaded CI machine may cause on its own).
        let cluster_errors: Vec<String> =
            std::fs::read_to_string(work.join("ceph/log/ceph.cluster.log"))
                .unwrap()
                .lines()
                .filter(|l| {
                    l.contains("[ERR]")
                        || l.contains("[WRN]") && !l.to_lowercase().contains("slow ops")
                })
                .map(str::to_string)
                .collect();
        assert!(
            cluster_errors.is_empty(),
            "cluster log:\n{}",
            cluster_errors.join("\n")
        );

        // uraid's own scrub agrees: parity matches data everywhere.
        let sock = format!("unix:{}", work.join("ctl.sock").display());
        let members: Vec<PathBuf> = ["m0", "m1", "r2", "m3", "m4", "m5"]
            .iter()
            .map(|m| work.join(m))
            .collect();
        let o = run(Command::new(env!("CARGO_BIN_EXE_uraid"))
            .args(["scrub", "--wait", "--control", &sock])
            .args(&members));
        let scrub = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            scrub.contains(" 0 mismatched") && scrub.contains(" 0 unreadable"),
            "uraid scrub: {scrub}"
        );
    });
    let down = bash(&teardown, &work);
    let pid: i32 = std::fs::read_to_string(work.join("serve.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    wait_for("uraid serve to exit", Duration::from_secs(60), || {
        pid == 0 || !Path::new(&format!("/proc/{pid}")).exists()
    });
    if let Err(e) = checks {
        eprintln!(
            "uraid serve log:\n{}",
            std::fs::read_to_string(work.join("serve.log")).unwrap_or_default()
        );
        std::panic::resume_unwind(e);
    }
    assert!(down.status.success(), "teardown:\n{}", text(&down));
    let serve_log = std::fs::read_to_string(work.join("serve.log")).unwrap();
    assert!(
        serve_log.contains("array flushed and marked clean"),
        "serve log:\n{serve_log}"
    );
    eprintln!("ceph test took {:.0?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&work);
}
