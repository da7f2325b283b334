//! The `/status` document (schema `SCHEMA`, docs/control.md), read from the atomics the
//! data path updates, and the member words `/metrics` shares with it.

use super::{State, SCHEMA};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use uraid_core::format::uuid_string;
use uraid_engine::metrics::OpSnapshot;
use uraid_engine::FileDev;
use uraid_nbd::OPS;

/// The throttle: budget, priority, min and max rates.
fn throttle_json(t: &uraid_engine::Throttle) -> Value {
    json!({
        "budget": t.budget,
        "priority": t.priority.name(),
        "min_bytes_per_second": t.min_bytes_per_second,
        "max_bytes_per_second": t.max_bytes_per_second,
    })
}

/// One command's or member operation's counters and latency.
fn op_json(o: &OpSnapshot) -> Value {
    json!({
        "count": o.count,
        "bytes": o.bytes,
        "errors": o.errors,
        "latency_mean_us": o.mean_us(),
        "latency_p99_us": o.quantile_bound(0.99).map(|s| s * 1e6),
    })
}

/// md-style state: "clean"/"active" (written since start, or not clean on disk), then
/// ", degraded" or ", FAILED", then the resync's state while one is due.
fn state_words(dirty: bool, failed: usize, serving: bool, resync: Option<&str>) -> String {
    let mut s = if dirty || resync.is_some() {
        "active"
    } else {
        "clean"
    }
    .to_string();
    if !serving {
        s.push_str(", FAILED");
    } else if failed > 0 {
        s.push_str(", degraded");
    }
    if let Some(r) = resync {
        s.push_str(", ");
        s.push_str(r);
    }
    s
}

/// The `/status` document (schema `SCHEMA`, docs/control.md).
pub(super) fn status(state: &State) -> Value {
    let a = state.volume.array();
    let g = *a.geometry();
    let (name, uuid, ctime) = a.identity();
    let failed = a.failed();
    let st = a.stats.snapshot();
    let server = &state.server;
    let ss = server.stats();
    let members = slots(state, a);
    let ops: serde_json::Map<String, Value> = OPS
        .iter()
        .zip(ss.ops.iter())
        .map(|(n, s)| {
            (
                n.to_string(),
                op_json(&uraid_engine::metrics::OpCounters::sum(s.iter())),
            )
        })
        .collect();
    let (bc, regions, dirty) = a.bitmap_state();
    json!({
        "schema": SCHEMA,
        "source": "server",
        "pid": std::process::id(),
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
        "name": name,
        "array_uuid": uuid_string(&uuid),
        "level": g.level.to_string(),
        "members": g.members,
        "chunk": g.chunk,
        "volume_size": g.volume_size(),
        "ctime": ctime,
        "events": a.events(),
        "dirty": a.is_dirty(),
        "state": state_words(
            a.is_dirty(),
            failed.len() + a.rebuild_state().len(),
            a.is_serving(),
            match (a.recovery_progress().running, a.needs_resync(), a.rebuild_state().is_empty()) {
                (true, _, _) => Some("resyncing"),
                (false, true, _) => Some("resync pending"),
                (_, _, false) if a.rebuild_progress().running => Some("recovering"),
                (_, _, false) => Some("recovery pending"),
                _ => None,
            }
        ),
        "degraded": !failed.is_empty() || !a.rebuild_state().is_empty(),
        "failed": failed.iter().collect::<Vec<_>>(),
        "fault_tolerance": g.fault_tolerance(),
        "slots": members,
        "exports": [{
            "name": server.config().export,
            "read_only": server.config().read_only,
            "listen": state.listen,
        }],
        "connections": {
            "open": server.open_connections(),
            "accepted": ss.connections.load(Ordering::Relaxed),
            "protocol_errors": ss.protocol_errors.load(Ordering::Relaxed),
        },
        "requests": {
            "total": ss.requests.load(Ordering::Relaxed),
            "errors": ss.errors.load(Ordering::Relaxed),
            "ops": ops,
        },
        "stripe_operations": {
            "full": st.full_stripe_writes, "reconstruct": st.rcw_writes,
            "read_modify_write": st.rmw_writes, "merged": st.merged_writes,
            "degraded_reads": st.degraded_reads, "corrected_reads": st.corrected_reads,
        },
        "background": background(a),
        "throttle": throttle_json(&a.throttle()),
        "bitmap": {
            "chunk": bc, "regions": regions, "dirty_regions": dirty,
            "set_rounds": a.bitmap_rounds().0, "clear_rounds": a.bitmap_rounds().1,
        },
        "unsynced_stripes_refused": a.unsynced_stripes_refused(),
        "scrub": scrub_json(a),
        "spares": state.jobs.spare_paths(),
        "journal": a.journal_status().map(|j| json!({
            "device": j.device, "mode": j.mode, "state": j.state,
            "log_bytes": j.log_bytes, "used_bytes": j.used_bytes,
            "records": j.records, "bytes": j.bytes, "commits": j.commits,
            "checkpoints": j.checkpoints, "replayed_records": j.replayed,
        })),
    })
}

/// The `slots` of the status document: each member's path, state and I/O.
fn slots(state: &State, a: &uraid_engine::Array<FileDev>) -> Vec<Value> {
    (0..a.geometry().members)
        .map(|i| {
            let io = a.member_io(i);
            let (corrected, budget_used, budget) = a.member_errors(i);
            json!({
                "index": i,
                "path": member_path(state, i),
                "state": member_state(a, i),
                "rebuilt_units": a.rebuild_state().iter().find(|r| r.0 == i).map(|r| r.1),
                "replacement": a.replace_state().filter(|r| r.0 == i).map(|r| r.1),
                "read": op_json(&io.read),
                "write": op_json(&io.write),
                "flush": op_json(&io.flush),
                "read_errors_corrected": corrected,
                "read_error_budget": { "used": budget_used, "max": budget },
            })
        })
        .collect()
}

/// The path of slot `i`'s device (the one added while serving, if any).
pub(super) fn member_path(state: &State, i: usize) -> Option<String> {
    state
        .volume
        .array()
        .member_name(i)
        .map(str::to_string)
        .or_else(|| {
            state
                .members
                .get(i)
                .cloned()
                .flatten()
                .map(|p| p.display().to_string())
        })
}

/// A member's state word: removed, replacing, missing, failed, rebuilding or active.
pub(super) fn member_state(a: &uraid_engine::Array<FileDev>, i: usize) -> &'static str {
    if a.removed().contains(i) {
        "removed"
    } else if a.replace_state().is_some_and(|r| r.0 == i) {
        "replacing"
    } else if a.member_dev(i).is_none() {
        "missing"
    } else if a.is_failed(i) {
        "failed"
    } else if a.rebuild_state().iter().any(|r| r.0 == i) {
        "rebuilding"
    } else {
        "active"
    }
}

/// Background operations for status: the resync while it runs (or stopped unfinished), the
/// rebuild while members are being rebuilt, a replace, and a scrub while it runs.
fn background(a: &uraid_engine::Array<FileDev>) -> Vec<Value> {
    let one = |v: uraid_engine::recovery::ProgressView| {
        json!({
            "op": v.op,
            "state": if v.running { "running" } else { "stopped" },
            "progress": v.fraction,
            "done": v.done,
            "total": v.total,
            "repaired": v.repaired,
            "rate_bytes_per_second": v.bytes_per_second,
            "eta_seconds": v.eta_seconds,
        })
    };
    let mut out = Vec::new();
    let v = a.recovery_progress();
    if v.running || a.needs_resync() {
        out.push(one(v));
    }
    if !a.rebuild_state().is_empty() {
        out.push(one(a.rebuild_progress()));
    }
    if a.replace_state().is_some() {
        out.push(one(a.replace_progress()));
    }
    let (mode, r, v, paused) = a.scrub_state();
    if let (Some(mode), true) = (mode, v.running) {
        let mut e = one(v);
        e["op"] = json!(mode.name());
        e["state"] = json!(if paused { "paused" } else { "running" });
        e["mismatches"] = json!(r.mismatches);
        e["located"] = json!(r.located);
        out.push(e);
    }
    out
}

/// The last (or running) scrub: mode, state and what it found.
fn scrub_json(a: &uraid_engine::Array<FileDev>) -> Value {
    let (mode, r, v, paused) = a.scrub_state();
    let Some(mode) = mode else {
        return json!({ "state": "never" });
    };
    json!({
        "mode": mode.name(),
        "state": match (v.running, paused, v.done >= v.total) {
            (true, true, _) => "paused",
            (true, false, _) => "running",
            (false, _, true) => "finished",
            (false, _, false) => "stopped",
        },
        "progress": v.fraction,
        "units": r.units,
        "mismatches": r.mismatches,
        "located": r.located,
        "repaired": r.repaired,
        "unreadable": r.unreadable,
    })
}
