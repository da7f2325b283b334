//! `uraid add`: a device into a failed member's slot (or as a hot spare), on the running
//! server or in the superblocks of a stopped array.

use super::{live_socket, path_query, target_members, Target};
use crate::client;
use anyhow::Result;
use std::path::PathBuf;
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct AddArgs {
    /// Overwrite a device that holds a uraid superblock or journal.
    #[arg(short, long)]
    force: bool,
    /// Control socket of the server: unix:PATH (as for status).
    #[arg(long, value_name = "unix:PATH")]
    control: Option<String>,
    #[command(flatten)]
    scan: super::ScanArgs,
    /// The new member.
    dev: PathBuf,
    /// The array's members (the embedded default volume when none are given).
    members: Vec<PathBuf>,
}

/// `uraid add`.
pub fn run(a: AddArgs) -> Result<()> {
    let AddArgs {
        force,
        control,
        scan,
        dev,
        members,
    } = a;
    let t = Target {
        control,
        scan,
        members,
    };
    let (members, embedded) = target_members(&t)?;
    let plan = assemble::plan(&members)?;
    if let Some(sock) = live_socket(&plan, &t, embedded)? {
        let msg = client::post(
            &sock,
            &format!("/add?path={}&force={}", path_query(&dev), u8::from(force)),
        )?;
        println!("uraid: {msg} (server at {})", sock.display());
        return Ok(());
    }
    if assemble::slot_to_fill(&plan).is_none() {
        let sb = assemble::add_spare(&plan, &dev, force)?;
        println!(
            "uraid: {} added to array '{}' as a hot spare (give it with the members to \
             serve: it takes over the next member that fails)",
            dev.display(),
            sb.name
        );
        return Ok(());
    }
    let (slot, sb) = assemble::add_member(&plan, &dev, force)?;
    println!(
        "uraid: {} added to array '{}' as member {slot} (events {}); it is rebuilt \
         when the array is served (uraid status shows progress)",
        dev.display(),
        sb.name,
        sb.events
    );
    Ok(())
}
