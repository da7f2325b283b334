//! The client side of the control socket: its HTTP requests (`get`, `post`, …), finding
//! and checking a running server, and what `uraid status`, `uraid detail` and `uraid watch`
//! print from its status document.

use crate::control::{self, SCHEMA};
use crate::size;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use uraid_core::format::uuid_string;
use uraid_engine::assemble::Plan;

/// GETs `path` from the control socket at `sock`: the status code and body.
pub fn get(sock: &Path, path: &str) -> Result<(u16, String)> {
    request(sock, "GET", path)
}

/// Sends a body-less `method` request for `path` to the control socket at `sock`.
pub fn request(sock: &Path, method: &str, path: &str) -> Result<(u16, String)> {
    let mut s = UnixStream::connect(sock)
        .with_context(|| format!("cannot connect to {}", sock.display()))?;
    // A member failure waits for a superblock round (member timeouts apply).
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: uraid\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => bail!("{}: malformed response", sock.display()),
    };
    let code = resp.code.unwrap_or(0);
    Ok((code, String::from_utf8_lossy(&buf[n..]).into_owned()))
}

/// POSTs an operator command; the server's message, or its refusal as an error.
pub fn post(sock: &Path, path: &str) -> Result<String> {
    let (code, body) = request(sock, "POST", path)?;
    let v: Value = serde_json::from_str(&body)
        .with_context(|| format!("{}: response is not JSON", sock.display()))?;
    if code != 202 {
        let e = v["error"].as_str().unwrap_or("?");
        bail!(
            "{}",
            e.strip_suffix(crate::control::FORCE_HINT).unwrap_or(e)
        );
    }
    Ok(v["message"].as_str().unwrap_or("done").to_string())
}

/// GETs a JSON document; non-200 is an error carrying the server's message.
pub fn get_json(sock: &Path, path: &str) -> Result<Value> {
    let (code, body) = get(sock, path)?;
    let v: Value = serde_json::from_str(&body)
        .with_context(|| format!("{}: response is not JSON", sock.display()))?;
    if code != 200 {
        bail!(
            "{}: {path}: HTTP {code}: {}",
            sock.display(),
            v["error"].as_str().unwrap_or("?")
        );
    }
    Ok(v)
}

/// Where to look for the server of the array formed by `plan`'s members.
pub fn socket_for(
    plan: &Plan,
    control_arg: Option<&str>,
    embedded: bool,
) -> Result<Option<PathBuf>> {
    match control_arg {
        Some(spec) => control::parse_endpoint(spec),
        None => Ok(control::default_path(&plan.sb.name, embedded)),
    }
}

/// Why there is no live status.
pub fn not_running_reason(sock: &Path) -> String {
    match std::os::unix::net::UnixStream::connect(sock) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => format!(
            "a server may be running, but its control socket {} refused this user (permission denied)",
            sock.display()
        ),
        _ => format!("no running server at {}", sock.display()),
    }
}

/// The live status of the array `plan` describes, if its server answers at `sock`. A server
/// of another array at that path is an error (never shown as this one's status).
pub fn live_status(plan: &Plan, sock: &Path) -> Result<Option<Value>> {
    if !sock.exists() {
        return Ok(None);
    }
    let v = match get_json(sock, "/status") {
        Ok(v) => v,
        Err(e) => {
            // Not reachable (a stale socket file, no permission) is "no live status", and
            // `not_running_reason` says which; anything else is reported.
            if std::os::unix::net::UnixStream::connect(sock).is_err() {
                return Ok(None);
            }
            return Err(e);
        }
    };
    if v["schema"].as_u64() != Some(SCHEMA as u64) {
        bail!(
            "{}: status schema {} (this uraid understands {SCHEMA})",
            sock.display(),
            v["schema"]
        );
    }
    let want = uuid_string(&plan.sb.array_uuid);
    if v["array_uuid"].as_str() != Some(want.as_str()) {
        bail!(
            "{}: the server there serves array {} , not {want} (pass --control unix:PATH)",
            sock.display(),
            v["array_uuid"]
        );
    }
    Ok(Some(v))
}

fn us(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.0}us"))
}

fn mark(state: &str) -> char {
    // A member being replaced holds all of its data.
    if state == "active" || state == "replacing" {
        'U'
    } else {
        '_'
    }
}

/// `uraid status` from a live server.
pub fn print_live(v: &Value, sock: &Path, detail: bool) {
    let slots = v["slots"].as_array().cloned().unwrap_or_default();
    let marks: String = slots
        .iter()
        .map(|s| mark(s["state"].as_str().unwrap_or("")))
        .collect();
    let members = v["members"].as_u64().unwrap_or(0);
    let up = slots
        .iter()
        .filter(|s| mark(s["state"].as_str().unwrap_or("")) == 'U')
        .count();
    println!(
        "{} : {} {} members, chunk {}, volume {} [{up}/{members}] [{marks}]",
        v["name"].as_str().unwrap_or("?"),
        v["level"].as_str().unwrap_or("?"),
        members,
        size::human(v["chunk"].as_u64().unwrap_or(0)),
        size::human(v["volume_size"].as_u64().unwrap_or(0)),
    );
    println!(
        "      uuid {}  events {}  state: {}",
        v["array_uuid"].as_str().unwrap_or("?"),
        v["events"],
        v["state"].as_str().unwrap_or("?")
    );
    println!(
        "      source: running server (pid {}, up {:.0} s, control socket {})",
        v["pid"],
        v["uptime_seconds"].as_f64().unwrap_or(0.0),
        sock.display()
    );
    for e in v["exports"].as_array().into_iter().flatten() {
        for l in e["listen"].as_array().into_iter().flatten() {
            println!(
                "      export {} at {}",
                e["name"].as_str().unwrap_or(""),
                l.as_str().unwrap_or("")
            );
        }
    }
    let c = &v["connections"];
    let r = &v["requests"];
    let refused = total(&c["refused"]);
    println!(
        "      connections: {} open, {} accepted, {} refused, {} protocol errors; requests: {}, {} error replies",
        c["open"], c["accepted"], refused, c["protocol_errors"], r["total"], r["errors"]
    );
    let t = &v["tls"];
    if let Some(cred) = t["credentials"].as_str() {
        println!(
            "      tls: {} ({cred}), {} handshakes, {} failed (uraid tls: per client)",
            t["mode"].as_str().unwrap_or("?"),
            t["handshakes"],
            total(&t["failures"])
        );
    }
    if let Some(j) = v["journal"].as_object() {
        println!(
            "      journal: {} {} ({}), {} of {} used, {} records, {} commits, {} checkpoints",
            j["device"].as_str().unwrap_or("?"),
            j["state"].as_str().unwrap_or("?"),
            j["mode"].as_str().unwrap_or("?"),
            size::human(j["used_bytes"].as_u64().unwrap_or(0)),
            size::human(j["log_bytes"].as_u64().unwrap_or(0)),
            j["records"],
            j["commits"],
            j["checkpoints"]
        );
    }
    let bg = background_lines(v);
    if bg.is_empty() {
        println!("      background: none");
    }
    for b in &bg {
        println!("      background: {b}");
    }
    for sp in v["spares"].as_array().into_iter().flatten() {
        println!("      spare: {}", sp.as_str().unwrap_or("?"));
    }
    for s in &slots {
        print_slot(s, detail);
    }
    // The drives that left (which to pull), while this server runs.
    for d in v["departed"].as_array().into_iter().flatten() {
        let by = d["by"]
            .as_str()
            .map_or(String::new(), |b| format!(", slot taken by {b}"));
        println!(
            "      [{:>2}] was      {} ({}{by}, {})",
            d["slot"].as_u64().unwrap_or(0),
            d["device"].as_str().unwrap_or("?"),
            d["how"].as_str().unwrap_or("?"),
            utc(d["at"].as_u64().unwrap_or(0))
        );
    }
    if detail {
        print_requests(v);
    }
}

/// One slot's line of `uraid status` (with `detail`: its I/O by operation and errors).
fn print_slot(s: &Value, detail: bool) {
    let st = s["state"].as_str().unwrap_or("?");
    let path = s["path"].as_str().unwrap_or("-");
    print!(
        "      [{:>2}] {st:<8} {path}",
        s["index"].as_u64().unwrap_or(0)
    );
    if let Some(r) = s["replacement"].as_str() {
        print!(" -> {r}");
    }
    if detail {
        println!();
        for op in ["read", "write", "flush", "discard"] {
            let o = &s[op];
            println!(
                "           {op:<7} {:>12} ops {:>12} errors {:>3}  mean {:>7}  p99 <= {:>7}",
                o["count"],
                size::human(o["bytes"].as_u64().unwrap_or(0)),
                o["errors"],
                us(&o["latency_mean_us"]),
                us(&o["latency_p99_us"]),
            );
        }
        println!(
            "           read errors corrected {}, budget {}/{}",
            s["read_errors_corrected"],
            s["read_error_budget"]["used"],
            s["read_error_budget"]["max"]
        );
        let bad = &s["bad_blocks"]["ranges"];
        if let Some(ranges) = bad.as_array().filter(|r| !r.is_empty()) {
            let list: Vec<String> = ranges
                .iter()
                .map(|r| format!("{}+{}", r["first_unit"], r["units"]))
                .collect();
            println!(
                "           bad blocks: {} range(s), {} (units {})",
                ranges.len(),
                size::human(s["bad_blocks"]["bytes"].as_u64().unwrap_or(0)),
                list.join(" ")
            );
        }
    } else {
        println!(
            "  reads {} writes {} errors {}",
            s["read"]["count"],
            s["write"]["count"],
            s["read"]["errors"].as_u64().unwrap_or(0) + s["write"]["errors"].as_u64().unwrap_or(0)
        );
    }
}

/// `uraid detail`: requests by command and stripe operations.
fn print_requests(v: &Value) {
    println!("      requests by command:");
    if let Some(ops) = v["requests"]["ops"].as_object() {
        for (name, o) in ops {
            println!(
                "           {name:<12} {:>12} ops {:>12} errors {:>3}  mean {:>7}  p99 <= {:>7}",
                o["count"],
                size::human(o["bytes"].as_u64().unwrap_or(0)),
                o["errors"],
                us(&o["latency_mean_us"]),
                us(&o["latency_p99_us"]),
            );
        }
    }
    println!("      stripe operations: {}", v["stripe_operations"]);
}

/// `uraid watch`: polls the server every `interval` and prints rates; progress bars for
/// background operations on a terminal, plain lines otherwise. `count` stops after that
/// many updates (0: until interrupted).
pub fn watch(sock: &Path, plan: &Plan, interval: Duration, count: u64) -> Result<()> {
    let Some(mut prev) = live_status(plan, sock)? else {
        bail!(
            "array '{}': {} (uraid watch needs one; uraid status reads superblocks)",
            plan.sb.name,
            not_running_reason(sock)
        );
    };
    let tty = std::io::stderr().is_terminal();
    let multi = indicatif::MultiProgress::new();
    if !tty {
        multi.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut bars: std::collections::HashMap<String, indicatif::ProgressBar> = Default::default();
    let mut t_prev = Instant::now();
    let mut n = 0;
    loop {
        std::thread::sleep(interval);
        let Some(v) = live_status(plan, sock)? else {
            println!("{}: stopped watching", not_running_reason(sock));
            return Ok(());
        };
        let dt = t_prev.elapsed().as_secs_f64().max(1e-3);
        t_prev = Instant::now();
        let (line, members) = rates(&v, &prev, dt);
        // Background operations: a bar each on a terminal, lines otherwise.
        if tty {
            draw_bars(&v, &multi, &mut bars);
            let _ = multi.println(format!("{line}\n  {members}"));
        } else {
            for l in background_lines(&v) {
                println!("{l}");
            }
            println!("{line}");
            println!("  {members}");
        }
        prev = v;
        n += 1;
        if count > 0 && n >= count {
            return Ok(());
        }
    }
}

/// The two lines of a `uraid watch` update: request rates of the array, then each member's,
/// from two status documents `dt` seconds apart.
fn rates(v: &Value, prev: &Value, dt: f64) -> (String, String) {
    let delta = |a: &Value, b: &Value| {
        (a.as_u64()
            .unwrap_or(0)
            .saturating_sub(b.as_u64().unwrap_or(0))) as f64
            / dt
    };
    let ops = |x: &Value, key: &str| -> (f64, f64) {
        let (mut c, mut b) = (0.0, 0.0);
        if let (Some(now), Some(was)) = (
            x["requests"]["ops"].as_object(),
            prev["requests"]["ops"].as_object(),
        ) {
            for k in ["read", "write"]
                .iter()
                .filter(|k| key.is_empty() || **k == key)
            {
                let null = Value::Null;
                let (n, w) = (now.get(*k).unwrap_or(&null), was.get(*k).unwrap_or(&null));
                c += delta(&n["count"], &w["count"]);
                b += delta(&n["bytes"], &w["bytes"]);
            }
        }
        (c, b)
    };
    let (ri, rb) = ops(v, "read");
    let (wi, wb) = ops(v, "write");
    let line = format!(
        "{}: {}  read {:.0} IOPS {}/s  write {:.0} IOPS {}/s  connections {}",
        v["name"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?"),
        ri,
        size::human(rb as u64),
        wi,
        size::human(wb as u64),
        v["connections"]["open"],
    );
    let members: Vec<String> = v["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(prev["slots"].as_array().into_iter().flatten())
        .map(|(s, p)| {
            format!(
                "[{}] {} r {:.0}/s w {:.0}/s",
                s["index"],
                s["state"].as_str().unwrap_or("?"),
                delta(&s["read"]["count"], &p["read"]["count"]),
                delta(&s["write"]["count"], &p["write"]["count"])
            )
        })
        .collect();
    (line, members.join("  "))
}

/// Updates the progress bar of each background operation (a bar each, on a terminal).
fn draw_bars(
    v: &Value,
    multi: &indicatif::MultiProgress,
    bars: &mut std::collections::HashMap<String, indicatif::ProgressBar>,
) {
    for b in v["background"].as_array().into_iter().flatten() {
        let op = b["op"].as_str().unwrap_or("?").to_string();
        let done = b["progress"].as_f64().unwrap_or(0.0);
        let bar = bars.entry(op.clone()).or_insert_with(|| {
            let pb = multi.add(indicatif::ProgressBar::new(1000));
            pb.set_style(
                indicatif::ProgressStyle::with_template("{prefix} [{bar:40}] {percent}% {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            pb.set_prefix(op.clone());
            pb
        });
        bar.set_position((done * 1000.0) as u64);
        bar.set_message(format!("eta {}", b["eta_seconds"]));
    }
}

/// One plain line per background operation of a status document (`op`, `progress` 0–1,
/// `rate_bytes_per_second`, `eta_seconds`; docs/control.md).
pub fn background_lines(v: &Value) -> Vec<String> {
    v["background"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let eta = b["eta_seconds"]
                .as_f64()
                .map_or("-".to_string(), |s| format!("{s:.0} s"));
            format!(
                "{}: {:.1}% done, {}/s, eta {eta}",
                b["op"].as_str().unwrap_or("?"),
                b["progress"].as_f64().unwrap_or(0.0) * 100.0,
                size::human(b["rate_bytes_per_second"].as_f64().unwrap_or(0.0) as u64),
            )
        })
        .collect()
}

/// `secs` since the Unix epoch, RFC 3339 in UTC.
fn utc(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The sum of a JSON object's counters (`/status`'s counts by reason); 0 for anything else.
pub fn total(v: &serde_json::Value) -> u64 {
    v.as_object()
        .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_operations_render_as_lines() {
        let v = serde_json::json!({"background": [
            {"op": "resync", "progress": 0.25, "rate_bytes_per_second": 2097152.0, "eta_seconds": 30.4},
            {"op": "scrub", "progress": 1.0, "rate_bytes_per_second": 0.0, "eta_seconds": null},
        ]});
        assert_eq!(
            background_lines(&v),
            vec![
                "resync: 25.0% done, 2M/s, eta 30 s".to_string(),
                "scrub: 100.0% done, 0B/s, eta -".to_string()
            ]
        );
        assert!(background_lines(&serde_json::json!({"background": []})).is_empty());
    }
}
