//! `uraid fail`: mark a member failed, on the running server or in the superblocks.

use super::{live_socket, target_members, Target};
use crate::client;
use anyhow::Result;
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct FailArgs {
    index: usize,
    #[arg(short, long)]
    force: bool,
    #[command(flatten)]
    target: Target,
}

/// `uraid fail`.
pub fn run(a: FailArgs) -> Result<()> {
    let FailArgs {
        index,
        force,
        target,
    } = a;
    let (members, embedded) = target_members(&target)?;
    let plan = assemble::plan(&members)?;
    match live_socket(&plan, &target, embedded)? {
        Some(sock) => {
            let msg = client::post(
                &sock,
                &format!("/fail?member={index}&force={}", u8::from(force)),
            )?;
            println!("uraid: {msg} (server at {})", sock.display());
        }
        None => {
            let sb = assemble::fail_member(&plan, index, force)?;
            println!(
                "uraid: member {index} of array '{}' marked failed (events {})",
                sb.name, sb.events
            );
        }
    }
    Ok(())
}
