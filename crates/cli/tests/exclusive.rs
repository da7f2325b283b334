//! Members are used by one process at a time: a second `serve`, a `bench` on a served array
//! and a `create` on a member in use are refused with the holder named, on files (flock) and
//! on loop devices (O_EXCL); `examine` and `status` keep working. A bench never changes an
//! array it was not allowed to write: `--fail` in a read-only run leaves every member
//! byte-identical.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::*;

/// `args` followed by `members`.
fn with(args: &[&str], members: &[String]) -> Vec<String> {
    args.iter()
        .map(|s| s.to_string())
        .chain(members.iter().cloned())
        .collect()
}

fn run(args: &[String], cwd: &Path) -> Output {
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    uraid(&a, cwd)
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}")).collect()
}

#[test]
fn second_serve_bench_and_create_are_refused_while_serving() {
    let dir = tmp("serve");
    let m = names(6);
    ok(&run(
        &with(&["create", "--level", "6", "--size", "16M", "-N", "v"], &m),
        &dir,
    ));
    let s = Serve::new(&dir).sock(&dir.join("s1")).members(&m).start();
    let held = format!("is in use by pid {} (uraid)", s.pid());

    // A second server on the same members, listening elsewhere: refused before it binds.
    let sock2 = dir.join("s2");
    let e = one_line_error(&run(
        &with(
            &["serve", "--listen", &format!("unix:{}", sock2.display())],
            &m,
        ),
        &dir,
    ));
    assert!(e.contains(&format!("member 0 (m0) {held}")), "{e}");
    assert!(!sock2.exists(), "the refused server bound its socket");

    // bench, read-only or writing, on the served array.
    let e = one_line_error(&run(&with(&["bench", "--runtime", "0.2"], &m), &dir));
    assert!(e.contains(&held), "{e}");
    let e = one_line_error(&run(
        &with(
            &[
                "bench",
                "--runtime",
                "0.2",
                "--read-pct",
                "0",
                "--allow-writes",
            ],
            &m,
        ),
        &dir,
    ));
    assert!(e.contains(&held), "{e}");

    // create over members in use, even with --force.
    let e = one_line_error(&uraid(
        &["create", "--level", "5", "--force", "m3", "m4", "m5"],
        &dir,
    ));
    assert!(e.contains(&format!("member 0 (m3) {held}")), "{e}");

    // Looking stays possible.
    ok(&uraid(&["examine", "m3"], &dir));
    let st = ok(&run(&with(&["status"], &m), &dir));
    assert!(st.contains("[6/6] [UUUUUU]"), "{st}");

    s.stop();
    // Released with the server: the same bench runs now.
    ok(&run(&with(&["bench", "--runtime", "0.2"], &m), &dir));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn create_refuses_a_member_another_process_has_locked() {
    let dir = tmp("lock");
    for f in ["a", "b", "c"] {
        std::fs::File::create(dir.join(f))
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
    }
    let held = std::fs::File::open(dir.join("b")).unwrap();
    // SAFETY: flock on a descriptor this test owns; the lock goes with the file.
    let r = unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0);
    let e = one_line_error(&uraid(
        &["create", "--level", "5", "--size", "8M", "a", "b", "c"],
        &dir,
    ));
    assert!(
        e.contains(&format!(
            "member 1 (b) is in use by pid {}",
            std::process::id()
        )),
        "{e}"
    );
    assert!(
        uraid(&["examine", "a"], &dir).status.code() == Some(1),
        "a refused create wrote a superblock"
    );
    drop(held);
    ok(&uraid(
        &["create", "--level", "5", "--size", "8M", "a", "b", "c"],
        &dir,
    ));
    // Assembly names the member's slot (from its superblock), not its place on the command
    // line, and the path as given.
    let held = std::fs::File::open(dir.join("b")).unwrap();
    // SAFETY: as above.
    let r = unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0);
    let e = one_line_error(&uraid(&["bench", "--runtime", "0.2", "c", "b", "a"], &dir));
    assert!(
        e.contains(&format!(
            "member 1 (b) is in use by pid {}",
            std::process::id()
        )),
        "{e}"
    );
    drop(held);
    // A journal device in use is named as itself, not as a member slot.
    std::fs::File::create(dir.join("j"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let held = std::fs::File::open(dir.join("j")).unwrap();
    // SAFETY: as above.
    let r = unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0);
    let e = one_line_error(&uraid(
        &["journal", "add", "--journal", "j", "a", "b", "c"],
        &dir,
    ));
    assert!(
        e.starts_with(&format!("uraid: j is in use by pid {}", std::process::id()))
            && !e.contains("member"),
        "{e}"
    );
    drop(held);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_fail_leaves_every_member_byte_identical() {
    let dir = tmp("bench");
    let m = names(6);
    ok(&run(
        &with(&["create", "--level", "6", "--size", "8M", "-N", "b"], &m),
        &dir,
    ));
    // Put data on the array first (allowed explicitly), so that the degraded runs below
    // really read and reconstruct instead of answering holes.
    ok(&run(
        &with(
            &[
                "bench",
                "--runtime",
                "0.3",
                "--read-pct",
                "0",
                "--precondition",
                "--allow-writes",
            ],
            &m,
        ),
        &dir,
    ));
    let snapshot = || -> Vec<Vec<u8>> {
        m.iter()
            .map(|f| std::fs::read(dir.join(f)).unwrap())
            .collect()
    };
    let before = snapshot();

    // Read-only with two members out: runs degraded, changes nothing.
    let j: serde_json::Value = serde_json::from_str(&ok(&run(
        &with(
            &[
                "bench",
                "--runtime",
                "0.3",
                "--fail",
                "1",
                "--fail",
                "4",
                "--json",
            ],
            &m,
        ),
        &dir,
    )))
    .unwrap();
    assert!(
        j["planner"]["degraded_reads"].as_u64().unwrap() > 0 && j["errors"] == 0,
        "{j}"
    );
    assert!(
        snapshot() == before,
        "a read-only bench with --fail changed a member"
    );

    // Writes with --fail would record the failure for good: refused without --allow-writes,
    // and so are plain writes to an array the user named.
    for (args, want) in [
        (
            vec![
                "bench",
                "--runtime",
                "0.2",
                "--read-pct",
                "50",
                "--fail",
                "1",
            ],
            "would record member(s) [1] of array 'b' as failed (until replaced",
        ),
        (
            vec!["bench", "--runtime", "0.2", "--read-pct", "0"],
            "bench --read-pct 0 writes to array 'b' and would overwrite its data",
        ),
        (
            vec!["bench", "--runtime", "0.2", "--precondition"],
            "bench --precondition writes to array 'b'",
        ),
    ] {
        let e = one_line_error(&run(&with(&args, &m), &dir));
        assert!(e.contains(want) && e.contains("--allow-writes"), "{e}");
        assert!(snapshot() == before, "{args:?} changed a member");
    }
    let st = ok(&run(&with(&["status"], &m), &dir));
    assert!(
        st.contains("[6/6] [UUUUUU]") && st.contains("clean"),
        "{st}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loop devices attached for one test, detached on drop (also when the test panics).
struct Loops(Vec<String>);

impl Drop for Loops {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = Command::new("umount").arg(l).output();
            let _ = Command::new("losetup").args(["-d", l]).output();
        }
    }
}

#[test]
fn loop_device_members_are_opened_exclusively() {
    let dir = tmp("loop");
    let mut loops = Loops(Vec::new());
    for i in 0..5 {
        let f = dir.join(format!("back{i}"));
        std::fs::File::create(&f)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        match Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&f)
            .output()
        {
            Ok(o) if o.status.success() => loops
                .0
                .push(String::from_utf8_lossy(&o.stdout).trim().to_string()),
            other => {
                eprintln!("SKIPPED loop_device_members_are_opened_exclusively: losetup unavailable here: {other:?}");
                return;
            }
        }
    }
    let devs: Vec<String> = loops.0[..4].to_vec();
    ok(&run(
        &with(
            &[
                "create", "--level", "5", "--chunk", "16K", "--force", "-N", "lv",
            ],
            &devs,
        ),
        &dir,
    ));
    let s = Serve::new(&dir)
        .sock(&dir.join("s1"))
        .members(&devs)
        .start();
    // O_EXCL records no owner: the refusal says so, and names the server as a process that
    // has the device open.
    let e = one_line_error(&run(&with(&["serve", "--listen", "unix:s2"], &devs), &dir));
    assert!(
        e.contains(&format!(
            "member 0 ({}) is in use (opened exclusively by another process",
            devs[0]
        )) && e.contains(&s.pid().to_string()),
        "{e}"
    );
    let e = one_line_error(&uraid(
        &["create", "--level", "1", "--force", &devs[1], &loops.0[4]],
        &dir,
    ));
    assert!(
        e.contains(&format!(
            "member 0 ({}) is in use (opened exclusively",
            devs[1]
        )),
        "{e}"
    );
    ok(&run(&with(&["status"], &devs), &dir));
    s.stop();

    // A mounted device is refused too, and the mount point named.
    let spare = loops.0[4].clone();
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", &spare])
        .output();
    let mounted = mkfs.is_ok_and(|o| o.status.success())
        && Command::new("mount")
            .arg(&spare)
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
    if mounted {
        let e = one_line_error(&uraid(
            &["create", "--level", "1", "--force", &devs[0], &spare],
            &dir,
        ));
        assert!(
            e.contains(&format!(
                "member 1 ({spare}) is in use (mounted on {})",
                mnt.display()
            )),
            "{e}"
        );
        let _ = Command::new("umount").arg(&mnt).status();
    } else {
        eprintln!("SKIPPED the mounted-device case: mkfs.ext4 or mount unavailable");
    }
    drop(loops);
    let _ = std::fs::remove_dir_all(&dir);
}
