//! `uraid examine`: the superblock of one member (or a journal device), and the words for
//! superblock fields that `uraid status` shares.

use crate::size;
use anyhow::Result;
use serde_json::json;
use std::path::{Path, PathBuf};
use uraid_core::format::{uuid_string, Superblock};
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct ExamineArgs {
    /// The member (or journal device) to examine.
    #[arg(required_unless_present = "scan")]
    member: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Every array whose devices a scan finds, as uraid.conf sections (mdadm --examine
    /// --scan): the block devices in /proc/partitions and the --scan-dir directories.
    #[arg(long, conflicts_with = "member")]
    scan: bool,
    /// A directory whose files and block devices --scan also reads (member files); repeat
    /// for several.
    #[arg(long = "scan-dir", value_name = "DIR", requires = "scan")]
    scan_dir: Vec<PathBuf>,
}

/// `uraid examine`: the superblock, or a journal device's header when the device holds no
/// superblock; with `--scan`, config sections for every array found.
pub fn run(a: ExamineArgs) -> Result<()> {
    let ExamineArgs {
        member,
        json,
        scan,
        scan_dir,
    } = a;
    let Some(member) = member.filter(|_| !scan) else {
        return print_scan(&scan_dir, json);
    };
    if let (Err(_), Ok(j)) = (
        assemble::read_superblock(&member),
        assemble::read_journal_super(&member),
    ) {
        return print_journal_examine(&member, &j, json);
    }
    let sb = assemble::read_superblock(&member)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&sb_json(&member, &sb))?);
    } else {
        print_examine(&member, &sb);
    }
    Ok(())
}

fn print_journal_examine(
    path: &Path,
    j: &uraid_core::journal::JournalSuper,
    json: bool,
) -> Result<()> {
    if json {
        let v = json!({
            "path": path.display().to_string(),
            "kind": "journal",
            "array_uuid": uuid_string(&j.array_uuid),
            "journal_uuid": uuid_string(&j.journal_uuid),
            "epoch": j.epoch,
            "generation": j.gen,
            "log_start": j.log_start,
            "log_len": j.log_len,
            "tail": j.tail,
            "tail_seq": j.tail_seq,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{}:", path.display());
    println!("          Magic : uraid-jn (journal device)");
    println!("     Array UUID : {}", uuid_string(&j.array_uuid));
    println!("   Journal UUID : {}", uuid_string(&j.journal_uuid));
    println!(
        "       Log Area : {} ({} bytes at offset {})",
        size::human(j.log_len),
        j.log_len,
        j.log_start
    );
    println!("          Epoch : {}", j.epoch);
    println!(
        "     Checkpoint : record {} at log position {}",
        j.tail_seq, j.tail
    );
    Ok(())
}

pub fn journal_word(sb: &Superblock) -> String {
    match sb.journal {
        Some((u, m)) => format!("{} ({})", uuid_string(&u), m.name()),
        None => "none".into(),
    }
}

fn bitmap_word(sb: &Superblock) -> String {
    match sb.bitmap_chunk {
        0 => "none (no write-intent bitmap: an unclean stop resyncs everything)".into(),
        c => format!(
            "{} ({} regions)",
            size::human(c),
            uraid_core::bitmap::regions(&sb.geometry, c)
        ),
    }
}

pub fn state_word(sb: &Superblock) -> &'static str {
    if sb.clean {
        "clean"
    } else {
        "active (not cleanly stopped)"
    }
}

fn print_examine(path: &Path, sb: &Superblock) {
    let g = sb.geometry;
    println!("{}:", path.display());
    println!("          Magic : uraid-sb");
    println!("        Version : {}", uraid_core::format::VERSION);
    println!("     Array UUID : {}", uuid_string(&sb.array_uuid));
    println!("           Name : {}", sb.name);
    println!("     Raid Level : {}", g.level);
    println!("   Raid Devices : {}", g.members);
    println!("     Chunk Size : {}", size::human(g.chunk));
    println!("    Data Offset : {} bytes", sb.data_offset);
    println!(
        "    Member Data : {} ({} bytes)",
        size::human(g.member_data),
        g.member_data
    );
    println!(
        "    Volume Size : {} ({} bytes)",
        size::human(g.volume_size()),
        g.volume_size()
    );
    println!("    Device UUID : {}", uuid_string(&sb.device_uuid));
    if sb.spare {
        println!("    Device Role : hot spare");
    } else if sb.replacement {
        println!(
            "    Device Role : replacement of member {} (replace in progress)",
            sb.index
        );
    } else {
        println!("   Device Index : {}", sb.index);
    }
    println!("         Events : {}", sb.events);
    println!("   Bitmap Chunk : {}", bitmap_word(sb));
    println!("        Journal : {}", journal_word(sb));
    println!("          State : {}", state_word(sb));
    let states: String = (0..g.members)
        .map(|i| {
            if sb.is_failed(i) {
                'F'
            } else if sb.is_rebuilding(i) {
                'R'
            } else {
                'A'
            }
        })
        .collect();
    println!("   Array States : {states}  (A = active, F = failed, R = rebuilding)");
    for i in (0..g.members).filter(|&i| sb.is_rebuilding(i)) {
        println!(
            "    Rebuild [{i:>2}] : {} of {} units",
            sb.rebuilt[i],
            g.units()
        );
    }
    // md's --examine-badblocks: every slot's list (units of `Geometry::units`).
    for i in 0..g.members {
        let (n, units) = sb.bad.count(i);
        if n == 0 {
            continue;
        }
        let list: Vec<String> = sb
            .bad
            .ranges()
            .iter()
            .filter(|r| r.member == i)
            .map(|r| format!("{}+{}", r.start, r.len))
            .collect();
        println!(
            " Bad Blocks [{i:>2}] : {n} range(s), {} units, {} (units {})",
            units,
            size::human(units * g.chunk),
            list.join(" ")
        );
    }
    for (i, r) in sb.replaces.iter().enumerate() {
        if let Some(r) = r {
            println!(
                "    Replace [{i:>2}] : by {}, {} of {} units copied",
                uuid_string(&r.uuid),
                r.copied,
                g.units()
            );
        }
    }
}

fn sb_json(path: &Path, sb: &Superblock) -> serde_json::Value {
    let g = sb.geometry;
    json!({
        "path": path.display().to_string(),
        "version": uraid_core::format::VERSION,
        "array_uuid": uuid_string(&sb.array_uuid),
        "name": sb.name,
        "level": g.level.to_string(),
        "parity": g.parity(),
        "members": g.members,
        "chunk": g.chunk,
        "data_offset": sb.data_offset,
        "member_data": g.member_data,
        "volume_size": g.volume_size(),
        "device_uuid": uuid_string(&sb.device_uuid),
        "index": sb.index,
        "events": sb.events,
        "clean": sb.clean,
        "bitmap_chunk": sb.bitmap_chunk,
        "journal": sb.journal.map(|(u, m)| json!({"uuid": uuid_string(&u), "mode": m.name()})),
        "ctime": sb.ctime,
        "utime": sb.utime,
        "spare": sb.spare,
        "member_states": (0..g.members).map(|i| sb_state(sb, i)).collect::<Vec<_>>(),
        "rebuilt_units": sb.rebuilt,
        "bad_blocks": sb.bad.ranges().iter()
            .map(|r| json!({"member": r.member, "first_unit": r.start, "units": r.len}))
            .collect::<Vec<_>>(),
        "replacement": sb.replacement,
        "replaces": sb.replaces.iter().enumerate().filter_map(|(i, r)| {
            r.map(|r| json!({"member": i, "device_uuid": uuid_string(&r.uuid), "copied_units": r.copied}))
        }).collect::<Vec<_>>(),
    })
}

pub fn sb_state(sb: &Superblock, i: usize) -> &'static str {
    if sb.is_removed(i) {
        "removed"
    } else if sb.is_failed(i) {
        "failed"
    } else if sb.is_rebuilding(i) {
        "rebuilding"
    } else {
        "active"
    }
}

/// `examine --scan`: a `[NAME]` section with its `uuid` line per array found, preceded by
/// comments naming its level and devices (what to paste into /etc/uraid/uraid.conf), or
/// the same as JSON.
fn print_scan(dirs: &[PathBuf], json: bool) -> Result<()> {
    let scan = assemble::scan(dirs, true, assemble::DISCOVERY_TIMEOUT)?;
    if json {
        let v: Vec<serde_json::Value> = scan
            .arrays
            .iter()
            .map(|f| {
                json!({
                    "name": f.sb.name,
                    "array_uuid": uuid_string(&f.uuid),
                    "level": f.sb.geometry.level.to_string(),
                    "members": f.sb.geometry.members,
                    "devices": f.devices.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>(),
                    "journals": f.journals.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "# uraid examine --scan: {} array(s) among {} device(s) in {}",
        scan.arrays.len(),
        scan.scanned,
        scan.places.join(", ")
    );
    for f in &scan.arrays {
        let g = f.sb.geometry;
        let devs: Vec<String> = f
            .devices
            .iter()
            .map(|(p, _)| p.display().to_string())
            .chain(f.journals.iter().map(|(p, _)| p.display().to_string()))
            .collect();
        println!();
        println!(
            "# {} {} members, {} device(s) found now: {}",
            g.level,
            g.members,
            devs.len(),
            devs.join(" ")
        );
        println!("[{}]", f.sb.name);
        println!("uuid = {}", uuid_string(&f.uuid));
    }
    for p in &scan.unanswered {
        eprintln!("uraid: {}: did not answer; not examined", p.display());
    }
    Ok(())
}
