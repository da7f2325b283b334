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

/// `uraid scrub`.
pub fn run(a: ScrubArgs) -> Result<()> {
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
) -> Result<()> {
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
                break;
            }
        }
    }
    Ok(())
}

/// Scrub of a stopped array, in this process (messages on stderr as they are found).
fn scrub_offline(plan: &Plan, mode: uraid_engine::ScrubMode) -> Result<()> {
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
    Ok(())
}
