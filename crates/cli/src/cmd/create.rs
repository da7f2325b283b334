//! `uraid create`: superblocks on the members, then the journal and hot spares.

use super::journal::parse_journal_mode;
use crate::size;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use uraid_core::format::{uuid_string, JournalMode};
use uraid_core::Level;
use uraid_engine::assemble::{self, CreateOptions};

#[derive(clap::Args)]
pub struct CreateArgs {
    /// RAID level: 0, 1, 10, 5, 6, 7 (triple parity) or ec (with --parity).
    #[arg(short, long)]
    level: String,
    /// Parity members for --level ec (1..=8).
    #[arg(long)]
    parity: Option<usize>,
    /// Chunk size, a power of two from 4K to 1M.
    #[arg(short, long, default_value = "64K", value_parser = size::parse)]
    chunk: u64,
    /// Array name (up to 32 bytes). Default: uraid- and the first 8 hex digits of the
    /// array's uuid (unique, so every array gets its own control socket).
    #[arg(short = 'N', long)]
    name: Option<String>,
    /// Overwrite members that already carry a uraid superblock.
    #[arg(short, long)]
    force: bool,
    /// Create missing member files of this size first (sparse).
    #[arg(long, value_parser = size::parse)]
    size: Option<u64>,
    /// Write-intent bitmap region size (bytes of each member), a power of two of at
    /// least one chunk, or "none". Default 4M (larger when the members are so big that
    /// 455,168 regions do not cover them); none on RAID0.
    #[arg(long, value_parser = parse_bitmap_chunk)]
    bitmap_chunk: Option<u64>,
    /// A journal device (a faster device or file, at least four full stripes plus 8 KiB):
    /// every stripe update is logged there before the members are written, which closes
    /// the RAID write hole (no resync after a crash, safe degraded start). Parity levels.
    /// Give it with the members to `serve`, `status`.
    #[arg(long, value_name = "DEV")]
    journal: Option<PathBuf>,
    /// write-through: FLUSH still flushes the members; write-back: FLUSH and FUA are
    /// satisfied by the journal (one journal write), members flushed at checkpoints.
    #[arg(long, default_value = "write-through", value_parser = parse_journal_mode)]
    journal_mode: JournalMode,
    /// A hot spare (repeat for several): it takes over the slot of the next member that
    /// fails while serving (give it with the members to `serve`). Levels with redundancy.
    #[arg(long, value_name = "DEV")]
    spare: Vec<PathBuf>,
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

/// `uraid create`.
pub fn run(a: CreateArgs) -> Result<()> {
    let CreateArgs {
        level,
        parity,
        chunk,
        name,
        force,
        size,
        bitmap_chunk,
        journal,
        journal_mode,
        spare,
        members,
    } = a;
    let level = Level::parse(&level, parity)?;
    if !spare.is_empty() && level == Level::Raid0 {
        bail!("--spare: raid0 has no redundancy, a spare could never be rebuilt");
    }
    for (i, s) in spare.iter().enumerate() {
        if spare[..i].contains(s) || members.contains(s) {
            bail!("{}: given twice", s.display());
        }
    }
    // Files `--size` creates are removed again if the command is refused: a refused create
    // leaves nothing behind.
    let mut made = Made(Vec::new());
    if let Some(sz) = size {
        for m in members.iter().chain(&spare) {
            if !m.exists() {
                let f = std::fs::File::create(m)
                    .with_context(|| format!("{}: cannot create", m.display()))?;
                made.0.push(m.clone());
                f.set_len(sz)
                    .with_context(|| format!("{}: cannot make it {sz} bytes", m.display()))?;
            }
        }
    }
    let jpath = journal.clone();
    let sb = assemble::create_exclusive(
        &members,
        &CreateOptions {
            level,
            chunk,
            name: name.unwrap_or_default(),
            force,
            bitmap_chunk,
            journal: journal.map(|j| (j, journal_mode)),
        },
    )?;
    // Members of an array now: kept whatever follows (a spare refused below is reported,
    // and the array stands).
    made.0.retain(|p| spare.contains(p));
    let g = sb.geometry;
    println!(
        "uraid: created {} array '{}' ({}) on {} members: chunk {}, volume {} ({} bytes)",
        g.level,
        sb.name,
        uuid_string(&sb.array_uuid),
        g.members,
        size::human(g.chunk),
        size::human(g.volume_size()),
        g.volume_size()
    );
    if let Some((u, m)) = sb.journal {
        println!("uraid: journal {} ({})", uuid_string(&u), m.name());
    }
    if !spare.is_empty() {
        let mut given = members.clone();
        given.extend(jpath.iter().cloned());
        let plan = assemble::plan(&given)?;
        for s in &spare {
            assemble::add_spare(&plan, s, force)?;
            made.0.retain(|p| p != s);
            println!("uraid: hot spare {}", s.display());
        }
    }
    Ok(())
}

/// Member files this command created, removed on drop (the command was refused before they
/// became part of an array).
struct Made(Vec<std::path::PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `--bitmap-chunk`: a size, or "none" (0).
fn parse_bitmap_chunk(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("none") {
        Ok(0)
    } else {
        size::parse(s)
    }
}
