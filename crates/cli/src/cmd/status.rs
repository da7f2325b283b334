//! `uraid status` and `uraid detail`: from the running server's status document when one
//! answers, else from the superblocks.

use super::examine::{journal_word, sb_state, state_word};
use super::{target_members, Target};
use crate::{client, control, size};
use anyhow::Result;
use serde_json::json;
use uraid_core::format::uuid_string;
use uraid_engine::assemble::{self, Plan};

#[derive(clap::Args, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print JSON (schema in docs/control.md).
    #[arg(long)]
    json: bool,
    /// Read the superblocks even if a server is running.
    #[arg(long)]
    offline: bool,
}

/// Exit status of `status` and `detail` (mdadm --detail --test's codes): every member in
/// service...
pub const EXIT_HEALTHY: i32 = 0;
/// ...the array serves (or can start) with members missing, failed or being rebuilt...
pub const EXIT_DEGRADED: i32 = 1;
/// ...it cannot serve or start (past its tolerance, or its journal not given)...
pub const EXIT_FAILED: i32 = 2;
/// ...or the command itself failed (no superblock found, a bad argument).
pub const EXIT_UNKNOWN: i32 = 4;

/// `uraid status`, or with `detail` `uraid detail` (per-member I/O, requests by command).
/// Returns the exit status (`EXIT_HEALTHY` ...).
pub fn run(a: &StatusArgs, detail: bool) -> Result<i32> {
    let (members, embedded) = target_members(&a.target)?;
    let plan = assemble::plan(&members)?;
    let sock = client::socket_for(&plan, a.target.control.as_deref(), embedded)?;
    let live = match (&sock, a.offline) {
        (Some(p), false) => client::live_status(&plan, p)?.map(|v| (v, p.clone())),
        _ => None,
    };
    let code = match live {
        Some((mut v, p)) => {
            let gone = not_in(&v, &members);
            if a.json {
                v["given_not_members"] = json!(gone
                    .iter()
                    .map(|g| g.display().to_string())
                    .collect::<Vec<_>>());
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                client::print_live(&v, &p, detail);
                for g in &gone {
                    println!(
                        "      note: {} is not in this array now (no slot, replacement or spare \
                         of the running server has it: replaced, removed, or failed and taken \
                         over)",
                        g.display()
                    );
                }
            }
            live_code(&v)
        }
        None => {
            let why = match (&sock, a.offline) {
                (_, true) => "--offline".to_string(),
                (Some(p), _) => client::not_running_reason(p),
                (None, _) if a.target.control.is_some() => "--control none".to_string(),
                (None, _) => format!(
                    "array name {:?} names no control socket; pass --control unix:PATH",
                    plan.sb.name
                ),
            };
            if a.json {
                let mut v = status_json(&plan);
                v["schema"] = json!(control::SCHEMA);
                v["source"] = json!("superblocks");
                v["source_reason"] = json!(why);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_status(&plan);
                println!("      source: superblocks ({why})");
            }
            offline_code(&plan)
        }
    };
    Ok(code)
}

/// The devices given (`members`) that the running server's status document `v` does not
/// use: no slot, replacement or spare has them.
fn not_in(v: &serde_json::Value, members: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    let mut used: Vec<&str> = Vec::new();
    for s in v["slots"].as_array().into_iter().flatten() {
        if s["state"] != "removed" {
            used.extend(s["path"].as_str());
        }
        used.extend(s["replacement"].as_str());
    }
    used.extend(
        v["spares"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str()),
    );
    if let Some(j) = v["journal"]["device"].as_str() {
        used.push(j);
    }
    // The server names devices as it was given them: a relative path is the server's.
    let cwd = v["pid"]
        .as_u64()
        .and_then(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).ok());
    let used: Vec<std::path::PathBuf> = used
        .iter()
        .map(|u| match &cwd {
            Some(c) if std::path::Path::new(u).is_relative() => c.join(u),
            _ => std::path::PathBuf::from(u),
        })
        .collect();
    members
        .iter()
        .filter(|m| !used.iter().any(|u| assemble::same_file(u, m)))
        .cloned()
        .collect()
}

/// The exit status from a running server's status document.
fn live_code(v: &serde_json::Value) -> i32 {
    match super::monitor::health(v) {
        "failed" => EXIT_FAILED,
        "degraded" => EXIT_DEGRADED,
        _ => EXIT_HEALTHY,
    }
}

/// The exit status from the superblocks.
fn offline_code(plan: &Plan) -> i32 {
    if can_start(plan).is_err() {
        EXIT_FAILED
    } else if !plan.missing().is_empty() {
        EXIT_DEGRADED
    } else {
        EXIT_HEALTHY
    }
}

/// Whether `serve` would start the array from these devices: `Plan::can_start`, and its
/// journal given if it has one (serve refuses it without).
fn can_start(plan: &Plan) -> Result<(), String> {
    plan.can_start().map_err(|e| e.to_string())?;
    if plan.sb.journal.is_some() && plan.journal.is_none() {
        return Err("its journal device was not given (give it with the members)".into());
    }
    Ok(())
}

fn member_states(plan: &Plan) -> Vec<(usize, String, &'static str)> {
    (0..plan.slots.len())
        .map(|i| {
            let path = plan.slots[i]
                .as_ref()
                .map_or("-".to_string(), |p| p.display().to_string());
            let st = if plan.sb.is_removed(i) {
                "removed"
            } else if plan.sb.is_failed(i) {
                "failed"
            } else if plan.slots[i].is_none() {
                "missing"
            } else {
                sb_state(&plan.sb, i)
            };
            (i, path, st)
        })
        .collect()
}

fn health(plan: &Plan) -> String {
    let missing = plan.missing().len();
    if plan.can_start().is_ok() {
        if let Err(why) = can_start(plan) {
            return format!("cannot start: {why}");
        }
    }
    match (plan.can_start(), missing) {
        (Err(_), _) => format!(
            "FAILED ({missing} of {} members unavailable)",
            plan.slots.len()
        ),
        (Ok(()), n) if !plan.sb.clean && plan.sb.journal.is_some() && plan.journal.is_some() => {
            format!(
                "{}not stopped cleanly: serve replays the journal first thing (no resync)",
                if n > 0 { "degraded; " } else { "healthy; " }
            )
        }
        (Ok(()), 0) if !plan.sb.clean => match plan.dirty_ranges() {
            Some(r) if r.is_empty() => "healthy; not stopped cleanly, but the write-intent \
                                        bitmap has no dirty region: nothing to resync"
                .into(),
            Some(r) => format!(
                "healthy; not stopped cleanly: serve resyncs {} bytes ({} dirty range(s) in the \
                 write-intent bitmap) first thing",
                r.iter().map(|x| x.end - x.start).sum::<u64>(),
                r.len()
            ),
            None => "healthy; not stopped cleanly: serve resyncs all of it first thing".into(),
        },
        (Ok(()), 0) => "healthy".into(),
        (Ok(()), n) if plan.check_dirty_degraded(false).is_err() => format!(
            "degraded ({n} of {} members unavailable) and not stopped cleanly: serve refuses \
             it without --start-dirty-degraded{} (give every member to resync)",
            plan.slots.len(),
            if plan.absent().is_empty() {
                ""
            } else {
                " and --run"
            }
        ),
        (Ok(()), n) if plan.check_complete(false).is_err() => format!(
            "degraded ({n} of {} members unavailable): member(s) {:?} in service were not \
             given: serve refuses it without --run",
            plan.slots.len(),
            plan.absent()
        ),
        (Ok(()), n) => format!("degraded ({n} of {} members unavailable)", plan.slots.len()),
    }
}

fn print_status(plan: &Plan) {
    let sb = &plan.sb;
    let g = sb.geometry;
    let marks: String = member_states(plan)
        .iter()
        .map(|(_, _, s)| if *s == "active" { 'U' } else { '_' })
        .collect();
    println!(
        "{} : {} {} members, chunk {}, volume {} [{}/{}] [{}]",
        sb.name,
        g.level,
        g.members,
        size::human(g.chunk),
        size::human(g.volume_size()),
        g.members - plan.missing().len(),
        g.members,
        marks
    );
    println!(
        "      uuid {}  events {}  {}  {}",
        uuid_string(&sb.array_uuid),
        sb.events,
        state_word(sb),
        health(plan)
    );
    for (i, path, st) in member_states(plan) {
        let extra = if st == "rebuilding" {
            format!(
                "  (rebuilt {} of {} units; serve resumes it)",
                sb.rebuilt[i],
                g.units()
            )
        } else {
            String::new()
        };
        println!("      [{i:>2}] {st:<10} {path}{extra}");
    }
    if sb.journal.is_some() {
        let at = plan
            .journal
            .as_ref()
            .map_or("MISSING (not given)".to_string(), |p| {
                p.display().to_string()
            });
        println!("      journal  {} {at}", journal_word(sb));
    }
    for (p, _) in &plan.spares {
        println!("      spare      {}", p.display());
    }
    for r in &plan.refused {
        println!("      refused: {r}");
    }
}

fn status_json(plan: &Plan) -> serde_json::Value {
    let sb = &plan.sb;
    let g = sb.geometry;
    json!({
        "name": sb.name,
        "array_uuid": uuid_string(&sb.array_uuid),
        "level": g.level.to_string(),
        "members": g.members,
        "chunk": g.chunk,
        "volume_size": g.volume_size(),
        "events": sb.events,
        "clean": sb.clean,
        "state": health(plan),
        "can_start": can_start(plan).is_ok(),
        "fault_tolerance": g.fault_tolerance(),
        "slots": member_states(plan).into_iter().map(|(i, p, s)| json!({"index": i, "path": p, "state": s, "rebuilt_units": (s == "rebuilding").then_some(sb.rebuilt[i])})).collect::<Vec<_>>(),
        "refused": plan.refused,
        "spares": plan.spares.iter().map(|s| s.0.display().to_string()).collect::<Vec<_>>(),
        "journal": sb.journal.map(|(u, m)| json!({
            "uuid": uuid_string(&u),
            "mode": m.name(),
            "path": plan.journal.as_ref().map(|p| p.display().to_string()),
        })),
    })
}
