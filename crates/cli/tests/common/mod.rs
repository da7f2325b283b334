//! Helpers shared by the CLI test binaries (each binary uses a subset).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

/// Runs the `uraid` binary with `args` in `cwd`.
pub fn uraid(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run uraid")
}

/// Stdout of a command that must succeed.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "uraid failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A failing or refused command prints one line `uraid: ...` on stderr, no panic, exit 1.
pub fn one_line_error(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(
        err.starts_with("uraid: ") && !err.contains("panicked"),
        "{err}"
    );
    err
}

/// A fresh temp directory for one test (`tag`) of this test binary.
pub fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "uraid-{}-{tag}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a command that must succeed.
pub fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Kills and reaps a child that is still running (test servers, from their Drop).
pub fn kill_if_running(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The clean flag of a member's superblock, as `uraid examine --json` reports it.
pub fn examine_clean(member: &Path) -> bool {
    let o = run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["examine", "--json"])
        .arg(member));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    j["clean"]
        .as_bool()
        .expect("examine reports the clean flag")
}

/// Runs a fio job over NBD with crc32c verification (verify_fatal: a wrong block fails it).
pub fn fio_job(dir: &Path, name: &str, uri: &str, extra: &str) {
    let job = dir.join(format!("{name}.fio"));
    std::fs::write(
        &job,
        format!(
            "[{name}]\nioengine=nbd\nuri={uri}\nbs=16k\nsize=100%\nverify=crc32c\n\
             verify_fatal=1\niodepth=8\nrandseed=42\n{extra}\n"
        ),
    )
    .unwrap();
    let o = Command::new("fio").arg(&job).output().expect("fio");
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "fio {name}: {out}");
}
