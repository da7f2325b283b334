//! Superblock persistence: dirty/clean rounds and the failure barrier.
//!
//! Rules (ARCHITECTURE.md, invariants 4 and 7):
//! * A member failure is *durable* once every surviving member's superblock records it. The
//!   in-memory failed set may run ahead of the durable one, but no write or flush that
//!   completed without a failed member is acknowledged before the failure is durable
//!   (`failure_barrier`, called on every write and flush completion path). Otherwise a power
//!   cut in that window brings the member back as active with stale chunks.
//! * A superblock round writes every live member's superblock into the one of its two slots
//!   (4 KiB at member offsets 0 and 4096) that does *not* hold its freshest valid superblock,
//!   and flushes it, so a round torn by a crash leaves that copy intact: `events - 1`, which
//!   assembly accepts (`assemble::decide`, md's event margin of one).
//! * Rounds are serialised by one async mutex; a round that itself fails a member runs again.
//!   Nothing that can fail a member (and so needs a round) runs while holding it.

use crate::array::Array;
use crate::buf;
use crate::dev::BlockDev;
use futures::future::join_all;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use uraid_core::format::{MemberState, Superblock, SB_SIZE};
use uraid_core::MemberSet;

pub(crate) struct Meta {
    pub(crate) sb: Superblock,
    pub(crate) ids: Vec<MemberId>,
    /// A replace being finished (recovery/replace.rs `swap_in`): set before its round,
    /// moved on by the round, read back after it.
    pub(crate) swap: Option<Swap>,
}

/// Where the swap of a replacement into its slot stands (`Meta::swap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swap {
    /// The next round names the replacement (generation `gen`, device `uuid`) in `slot`
    /// if the slot is live, writing its superblock first; a failed slot leaves it pending.
    Pending {
        slot: usize,
        gen: usize,
        uuid: [u8; 16],
    },
    /// Its superblock was written and it was promoted: the superblocks name it.
    Done,
    /// It could not be marked swapping or its superblock could not be written: the slot
    /// names the old device.
    Failed,
}

/// Who a member is on disk: its device uuid, and which superblock slot holds its freshest
/// valid superblock (the next round writes the *other* slot, so a torn round can never
/// destroy a member's only valid copy, also on a member that missed the previous round).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberId {
    pub uuid: [u8; 16],
    pub sb_slot: usize,
    /// The event count of that superblock (members taken one event behind, or forced, are
    /// behind the array's).
    pub events: u64,
}

pub(crate) struct Metadata {
    pub(crate) state: tokio::sync::Mutex<Meta>,
    /// Serialises the first write's preparation (`ensure_dirty`).
    first_write: tokio::sync::Mutex<()>,
    /// The failed set the superblocks on disk record.
    persisted: AtomicU64,
    /// Slots whose member was removed (`REMOVED_SLOT`), for status without the lock.
    removed: AtomicU64,
    dirty: AtomicBool,
    /// The superblocks on disk say "not clean" although this session wrote nothing (a
    /// journal replay made the array consistent): the clean stop writes "clean" anyway.
    clean_round_due: AtomicBool,
    /// The superblocks' event count after the last round (status).
    events: AtomicU64,
    /// Array identity, for status without taking the superblock lock.
    pub(crate) name: String,
    pub(crate) uuid: [u8; 16],
    pub(crate) ctime: u64,
    /// Read-only metadata: never write superblocks (bench on someone's array, tests).
    frozen: bool,
}

impl Metadata {
    /// `absent`: members missing at assembly. They count as known: a session that only
    /// reads never records them failed (their data is still current); the first write's
    /// round does.
    pub(crate) fn new(
        sb: Superblock,
        ids: Vec<MemberId>,
        frozen: bool,
        absent: MemberSet,
    ) -> Metadata {
        let persisted: MemberSet = (0..sb.geometry.members)
            .filter(|&i| sb.is_failed(i))
            .collect::<MemberSet>()
            .union(absent);
        let removed: MemberSet = (0..sb.geometry.members)
            .filter(|&i| sb.is_removed(i))
            .collect();
        Metadata {
            events: AtomicU64::new(sb.events),
            name: sb.name.clone(),
            uuid: sb.array_uuid,
            ctime: sb.ctime,
            state: tokio::sync::Mutex::new(Meta {
                sb,
                ids,
                swap: None,
            }),
            first_write: tokio::sync::Mutex::new(()),
            persisted: AtomicU64::new(persisted.bits()),
            removed: AtomicU64::new(removed.bits()),
            dirty: AtomicBool::new(false),
            clean_round_due: AtomicBool::new(false),
            frozen,
        }
    }

    pub(crate) fn persisted(&self) -> MemberSet {
        MemberSet::from_bits(self.persisted.load(Ordering::Acquire))
    }

    pub(crate) fn removed(&self) -> MemberSet {
        MemberSet::from_bits(self.removed.load(Ordering::Acquire))
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    pub(crate) fn events(&self) -> u64 {
        self.events.load(Ordering::Acquire)
    }
}

/// Member `i`'s superblock as the array's current one says it, and where it goes: the
/// superblock slot that does not hold its freshest copy, that slot's offset, the block.
fn superblock_of(meta: &Meta, i: usize) -> (usize, u64, crate::buf::IoBuf) {
    let mut sb = meta.sb.clone();
    sb.index = i;
    sb.device_uuid = meta.ids[i].uuid;
    let slot = 1 - meta.ids[i].sb_slot;
    (slot, (slot * SB_SIZE) as u64, buf::copy_of(&sb.encode()))
}

impl<D: BlockDev> Array<D> {
    /// Marks a member failed (logging the cause) and waits until the failure is durable.
    pub(crate) async fn fail_member(&self, member: usize, err: &io::Error) {
        if crate::members::is_stale(err) {
            // From the device the slot had before: its failure is on disk already.
            tracing::debug!("member {member}: {err}");
            return;
        }
        if self.members.mark_failed(member) {
            tracing::error!(
                "member {member} ({}) failed: {err}; marking it faulty",
                self.members.name(member).unwrap_or("?")
            );
        }
        self.failure_barrier().await;
    }

    /// Fails member `i` on the operator's request (`uraid fail`, mdadm --fail), durably.
    /// Refused: an unknown or already failed member, one whose loss the array cannot
    /// survive, and, without `force`, one that would leave no redundancy.
    pub async fn fail_by_operator(
        self: &std::sync::Arc<Self>,
        i: usize,
        force: bool,
    ) -> Result<(), String> {
        let g = self.geo;
        if i >= g.members {
            return Err(format!("no member {i}: the array has {}", g.members));
        }
        self.on_reactor(move |a| async move {
            // Checked and marked under the superblock lock: two operator commands at once
            // cannot both pass the check.
            {
                let _meta = a.meta.state.lock().await;
                if a.members.is_failed(i) {
                    return Err(format!("member {i} is already failed or missing"));
                }
                g.check_fail(a.members.degraded(), i, force)?;
                if a.needs_resync() && a.journal_active().is_none() && g.level.is_parity() && !force
                {
                    return Err(format!(
                        "a resync is pending (unclean stop): failing member {i} now would make \
                         the stripes not yet resynced unreadable where it held data; wait for \
                         the resync or pass --force"
                    ));
                }
                a.members.mark_failed(i);
                tracing::error!(
                    "member {i} ({}) failed by the operator; marking it faulty",
                    a.members.name(i).unwrap_or("?")
                );
            }
            a.failure_barrier().await;
            Ok(())
        })
        .await
        .unwrap_or_else(|| Err("the server is stopping".to_string()))
    }

    /// Removes member `i` from the running array (`uraid remove`, mdadm --remove): its slot
    /// is recorded with no device (`REMOVED_SLOT`), so the device is refused from now on and
    /// the slot waits for a new member (`add`, or a spare). An active or rebuilding member is
    /// failed first, with `fail_by_operator`'s refusals (and `force`). Durable when it
    /// returns.
    pub async fn remove_member(
        self: &std::sync::Arc<Self>,
        i: usize,
        force: bool,
    ) -> Result<String, String> {
        let g = self.geo;
        if i >= g.members {
            return Err(format!("no member {i}: the array has {}", g.members));
        }
        if self.meta_frozen() {
            return Err("the array's metadata is read-only".into());
        }
        if self.meta.removed().contains(i) {
            return Err(format!("member {i} was removed already"));
        }
        if self.members.replacement(i).is_some() {
            return Err(format!(
                "member {i} is being replaced: cancel the replace first (uraid replace --cancel)"
            ));
        }
        let was = if self.members.is_failed(i) {
            "failed"
        } else {
            self.fail_by_operator(i, force).await?;
            "active"
        };
        self.on_reactor(move |a| async move {
            let mut meta = a.meta.state.lock().await;
            if !a.members.is_failed(i) {
                return Err(format!(
                    "member {i} was given a new device meanwhile (a spare took it over)"
                ));
            }
            if a.meta.removed().contains(i) {
                return Err(format!("member {i} was removed already"));
            }
            if a.members.replacement(i).is_some() {
                return Err(format!(
                    "member {i} failed, but a replace started meanwhile takes its slot"
                ));
            }
            let name = a.members.name(i).unwrap_or("?").to_string();
            meta.ids[i].uuid = uraid_core::format::REMOVED_SLOT;
            a.meta.removed.fetch_or(1 << i, Ordering::AcqRel);
            a.persist(&mut meta, true).await;
            // The server lets go of the device (it can be added again, or used elsewhere).
            a.members.retire(i, a.members.generation(i));
            tracing::warn!("member {i} ({name}) removed from the array");
            Ok(format!("member {i} ({name}, {was}) removed"))
        })
        .await
        .unwrap_or_else(|| Err("the server is stopping".to_string()))
    }

    /// Slots whose member was removed and not yet replaced.
    pub fn removed(&self) -> MemberSet {
        self.meta.removed()
    }

    /// Puts `dev` into the lowest failed slot of the running array (`uraid add` on a server,
    /// or a hot spare taking over), durably: its metadata area is zeroed (no stale map or
    /// bitmap can be merged from it), then in one superblock round the slot is recorded
    /// rebuilding from unit 0 with `uuid` (the new member gets its superblock too); from
    /// then on writes reach it and the rebuild (`Array::rebuild`) fills it. The caller then
    /// rewrites the member metadata (`Volume::add_member` does). Returns the slot.
    pub async fn add_member_online(
        self: &std::sync::Arc<Self>,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<usize, String> {
        let g = self.geo;
        self.check_new_size(&dev)?;
        if g.fault_tolerance() == 0 {
            return Err(format!(
                "{} has no redundancy to rebuild a member from",
                g.level
            ));
        }
        if self.meta_frozen() {
            return Err("the array's metadata is read-only".into());
        }
        self.on_reactor(move |a| async move { a.add_member_here(dev, uuid).await })
            .await
            .unwrap_or_else(|| Err("the server is stopping".into()))
    }

    async fn add_member_here(&self, dev: D, uuid: [u8; 16]) -> Result<usize, String> {
        let name = dev.name().to_string();
        // A refused add writes nothing to the device; the metadata area is cleared before
        // the superblock lock (a hanging new device must not hold it), and the slot chosen
        // under it.
        if !self.can_take_member() {
            return Err("the array has no failed or missing member to replace".into());
        }
        self.clear_metadata_area(&dev).await?;
        // No journal record that wrote a failed slot's old member may be replayed onto the
        // new device (journal_retire_slot): the failures durable, then those records
        // checkpointed away, before the slot is chosen (again, if another failed meanwhile).
        let mut retired = MemberSet::EMPTY;
        let (mut meta, slot) = loop {
            self.failure_barrier().await;
            for i in self.members.failed().minus(retired).iter() {
                self.journal_retire_slot(i).await;
                retired = retired.with(i);
            }
            // Past the tolerance the records stay (a forced assembly may want them), so no
            // device may take a slot they wrote.
            self.check_serving().map_err(|e| e.to_string())?;
            let meta = self.meta.state.lock().await;
            // A slot whose old member failed during a replace is its replacement's.
            let Some(slot) = self
                .members
                .failed()
                .iter()
                .find(|&i| self.members.replacement(i).is_none())
            else {
                return Err("the array has no failed or missing member to replace".into());
            };
            if retired.contains(slot) {
                break (meta, slot);
            }
        };
        if !self.members.can_install(slot) {
            return Err(format!(
                "slot {slot} was given {} devices this session already; restart the server to \
                 add another",
                crate::members::MAX_GENERATIONS - 1
            ));
        }
        self.failure_on_disk(&mut meta, slot).await;
        if self.members.install(slot, dev).is_err() {
            return Err(format!("slot {slot}: no room for another device"));
        }
        tracing::warn!(
            "member {slot}: {name} added in place of the failed member; it is rebuilt from unit 0"
        );
        self.start_rebuilding_slot(meta, slot, uuid, &name).await?;
        Ok(slot)
    }

    /// Refuses a new device smaller than a member.
    pub(crate) fn check_new_size(&self, dev: &D) -> Result<(), String> {
        let need = self.members.data_offset() + self.geo.member_data;
        if dev.size() < need {
            return Err(format!(
                "{}: too small ({} bytes); a member needs at least {need}",
                dev.name(),
                dev.size()
            ));
        }
        Ok(())
    }

    /// Zeroes and flushes a new device's bytes before the data area: no stale superblock,
    /// bitmap or map sector with a valid checksum can survive on it.
    pub(crate) async fn clear_metadata_area(&self, dev: &D) -> Result<(), String> {
        let zeros = crate::buf::alloc(self.members.data_offset() as usize);
        let (r, _) = dev.write(0, zeros).await;
        r.and(dev.flush().await)
            .map_err(|e| format!("{}: clearing its metadata area: {e}", dev.name()))
    }

    /// Before a failed slot gets a new device: its failure is on disk (state failed, no
    /// checkpoint, its old uuid), so a crash before the round that names the new device
    /// leaves it failed, never trusting the new one.
    pub(crate) async fn failure_on_disk(&self, meta: &mut Meta, slot: usize) {
        if !self.meta.persisted().contains(slot)
            || meta.sb.states[slot] != MemberState::Failed
            || meta.sb.rebuilt[slot] != 0
        {
            self.persist(meta, true).await;
        }
    }

    /// Slot `slot` was just given its new device (its metadata area zeroed): it is recorded
    /// rebuilding from unit 0 with device uuid `uuid` in one round (the device gets its
    /// first superblock from that round, so a torn round leaves it without any: missing),
    /// then every bitmap copy is made equal to memory. The caller rewrites the map pages.
    pub(crate) async fn start_rebuilding_slot(
        &self,
        mut meta: tokio::sync::MutexGuard<'_, Meta>,
        slot: usize,
        uuid: [u8; 16],
        name: &str,
    ) -> Result<(), String> {
        meta.ids[slot] = MemberId {
            uuid,
            sb_slot: 1,
            events: meta.sb.events,
        };
        meta.sb.rebuilt[slot] = 0;
        self.meta.removed.fetch_and(!(1 << slot), Ordering::AcqRel);
        self.members.start_rebuilding(slot);
        self.persist(&mut meta, true).await;
        drop(meta);
        if self.members.is_failed(slot) {
            return Err(format!(
                "{name}: its superblock could not be written; failed again"
            ));
        }
        // Every member's bitmap copy (the new one's is zero) made equal to memory.
        self.bitmap_sync_all().await;
        Ok(())
    }

    /// Whether a device could be added now: a failed slot with room for another device.
    pub fn can_take_member(&self) -> bool {
        self.members
            .failed()
            .iter()
            .find(|&i| self.members.replacement(i).is_none())
            .is_some_and(|i| self.members.can_install(i))
    }

    /// The array's current superblock (a spare added while serving carries a copy).
    pub async fn superblock(&self) -> Superblock {
        self.meta.state.lock().await.sb.clone()
    }

    /// Waits until every failure known now is recorded in the superblocks of the survivors.
    /// Cheap when nothing failed since the last round (two atomic loads).
    pub(crate) async fn failure_barrier(&self) {
        let f = self.members.failed();
        if f.minus(self.meta.persisted()).is_empty() {
            if self.members.replacement_failures().is_empty() {
                return;
            }
            // A replacement failed while being swapped in: its swap round (which holds the
            // superblock lock) decides whether that failed the slot; wait for it.
            Box::pin(async { drop(self.meta.state.lock().await) }).await;
            if self
                .members
                .failed()
                .minus(self.meta.persisted())
                .is_empty()
            {
                return;
            }
        }
        // Boxed: the superblock round is a large future that every write would otherwise
        // carry (and move) for nothing.
        Box::pin(async {
            let mut meta = self.meta.state.lock().await;
            self.persist(&mut meta, false).await;
        })
        .await
    }

    /// Writes a superblock round if the failed set changed (or `force`), until one round
    /// completes without failing anyone new.
    pub(crate) async fn persist(&self, meta: &mut Meta, force: bool) {
        let mut force = force;
        loop {
            let failed = self.members.failed();
            if !force && failed.minus(self.meta.persisted()).is_empty() {
                return;
            }
            force = false;
            if self.meta.frozen {
                // Nothing is written; the in-memory failure is all there is.
                self.meta.persisted.store(failed.bits(), Ordering::Release);
                return;
            }
            self.catch_up(meta, failed).await;
            meta.sb.events += 1;
            meta.sb.utime = now();
            // A replacement being swapped in takes the slot's identity in this round (only
            // if the slot is live: a failed one keeps its old uuid, and the takeover names
            // the replacement in its own round). From here it cannot be dropped.
            let mut swap_old = None;
            let mut again = false;
            if let Some(Swap::Pending { slot: s, gen, uuid }) = meta.swap {
                if !failed.contains(s) {
                    if self.members.begin_swap(s, gen) {
                        swap_old = Some((s, gen, meta.ids[s]));
                        meta.ids[s] = MemberId {
                            uuid,
                            sb_slot: 1,
                            events: meta.sb.events,
                        };
                    } else {
                        meta.swap = Some(Swap::Failed);
                    }
                }
            }
            // Against the same snapshot of the failed set: a rebuilding member that fails
            // meanwhile is written as rebuilding (its next round records it failed), never
            // as active.
            let rebuilding = self.members.rebuilding_marked().minus(failed);
            for i in 0..self.geo.members {
                meta.sb.states[i] = if failed.contains(i) {
                    MemberState::Failed
                } else if rebuilding.contains(i) {
                    MemberState::Rebuilding
                } else {
                    MemberState::Active
                };
                // Only the rebuild moves a checkpoint (`persist_rebuilt`, after flushing
                // the member): a round for another reason keeps the last one.
                if meta.sb.states[i] != MemberState::Rebuilding {
                    meta.sb.rebuilt[i] = 0;
                }
                if meta.ids[i].uuid != [0; 16] {
                    meta.sb.slot_uuids[i] = meta.ids[i].uuid;
                }
            }
            let live = MemberSet::all(self.geo.members).minus(failed);
            // A replacement being swapped in gets its superblock first, durably, before any
            // other member's names it: a crash in between leaves a round one event behind
            // on the others (taken), never a slot naming a device with no superblock.
            let mut swapped = None;
            if let Some((s, gen, old)) = swap_old {
                let (slot, at, block) = superblock_of(meta, s);
                let r = match self.members.write_gen(s, gen, at, block).await {
                    Ok(()) => self.members.flush_gen(s, gen).await,
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => {
                        // Named on disk (first): it is the slot's device from now on, in
                        // one store; the old one is retired and never written again.
                        meta.ids[s].sb_slot = slot;
                        meta.ids[s].events = meta.sb.events;
                        meta.swap = Some(Swap::Done);
                        self.members.promote_replacement(s);
                        swapped = Some(s);
                    }
                    Err(e) => {
                        // The slot keeps the old device: this pass names it again, and a
                        // second pass moves the others one event past anything the
                        // replacement may hold (a write that landed before its flush
                        // failed), so the two never tie at assembly. Events move by one
                        // per pass, never two.
                        tracing::error!(
                            "member {s}: writing its replacement's superblock failed: {e}"
                        );
                        meta.swap = Some(Swap::Failed);
                        meta.ids[s] = old;
                        meta.sb.slot_uuids[s] = old.uuid;
                        again = true;
                    }
                }
            }
            let writes = live.iter().filter(|&i| swapped != Some(i)).map(|i| {
                let (slot, at, block) = superblock_of(meta, i);
                async move {
                    // Superblocks go to the current device only: never mirrored to a
                    // replacement, which must not claim the slot before it has it.
                    let r = match self.members.write_cur(i, at, block).await {
                        Ok(()) => self.members.flush(i).await,
                        Err(e) => Err(e),
                    };
                    (i, slot, r)
                }
            });
            let mut newly = false;
            for (i, slot, r) in join_all(writes).await {
                match r {
                    Ok(()) => {
                        meta.ids[i].sb_slot = slot;
                        meta.ids[i].events = meta.sb.events;
                    }
                    Err(e) => {
                        tracing::error!(
                            "member {i}: superblock update failed: {e}; marking it faulty"
                        );
                        self.members.mark_failed(i);
                        newly = true;
                    }
                }
            }
            // Exactly what this round wrote (a slot given a new device is no longer failed
            // on disk; its next failure must be written again).
            self.meta.persisted.store(failed.bits(), Ordering::Release);
            self.meta.events.store(meta.sb.events, Ordering::Release);
            if again {
                force = true;
                continue;
            }
            if !newly {
                return;
            }
        }
    }

    /// Brings members whose superblock is behind the array's (taken one event behind, or
    /// forced) up to the array's current superblock, without a new event, before a round:
    /// otherwise a crash tearing that round would leave them two events behind and refused.
    /// A member that cannot be written is failed (the round that follows records it).
    async fn catch_up(&self, meta: &mut Meta, failed: MemberSet) {
        let behind: Vec<usize> = MemberSet::all(self.geo.members)
            .minus(failed)
            .iter()
            .filter(|&i| meta.ids[i].events < meta.sb.events)
            .collect();
        if behind.is_empty() {
            return;
        }
        let writes = behind.iter().map(|&i| {
            let (slot, at, block) = superblock_of(meta, i);
            async move {
                let r = match self.members.write_cur(i, at, block).await {
                    Ok(()) => self.members.flush(i).await,
                    Err(e) => Err(e),
                };
                (i, slot, r)
            }
        });
        for (i, slot, r) in join_all(writes).await {
            match r {
                Ok(()) => {
                    tracing::info!(
                        "member {i}: superblock brought up to events {} (it was behind)",
                        meta.sb.events
                    );
                    meta.ids[i].sb_slot = slot;
                    meta.ids[i].events = meta.sb.events;
                }
                Err(e) => {
                    tracing::error!("member {i}: superblock update failed: {e}; marking it faulty");
                    self.members.mark_failed(i);
                }
            }
        }
    }

    /// Records the rebuild checkpoints `to` (member, units it holds) in a superblock round.
    /// Caller flushed those members after the writes the checkpoints cover. A member whose
    /// rebuild finished (no longer rebuilding) is recorded active.
    pub(crate) async fn persist_rebuilt(&self, to: &[(usize, u64)]) {
        let mut meta = self.meta.state.lock().await;
        for &(i, r) in to {
            meta.sb.rebuilt[i] = r;
        }
        self.persist(&mut meta, true).await;
    }

    /// The superblocks say "not clean" but the array is consistent (journal replayed): the
    /// next clean stop records "clean" even if nothing is written meanwhile.
    pub(crate) fn clean_round_due(&self) {
        self.meta.clean_round_due.store(true, Ordering::Release);
    }

    /// Whether superblocks are never written (read-only benchmarks).
    pub(crate) fn meta_frozen(&self) -> bool {
        self.meta.frozen
    }

    /// A superblock round recording that the array has no journal any more (the journal
    /// failed: bitmap mode from now on, journal.rs).
    pub(crate) async fn drop_journal_from_superblocks(&self) {
        if self.meta.frozen {
            return;
        }
        let mut meta = self.meta.state.lock().await;
        if meta.sb.journal.take().is_some() {
            self.persist(&mut meta, true).await;
        }
    }

    /// Before the first write of a session: superblocks say "not clean".
    pub(crate) async fn ensure_dirty(&self) {
        if self.meta.dirty.load(Ordering::Acquire) {
            return;
        }
        Box::pin(async {
            let _first = self.meta.first_write.lock().await;
            if self.meta.dirty.load(Ordering::Acquire) {
                return;
            }
            {
                let mut meta = self.meta.state.lock().await;
                meta.sb.clean = false;
                self.persist(&mut meta, true).await;
            }
            // Every member's bitmap copy made equal to the bits in memory before any write
            // relies on them (bitmap.rs). Not under the superblock lock: a member failing
            // here is recorded by a superblock round.
            self.bitmap_sync_all().await;
            self.meta.dirty.store(true, Ordering::Release);
        })
        .await
    }

    /// Flushes every member and, if anything was written since assembly and no resync is
    /// still due, records a clean shutdown in the superblocks. A session that only read leaves them untouched: members
    /// that were merely absent are not marked failed, since their data is still current.
    pub async fn close(&self) -> Result<(), crate::ArrayError> {
        // Deferred member writes (write-back journal) land first.
        self.journal_drain().await;
        self.flush_members().await;
        self.check_serving()?;
        // Everything is on the members: the journal is emptied (nothing to replay).
        self.journal_checkpoint().await;
        // Regions written this session are idle and flushed: their bits go (resync's
        // unfinished regions keep theirs, so the next start resumes there).
        self.bitmap_close().await;
        let mut meta = self.meta.state.lock().await;
        // An unfinished resync keeps the array "not clean": the next start resyncs again.
        let due = self.meta.dirty.load(Ordering::Acquire)
            || self.meta.clean_round_due.load(Ordering::Acquire);
        if due && !self.needs_resync() {
            meta.sb.clean = true;
            self.persist(&mut meta, true).await;
            self.meta.dirty.store(false, Ordering::Release);
            self.meta.clean_round_due.store(false, Ordering::Release);
        }
        drop(meta);
        self.check_serving().map(|_| ())
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
