//! Replace: a new device takes an active member's place while the member keeps serving
//! (`uraid replace`, md's want_replacement). The data is copied from the member itself, so
//! the array never loses redundancy on the way, unlike fail + add.
//!
//! Rules (docs/invariants.md, "A replacement holds no member superblock before
//! its swap", "A resumed replace trusts its replacement only below a durable checkpoint"):
//! * From the start every write and flush of the slot goes to both devices (`Members`:
//!   the slot's (current, replacement) generations are one word, so an I/O sees a
//!   consistent pair); reads use the old device only. Superblocks go to the old device
//!   only: the replacement claims nothing until the swap.
//! * At the start the replacement's metadata area is zeroed, its replacement superblock
//!   (FLAG_REPLACEMENT: never taken for a member) written and flushed; a round records the
//!   replace (slot, its uuid, copy checkpoint 0); then every bitmap and allocation-map page
//!   is rewritten (to every member, so to the replacement too).
//! * The walk copies each unit's chunk of the slot under the unit's stripe lock: read from
//!   the old device; a chunk it cannot read is reconstructed from the rest of the stripe
//!   (the old device's read-error budget applies as for any read).
//! * The swap: the replacement is flushed (and every member: a unit skipped as a hole is
//!   one only once its map clear is durable everywhere), then one superblock round names
//!   it in the slot (its own superblock written to it in that round), then in one store it becomes the
//!   slot's device and the old one is no longer written. A crash before the round finds
//!   the old member complete (it got every write); a torn round leaves the slot either
//!   with the old member or with the new one, which holds everything. The old device is
//!   refused afterwards (its uuid is no longer the slot's).
//! * Units with nothing allocated are skipped, as the rebuild does.
//! * The copy checkpoint is persisted every `PERSIST_EVERY` (replacement flushed, then
//!   every member, then a round), and when the server stops (`keep_replaces_on_stop`).
//!   At the next start the replace resumes with its replacement (`resume_replace`): the walk covers the units
//!   from the checkpoint and, after an unclean stop, those below it resync owes (everything
//!   with a journal), never trusting the replacement beyond that. A recorded replace whose
//!   replacement is not given is dropped in a round (`drop_unresumed_replaces`); a record
//!   whose replacement was dropped is cleared before a write it missed is acknowledged
//!   (`Metadata::failure_barrier`).
//! * Replaces of different slots run at once (each its own walk and progress); a second
//!   replace of a slot is refused while one runs.
//! * The old member failing during the replace (an error, `uraid fail`) makes the
//!   replacement the slot's new device, rebuilt from unit 0 like an added member (writes
//!   while the slot was failed did not reach it). The replacement failing ends the replace;
//!   the member stays.

use super::walk::{self, After, At, Units, Walk, Worker};
use crate::array::{Array, ArrayError};
use crate::background::{Progress, Replacing, Resumable};
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::metadata::Swap;
use crate::stripe::Attempt;
use futures::future::join_all;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::format::{SB_SIZE, SB_SLOTS};
use uraid_core::geometry::Role;

/// How often a running replace persists its copy checkpoint.
pub const PERSIST_EVERY: Duration = Duration::from_secs(2);

/// How a replace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceOutcome {
    /// The new device is the slot's member; the old one is out.
    Replaced { slot: usize },
    /// Stopped (`stop`): the replacement was dropped, the member stays.
    Cancelled { slot: usize },
    /// Stopped with the server (`Array::keep_replaces_on_stop`): the copy checkpoint is
    /// recorded and the replacement stays attached until the array closes; the replace
    /// resumes at the next start if the replacement is given.
    Stopped { slot: usize },
    /// The old member failed meanwhile: the new device is the slot's member now, being
    /// rebuilt (the caller starts the rebuild and rewrites the map pages).
    Rebuilding { slot: usize },
}

impl<D: BlockDev> Array<D> {
    /// The replaces under way (their replacement still attached): the latest last.
    fn current_replaces(&self) -> Vec<Replacing> {
        self.recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|r| self.replacement_is(r))
            .cloned()
            .collect()
    }

    /// The member being replaced last started, with its replacement's name.
    pub fn replace_state(&self) -> Option<(usize, String)> {
        self.replace_states().pop()
    }

    /// Every member being replaced, with its replacement's name (the latest last).
    pub fn replace_states(&self) -> Vec<(usize, String)> {
        self.current_replaces()
            .into_iter()
            .filter_map(|r| {
                let (_, name) = self.members().replacement(r.slot)?;
                Some((r.slot, name.to_string()))
            })
            .collect()
    }

    /// Drops the replace started last if its replacement is still attached (an error
    /// before its walk could run): the member stays.
    pub fn abandon_replace(&self) {
        if let Some(r) = self.current_replaces().pop() {
            self.abandon_replace_of(r.slot);
        }
    }

    /// Drops the replace of slot `i` if its replacement is still attached: the member stays.
    pub fn abandon_replace_of(&self, i: usize) {
        let gen = self.replacing_of(i).map(|r| r.gen);
        if let Some(gen) = gen {
            if self.members().drop_replacement(i, gen) {
                tracing::warn!("member {i}: replace abandoned; the member stays");
            }
        }
    }

    /// The replace of slot `i`, if one was started and its replacement is attached.
    fn replacing_of(&self, i: usize) -> Option<Replacing> {
        self.current_replaces().into_iter().find(|r| r.slot == i)
    }

    /// The server is stopping: replace walks stopped from now on keep their replace for the
    /// next start (`ReplaceOutcome::Stopped`) instead of dropping it.
    pub fn keep_replaces_on_stop(&self) {
        self.recovery()
            .replace_keep
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Progress of the replace started last (running or ended).
    pub fn replace_progress(&self) -> crate::recovery::ProgressView {
        let last = self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .map_or(0, |r| r.slot);
        self.replace_progress_of(last)
    }

    /// Progress of slot `i`'s running (or last) replace.
    pub fn replace_progress_of(&self, i: usize) -> crate::recovery::ProgressView {
        self.recovery().replace_progress[i].view()
    }

    /// Starts replacing active member `i` by `dev` (module docs): checks, zeroes `dev`'s
    /// metadata area, gives it its replacement superblock, attaches it as the slot's
    /// replacement, records the replace in the superblocks and rewrites the bitmap pages.
    /// The caller rewrites the allocation-map pages (`Volume::replace_member`) and then
    /// runs `replace_run_slot`.
    pub async fn start_replace(
        self: &Arc<Self>,
        i: usize,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<(), String> {
        self.check_replace(i, &dev)?;
        self.on_reactor(move |a| async move { a.start_replace_here(i, dev, uuid, None).await })
            .await
            .unwrap_or_else(|| Err("the server is stopping".into()))
    }

    /// The replaces the superblocks recorded at assembly, waiting for their replacement:
    /// (slot, the replacement's device uuid, its checkpoint).
    pub fn resumable_replaces(&self) -> Vec<(usize, [u8; 16], u64)> {
        self.recovery()
            .replace_resume
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|r| (r.slot, r.uuid, r.copied))
            .collect()
    }

    /// Resumes the replace of slot `i` the superblocks recorded (after a restart), with its
    /// replacement `dev` (device `uuid`, found at assembly): as `start_replace`, except that
    /// the copy walks only the units its checkpoint does not cover (and, after an unclean
    /// stop, those below it resync owes), and that checkpoint is recorded again at once.
    /// Right after assembly, before anything is written. The caller rewrites the map pages
    /// and runs `replace_run_slot`.
    pub async fn resume_replace(
        self: &Arc<Self>,
        i: usize,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<(), String> {
        let r = {
            let mut v = self
                .recovery()
                .replace_resume
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let k = v
                .iter()
                .position(|r| r.slot == i && r.uuid == uuid)
                .ok_or_else(|| format!("member {i}: no replace by this device is recorded"))?;
            v.remove(k)
        };
        if self.members().is_failed(i) || self.members().device(i).is_none() {
            return Err(format!(
                "member {i} is failed or missing: its replace by {} is dropped (add the device \
                 to rebuild the slot)",
                dev.name()
            ));
        }
        self.check_replace(i, &dev)?;
        self.on_reactor(move |a| async move { a.start_replace_here(i, dev, uuid, Some(r)).await })
            .await
            .unwrap_or_else(|| Err("the server is stopping".into()))
    }

    /// Drops every recorded replace not resumed (its replacement was not given, or could not
    /// be opened): logged, and cleared from the superblocks in a round; the members stay.
    pub async fn drop_unresumed_replaces(self: &Arc<Self>) {
        let left: Vec<_> = std::mem::take(
            &mut *self
                .recovery()
                .replace_resume
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for r in &left {
            tracing::warn!(
                "member {}: its replace by device {} ({} of {} units copied) is dropped: the \
                 replacement was not given; the member stays",
                r.slot,
                uraid_core::format::uuid_string(&r.uuid),
                r.copied,
                self.geo().units()
            );
        }
        self.on_reactor(|a| async move { a.meta().drop_unattached_replaces(a.members()).await })
            .await;
    }

    /// The checks of a replace that need no lock.
    fn check_replace(&self, i: usize, dev: &D) -> Result<(), String> {
        let g = self.geo();
        if i >= g.members {
            return Err(format!("no member {i}: the array has {}", g.members));
        }
        if g.fault_tolerance() == 0 {
            return Err(format!(
                "{} has no redundancy: a chunk the member cannot read could not be rebuilt \
                 (copy the volume instead)",
                g.level
            ));
        }
        self.check_new_size(dev)?;
        if self.meta_frozen() {
            return Err("the array's metadata is read-only".into());
        }
        Ok(())
    }

    /// Why member `i` cannot be replaced now, if it cannot.
    fn replace_refusal(&self, i: usize) -> Option<String> {
        if self.members().is_failed(i) {
            return Some(format!(
                "member {i} is failed or missing: add a device instead (uraid add)"
            ));
        }
        if self.members().rebuilding().contains(i) {
            return Some(format!(
                "member {i} is being rebuilt: it does not hold all of its data yet"
            ));
        }
        if let Some((_, name)) = self.members().replacement(i) {
            return Some(format!(
                "member {i} is being replaced already (by {name}): cancel that replace first \
                 (uraid replace {i} --cancel), or wait for it"
            ));
        }
        if !self.members().can_install(i) {
            return Some(format!(
                "slot {i} was given {} devices this session already; restart the server first",
                crate::members::MAX_GENERATIONS - 1
            ));
        }
        None
    }

    /// The replacement superblock of device `uuid` for slot `i` (FLAG_REPLACEMENT, a copy of
    /// the array's), in both superblock slots.
    async fn replacement_superblocks(&self, i: usize, uuid: [u8; 16]) -> IoBuf {
        let mut sb = self.superblock().await;
        sb.index = i;
        sb.device_uuid = uuid;
        sb.spare = false;
        sb.replacement = true;
        let block = sb.encode();
        let mut b = buf::alloc(SB_SIZE * SB_SLOTS);
        for s in 0..SB_SLOTS {
            b[s * SB_SIZE..(s + 1) * SB_SIZE].copy_from_slice(&block);
        }
        b
    }

    async fn start_replace_here(
        &self,
        i: usize,
        dev: D,
        uuid: [u8; 16],
        resume: Option<Resumable>,
    ) -> Result<(), String> {
        let name = dev.name().to_string();
        // Checked first (a refused replace writes nothing to the device), then the device's
        // metadata area cleared and its replacement superblock written before the
        // superblock lock (a hanging new device must not hold it), then checked again
        // under the lock: no add, fail round or other replace of the slot interleaves.
        self.replace_refusal(i).map_or(Ok(()), Err)?;
        self.clear_metadata_area(&dev).await?;
        let sbs = self.replacement_superblocks(i, uuid).await;
        let (r, _) = dev.write(0, sbs).await;
        r.and(dev.flush().await)
            .map_err(|e| format!("{name}: writing its replacement superblock: {e}"))?;
        let mut meta = self.meta().lock().await;
        self.replace_refusal(i).map_or(Ok(()), Err)?;
        let units = self.geo().units();
        // A resumed replace trusts its checkpoint only while the superblocks still record
        // it (a round that ran meanwhile without the replacement attached cleared it: a
        // write may have reached the member alone), else it copies everything again.
        let (walk, from) = match &resume {
            Some(r) if meta.replace_record(i).is_some_and(|x| x.uuid == uuid) => {
                (r.units.clone(), r.first())
            }
            _ => {
                self.meta()
                    .clear_stale_replace(self.members(), &mut meta, i)
                    .await;
                (std::iter::once(0..units).collect(), 0)
            }
        };
        if self.members().set_replacement(i, dev).is_err() {
            return Err(format!("slot {i}: no room for another device"));
        }
        let gen = self.members().generation_top(i);
        {
            let mut v = self
                .recovery()
                .replacing
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            v.retain(|r| r.slot != i);
            v.push(Replacing {
                slot: i,
                gen,
                uuid,
                units: walk,
            });
        }
        drop(meta);
        match resume {
            Some(r) => tracing::warn!(
                "member {i} ({}): its replace by {name} resumes at unit {from} of {units} (the \
                 superblocks recorded {} copied)",
                self.members().name(i).unwrap_or("?"),
                r.copied
            ),
            None => tracing::warn!(
                "member {i} ({}): being replaced by {name} (copied while it serves)",
                self.members().name(i).unwrap_or("?")
            ),
        }
        self.intent().sync_all(self.meta(), self.members()).await;
        if !self
            .meta()
            .record_replace(self.members(), i, gen, uuid, from)
            .await
        {
            return Err(format!(
                "{name}: writing its metadata failed; replace abandoned"
            ));
        }
        Ok(())
    }

    /// Copies the member being replaced (the replace started last) onto its replacement
    /// and swaps it in (`replace_run_slot`).
    pub async fn replace_run(
        self: &Arc<Self>,
        stop: &AtomicBool,
    ) -> Result<ReplaceOutcome, ArrayError> {
        let Some(r) = self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .cloned()
        else {
            return Err(ArrayError::Refused("no replace was started".into()));
        };
        self.replace_run_slot(r.slot, stop, PERSIST_EVERY).await
    }

    /// Copies member `i` onto its replacement (from the start, or for a resumed replace the
    /// units its checkpoint does not cover) and swaps it in (module docs), persisting the
    /// copy checkpoint every `persist_every` (tests: after every batch); `stop` cancels.
    /// Runs on any thread (the server gives each replace its own).
    pub async fn replace_run_slot(
        self: &Arc<Self>,
        i: usize,
        stop: &AtomicBool,
        persist_every: Duration,
    ) -> Result<ReplaceOutcome, ArrayError> {
        let Some(r) = self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rfind(|r| r.slot == i)
            .cloned()
        else {
            return Err(ArrayError::Refused(format!(
                "no replace of member {i} was started"
            )));
        };
        let units = self.geo().units();
        let walk_units = Units::new(r.units.clone());
        let mut w = CopyWalk {
            name: self.identity().0.to_string(),
            r,
            units,
            t0: Instant::now(),
            persist_every,
            last_persist: Instant::now(),
            covered: 0,
        };
        walk::run(self, &mut w, walk_units, stop).await
    }

    /// Persists slot `r.slot`'s copy checkpoint `covered`: the replacement flushed first
    /// (everything copied or written below it is durable), then a round.
    async fn persist_copy_checkpoint(self: &Arc<Self>, r: &Replacing, covered: u64) {
        let (i, gen, uuid) = (r.slot, r.gen, r.uuid);
        self.on_reactor(move |a| async move {
            if let Err(e) = a.members().flush_gen(i, gen).await {
                a.members().replacement_failed(i, gen, &e);
                return;
            }
            // The other members too: units skipped as holes are covered only once the map
            // clear that made them holes is durable everywhere (rebuild.rs, the same rule).
            a.flush_members().await;
            a.meta()
                .persist_copied(a.members(), i, gen, uuid, covered)
                .await;
        })
        .await;
    }

    /// Copies unit by unit, each under its stripe lock.
    async fn copy_batch(&self, batch: &[u64], i: usize, gen: usize) -> Vec<Result<(), ArrayError>> {
        join_all(batch.iter().map(|&unit| async move {
            if self.skippable(unit) {
                return Ok(());
            }
            let _held = self.lock_stripe(unit).await;
            match self.copy_unit(unit, i, gen).await {
                // Neither read nor reconstructable: the slot's chunk there goes on its
                // bad-block list (the replacement inherits it at the swap) and the copy goes
                // on; a full list stops it.
                Err(e @ ArrayError::Unreadable { .. })
                    if self.check_serving().is_ok() && !self.members().is_failed(i) =>
                {
                    self.record_bad("replace", unit, uraid_core::MemberSet::EMPTY.with(i), e)
                }
                r => r,
            }
        }))
        .await
    }

    /// Slot `i`'s chunk of `unit` onto its replacement: read from the member, or
    /// reconstructed from the rest of the stripe where it cannot be read.
    async fn copy_unit(&self, unit: u64, i: usize, gen: usize) -> Result<(), ArrayError> {
        let g = self.geo();
        let len = g.chunk;
        let (at, copies) = if g.level.is_parity() {
            (g.member_offset(unit, 0), Vec::new())
        } else {
            let copies = g.mirror_copies(unit);
            match copies.iter().find(|c| c.0 == i) {
                Some(&(_, base)) => (base, copies),
                None => return Ok(()),
            }
        };
        // Members being rebuilt that do not hold this unit yet are never a source.
        let stale = self.members().stale_at(unit);
        let mut excl = stale.minus(self.members().failed());
        let chunk: IoBuf = loop {
            if self.members().is_failed(i) {
                return Err(ArrayError::Refused(format!("member {i} failed")));
            }
            if !excl.contains(i) {
                match self.read_members(unit, &[(i, at, len)], &mut excl).await {
                    Attempt::Done(mut v) => break v.pop().expect("one read"),
                    Attempt::Retry => continue,
                }
            }
            // The member could not read it: from the others, unless the unit awaits resync
            // (its parity or copies may not match its data: nothing to decode from).
            let failed = self.check_serving()?;
            if self.recovery().resync.unsynced(unit) {
                return Err(ArrayError::Unreadable { members: excl });
            }
            if g.level.is_parity() {
                let k = g.data_chunks();
                match g.role(unit, i) {
                    Role::Data(d) => match self.fetch_data(unit, 0, len, &[d], &mut excl).await? {
                        Attempt::Done(mut v) => {
                            break v.pop().flatten().expect("fetch_data returns every chunk")
                        }
                        Attempt::Retry => continue,
                    },
                    Role::Parity(j) => {
                        let want: Vec<usize> = (0..k).collect();
                        let data = match self.fetch_data(unit, 0, len, &want, &mut excl).await? {
                            Attempt::Done(v) => v,
                            Attempt::Retry => continue,
                        };
                        let mut parity: Vec<IoBuf> =
                            (0..g.parity()).map(|_| buf::alloc(len as usize)).collect();
                        {
                            let srcs: Vec<&[u8]> = data
                                .iter()
                                .map(|b| &b.as_ref().expect("fetch_data returns every chunk")[..])
                                .collect();
                            let mut out: Vec<&mut [u8]> =
                                parity.iter_mut().map(|b| &mut b[..]).collect();
                            let codec = self.codec().as_ref().expect("parity level has a codec");
                            codec.encode(&srcs, &mut out);
                        }
                        break parity.swap_remove(j);
                    }
                }
            }
            let Some(&(src, base)) = copies.iter().find(|(m, _)| {
                *m != i && !failed.contains(*m) && !excl.contains(*m) && !stale.contains(*m)
            }) else {
                return Err(ArrayError::Unreadable { members: excl });
            };
            match self
                .read_members(unit, &[(src, base, len)], &mut excl)
                .await
            {
                Attempt::Done(mut v) => break v.pop().expect("one read"),
                Attempt::Retry => continue,
            }
        };
        self.members()
            .write_replacement(i, gen, at, chunk)
            .await
            .map_err(|e| {
                self.members().replacement_failed(i, gen, &e);
                ArrayError::Refused(format!("member {i}'s replacement: {e}"))
            })
    }

    /// Whether the replace `r` still has its replacement attached.
    fn replacement_is(&self, r: &Replacing) -> bool {
        self.members().replacement(r.slot).map(|x| x.0) == Some(r.gen)
    }

    /// The swap (module docs), under the superblock lock from the moment it starts to the
    /// moment its outcome is recorded (no add, spare, remove or fail round interleaves).
    async fn swap_in(&self, r: Replacing) -> Result<ReplaceOutcome, ArrayError> {
        let i = r.slot;
        if let Err(e) = self.members().flush_gen(i, r.gen).await {
            self.members().replacement_failed(i, r.gen, &e);
            return Err(ArrayError::Refused(format!(
                "member {i}'s replacement: flush: {e}; the member stays"
            )));
        }
        // Every member: a map clear that let the copy skip a unit is durable before the
        // replacement (which does not hold that unit) can be named.
        self.flush_members().await;
        let mut meta = self.meta().lock().await;
        if self.members().is_failed(i) {
            drop(meta);
            return self.takeover(r).await;
        }
        if self.members().replacement(i).map(|x| x.0) != Some(r.gen) {
            return Err(ArrayError::Refused(format!(
                "member {i}'s replacement failed; the member stays"
            )));
        }
        let swap = self
            .meta()
            .swap_round(self.members(), &mut meta, i, r.gen, r.uuid)
            .await;
        // A replacement failure during the round was held for this decision (I/O that
        // saw it waits in its failure barrier for this lock).
        let repl_failed = self.members().take_replacement_failure(i);
        if swap == Swap::Done {
            // Named on disk and promoted in the round: the old device is out.
            if repl_failed && self.members().mark_failed(i) {
                // It failed a write during the round: it is the slot's device now, so the
                // slot fails (recorded before the waiting I/O is acknowledged).
                self.meta().persist(self.members(), &mut meta, false).await;
                return Err(ArrayError::Refused(format!(
                    "member {i}'s replacement failed while being swapped in; the slot is failed"
                )));
            }
            if self.members().is_failed(i) {
                // The old device failed before the promotion: writes meanwhile skipped the
                // slot, so the new device is rebuilt.
                drop(meta);
                return self.takeover(r).await;
            }
            return Ok(ReplaceOutcome::Replaced { slot: i });
        }
        self.members().end_swap(i);
        if swap != Swap::Failed {
            // The slot failed before the round: it kept its old identity.
            drop(meta);
            return self.takeover(r).await;
        }
        // Its superblock could not be written: the round named the old device again (one
        // event past the replacement's); what failed on it is on the old one.
        self.members().drop_replacement(i, r.gen);
        Err(ArrayError::Refused(format!(
            "member {i}'s replacement: its superblock could not be written; the member stays"
        )))
    }

    /// The old member failed during the replace: the replacement becomes the slot's device,
    /// rebuilt from unit 0 (the add protocol, `start_rebuilding_slot`).
    async fn replacement_takes_over(
        self: &Arc<Self>,
        r: Replacing,
    ) -> Result<ReplaceOutcome, ArrayError> {
        self.on_reactor(move |a| async move { a.takeover(r).await })
            .await
            .unwrap_or(Err(ArrayError::Shutdown))
    }

    /// The take-over itself: the slot's failure durable, then every journal record that
    /// wrote its old member checkpointed away (`Journal::retire_slot`: replay must never
    /// write one onto the replacement), then, under the superblock lock, the add protocol.
    async fn takeover(&self, r: Replacing) -> Result<ReplaceOutcome, ArrayError> {
        self.failure_barrier().await;
        self.journal_retire_slot(r.slot).await;
        // Past the tolerance the records stay (a forced assembly may want them), so the
        // replacement may not take the slot they wrote.
        self.check_serving()?;
        let meta = self.meta().lock().await;
        self.takeover_locked(meta, r).await
    }

    /// `replacement_takes_over` with the superblock lock held.
    async fn takeover_locked(
        &self,
        mut meta: tokio::sync::MutexGuard<'_, crate::metadata::Meta>,
        r: Replacing,
    ) -> Result<ReplaceOutcome, ArrayError> {
        let i = r.slot;
        let promoted = self.members().generation(i) == r.gen;
        if !self.members().is_failed(i)
            || !(promoted || self.members().replacement(i).map(|x| x.0) == Some(r.gen))
        {
            return Err(ArrayError::Refused(format!(
                "member {i}: its replacement is gone"
            )));
        }
        // Retired before the lock, and the slot stayed failed since (another device in it
        // would have changed its generation, refused above): it gained no records (`log`).
        debug_assert!(
            self.journal_slot_retired(i),
            "slot {i} has journal records a replay would write onto its replacement"
        );
        self.failure_on_disk(&mut meta, i).await;
        // Its metadata pages are stale now (the slot missed writes while failed): zeroed
        // again before it is named.
        let zeros = buf::alloc(self.members().data_offset() as usize);
        let z = match self.members().write_gen(i, r.gen, 0, zeros).await {
            Ok(()) => self.members().flush_gen(i, r.gen).await,
            Err(e) => Err(e),
        };
        if let Err(e) = z {
            self.members().drop_replacement(i, r.gen);
            return Err(ArrayError::Refused(format!(
                "member {i}'s replacement: {e}"
            )));
        }
        if !promoted {
            self.members().promote_replacement(i);
        }
        tracing::warn!(
            "member {i} failed during its replace: the replacement ({}) takes its slot and is \
             rebuilt from unit 0",
            self.members().name(i).unwrap_or("?")
        );
        self.start_rebuilding_slot(meta, i, r.uuid, "the replacement")
            .await
            .map(|()| ReplaceOutcome::Rebuilding { slot: i })
            .map_err(ArrayError::Refused)
    }
}

/// The copy walk of a replace (module docs): slot `r.slot`'s chunk of every unit onto its
/// replacement, then the swap.
struct CopyWalk {
    name: String,
    r: Replacing,
    units: u64,
    t0: Instant,
    /// How often the copy checkpoint is persisted, and when it last was.
    persist_every: Duration,
    last_persist: Instant,
    /// The copy checkpoint in memory: every unit below it is on the replacement (copied by
    /// this walk, or trusted from the recorded checkpoint and not owed to resync).
    covered: u64,
}

impl<D: BlockDev> Walk<D> for CopyWalk {
    type Outcome = Result<(), ArrayError>;
    type Output = Result<ReplaceOutcome, ArrayError>;

    fn progress<'a>(&self, a: &'a Array<D>) -> &'a Progress {
        &a.recovery().replace_progress[self.r.slot]
    }

    async fn check(&mut self, a: &Arc<Array<D>>, _at: At) -> Option<Self::Output> {
        let i = self.r.slot;
        if a.members().is_failed(i) {
            return Some(a.replacement_takes_over(self.r.clone()).await);
        }
        if !a.replacement_is(&self.r) {
            return Some(Err(ArrayError::Refused(format!(
                "member {i}'s replacement failed; the member stays"
            ))));
        }
        None
    }

    async fn stopped(&mut self, a: &Arc<Array<D>>, at: At) -> Self::Output {
        let i = self.r.slot;
        if a.recovery()
            .replace_keep
            .load(std::sync::atomic::Ordering::Acquire)
        {
            a.persist_copy_checkpoint(&self.r, self.covered).await;
            tracing::warn!(
                target: "uraid_engine::recovery",
                "array '{}': replace of member {i} stopped with the server at unit {} of {}; \
                 it resumes at the next start if its replacement is given",
                self.name,
                self.covered,
                self.units
            );
            return Ok(ReplaceOutcome::Stopped { slot: i });
        }
        a.members().drop_replacement(i, self.r.gen);
        tracing::warn!(
            target: "uraid_engine::recovery",
            "array '{}': replace of member {i} cancelled at unit {} of {}",
            self.name,
            at.next,
            self.units
        );
        Ok(ReplaceOutcome::Cancelled { slot: i })
    }

    fn gone(&self) -> Self::Outcome {
        Err(ArrayError::Shutdown)
    }

    fn worker(&self) -> Worker<D, Self::Outcome> {
        let (i, gen) = (self.r.slot, self.r.gen);
        walk::worker(move |a, b| async move { a.copy_batch(&b, i, gen).await })
    }

    async fn after_batch(
        &mut self,
        a: &Arc<Array<D>>,
        _at: At,
        batch: &[u64],
        outcomes: Vec<Self::Outcome>,
    ) -> After<Self::Output> {
        let Some(e) = outcomes.into_iter().find_map(Result::err) else {
            if let Some(&last) = batch.last() {
                self.covered = last + 1;
            }
            return After::Next;
        };
        let i = self.r.slot;
        if a.members().is_failed(i) || !a.replacement_is(&self.r) {
            return After::Again; // `check` ends it
        }
        a.members().drop_replacement(i, self.r.gen);
        tracing::error!(
            target: "uraid_engine::recovery",
            "array '{}': replace of member {i} stopped: {e}; the member stays",
            self.name
        );
        After::End(Err(e))
    }

    async fn checkpoint(&mut self, a: &Arc<Array<D>>) {
        if self.last_persist.elapsed() >= self.persist_every {
            self.last_persist = Instant::now();
            a.persist_copy_checkpoint(&self.r, self.covered).await;
        }
    }

    async fn finish(&mut self, a: &Arc<Array<D>>, _at: At) -> Self::Output {
        let r = self.r.clone();
        let slot = r.slot;
        let swapped = a
            .on_reactor(move |a| async move { a.swap_in(r).await })
            .await
            .unwrap_or(Err(ArrayError::Shutdown));
        if let Ok(ReplaceOutcome::Replaced { .. }) = swapped {
            tracing::warn!(
                target: "uraid_engine::recovery",
                "array '{}': member {} replaced in {:.1} s",
                self.name,
                slot,
                self.t0.elapsed().as_secs_f64()
            );
        }
        swapped
    }
}
