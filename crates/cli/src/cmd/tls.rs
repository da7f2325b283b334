//! `uraid tls`: a running server's TLS (mode, credentials, sessions), and `--reload` to
//! read its certificate or PSK files again without dropping a connection.

use super::{live_socket, target_members, Target};
use crate::client;
use anyhow::{bail, Result};
use uraid_engine::assemble;

#[derive(clap::Args)]
pub struct TlsArgs {
    /// Read the server's --tls-certificates or --tls-psk files again: new connections use
    /// them, established ones keep their sessions. On an error nothing changes.
    #[arg(long)]
    reload: bool,
    #[command(flatten)]
    target: Target,
}

pub fn run(a: TlsArgs) -> Result<()> {
    let (members, embedded) = target_members(&a.target)?;
    let plan = assemble::plan(&members)?;
    let Some(sock) = live_socket(&plan, &a.target, embedded)? else {
        bail!(
            "no running server of array '{}': TLS is set when serving (uraid serve --tls, \
             --tls-certificates, --tls-psk)",
            plan.sb.name
        );
    };
    if a.reload {
        let msg = client::post(&sock, "/tls/reload")?;
        println!("uraid: {msg} (server at {})", sock.display());
        return Ok(());
    }
    let st = client::get_json(&sock, "/status")?;
    let t = &st["tls"];
    println!(
        "uraid: TLS {}{} (server at {})",
        t["mode"].as_str().unwrap_or("?"),
        t["credentials"]
            .as_str()
            .map(|c| format!(": {c}"))
            .unwrap_or_default(),
        sock.display()
    );
    println!(
        "      {} handshakes, {} failed; {} bytes encrypted, {} decrypted",
        t["handshakes"],
        client::total(&t["failures"]),
        t["bytes_encrypted"],
        t["bytes_decrypted"]
    );
    for c in st["connections"]["clients"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let tls = match c["tls"].as_object() {
            Some(t) => format!(
                "{} {}{}",
                t["version"].as_str().unwrap_or("?"),
                t["cipher"].as_str().unwrap_or("?"),
                t["peer"]
                    .as_str()
                    .map(|p| format!(", {p}"))
                    .unwrap_or_default()
            ),
            None => "plaintext".into(),
        };
        println!(
            "      client {} from {}: {} ({}, {} s)",
            c["id"],
            c["peer"].as_str().unwrap_or("?"),
            tls,
            c["phase"].as_str().unwrap_or("?"),
            c["seconds"]
        );
    }
    Ok(())
}
