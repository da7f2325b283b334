//! Operator member administration on a running array: fail, remove, add (or a hot spare
//! taking over). Each check and its superblock round run under the superblock lock
//! (`Metadata::lock`), so two operator commands at once cannot both pass a check.

use super::Array;
use crate::dev::BlockDev;
use crate::metadata::Meta;
use uraid_core::format::{Superblock, SB_SIZE, SB_SLOTS};
use uraid_core::MemberSet;

impl<D: BlockDev> Array<D> {
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
                let _meta = a.meta.lock().await;
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
    /// refused without `force` (mdadm removes only failed devices); with it, failed first,
    /// with `fail_by_operator`'s refusals (which `force` also passes). Durable when it
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
        } else if !force {
            return Err(in_service(i));
        } else {
            self.fail_by_operator(i, force).await?;
            "active"
        };
        self.on_reactor(move |a| async move {
            let mut meta = a.meta.lock().await;
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
            a.meta.remove_slot(&a.members, &mut meta, i).await;
            // The server lets go of the device (it can be added again, or used elsewhere).
            a.members.remove_device(i);
            tracing::warn!("member {i} ({name}) removed from the array");
            Ok(format!("member {i} ({name}, {was}) removed"))
        })
        .await
        .unwrap_or_else(|| Err("the server is stopping".to_string()))
    }

    /// Puts `dev` into the lowest failed slot of the running array (`uraid add` on a server,
    /// or a hot spare taking over), durably: its metadata area is zeroed (no stale map or
    /// bitmap can be merged from it), then in one superblock round the slot is recorded
    /// rebuilding from unit 0 with `uuid` (the new member gets its superblock too); from
    /// then on writes reach it and the rebuild (`Array::rebuild`) fills it. The caller then
    /// rewrites the member metadata (`Volume::add_member` does).
    ///
    /// A former member the slot still names goes back into its own slot with its own uuid
    /// instead (only its map and bitmap copies zeroed: its superblocks stay until the round
    /// overwrites one), and its rebuild regenerates only the write-intent regions dirty since
    /// it left (recovery/readd.rs; `Added::readd`).
    pub async fn add_member_online(
        self: &std::sync::Arc<Self>,
        dev: D,
        uuid: [u8; 16],
    ) -> Result<Added, String> {
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

    async fn add_member_here(&self, dev: D, uuid: [u8; 16]) -> Result<Added, String> {
        let name = dev.name().to_string();
        // The metadata area is cleared before the superblock lock (a hanging new device
        // must not hold it), and the slot chosen under it.
        if !self.can_take_member() {
            return Err("the array has no failed or missing member to replace".into());
        }
        // A former member of its own slot (read before anything is cleared): its superblocks
        // stay until the slot is chosen (a re-add refused before then leaves its superblocks, forcible
        // into a later assembly), its map and bitmap copies go (never merged stale). No bit
        // is cleared from now until its rebuild has copied them (recovery/readd.rs).
        let mut former = self.readd_candidate(&dev).await;
        let mut hold = None;
        if former.is_some() {
            hold = Some(self.intent.hold_clears().await);
            self.clear_member_metadata(&dev).await?;
        } else {
            self.clear_metadata_area(&dev).await?;
        }
        // No journal record that wrote a failed slot's old member may be replayed onto the
        // new device (`Journal::retire_slot`): the failures durable, then those records
        // checkpointed away, before the slot is chosen (again, if another failed meanwhile).
        let mut retired = MemberSet::EMPTY;
        let (mut meta, slot, readd) = loop {
            self.failure_barrier().await;
            for i in self.members.failed().minus(retired).iter() {
                self.journal_retire_slot(i).await;
                retired = retired.with(i);
            }
            // Past the tolerance the records stay (a forced assembly may want them), so no
            // device may take a slot they wrote.
            self.check_serving().map_err(|e| e.to_string())?;
            let meta = self.meta.lock().await;
            // A former member goes back into its own slot if that still names it.
            let back = former.filter(|f| {
                self.members.is_failed(f.slot)
                    && self.members.replacement(f.slot).is_none()
                    && meta.slot_uuid(f.slot) == f.uuid
            });
            if former.is_some() && back.is_none() {
                // Its slot changed meanwhile: a new member after all, cleared whole first.
                drop(meta);
                (former, hold) = (None, None);
                self.clear_metadata_area(&dev).await?;
                continue;
            }
            // A slot whose old member failed during a replace is its replacement's.
            let Some(slot) = back.map(|f| f.slot).or_else(|| {
                self.members
                    .failed()
                    .iter()
                    .find(|&i| self.members.replacement(i).is_none())
            }) else {
                return Err("the array has no failed or missing member to replace".into());
            };
            if retired.contains(slot) {
                if self.journal_slot_retired(slot) {
                    break (meta, slot, back.is_some());
                }
                // Records wrote the slot after it was retired: another device held it
                // meanwhile (a replacement that took over, then failed). Again.
                drop(meta);
                retired = retired.without(slot);
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
        // Its bad-block ranges, which the new device forgets (`start_rebuilding`): a former
        // member does not hold those chunks.
        let bad = self.members.bad_blocks();
        // The old device leaves now, unless it is this one (re-add) or was noted removed.
        let note = !readd && !self.meta.removed().contains(slot);
        if self.members.install(slot, dev, note).is_err() {
            return Err(format!("slot {slot}: no room for another device"));
        }
        let gen = self.members.generation(slot);
        let uuid = match (readd, former) {
            (true, Some(f)) => f.uuid,
            _ => uuid,
        };
        self.start_rebuilding_slot(meta, slot, uuid, &name).await?;
        if !readd {
            tracing::warn!(
                "member {slot}: {name} added in place of the failed member; it is rebuilt from \
                 unit 0"
            );
            return Ok(Added { slot, readd: None });
        }
        // The slot is not failed any more: every write planned from now on reaches it, every
        // earlier one set its bits before it was planned, and none was cleared since it
        // failed (recovery/readd.rs).
        let units = self.register_readd(slot, gen, bad);
        drop(hold);
        tracing::warn!(
            "member {slot}: {name} re-added (it is the slot's former device): {units} of {} \
             units are in write-intent regions dirty since it left and are rebuilt; it holds \
             the rest",
            self.geo.units()
        );
        Ok(Added {
            slot,
            readd: Some(units),
        })
    }

    /// Lets go of failed member `i`'s device (its exclusive claim), so that the same device
    /// can be opened again to come back (`uraid add` of a failed member's own path). No
    /// I/O goes to a failed slot; one still on its way reaches nothing. False: `i` is not
    /// failed, or is a replace's.
    pub fn let_go_of_failed(&self, i: usize) -> bool {
        let ok = i < self.geo.members
            && self.members.is_failed(i)
            && self.members.replacement(i).is_none();
        if ok {
            self.members.retire(i, self.members.generation(i));
        }
        ok
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

    /// Zeroes and flushes a former member's bitmap and allocation-map copies (between its
    /// superblocks and the data area): none can be merged stale at an assembly before they
    /// are rewritten. Its superblocks stay.
    pub(crate) async fn clear_member_metadata(&self, dev: &D) -> Result<(), String> {
        let at = (SB_SIZE * SB_SLOTS) as u64;
        let zeros = crate::buf::alloc((self.members.data_offset() - at) as usize);
        let (r, _) = dev.write(at, zeros).await;
        r.and(dev.flush().await)
            .map_err(|e| format!("{}: clearing its map and bitmap copies: {e}", dev.name()))
    }

    /// Zeroes and flushes a new device's bytes before the data area: no stale superblock,
    /// bitmap or map sector with a valid checksum can survive on it.
    pub(crate) async fn clear_metadata_area(&self, dev: &D) -> Result<(), String> {
        let zeros = crate::buf::alloc(self.members.data_offset() as usize);
        let (r, _) = dev.write(0, zeros).await;
        r.and(dev.flush().await)
            .map_err(|e| format!("{}: clearing its metadata area: {e}", dev.name()))
    }

    /// Before a failed slot gets a new device: its failure is on disk
    /// (`Metadata::failure_on_disk`).
    pub(crate) async fn failure_on_disk(&self, meta: &mut Meta, slot: usize) {
        self.meta.failure_on_disk(&self.members, meta, slot).await;
    }

    /// Slot `slot` was just given its new device (its metadata area zeroed; a re-added one's
    /// map and bitmap copies): it is recorded
    /// rebuilding from unit 0 with device uuid `uuid` in one round
    /// (`Metadata::name_rebuilding`), the superblock lock released, then every bitmap copy
    /// is made equal to memory. The caller rewrites the map pages.
    pub(crate) async fn start_rebuilding_slot(
        &self,
        mut meta: tokio::sync::MutexGuard<'_, Meta>,
        slot: usize,
        uuid: [u8; 16],
        name: &str,
    ) -> Result<(), String> {
        self.meta
            .name_rebuilding(&self.members, &mut meta, slot, uuid)
            .await;
        drop(meta);
        if self.members.is_failed(slot) {
            return Err(format!(
                "{name}: its superblock could not be written; failed again"
            ));
        }
        // Every member's bitmap copy (the new one's is zero) made equal to memory.
        self.intent.sync_all(&self.meta, &self.members).await;
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
        self.meta.superblock().await
    }
}

/// What `add_member_online` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// The slot the device went into.
    pub slot: usize,
    /// Some: a former member put back into its own slot (re-add), with the units of the
    /// write-intent regions dirty since it left (what its rebuild regenerates, at most).
    /// None: a new member, rebuilt from unit 0.
    pub readd: Option<u64>,
}

/// Why `remove` refuses member `i` while it is in service (online and offline alike).
pub(crate) fn in_service(i: usize) -> String {
    format!(
        "member {i} is in service (active or rebuilding): fail it first (uraid fail {i}), or \
         pass --force to fail and remove it at once"
    )
}
