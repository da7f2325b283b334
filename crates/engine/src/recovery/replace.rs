//! Replace: a new device takes an active member's place while the member keeps serving
//! (`uraid replace`, md's want_replacement). The data is copied from the member itself, so
//! the array never loses redundancy on the way, unlike fail + add.
//!
//! Rules (docs/invariants.md, "A replacement holds no superblock before its swap"):
//! * From the start every write and flush of the slot goes to both devices (`Members`:
//!   the slot's (current, replacement) generations are one word, so an I/O sees a
//!   consistent pair); reads use the old device only. Superblocks go to the old device
//!   only: the replacement claims nothing until the swap.
//! * At the start the replacement's metadata area is zeroed and flushed, then every bitmap
//!   and allocation-map page is rewritten (to every member, so to the replacement too).
//! * The walk copies each unit's chunk of the slot under the unit's stripe lock: read from
//!   the old device; a chunk it cannot read is reconstructed from the rest of the stripe
//!   (the old device's read-error budget applies as for any read).
//! * The swap: the replacement is flushed, then one superblock round names it in the slot
//!   (its own superblock written to it in that round), then in one store it becomes the
//!   slot's device and the old one is no longer written. A crash before the round finds
//!   the old member complete (it got every write); a torn round leaves the slot either
//!   with the old member or with the new one, which holds everything. The old device is
//!   refused afterwards (its uuid is no longer the slot's).
//! * Units with nothing allocated are skipped, as the rebuild does.
//! * Progress is not persisted: after a restart the old member is simply still the member
//!   (the replacement has no superblock); the replace is started again.
//! * The old member failing during the replace (an error, `uraid fail`) makes the
//!   replacement the slot's new device, rebuilt from unit 0 like an added member (writes
//!   while the slot was failed did not reach it). The replacement failing ends the replace;
//!   the member stays.

use super::walk::{self, After, At, Units, Walk, Worker};
use crate::array::{Array, ArrayError};
use crate::background::{Progress, Replacing};
use crate::buf::{self, IoBuf};
use crate::dev::BlockDev;
use crate::metadata::Swap;
use crate::stripe::Attempt;
use futures::future::join_all;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
use uraid_core::geometry::Role;

/// How a replace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceOutcome {
    /// The new device is the slot's member; the old one is out.
    Replaced { slot: usize },
    /// Stopped (`stop`): the replacement was dropped, the member stays.
    Cancelled { slot: usize },
    /// The old member failed meanwhile: the new device is the slot's member now, being
    /// rebuilt (the caller starts the rebuild and rewrites the map pages).
    Rebuilding { slot: usize },
}

impl<D: BlockDev> Array<D> {
    /// The member being replaced, with its replacement's name and the units copied.
    pub fn replace_state(&self) -> Option<(usize, String)> {
        let r = (*self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner()))?;
        let (gen, name) = self.members().replacement(r.slot)?;
        (gen == r.gen).then(|| (r.slot, name.to_string()))
    }

    /// Drops the replace started last if its replacement is still attached (an error
    /// before its walk could run): the member stays.
    pub fn abandon_replace(&self) {
        if let Some(r) = *self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            if self.members().drop_replacement(r.slot, r.gen) {
                tracing::warn!("member {}: replace abandoned; the member stays", r.slot);
            }
        }
    }

    /// Progress of the running (or last) replace.
    pub fn replace_progress(&self) -> crate::recovery::ProgressView {
        self.recovery().replace_progress.view()
    }

    /// Starts replacing active member `i` by `dev` (module docs): checks, zeroes `dev`'s
    /// metadata area, attaches it as the slot's replacement and rewrites the bitmap pages.
    /// The caller rewrites the allocation-map pages (`Volume::replace_member`) and then
    /// runs `replace_run`.
    pub async fn start_replace(
        self: &Arc<Self>,
        i: usize,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<(), String> {
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
        self.check_new_size(&dev)?;
        if self.meta_frozen() {
            return Err("the array's metadata is read-only".into());
        }
        self.on_reactor(move |a| async move { a.start_replace_here(i, dev, uuid).await })
            .await
            .unwrap_or_else(|| Err("the server is stopping".into()))
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
        if let Some(r) = *self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            if self
                .members()
                .replacement(r.slot)
                .is_some_and(|x| x.0 == r.gen)
            {
                return Some(format!(
                    "member {} is being replaced already: one replace at a time",
                    r.slot
                ));
            }
        }
        if !self.members().can_install(i) {
            return Some(format!(
                "slot {i} was given {} devices this session already; restart the server first",
                crate::members::MAX_GENERATIONS - 1
            ));
        }
        None
    }

    async fn start_replace_here(&self, i: usize, dev: D, uuid: [u8; 16]) -> Result<(), String> {
        let name = dev.name().to_string();
        // Checked first (a refused replace writes nothing to the device), then the device's
        // metadata area cleared before the superblock lock (a hanging new device must not
        // hold it), then checked again under the lock: no add, fail round or other replace
        // interleaves.
        self.replace_refusal(i).map_or(Ok(()), Err)?;
        self.clear_metadata_area(&dev).await?;
        let meta = self.meta().lock().await;
        self.replace_refusal(i).map_or(Ok(()), Err)?;
        if self.members().set_replacement(i, dev).is_err() {
            return Err(format!("slot {i}: no room for another device"));
        }
        let gen = self.members().generation_top(i);
        *self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Replacing { slot: i, gen, uuid });
        drop(meta);
        tracing::warn!(
            "member {i} ({}): being replaced by {name} (copied while it serves)",
            self.members().name(i).unwrap_or("?")
        );
        self.intent().sync_all(self.meta(), self.members()).await;
        if self.members().replacement(i).map(|r| r.0) != Some(gen) {
            return Err(format!(
                "{name}: writing its metadata failed; replace abandoned"
            ));
        }
        Ok(())
    }

    /// Copies the member being replaced onto its replacement and swaps it in (module docs);
    /// `stop` cancels. Runs on any thread (the server gives it its own).
    pub async fn replace_run(
        self: &Arc<Self>,
        stop: &AtomicBool,
    ) -> Result<ReplaceOutcome, ArrayError> {
        let Some(r) = *self
            .recovery()
            .replacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        else {
            return Err(ArrayError::Refused("no replace was started".into()));
        };
        let units = self.geo().units();
        let mut w = CopyWalk {
            name: self.identity().0.to_string(),
            r,
            units,
            t0: Instant::now(),
        };
        walk::run(self, &mut w, Units::range(0..units), stop).await
    }

    /// Copies unit by unit, each under its stripe lock.
    async fn copy_batch(&self, batch: &[u64], i: usize, gen: usize) -> Vec<Result<(), ArrayError>> {
        join_all(batch.iter().map(|&unit| async move {
            if self.skippable(unit) {
                return Ok(());
            }
            let _held = self.locks().lock(unit).await;
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
                match self.read_members(&[(i, at, len)], &mut excl).await {
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
            match self.read_members(&[(src, base, len)], &mut excl).await {
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
    fn replacement_is(&self, r: Replacing) -> bool {
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
}

impl<D: BlockDev> Walk<D> for CopyWalk {
    type Outcome = Result<(), ArrayError>;
    type Output = Result<ReplaceOutcome, ArrayError>;

    fn progress<'a>(&self, a: &'a Array<D>) -> &'a Progress {
        &a.recovery().replace_progress
    }

    async fn check(&mut self, a: &Arc<Array<D>>, _at: At) -> Option<Self::Output> {
        let i = self.r.slot;
        if a.members().is_failed(i) {
            return Some(a.replacement_takes_over(self.r).await);
        }
        if !a.replacement_is(self.r) {
            return Some(Err(ArrayError::Refused(format!(
                "member {i}'s replacement failed; the member stays"
            ))));
        }
        None
    }

    async fn stopped(&mut self, a: &Arc<Array<D>>, at: At) -> Self::Output {
        let i = self.r.slot;
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
        _batch: &[u64],
        outcomes: Vec<Self::Outcome>,
    ) -> After<Self::Output> {
        let Some(e) = outcomes.into_iter().find_map(Result::err) else {
            return After::Next;
        };
        let i = self.r.slot;
        if a.members().is_failed(i) || !a.replacement_is(self.r) {
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

    async fn finish(&mut self, a: &Arc<Array<D>>, _at: At) -> Self::Output {
        let r = self.r;
        let swapped = a
            .on_reactor(move |a| async move { a.swap_in(r).await })
            .await
            .unwrap_or(Err(ArrayError::Shutdown));
        if let Ok(ReplaceOutcome::Replaced { .. }) = swapped {
            tracing::warn!(
                target: "uraid_engine::recovery",
                "array '{}': member {} replaced in {:.1} s",
                self.name,
                r.slot,
                self.t0.elapsed().as_secs_f64()
            );
        }
        swapped
    }
}
