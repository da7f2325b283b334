//! `uraid throttle`: show or change a running server's background throttle.

use super::{live_socket, target_members, Target};
use crate::client;
use anyhow::{bail, Result};
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct ThrottleArgs {
    /// Stripes in flight while clients are active; 0: the --min rate instead.
    #[arg(long, value_name = "STRIPES", value_parser = clap::value_parser!(u64).range(0..=65536))]
    budget: Option<u64>,
    /// low, normal or high: how much of the time the budget is used.
    #[arg(long, value_parser = ["low", "normal", "high"])]
    priority: Option<String>,
    /// Rate while clients are active with budget 0, MB/s of member I/O (or a size per
    /// second: 500M, 2G); 0: unlimited.
    #[arg(long, value_name = "MB/S", value_parser = crate::size::parse_rate_mb)]
    min: Option<u64>,
    /// Rate while clients are idle, MB/s (or 500M, 2G); 0: unlimited.
    #[arg(long, value_name = "MB/S", value_parser = crate::size::parse_rate_mb)]
    max: Option<u64>,
    #[command(flatten)]
    target: Target,
}

/// `uraid throttle`: prints the throttle when nothing is to be set.
pub fn run(a: ThrottleArgs) -> Result<()> {
    let ThrottleArgs {
        budget,
        priority,
        min,
        max,
        target,
    } = a;
    for (flag, v) in [("--min", min), ("--max", max)] {
        if v.is_some_and(|m| m > 1 << 30) {
            bail!("{flag}: at most 1073741824 MB/s (0: unlimited)");
        }
    }
    let (members, embedded) = target_members(&target)?;
    let plan = assemble::plan(&members)?;
    let Some(sock) = live_socket(&plan, &target, embedded)? else {
        bail!(
            "no running server of array '{}': the throttle is set when serving \
             (uraid serve --background-budget, --priority, --resync-min, --resync-max)",
            plan.sb.name
        );
    };
    let mut q = Vec::new();
    if let Some(b) = budget {
        q.push(format!("budget={b}"));
    }
    if let Some(p) = priority {
        q.push(format!("priority={p}"));
    }
    if let Some(m) = min {
        q.push(format!("min={m}"));
    }
    if let Some(m) = max {
        q.push(format!("max={m}"));
    }
    if q.is_empty() {
        let st = client::get_json(&sock, "/status")?;
        let t = &st["throttle"];
        let rate = |v: &serde_json::Value| match v.as_u64() {
            Some(0) | None => "unlimited".to_string(),
            Some(b) => format!("{} MB/s", b >> 20),
        };
        println!(
            "uraid: throttle: budget {} stripe(s) while clients are active, priority {}, \
             min {}, max {} (server at {})",
            t["budget"],
            t["priority"].as_str().unwrap_or("?"),
            rate(&t["min_bytes_per_second"]),
            rate(&t["max_bytes_per_second"]),
            sock.display()
        );
    } else {
        let msg = client::post(&sock, &format!("/throttle?{}", q.join("&")))?;
        println!("uraid: {msg} (server at {})", sock.display());
    }
    Ok(())
}
