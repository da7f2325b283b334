//! The `/status` document (schema `SCHEMA`, docs/control.md), read from the atomics the
//! data path updates, and the member words `/metrics` shares with it.

use super::{State, SCHEMA};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use uraid_core::format::uuid_string;
use uraid_engine::metrics::OpSnapshot;
use uraid_engine::recovery::ProgressView;
use uraid_engine::{ArrayStatus, MemberState, MemberStatus, ScrubStatus};
use uraid_nbd::server::{ClientInfo, REFUSALS};
use uraid_nbd::tls::Mode;
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
    let a = state.volume.array().status();
    let g = a.geometry;
    let server = &state.server;
    let ss = server.stats();
    let members = slots(state, &a);
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
    let rebuilding = a.rebuilding();
    let st = &a.stats;
    let bm = &a.bitmap;
    json!({
        "schema": SCHEMA,
        "source": "server",
        "pid": std::process::id(),
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
        "name": a.identity.name,
        "array_uuid": uuid_string(&a.identity.uuid),
        "level": g.level.to_string(),
        "members": g.members,
        "chunk": g.chunk,
        "volume_size": g.volume_size(),
        "ctime": a.identity.ctime,
        "events": a.events,
        "dirty": a.dirty,
        "state": state_words(
            a.dirty,
            a.failed.len() + rebuilding.len(),
            a.serving,
            match (a.resync.running, a.resync_due, rebuilding.is_empty()) {
                (true, _, _) => Some("resyncing"),
                (false, true, _) => Some("resync pending"),
                (_, _, false) if a.rebuild.running => Some("recovering"),
                (_, _, false) => Some("recovery pending"),
                _ => None,
            }
        ),
        "degraded": a.degraded(),
        "failed": a.failed.iter().collect::<Vec<_>>(),
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
            "refused": REFUSALS.iter().zip(&ss.refused)
                .map(|(k, v)| (k.to_string(), json!(v.load(Ordering::Relaxed))))
                .collect::<serde_json::Map<_, _>>(),
            "clients": server.clients().iter().map(client_json).collect::<Vec<_>>(),
        },
        "tls": tls_json(server),
        "requests": {
            "total": ss.requests.load(Ordering::Relaxed),
            "errors": ss.errors.load(Ordering::Relaxed),
            "ops": ops,
        },
        "stripe_operations": {
            "full": st.full_stripe_writes, "reconstruct": st.rcw_writes,
            "read_modify_write": st.rmw_writes, "merged": st.merged_writes,
            "plugged": st.plugged_writes, "plug_filled": st.plug_filled,
            "degraded_reads": st.degraded_reads, "corrected_reads": st.corrected_reads,
            "slow_reads_around": st.slow_reads_around,
        },
        "read_ahead": state.volume.read_ahead_stats().map(|r| json!({
            "budget": r.budget, "cache_bytes": r.cache_bytes, "streams": r.streams,
            "hits": r.hits, "late_hits": r.late_hits, "misses": r.misses,
            "prefetched_bytes": r.prefetched_bytes, "unused_bytes": r.unused_bytes,
            "dropped_bytes": r.dropped_bytes,
        })),
        "background": background(&a),
        "throttle": throttle_json(&a.throttle),
        "bitmap": {
            "chunk": bm.chunk, "regions": bm.regions, "dirty_regions": bm.dirty,
            "set_rounds": bm.set_rounds, "clear_rounds": bm.clear_rounds,
        },
        "rebuild_units": { "rebuilt": a.rebuild_written, "held": a.rebuild_held },
        "departed": a.departed.iter().map(|d| json!({
            "slot": d.slot, "device": d.device, "how": d.how, "by": d.by, "at": d.at,
        })).collect::<Vec<_>>(),
        "unsynced_stripes_refused": a.unsynced_stripes_refused,
        "unsynced_stripes_verified": a.unsynced_stripes_verified,
        "scrub": scrub_json(&a.scrub),
        "spares": state.jobs.spare_paths(),
        "journal": a.journal.as_ref().map(journal_json),
    })
}

/// The `journal` of the status document.
fn client_json(c: &ClientInfo) -> Value {
    json!({
        "id": c.id,
        "peer": c.peer,
        "seconds": c.seconds,
        "phase": if c.handshake { "handshake" } else { "transmission" },
        "headers": c.headers,
        "tls": c.tls.as_ref().map(|t| json!({
            "version": t.version, "cipher": t.cipher, "peer": t.peer,
        })),
    })
}

/// Counters by name as a JSON object.
fn counts<K: std::fmt::Display>(
    m: &std::sync::Mutex<std::collections::BTreeMap<K, u64>>,
) -> serde_json::Map<String, Value> {
    m.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect()
}

/// The server's TLS mode, what it serves with and its counters.
fn tls_json<D: uraid_engine::BlockDev>(server: &uraid_nbd::Server<D>) -> Value {
    let cfg = server.config();
    let ss = server.stats();
    let peers = counts(&ss.tls_peers);
    json!({
        "mode": cfg.tls_mode.to_string(),
        "credentials": cfg.tls.as_ref().filter(|_| cfg.tls_mode != Mode::Off).map(|t| t.describe()),
        "handshakes": peers.values().filter_map(|v| v.as_u64()).sum::<u64>(),
        "peers": peers,
        "failures": counts(&ss.tls_failures),
        "bytes_encrypted": ss.tls_bytes_encrypted.load(Ordering::Relaxed),
        "bytes_decrypted": ss.tls_bytes_decrypted.load(Ordering::Relaxed),
    })
}

fn journal_json(j: &uraid_engine::journal::JournalStatus) -> Value {
    json!({
        "device": j.device, "mode": j.mode, "state": j.state,
        "log_bytes": j.log_bytes, "used_bytes": j.used_bytes,
        "records": j.records, "bytes": j.bytes, "commits": j.commits,
        "checkpoints": j.checkpoints, "replayed_records": j.replayed,
        "deferred_bytes": j.deferred_bytes, "deferred_limit": j.deferred_limit,
    })
}

/// The `slots` of the status document: each member's path, state and I/O.
fn slots(state: &State, a: &ArrayStatus) -> Vec<Value> {
    a.members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({
                "index": i,
                "path": member_path(state, i, m),
                "state": member_state(m),
                "rebuilt_units": match m.state {
                    MemberState::Rebuilding { below } => Some(below),
                    _ => None,
                },
                "replacement": m.replacement,
                "slow": m.slow,
                "replace_progress": m.replace.as_ref().map(|v| v.fraction),
                "read": op_json(&m.io.read),
                "write": op_json(&m.io.write),
                "flush": op_json(&m.io.flush),
                "discard": op_json(&m.io.discard),
                "read_errors_corrected": m.errors.corrected,
                "read_error_budget": { "used": m.errors.budget_used, "max": m.errors.budget },
                "bad_blocks": {
                    "ranges": m.bad_ranges.iter()
                        .map(|&(start, units)| json!({ "first_unit": start, "units": units }))
                        .collect::<Vec<_>>(),
                    "bytes": m.bad_bytes,
                },
            })
        })
        .collect()
}

/// The path of slot `i`'s device (the one added while serving, if any), else the one it was
/// started with.
pub(super) fn member_path(state: &State, i: usize, m: &MemberStatus) -> Option<String> {
    m.name.clone().or_else(|| {
        state
            .members
            .get(i)
            .cloned()
            .flatten()
            .map(|p| p.display().to_string())
    })
}

/// A member's state word: removed, replacing, missing, failed, rebuilding or active.
pub(super) fn member_state(m: &MemberStatus) -> &'static str {
    if m.removed {
        "removed"
    } else if m.replacement.is_some() {
        "replacing"
    } else if m.name.is_none() {
        "missing"
    } else {
        match m.state {
            MemberState::Failed => "failed",
            MemberState::Rebuilding { .. } => "rebuilding",
            MemberState::Active => "active",
        }
    }
}

/// Background operations for status: the resync while it runs (or stopped unfinished), the
/// rebuild while members are being rebuilt, a replace, and a scrub while it runs.
fn background(a: &ArrayStatus) -> Vec<Value> {
    let one = |v: &ProgressView| {
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
    if a.resync.running || a.resync_due {
        out.push(one(&a.resync));
    }
    if !a.rebuilding().is_empty() {
        out.push(one(&a.rebuild));
    }
    for (i, v) in a.replaces() {
        let mut e = one(&v);
        e["member"] = json!(i);
        out.push(e);
    }
    let sc = &a.scrub;
    if let (Some(mode), true) = (sc.mode, sc.progress.running) {
        let mut e = one(&sc.progress);
        e["op"] = json!(mode.name());
        e["state"] = json!(if sc.paused { "paused" } else { "running" });
        e["mismatches"] = json!(sc.report.mismatches);
        e["located"] = json!(sc.report.located);
        out.push(e);
    }
    out
}

/// The last (or running) scrub: mode, state and what it found.
fn scrub_json(sc: &ScrubStatus) -> Value {
    let (r, v) = (&sc.report, &sc.progress);
    let Some(mode) = sc.mode else {
        return json!({ "state": "never" });
    };
    json!({
        "mode": mode.name(),
        "state": match (v.running, sc.paused, v.done >= v.total) {
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
        "bad_blocks": r.bad_blocks,
    })
}
