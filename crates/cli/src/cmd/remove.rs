//! `uraid remove`: empty a member's slot, or remove a hot spare, on the running server or
//! in the superblocks.

use super::{live_socket, path_query, target_members, Target};
use crate::client;
use anyhow::Result;
use std::path::Path;
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct RemoveArgs {
    /// Member index, or a spare's path.
    what: String,
    /// Remove a member that is in service (active or rebuilding): fail it first, even if
    /// that leaves no redundancy. Without it only failed or missing members are removed.
    #[arg(short, long)]
    force: bool,
    #[command(flatten)]
    target: Target,
}

/// `uraid remove`.
pub fn run(a: RemoveArgs) -> Result<()> {
    let RemoveArgs {
        what,
        force,
        target,
    } = a;
    let (members, embedded) = target_members(&target)?;
    let plan = assemble::plan(&members)?;
    let index = what.parse::<usize>().ok();
    match live_socket(&plan, &target, embedded)? {
        Some(sock) => {
            let q = match index {
                Some(i) => format!("member={i}"),
                None => format!("path={}", path_query(Path::new(&what))),
            };
            let msg = client::post(&sock, &format!("/remove?{q}&force={}", u8::from(force)))?;
            println!("uraid: {msg} (server at {})", sock.display());
        }
        None => match index {
            Some(i) => {
                let sb = assemble::remove_member(&plan, i, force)?;
                println!(
                    "uraid: member {i} removed from array '{}' (events {}); `uraid add` \
                     fills its slot",
                    sb.name, sb.events
                );
            }
            None => {
                assemble::remove_spare(&plan, Path::new(&what))?;
                println!("uraid: spare {what} removed from array '{}'", plan.sb.name);
            }
        },
    }
    Ok(())
}
