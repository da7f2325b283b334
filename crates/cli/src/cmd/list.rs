//! `uraid list`: every array whose devices a scan finds, and every running server
//! (mdadm --detail --scan, /proc/mdstat, zpool list).

use crate::client;
use anyhow::Result;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use uraid_core::format::uuid_string;
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct ListArgs {
    /// A directory whose files and block devices are also read (member files); repeat for
    /// several. The block devices in /proc/partitions are always read.
    #[arg(long = "scan-dir", value_name = "DIR")]
    scan_dir: Vec<PathBuf>,
    /// A directory of control sockets to ask (default /run/uraid); repeat for several.
    #[arg(long = "control-dir", value_name = "DIR")]
    control_dir: Vec<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A running server: its control socket and status document.
pub struct Server {
    pub sock: PathBuf,
    pub status: Value,
}

/// The servers answering on the sockets (`*.sock`) in `dirs` and on `more`, and the
/// sockets that accept connections but gave no status document (with why).
pub fn servers(dirs: &[PathBuf], more: &[PathBuf]) -> (Vec<Server>, Vec<(PathBuf, String)>) {
    let mut socks: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    socks.extend(more.iter().cloned());
    socks.sort();
    socks.dedup();
    let (mut up, mut mute) = (Vec::new(), Vec::new());
    for sock in socks {
        if std::os::unix::net::UnixStream::connect(&sock).is_err() {
            continue;
        }
        match client::get_json(&sock, "/status") {
            Ok(status) if status["schema"].is_u64() => up.push(Server { sock, status }),
            Ok(_) => mute.push((sock, "not a uraid status document".to_string())),
            Err(e) => mute.push((sock, format!("{e:#}"))),
        }
    }
    (up, mute)
}

fn health(v: &Value) -> &'static str {
    match super::monitor::health(v) {
        "failed" => "FAILED",
        "degraded" => "degraded",
        _ => "healthy",
    }
}

/// `uraid list`.
pub fn run(a: ListArgs) -> Result<()> {
    let scan = assemble::scan(&a.scan_dir, true, assemble::DISCOVERY_TIMEOUT)?;
    let dirs = if a.control_dir.is_empty() {
        vec![PathBuf::from("/run/uraid")]
    } else {
        a.control_dir.clone()
    };
    let (servers, mute) = servers(&dirs, &[]);
    let served_by = |uuid: &[u8; 16]| {
        let u = uuid_string(uuid);
        servers
            .iter()
            .find(|s| s.status["array_uuid"].as_str() == Some(u.as_str()))
    };
    let mut arrays = Vec::new();
    for f in &scan.arrays {
        let plan = assemble::plan(&f.paths()).ok();
        let g = f.sb.geometry;
        let (found, state) = match &plan {
            Some(p) => (
                g.members - p.missing().len(),
                if p.sb.clean { "clean" } else { "dirty" },
            ),
            None => (0, "unknown"),
        };
        let server = served_by(&f.uuid);
        arrays.push(json!({
            "name": f.sb.name,
            "array_uuid": uuid_string(&f.uuid),
            "level": g.level.to_string(),
            "members": g.members,
            "members_found": found,
            "state": state,
            "copies": f.check_copies().err().map(|e| e.to_string()),
            "devices": f.devices.iter().map(|(p, sb)| json!({
                "path": p.display().to_string(),
                "role": if sb.spare { "spare".to_string() }
                        else if sb.replacement { format!("replacement of {}", sb.index) }
                        else { format!("member {}", sb.index) },
                "events": sb.events,
            })).collect::<Vec<_>>(),
            "journals": f.journals.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>(),
            "server": server.map(|s| s.sock.display().to_string()),
        }));
    }
    let running: Vec<Value> = servers
        .iter()
        .map(|s| {
            json!({
                "control": s.sock.display().to_string(),
                "name": s.status["name"],
                "array_uuid": s.status["array_uuid"],
                "pid": s.status["pid"],
                "health": health(&s.status),
                "state": s.status["state"],
                "exports": s.status["exports"],
            })
        })
        .collect();
    if a.json {
        let v = json!({
            "arrays": arrays,
            "servers": running,
            "scanned": scan.scanned,
            "places": scan.places,
            "unanswered": scan.unanswered.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "sockets_without_status": mute.iter().map(|(p, e)| json!({"control": p.display().to_string(), "error": e})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if arrays.is_empty() {
        println!(
            "no uraid array found among {} device(s) in {}",
            scan.scanned,
            scan.places.join(", ")
        );
    }
    for v in &arrays {
        println!(
            "{} : {} [{}/{}] {}  uuid {}",
            v["name"].as_str().unwrap_or("?"),
            v["level"].as_str().unwrap_or("?"),
            v["members_found"],
            v["members"],
            v["state"].as_str().unwrap_or("?"),
            v["array_uuid"].as_str().unwrap_or("?"),
        );
        let devs: Vec<String> = v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                format!(
                    "{} ({})",
                    d["path"].as_str().unwrap_or("?"),
                    d["role"].as_str().unwrap_or("?")
                )
            })
            .chain(
                v["journals"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|j| format!("{} (journal)", j.as_str().unwrap_or("?"))),
            )
            .collect();
        println!("      devices: {}", devs.join(", "));
        if let Some(c) = v["copies"].as_str() {
            println!("      REFUSED by --scan: {c}");
        }
        match v["server"].as_str() {
            Some(s) => println!("      served: control {s}"),
            None => println!("      served: no running server found"),
        }
    }
    for s in &running {
        println!(
            "server pid {} : '{}' {} {}  control {}",
            s["pid"],
            s["name"].as_str().unwrap_or("?"),
            s["health"].as_str().unwrap_or("?"),
            s["state"].as_str().unwrap_or(""),
            s["control"].as_str().unwrap_or("?")
        );
    }
    for (p, e) in &mute {
        println!(
            "socket {}: accepts connections but gave no status ({e}); a server there may be \
             hung",
            p.display()
        );
    }
    for p in &scan.unanswered {
        println!("{}: did not answer (left out)", Path::new(p).display());
    }
    Ok(())
}
