//! `uraid serve NAME` from the config file, and `uraid config check`. The file's format is
//! `uraid_core::config`; here each `key = value` line becomes `uraid serve --key value`
//! (a switch: `--key` for yes, nothing for no), checked line by line with `uraid serve`'s
//! own argument parser so an error names its line, and the array is found by its
//! superblocks (`--scan` with the section's `uuid`, else its name). `[defaults]` lines come
//! first, then the array's, then the command line's: a later single-value option replaces
//! an earlier one, a repeated option (listen, scan-dir) adds to it. Refused: `force`, `run`
//! and `start-dirty-degraded` anywhere; switches, listeners, control, metrics and export in
//! `[defaults]`.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use uraid_core::config::{self, Config, Entry, Section};

/// Where the config file is when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/uraid/uraid.conf";

#[derive(clap::Subcommand)]
pub enum ConfigCmd {
    /// Check the config file: syntax, every key a `uraid serve` option, every value one it
    /// takes; errors name their line. Exit status 1 if anything is wrong.
    Check {
        /// The config file (default /etc/uraid/uraid.conf).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

/// Options a config line may not set: the section says which array (`--scan`), the file is
/// the config; starting degraded, dirty-degraded or with stale members is an operator's
/// decision for one start, never a standing one (a restart after a crash would take it
/// again).
const NOT_KEYS: &[&str] = &[
    "scan",
    "config",
    "help",
    "force",
    "run",
    "start-dirty-degraded",
];

/// Options that belong to one array, not to `[defaults]`: where it listens and is
/// managed, and switches (an array's `no` cannot undo a default's `yes`).
const NOT_DEFAULTS: &[&str] = &["listen", "control", "metrics", "export"];

/// Reads and parses `path`, errors as `PATH:LINE: message`.
pub fn load(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("config {}: cannot read", path.display()))?;
    config::parse(&text).map_err(|e| anyhow::anyhow!("{}:{}: {}", path.display(), e.line, e.msg))
}

/// The `uraid serve` arguments of one config line (`defaults`: a `[defaults]` line).
fn entry_args(serve: &clap::Command, e: &Entry, defaults: bool) -> Result<Vec<OsString>, String> {
    if NOT_KEYS.contains(&e.key.as_str()) {
        return Err(format!(
            "{}: not allowed in a config file (give --{} on the command line for one start)",
            e.key, e.key
        ));
    }
    let arg = serve
        .get_arguments()
        .find(|a| a.get_long() == Some(e.key.as_str()));
    let Some(arg) = arg else {
        return Err(format!(
            "{}: not a key (keys are `uraid serve` options' long names, see uraid serve \
             --help; the array is the section's name or its uuid line)",
            e.key
        ));
    };
    let switch = !arg.get_action().takes_values();
    if defaults && (switch || NOT_DEFAULTS.contains(&e.key.as_str())) {
        return Err(format!(
            "{}: belongs in an array's section, not [defaults]",
            e.key
        ));
    }
    let flag = OsString::from(format!("--{}", e.key));
    if switch {
        return match e.value.as_str() {
            "yes" | "true" | "on" => Ok(vec![flag]),
            "no" | "false" | "off" => Ok(Vec::new()),
            v => Err(format!("{}: a switch takes yes or no, not {v:?}", e.key)),
        };
    }
    Ok(vec![flag, OsString::from(&e.value)])
}

/// Checks one line with `uraid serve`'s parser (`cli` parses a whole command line).
fn check_entry(
    serve: &clap::Command,
    cli: &dyn Fn(Vec<OsString>) -> Result<(), String>,
    e: &Entry,
    defaults: bool,
) -> Result<Vec<OsString>, String> {
    let args = entry_args(serve, e, defaults)?;
    let mut argv: Vec<OsString> = vec!["uraid".into(), "serve".into()];
    argv.extend(args.iter().cloned());
    argv.extend(["--scan".into(), "x".into()]);
    cli(argv).map_err(|m| format!("{} = {}: {m}", e.key, e.value))?;
    Ok(args)
}

/// The `uraid serve` arguments for array `s`: `[defaults]`, then its own lines, then
/// `--scan` with its uuid or name. Every line is checked; the errors name their lines.
pub fn serve_args(
    path: &Path,
    cfg: &Config,
    s: &Section,
    serve: &clap::Command,
    cli: &dyn Fn(Vec<OsString>) -> Result<(), String>,
) -> Result<Vec<OsString>, Vec<String>> {
    let mut out = Vec::new();
    let mut errs = Vec::new();
    let lines = cfg
        .defaults
        .iter()
        .map(|e| (e, true))
        .chain(s.options().map(|e| (e, false)));
    for (e, defaults) in lines {
        match check_entry(serve, cli, e, defaults) {
            Ok(a) => out.extend(a),
            Err(m) => errs.push(format!("{}:{}: {m}", path.display(), e.line)),
        }
    }
    let which = s.uuid().map_or(s.name.as_str(), |u| u.value.as_str());
    out.extend(["--scan".into(), which.into()]);
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(errs)
    }
}

/// `uraid config check`: Ok(0) if the file is right, else its errors on stderr and Ok(1).
pub fn check(
    path: &Path,
    serve: &clap::Command,
    cli: &dyn Fn(Vec<OsString>) -> Result<(), String>,
) -> Result<i32> {
    let cfg = load(path)?;
    let mut errs = Vec::new();
    if cfg.arrays.is_empty() {
        errs.push(format!("{}: no [array] section", path.display()));
    }
    for e in &cfg.defaults {
        if let Err(m) = check_entry(serve, cli, e, true) {
            errs.push(format!("{}:{}: {m}", path.display(), e.line));
        }
    }
    for s in &cfg.arrays {
        let own = Config {
            defaults: Vec::new(),
            arrays: Vec::new(),
        };
        if let Err(v) = serve_args(path, &own, s, serve, cli) {
            errs.extend(v);
        }
    }
    if !errs.is_empty() {
        for e in &errs {
            eprintln!("uraid: {e}");
        }
        return Ok(1);
    }
    let names: Vec<&str> = cfg.arrays.iter().map(|s| s.name.as_str()).collect();
    println!(
        "{}: {} array(s): {}",
        path.display(),
        names.len(),
        names.join(", ")
    );
    Ok(0)
}

/// For `uraid serve NAME` where NAME is not a file: the array NAME (a name or UUID, found
/// by `--scan`) with the config file's options: its `[NAME]` section if it has one, else
/// only `[defaults]`. The config file is `--config` (which must have the section), else the
/// default one if it exists, else none (NAME alone). None if NAME is a file.
pub fn for_name(
    name: &Path,
    explicit: Option<&Path>,
) -> Result<Option<(PathBuf, Config, Section)>> {
    // A path (a '/' in it) is a member, even one that does not exist (a typo).
    if name.exists() || name.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Ok(None);
    }
    let n = name.to_string_lossy().into_owned();
    let (path, cfg) = match explicit {
        Some(p) => (p.to_path_buf(), load(p)?),
        None if Path::new(DEFAULT_PATH).exists() => {
            (PathBuf::from(DEFAULT_PATH), load(Path::new(DEFAULT_PATH))?)
        }
        None => (PathBuf::from("(no config file)"), Config::default()),
    };
    let section = match cfg.array(&n) {
        Some(s) => s.clone(),
        None if explicit.is_some() => bail!(
            "{n}: not a member file, and {} has no [{n}] section",
            path.display()
        ),
        None => Section {
            line: 0,
            name: n,
            entries: Vec::new(),
        },
    };
    Ok(Some((path, cfg, section)))
}
