//! The `uraid` binary as a user runs it: create / examine / status on files and loop devices,
//! errors as one line, and the in-process benchmark (including degraded, which once hung).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// Runs uraid with `args` followed by members m0..m{n-1}.
fn on_members(args: &[&str], n: usize, cwd: &Path) -> Output {
    let m = members(n);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(m.iter().map(|s| s.as_str()));
    uraid(&all, cwd)
}

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}")).collect()
}

fn create(dir: &Path, level: &str, n: usize, extra: &[&str]) -> String {
    let mut args = vec![
        "create", "--level", level, "--size", "48M", "--chunk", "64K",
    ];
    args.extend_from_slice(extra);
    ok(&on_members(&args, n, dir))
}

#[test]
fn superblock_matches_docs() {
    let dir = tmp("docs");
    create(&dir, "6", 6, &["--name", "docvol"]);
    let sb = std::fs::read(dir.join("m3")).unwrap();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/format.md"))
        .unwrap();
    // Rows of the field table: | offset | size | field | meaning |
    let mut fields = std::collections::HashMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 5 {
            if let (Ok(off), Ok(size)) = (cells[1].parse::<usize>(), cells[2].parse::<usize>()) {
                fields.insert(cells[3].to_string(), (off, size));
            }
        }
    }
    // Superblock (28 rows, and 2 of the replace in progress), journal superblock (10),
    // record header (8 of fixed size).
    assert_eq!(fields.len(), 48, "docs table rows: {fields:?}");
    let get = |name: &str| -> &[u8] {
        let (o, s) = fields[name];
        &sb[o..o + s]
    };
    let le = |b: &[u8]| b.iter().rev().fold(0u64, |a, &x| a << 8 | x as u64);
    assert_eq!(get("magic"), b"uraid-sb");
    assert_eq!(le(get("version")), 8);
    assert_eq!(le(get("sb_size")), 4096);
    assert_eq!(&get("name")[..6], b"docvol");
    assert_eq!(le(get("level")), 6);
    assert_eq!(le(get("parity")), 2);
    assert_eq!(le(get("chunk")), 65536);
    assert_eq!(le(get("members")), 6);
    assert_eq!(le(get("index")), 3);
    assert_eq!(le(get("flags")), 1);
    assert_eq!(le(get("data_offset")), 1 << 20);
    let member_data = (48u64 << 20) - (1 << 20);
    assert_eq!(le(get("member_data")), member_data);
    assert_eq!(le(get("volume_size")), 4 * member_data);
    assert_eq!(le(get("events")), 1);
    assert_eq!(get("member_states")[..6], [0; 6]);
    assert!(get("rebuilt").iter().all(|&b| b == 0));
    let slot3 = &get("slot_uuids")[3 * 16..4 * 16];
    assert_eq!(slot3, get("device_uuid"), "slot 3 names this member");
    assert!(get("slot_uuids")[6 * 16..].iter().all(|&b| b == 0));
    assert_eq!(le(get("bitmap_chunk")), 4 << 20, "the default region");
    assert_eq!(le(get("bad_count")), 0, "no bad blocks");
    assert!(get("bad_ranges").iter().all(|&b| b == 0));
    assert_eq!(get("journal_uuid"), [0u8; 16], "no journal");
    assert_eq!(le(get("journal_mode")), 0);
    assert_eq!(le(get("served")), 0, "a new array is in sync");
    assert!(get("replace_uuids").iter().all(|&b| b == 0), "no replace");
    assert!(get("replace_copied").iter().all(|&b| b == 0));
    assert_eq!(
        fields["replace_uuids"].0,
        uraid_core::format::off::REPLACE_UUIDS
    );
    assert_eq!(
        fields["replace_copied"].0,
        uraid_core::format::off::REPLACE_COPIED
    );
    assert_eq!(le(get("crc32c")) as u32, crc32c_of(&sb[..4092]));
    // The allocation map as docs/format.md describes it: a fresh array has every page sealed
    // with no bit set; 47 MiB members of a 4+2 raid6 with 64K chunks -> 752 granules, 1 page.
    // Each 512-byte sector of a page is sealed on its own: CRC-32C of (page, sector, payload).
    let page = &sb[65536..65536 + 4096];
    for (s, sec) in page.chunks(512).enumerate() {
        assert!(sec[..508].iter().all(|&b| b == 0));
        let mut sealed = 0u32.to_le_bytes().to_vec();
        sealed.extend_from_slice(&(s as u32).to_le_bytes());
        sealed.extend_from_slice(&sec[..508]);
        assert_eq!(le(&sec[508..]) as u32, crc32c_of(&sealed), "sector {s}");
    }
    // The write-intent bitmap: 47 MiB members in 4 MiB regions -> 12 regions, 1 page at
    // 8 KiB, sealed like the map's sectors but with the CRC over the ASCII prefix
    // "uraid-write-intent-bitmap" first.
    let page = &sb[8192..8192 + 4096];
    for (s, sec) in page.chunks(512).enumerate() {
        assert!(sec[..508].iter().all(|&b| b == 0));
        let mut sealed = b"uraid-write-intent-bitmap".to_vec();
        sealed.extend_from_slice(&0u32.to_le_bytes());
        sealed.extend_from_slice(&(s as u32).to_le_bytes());
        sealed.extend_from_slice(&sec[..508]);
        assert_eq!(
            le(&sec[508..]) as u32,
            crc32c_of(&sealed),
            "bitmap sector {s}"
        );
    }
    assert!(
        sb[8192 + 4096..65536].iter().all(|&b| b == 0),
        "one bitmap page"
    );
    // Superblock slot 1 holds the same superblock at creation.
    assert_eq!(&sb[4096..8192 - 4], &sb[..4096 - 4]);
    assert!(
        sb[65536 + 4096..1 << 20].iter().all(|&b| b == 0),
        "only one map page"
    );
    // The same values through examine --json.
    let j: serde_json::Value =
        serde_json::from_str(&ok(&uraid(&["examine", "m3", "--json"], &dir))).unwrap();
    assert_eq!(j["level"], "raid6");
    assert_eq!(j["index"], 3);
    assert_eq!(j["volume_size"], 4 * member_data);
    assert_eq!(
        j["array_uuid"].as_str().unwrap().replace('-', ""),
        hex(get("array_uuid"))
    );
    // With a journal: the superblock names it, the journal superblock is as documented.
    std::fs::File::create(dir.join("jn"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    create(
        &dir,
        "6",
        6,
        &["--force", "--journal", "jn", "--journal-mode", "write-back"],
    );
    let sb = std::fs::read(dir.join("m2")).unwrap();
    let jn = std::fs::read(dir.join("jn")).unwrap();
    let at = |b: &[u8], name: &str| -> Vec<u8> {
        let (o, s) = fields[name];
        b[o..o + s].to_vec()
    };
    assert_eq!(le(&at(&sb, "journal_mode")), 2, "write-back");
    assert_eq!(at(&sb, "journal_uuid"), at(&jn, "j_journal_uuid"));
    assert_ne!(at(&sb, "journal_uuid"), vec![0u8; 16]);
    assert_eq!(at(&sb, "array_uuid"), at(&jn, "j_array_uuid"));
    assert_eq!(at(&jn, "jmagic"), b"uraid-jn");
    assert_eq!(le(&at(&jn, "jversion")), 1);
    assert_eq!(le(&at(&jn, "log_start")), 8192);
    assert_eq!(le(&at(&jn, "log_len")), (8 << 20) - 8192);
    assert_eq!(le(&at(&jn, "tail")), 0);
    assert_eq!(le(&jn[4092..4096]) as u32, crc32c_of(&jn[..4092]));
    let _ = std::fs::remove_dir_all(&dir);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bitwise CRC-32C, independent of the crate the product uses.
fn crc32c_of(b: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn status_reports_missing_stale_and_foreign_members() {
    let dir = tmp("status");
    create(&dir, "6", 6, &["--name", "a"]);
    let healthy = ok(&uraid(
        &["status", "m5", "m4", "m3", "m2", "m1", "m0"],
        &dir,
    ));
    assert!(
        healthy.contains("[6/6] [UUUUUU]") && healthy.contains("healthy"),
        "{healthy}"
    );
    // Exit status 1: degraded (mdadm --detail --test).
    let j: serde_json::Value = serde_json::from_str(&exits(
        &uraid(&["status", "--json", "m0", "m2", "m3", "m4", "m5"], &dir),
        1,
    ))
    .unwrap();
    // Member 1 is in service on disk: serve would need --run (mdadm's rule).
    assert_eq!(
        j["state"],
        "degraded (1 of 6 members unavailable): member(s) [1] in service were not given: serve \
         refuses it without --run"
    );
    assert_eq!(j["slots"][1]["state"], "missing");
    assert_eq!(j["can_start"], true);
    // A foreign member: another array's disk.
    ok(&uraid(
        &["create", "--level", "1", "--size", "48M", "x0", "x1"],
        &dir,
    ));
    let s = exits(
        &uraid(&["status", "m0", "m1", "m2", "m3", "m4", "x0"], &dir),
        1,
    );
    assert!(s.contains("refused: x0: belongs to array"), "{s}");
    // A read-only run with m1 left out changes nothing on disk: m1 is still current.
    ok(&on_members(
        &["bench", "--runtime", "0.3", "--fail", "1"],
        6,
        &dir,
    ));
    let s = ok(&on_members(&["status"], 6, &dir));
    assert!(
        s.contains("[6/6] [UUUUUU]") && s.contains("events 1 "),
        "{s}"
    );
    // Stale: write to the array while m1 is out (bench with --fail 1 writes, which records the
    // failure and so needs --allow-writes), then bring it back.
    ok(&on_members(
        &[
            "bench",
            "--runtime",
            "0.3",
            "--read-pct",
            "0",
            "--fail",
            "1",
            "--allow-writes",
        ],
        6,
        &dir,
    ));
    let s = exits(&on_members(&["status"], 6, &dir), 1);
    assert!(s.contains("refused: m1: member 1 is marked failed"), "{s}");
    assert!(s.contains("[5/6] [U_UUUU]"), "{s}");
    // Three gone from a raid6: cannot start (exit status 2), and bench says so in one line.
    let s = exits(&uraid(&["status", "m0", "m2", "m3"], &dir), 2);
    assert!(s.contains("FAILED"), "{s}");
    // Not an array at all: status could not tell (4), not "degraded" (1).
    let o = uraid(&["status", "nonexistent"], &dir);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    let e = one_line_error(&uraid(
        &["bench", "--runtime", "0.2", "m0", "m2", "m3"],
        &dir,
    ));
    assert!(
        e.contains(
            "cannot start raid6 array 'a': 3 of 6 members missing or failed, it tolerates 2"
        ),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn user_mistakes_are_one_line_errors() {
    let dir = tmp("errors");
    for (args, want) in [
        (
            vec!["create", "--level", "9", "--size", "8M", "a", "b"],
            "unknown RAID level '9'",
        ),
        (
            vec!["create", "--level", "6", "--size", "8M", "a", "b", "c"],
            "raid6 needs at least 4 members, got 3",
        ),
        (
            vec!["create", "--level", "ec", "--size", "8M", "a", "b", "c"],
            "--level ec needs --parity M",
        ),
        (
            vec![
                "create", "--level", "5", "--chunk", "3K", "--size", "8M", "a", "b", "c",
            ],
            "chunk size 3072 must be a power of two",
        ),
        (
            vec!["create", "--level", "5", "--size", "64K", "s0", "s1", "s2"],
            "too small",
        ),
        (
            vec!["create", "--level", "5", "--size", "8M", "d0", "d1", "d0"],
            "d0 is given twice",
        ),
        (
            vec!["examine", "nonexistent"],
            "nonexistent: No such file or directory",
        ),
    ] {
        let e = one_line_error(&uraid(&args, &dir));
        assert!(e.contains(want), "{args:?}: {e}");
    }
    std::fs::write(dir.join("junk"), vec![7u8; 8192]).unwrap();
    let e = one_line_error(&uraid(&["examine", "junk"], &dir));
    assert!(e.contains("junk: no uraid superblock (bad magic)"), "{e}");
    create(&dir, "5", 3, &[]);
    let e = one_line_error(&uraid(&["create", "--level", "5", "m0", "m1", "m2"], &dir));
    assert!(
        e.contains("m0 already holds a uraid superblock") && e.contains("--force"),
        "{e}"
    );
    create(&dir, "0", 3, &["--force"]);
    // clap's own usage errors exit 2 without a backtrace.
    let o = uraid(&["create", "--chunk", "12Q", "--level", "5", "a"], &dir);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown size suffix"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_level_creates_and_benches() {
    let dir = tmp("levels");
    for (level, n, extra) in [
        ("0", 4, vec![]),
        ("1", 3, vec![]),
        ("10", 4, vec![]),
        ("5", 5, vec![]),
        ("6", 6, vec![]),
        ("7", 7, vec![]),
        ("ec", 8, vec!["--parity", "4"]),
    ] {
        let sub = dir.join(format!("l{level}"));
        std::fs::create_dir_all(&sub).unwrap();
        create(&sub, level, n, &extra);
        let args = [
            "bench",
            "--runtime",
            "0.3",
            "--read-pct",
            "50",
            "--json",
            "--allow-writes",
        ];
        let j: serde_json::Value = serde_json::from_str(&ok(&on_members(&args, n, &sub))).unwrap();
        assert!(
            j["ops"].as_u64().unwrap() > 0 && j["errors"] == 0,
            "{level}: {j}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Degraded mixed load used to hang (a stale waker swallowed a stripe-lock wake-up) in about
/// half of these runs; each must finish well inside its time limit.
#[test]
fn degraded_bench_never_hangs() {
    let dir = tmp("hang");
    create(&dir, "6", 6, &[]);
    for _ in 0..6 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_uraid"))
            .args([
                "bench",
                "--runtime",
                "0.4",
                "--read-pct",
                "50",
                "--threads",
                "2",
                "--fail",
                "1",
                "--fail",
                "4",
                "--allow-writes",
            ])
            .args(members(6))
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                assert!(st.success());
                break;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("degraded bench hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// create / examine / status on loop devices (block devices: BLKGETSIZE64, BLKZEROOUT).
#[test]
fn loop_devices() {
    let dir = tmp("loop");
    let mut loops = Vec::new();
    for i in 0..4 {
        let f = dir.join(format!("back{i}"));
        std::fs::File::create(&f)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&f)
            .output();
        match o {
            Ok(o) if o.status.success() => {
                loops.push(String::from_utf8_lossy(&o.stdout).trim().to_string())
            }
            other => {
                for l in &loops {
                    let _ = Command::new("losetup").args(["-d", l]).status();
                }
                // Not root or no loop driver: say so loudly rather than pass silently.
                eprintln!("SKIPPED loop_devices: losetup unavailable here: {other:?}");
                return;
            }
        }
    }
    let refs: Vec<&str> = loops.iter().map(|s| s.as_str()).collect();
    let mut args = vec!["create", "--level", "5", "--chunk", "16K", "--force"];
    args.extend(&refs);
    let out = uraid(&args, &dir);
    let e = ok(&uraid(&["examine", "--json", refs[2]], &dir));
    let mut st = vec!["status"];
    st.extend(&refs);
    let s = uraid(&st, &dir);
    let mut b = vec![
        "bench",
        "--runtime",
        "0.3",
        "--read-pct",
        "50",
        "--allow-writes",
    ];
    b.extend(&refs);
    let bench = uraid(&b, &dir);
    for l in &loops {
        let _ = Command::new("losetup").args(["-d", l]).status();
    }
    ok(&out);
    let j: serde_json::Value = serde_json::from_str(&e).unwrap();
    assert_eq!(j["member_data"], (31u64 << 20));
    assert!(ok(&s).contains("[4/4] [UUUU]"));
    ok(&bench);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's main command: `uraid bench` with no members creates the embedded default
/// volume (raid6 8+2 over ten sparse 1 GiB files in ./uraid-data) and reuses it afterwards.
#[test]
fn default_volume_is_created_then_reused() {
    let dir = tmp("default");
    let first = uraid(&["bench", "--runtime", "0.2", "--json"], &dir);
    let j: serde_json::Value = serde_json::from_str(&ok(&first)).unwrap();
    assert_eq!(j["array"], "raid6 8+2 chunk 64K");
    assert!(String::from_utf8_lossy(&first.stderr).contains("created the default raid6 8+2 volume"));
    let sb = ok(&uraid(
        &["examine", "--json", "uraid-data/member7.img"],
        &dir,
    ));
    let uuid = serde_json::from_str::<serde_json::Value>(&sb).unwrap()["array_uuid"].clone();
    let second = uraid(
        &["bench", "--runtime", "0.2", "--read-pct", "0", "--json"],
        &dir,
    );
    ok(&second);
    assert!(
        !String::from_utf8_lossy(&second.stderr).contains("created"),
        "second run must reuse the volume"
    );
    let sb = ok(&uraid(
        &["examine", "--json", "uraid-data/member7.img"],
        &dir,
    ));
    let v: serde_json::Value = serde_json::from_str(&sb).unwrap();
    assert_eq!(v["array_uuid"], uuid);
    assert_eq!(
        v["clean"], true,
        "a bench that wrote leaves the array clean on exit"
    );
    // Half a default volume is refused rather than silently recreated.
    std::fs::remove_file(dir.join("uraid-data/member3.img")).unwrap();
    let e = one_line_error(&uraid(&["bench", "--runtime", "0.2"], &dir));
    assert!(e.contains("some default member files exist"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The journal commands as a user runs them: add to a stopped array, examine both kinds of
/// superblock, a missing journal named by status and refused by serve, remove; refusals for
/// a level without parity, a device too small, and a second journal.
#[test]
fn journal_add_examine_missing_and_remove() {
    let dir = tmp("journal-cmds");
    create(&dir, "5", 4, &["--name", "jv"]);
    let mk = |name: &str, size: u64| {
        std::fs::File::create(dir.join(name))
            .unwrap()
            .set_len(size)
            .unwrap()
    };
    mk("jn", 8 << 20);
    mk("tiny", 64 << 10);
    let add = |j: &str, extra: &[&str]| {
        let mut a = vec!["journal", "add", "--journal", j];
        a.extend_from_slice(extra);
        on_members(&a, 4, &dir)
    };
    let e = one_line_error(&add("tiny", &[]));
    assert!(e.contains("too small"), "{e}");
    let out = ok(&add("jn", &["--mode", "write-back"]));
    assert!(out.contains("now journals to jn"), "{out}");
    let e = one_line_error(&add("jn", &["--force"]));
    assert!(e.contains("already has journal"), "{e}");
    let ex = ok(&uraid(&["examine", "m1"], &dir));
    assert!(ex.contains("(write-back)"), "{ex}");
    let ex = ok(&uraid(&["examine", "jn"], &dir));
    assert!(ex.contains("uraid-jn (journal device)"), "{ex}");
    // Without the journal: status names it missing and says the array cannot start (exit
    // status 2, can_start false), serve refuses and says what to do.
    let st = exits(&on_members(&["status", "--offline"], 4, &dir), 2);
    assert!(
        st.contains("MISSING") && st.contains("cannot start"),
        "{st}"
    );
    let j: serde_json::Value = serde_json::from_str(&exits(
        &on_members(&["status", "--offline", "--json"], 4, &dir),
        2,
    ))
    .unwrap();
    assert_eq!(j["can_start"], false, "{j}");
    let e = one_line_error(&on_members(
        &["serve", "--listen", "unix:x.sock", "--control", "none"],
        4,
        &dir,
    ));
    assert!(
        e.contains("uses journal device") && e.contains("uraid journal remove"),
        "{e}"
    );
    // With it among the members, status shows where it is.
    let st = ok(&on_members(&["status", "--offline", "jn"], 4, &dir));
    assert!(
        st.contains("journal") && st.contains("jn") && !st.contains("MISSING"),
        "{st}"
    );
    let out = ok(&on_members(&["journal", "remove", "jn"], 4, &dir));
    assert!(out.contains("has no journal any more"), "{out}");
    let ex = ok(&uraid(&["examine", "m1"], &dir));
    assert!(ex.contains("Journal : none"), "{ex}");
    let e = one_line_error(&on_members(&["journal", "remove"], 4, &dir));
    assert!(e.contains("has no journal"), "{e}");
    // RAID1 has no write hole: no journal.
    let e = one_line_error(&on_members(
        &[
            "create",
            "--level",
            "1",
            "--size",
            "48M",
            "--force",
            "--journal",
            "jn",
        ],
        2,
        &dir,
    ));
    assert!(e.contains("no parity"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `create --spare`: hot spares written at creation (a superblock marked spare), found by
/// `status` among the paths given; refused on RAID0 before anything is written, and a spare
/// given twice is refused.
#[test]
fn create_with_spares() {
    let dir = tmp("spares-create");
    let out = create(&dir, "6", 6, &["--spare", "s0", "--spare", "s1"]);
    assert!(
        out.contains("hot spare s0") && out.contains("hot spare s1"),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&on_members(
        &["status", "--json", "--offline", "s0", "s1"],
        6,
        &dir,
    )))
    .unwrap();
    assert_eq!(v["spares"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["state"], "healthy", "{v}");
    let ex: serde_json::Value =
        serde_json::from_str(&ok(&uraid(&["examine", "--json", "s0"], &dir))).unwrap();
    assert_eq!(ex["spare"], true, "{ex}");
    let e = one_line_error(&on_members(
        &[
            "create", "--level", "0", "--size", "48M", "--force", "--spare", "s2",
        ],
        3,
        &dir,
    ));
    assert!(e.contains("raid0 has no redundancy"), "{e}");
    assert!(!dir.join("s2").exists(), "nothing written");
    let e = one_line_error(&on_members(
        &[
            "create", "--level", "5", "--size", "48M", "--force", "--spare", "s3", "--spare", "s3",
        ],
        3,
        &dir,
    ));
    assert!(e.contains("given twice"), "{e}");
}

/// A refused `create` leaves nothing behind: member files `--size` made are removed again
/// (too few members for the level; a member of another array among them), and a file that
/// was there before is left as it was.
#[test]
fn a_refused_create_leaves_no_member_files_behind() {
    let dir = tmp("create-refused");
    let e = one_line_error(&uraid(
        &["create", "--level", "6", "--size", "48M", "n0", "n1", "n2"],
        &dir,
    ));
    assert!(e.contains("raid6 needs at least 4 members, got 3"), "{e}");
    assert_eq!(e.matches("needs at least").count(), 1, "printed once: {e}");
    for n in ["n0", "n1", "n2"] {
        assert!(!dir.join(n).exists(), "{n} left behind: {e}");
    }
    // A member of another array among them: refused, the new files go, the old one stays.
    create(&dir, "1", 2, &[]);
    let before = std::fs::read(dir.join("m0")).unwrap();
    let e = one_line_error(&uraid(
        &["create", "--level", "5", "--size", "48M", "m0", "k1", "k2"],
        &dir,
    ));
    assert!(e.contains("m0"), "{e}");
    assert!(!dir.join("k1").exists() && !dir.join("k2").exists(), "{e}");
    assert!(
        std::fs::read(dir.join("m0")).unwrap() == before,
        "m0 changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// mdadm's --run: a member list with a typo (m0 twice, m3 left out) is refused, naming the
/// slot and device left out, and nothing is written (the left-out member is not recorded
/// failed: every member given again, the array is healthy); `--run` starts it degraded.
/// A member the array recorded failed needs no --run.
#[test]
fn a_member_list_that_leaves_a_member_in_service_out_is_refused_without_run() {
    let dir = tmp("run");
    create(&dir, "5", 4, &["--name", "r"]);
    let uuid = {
        let j: serde_json::Value =
            serde_json::from_str(&ok(&uraid(&["examine", "--json", "m3"], &dir))).unwrap();
        j["device_uuid"].as_str().expect("device_uuid").to_string()
    };
    let listen = format!("unix:{}", dir.join("nbd.sock").display());
    let typo = [
        "serve",
        "--listen",
        &listen,
        "--control",
        "none",
        "m0",
        "m1",
        "m2",
        "m0",
    ];
    let o = uraid(&typo, &dir);
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("m0: duplicate of member 0"), "{e}");
    assert!(
        e.contains("member 3 (device ") && e.contains("--run"),
        "{e}"
    );
    assert!(
        uuid.is_empty() || e.contains(&uuid),
        "names the device {uuid}: {e}"
    );
    assert_eq!(e.matches("not starting").count(), 1, "printed once: {e}");
    let status = exits(&uraid(&["status", "m0", "m1", "m2", "m3"], &dir), 0);
    assert!(status.contains("[4/4] [UUUU]"), "{status}");
    // --run: starts degraded.
    let srv = Serve::new(&dir)
        .args(["--run"])
        .members(["m0", "m1", "m2"])
        .start();
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Arrays created without --name get names of their own (`uraid-` and the uuid's first 8 hex
/// digits): two of them never share a default control socket or export name.
#[test]
fn arrays_created_without_a_name_get_different_names() {
    let dir = tmp("names");
    let made: Vec<String> = [["a0", "a1"], ["b0", "b1"]]
        .iter()
        .map(|m| {
            let out = ok(&uraid(
                &["create", "--level", "1", "--size", "48M", m[0], m[1]],
                &dir,
            ));
            let name = out.split('\'').nth(1).unwrap_or_default().to_string();
            let uuid = out.split('(').nth(1).unwrap_or_default();
            assert!(
                name.starts_with("uraid-") && name.len() == 14 && uuid.starts_with(&name[6..]),
                "{out}"
            );
            name
        })
        .collect();
    assert_ne!(made[0], made[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two arrays given the same name: the second server to start finds the default control
/// socket answered by the first and refuses (before opening its members), naming both ways
/// out; it never runs unmanageable with only a warning. The first server is stood in for by
/// a listener of this test process on that path.
#[test]
fn a_default_control_socket_another_server_holds_is_refused() {
    if !root() {
        eprintln!("skipped: /run/uraid needs root");
        return;
    }
    let dir = tmp("ctltaken");
    let name = format!("ctltaken-{}", std::process::id());
    create(&dir, "1", 2, &["--name", &name]);
    let path = std::path::PathBuf::from(format!("/run/uraid/{name}.sock"));
    std::fs::create_dir_all("/run/uraid").expect("/run/uraid (tests run as root)");
    let _ = std::fs::remove_file(&path);
    let other = std::os::unix::net::UnixListener::bind(&path).expect("bind the stand-in");
    let listen = format!("unix:{}", dir.join("nbd.sock").display());
    // Bounded: a server that starts anyway is killed, and the test fails on its output.
    let mut child = Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["serve", "--listen", &listen, "m0", "m1"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run uraid serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    kill_if_running(&mut child);
    let o = child.wait_with_output().expect("output");
    let e = one_line_error(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("another server is listening there")
            && e.contains("--control unix:PATH")
            && e.contains("--control none"),
        "{e}"
    );
    assert!(path.exists(), "the other server's socket is left alone");
    assert!(
        examine_clean(&dir.join("m0")),
        "members not opened for writing"
    );
    drop(other);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `examine --scan` (mdadm --examine --scan): one uraid.conf section per array the scan
/// finds, by name with its uuid line, that `uraid config check` accepts as written.
#[test]
fn examine_scan_prints_config_sections_for_every_array_found() {
    let dir = tmp("exscan");
    ok(&uraid(
        &[
            "create", "--level", "5", "--size", "16M", "-N", "alpha", "a0", "a1", "a2",
        ],
        &dir,
    ));
    ok(&uraid(
        &[
            "create", "--level", "1", "--size", "16M", "-N", "beta", "b0", "b1",
        ],
        &dir,
    ));
    let uuid = |m: &str| {
        let j: serde_json::Value =
            serde_json::from_str(&ok(&uraid(&["examine", "--json", m], &dir))).unwrap();
        j["array_uuid"].as_str().unwrap().to_string()
    };
    let out = ok(&uraid(&["examine", "--scan", "--scan-dir", "."], &dir));
    for (name, m) in [("alpha", "a0"), ("beta", "b0")] {
        assert!(
            out.contains(&format!("[{name}]\nuuid = {}\n", uuid(m))),
            "{out}"
        );
    }
    std::fs::write(dir.join("u.conf"), &out).unwrap();
    let check = ok(&uraid(&["config", "check", "--config", "u.conf"], &dir));
    assert!(check.contains("2 array(s): alpha, beta"), "{check}");
    let e = uraid(&["examine"], &dir);
    assert!(!e.status.success(), "a member or --scan is required");
    let _ = std::fs::remove_dir_all(&dir);
}
