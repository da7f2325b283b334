//! Shared by the server tests: a server over in-memory members on a Unix socket in a temp
//! dir, and the data pattern the tests write (the NBD client is `uraid_testkit::nbd`).

#![allow(dead_code)]

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::Level;
use uraid_engine::{Runtime, Volume};
use uraid_nbd::{Config, Server};
use uraid_sim::{mem_array, Faults, MemDev};

pub struct Fixture {
    pub dir: PathBuf,
    pub sock: PathBuf,
    pub rt: Option<Runtime>,
    pub array: Arc<Volume<MemDev>>,
    pub faults: Vec<Arc<Faults>>,
    pub server: Option<Server<MemDev>>,
    listener: Option<UnixListener>,
}

impl Fixture {
    /// A RAID-0 volume of 4 x `member_mib` MiB on one reactor, served with `cfg` (export
    /// "vol").
    pub fn start(tag: &str, member_mib: u64, cfg: Config) -> Fixture {
        let dir = std::env::temp_dir().join(format!("uraid-nbd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rt = Runtime::new(1, 256, true).unwrap();
        assert!(rt.uses_uring(), "the NBD server needs io_uring");
        let (array, faults) = mem_array(
            Level::Raid0,
            4,
            64 << 10,
            member_mib << 20,
            Some(rt.handle()),
        );
        let server = Server::new(
            array.clone(),
            rt.handle(),
            Config {
                export: "vol".into(),
                ..cfg
            },
        );
        let sock = dir.join("nbd.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        server.listen(listener.as_raw_fd(), false);
        Fixture {
            dir,
            sock,
            rt: Some(rt),
            array,
            faults,
            server: Some(server),
            listener: Some(listener),
        }
    }

    pub fn server(&self) -> &Server<MemDev> {
        self.server.as_ref().expect("server running")
    }

    /// Polls `f` every 20 ms until it holds; panics after `within`.
    pub fn wait_for(&self, what: &str, within: Duration, mut f: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + within;
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the server has taken no new request for `quiet` (it stalled or is idle).
    pub fn wait_stalled(&self, quiet: Duration) -> u64 {
        let stats = self.server().stats();
        let load = || stats.requests.load(std::sync::atomic::Ordering::SeqCst);
        let mut last = load();
        let mut since = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let now = load();
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return now;
            }
            assert!(Instant::now() < deadline, "server never went quiet");
        }
    }

    /// Stops the server (bounded: a hang fails the test after `within`) and the reactors.
    pub fn stop_within(mut self, within: Duration) {
        let server = self.server.take().expect("server running");
        let rt = self.rt.take().expect("runtime running");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = server.shutdown();
            drop(server);
            rt.shutdown();
            let _ = tx.send(r);
        });
        match rx.recv_timeout(within) {
            Ok(r) => r.expect("array closed cleanly"),
            Err(_) => panic!("server shutdown did not finish within {within:?}"),
        }
        drop(self.listener.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A failed test: do not join reactors that may be stuck.
        if let Some(rt) = self.rt.take() {
            std::mem::forget(rt);
        }
        if let Some(s) = self.server.take() {
            std::mem::forget(s);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Deterministic bytes for block `i`.
pub fn block(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i as usize * 31 + j / 512 * 7 + j) as u8)
        .collect()
}
