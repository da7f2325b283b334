//! Superblock persistence: dirty/clean rounds and the failure barrier.
//!
//! Rules (docs/invariants.md, "Failures are durable before acknowledgement" and "Superblock
//! rounds never tear the only copy"):
//! * A member failure is *durable* once every surviving member's superblock records it. The
//!   in-memory failed set may run ahead of the durable one, but no write or flush that
//!   completed without a failed member is acknowledged before the failure is durable
//!   (`failure_barrier`, called on every write and flush completion path). Otherwise a power
//!   cut in that window brings the member back as active with stale chunks.
//! * A superblock round writes every live member's superblock into the one of its two slots
//!   (4 KiB at member offsets 0 and 4096) that does *not* hold its freshest valid superblock,
//!   and flushes it, so a round torn by a crash leaves that copy intact: `events - 1`, which
//!   assembly accepts (`uraid_core::assemble::decide`, md's event margin of one).
//! * The event count only grows, one per round (`assert!` in `persist`, also in release: a
//!   round that wrote a lower count would let assembly pick a stale member).
//! * Rounds are serialised by one async mutex; a round that itself fails a member runs again.
//!   Nothing that can fail a member (and so needs a round) runs while holding it.

use crate::buf;
use crate::dev::BlockDev;
use crate::members::{MemberData, Members};
use futures::future::join_all;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use uraid_core::format::{MemberState, Superblock, SB_SIZE};
use uraid_core::MemberSet;

/// Who a member is on disk (defined with the assembly decision that produces it).
pub use uraid_core::assemble::MemberId;

/// A write's hold on "not clean" (`Metadata::hold_dirty`): safe mode does not mark the
/// array clean while one lives.
pub(crate) struct DirtyHold<'a>(&'a Metadata);

impl Drop for DirtyHold<'_> {
    fn drop(&mut self) {
        let m = self.0;
        m.last_write
            .store(m.epoch.elapsed().as_millis() as u64, Ordering::Release);
        m.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A safe-mode clean pass (`Metadata::begin_clean`): holds the first-write lock, so writers
/// wait until it is dropped.
pub(crate) struct CleanPass<'a> {
    meta: &'a Metadata,
    _first: tokio::sync::MutexGuard<'a, ()>,
}

impl Drop for CleanPass<'_> {
    fn drop(&mut self) {
        self.meta.cleaning.store(false, Ordering::SeqCst);
    }
}

/// What the superblock lock guards (`Metadata::lock`): the array's current superblock, who
/// each member is on disk, and a replacement's swap. Its fields are private to this module:
/// every edit is a `Metadata` method that states its rule and ends in the round that makes
/// it durable.
pub(crate) struct Meta {
    sb: Superblock,
    ids: Vec<MemberId>,
    /// A replace being finished (`Metadata::swap_round`): set before its round, moved on by
    /// the round, read back after it.
    swap: Option<Swap>,
}

/// Where the swap of a replacement into its slot stands (`Metadata::swap_round`).
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

pub(crate) struct Metadata {
    /// The superblock lock (`lock`). Lock order (array/mod.rs): taken after stripe,
    /// write-intent and journal locks, never before them.
    state: tokio::sync::Mutex<Meta>,
    /// Serialises the first write's preparation (`hold_dirty`) and safe mode's clean pass
    /// (`begin_clean`).
    first_write: tokio::sync::Mutex<()>,
    /// Writes in flight that rely on the superblocks saying "not clean" (`DirtyHold`).
    writers: AtomicU64,
    /// A safe-mode clean pass is deciding or running: new writers wait on `first_write`.
    cleaning: AtomicBool,
    /// When the last `DirtyHold` ended, in ms since `epoch` (safe mode's idle delay).
    last_write: AtomicU64,
    epoch: std::time::Instant,
    /// The failed set the superblocks on disk record.
    persisted: AtomicU64,
    /// Slots whose member was removed (`REMOVED_SLOT`), for status without the lock.
    removed: AtomicU64,
    /// Slots whose replace the superblocks on disk record (format version 7): a write that
    /// skipped such a slot's replacement (dropped since) waits for a round that clears the
    /// record (`failure_barrier`), so a restart never resumes a replacement that missed it.
    replace_on_disk: AtomicU64,
    dirty: AtomicBool,
    /// Members missing at assembly, and whether no write has marked the array dirty since:
    /// until then a round (a replace recorded or dropped, a member failing under reads)
    /// leaves their slots as the superblocks had them (their data is still current), and
    /// the first write's round (or a read decoded around them, `record_absent_failed`)
    /// records them failed.
    absent: MemberSet,
    absent_kept: AtomicBool,
    /// That round has completed (`absent_kept` is cleared before it runs, under the
    /// superblock lock).
    absent_recorded: AtomicBool,
    /// The superblocks on disk say "not clean" although this session wrote nothing (a
    /// journal replay made the array consistent): the clean stop writes "clean" anyway.
    clean_round_due: AtomicBool,
    /// The superblocks' event count after the last round (status).
    events: AtomicU64,
    /// Array identity, for status without taking the superblock lock.
    name: String,
    uuid: [u8; 16],
    ctime: u64,
    /// Read-only metadata: never write superblocks (bench on someone's array, tests).
    frozen: bool,
    /// The served set (`Superblock::served`, docs/format.md "Served while out of sync") as
    /// the superblocks had it at assembly, when resync was due then (else empty): slots
    /// whose devices may have served a torn stripe's bytes in an earlier session.
    served_before: MemberSet,
    /// Slots failed (recorded, or missing) at assembly: they served nothing this session.
    failed_at_start: MemberSet,
    /// Resync was due at assembly and has not finished: rounds record the served set
    /// (`served_now`); false: they write it empty.
    tracking: AtomicBool,
    /// This session's first client read has begun (`record_served`): from then on rounds
    /// count the devices in service as served.
    client_read: AtomicBool,
    /// The served set of this session is on disk (`record_served` ran).
    served_recorded: AtomicBool,
    /// Slots whose rebuild checkpoint a round dropped while resync was due (recorded
    /// failed): the checkpoint bounded what the device served, so from then on the slot
    /// counts as served (`record_states`).
    dropped: AtomicU64,
}

impl Metadata {
    /// `absent`: members missing at assembly. They count as known: a session that only
    /// reads never records them failed (their data is still current); the first write's
    /// round does.
    /// `resync_due`: the array needs resync (unclean stop, a level with redundancy, dirty
    /// regions): the served set is tracked until `in_sync`.
    pub(crate) fn new(
        sb: Superblock,
        ids: Vec<MemberId>,
        frozen: bool,
        absent: MemberSet,
        resync_due: bool,
    ) -> Metadata {
        let persisted: MemberSet = (0..sb.geometry.members)
            .filter(|&i| sb.is_failed(i))
            .collect::<MemberSet>()
            .union(absent);
        let served_before = if resync_due {
            sb.served
        } else {
            MemberSet::EMPTY
        };
        let removed: MemberSet = (0..sb.geometry.members)
            .filter(|&i| sb.is_removed(i))
            .collect();
        // The array's superblock is a member's (a spare's or a replacement's copy is never
        // the truth, `uraid_core::assemble::decide`); its rounds never carry their flags.
        let mut sb = sb;
        sb.spare = false;
        sb.replacement = false;
        if sb.clean {
            // A superblock marked clean (a replayed journal's) carries no served set.
            sb.served = MemberSet::EMPTY;
        }
        let replace_on_disk = if frozen {
            MemberSet::EMPTY
        } else {
            replace_set(&sb)
        };
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
            absent,
            absent_kept: AtomicBool::new(!absent.is_empty()),
            absent_recorded: AtomicBool::new(absent.is_empty()),
            first_write: tokio::sync::Mutex::new(()),
            writers: AtomicU64::new(0),
            cleaning: AtomicBool::new(false),
            last_write: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            persisted: AtomicU64::new(persisted.bits()),
            removed: AtomicU64::new(removed.bits()),
            replace_on_disk: AtomicU64::new(replace_on_disk.bits()),
            dirty: AtomicBool::new(false),
            clean_round_due: AtomicBool::new(false),
            frozen,
            served_before,
            failed_at_start: persisted,
            tracking: AtomicBool::new(resync_due && !frozen),
            client_read: AtomicBool::new(false),
            served_recorded: AtomicBool::new(!resync_due || frozen),
            dropped: AtomicU64::new(0),
        }
    }

    /// Slots whose devices may have served reads of stripes not yet in sync in an earlier
    /// session (the superblocks' served set at assembly; empty without resync due).
    pub(crate) fn served_before(&self) -> MemberSet {
        self.served_before
    }

    /// Resync finished: the served set written is empty from now on, and a round writes
    /// that now if the superblocks name any slot (every stripe is in sync: what a device
    /// served before is what the others hold, so a later start must not refuse decodes
    /// around it).
    pub(crate) async fn in_sync<D: BlockDev>(&self, members: &Members<D>) {
        if !self.tracking.swap(false, Ordering::AcqRel) {
            return;
        }
        Box::pin(async {
            let mut meta = self.state.lock().await;
            if !meta.sb.served.is_empty() {
                self.persist(members, &mut meta, true).await;
            }
        })
        .await
    }

    /// The served set a round writes now (`failed`: the round's snapshot): empty once the
    /// array is in sync (resync finished, or marked clean); else the slots served before
    /// this session, the slots whose rebuild checkpoint was dropped (`dropped`), and, once
    /// a client read began, every slot whose device serves reads this session
    /// (`Members::seen`: in service at assembly or rebuilt since) and every slot failed
    /// since assembly (a member being rebuilt served the units below its checkpoint). A
    /// session that only resyncs or writes serves nothing a client saw.
    fn served_now<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &Meta,
        failed: MemberSet,
    ) -> MemberSet {
        if meta.sb.clean || !self.tracking.load(Ordering::Acquire) {
            return MemberSet::EMPTY;
        }
        let mut set = self
            .served_before
            .union(MemberSet::from_bits(self.dropped.load(Ordering::Acquire)));
        if self.client_read.load(Ordering::Acquire) {
            set = set
                .union(members.seen())
                .union(failed.minus(self.failed_at_start));
        }
        set
    }

    /// Before the first client read of a session with resync due: a round writes the
    /// served set to every live member (also to those one event behind, whose older copy
    /// could otherwise be the freshest a later start finds), so a crash after this
    /// session's reads leaves the next one knowing which devices may have served torn
    /// stripes (docs/format.md, "Served while out of sync"). Cheap once done (one atomic
    /// load).
    pub(crate) async fn record_served<D: BlockDev>(&self, members: &Members<D>) {
        if self.served_recorded.load(Ordering::Acquire) {
            return;
        }
        Box::pin(async {
            let mut meta = self.state.lock().await;
            if self.served_recorded.load(Ordering::Acquire) {
                return;
            }
            self.client_read.store(true, Ordering::Release);
            self.persist(members, &mut meta, true).await;
            self.served_recorded.store(true, Ordering::Release);
        })
        .await
    }

    /// Before bytes decoded around members absent since assembly are served (a stripe not
    /// in sync that the members present showed to be one codeword): those members are
    /// recorded failed, as the first write's round would. Otherwise one could come back at
    /// the next start as an active member holding a torn write's other bytes, and a healthy
    /// read would return them after the decode was served.
    /// Returns once that round has completed, whoever ran it (the first write's, another
    /// read's): never while it is still being written.
    pub(crate) async fn record_absent_failed<D: BlockDev>(&self, members: &Members<D>) {
        if self.absent_recorded.load(Ordering::Acquire) {
            return;
        }
        Box::pin(async {
            let mut meta = self.state.lock().await;
            if self.absent_kept.swap(false, Ordering::AcqRel) {
                self.persist(members, &mut meta, true).await;
            }
            self.absent_recorded.store(true, Ordering::Release);
        })
        .await
    }

    /// Members missing at assembly.
    pub(crate) fn absent(&self) -> MemberSet {
        self.absent
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

    /// The array's name, uuid and creation time (fixed at creation).
    pub(crate) fn identity(&self) -> (&str, [u8; 16], u64) {
        (&self.name, self.uuid, self.ctime)
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

// The steps of one superblock round (`Metadata::persist`), each against one snapshot of
// the failed set (`failed`).

/// A replacement being swapped in takes the slot's identity in this round (only if the slot
/// is live: a failed one keeps its old uuid, and the takeover names the replacement in its
/// own round). From here it cannot be dropped. Returns (slot, generation, the slot's old
/// identity) when it does; a replacement that cannot be marked swapping fails the swap.
fn swap_begin<D: BlockDev>(
    members: &Members<D>,
    meta: &mut Meta,
    failed: MemberSet,
) -> Option<(usize, usize, MemberId)> {
    let Some(Swap::Pending { slot: s, gen, uuid }) = meta.swap else {
        return None;
    };
    if failed.contains(s) {
        return None;
    }
    if !members.begin_swap(s, gen) {
        meta.swap = Some(Swap::Failed);
        return None;
    }
    let old = meta.ids[s];
    meta.ids[s] = MemberId {
        uuid,
        sb_slot: 1,
        events: meta.sb.events,
    };
    // The replace ends in this round: its record goes.
    meta.sb.replaces[s] = None;
    Some((s, gen, old))
}

/// Every member's state in the round's superblock, against the same snapshot of the failed
/// set: a rebuilding member that fails meanwhile is written as rebuilding (its next round
/// records it failed), never as active. `served`: the round's served set
/// (`Metadata::served_now`).
fn record_states<D: BlockDev>(
    members: &Members<D>,
    meta: &mut Meta,
    failed: MemberSet,
    kept: MemberSet,
    served: MemberSet,
) {
    meta.sb.served = served;
    let rebuilding = members.rebuilding_marked().minus(failed);
    for i in 0..members.count() {
        if kept.contains(i) {
            // Absent since assembly and nothing written yet (`Metadata::absent`): its
            // slot stays as the superblocks had it; a replace record goes all the same.
            meta.sb.replaces[i] = None;
            continue;
        }
        meta.sb.states[i] = if failed.contains(i) {
            MemberState::Failed
        } else if rebuilding.contains(i) {
            MemberState::Rebuilding
        } else {
            MemberState::Active
        };
        // Only the rebuild moves a checkpoint (`persist_rebuilt`, after flushing the
        // member): a round for another reason keeps the last one.
        if meta.sb.states[i] != MemberState::Rebuilding {
            meta.sb.rebuilt[i] = 0;
        }
        if meta.ids[i].uuid != [0; 16] {
            meta.sb.slot_uuids[i] = meta.ids[i].uuid;
        }
        // A replace record lasts while its replacement is attached to a live slot (it is
        // set and moved only by `record_replace` and `persist_copied`).
        if failed.contains(i) || members.replacement(i).is_none() {
            meta.sb.replaces[i] = None;
        }
    }
    // Bad-block lists: the live ones (`Members::mark_bad` before the round that a rebuild
    // checkpoint past the unit rides on; `clear_bad` only after the chunk was flushed).
    meta.sb.bad = members.bad_blocks();
}

/// A replacement being swapped in (`swap_begin`'s slot, generation and old identity) gets
/// its superblock first, durably, before any other member's names it: a crash in between
/// leaves a round one event behind on the others (taken), never a slot naming a device with
/// no superblock. Returns the slot if it was swapped in, and whether the round must run again.
async fn write_swapped<D: BlockDev>(
    members: &Members<D>,
    meta: &mut Meta,
    (s, gen, old): (usize, usize, MemberId),
) -> (Option<usize>, bool) {
    let (slot, at, block) = superblock_of(meta, s);
    let r = match members.write_gen(s, gen, at, block).await {
        Ok(()) => members.flush_gen(s, gen).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => {
            // Named on disk (first): it is the slot's device from now on, in one store; the
            // old one is retired and never written again.
            meta.ids[s].sb_slot = slot;
            meta.ids[s].events = meta.sb.events;
            meta.swap = Some(Swap::Done);
            members.promote_replacement(s);
            (Some(s), false)
        }
        Err(e) => {
            // The slot keeps the old device: this pass names it again, and a second pass
            // moves the others one event past anything the replacement may hold (a write
            // that landed before its flush failed), so the two never tie at assembly. Events
            // move by one per pass, never two.
            tracing::error!("member {s}: writing its replacement's superblock failed: {e}");
            meta.swap = Some(Swap::Failed);
            meta.ids[s] = old;
            meta.sb.slot_uuids[s] = old.uuid;
            (None, true)
        }
    }
}

/// Writes the round's superblock to every member of `live` but `swapped` (written first, by
/// `write_swapped`), each into its other slot, flushed; a member that fails is marked
/// failed. Returns whether one did (the round runs again to record it).
async fn write_round<D: BlockDev>(
    members: &Members<D>,
    meta: &mut Meta,
    live: MemberSet,
    swapped: Option<usize>,
) -> bool {
    let writes = live.iter().filter(|&i| swapped != Some(i)).map(|i| {
        let (slot, at, block) = superblock_of(meta, i);
        async move {
            // Superblocks go to the current device only: never mirrored to a replacement,
            // which must not claim the slot before it has it.
            let r = match members.write_cur(i, at, block).await {
                Ok(()) => members.flush(i).await,
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
                    "member {i} ({}): superblock update failed: {}; marking it faulty",
                    members.name(i).unwrap_or("?"),
                    crate::dev::explain(&e)
                );
                members.mark_failed(i);
                newly = true;
            }
        }
    }
    newly
}

impl Metadata {
    /// Marks a member failed (logging the cause) and waits until the failure is durable.
    pub(crate) async fn fail_member<D: BlockDev>(
        &self,
        members: &Members<D>,
        member: usize,
        err: &io::Error,
    ) {
        if crate::members::is_stale(err) {
            // From the device the slot had before: its failure is on disk already.
            tracing::debug!("member {member}: {err}");
            return;
        }
        if members.mark_failed(member) {
            tracing::error!(
                "member {member} ({}) failed: {}; marking it faulty",
                members.name(member).unwrap_or("?"),
                crate::dev::explain(err)
            );
        }
        self.failure_barrier(members).await;
    }

    /// Waits until every failure known now is recorded in the superblocks of the survivors.
    /// Cheap when nothing failed since the last round (two atomic loads).
    pub(crate) async fn failure_barrier<D: BlockDev>(&self, members: &Members<D>) {
        let f = members.failed();
        if f.minus(self.persisted()).is_empty() {
            if self.replace_record_stale(members) {
                // A replace recorded on disk lost its replacement: the record goes before
                // a write the replacement missed is acknowledged.
                return Box::pin(async {
                    let mut meta = self.state.lock().await;
                    if self.replace_record_stale(members) {
                        self.persist(members, &mut meta, true).await;
                    }
                })
                .await;
            }
            if members.replacement_failures().is_empty() {
                return;
            }
            // A replacement failed while being swapped in: its swap round (which holds the
            // superblock lock) decides whether that failed the slot; wait for it.
            Box::pin(async { drop(self.state.lock().await) }).await;
            if members.failed().minus(self.persisted()).is_empty() {
                return;
            }
        }
        // Boxed: the superblock round is a large future that every write would otherwise
        // carry (and move) for nothing.
        Box::pin(async {
            let mut meta = self.state.lock().await;
            self.persist(members, &mut meta, false).await;
        })
        .await
    }

    /// Writes a superblock round if the failed set changed (or `force`), until one round
    /// completes without failing anyone new.
    pub(crate) async fn persist<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        force: bool,
    ) {
        let mut force = force;
        loop {
            let failed = members.failed();
            if !force && failed.minus(self.persisted()).is_empty() {
                return;
            }
            force = false;
            if self.frozen {
                // Nothing is written; the in-memory failure is all there is.
                self.persisted.store(failed.bits(), Ordering::Release);
                return;
            }
            self.catch_up(members, meta, failed).await;
            // Event counts only grow: assembly trusts the member with the highest.
            assert!(
                meta.sb.events >= self.events(),
                "superblock events moving backwards: {} after {}",
                meta.sb.events,
                self.events()
            );
            meta.sb.events += 1;
            meta.sb.utime = now();
            let swap_old = swap_begin(members, meta, failed);
            let kept = if self.absent_kept.load(Ordering::Acquire) {
                self.absent
                    .iter()
                    .filter(|&i| failed.contains(i) && meta.ids[i].uuid == [0; 16])
                    .collect()
            } else {
                MemberSet::EMPTY
            };
            // A member being rebuilt that this round records failed loses its checkpoint,
            // which bounded the units it served: from now on it counts as served.
            // (Not a device given to the slot this session: it holds only checked decodes,
            // or, re-added, its own chunks of regions that were in sync: recovery/readd.rs.)
            for i in failed.minus(kept).iter() {
                if meta.sb.is_rebuilding(i) && meta.sb.rebuilt[i] > 0 && members.generation(i) == 0
                {
                    self.dropped.fetch_or(1 << i, Ordering::AcqRel);
                }
            }
            let served = self.served_now(members, meta, failed);
            record_states(members, meta, failed, kept, served);
            let live = MemberSet::all(members.count()).minus(failed);
            let (swapped, again) = match swap_old {
                Some(old) => write_swapped(members, meta, old).await,
                None => (None, false),
            };
            let newly = write_round(members, meta, live, swapped).await;
            // Exactly what this round wrote (a slot given a new device is no longer failed
            // on disk; its next failure must be written again).
            self.persisted.store(failed.bits(), Ordering::Release);
            self.replace_on_disk
                .store(replace_set(&meta.sb).bits(), Ordering::Release);
            self.events.store(meta.sb.events, Ordering::Release);
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
    async fn catch_up<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        failed: MemberSet,
    ) {
        let behind: Vec<usize> = MemberSet::all(members.count())
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
                let r = match members.write_cur(i, at, block).await {
                    Ok(()) => members.flush(i).await,
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
                    tracing::error!(
                        "member {i} ({}): superblock update failed: {}; marking it faulty",
                        members.name(i).unwrap_or("?"),
                        crate::dev::explain(&e)
                    );
                    members.mark_failed(i);
                }
            }
        }
    }

    /// Records the rebuild checkpoints `to` (member, units it holds) in a superblock round.
    /// Caller flushed those members after the writes the checkpoints cover. A member whose
    /// rebuild finished (no longer rebuilding) is recorded active.
    pub(crate) async fn persist_rebuilt<D: BlockDev>(
        &self,
        members: &Members<D>,
        to: &[(usize, u64, usize)],
    ) {
        let mut meta = self.state.lock().await;
        // (slot, checkpoint, device generation it was taken for): a slot given another
        // device before this lock was taken keeps what the round that named it wrote (its
        // checkpoint 0); one given another device after it is named by a later round.
        for &(i, r, gen) in to {
            if members.generation(i) == gen {
                meta.sb.rebuilt[i] = r;
            }
        }
        self.persist(members, &mut meta, true).await;
    }

    /// A superblock round that records the bad-block lists as they are now
    /// (`Members::bad_blocks`).
    pub(crate) async fn persist_bad<D: BlockDev>(&self, members: &Members<D>) {
        let mut meta = self.state.lock().await;
        self.persist(members, &mut meta, true).await;
    }

    /// The superblocks say "not clean" but the array is consistent (journal replayed): the
    /// next clean stop records "clean" even if nothing is written meanwhile.
    pub(crate) fn clean_round_due(&self) {
        self.clean_round_due.store(true, Ordering::Release);
    }

    /// Whether superblocks are never written (read-only benchmarks).
    pub(crate) fn frozen(&self) -> bool {
        self.frozen
    }

    /// A superblock round recording that the array has no journal any more (the journal
    /// failed: bitmap mode from now on, journal.rs).
    pub(crate) async fn drop_journal<D: BlockDev>(&self, members: &Members<D>) {
        if self.frozen {
            return;
        }
        let mut meta = self.state.lock().await;
        if meta.sb.journal.take().is_some() {
            self.persist(members, &mut meta, true).await;
        }
    }

    /// Before a write: superblocks say "not clean" (a round, the first time in a session
    /// and after every safe-mode clean pass), then `sync_bitmap` runs (every member's bitmap
    /// copy made equal to the bits in memory, `WriteIntent::sync_all`) before any write
    /// relies on them. The returned hold keeps safe mode from marking the array clean until
    /// it is dropped (after the write's member I/O). Not under the superblock lock: a member
    /// failing there is recorded by a superblock round.
    ///
    /// Safe mode's rule (with `begin_clean`): a writer counts itself in `writers` and then
    /// reads `dirty` and `cleaning`; the clean pass sets `cleaning` and then reads
    /// `writers` (all SeqCst). So either the writer sees the pass and waits for it on
    /// `first_write`, or the pass sees the writer and gives up: "clean" is never written
    /// while a write that relies on "not clean" is on its way to the members.
    pub(crate) async fn hold_dirty<D: BlockDev>(
        &self,
        members: &Members<D>,
        sync_bitmap: impl std::future::Future<Output = ()>,
    ) -> DirtyHold<'_> {
        self.writers.fetch_add(1, Ordering::SeqCst);
        if self.dirty.load(Ordering::SeqCst) && !self.cleaning.load(Ordering::SeqCst) {
            return DirtyHold(self);
        }
        self.writers.fetch_sub(1, Ordering::SeqCst);
        Box::pin(async {
            // A clean pass holds this lock from deciding to its last round.
            let _first = self.first_write.lock().await;
            if !self.dirty.load(Ordering::Acquire) {
                {
                    let mut meta = self.state.lock().await;
                    meta.sb.clean = false;
                    // From this write on, members absent since assembly miss data.
                    self.absent_kept.store(false, Ordering::Release);
                    self.persist(members, &mut meta, true).await;
                    self.absent_recorded.store(true, Ordering::Release);
                }
                sync_bitmap.await;
                self.dirty.store(true, Ordering::SeqCst);
            }
            self.writers.fetch_add(1, Ordering::SeqCst);
            DirtyHold(self)
        })
        .await
    }

    /// Milliseconds since the last write that held the array dirty ended (safe mode).
    pub(crate) fn idle_ms(&self) -> u64 {
        let now = self.epoch.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_write.load(Ordering::Acquire))
    }

    /// Safe mode: begins a clean pass if the array is dirty and no write holds it dirty.
    /// While the pass lives, new writers wait (`hold_dirty`); the caller drains, flushes
    /// and checkpoints, then calls `record_clean`. None: a writer is in flight or marking
    /// the array dirty, or nothing to do.
    pub(crate) fn begin_clean(&self) -> Option<CleanPass<'_>> {
        if self.frozen || !self.dirty.load(Ordering::Acquire) {
            return None;
        }
        let first = self.first_write.try_lock().ok()?;
        self.cleaning.store(true, Ordering::SeqCst);
        let pass = CleanPass {
            meta: self,
            _first: first,
        };
        if self.writers.load(Ordering::SeqCst) != 0 || !self.dirty.load(Ordering::SeqCst) {
            return None;
        }
        Some(pass)
    }

    /// The last round of a clean stop (the caller drained, flushed and checkpointed): if
    /// anything was written since assembly (or a replay left a clean round due) and
    /// `still_due()` (asked under the superblock lock: an unfinished resync) is false, the
    /// superblocks record "clean".
    pub(crate) async fn record_clean<D: BlockDev>(
        &self,
        members: &Members<D>,
        still_due: impl FnOnce() -> bool,
    ) {
        let mut meta = self.state.lock().await;
        // An unfinished resync keeps the array "not clean": the next start resyncs again.
        let due =
            self.dirty.load(Ordering::Acquire) || self.clean_round_due.load(Ordering::Acquire);
        if due && !still_due() {
            meta.sb.clean = true;
            self.persist(members, &mut meta, true).await;
            self.dirty.store(false, Ordering::Release);
            self.clean_round_due.store(false, Ordering::Release);
        }
    }

    /// The superblock lock: a round, or an operator command's check and its round.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Meta> {
        self.state.lock().await
    }

    /// The array's current superblock (a spare added while serving carries a copy).
    pub(crate) async fn superblock(&self) -> Superblock {
        self.state.lock().await.sb.clone()
    }

    /// Removes slot `i`'s member (the caller checked, under this lock, that it is failed):
    /// the slot names no device (`REMOVED_SLOT`) from this round on, so its old device is
    /// refused at assembly and the slot waits for a new one. Durable when it returns.
    pub(crate) async fn remove_slot<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        i: usize,
    ) {
        meta.ids[i].uuid = uraid_core::format::REMOVED_SLOT;
        self.removed.fetch_or(1 << i, Ordering::AcqRel);
        self.persist(members, meta, true).await;
    }

    /// Before failed slot `slot` gets a new device: its failure is on disk (state failed, no
    /// rebuild checkpoint, its old uuid), writing a round if it is not yet, so a crash
    /// before the round that names the new device leaves the slot failed, never trusting
    /// the new device. (A slot absent since assembly with nothing written yet is kept as the
    /// superblocks had it, active: its device's data is current then.)
    pub(crate) async fn failure_on_disk<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        slot: usize,
    ) {
        if !self.persisted().contains(slot)
            || meta.sb.states[slot] != MemberState::Failed
            || meta.sb.rebuilt[slot] != 0
        {
            self.persist(members, meta, true).await;
        }
    }

    /// Names device `uuid` in slot `slot`, which was just given it (`failure_on_disk` ran
    /// first, its metadata area is zeroed), rebuilding from unit 0, in one round. The device
    /// gets its first superblock from that round (`sb_slot: 1`: it is written to slot 0), so
    /// a torn round leaves it without any: missing, never trusted. A re-added device
    /// (recovery/readd.rs) keeps its old superblock in slot 1 meanwhile: at least two events
    /// behind the round, or in a slot that round records rebuilding, so never taken (nor
    /// forced) as active. A device that fails the round leaves the slot failed
    /// (`members.is_failed(slot)` afterwards).
    pub(crate) async fn name_rebuilding<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        slot: usize,
        uuid: [u8; 16],
    ) {
        meta.ids[slot] = MemberId {
            uuid,
            sb_slot: 1,
            events: meta.sb.events,
        };
        if meta.sb.is_rebuilding(slot) && meta.sb.rebuilt[slot] > 0 {
            // A slot absent since assembly, kept as the superblocks had it: the checkpoint
            // that goes bounded what its old device served.
            self.dropped.fetch_or(1 << slot, Ordering::AcqRel);
        }
        meta.sb.rebuilt[slot] = 0;
        self.removed.fetch_and(!(1 << slot), Ordering::AcqRel);
        members.start_rebuilding(slot);
        self.persist(members, meta, true).await;
    }

    /// The swap of replacement `gen` (device `uuid`) into live slot `slot`, in one round
    /// (`persist`: the replacement's superblock is written first, then it is promoted and
    /// named by the others). Returns how it stands: `Done` (the superblocks name it),
    /// `Failed` (the slot names the old device, one event past anything the replacement may
    /// hold) or `Pending` (the slot failed before the round: it kept its old identity).
    pub(crate) async fn swap_round<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        slot: usize,
        gen: usize,
        uuid: [u8; 16],
    ) -> Swap {
        let pending = Swap::Pending { slot, gen, uuid };
        meta.swap = Some(pending);
        self.persist(members, meta, true).await;
        meta.swap.take().unwrap_or(pending)
    }

    /// Runs `op` on every live member of `set` concurrently. A member whose op fails is
    /// failed (durably, before this returns); the successes are returned. This is the one
    /// place whole-array operations (flush, metadata pages) apply the error policy.
    pub(crate) async fn each_live<D: BlockDev, T, F, Fut>(
        &self,
        members: &Members<D>,
        set: MemberSet,
        op: F,
    ) -> Vec<(usize, T)>
    where
        F: Fn(usize) -> Fut,
        Fut: std::future::Future<Output = io::Result<T>>,
    {
        let live = set.minus(members.failed());
        let results = join_all(live.iter().map(|i| {
            let f = op(i);
            async move { (i, f.await) }
        }))
        .await;
        let mut ok = Vec::with_capacity(results.len());
        for (i, r) in results {
            match r {
                Ok(v) => ok.push((i, v)),
                Err(e) => self.fail_member(members, i, &e).await,
            }
        }
        ok
    }

    /// Writes `(member, data-area offset, buffer)` concurrently. A member whose write fails
    /// is failed: what was written stays consistent without it.
    pub(crate) async fn write_members<D: BlockDev, T: Into<MemberData>>(
        &self,
        members: &Members<D>,
        writes: Vec<(usize, u64, T)>,
    ) {
        let results = join_all(
            writes
                .into_iter()
                .map(|(m, at, b)| async move { (m, members.write(m, at, b).await) }),
        )
        .await;
        for (m, r) in results {
            if let Err(e) = r {
                self.fail_member(members, m, &e).await;
            }
        }
    }

    /// Flushes every live member (whatever the journal mode) and waits for the failure
    /// barrier; the member writes that bypassed the journal until now are then flushed
    /// (`Members::unjournaled_covered`).
    pub(crate) async fn flush_members<D: BlockDev>(&self, members: &Members<D>) {
        let seen = members.unjournaled_issued();
        let all = MemberSet::all(members.count());
        self.each_live(members, all, |i| members.flush(i)).await;
        self.failure_barrier(members).await;
        members.unjournaled_covered(seen);
    }
}

// ---- Persisted replace (format version 7; recovery/replace.rs) ----------------------------

/// The slots whose replace `sb` records.
fn replace_set(sb: &Superblock) -> MemberSet {
    (0..sb.replaces.len())
        .filter(|&i| sb.replaces[i].is_some())
        .collect()
}

impl Meta {
    /// The replace of slot `slot` the current superblock records.
    pub(crate) fn replace_record(&self, slot: usize) -> Option<uraid_core::format::ReplaceRecord> {
        self.sb.replaces[slot]
    }

    /// The device uuid slot `slot` names (the next round writes it): `REMOVED_SLOT` after
    /// `remove`, a new device's once one was named there.
    pub(crate) fn slot_uuid(&self, slot: usize) -> [u8; 16] {
        match self.ids[slot].uuid {
            // Absent since assembly: the superblocks' record stands.
            u if u == [0; 16] => self.sb.slot_uuids[slot],
            u => u,
        }
    }
}

impl Metadata {
    /// Whether a replace the superblocks on disk record has lost its replacement (cheap:
    /// one atomic load when none is recorded).
    fn replace_record_stale<D: BlockDev>(&self, members: &Members<D>) -> bool {
        let on = MemberSet::from_bits(self.replace_on_disk.load(Ordering::Acquire));
        on.iter().any(|i| members.replacement(i).is_none())
    }

    /// Before slot `slot` is given a replacement: a replace record of an earlier
    /// replacement of it (dropped, the round that clears it not yet written) is cleared
    /// first, so the new replacement never inherits its checkpoint.
    pub(crate) async fn clear_stale_replace<D: BlockDev>(
        &self,
        members: &Members<D>,
        meta: &mut Meta,
        slot: usize,
    ) {
        if meta.sb.replaces[slot].is_some() && members.replacement(slot).is_none() && !self.frozen {
            self.persist(members, meta, true).await;
        }
    }

    /// Records in one round that slot `slot` is being replaced by device `uuid` (attached as
    /// its replacement generation `gen`), which holds the units below `copied` (0 for a new
    /// replace; a resumed one's first unit to walk). False if the replacement is no longer
    /// attached afterwards (failed during the round: nothing recorded).
    pub(crate) async fn record_replace<D: BlockDev>(
        &self,
        members: &Members<D>,
        slot: usize,
        gen: usize,
        uuid: [u8; 16],
        copied: u64,
    ) -> bool {
        if self.frozen {
            return members.replacement(slot).map(|r| r.0) == Some(gen);
        }
        let mut meta = self.state.lock().await;
        if members.replacement(slot).map(|r| r.0) != Some(gen) {
            return false;
        }
        meta.sb.replaces[slot] = Some(uraid_core::format::ReplaceRecord { uuid, copied });
        self.persist(members, &mut meta, true).await;
        meta.sb.replaces[slot].is_some_and(|r| r.uuid == uuid)
    }

    /// Moves the copy checkpoint of slot `slot`'s replace (device `uuid`, generation `gen`)
    /// to `copied` in a round. The caller flushed the replacement after every copy and
    /// write below `copied`. Nothing if that replace is no longer the slot's.
    pub(crate) async fn persist_copied<D: BlockDev>(
        &self,
        members: &Members<D>,
        slot: usize,
        gen: usize,
        uuid: [u8; 16],
        copied: u64,
    ) {
        if self.frozen {
            return;
        }
        let mut meta = self.state.lock().await;
        let ours = meta.sb.replaces[slot].is_some_and(|r| r.uuid == uuid && r.copied < copied);
        if ours && members.replacement(slot).map(|r| r.0) == Some(gen) {
            meta.sb.replaces[slot] = Some(uraid_core::format::ReplaceRecord { uuid, copied });
            self.persist(members, &mut meta, true).await;
        }
    }

    /// Drops every recorded replace whose replacement is not attached (after assembly:
    /// replacements that were not given), in a round, so none resumes later with writes it
    /// missed.
    pub(crate) async fn drop_unattached_replaces<D: BlockDev>(&self, members: &Members<D>) {
        if self.frozen {
            return;
        }
        let mut meta = self.state.lock().await;
        let stale = (0..meta.sb.replaces.len())
            .any(|i| meta.sb.replaces[i].is_some() && members.replacement(i).is_none());
        if stale {
            self.persist(members, &mut meta, true).await;
        }
    }
}

// ---- end of the persisted replace ---------------------------------------------------------

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
