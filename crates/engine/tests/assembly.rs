//! Assembly decisions (`assemble::decide`): members one event behind (a torn superblock
//! round) are taken, staler ones refused unless forced, members marked failed refused.

use uraid_core::format::MemberState;
use uraid_core::{Geometry, Level};
use uraid_engine::assemble::{decide, Found};
use uraid_sim::sim_superblock;

fn found(events: &[u64], failed: &[usize]) -> Vec<Found> {
    let g = Geometry::new(Level::Raid6, events.len(), 4096, 1 << 20).unwrap();
    let max = *events.iter().max().unwrap();
    events
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let mut sb = sim_superblock(g);
            sb.index = i;
            sb.device_uuid = uraid_sim::device_uuid(i);
            sb.events = e;
            if e == max {
                for &f in failed {
                    sb.states[f] = MemberState::Failed;
                }
            }
            Found {
                path: format!("m{i}").into(),
                sb,
                slot: 0,
            }
        })
        .collect()
}

#[test]
fn a_member_one_event_behind_is_taken() {
    // A round torn after it reached members 0..3: the others are one event behind.
    let plan = decide(found(&[8, 8, 8, 7, 7, 7], &[]), Vec::new(), false).unwrap();
    assert!(plan.missing().is_empty(), "{:?}", plan.refused);
    plan.can_start().unwrap();
    // Without the margin, half the array would be "stale" and RAID6 could not start.
}

#[test]
fn staler_members_are_refused_unless_forced() {
    let f = || found(&[9, 9, 9, 6, 6, 5], &[]);
    let plan = decide(f(), Vec::new(), false).unwrap();
    assert_eq!(plan.missing(), vec![3, 4, 5]);
    assert!(plan.can_start().is_err());
    assert!(
        plan.refused.iter().all(|r| r.contains("stale")),
        "{:?}",
        plan.refused
    );
    // --force takes the freshest stale members, only as many as needed (RAID6: one).
    let plan = decide(f(), Vec::new(), true).unwrap();
    plan.can_start().unwrap();
    assert_eq!(plan.missing().len(), 2, "{:?}", plan.refused);
    assert!(plan.slots[3].is_some() || plan.slots[4].is_some());
    assert!(plan.slots[5].is_none(), "the stalest is not needed");
    assert!(plan.refused.iter().any(|r| r.contains("FORCED")));
}

#[test]
fn members_marked_failed_are_refused_even_one_event_behind() {
    // The round that recorded member 2 failed reached the others; member 2 missed it.
    let plan = decide(found(&[4, 4, 3, 4, 4, 4], &[2]), Vec::new(), false).unwrap();
    assert_eq!(plan.missing(), vec![2]);
    assert!(
        plan.refused[0].contains("marked failed"),
        "{:?}",
        plan.refused
    );
}

#[test]
fn a_replaced_member_coming_back_is_refused() {
    // Slot 2 was given a new device (`uraid add`): the old one, fresher than stale even,
    // is refused by its uuid, and the new one takes the slot.
    let mut f = found(&[6, 6, 5, 6, 6, 6], &[]);
    let new_uuid = [0xAB; 16];
    for x in f.iter_mut().filter(|x| x.sb.events == 6) {
        x.sb.slot_uuids[2] = new_uuid;
        x.sb.states[2] = MemberState::Rebuilding;
    }
    let plan = decide(f, Vec::new(), true).unwrap();
    assert!(plan.slots[2].is_none(), "{:?}", plan.refused);
    assert!(
        plan.refused[0].contains("replaced it with device ab"),
        "{:?}",
        plan.refused
    );
    // Rebuilding without its member: it counts as missing.
    assert_eq!(plan.missing(), vec![2]);
}

#[test]
fn a_member_that_was_being_rebuilt_is_never_forced_in() {
    // RAID6: member 2 was being rebuilt and then failed (its own superblock still says
    // rebuilding); members 4 and 5 are gone. --force must not take member 2 as active.
    let mut f = found(&[7, 7, 6, 7], &[2]);
    f[2].sb.states[2] = MemberState::Rebuilding;
    f[2].sb.rebuilt[2] = 10;
    let g = Geometry::new(Level::Raid6, 6, 4096, 1 << 20).unwrap();
    for x in f.iter_mut() {
        x.sb.geometry = g;
        x.sb.states.resize(6, MemberState::Active);
        x.sb.rebuilt.resize(6, 0);
        x.sb.slot_uuids = (0..6).map(uraid_sim::device_uuid).collect();
    }
    let plan = decide(f, Vec::new(), true).unwrap();
    assert!(plan.slots[2].is_none(), "{:?}", plan.refused);
    assert!(
        plan.refused
            .iter()
            .any(|r| r.contains("it was being rebuilt")),
        "{:?}",
        plan.refused
    );
}
