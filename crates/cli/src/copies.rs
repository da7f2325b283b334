//! glibc's memory copies on AMD CPUs.
//!
//! glibc 2.36 (Debian 12) copies blocks from about 2 KiB up to its non-temporal threshold
//! with `rep movsb` on CPUs that have ERMS/FSRM. On AMD Zen that instruction is several
//! times slower than glibc's vector loop for some alignments of source against destination
//! (glibc bug 30994). Current glibc no longer uses it on AMD below the non-temporal
//! threshold (`rep_movsb_threshold = non_temporal_threshold` for `arch_kind_amd` in
//! sysdeps/x86/dl-cacheinfo.h). Here the copy that pays is rustls's, one per TLS record
//! received (docs/benchmarks.md, "NBD over TLS").
//!
//! The dynamic loader reads that choice from `GLIBC_TUNABLES` before `main` runs, so
//! `serve` on an AMD CPU starts itself again once, first thing (exec of the path it was
//! started from, AT_EXECFN: the same process id and process name, no thread or file opened
//! yet), with the tunable that makes an older glibc copy as current glibc does. Not when that
//! path no longer is this binary (replaced on disk) or the loader was started explicitly
//! (`ld.so uraid serve`): then a warning says so. A `GLIBC_TUNABLES` that already names the
//! tunable is left as it is: that is how an operator chooses otherwise, and how the second
//! start knows it is one. A set-id or file-capability start (AT_SECURE) is left alone: the
//! loader drops the tunable there.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// The tunable.
pub const TUNABLE: &str = "glibc.cpu.x86_rep_movsb_threshold";
/// The tunable with a threshold above any copy, as an operator would set it: `rep movsb` is
/// never chosen, copies past the non-temporal threshold still take the non-temporal path
/// (as current glibc on AMD).
pub const SETTING: &str = "glibc.cpu.x86_rep_movsb_threshold=1000000000";

/// The `GLIBC_TUNABLES` to start again with, given the current one; None: start as is
/// (the tunable is named already).
pub fn tunables(current: Option<&OsStr>) -> Option<OsString> {
    match current {
        Some(c) if named(c).is_some() => None,
        Some(c) if !c.is_empty() => {
            let mut v = c.as_bytes().to_vec();
            v.push(b':');
            v.extend_from_slice(SETTING.as_bytes());
            Some(OsString::from_vec(v))
        }
        _ => Some(SETTING.into()),
    }
}

/// The tunable as this process runs with it (`TUNABLE=VALUE` from `GLIBC_TUNABLES`), for
/// the start-up lines.
pub fn current() -> Option<String> {
    named(&std::env::var_os("GLIBC_TUNABLES")?)
}

/// `TUNABLE=VALUE` if the colon-separated list `v` names the tunable.
fn named(v: &OsStr) -> Option<String> {
    v.to_string_lossy()
        .split(':')
        .find(|t| t.split('=').next() == Some(TUNABLE))
        .map(str::to_string)
}

/// The CPU's vendor is AMD (`vendor_id` in /proc/cpuinfo).
fn amd() -> bool {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open("/proc/cpuinfo") else {
        return false;
    };
    for line in std::io::BufReader::new(f).lines() {
        let Ok(line) = line else { return false };
        if let Some(v) = line.strip_prefix("vendor_id") {
            return v.trim_start_matches([' ', '\t', ':']).trim() == "AuthenticAMD";
        }
    }
    false
}

/// On an AMD CPU with glibc, execs this program again with the tunable set (see the module
/// doc); returns only if it does not: None when there is nothing to do (another CPU, the
/// tunable already named, AT_SECURE), else why it could not (for the log).
pub fn vector_copies_on_amd() -> Option<String> {
    if !cfg!(all(
        target_os = "linux",
        target_env = "gnu",
        target_arch = "x86_64"
    )) {
        return None;
    }
    let value = tunables(std::env::var_os("GLIBC_TUNABLES").as_deref())?;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave this process; no memory
    // is passed.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    // A set-id or file-capability start (AT_SECURE): the loader would drop the tunable
    // from the new environment, and the next start would exec again, forever.
    if secure || !amd() {
        return None;
    }
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_default();
    let path = match started_as() {
        Ok(p) => p,
        Err(why) => return Some(why),
    };
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&path)
        .arg0(arg0)
        .args(args)
        .env("GLIBC_TUNABLES", value)
        .exec();
    // Command::exec set SIGPIPE back to its default before trying; a server keeps it
    // ignored (a log reader going away must not end it).
    // SAFETY: signal(2) with a valid signal number and SIG_IGN; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    Some(format!("exec {}: {e}", path.display()))
}

/// The path the kernel started this process from (AT_EXECFN, the working directory
/// unchanged since), to exec again: the process keeps its name (comm, the last part of
/// that path: what `ps`, `pgrep`, systemd and the member lock's "in use by" show). Refused
/// for an explicit `ld.so` start (the program the kernel ran is the loader: no AT_BASE) and
/// when that path no longer is this binary (replaced on disk).
fn started_as() -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave this process.
    if unsafe { libc::getauxval(libc::AT_BASE) } == 0 {
        return Err("started by the dynamic loader itself".into());
    }
    // SAFETY: as above; AT_EXECFN, when present, points to the NUL-terminated path given
    // to execve, on this process's stack for its whole life.
    let p = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const libc::c_char;
    if p.is_null() {
        return Err("no AT_EXECFN".into());
    }
    // SAFETY: a valid C string (above), copied at once.
    let bytes = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes().to_vec();
    let mut path = PathBuf::from(OsString::from_vec(bytes));
    // A bare name was found in the working directory (an empty PATH entry, a direct
    // execv): say so, or the exec would search PATH for another program of that name.
    if path.components().count() == 1 && !path.is_absolute() {
        path = std::path::Path::new(".").join(path);
    }
    let same = match (
        std::fs::metadata(&path),
        std::fs::metadata("/proc/self/exe"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if !same {
        return Err(format!("{} is no longer this program", path.display()));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunable_is_added_once_and_an_operators_choice_is_kept() {
        let ours = SETTING.to_string();
        assert_eq!(SETTING.strip_prefix(TUNABLE), Some("=1000000000"));
        assert_eq!(tunables(None), Some(ours.clone().into()));
        assert_eq!(tunables(Some(OsStr::new(""))), Some(ours.clone().into()));
        assert_eq!(
            tunables(Some(OsStr::new("glibc.malloc.arena_max=2"))),
            Some(format!("glibc.malloc.arena_max=2:{ours}").into())
        );
        // Named already: by us (the second start) or by the operator, any value.
        assert_eq!(tunables(Some(OsStr::new(&ours))), None);
        assert_eq!(
            tunables(Some(OsStr::new("glibc.cpu.x86_rep_movsb_threshold=4096"))),
            None
        );
    }
}
