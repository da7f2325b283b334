//! The Debian package (scripts/package.sh): it builds from the binary under test, installs
//! with dpkg into a scratch root, and what it installs works: the binary runs, the man
//! pages render, the completions load, the unit is there, and every shared library the
//! binary needs comes from a package it depends on.

use std::path::Path;
use std::process::Command;

mod common;
use common::*;

fn stdout(c: &mut Command) -> String {
    let o = run(c);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_package_installs_and_its_binary_pages_completions_and_unit_work() {
    let dir = tmp("package");
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let deb = stdout(
        Command::new(repo.join("scripts/package.sh"))
            .env("URAID_BIN", env!("CARGO_BIN_EXE_uraid"))
            .env("URAID_PKG_OUT", dir.join("out")),
    );
    let deb = repo.join(deb.trim());
    assert!(deb.exists(), "{}", deb.display());
    let root = dir.join("root");
    let admin = root.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::write(admin.join("status"), "").unwrap();
    // An empty dpkg database: the dependencies are checked below, not by dpkg here.
    run(Command::new("dpkg")
        .arg(format!("--instdir={}", root.display()))
        .arg(format!("--admindir={}", admin.display()))
        .args([
            "--force-script-chrootless",
            "--force-depends",
            "--log=/dev/null",
            "-i",
        ])
        .arg(&deb));
    let bin = root.join("usr/bin/uraid");
    let v = stdout(Command::new(&bin).arg("--version"));
    assert_eq!(v.trim(), format!("uraid {}", env!("CARGO_PKG_VERSION")));
    let page = stdout(
        Command::new("man")
            .args(["-l", "-P", "cat"])
            .arg(root.join("usr/share/man/man8/uraid-serve.8.gz"))
            .env("MANWIDTH", "100"),
    );
    assert!(
        page.contains("uraid-serve") && page.contains("--scan"),
        "{page}"
    );
    for f in [
        "usr/share/man/man8/uraid.8.gz",
        "usr/share/man/man8/uraid-monitor.8.gz",
        "usr/share/zsh/vendor-completions/_uraid",
        "usr/share/fish/vendor_completions.d/uraid.fish",
        "lib/systemd/system/uraid@.service",
        "usr/share/doc/uraid/examples/uraid.conf",
        "usr/share/doc/uraid/examples/prometheus/uraid.rules.yml",
    ] {
        assert!(root.join(f).exists(), "{f} not installed");
    }
    let bash = root.join("usr/share/bash-completion/completions/uraid");
    let c = stdout(
        Command::new("bash")
            .arg("-c")
            .arg(format!("source {} && complete -p uraid", bash.display())),
    );
    assert!(c.contains("_uraid"), "{c}");
    // The installed example config is one `uraid config check` accepts.
    let ex = root.join("usr/share/doc/uraid/examples/uraid.conf");
    stdout(
        Command::new(&bin)
            .args(["config", "check", "--config"])
            .arg(&ex),
    );
    // Every library the binary needs is in a package it depends on.
    let info = stdout(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"));
    let depends: Vec<String> = info
        .split(',')
        .map(|d| d.split_whitespace().next().unwrap_or("").to_string())
        .collect();
    let ldd = stdout(Command::new("ldd").arg(&bin));
    for lib in ldd.lines().filter_map(|l| {
        let l = l.trim();
        let path = l.split("=>").nth(1).map_or(l, str::trim);
        let path = path.split_whitespace().next()?;
        path.starts_with('/').then(|| path.to_string())
    }) {
        let real = std::fs::canonicalize(&lib).unwrap();
        let owner = Command::new("dpkg").arg("-S").arg(&real).output().unwrap();
        let owner = if owner.status.success() {
            owner
        } else {
            Command::new("dpkg").arg("-S").arg(&lib).output().unwrap()
        };
        let pkg = String::from_utf8_lossy(&owner.stdout);
        let pkg = pkg.split(':').next().unwrap_or("").trim().to_string();
        assert!(
            depends.contains(&pkg),
            "{lib} comes from package {pkg:?}, not among Depends: {info}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
