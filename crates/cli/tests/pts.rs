//! The benchmark suite's quick mode (scripts/pts.py --quick): every target (raw files, uraid
//! in-process, uraid serve over Unix and TCP, nbdkit, qemu-nbd, uraid with one and two members
//! missing) must produce a number in every cell, and the report, JSON and plots must be written.
//! It asserts nothing about speed.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn pts_quick_mode_fills_every_cell() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("uraid-pts-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let members = PathBuf::from("/dev/shm").join(format!("uraid-pts-test-{}", std::process::id()));
    let o = Command::new("python3")
        .arg(root.join("scripts/pts.py"))
        .args(["--quick", "--uraid", env!("CARGO_BIN_EXE_uraid"), "--out"])
        .arg(&out)
        .arg("--dir")
        .arg(&members)
        .output()
        .expect("python3 runs");
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "pts.py --quick failed:\n{log}");
    assert!(!members.exists(), "member files left behind in {members:?}");

    // Check the JSON independently of the script's own check.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let targets = json["targets"].as_object().unwrap();
    for t in [
        "raw",
        "uraid",
        "uraid-nbd-unix",
        "uraid-nbd-tcp",
        "nbdkit-unix",
        "nbdkit-tcp",
        "qemu-nbd-unix",
        "qemu-nbd-tcp",
        "uraid-deg1",
        "uraid-deg2",
    ] {
        assert!(targets.contains_key(t), "target {t} missing");
    }
    let mut n = 0;
    for (test, cells) in json["cells"].as_object().unwrap() {
        let cells = cells.as_array().unwrap();
        assert!(!cells.is_empty(), "{test} has no cells");
        for t in targets.keys() {
            for c in cells {
                let r = &json["median"][test][t][c.as_str().unwrap()];
                for f in ["iops", "mbps", "lat_avg_us", "lat_max_us"] {
                    let v = r[f].as_f64().unwrap_or(f64::NAN);
                    assert!(v.is_finite() && v > 0.0, "{test} {t} {c} {f} = {v}");
                }
                assert_eq!(r["errors"].as_f64(), Some(0.0), "{test} {t} {c} had errors");
                n += 1;
            }
        }
    }
    assert!(n >= 100, "only {n} cells");
    for f in ["benchmarks.md", "iops.png", "latency.png", "throughput.png"] {
        let len = std::fs::metadata(out.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "{f} missing or empty");
    }
    let md = std::fs::read_to_string(out.join("benchmarks.md")).unwrap();
    assert!(
        md.contains("| 4k |") && md.contains("R65/W35"),
        "report lacks the IOPS table"
    );

    // --render redraws the same report from the JSON alone.
    let again = out.join("rendered");
    let o = Command::new("python3")
        .arg(root.join("scripts/pts.py"))
        .arg("--render")
        .arg(out.join("results.json"))
        .arg("--out")
        .arg(&again)
        .output()
        .expect("python3 runs");
    assert!(
        o.status.success(),
        "--render failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let md2 = std::fs::read_to_string(again.join("benchmarks.md")).unwrap();
    assert_eq!(md, md2, "a redrawn report differs from the original");
    let _ = std::fs::remove_dir_all(&out);
}
