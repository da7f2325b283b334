//! Helpers shared by the CLI test binaries (each binary uses a subset).
#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Runs the `uraid` binary with `args` in `cwd`.
pub fn uraid(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run uraid")
}

/// Stdout of a command that must succeed.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "uraid failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stdout of a command that must exit with `code` (`status`'s 1 degraded, 2 failed; `scrub
/// --wait`'s 2 found something).
pub fn exits(o: &Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A failing or refused command prints one line `uraid: ...` on stderr, no panic, exit 1.
pub fn one_line_error(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(
        err.starts_with("uraid: ") && !err.contains("panicked"),
        "{err}"
    );
    err
}

/// A fresh temp directory for one test (`tag`) of this test binary.
/// The tests run as root (some need it: /run/uraid, chown, setcap).
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "uraid-{}-{tag}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a command that must succeed.
pub fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// `run` for `status` and `detail`, whose exit status is the array's health: 0 healthy, 1
/// degraded, 2 failed (4, the command failing, still fails the test).
pub fn run_health(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        matches!(o.status.code(), Some(0..=2)),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Kills and reaps a child that is still running (test servers, from their Drop).
pub fn kill_if_running(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The clean flag of a member's superblock, as `uraid examine --json` reports it.
pub fn examine_clean(member: &Path) -> bool {
    let o = run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["examine", "--json"])
        .arg(member));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    j["clean"]
        .as_bool()
        .expect("examine reports the clean flag")
}

/// Runs a fio job over NBD with crc32c verification (verify_fatal: a wrong block fails it).
pub fn fio_job(dir: &Path, name: &str, uri: &str, extra: &str) {
    let job = dir.join(format!("{name}.fio"));
    std::fs::write(
        &job,
        format!(
            "[{name}]\nioengine=nbd\nuri={uri}\nbs=16k\nsize=100%\nverify=crc32c\n\
             verify_fatal=1\niodepth=8\nrandseed=42\n{extra}\n"
        ),
    )
    .unwrap();
    let o = Command::new("fio").arg(&job).output().expect("fio");
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "fio {name}: {out}");
}

/// How long `uraid serve` may take to say it is ready, and to exit after SIGTERM.
pub const SERVE_START: Duration = Duration::from_secs(20);
pub const SERVE_STOP: Duration = Duration::from_secs(20);

/// One `uraid serve` for a test, configured here and started with [`Serve::start`]:
///
/// ```text
/// uraid serve --listen unix:SOCK [--listen tcp:127.0.0.1:0] --control unix:ctl.sock \
///     [--metrics=tcp:127.0.0.1:0] ARGS... MEMBERS...
/// ```
///
/// run in `dir` (so the control socket is `dir/ctl.sock` and relative member paths are
/// relative to `dir`); SOCK is `dir/nbd.sock` unless [`Serve::sock`] names another.
pub struct Serve {
    dir: PathBuf,
    sock: PathBuf,
    tcp: bool,
    metrics: bool,
    log: Option<PathBuf>,
    args: Vec<OsString>,
    members: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_removed: Vec<OsString>,
    bin: PathBuf,
    wrap: Vec<OsString>,
}

impl Serve {
    pub fn new(dir: &Path) -> Serve {
        Serve {
            dir: dir.to_path_buf(),
            sock: dir.join("nbd.sock"),
            tcp: false,
            metrics: false,
            log: None,
            args: Vec::new(),
            members: Vec::new(),
            env: Vec::new(),
            env_removed: Vec::new(),
            bin: PathBuf::from(env!("CARGO_BIN_EXE_uraid")),
            wrap: Vec::new(),
        }
    }

    /// The NBD Unix socket (default `dir/nbd.sock`).
    pub fn sock(mut self, sock: &Path) -> Serve {
        self.sock = sock.to_path_buf();
        self
    }

    /// Also listen on an ephemeral loopback TCP port ([`Server::tcp_addr`]).
    pub fn tcp(mut self) -> Serve {
        self.tcp = true;
        self
    }

    /// Serve Prometheus metrics on an ephemeral loopback TCP port ([`Server::metrics_url`]).
    pub fn metrics(mut self) -> Serve {
        self.metrics = true;
        self
    }

    /// The server's stderr goes to `log` (created afresh) instead of the test's.
    pub fn log(mut self, log: &Path) -> Serve {
        self.log = Some(log.to_path_buf());
        self
    }

    /// More `uraid serve` options, before the members.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Serve {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable for the server.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Serve {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// An environment variable the server does not inherit.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Serve {
        self.env_removed.push(key.as_ref().to_owned());
        self
    }

    /// Another uraid binary (a copy, a link) than the one cargo built.
    pub fn bin(mut self, bin: &Path) -> Serve {
        self.bin = bin.to_path_buf();
        self
    }

    /// Starts the binary through this command (`setpriv --reuid=...`): `WRAP... BIN serve ...`.
    /// The wrapper must exec the binary (the server's pid is the wrapper's).
    pub fn wrap<S: AsRef<OsStr>>(mut self, wrap: impl IntoIterator<Item = S>) -> Serve {
        self.wrap = wrap.into_iter().map(|a| a.as_ref().to_owned()).collect();
        self
    }

    pub fn members<S: AsRef<OsStr>>(mut self, members: impl IntoIterator<Item = S>) -> Serve {
        self.members
            .extend(members.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Starts the server and waits (at most [`SERVE_START`]) until it prints "stop with",
    /// which it does once every listener is up; panics, with the log if there is one, if it
    /// exits or stays silent first. The server is killed when the returned [`Server`] is
    /// dropped without [`Server::stop`].
    pub fn start(self) -> Server {
        let mut cmd = match self.wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", self.sock.display()));
        if self.tcp {
            cmd.args(["--listen", "tcp:127.0.0.1:0"]);
        }
        cmd.args(["--control", "unix:ctl.sock"]);
        if self.metrics {
            cmd.arg("--metrics=tcp:127.0.0.1:0");
        }
        // Tests that kill the server to stand in for a crash want the array dirty at the
        // kill however long they idled: safe mode is off unless a test asks for it.
        if !self.args.iter().any(|a| a == "--safe-mode-delay") {
            cmd.args(["--safe-mode-delay", "0"]);
        }
        let stderr = match &self.log {
            Some(log) => Stdio::from(
                std::fs::File::create(log)
                    .unwrap_or_else(|e| panic!("create {}: {e}", log.display())),
            ),
            None => Stdio::inherit(),
        };
        for k in &self.env_removed {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(&self.args)
            .args(&self.members)
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start uraid serve");
        // Stdout is read to its end (so the server never writes into a closed pipe); the
        // lines up to "stop with" say where it listens.
        let out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut srv = Server {
            child,
            sock: self.sock,
            ctl: self.dir.join("ctl.sock"),
            tcp: None,
            metrics: None,
            log: self.log,
            started: Vec::new(),
        };
        let deadline = Instant::now() + SERVE_START;
        loop {
            let line = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "uraid serve did not start within {SERVE_START:?}{}",
                        srv.log_tail()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Stdout closed: the server is exiting.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    let st = loop {
                        match srv.child.try_wait().expect("wait for uraid serve") {
                            Some(st) => break st.to_string(),
                            None if Instant::now() > deadline => break "stdout closed".into(),
                            None => std::thread::sleep(Duration::from_millis(20)),
                        }
                    };
                    panic!(
                        "uraid serve exited ({st}) before it started{}",
                        srv.log_tail()
                    )
                }
            };
            if let Some(a) = line
                .strip_prefix("uraid: listening on nbd://")
                .or_else(|| line.strip_prefix("uraid: listening on nbds://"))
            {
                srv.tcp = a.split('/').next().map(str::to_string);
            }
            if let Some(u) = line.strip_prefix("uraid: Prometheus metrics at ") {
                srv.metrics = Some(u.to_string());
            }
            let last = line.contains("stop with");
            srv.started.push(line);
            if last {
                break;
            }
        }
        assert!(
            !self.tcp || srv.tcp.is_some(),
            "server did not report its TCP address"
        );
        assert!(
            !self.metrics || srv.metrics.is_some(),
            "server did not report its metrics address"
        );
        srv
    }
}

/// A running `uraid serve` (see [`Serve`]); killed on drop if still running, so a failing
/// test does not leave it behind.
pub struct Server {
    child: Child,
    /// The NBD Unix socket.
    pub sock: PathBuf,
    /// The control socket.
    pub ctl: PathBuf,
    tcp: Option<String>,
    metrics: Option<String>,
    log: Option<PathBuf>,
    /// What it printed on stdout up to "stop with".
    pub started: Vec<String>,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The export "vol" over the Unix socket.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///vol?socket={}", self.sock.display())
    }

    /// `127.0.0.1:PORT` of the TCP listener ([`Serve::tcp`]).
    pub fn tcp_addr(&self) -> &str {
        self.tcp.as_deref().expect("started with Serve::tcp")
    }

    /// The export "vol" over TCP.
    pub fn tcp_uri(&self) -> String {
        format!("nbd://{}/vol", self.tcp_addr())
    }

    /// The Prometheus endpoint's URL ([`Serve::metrics`]).
    pub fn metrics_url(&self) -> &str {
        self.metrics
            .as_deref()
            .expect("started with Serve::metrics")
    }

    /// Sends `sig` (a `libc::SIG*`).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped (`stop`,
        // `kill` and `exit_within` take `self` mutably or by value).
        let r = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(r, 0, "kill({sig}): {}", std::io::Error::last_os_error());
    }

    /// Waits for the server to exit; panics (and drop kills it) if it is still running
    /// after `within`.
    pub fn exit_within(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait for uraid serve") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "uraid serve still running {within:?} after the signal{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; the server must exit 0 (in-flight requests finished, the array flushed and
    /// marked clean) within [`SERVE_STOP`].
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let st = self.exit_within(SERVE_STOP);
        assert!(
            st.success(),
            "uraid serve exited with {st}{}",
            self.log_tail()
        );
    }

    /// SIGKILL, like a power cut: no clean stop.
    pub fn kill(mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().expect("SIGKILL uraid serve");
        }
        self.child.wait().expect("wait for uraid serve");
    }

    /// What the server wrote to its log so far, for a panic message ("" without a log).
    fn log_tail(&self) -> String {
        let Some(log) = &self.log else {
            return String::new();
        };
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let mut start = text.len().saturating_sub(4000);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let tail = &text[start..];
        format!("; {}:\n{}", log.display(), tail.trim_start())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        kill_if_running(&mut self.child);
    }
}
