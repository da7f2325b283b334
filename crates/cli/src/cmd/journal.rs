//! `uraid journal add|remove`: give a stopped array a journal device, or stop using it.

use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;
use uraid_core::format::{uuid_string, JournalMode};
use uraid_engine::assemble;

#[derive(Subcommand)]
pub enum JournalCmd {
    /// Format DEV as the journal of the (cleanly stopped) array formed by MEMBERs.
    Add {
        #[arg(long, value_name = "DEV")]
        journal: PathBuf,
        #[arg(long, default_value = "write-through", value_parser = parse_journal_mode)]
        mode: JournalMode,
        /// Overwrite a device that holds a uraid superblock or journal.
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        members: Vec<PathBuf>,
    },
    /// Stop using the journal of the array formed by MEMBERs (and its journal device, if
    /// given among them). Refused after an unclean stop unless --force.
    Remove {
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        members: Vec<PathBuf>,
    },
}

pub fn parse_journal_mode(s: &str) -> Result<JournalMode, String> {
    match s {
        "write-through" | "wt" => Ok(JournalMode::WriteThrough),
        "write-back" | "wb" => Ok(JournalMode::WriteBack),
        _ => Err(format!("{s}: write-through or write-back")),
    }
}

/// `uraid journal add` and `uraid journal remove`.
pub fn run(cmd: JournalCmd) -> Result<()> {
    match cmd {
        JournalCmd::Add {
            journal,
            mode,
            force,
            members,
        } => {
            let plan = assemble::plan(&members)?;
            let sb = assemble::add_journal(&plan, &journal, mode, force)?;
            let (u, m) = sb.journal.context("journal recorded")?;
            println!(
                "uraid: array '{}' now journals to {} (journal {}, {}); give it with the \
                 members when serving",
                sb.name,
                journal.display(),
                uuid_string(&u),
                m.name()
            );
            Ok(())
        }
        JournalCmd::Remove { force, members } => {
            let plan = assemble::plan(&members)?;
            let sb = assemble::remove_journal(&plan, force)?;
            println!(
                "uraid: array '{}' has no journal any more (events {})",
                sb.name, sb.events
            );
            Ok(())
        }
    }
}
