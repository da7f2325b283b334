//! The supervisor: owns the threads of a serving array's background work and carries out
//! the operator's commands that start, pause or end it (the control socket's `POST`s, by
//! way of cli/jobs.rs).
//!
//! * Walks (recovery/): resync at start, rebuild whenever members are to be rebuilt (at
//!   start, after an add, a spare taking over or a replacement taking a failed slot), scrub
//!   (start, pause, resume, cancel), replace (start, cancel). Each runs on its own thread
//!   (`block_on` of the walk; the walk's stripe work goes to the reactors).
//! * The write-intent bitmap daemon (clears idle regions, checkpoints the journal).
//! * Hot spares: a pool, and a watcher that puts one into the slot of a member that failed.
//! * Member administration that must not interleave with a spare taking over (add, replace,
//!   remove): under one lock (`adding`).
//! * `stop` stops and joins everything; nothing starts afterwards.
//!
//! A command that cannot be carried out is a `Refusal`: its kind (the control socket maps it
//! to an HTTP status) and the message the operator sees.

use crate::dev::{BlockDev, FileDev};
use crate::volume::Volume;
use crate::{assemble, ScrubMode};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the spare watcher looks for a failed member.
const SPARE_WATCH_EVERY: Duration = Duration::from_millis(200);

/// How often the bitmap daemon looks at its stop flag (it ticks every `BITMAP_TICK`).
const DAEMON_POLL: Duration = Duration::from_millis(100);

/// How often the daemon judges member latency (`Array::slow_tick`).
const SLOW_TICK: Duration = Duration::from_secs(1);

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The array's or the server's state does not allow it now (read-only, degraded, one
    /// already running, a device in use or holding another array's superblock…).
    Conflict,
    /// The server is stopping.
    Stopping,
    /// The server failed to carry it out (a thread could not start, a device could not
    /// be erased).
    Internal,
}

/// A refused operator command: its kind and the message the operator sees (`Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

impl Refusal {
    pub fn conflict(message: impl Into<String>) -> Refusal {
        Refusal {
            kind: RefusalKind::Conflict,
            message: message.into(),
        }
    }

    fn stopping() -> Refusal {
        Refusal {
            kind: RefusalKind::Stopping,
            message: "the server is stopping".into(),
        }
    }

    fn internal(message: String) -> Refusal {
        Refusal {
            kind: RefusalKind::Internal,
            message,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

/// What `scrub_command` does to the running scrub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrubCommand {
    Pause,
    Resume,
    Cancel,
}

impl ScrubCommand {
    pub fn parse(s: &str) -> Option<ScrubCommand> {
        match s {
            "pause" => Some(ScrubCommand::Pause),
            "resume" => Some(ScrubCommand::Resume),
            "cancel" => Some(ScrubCommand::Cancel),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ScrubCommand::Pause => "pause",
            ScrubCommand::Resume => "resume",
            ScrubCommand::Cancel => "cancel",
        }
    }
}

/// What `remove` removes: a member slot, or a hot spare by path.
pub enum Removal {
    Member(usize),
    Spare(PathBuf),
}

/// What `start_resync` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncStart {
    /// The array was stopped cleanly: nothing to resync.
    NotNeeded,
    /// Resync runs on its own thread.
    Started,
    /// A read-only server writes no data: resync waits for a read-write start.
    ReadOnly,
    /// Resync needs every member and the array is degraded.
    Degraded,
}

/// A walk's thread and its stop flag.
struct Job {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Job {
    fn running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Asks it to stop and waits for it.
    fn end(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Joins the finished jobs of `jobs` and forgets them.
fn reap(jobs: &mut Vec<(usize, Job)>) {
    let (done, running): (Vec<_>, Vec<_>) = std::mem::take(jobs)
        .into_iter()
        .partition(|(_, j)| !j.running());
    *jobs = running;
    for (_, j) in done {
        let _ = j.thread.join();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// The background work of one serving volume (module docs).
pub struct Supervisor<D: BlockDev> {
    volume: Arc<Volume<D>>,
    read_only: bool,
    scrub: Mutex<Option<Job>>,
    rebuild: Mutex<Option<JoinHandle<()>>>,
    /// Each replace's thread and stop flag, by slot (several run at once).
    replace: Mutex<Vec<(usize, Job)>>,
    resync: Mutex<Option<JoinHandle<()>>>,
    bitmap_daemon: Mutex<Option<JoinHandle<()>>>,
    /// Stops the rebuild (`stop`, first).
    rebuild_stop: Arc<AtomicBool>,
    /// Stops the resync and the bitmap daemon (`stop`, once the other work has stopped).
    daemon_stop: Arc<AtomicBool>,
    /// Serialises add, replace, remove and a spare taking over.
    adding: Mutex<()>,
    /// Hot spares: opened, waiting for a member to fail (`spare_tick`).
    spares: Mutex<Vec<(D, [u8; 16])>>,
    spare_watch: Mutex<Option<JoinHandle<()>>>,
    /// Set by `stop` (under the scrub lock): nothing starts afterwards.
    stopped: AtomicBool,
}

impl<D: BlockDev> Supervisor<D> {
    /// The supervisor of `volume`; a `read_only` server writes nothing (no rebuild, no
    /// resync, no repair, no member changes).
    pub fn new(volume: Arc<Volume<D>>, read_only: bool) -> Supervisor<D> {
        Supervisor {
            volume,
            read_only,
            scrub: Mutex::new(None),
            rebuild: Mutex::new(None),
            replace: Mutex::new(Vec::new()),
            resync: Mutex::new(None),
            bitmap_daemon: Mutex::new(None),
            rebuild_stop: Arc::new(AtomicBool::new(false)),
            daemon_stop: Arc::new(AtomicBool::new(false)),
            adding: Mutex::new(()),
            spares: Mutex::new(Vec::new()),
            spare_watch: Mutex::new(None),
            stopped: AtomicBool::new(false),
        }
    }

    /// The volume it supervises.
    pub fn volume(&self) -> &Arc<Volume<D>> {
        &self.volume
    }

    /// Starts the resync of an array that was not stopped cleanly, on its own thread (at
    /// start; `stop` ends and joins it). Once: a second call while it runs reports it
    /// started; after `stop` nothing starts (NotNeeded).
    pub fn start_resync(&self) -> std::io::Result<ResyncStart> {
        // The slot is held while deciding, so `stop` (which sets `stopped` before it takes
        // the slot) either sees the thread or keeps it from starting.
        let mut slot = lock(&self.resync);
        if slot.is_some() {
            return Ok(ResyncStart::Started);
        }
        if self.stopped.load(Ordering::Acquire) {
            return Ok(ResyncStart::NotNeeded);
        }
        let a = self.volume.array();
        if !a.needs_resync() {
            return Ok(ResyncStart::NotNeeded);
        }
        if self.read_only {
            // md defers resync on read-only arrays: nothing is written, and the array stays
            // "not clean" for the next read-write start.
            return Ok(ResyncStart::ReadOnly);
        }
        if !a.failed().is_empty() {
            return Ok(ResyncStart::Degraded);
        }
        let (vol, stop) = (self.volume.clone(), self.daemon_stop.clone());
        let t = spawn("uraid-resync", move || {
            let _ = futures::executor::block_on(vol.array().resync(&stop));
        })?;
        *slot = Some(t);
        Ok(ResyncStart::Started)
    }

    /// Starts the metadata daemon: every `BITMAP_TICK` it clears the write-intent bits of
    /// regions idle for a tick and checkpoints the journal (if the array has a bitmap or a
    /// journal and the server writes), with `safe_mode` (md's `safe_mode_delay`) it marks
    /// the array clean once no write has been in flight for that long
    /// (`Array::safe_mode_tick`), and every `SLOW_TICK` it judges member latency
    /// (`Array::slow_tick`). False after `stop`; a second call while it runs does nothing
    /// (true).
    pub fn start_bitmap_daemon(&self, safe_mode: Option<Duration>) -> std::io::Result<bool> {
        let mut slot = lock(&self.bitmap_daemon);
        if slot.is_some() {
            return Ok(true);
        }
        if self.stopped.load(Ordering::Acquire) {
            return Ok(false);
        }
        let a = self.volume.array();
        let writes = !self.read_only;
        let ticks = writes && (a.bitmap_state().0 != 0 || a.journal_status().is_some());
        let safe_mode = safe_mode.filter(|_| writes);
        let (vol, stop) = (self.volume.clone(), self.daemon_stop.clone());
        let t = spawn("uraid-bitmap", move || {
            let (mut slept, mut since_slow) = (Duration::ZERO, Duration::ZERO);
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(DAEMON_POLL);
                slept += DAEMON_POLL;
                since_slow += DAEMON_POLL;
                if since_slow >= SLOW_TICK {
                    since_slow = Duration::ZERO;
                    vol.array().slow_tick();
                }
                if ticks && slept >= crate::bitmap::BITMAP_TICK {
                    slept = Duration::ZERO;
                    futures::executor::block_on(vol.array().bitmap_tick());
                }
                if let Some(idle) = safe_mode {
                    let a = vol.array();
                    if a.is_dirty() && a.idle_for() >= idle && !a.needs_resync() {
                        futures::executor::block_on(a.safe_mode_tick(idle));
                    }
                }
            }
        })?;
        *slot = Some(t);
        Ok(true)
    }

    /// Starts a scrub in `mode`. Refused while one runs, on a degraded array, and on a
    /// read-only server.
    pub fn start_scrub(&self, mode: ScrubMode) -> Result<String, Refusal> {
        if self.read_only {
            // A check writes too: chunks it cannot read are rebuilt in place, and a stripe
            // not yet resynced is resynced first (md runs no check on a read-only array).
            return Err(Refusal::conflict(
                "the server is read-only: a scrub writes (it rewrites what it cannot read)",
            ));
        }
        let a = self.volume.array();
        let degraded = a.failed().union(
            a.rebuild_state()
                .iter()
                .map(|r| r.0)
                .collect::<uraid_core::MemberSet>(),
        );
        if !degraded.is_empty() {
            return Err(Refusal::conflict(format!(
                "the array is degraded (member(s) {degraded} missing, failed or rebuilding): \
                 scrub needs every member"
            )));
        }
        let mut slot = lock(&self.scrub);
        if self.stopped.load(Ordering::Acquire) {
            return Err(Refusal::stopping());
        }
        if slot.as_ref().is_some_and(Job::running) {
            return Err(Refusal::conflict(
                "a scrub is running: pause, resume or cancel it, or wait for it",
            ));
        }
        if let Some(j) = slot.take() {
            let _ = j.thread.join();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (vol, st) = (self.volume.clone(), stop.clone());
        a.scrub_pause(false);
        let thread = spawn("uraid-scrub", move || {
            if let Err(e) = futures::executor::block_on(vol.array().scrub_run(mode, &st)) {
                tracing::error!(target: "uraid_engine::recovery", "scrub ({}): {e}", mode.name());
            }
        })
        .map_err(|e| Refusal::internal(format!("starting the scrub thread: {e}")))?;
        *slot = Some(Job { stop, thread });
        Ok(format!("scrub ({}) started", mode.name()))
    }

    /// Pauses, resumes or cancels the running scrub.
    pub fn scrub_command(&self, cmd: ScrubCommand) -> Result<String, Refusal> {
        let slot = lock(&self.scrub);
        let Some(job) = slot.as_ref().filter(|j| j.running()) else {
            return Err(Refusal::conflict("no scrub is running"));
        };
        let a = self.volume.array();
        match cmd {
            ScrubCommand::Pause => a.scrub_pause(true),
            ScrubCommand::Resume => a.scrub_pause(false),
            ScrubCommand::Cancel => {
                job.stop.store(true, Ordering::Release);
                a.scrub_pause(false);
            }
        }
        Ok(format!("scrub {}: done", cmd.name()))
    }

    /// Starts the rebuild thread if members are to be rebuilt and none runs (at start, and
    /// after `add`). The rebuild picks up members added while it runs by itself. True if
    /// a rebuild runs.
    pub fn ensure_rebuild(&self) -> bool {
        let a = self.volume.array();
        if a.rebuild_state().is_empty() || self.read_only || self.stopped.load(Ordering::Acquire) {
            return false;
        }
        let mut slot = lock(&self.rebuild);
        if slot.as_ref().is_some_and(|t| !t.is_finished()) {
            return true;
        }
        let (vol, stop) = (self.volume.clone(), self.rebuild_stop.clone());
        match spawn("uraid-rebuild", move || {
            // Members added while a pass finished: go again until nothing is left.
            while !vol.array().rebuild_state().is_empty() && !stop.load(Ordering::Acquire) {
                if futures::executor::block_on(vol.array().rebuild(&stop)).is_err() {
                    break;
                }
            }
        }) {
            Ok(t) => {
                *slot = Some(t);
                true
            }
            Err(e) => {
                tracing::error!("starting the rebuild thread: {e}");
                false
            }
        }
    }

    /// Hot spares waiting (their device names).
    pub fn spare_names(&self) -> Vec<String> {
        lock(&self.spares)
            .iter()
            .map(|(d, _)| d.name().to_string())
            .collect()
    }

    /// Takes a spare (opened at start or added while serving) into the pool.
    pub fn add_spare(self: &Arc<Self>, dev: D, uuid: [u8; 16]) {
        lock(&self.spares).push((dev, uuid));
        self.watch_spares();
    }

    /// Starts the thread that puts a spare into the slot of a member that failed (every
    /// `SPARE_WATCH_EVERY`), if it is not running.
    fn watch_spares(self: &Arc<Self>) {
        let mut w = lock(&self.spare_watch);
        if w.as_ref().is_some_and(|t| !t.is_finished()) || self.read_only {
            return;
        }
        let me = Arc::downgrade(self);
        *w = spawn("uraid-spares", move || loop {
            std::thread::sleep(SPARE_WATCH_EVERY);
            let Some(s) = me.upgrade() else { return };
            if s.stopped.load(Ordering::Acquire) {
                return;
            }
            s.spare_tick();
        })
        .ok();
    }

    /// One look: a failed member and a spare waiting: the spare takes the slot.
    fn spare_tick(&self) {
        let a = self.volume.array();
        if a.failed().is_empty() || !a.is_serving() || !a.can_take_member() {
            return;
        }
        let _one = lock(&self.adding);
        // Again under the add lock: an operator's `add` may have filled the slot meanwhile
        // (the spare would be popped, refused and lost from the pool).
        if self.stopped.load(Ordering::Acquire)
            || a.failed().is_empty()
            || !a.is_serving()
            || !a.can_take_member()
        {
            return;
        }
        let Some((dev, uuid)) = lock(&self.spares).pop() else {
            return;
        };
        let name = dev.name().to_string();
        match futures::executor::block_on(self.volume.add_member(dev, uuid)) {
            Ok(slot) => {
                tracing::warn!("spare {name} takes over the slot of failed member {slot}");
                self.ensure_rebuild();
            }
            Err(e) => {
                tracing::error!("spare {name} could not take over a failed member: {e}");
                // It may have become a member before the error (the map rewrite).
                self.ensure_rebuild();
            }
        }
    }

    /// Takes the first spare whose name `same` accepts out of the pool.
    fn take_spare(&self, same: impl Fn(&str) -> bool) -> Option<D> {
        let mut spares = lock(&self.spares);
        let at = spares.iter().position(|(d, _)| same(d.name()));
        at.map(|k| spares.remove(k).0)
    }

    /// Puts `dev` in place of the lowest failed member (a former member: into its own
    /// slot) and starts its rebuild (caller holds the add lock). Returns the slot.
    fn add_member(&self, dev: D, uuid: [u8; 16]) -> Result<crate::Added, Refusal> {
        let r = futures::executor::block_on(self.volume.add_member_with(dev, uuid));
        // Also after a late error (the map rewrite): the member may be rebuilding already.
        self.ensure_rebuild();
        r.map_err(Refusal::conflict)
    }

    /// Starts replacing member `i` by `dev` while it serves (md's want_replacement): copied
    /// on its own thread; if the member fails meanwhile the device takes its slot and the
    /// rebuild starts. `open` (checks and opens the device) runs once no other replace of
    /// the slot runs (caller holds the add lock). Replaces of different slots run at once.
    fn start_replace(
        self: &Arc<Self>,
        i: usize,
        open: impl FnOnce() -> Result<D, Refusal>,
    ) -> Result<(), Refusal> {
        let mut jobs = lock(&self.replace);
        if self.stopped.load(Ordering::Acquire) {
            return Err(Refusal::stopping());
        }
        if jobs.iter().any(|(s, j)| *s == i && j.running()) {
            return Err(Refusal::conflict(format!(
                "member {i} is being replaced already: cancel that replace first (uraid \
                 replace {i} --cancel), or wait for it"
            )));
        }
        reap(&mut jobs);
        let dev = open()?;
        let uuid = assemble::new_device_uuid();
        futures::executor::block_on(self.volume.replace_member(i, dev, uuid))
            .map_err(Refusal::conflict)?;
        let job = self.replace_job(i)?;
        jobs.push((i, job));
        Ok(())
    }

    /// The thread that runs slot `i`'s replace (started or resumed) to its end.
    fn replace_job(self: &Arc<Self>, i: usize) -> Result<Job, Refusal> {
        let stop = Arc::new(AtomicBool::new(false));
        let (st, me, vol) = (stop.clone(), self.clone(), self.volume.clone());
        let v2 = vol.clone();
        let thread = spawn(&format!("uraid-replace{i}"), move || {
            let r = futures::executor::block_on(vol.replace_run_slot(
                i,
                &st,
                crate::recovery::REPLACE_PERSIST_EVERY,
            ));
            if let Err(e) = &r {
                tracing::error!(target: "uraid_engine::recovery", "replace of member {i}: {e}");
            }
            // Also after an error: the replacement may have taken a failed slot.
            me.ensure_rebuild();
        })
        .map_err(|e| {
            v2.array().abandon_replace_of(i);
            Refusal::internal(format!("starting the replace thread: {e}"))
        })?;
        Ok(Job { stop, thread })
    }

    /// At start, right after assembly (before anything is written): resumes each replace
    /// the superblocks recorded whose replacement was found (`found`: slot, device, its
    /// uuid), from its checkpoint, each on its own thread; drops the others (the members
    /// stay). Returns a line per replace for the operator.
    pub fn resume_replaces(self: &Arc<Self>, found: Vec<(usize, D, [u8; 16])>) -> Vec<String> {
        let mut said = Vec::new();
        let a = self.volume.array().clone();
        if self.read_only {
            for (i, _, _) in &found {
                said.push(format!(
                    "member {i}: its replace waits for a read-write start (read-only server)"
                ));
            }
            return said;
        }
        let _one = lock(&self.adding);
        let recorded = a.resumable_replaces();
        for (i, dev, uuid) in found {
            let name = dev.name().to_string();
            let at = recorded.iter().find(|r| r.0 == i).map_or(0, |r| r.2);
            let r = futures::executor::block_on(self.volume.resume_replace(i, dev, uuid));
            let job = r
                .map_err(Refusal::conflict)
                .and_then(|()| self.replace_job(i));
            match job {
                Ok(j) => {
                    lock(&self.replace).push((i, j));
                    said.push(format!(
                        "member {i}: its replace by {name} resumes ({at} of {} units were \
                         copied)",
                        a.geometry().units()
                    ));
                }
                Err(e) => said.push(format!(
                    "member {i}: its replace by {name} cannot resume: {e}; the member stays"
                )),
            }
        }
        for (i, uuid, copied) in a.resumable_replaces() {
            said.push(format!(
                "member {i}: its replace by device {} ({copied} units copied) is dropped: the \
                 replacement was not given; the member stays",
                uraid_core::format::uuid_string(&uuid)
            ));
        }
        futures::executor::block_on(a.drop_unresumed_replaces());
        said
    }

    /// Cancels every running replace (the members stay; the new devices are left unused).
    pub fn replace_cancel(&self) -> Result<String, Refusal> {
        self.replace_cancel_of(None)
    }

    /// Cancels the running replace of member `i` (every running one: None).
    pub fn replace_cancel_of(&self, i: Option<usize>) -> Result<String, Refusal> {
        let jobs = lock(&self.replace);
        let running: Vec<&(usize, Job)> = jobs
            .iter()
            .filter(|(s, j)| j.running() && i.is_none_or(|i| i == *s))
            .collect();
        if running.is_empty() {
            return Err(Refusal::conflict(match i {
                Some(i) => format!("no replace of member {i} is running"),
                None => "no replace is running".into(),
            }));
        }
        for (_, j) in &running {
            j.stop.store(true, Ordering::Release);
        }
        Ok(match i {
            Some(i) => format!("replace of member {i} cancelled"),
            None => "replace cancelled".into(),
        })
    }

    /// Fails member `i` (mdadm --fail).
    pub fn fail(&self, i: usize, force: bool) -> Result<String, Refusal> {
        if self.read_only {
            return Err(Refusal::conflict(
                "the server is read-only: failing a member writes",
            ));
        }
        let a = self.volume.array().clone();
        futures::executor::block_on(a.fail_by_operator(i, force)).map_err(Refusal::conflict)?;
        Ok(format!("member {i} marked failed"))
    }

    /// Stops everything and waits for it (server shutdown): the rebuild, resync and bitmap
    /// daemon, the spare watcher, a replace and a scrub; nothing starts afterwards.
    pub fn stop(&self) {
        self.rebuild_stop.store(true, Ordering::Release);
        let scrub = {
            let mut slot = lock(&self.scrub);
            self.stopped.store(true, Ordering::Release);
            slot.take()
        };
        // No spare takes a slot after this (it checks `stopped` under the add lock).
        drop(lock(&self.adding));
        let watcher = lock(&self.spare_watch).take();
        if let Some(t) = watcher {
            let _ = t.join();
        }
        // Replaces stopped now are kept for the next start (recorded with their checkpoint).
        self.volume.array().keep_replaces_on_stop();
        let replaces = std::mem::take(&mut *lock(&self.replace));
        for (_, j) in &replaces {
            j.stop.store(true, Ordering::Release);
        }
        for (_, j) in replaces {
            j.end();
        }
        let rebuild = lock(&self.rebuild).take();
        if let Some(t) = rebuild {
            let _ = t.join();
        }
        if let Some(j) = scrub {
            j.stop.store(true, Ordering::Release);
            self.volume.array().scrub_pause(false);
            let _ = j.thread.join();
        }
        self.daemon_stop.store(true, Ordering::Release);
        let threads = [lock(&self.resync).take(), lock(&self.bitmap_daemon).take()];
        for t in threads.into_iter().flatten() {
            let _ = t.join();
        }
    }
}

/// Commands that name devices by path (opened here as `FileDev`).
impl Supervisor<FileDev> {
    /// Adds the device at `path` in place of the lowest failed member (a former member:
    /// into its own slot, a re-add) and starts its rebuild (mdadm --add on a running
    /// array), or, with no member failed, as a hot spare.
    /// Refused: a read-only server, a device that holds a uraid superblock or journal
    /// (unless `force`), one in use.
    pub fn add(self: &Arc<Self>, path: &Path, force: bool) -> Result<String, Refusal> {
        if self.read_only {
            return Err(Refusal::conflict(
                "the server is read-only: adding a member writes",
            ));
        }
        let _one = lock(&self.adding);
        self.check_new_device(path, force)?;
        // The failed member's own device (mdadm --re-add): the slot lets go of it first, so
        // it can be opened (claimed) again.
        // Not a slot whose replace runs: its replacement may be taking it over right now.
        let a = self.volume.array();
        let replacing: Vec<usize> = lock(&self.replace)
            .iter()
            .filter(|(_, j)| j.running())
            .map(|(s, _)| *s)
            .collect();
        for i in a.failed().iter().filter(|i| !replacing.contains(i)) {
            if a.member_name(i)
                .is_some_and(|n| assemble::same_file(Path::new(n), path))
            {
                a.let_go_of_failed(i);
            }
        }
        let dev = open(path)?;
        let uuid = assemble::new_device_uuid();
        if self.volume.array().failed().is_empty() {
            return self.add_as_spare(path, dev, uuid);
        }
        let added = self.add_member(dev, uuid)?;
        let slot = added.slot;
        Ok(match added.readd {
            Some(units) => format!(
                "{} re-added as member {slot} (its former slot): {units} of {} units lie in \
                 write-intent regions written since it left and are rebuilt; it holds the rest",
                path.display(),
                self.volume.geometry().units()
            ),
            None => format!(
                "{} added as member {slot}; it is being rebuilt",
                path.display()
            ),
        })
    }

    /// Refuses (without `force`) a device holding a uraid superblock or journal, except a
    /// former member of this array (failed, replaced or removed): it comes back into its own
    /// slot if that still names it (re-add: its data outside the dirty write-intent regions
    /// kept, recovery/readd.rs), else as a new member, its old data never used.
    fn check_new_device(&self, path: &Path, force: bool) -> Result<(), Refusal> {
        if force {
            return Ok(());
        }
        if let Ok(sb) = assemble::read_superblock(path) {
            let a = self.volume.array();
            let now = futures::executor::block_on(a.superblock());
            let former = sb.array_uuid == now.array_uuid
                && !sb.spare
                && (a.is_failed(sb.index) || now.slot_uuids.get(sb.index) != Some(&sb.device_uuid));
            if former {
                return Ok(());
            }
            return Err(Refusal::conflict(format!(
                "{} holds a uraid superblock (array '{}', member {}); --force overwrites it",
                path.display(),
                sb.name,
                sb.index
            )));
        }
        if assemble::read_journal_super(path).is_ok() {
            return Err(Refusal::conflict(format!(
                "{} holds a uraid journal; --force overwrites it",
                path.display()
            )));
        }
        Ok(())
    }

    /// `add` with no member failed: `dev` gets a spare superblock and joins the pool.
    fn add_as_spare(
        self: &Arc<Self>,
        path: &Path,
        dev: FileDev,
        uuid: [u8; 16],
    ) -> Result<String, Refusal> {
        use std::os::unix::fs::FileExt;
        let g = *self.volume.geometry();
        if g.fault_tolerance() == 0 {
            return Err(Refusal::conflict(format!(
                "{} has no redundancy: a spare could never be rebuilt",
                g.level
            )));
        }
        let sb = futures::executor::block_on(self.volume.array().superblock());
        let need = sb.data_offset + g.member_data;
        if dev.size() < need {
            return Err(Refusal::conflict(format!(
                "{}: too small ({} bytes, needs {need})",
                path.display(),
                dev.size()
            )));
        }
        let sb = assemble::spare_superblock(&sb, uuid);
        let write = || -> std::io::Result<()> {
            let f = std::fs::OpenOptions::new().write(true).open(path)?;
            for s in 0..uraid_core::format::SB_SLOTS {
                f.write_all_at(&sb.encode(), (s * uraid_core::format::SB_SIZE) as u64)?;
            }
            f.sync_all()
        };
        write().map_err(|e| {
            Refusal::conflict(format!(
                "{}: writing its spare superblock: {e}",
                path.display()
            ))
        })?;
        self.add_spare(dev, uuid);
        Ok(format!("{} added as a hot spare", path.display()))
    }

    /// Starts replacing member `i` by the device at `path` while it serves (module docs of
    /// recovery/replace.rs).
    pub fn replace(
        self: &Arc<Self>,
        i: usize,
        path: &Path,
        force: bool,
    ) -> Result<String, Refusal> {
        if self.read_only {
            return Err(Refusal::conflict(
                "the server is read-only: replacing writes",
            ));
        }
        let _one = lock(&self.adding);
        self.start_replace(i, || {
            self.check_new_device(path, force)?;
            open(path)
        })?;
        Ok(format!(
            "replacing member {i} by {} (copied while it serves; uraid status shows progress)",
            path.display()
        ))
    }

    /// Removes member `i` (failing it first if it is active), or the hot spare at a path
    /// (its superblocks erased). Under the add lock: no spare takes the slot between the
    /// failure and the removal.
    pub fn remove(&self, what: Removal, force: bool) -> Result<String, Refusal> {
        if self.read_only {
            return Err(Refusal::conflict(
                "the server is read-only: removing writes",
            ));
        }
        let _one = lock(&self.adding);
        match what {
            Removal::Member(i) => {
                let a = self.volume.array().clone();
                futures::executor::block_on(a.remove_member(i, force)).map_err(Refusal::conflict)
            }
            Removal::Spare(path) => {
                let Some(dev) = self.take_spare(|d| assemble::same_file(Path::new(d), &path))
                else {
                    return Err(Refusal::conflict(format!(
                        "{} is not a spare of this server",
                        path.display()
                    )));
                };
                drop(dev);
                assemble::erase_superblocks(&path).map_err(|e| {
                    Refusal::internal(format!(
                        "spare {} set aside, but erasing it: {e}",
                        path.display()
                    ))
                })?;
                tracing::warn!("spare {} removed", path.display());
                Ok(format!("spare {} removed", path.display()))
            }
        }
    }
}

/// Opens a new device for the array (exclusively; refused if in use).
fn open(path: &Path) -> Result<FileDev, Refusal> {
    FileDev::open(path).map_err(|e| Refusal::conflict(format!("{}: {e}", path.display())))
}
