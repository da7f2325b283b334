//! `uraid replace`: copy a member onto a new device while it keeps serving, on the running
//! server in the background or on a stopped array in this process.

use super::{live_socket, open_here, path_query, target_members, Target};
use crate::client;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use uraid_engine::assemble::{self, Plan};

#[derive(clap::Args)]
pub struct ReplaceArgs {
    /// Member index.
    index: usize,
    /// The new device.
    #[arg(
        long = "with",
        value_name = "DEVICE",
        required_unless_present = "cancel"
    )]
    device: Option<PathBuf>,
    /// Overwrite a device holding a uraid superblock or journal.
    #[arg(short, long)]
    force: bool,
    /// Wait until it has finished (running server).
    #[arg(long)]
    wait: bool,
    /// Cancel the running replace of member INDEX (running server).
    #[arg(long, conflicts_with_all = ["device", "wait", "force"])]
    cancel: bool,
    #[command(flatten)]
    target: Target,
}

/// `uraid replace`.
pub fn run(a: ReplaceArgs) -> Result<()> {
    let ReplaceArgs {
        index,
        device,
        force,
        wait,
        cancel,
        target,
    } = a;
    replace_cmd(index, device, force, wait, cancel, &target)
}

fn replace_cmd(
    i: usize,
    device: Option<PathBuf>,
    force: bool,
    wait: bool,
    cancel: bool,
    t: &Target,
) -> Result<()> {
    let (members, embedded) = target_members(t)?;
    let plan = assemble::plan(&members)?;
    let sock = live_socket(&plan, t, embedded)?;
    if cancel {
        let Some(sock) = sock else {
            bail!(
                "no running server of array '{}' to cancel a replace on",
                plan.sb.name
            );
        };
        let st = client::get_json(&sock, "/status")?;
        if st["slots"][i]["state"] != "replacing" {
            bail!("member {i} is not being replaced");
        }
        let msg = client::post(&sock, &format!("/replace/cancel?member={i}"))?;
        println!("uraid: {msg} (server at {})", sock.display());
        return Ok(());
    }
    let Some(dev) = device else {
        bail!("uraid replace INDEX --with DEVICE MEMBERS...: the new device");
    };
    let Some(sock) = sock else {
        return replace_offline(&plan, i, &dev, force);
    };
    let msg = client::post(
        &sock,
        &format!(
            "/replace?member={i}&path={}&force={}",
            path_query(&dev),
            u8::from(force)
        ),
    )?;
    println!("uraid: {msg} (server at {})", sock.display());
    if wait {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let v = client::get_json(&sock, "/status")?;
            let slot = &v["slots"][i];
            if slot["state"] != "replacing" {
                println!(
                    "uraid: member {i} is {} on {}",
                    slot["state"].as_str().unwrap_or("?"),
                    slot["path"].as_str().unwrap_or("?")
                );
                break;
            }
        }
    }
    Ok(())
}

/// Replace on a stopped array, in this process: assembled, copied, swapped, closed.
fn replace_offline(plan: &Plan, i: usize, dev: &Path, force: bool) -> Result<()> {
    plan.can_start()?;
    assemble::check_replacement(plan, i, dev, force)?;
    let (rt, vol) = open_here(plan)?;
    let new =
        uraid_engine::FileDev::open(dev).map_err(|e| anyhow::anyhow!("{}: {e}", dev.display()))?;
    let uuid = assemble::new_device_uuid();
    let started = futures::executor::block_on(vol.replace_member(i, new, uuid));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let r = match started {
        Ok(()) => futures::executor::block_on(vol.replace_run(&stop))
            .map_err(|e| anyhow::anyhow!("replace: {e}")),
        Err(e) => Err(anyhow::anyhow!("replace: {e}")),
    };
    let v = vol.clone();
    let closed = rt
        .handle()
        .block_on(0, move || async move { v.close().await });
    let r = r?;
    closed.map_err(|e| anyhow::anyhow!("closing the array: {e}"))?;
    match r {
        uraid_engine::ReplaceOutcome::Replaced { slot } => println!(
            "uraid: member {slot} of array '{}' replaced by {}",
            plan.sb.name,
            dev.display()
        ),
        uraid_engine::ReplaceOutcome::Rebuilding { slot } => println!(
            "uraid: member {slot} failed during the replace: {} took its slot and is rebuilt \
             when the array is served",
            dev.display()
        ),
        uraid_engine::ReplaceOutcome::Stopped { slot } => {
            bail!(
                "replace of member {slot} was stopped; it resumes when the array is served with \
                 {} among its devices",
                dev.display()
            )
        }
        uraid_engine::ReplaceOutcome::Cancelled { slot } => {
            bail!("replace of member {slot} was stopped")
        }
    }
    Ok(())
}
