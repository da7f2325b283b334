//! The `/metrics` document: Prometheus text format 0.0.4, written by hand (docs/design/control-plane.md
//! says why). `FAMILIES` is the table of metric families in the order they are written:
//! each has its name, type and help, and a function that writes its samples from one
//! `Snapshot` of the array and the server.

use super::status::{member_path, member_state};
use super::State;
use std::fmt::Display;
use std::sync::atomic::Ordering;
use uraid_core::format::uuid_string;
use uraid_engine::journal::JournalStatus;
use uraid_engine::members::MemberIoSnapshot;
use uraid_engine::metrics::{bucket_bounds, OpCounters, OpSnapshot, BUCKETS};
use uraid_engine::ArrayStatus;
use uraid_nbd::server::REFUSALS;
use uraid_nbd::{ServerStats, OPS};

/// The `/metrics` document.
pub(super) fn metrics(state: &State) -> String {
    let m = Snapshot::take(state);
    let mut out = String::new();
    for f in FAMILIES.iter().filter(|f| (f.when)(&m)) {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n",
            name = f.name,
            help = f.help,
            kind = f.kind
        ));
        (f.samples)(
            &m,
            &mut Samples {
                name: f.name,
                out: &mut out,
            },
        );
    }
    out
}

/// One metric family of the table.
struct Family {
    name: &'static str,
    /// gauge, counter or histogram.
    kind: &'static str,
    help: &'static str,
    /// Whether the family is written at all (the bitmap's and the journal's only when the
    /// array has one).
    when: fn(&Snapshot) -> bool,
    samples: fn(&Snapshot, &mut Samples),
}

/// What the families are written from: the array's status and the server's counters, read
/// once.
struct Snapshot<'a> {
    state: &'a State,
    a: ArrayStatus,
    nbd: &'a ServerStats,
    /// NBD counters per command (`OPS`), summed over the reactors.
    nbd_ops: Vec<OpSnapshot>,
    /// Read-ahead's counters, if it is on.
    ra: Option<uraid_engine::ReadAheadStats>,
}

impl<'a> Snapshot<'a> {
    fn take(state: &'a State) -> Snapshot<'a> {
        let nbd = state.server.stats();
        Snapshot {
            state,
            a: state.volume.array().status(),
            nbd,
            nbd_ops: nbd.ops.iter().map(|s| OpCounters::sum(s.iter())).collect(),
            ra: state.volume.read_ahead_stats(),
        }
    }

    /// The `array` label every family carries.
    fn arr(&self) -> (&'static str, String) {
        ("array", self.a.identity.name.clone())
    }

    /// The labels of member `i`: array, member index, device path (`-` for none).
    fn member(&self, i: usize) -> Vec<(&'static str, String)> {
        let dev = member_path(self.state, i, &self.a.members[i]).unwrap_or_else(|| "-".to_string());
        vec![self.arr(), ("member", i.to_string()), ("device", dev)]
    }

    /// The array label and one more.
    fn arr_and(&self, k: &'static str, v: &str) -> [(&'static str, String); 2] {
        [self.arr(), (k, v.to_string())]
    }
}

/// Writes the samples of one family.
struct Samples<'o> {
    name: &'static str,
    out: &'o mut String,
}

impl Samples<'_> {
    fn value(&mut self, l: &[(&str, String)], v: impl Display) {
        line(self.out, self.name, "", l, v);
    }

    /// A histogram from an operation's latency buckets: cumulative `_bucket`s, `_sum` in
    /// seconds, `_count` of the timed operations.
    fn histogram(&mut self, l: &[(&str, String)], o: &OpSnapshot) {
        let bounds = bucket_bounds();
        let mut cum = 0;
        for (i, n) in o.buckets.iter().enumerate() {
            cum += n;
            let le = if i < BUCKETS {
                format!("{}", bounds[i])
            } else {
                "+Inf".to_string()
            };
            let mut ll = l.to_vec();
            ll.push(("le", le));
            line(self.out, self.name, "_bucket", &ll, cum);
        }
        line(self.out, self.name, "_sum", l, o.latency_ns as f64 / 1e9);
        line(self.out, self.name, "_count", l, o.timed);
    }
}

fn line(out: &mut String, name: &str, suffix: &str, l: &[(&str, String)], v: impl Display) {
    out.push_str(&format!("{name}{suffix}{} {v}\n", labels(l)));
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(l: &[(&str, String)]) -> String {
    if l.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

fn always(_: &Snapshot) -> bool {
    true
}

fn tls_on(m: &Snapshot) -> bool {
    m.state.server.config().tls_mode != uraid_nbd::tls::Mode::Off
}

fn has_bitmap(m: &Snapshot) -> bool {
    m.a.bitmap.chunk > 0
}

fn has_journal(m: &Snapshot) -> bool {
    m.a.journal.is_some()
}

/// The member operations the member I/O families are labelled by.
type Pick = fn(&MemberIoSnapshot) -> &OpSnapshot;
const MEMBER_OPS: [(&str, Pick); 4] = [
    ("read", |s| &s.read),
    ("write", |s| &s.write),
    ("flush", |s| &s.flush),
    ("discard", |s| &s.discard),
];

/// The member states `uraid_member_state` has a sample for.
const MEMBER_STATES: [&str; 6] = [
    "active",
    "failed",
    "missing",
    "rebuilding",
    "removed",
    "replacing",
];

/// One sample per member and operation, of the number `f` picks.
fn member_io(m: &Snapshot, s: &mut Samples, f: fn(&OpSnapshot) -> u64) {
    for (i, ms) in m.a.members.iter().enumerate() {
        for (op, pick) in MEMBER_OPS {
            let mut l = m.member(i);
            l.push(("op", op.into()));
            s.value(&l, f(pick(&ms.io)));
        }
    }
}

/// One sample per NBD command, of the number `f` picks.
fn nbd_ops(m: &Snapshot, s: &mut Samples, f: fn(&OpSnapshot) -> u64) {
    for (op, o) in OPS.iter().zip(&m.nbd_ops) {
        s.value(&m.arr_and("op", op), f(o));
    }
}

/// A journal family: the journal's number `f` picks.
fn journal(m: &Snapshot, s: &mut Samples, f: fn(&JournalStatus) -> u64) {
    if let Some(j) = &m.a.journal {
        s.value(&[m.arr()], f(j));
    }
}

/// The families, in the order they are written.
const FAMILIES: &[Family] = &[
    Family {
        name: "uraid_array_info",
        kind: "gauge",
        help: "Array identity (value 1).",
        when: always,
        samples: |m, s| {
            let l = [
                m.arr(),
                ("uuid", uuid_string(&m.a.identity.uuid)),
                ("level", m.a.geometry.level.to_string()),
            ];
            s.value(&l, 1)
        },
    },
    Family {
        name: "uraid_array_state",
        kind: "gauge",
        help: "1 for the array's current state (clean: nothing written since assembly; active: written; degraded; failed).",
        when: always,
        samples: |m, s| {
            let (serving, dirty) = (m.a.serving, m.a.dirty);
            for (st, on) in [
                ("clean", !dirty),
                ("active", dirty),
                ("degraded", serving && !m.a.failed.is_empty()),
                ("failed", !serving),
            ] {
                s.value(&m.arr_and("state", st), u8::from(on));
            }
        },
    },
    Family {
        name: "uraid_array_members",
        kind: "gauge",
        help: "Members the array is built of.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.geometry.members),
    },
    Family {
        name: "uraid_array_failed_members",
        kind: "gauge",
        help: "Members missing or failed.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.failed.len()),
    },
    Family {
        name: "uraid_array_size_bytes",
        kind: "gauge",
        help: "Volume size.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.size()),
    },
    Family {
        name: "uraid_array_events",
        kind: "gauge",
        help: "Superblock event count (rises with every superblock round).",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.events),
    },
    Family {
        name: "uraid_member_state",
        kind: "gauge",
        help: "1 for each member's current state (active, failed, missing, rebuilding).",
        when: always,
        samples: |m, s| {
            for (i, ms) in m.a.members.iter().enumerate() {
                let now = member_state(ms);
                for st in MEMBER_STATES {
                    let mut l = m.member(i);
                    l.push(("state", st.into()));
                    s.value(&l, u8::from(now == st));
                }
            }
        },
    },
    Family {
        name: "uraid_member_slow",
        kind: "gauge",
        help: "1 while a member is flagged fail-slow (reads are served around it).",
        when: always,
        samples: |m, s| {
            for (i, ms) in m.a.members.iter().enumerate() {
                s.value(&m.member(i), u8::from(ms.slow));
            }
        },
    },
    Family {
        name: "uraid_member_io_total",
        kind: "counter",
        help: "Member I/Os (data and metadata).",
        when: always,
        samples: |m, s| member_io(m, s, |o| o.count),
    },
    Family {
        name: "uraid_member_io_bytes_total",
        kind: "counter",
        help: "Member I/O bytes.",
        when: always,
        samples: |m, s| member_io(m, s, |o| o.bytes),
    },
    Family {
        name: "uraid_member_io_errors_total",
        kind: "counter",
        help: "Member I/Os that failed.",
        when: always,
        samples: |m, s| member_io(m, s, |o| o.errors),
    },
    Family {
        name: "uraid_member_io_latency_seconds",
        kind: "histogram",
        help: "Member I/O latency, sampled: one in 16 reads and writes per thread is timed, every flush.",
        when: always,
        samples: |m, s| {
            for (i, ms) in m.a.members.iter().enumerate() {
                for (op, pick) in MEMBER_OPS {
                    let mut l = m.member(i);
                    l.push(("op", op.into()));
                    s.histogram(&l, pick(&ms.io));
                }
            }
        },
    },
    Family {
        name: "uraid_member_read_errors_corrected_total",
        kind: "counter",
        help: "Media read errors reconstructed from redundancy and rewritten in place.",
        when: always,
        samples: |m, s| {
            for (i, ms) in m.a.members.iter().enumerate() {
                s.value(&m.member(i), ms.errors.corrected);
            }
        },
    },
    Family {
        name: "uraid_member_bad_block_ranges",
        kind: "gauge",
        help: "Ranges on the member's bad-block list (chunks a rebuild or replace could not produce).",
        when: always,
        samples: |m, s| {
            for (i, ms) in m.a.members.iter().enumerate() {
                s.value(&m.member(i), ms.bad_ranges.len() as u64);
            }
        },
    },
    Family {
        name: "uraid_member_bad_block_bytes",
        kind: "gauge",
        help: "Bytes of the member's data area on its bad-block list.",
        when: always,
        samples: |m, s| {
            for (i, ms) in m.a.members.iter().enumerate() {
                s.value(&m.member(i), ms.bad_bytes);
            }
        },
    },
    Family {
        name: "uraid_read_ahead_reads_total",
        kind: "counter",
        help: "Reads served by read-ahead (hit: ready; late_hit: waited for its prefetch) and reads of a detected stream that read the members (miss).",
        when: |m| m.ra.is_some(),
        samples: |m, s| {
            if let Some(r) = m.ra {
                for (k, v) in [("hit", r.hits), ("late_hit", r.late_hits), ("miss", r.misses)] {
                    s.value(&m.arr_and("result", k), v);
                }
            }
        },
    },
    Family {
        name: "uraid_read_ahead_bytes_total",
        kind: "counter",
        help: "Bytes read ahead (prefetched), and of those the ones that left the cache unread (unused) or were dropped because a write, trim or zeroing overlapped them (dropped).",
        when: |m| m.ra.is_some(),
        samples: |m, s| {
            if let Some(r) = m.ra {
                for (k, v) in [
                    ("prefetched", r.prefetched_bytes),
                    ("unused", r.unused_bytes),
                    ("dropped", r.dropped_bytes),
                ] {
                    s.value(&m.arr_and("kind", k), v);
                }
            }
        },
    },
    Family {
        name: "uraid_read_ahead_cache_bytes",
        kind: "gauge",
        help: "Bytes held by read-ahead (read ahead and not yet read, or in flight); never above its budget.",
        when: |m| m.ra.is_some(),
        samples: |m, s| {
            if let Some(r) = m.ra {
                s.value(&[m.arr()], r.cache_bytes);
            }
        },
    },
    Family {
        name: "uraid_read_ahead_streams",
        kind: "gauge",
        help: "Sequential read streams read-ahead is following.",
        when: |m| m.ra.is_some(),
        samples: |m, s| {
            if let Some(r) = m.ra {
                s.value(&[m.arr()], r.streams);
            }
        },
    },
    Family {
        name: "uraid_stripe_operations_total",
        kind: "counter",
        help: "Stripe writes by plan, writes merged into another's stripe operation, stripe writes that waited for the rest of their stripe (plugged) and those whose stripe filled, degraded reads.",
        when: always,
        samples: |m, s| {
            let st = &m.a.stats;
            for (plan, v) in [
                ("full", st.full_stripe_writes),
                ("reconstruct", st.rcw_writes),
                ("read_modify_write", st.rmw_writes),
                ("merged", st.merged_writes),
                ("plugged", st.plugged_writes),
                ("plug_filled", st.plug_filled),
                ("degraded_read", st.degraded_reads),
                ("read_around_slow", st.slow_reads_around),
            ] {
                s.value(&m.arr_and("plan", plan), v);
            }
        },
    },
    Family {
        name: "uraid_background_progress_ratio",
        kind: "gauge",
        help: "Progress (0 to 1) of a background operation that is due or running.",
        when: always,
        samples: |m, s| {
            let a = &m.a;
            if a.resync.running || a.resync_due {
                s.value(&m.arr_and("op", a.resync.op), a.resync.fraction);
            }
            if !a.rebuilding().is_empty() {
                s.value(&m.arr_and("op", a.rebuild.op), a.rebuild.fraction);
            }
            if let (Some(mode), true) = (a.scrub.mode, a.scrub.progress.running) {
                s.value(&m.arr_and("op", mode.name()), a.scrub.progress.fraction);
            }
            // One per member being replaced (several may be).
            for (i, v) in a.replaces() {
                let mut l = m.member(i);
                l.push(("op", v.op.into()));
                s.value(&l, v.fraction);
            }
        },
    },
    Family {
        name: "uraid_scrub_mismatches",
        kind: "gauge",
        help: "4 KiB columns whose redundancy disagreed in the last (or running) scrub.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.scrub.report.mismatches),
    },
    Family {
        name: "uraid_scrub_located",
        kind: "gauge",
        help: "Of those, columns whose bad chunk was located (member named in the events).",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.scrub.report.located),
    },
    Family {
        name: "uraid_scrub_repaired",
        kind: "gauge",
        help: "Columns the last (or running) scrub repair rewrote.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.a.scrub.report.repaired),
    },
    Family {
        name: "uraid_rebuild_units_total",
        kind: "counter",
        help: "Units rebuilds regenerated (how=rebuilt), or left as they were on a re-added member that held them (how=held).",
        when: always,
        samples: |m, s| {
            s.value(&m.arr_and("how", "rebuilt"), m.a.rebuild_written);
            s.value(&m.arr_and("how", "held"), m.a.rebuild_held);
        },
    },
    Family {
        name: "uraid_bitmap_dirty_regions",
        kind: "gauge",
        help: "Write-intent bitmap regions set (writes in them recently; resynced after a crash).",
        when: has_bitmap,
        samples: |m, s| s.value(&[m.arr()], m.a.bitmap.dirty),
    },
    Family {
        name: "uraid_journal_active",
        kind: "gauge",
        help: "1 while the journal device is in service, 0 after it failed (bitmap mode).",
        when: has_journal,
        samples: |m, s| {
            if let Some(j) = &m.a.journal {
                s.value(&m.arr_and("mode", j.mode), u64::from(j.state == "active"));
            }
        },
    },
    Family {
        name: "uraid_journal_used_bytes",
        kind: "gauge",
        help: "Journal log bytes not yet checkpointed.",
        when: has_journal,
        samples: |m, s| journal(m, s, |j| j.used_bytes),
    },
    Family {
        name: "uraid_journal_deferred_bytes",
        kind: "gauge",
        help: "Write-back: bytes of acknowledged member writes held in memory until the \
               members have them (bounded by --write-back-memory).",
        when: has_journal,
        samples: |m, s| journal(m, s, |j| j.deferred_bytes),
    },
    Family {
        name: "uraid_journal_records_total",
        kind: "counter",
        help: "Stripe updates logged to the journal.",
        when: has_journal,
        samples: |m, s| journal(m, s, |j| j.records),
    },
    Family {
        name: "uraid_journal_commits_total",
        kind: "counter",
        help: "Journal flushes (each makes every record written before it durable).",
        when: has_journal,
        samples: |m, s| journal(m, s, |j| j.commits),
    },
    Family {
        name: "uraid_background_repaired_total",
        kind: "counter",
        help: "Stripes whose redundancy a background operation rewrote.",
        when: always,
        samples: |m, s| s.value(&m.arr_and("op", m.a.resync.op), m.a.resync.repaired),
    },
    Family {
        name: "uraid_nbd_requests_total",
        kind: "counter",
        help: "NBD requests by command.",
        when: always,
        samples: |m, s| nbd_ops(m, s, |o| o.count),
    },
    Family {
        name: "uraid_nbd_request_bytes_total",
        kind: "counter",
        help: "NBD request bytes by command (payload for read and write, range for the others).",
        when: always,
        samples: |m, s| nbd_ops(m, s, |o| o.bytes),
    },
    Family {
        name: "uraid_nbd_request_errors_total",
        kind: "counter",
        help: "NBD error replies by command.",
        when: always,
        samples: |m, s| nbd_ops(m, s, |o| o.errors),
    },
    Family {
        name: "uraid_reactor_ring_enters_total",
        kind: "counter",
        help: "io_uring_enter system calls made by the reactors (about one per request at queue depth 1).",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.state.server.ring_enters()),
    },
    Family {
        name: "uraid_reactor_idle_turns_total",
        kind: "counter",
        help: "Reactor turns with nothing to do, by how they ended: work found while busy-polling, or a sleep in io_uring_enter.",
        when: always,
        samples: |m, s| {
            let (polled, slept) = m.state.server.idle_turns();
            for (how, v) in [("polled", polled), ("slept", slept)] {
                s.value(&m.arr_and("how", how), v);
            }
        },
    },
    Family {
        name: "uraid_nbd_request_latency_seconds",
        kind: "histogram",
        help: "NBD request latency in the server, from request parsed to reply queued.",
        when: always,
        samples: |m, s| {
            for (op, o) in OPS.iter().zip(&m.nbd_ops) {
                s.histogram(&m.arr_and("op", op), o);
            }
        },
    },
    Family {
        name: "uraid_nbd_connections",
        kind: "gauge",
        help: "NBD connections open now.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.state.server.open_connections()),
    },
    Family {
        name: "uraid_nbd_connections_accepted_total",
        kind: "counter",
        help: "NBD connections accepted.",
        when: always,
        samples: |m, s| s.value(&[m.arr()], m.nbd.connections.load(Ordering::Relaxed)),
    },
    Family {
        name: "uraid_nbd_refused_total",
        kind: "counter",
        help: "NBD connections closed unserved: peer not allowed (--allow/--deny), too many in the handshake (--max-handshakes), or cut off after --handshake-timeout.",
        when: always,
        samples: |m, s| {
            for (r, v) in REFUSALS.iter().zip(&m.nbd.refused) {
                s.value(&m.arr_and("reason", r), v.load(Ordering::Relaxed));
            }
        },
    },
    Family {
        name: "uraid_nbd_tls_handshakes_total",
        kind: "counter",
        help: "TLS handshakes completed, by client identity (PSK identity or certificate subject; empty for none).",
        when: tls_on,
        samples: |m, s| {
            let peers = m.nbd.tls_peers.lock().unwrap_or_else(|e| e.into_inner());
            for (p, v) in peers.iter() {
                s.value(&m.arr_and("peer", p), v);
            }
        },
    },
    Family {
        name: "uraid_nbd_tls_failures_total",
        kind: "counter",
        help: "TLS sessions that failed, by reason.",
        when: tls_on,
        samples: |m, s| {
            let f = m.nbd.tls_failures.lock().unwrap_or_else(|e| e.into_inner());
            for (r, v) in f.iter() {
                s.value(&m.arr_and("reason", r), v);
            }
        },
    },
    Family {
        name: "uraid_nbd_tls_bytes_total",
        kind: "counter",
        help: "Plaintext bytes sealed into TLS records (direction=encrypted) and opened from them (decrypted).",
        when: tls_on,
        samples: |m, s| {
            let n = m.nbd;
            s.value(
                &m.arr_and("direction", "encrypted"),
                n.tls_bytes_encrypted.load(Ordering::Relaxed),
            );
            s.value(
                &m.arr_and("direction", "decrypted"),
                n.tls_bytes_decrypted.load(Ordering::Relaxed),
            );
        },
    },
    Family {
        name: "uraid_nbd_protocol_errors_total",
        kind: "counter",
        help: "NBD connections ended by a protocol violation.",
        when: always,
        samples: |m, s| {
            s.value(
                &[m.arr()],
                m.nbd.protocol_errors.load(Ordering::Relaxed),
            )
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            labels(&[("a", "x\"y\\z\nw".into())]),
            "{a=\"x\\\"y\\\\z\\nw\"}"
        );
    }

    #[test]
    fn families_have_unique_names_and_known_kinds() {
        let mut names: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len(), "a family name appears twice");
        for f in FAMILIES {
            assert!(f.name.starts_with("uraid_"), "{}", f.name);
            assert!(
                matches!(f.kind, "gauge" | "counter" | "histogram"),
                "{}: {}",
                f.name,
                f.kind
            );
            assert_eq!(
                f.kind == "counter",
                f.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                f.name
            );
            assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
        }
    }
}
