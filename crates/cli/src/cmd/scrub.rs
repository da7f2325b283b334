//! `uraid scrub`: on the running server in the background (start, pause, resume, cancel,
//! wait), or on a stopped array in this process.

use super::{live_socket, open_here, target_members, Target};
use crate::client;
use anyhow::{bail, Result};
use uraid_engine::assemble::{self, Plan};

#[derive(clap::Args)]
pub struct ScrubArgs {
    #[command(flatten)]
    target: Target,
    /// Rewrite what does not match (located chunks; otherwise parity from the data).
    #[arg(long)]
    repair: bool,
    #[arg(long, conflicts_with_all = ["resume", "cancel", "repair"])]
    pause: bool,
    #[arg(long, conflicts_with_all = ["cancel", "repair"])]
    resume: bool,
    #[arg(long, conflicts_with = "repair")]
    cancel: bool,
    /// On a running server: wait until the scrub ends and print what it found.
    #[arg(long)]
    wait: bool,
}

/// Exit status of `scrub --wait` (and of a scrub of a stopped array) that found mismatches
/// or units it could not read (repaired or not); 0 when it found nothing, 1 when it failed.
pub const EXIT_FOUND: i32 = 2;

/// `uraid scrub`; returns the exit status.
pub fn run(a: ScrubArgs) -> Result<i32> {
    let ScrubArgs {
        target,
        repair,
        pause,
        resume,
        cancel,
        wait,
    } = a;
    scrub_cmd(&target, repair, pause, resume, cancel, wait)
}

fn scrub_cmd(
    t: &Target,
    repair: bool,
    pause: bool,
    resume: bool,
    cancel: bool,
    wait: bool,
) -> Result<i32> {
    let (members, embedded) = target_members(t)?;
    let plan = assemble::plan(&members)?;
    let mode = if repair {
        uraid_engine::ScrubMode::Repair
    } else {
        uraid_engine::ScrubMode::Check
    };
    let Some(sock) = live_socket(&plan, t, embedded)? else {
        if pause || resume || cancel {
            bail!(
                "no running server of array '{}' to pause, resume or cancel a scrub on",
                plan.sb.name
            );
        }
        return scrub_offline(&plan, mode);
    };
    let path = match (pause, resume, cancel) {
        (true, _, _) => "/scrub/pause".to_string(),
        (_, true, _) => "/scrub/resume".to_string(),
        (_, _, true) => "/scrub/cancel".to_string(),
        _ => format!("/scrub?mode={}", mode.name()),
    };
    let msg = client::post(&sock, &path)?;
    println!("uraid: {msg} (server at {})", sock.display());
    let mut code = 0;
    if wait {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let v = client::get_json(&sock, "/status")?;
            let s = &v["scrub"];
            if s["state"] != "running" && s["state"] != "paused" {
                println!(
                    "uraid: scrub ({}) {}: {} units, {} mismatched column(s), {} located, {} \
                     repaired, {} unreadable (the events name members and offsets)",
                    s["mode"].as_str().unwrap_or("?"),
                    s["state"].as_str().unwrap_or("?"),
                    s["units"],
                    s["mismatches"],
                    s["located"],
                    s["repaired"],
                    s["unreadable"]
                );
                let n = |k: &str| s[k].as_u64().unwrap_or(0);
                if n("mismatches") + n("unreadable") > 0 {
                    code = EXIT_FOUND;
                }
                break;
            }
        }
    }
    Ok(code)
}

/// Scrub of a stopped array, in this process (messages on stderr as they are found).
fn scrub_offline(plan: &Plan, mode: uraid_engine::ScrubMode) -> Result<i32> {
    plan.can_start()?;
    let missing = plan.missing();
    if !missing.is_empty() {
        bail!(
            "array '{}' is degraded (member(s) {missing:?} missing, failed or rebuilding): scrub \
             needs every member",
            plan.sb.name
        );
    }
    let (rt, vol) = open_here(plan)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let r = futures::executor::block_on(vol.array().scrub_run(mode, &stop));
    let v = vol.clone();
    let closed = rt
        .handle()
        .block_on(0, move || async move { v.close().await });
    let r = r.map_err(|e| anyhow::anyhow!("scrub: {e}"))?;
    closed.map_err(|e| anyhow::anyhow!("closing the array: {e}"))?;
    println!(
        "uraid: scrub ({}) of array '{}': {} units, {} mismatched column(s), {} located, {} \
         repaired, {} unreadable",
        mode.name(),
        plan.sb.name,
        r.units,
        r.mismatches,
        r.located,
        r.repaired,
        r.unreadable
    );
    Ok(if r.mismatches + r.unreadable > 0 {
        EXIT_FOUND
    } else {
        0
    })
}
