//! Operator commands a running server carries out for the control socket (`POST`):
//! scrub start/pause/resume/cancel and failing a member. Each runs off the control
//! connection's thread: a scrub on its own thread (like resync and rebuild), a member
//! failure on a reactor (its superblock round gets member timeouts).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use uraid_engine::{FileDev, ScrubMode, Volume};

/// What `remove` removes: a member slot, or a hot spare by path.
pub enum Removal {
    Member(usize),
    Spare(std::path::PathBuf),
}

/// A command's refusal: HTTP status and message.
pub type Refusal = (u16, String);

pub struct Jobs {
    volume: Arc<Volume<FileDev>>,
    read_only: bool,
    scrub: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
    rebuild: Mutex<Option<JoinHandle<()>>>,
    /// The running replace's thread and its stop flag.
    replace: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
    rebuild_stop: Arc<AtomicBool>,
    /// Serialises `add` (one device at a time into the lowest failed slot).
    adding: Mutex<()>,
    /// Hot spares: opened, waiting for a member to fail (`spare_watch`).
    spares: Mutex<Vec<(FileDev, [u8; 16])>>,
    spare_watch: Mutex<Option<JoinHandle<()>>>,
    /// Set by `stop` (under the scrub lock): nothing starts afterwards.
    stopped: AtomicBool,
}

impl Jobs {
    pub fn new(volume: Arc<Volume<FileDev>>, read_only: bool) -> Jobs {
        Jobs {
            volume,
            read_only,
            scrub: Mutex::new(None),
            rebuild: Mutex::new(None),
            replace: Mutex::new(None),
            rebuild_stop: Arc::new(AtomicBool::new(false)),
            adding: Mutex::new(()),
            spares: Mutex::new(Vec::new()),
            spare_watch: Mutex::new(None),
            stopped: AtomicBool::new(false),
        }
    }

    fn scrub_slot(&self) -> std::sync::MutexGuard<'_, Option<(Arc<AtomicBool>, JoinHandle<()>)>> {
        self.scrub.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a scrub in `mode`. Refused while one runs, on a degraded array, and (repair)
    /// on a read-only server.
    pub fn start_scrub(&self, mode: ScrubMode) -> Result<String, Refusal> {
        if mode == ScrubMode::Repair && self.read_only {
            return Err((409, "the server is read-only: scrub repair writes".into()));
        }
        let a = self.volume.array();
        let degraded = a.failed().union(
            a.rebuild_state()
                .iter()
                .map(|r| r.0)
                .collect::<uraid_core::MemberSet>(),
        );
        if !degraded.is_empty() {
            return Err((
                409,
                format!(
                    "the array is degraded (member(s) {degraded} missing, failed or rebuilding): \
                     scrub needs every member"
                ),
            ));
        }
        let mut slot = self.scrub_slot();
        if self.stopped.load(Ordering::Acquire) {
            return Err((503, "the server is stopping".into()));
        }
        if slot.as_ref().is_some_and(|(_, t)| !t.is_finished()) {
            return Err((
                409,
                "a scrub is running: pause, resume or cancel it, or wait for it".into(),
            ));
        }
        if let Some((_, t)) = slot.take() {
            let _ = t.join();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (vol, st) = (self.volume.clone(), stop.clone());
        a.scrub_pause(false);
        let t = std::thread::Builder::new()
            .name("uraid-scrub".into())
            .spawn(move || {
                if let Err(e) = futures::executor::block_on(vol.array().scrub_run(mode, &st))
                {
                    tracing::error!(target: "uraid_engine::recovery", "scrub ({}): {e}", mode.name());
                }
            })
            .map_err(|e| (500, format!("starting the scrub thread: {e}")))?;
        *slot = Some((stop, t));
        Ok(format!("scrub ({}) started", mode.name()))
    }

    /// Pauses, resumes or cancels the running scrub.
    pub fn scrub_command(&self, cmd: &str) -> Result<String, Refusal> {
        let slot = self.scrub_slot();
        let Some((stop, t)) = slot.as_ref().filter(|(_, t)| !t.is_finished()) else {
            return Err((409, "no scrub is running".into()));
        };
        let _ = t;
        let a = self.volume.array();
        match cmd {
            "pause" => a.scrub_pause(true),
            "resume" => a.scrub_pause(false),
            "cancel" => {
                stop.store(true, Ordering::Release);
                a.scrub_pause(false);
            }
            _ => return Err((404, format!("no scrub command {cmd:?}"))),
        }
        Ok(format!("scrub {cmd}: done"))
    }

    /// Starts the rebuild thread if members are to be rebuilt and none runs (at start, and
    /// after `add`). The rebuild picks up members added while it runs by itself.
    pub fn ensure_rebuild(&self) -> bool {
        let a = self.volume.array();
        if a.rebuild_state().is_empty() || self.read_only || self.stopped.load(Ordering::Acquire) {
            return false;
        }
        let mut slot = self.rebuild.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|t| !t.is_finished()) {
            return true;
        }
        let (vol, stop) = (self.volume.clone(), self.rebuild_stop.clone());
        match std::thread::Builder::new()
            .name("uraid-rebuild".into())
            .spawn(move || {
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

    /// Hot spares waiting (their device paths).
    pub fn spare_paths(&self) -> Vec<String> {
        use uraid_engine::BlockDev;
        self.spares
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(d, _)| d.name().to_string())
            .collect()
    }

    /// Takes a spare (opened at start or added while serving) into the pool.
    pub fn add_spare_dev(self: &Arc<Self>, dev: FileDev, uuid: [u8; 16]) {
        self.spares
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dev, uuid));
        self.watch_spares();
    }

    /// Starts the thread that puts a spare into the slot of a member that failed (every
    /// 200 ms), if it is not running.
    fn watch_spares(self: &Arc<Self>) {
        let mut w = self.spare_watch.lock().unwrap_or_else(|e| e.into_inner());
        if w.as_ref().is_some_and(|t| !t.is_finished()) || self.read_only {
            return;
        }
        let me = Arc::downgrade(self);
        *w = std::thread::Builder::new()
            .name("uraid-spares".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_millis(200));
                let Some(j) = me.upgrade() else { return };
                if j.stopped.load(Ordering::Acquire) {
                    return;
                }
                j.spare_tick();
            })
            .ok();
    }

    /// One look: a failed member and a spare waiting: the spare takes the slot.
    fn spare_tick(&self) {
        let a = self.volume.array();
        if a.failed().is_empty() || !a.is_serving() || !a.can_take_member() {
            return;
        }
        let _one = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        let Some((dev, uuid)) = self.spares.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
            return;
        };
        use uraid_engine::BlockDev;
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

    /// Adds the device at `path` in place of the lowest failed member and starts its
    /// rebuild (mdadm --add on a running array), or, with no member failed, as a hot spare.
    /// Refused: a read-only server, a device that holds a uraid superblock or journal
    /// (unless `force`), one in use.
    pub fn add(self: &Arc<Self>, path: &std::path::Path, force: bool) -> Result<String, Refusal> {
        if self.read_only {
            return Err((
                409,
                "the server is read-only: adding a member writes".into(),
            ));
        }
        let _one = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        self.check_new_device(path, force)?;
        self.add_checked(path)
    }

    /// Refuses (without `force`) a device holding a uraid superblock or journal, except a
    /// former member of this array (failed, replaced or removed): it comes back as a new
    /// member, its old data never used.
    fn check_new_device(&self, path: &std::path::Path, force: bool) -> Result<(), Refusal> {
        if !force {
            if let Ok(sb) = uraid_engine::assemble::read_superblock(path) {
                let a = self.volume.array();
                let now = futures::executor::block_on(a.superblock());
                let former = sb.array_uuid == now.array_uuid
                    && !sb.spare
                    && (a.is_failed(sb.index)
                        || now.slot_uuids.get(sb.index) != Some(&sb.device_uuid));
                if former {
                    return Ok(());
                }
                return Err((
                    409,
                    format!(
                        "{} holds a uraid superblock (array '{}', member {}); force=1 \
                         overwrites it",
                        path.display(),
                        sb.name,
                        sb.index
                    ),
                ));
            }
            if uraid_engine::assemble::read_journal_super(path).is_ok() {
                return Err((
                    409,
                    format!(
                        "{} holds a uraid journal; force=1 overwrites it",
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Starts replacing member `i` by the device at `path` while it serves (md's
    /// want_replacement): copied in the background on its own thread; if the member fails
    /// meanwhile the device takes its slot and the rebuild starts.
    pub fn replace(
        self: &Arc<Self>,
        i: usize,
        path: &std::path::Path,
        force: bool,
    ) -> Result<String, Refusal> {
        if self.read_only {
            return Err((409, "the server is read-only: replacing writes".into()));
        }
        let _one = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        let mut slot = self.replace.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::Acquire) {
            return Err((503, "the server is stopping".into()));
        }
        if slot.as_ref().is_some_and(|(_, t)| !t.is_finished()) {
            return Err((
                409,
                "a replace is running: one at a time (cancel it, or wait for it)".into(),
            ));
        }
        if let Some((_, t)) = slot.take() {
            let _ = t.join();
        }
        self.check_new_device(path, force)?;
        let dev = FileDev::open(path).map_err(|e| (409, format!("{}: {e}", path.display())))?;
        let uuid = uraid_engine::assemble::new_device_uuid();
        let vol = self.volume.clone();
        futures::executor::block_on(vol.replace_member(i, dev, uuid)).map_err(|e| (409, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (st, me, v2) = (stop.clone(), self.clone(), vol.clone());
        let t = std::thread::Builder::new()
            .name("uraid-replace".into())
            .spawn(move || {
                let r = futures::executor::block_on(vol.replace_run(&st));
                if let Err(e) = &r {
                    tracing::error!(target: "uraid_engine::recovery", "replace: {e}");
                }
                // Also after an error: the replacement may have taken a failed slot.
                me.ensure_rebuild();
            })
            .map_err(|e| {
                v2.array().abandon_replace();
                (500, format!("starting the replace thread: {e}"))
            })?;
        *slot = Some((stop, t));
        Ok(format!(
            "replacing member {i} by {} (copied while it serves; uraid status shows progress)",
            path.display()
        ))
    }

    /// Cancels the running replace (the member stays; the new device is left unused).
    pub fn replace_cancel(&self) -> Result<String, Refusal> {
        let slot = self.replace.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref().filter(|(_, t)| !t.is_finished()) {
            Some((stop, _)) => {
                stop.store(true, Ordering::Release);
                Ok("replace cancelled".into())
            }
            None => Err((409, "no replace is running".into())),
        }
    }

    /// `add` once the device's contents were checked (caller holds the add lock).
    fn add_checked(self: &Arc<Self>, path: &std::path::Path) -> Result<String, Refusal> {
        let dev = FileDev::open(path).map_err(|e| (409, format!("{}: {e}", path.display())))?;
        let uuid = uraid_engine::assemble::new_device_uuid();
        let vol = self.volume.clone();
        if vol.array().failed().is_empty() {
            return self.add_as_spare(path, dev, uuid);
        }
        let r = futures::executor::block_on(vol.add_member(dev, uuid));
        // Also after a late error (the map rewrite): the member may be rebuilding already.
        self.ensure_rebuild();
        let slot = r.map_err(|e| (409, e))?;
        Ok(format!(
            "{} added as member {slot}; it is being rebuilt",
            path.display()
        ))
    }

    fn add_as_spare(
        self: &Arc<Self>,
        path: &std::path::Path,
        dev: FileDev,
        uuid: [u8; 16],
    ) -> Result<String, Refusal> {
        use std::os::unix::fs::FileExt;
        use uraid_engine::BlockDev;
        let g = *self.volume.geometry();
        if g.fault_tolerance() == 0 {
            return Err((
                409,
                format!(
                    "{} has no redundancy: a spare could never be rebuilt",
                    g.level
                ),
            ));
        }
        let sb = futures::executor::block_on(self.volume.array().superblock());
        let need = sb.data_offset + g.member_data;
        if dev.size() < need {
            return Err((
                409,
                format!(
                    "{}: too small ({} bytes, needs {need})",
                    path.display(),
                    dev.size()
                ),
            ));
        }
        let sb = uraid_engine::assemble::spare_superblock(&sb, uuid);
        let write = || -> std::io::Result<()> {
            let f = std::fs::OpenOptions::new().write(true).open(path)?;
            for s in 0..uraid_core::format::SB_SLOTS {
                f.write_all_at(&sb.encode(), (s * uraid_core::format::SB_SIZE) as u64)?;
            }
            f.sync_all()
        };
        write().map_err(|e| {
            (
                409,
                format!("{}: writing its spare superblock: {e}", path.display()),
            )
        })?;
        self.add_spare_dev(dev, uuid);
        Ok(format!("{} added as a hot spare", path.display()))
    }

    /// Fails member `i` (mdadm --fail).
    pub fn fail(&self, i: usize, force: bool) -> Result<String, Refusal> {
        if self.read_only {
            return Err((
                409,
                "the server is read-only: failing a member writes".into(),
            ));
        }
        let a = self.volume.array().clone();
        futures::executor::block_on(a.fail_by_operator(i, force)).map_err(|e| (409, e))?;
        Ok(format!("member {i} marked failed"))
    }

    /// Removes member `i` (failing it first if it is active), or with `spare` the hot spare
    /// at that path (its superblocks erased). Under the add lock: no spare takes the slot
    /// between the failure and the removal.
    pub fn remove(&self, what: Removal, force: bool) -> Result<String, Refusal> {
        if self.read_only {
            return Err((409, "the server is read-only: removing writes".into()));
        }
        let _one = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        match what {
            Removal::Member(i) => {
                let a = self.volume.array().clone();
                futures::executor::block_on(a.remove_member(i, force)).map_err(|e| (409, e))
            }
            Removal::Spare(path) => {
                use uraid_engine::BlockDev;
                let taken = {
                    let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
                    let at = spares.iter().position(|(d, _)| {
                        uraid_engine::assemble::same_file(std::path::Path::new(d.name()), &path)
                    });
                    at.map(|k| spares.remove(k))
                };
                let Some((dev, _)) = taken else {
                    return Err((
                        409,
                        format!("{} is not a spare of this server", path.display()),
                    ));
                };
                drop(dev);
                uraid_engine::assemble::erase_superblocks(&path).map_err(|e| {
                    (
                        500,
                        format!("spare {} set aside, but erasing it: {e}", path.display()),
                    )
                })?;
                tracing::warn!("spare {} removed", path.display());
                Ok(format!("spare {} removed", path.display()))
            }
        }
    }

    /// Stops a running scrub and waits for it (server shutdown).
    pub fn stop(&self) {
        self.rebuild_stop.store(true, Ordering::Release);
        let taken = {
            let mut slot = self.scrub_slot();
            self.stopped.store(true, Ordering::Release);
            slot.take()
        };
        // No spare takes a slot after this (it checks `stopped` under the add lock).
        drop(self.adding.lock().unwrap_or_else(|e| e.into_inner()));
        let watcher = self
            .spare_watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = watcher {
            let _ = t.join();
        }
        let replace = {
            let mut slot = self.replace.lock().unwrap_or_else(|e| e.into_inner());
            slot.take()
        };
        if let Some((stop, t)) = replace {
            stop.store(true, Ordering::Release);
            let _ = t.join();
        }
        let rebuild = self
            .rebuild
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = rebuild {
            let _ = t.join();
        }
        if let Some((stop, t)) = taken {
            stop.store(true, Ordering::Release);
            self.volume.array().scrub_pause(false);
            let _ = t.join();
        }
    }
}
