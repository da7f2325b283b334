//! `uraid watch`: the live view of a running server (`client::watch`).

use super::{target_members, Target};
use crate::client;
use anyhow::{bail, Result};
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct WatchArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds between updates.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Stop after this many updates (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    count: u64,
}

/// `uraid watch`.
pub fn run(a: WatchArgs) -> Result<()> {
    let WatchArgs {
        target,
        interval,
        count,
    } = a;
    if !(interval > 0.0 && interval <= 3600.0) {
        bail!("--interval {interval}: must be above 0 and at most 3600 seconds");
    }
    let (members, embedded) = target_members(&target)?;
    let plan = assemble::plan(&members)?;
    let Some(sock) = client::socket_for(&plan, target.control.as_deref(), embedded)? else {
        bail!("uraid watch needs a control socket");
    };
    client::watch(
        &sock,
        &plan,
        std::time::Duration::from_secs_f64(interval),
        count,
    )
}
