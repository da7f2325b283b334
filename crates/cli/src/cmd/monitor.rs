//! `uraid monitor`: mdadm --monitor's job for running servers. Every `--interval` it reads
//! the status document of each server whose control socket is in the control directories
//! (or given with `--control`) and reports what changed as typed events, one line each on
//! stdout and, with `--program`, by running the program with the event's words as
//! arguments (mdadm's convention: event, array, and the member device if there is one).
//!
//! Events (`events_between`, the pure part): NewArray (a server appeared; DegradedArray or
//! FailedArray follow if it is), Stopped (its server is gone), Fail (a member became failed
//! or missing, or another device took its slot between two looks), RebuildStarted /
//! RebuildFinished (then SpareActive: the device rebuilt is active), ReplaceStarted /
//! ReplaceFinished / ReplaceEnded (cancelled or failed), DegradedArray, FailedArray, Recovered (no longer
//! degraded), SlowMember, ScrubMismatches (a scrub's count of mismatches grew), JournalFailed.

use anyhow::{bail, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct MonitorArgs {
    /// A directory of control sockets to watch (default /run/uraid); repeat for several.
    #[arg(long = "control-dir", value_name = "DIR")]
    control_dir: Vec<PathBuf>,
    /// A control socket to watch (unix:PATH); repeat for several.
    #[arg(long, value_name = "unix:PATH")]
    control: Vec<String>,
    /// Seconds between looks.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    interval: f64,
    /// Run PROGRAM EVENT ARRAY [MEMBER-DEVICE] for every event (mdadm --program's
    /// arguments); its exit status is logged, never fatal.
    #[arg(long, value_name = "PROGRAM")]
    program: Option<PathBuf>,
    /// Look once, report every array that is degraded or failed, and exit (mdadm --oneshot):
    /// exit status 1 if any is, 2 if no server answered.
    #[arg(long, short = '1')]
    oneshot: bool,
    /// Stop after this many looks (default: run until killed).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

/// One thing that happened to an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: &'static str,
    pub array: String,
    pub member: Option<u64>,
    pub device: Option<String>,
    pub detail: String,
}

impl Event {
    fn new(kind: &'static str, v: &Value) -> Event {
        Event {
            kind,
            array: v["name"].as_str().unwrap_or("?").to_string(),
            member: None,
            device: None,
            detail: String::new(),
        }
    }

    fn slot(mut self, s: &Value) -> Event {
        self.member = s["index"].as_u64();
        self.device = s["path"].as_str().map(str::to_string);
        self
    }

    fn detail(mut self, d: impl Into<String>) -> Event {
        self.detail = d.into();
        self
    }

    /// The line printed: event, array, then member and device, then detail.
    pub fn line(&self) -> String {
        let mut s = format!("{} array={}", self.kind, self.array);
        if let Some(m) = self.member {
            s.push_str(&format!(" member={m}"));
        }
        if let Some(d) = &self.device {
            s.push_str(&format!(" device={d}"));
        }
        if !self.detail.is_empty() {
            s.push_str(&format!(" ({})", self.detail));
        }
        s
    }
}

/// "degraded", "failed" or "ok" from a status document (as `uraid status`'s exit code).
pub(super) fn health(v: &Value) -> &'static str {
    let failed = v["failed"].as_array().map_or(0, Vec::len) as u64;
    if failed > v["fault_tolerance"].as_u64().unwrap_or(0) {
        "failed"
    } else if v["degraded"].as_bool().unwrap_or(false) {
        "degraded"
    } else {
        "ok"
    }
}

fn slots(v: &Value) -> &[Value] {
    v["slots"].as_array().map_or(&[], Vec::as_slice)
}

/// What changed from `prev` (None: the server just appeared) to `now`, one array's status
/// documents.
pub fn events_between(prev: Option<&Value>, now: &Value) -> Vec<Event> {
    let mut out = Vec::new();
    let h = health(now);
    let Some(prev) = prev else {
        out.push(Event::new("NewArray", now).detail(now["state"].as_str().unwrap_or("")));
        match h {
            "failed" => out.push(Event::new("FailedArray", now)),
            "degraded" => out.push(Event::new("DegradedArray", now)),
            _ => {}
        }
        for s in slots(now)
            .iter()
            .filter(|s| s["slow"].as_bool() == Some(true))
        {
            out.push(Event::new("SlowMember", now).slot(s));
        }
        return out;
    };
    for (i, s) in slots(now).iter().enumerate() {
        let Some(p) = slots(prev).get(i) else {
            continue;
        };
        let (was, is) = (
            p["state"].as_str().unwrap_or(""),
            s["state"].as_str().unwrap_or(""),
        );
        let new_device = p["path"] != s["path"];
        let out_before = was == "failed" || was == "missing";
        // A device that left its slot between two looks (a hot spare took over, a rebuild
        // or a replace finished): the one that failed is named, unless a replace moved
        // the slot to its new device.
        if new_device && !out_before && was != "replacing" && !matches!(is, "failed" | "missing") {
            out.push(
                Event::new("Fail", now)
                    .slot(p)
                    .detail("replaced in its slot"),
            );
        }
        match (was, is) {
            (_, "failed" | "missing") if !out_before => {
                out.push(Event::new("Fail", now).slot(p).detail(is))
            }
            (_, "rebuilding") if was != "rebuilding" || new_device => {
                out.push(Event::new("RebuildStarted", now).slot(s))
            }
            ("rebuilding", "active") if !new_device => {
                // mdadm's pair: the rebuild ended, the device it rebuilt is now active.
                out.push(Event::new("RebuildFinished", now).slot(s));
                out.push(Event::new("SpareActive", now).slot(s));
            }
            ("replacing", "active") if new_device => out.push(
                Event::new("ReplaceFinished", now)
                    .slot(s)
                    .detail(format!("was {}", p["path"].as_str().unwrap_or("?"))),
            ),
            ("replacing", "active") => out.push(
                Event::new("ReplaceEnded", now)
                    .slot(s)
                    .detail("cancelled or failed; the member stays"),
            ),
            (_, "active") if new_device => {
                // Rebuilt onto a new device entirely between two looks.
                out.push(Event::new("RebuildFinished", now).slot(s));
                out.push(Event::new("SpareActive", now).slot(s));
            }
            (w, "replacing") if w != "replacing" => out.push(
                Event::new("ReplaceStarted", now)
                    .slot(s)
                    .detail(format!("onto {}", s["replacement"].as_str().unwrap_or("?"))),
            ),
            _ => {}
        }
        if s["slow"].as_bool() == Some(true) && p["slow"].as_bool() != Some(true) {
            out.push(Event::new("SlowMember", now).slot(s));
        }
    }
    match (health(prev), h) {
        (a, b) if a == b => {}
        (_, "failed") => out.push(Event::new("FailedArray", now)),
        (_, "degraded") => out.push(Event::new("DegradedArray", now)),
        (_, _) => out.push(Event::new("Recovered", now)),
    }
    let mism = |v: &Value| v["scrub"]["mismatches"].as_u64().unwrap_or(0);
    let started = |v: &Value| v["scrub"]["state"] == "running" || v["scrub"]["state"] == "paused";
    if mism(now) > mism(prev)
        || (mism(now) > 0 && started(prev) && !started(now) && mism(prev) == 0)
    {
        out.push(
            Event::new("ScrubMismatches", now)
                .detail(format!("{} mismatched 4 KiB columns", mism(now))),
        );
    }
    if now["journal"]["state"] == "failed" && prev["journal"]["state"] != "failed" {
        out.push(
            Event::new("JournalFailed", now)
                .detail(now["journal"]["device"].as_str().unwrap_or("?").to_string()),
        );
    }
    out
}

/// Reports `e`: a line on stdout, and `program` run with its words.
fn report(e: &Event, program: Option<&PathBuf>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    println!("{now} {}", e.line());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if let Some(p) = program {
        let mut c = std::process::Command::new(p);
        c.arg(e.kind).arg(&e.array);
        if let Some(d) = &e.device {
            c.arg(d);
        }
        match c.status() {
            Ok(st) if st.success() => {}
            Ok(st) => eprintln!("uraid monitor: {} {}: {st}", p.display(), e.kind),
            Err(err) => eprintln!("uraid monitor: {}: {err}", p.display()),
        }
    }
}

/// `uraid monitor`. Returns the exit status (with `--oneshot`: 1 if an array is degraded or
/// failed).
pub fn run(a: MonitorArgs) -> Result<i32> {
    if !(a.interval > 0.0 && a.interval <= 86_400.0) {
        bail!(
            "--interval {}: must be a number of seconds above 0 and at most 86400",
            a.interval
        );
    }
    let mut socks = Vec::new();
    for c in &a.control {
        match crate::control::parse_endpoint(c)? {
            Some(p) => socks.push(p),
            None => bail!("--control {c}: expected unix:PATH"),
        }
    }
    let dirs = if a.control_dir.is_empty() && socks.is_empty() {
        vec![PathBuf::from("/run/uraid")]
    } else {
        a.control_dir.clone()
    };
    // Last status per array UUID, with its name for the Stopped event.
    let mut last: BTreeMap<String, Value> = BTreeMap::new();
    let mut looks = 0u64;
    loop {
        let (up, _) = super::list::servers(&dirs, &socks);
        let mut seen = BTreeMap::new();
        for s in up {
            let uuid = s.status["array_uuid"].as_str().unwrap_or("?").to_string();
            seen.insert(uuid, s.status);
        }
        if a.oneshot {
            if seen.is_empty() {
                let mut places: Vec<String> =
                    dirs.iter().map(|d| d.display().to_string()).collect();
                places.extend(socks.iter().map(|p| p.display().to_string()));
                eprintln!(
                    "uraid monitor: no running server answered in {}",
                    places.join(", ")
                );
                return Ok(2);
            }
            let mut bad = false;
            for v in seen.values() {
                match health(v) {
                    "failed" => report(&Event::new("FailedArray", v), a.program.as_ref()),
                    "degraded" => report(&Event::new("DegradedArray", v), a.program.as_ref()),
                    _ => continue,
                }
                bad = true;
            }
            return Ok(i32::from(bad));
        }
        for (uuid, v) in &seen {
            for e in events_between(last.get(uuid), v) {
                report(&e, a.program.as_ref());
            }
        }
        for (uuid, v) in &last {
            if !seen.contains_key(uuid) {
                report(&Event::new("Stopped", v), a.program.as_ref());
            }
        }
        last = seen;
        looks += 1;
        if a.count.is_some_and(|n| looks >= n) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(slots: &[(&str, &str)], degraded: bool, failed: &[u64]) -> Value {
        json!({
            "name": "vol0", "array_uuid": "u", "degraded": degraded,
            "fault_tolerance": 2, "failed": failed, "state": "clean",
            "slots": slots.iter().enumerate().map(|(i, (st, p))| json!({
                "index": i, "state": st, "path": p, "slow": false,
            })).collect::<Vec<_>>(),
            "scrub": {"state": "never"},
        })
    }

    fn kinds(ev: &[Event]) -> Vec<&'static str> {
        ev.iter().map(|e| e.kind).collect()
    }

    /// A member fails, a spare takes its slot and is rebuilt, the array recovers; a scrub
    /// finds mismatches; the journal fails: each step gives its events, nothing else.
    #[test]
    fn a_failure_a_spare_and_a_rebuild_give_mdadm_events() {
        let ok = status(&[("active", "a"), ("active", "b")], false, &[]);
        assert_eq!(kinds(&events_between(None, &ok)), ["NewArray"]);
        assert!(events_between(Some(&ok), &ok).is_empty());
        let failed = status(&[("active", "a"), ("failed", "b")], true, &[1]);
        let ev = events_between(Some(&ok), &failed);
        assert_eq!(kinds(&ev), ["Fail", "DegradedArray"]);
        assert_eq!(ev[0].line(), "Fail array=vol0 member=1 device=b (failed)");
        let spare = status(&[("active", "a"), ("rebuilding", "s")], true, &[]);
        let ev = events_between(Some(&failed), &spare);
        assert_eq!(kinds(&ev), ["RebuildStarted"]);
        assert_eq!(ev[0].device.as_deref(), Some("s"));
        let done = status(&[("active", "a"), ("active", "s")], false, &[]);
        assert_eq!(
            kinds(&events_between(Some(&spare), &done)),
            ["RebuildFinished", "SpareActive", "Recovered"]
        );
        // A hot spare took the slot between two looks: the failed device is named.
        let ev = events_between(Some(&ok), &spare);
        assert_eq!(kinds(&ev), ["Fail", "RebuildStarted", "DegradedArray"]);
        assert_eq!(ev[0].device.as_deref(), Some("b"));
        // ... or was even rebuilt already.
        assert_eq!(
            kinds(&events_between(Some(&ok), &done)),
            ["Fail", "RebuildFinished", "SpareActive"]
        );
        // A replace that finished, and one that ended without its new device.
        let replacing = status(&[("active", "a"), ("replacing", "s")], false, &[]);
        assert_eq!(
            kinds(&events_between(Some(&done), &replacing)),
            ["ReplaceStarted"]
        );
        let replaced = status(&[("active", "a"), ("active", "r")], false, &[]);
        assert_eq!(
            kinds(&events_between(Some(&replacing), &replaced)),
            ["ReplaceFinished"]
        );
        assert_eq!(
            kinds(&events_between(Some(&replacing), &done)),
            ["ReplaceEnded"]
        );
        let mut scrubbed = done.clone();
        scrubbed["scrub"] = json!({"state": "finished", "mismatches": 3});
        let ev = events_between(Some(&done), &scrubbed);
        assert_eq!(kinds(&ev), ["ScrubMismatches"]);
        assert!(ev[0].detail.starts_with("3 "), "{ev:?}");
        let mut j = scrubbed.clone();
        j["journal"] = json!({"state": "active", "device": "/dev/j"});
        let mut jf = j.clone();
        jf["journal"]["state"] = json!("failed");
        assert_eq!(kinds(&events_between(Some(&j), &jf)), ["JournalFailed"]);
        // Past the tolerance.
        let mut gone = failed.clone();
        gone["failed"] = json!([0, 1, 2]);
        assert_eq!(
            kinds(&events_between(Some(&failed), &gone)),
            ["FailedArray"]
        );
        assert_eq!(
            kinds(&events_between(None, &gone)),
            ["NewArray", "FailedArray"]
        );
    }
}
