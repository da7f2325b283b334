//! The main safety net: random reads and writes of random sizes and alignments against a
//! flat reference model, for every level and member count, with members failing at random
//! points, before and during operations. With more members gone than the level tolerates,
//! I/O must fail cleanly — never return wrong data.

use futures::executor::block_on;
use proptest::prelude::*;
use uraid_core::geometry::SECTOR;
use uraid_core::Level;
use uraid_engine::ArrayError;
use uraid_sim::rng::Rng;
use uraid_sim::{mem_array, payload, random_range, Model};

const CHUNK: u64 = 4096;
const ROWS: u64 = 6;

#[derive(Debug, Clone)]
enum Op {
    Write {
        off: u64,
        sectors: u64,
        seed: u64,
    },
    Read {
        off: u64,
        sectors: u64,
    },
    /// Trim: must read back as zeros (whole granules become holes, partial ones are zeroed).
    Trim {
        off: u64,
        sectors: u64,
    },
    /// Kill a member now, or after it has served `after` more operations (mid-request).
    Fail {
        member: usize,
        after: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u64>(), 1u64..40, any::<u64>()).prop_map(|(off, sectors, seed)| Op::Write { off, sectors, seed }),
        3 => (any::<u64>(), 1u64..40).prop_map(|(off, sectors)| Op::Read { off, sectors }),
        1 => (any::<u64>(), 1u64..120).prop_map(|(off, sectors)| Op::Trim { off, sectors }),
        1 => (0usize..64, 0i64..6).prop_map(|(member, after)| Op::Fail { member, after }),
    ]
}

fn level_for(i: usize) -> Level {
    [
        Level::Raid0,
        Level::Raid1,
        Level::Raid10,
        Level::Raid5,
        Level::Raid6,
        Level::Raid7,
        Level::Ec { parity: 4 },
    ][i]
}

fn run(
    level: Level,
    members: usize,
    ops: Vec<Op>,
    allow_beyond: bool,
) -> Result<(), TestCaseError> {
    let (array, faults) = mem_array(level, members, CHUNK, ROWS * CHUNK, None);
    let size = array.size();
    let sectors_total = size / SECTOR;
    let mut model = Model::new(size);
    let tol = array.geometry().fault_tolerance();
    let mut scheduled = 0u64;
    for op in ops {
        match op {
            Op::Write { off, sectors, seed } => {
                let off = off % sectors_total * SECTOR;
                let len = (sectors * SECTOR).min(size - off);
                let data = payload(seed, len as usize);
                match block_on(array.write(off, data.clone())) {
                    Ok(()) => model.write(off, &data),
                    Err(ArrayError::Failed { .. }) => {
                        prop_assert!(
                            !array.is_serving(),
                            "write refused while the array could serve"
                        );
                        // A refused write may have landed partially: the model no longer knows
                        // the range, but the array must keep refusing from now on.
                        return finish_failed(&array);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("write: {e}"))),
                }
            }
            Op::Read { off, sectors } => {
                let off = off % sectors_total * SECTOR;
                let len = (sectors * SECTOR).min(size - off);
                match block_on(array.read(off, len)) {
                    Ok(seg) => prop_assert!(
                        seg.to_vec() == model.read(off, len),
                        "wrong data at {off}+{len}"
                    ),
                    Err(ArrayError::Failed { .. }) => {
                        prop_assert!(!array.is_serving());
                        return finish_failed(&array);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("read: {e}"))),
                }
            }
            Op::Trim { off, sectors } => {
                let off = off % sectors_total * SECTOR;
                let len = (sectors * SECTOR).min(size - off);
                match block_on(array.trim(off, len)) {
                    Ok(()) => model.write(off, &vec![0u8; len as usize]),
                    Err(ArrayError::Failed { .. }) => {
                        prop_assert!(!array.is_serving());
                        return finish_failed(&array);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("trim: {e}"))),
                }
            }
            Op::Fail { member, after } => {
                let member = member % members;
                let would = array.array().failed().bits() | scheduled | 1 << member;
                // Stay within what the level survives unless this case explores beyond it.
                if !allow_beyond && !array.geometry().can_serve(would) {
                    continue;
                }
                if (would.count_ones() as usize) > tol
                    && !allow_beyond
                    && !matches!(level, Level::Raid10)
                {
                    continue;
                }
                scheduled |= 1 << member;
                if after == 0 {
                    faults[member].kill();
                } else {
                    faults[member].kill_after(after);
                }
            }
        }
    }
    // Final full verification, then check failure detection is sound.
    match block_on(array.read(0, size)) {
        Ok(seg) => prop_assert!(seg.to_vec() == model.bytes, "final read-back differs"),
        Err(ArrayError::Failed { .. }) => {
            prop_assert!(allow_beyond, "array failed within its tolerance");
            return finish_failed(&array);
        }
        Err(e) => return Err(TestCaseError::fail(format!("final read: {e}"))),
    }
    Ok(())
}

fn finish_failed(
    array: &std::sync::Arc<uraid_engine::Volume<uraid_sim::MemDev>>,
) -> Result<(), TestCaseError> {
    let read_refused = matches!(
        block_on(array.read(0, SECTOR)),
        Err(ArrayError::Failed { .. })
    );
    let write_refused = matches!(
        block_on(array.write(0, payload(1, SECTOR as usize))),
        Err(ArrayError::Failed { .. })
    );
    prop_assert!(read_refused, "failed array served a read");
    prop_assert!(write_refused, "failed array accepted a write");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Within tolerance: every read matches the model.
    #[test]
    fn matches_model_within_tolerance(li in 0usize..7, extra in 0usize..15, ops in proptest::collection::vec(op(), 1..60)) {
        let level = level_for(li);
        let members = (level.min_members() + extra).min(16);
        run(level, members, ops, false)?;
    }

    /// Failures beyond tolerance allowed: reads that succeed are still right, and once the
    /// array cannot serve it refuses cleanly.
    #[test]
    fn never_wrong_beyond_tolerance(li in 0usize..7, extra in 0usize..6, ops in proptest::collection::vec(op(), 1..60)) {
        let level = level_for(li);
        let members = (level.min_members() + extra).min(16);
        run(level, members, ops, true)?;
    }
}

/// Exhaustive over member counts: every level from its minimum to 16 members, each member
/// failed in turn up to the tolerance, full read-back after every failure.
#[test]
fn every_member_count_survives_tolerated_failures() {
    for li in 0..7 {
        let level = level_for(li);
        for members in level.min_members()..=16 {
            let (array, faults) = mem_array(level, members, CHUNK, ROWS * CHUNK, None);
            let size = array.size();
            let mut model = Model::new(size);
            let tol = array.geometry().fault_tolerance();
            let mut seed = members as u64 * 100 + li as u64;
            let mut rng = Rng::new(seed);
            let mut write_some = |array: &std::sync::Arc<_>, model: &mut Model| {
                for _ in 0..8u64 {
                    seed += 1;
                    let (off, len) = random_range(&mut rng, size, 37);
                    let data = payload(seed, len as usize);
                    block_on(uraid_engine::Volume::write(array, off, data.clone())).unwrap();
                    model.write(off, &data);
                }
            };
            write_some(&array, &mut model);
            for f in 0..tol.min(members - 1) {
                // raid10's guaranteed tolerance is one member; fail members 0, 2, 4... so
                // pairs stay served even when tolerating more.
                let victim = if matches!(level, Level::Raid10) {
                    2 * f
                } else {
                    (f * 5 + 1) % members
                };
                faults[victim].kill();
                write_some(&array, &mut model);
                let got = block_on(array.read(0, size))
                    .unwrap_or_else(|e| panic!("{level} x{members} after {f}: {e}"));
                assert!(
                    got.to_vec() == model.bytes,
                    "{level} x{members}: wrong data after failing {}",
                    f + 1
                );
            }
            // One more than tolerated: a clean error.
            let mut extra = 0;
            while array.is_serving() {
                faults[extra].kill();
                let _ = block_on(array.read(0, size));
                extra += 1;
            }
            assert!(
                matches!(
                    block_on(array.read(0, SECTOR)),
                    Err(ArrayError::Failed { .. })
                ),
                "{level} x{members}"
            );
        }
    }
}

/// A multi-stripe read with members missing reads each stripe once: k member reads per
/// stripe (the readable data chunks, then parity for the missing ones, which are decoded),
/// not k more for every missing chunk; and the bytes match the model at any alignment.
#[test]
fn degraded_reads_read_each_stripe_once() {
    for (level, members, lost) in [
        (Level::Raid5, 5, 1),
        (Level::Raid6, 10, 1),
        (Level::Raid6, 10, 2),
        (Level::Ec { parity: 3 }, 9, 3),
    ] {
        let (array, faults) = mem_array(level, members, CHUNK, ROWS * CHUNK, None);
        let size = array.size();
        let mut model = Model::new(size);
        let data = payload(7, size as usize);
        block_on(array.write(0, data.clone())).unwrap();
        model.write(0, &data);
        for f in 0..lost {
            faults[f * 3 + 1].kill();
        }
        // The first read meets the dead members and fails them.
        let got = block_on(array.read(0, size)).unwrap();
        assert!(got.to_vec() == model.bytes, "{level}: wrong data");
        assert_eq!(array.array().failed().len(), lost);

        let k = array.geometry().data_chunks() as u64;
        let stripe_bytes = k * CHUNK;
        let reads = || -> u64 {
            (0..members)
                .map(|m| array.array().status().members[m].io.read.count)
                .sum()
        };
        let before = reads();
        let got = block_on(array.read(0, ROWS * stripe_bytes)).unwrap();
        assert!(
            got.to_vec() == model.bytes[..(ROWS * stripe_bytes) as usize],
            "{level}"
        );
        assert_eq!(
            reads() - before,
            k * ROWS,
            "{level} with {lost} lost: member reads for {ROWS} whole stripes"
        );
        // Unaligned ranges across stripes, partial chunks at both ends.
        for (off, len) in [(512, stripe_bytes), (CHUNK + 1536, 3 * stripe_bytes - 4096)] {
            let len = len.min(size - off);
            let got = block_on(array.read(off, len)).unwrap();
            assert!(
                got.to_vec() == model.read(off, len),
                "{level}: wrong data at {off}+{len}"
            );
        }
    }
}

/// Chunk-sized reads of a mirror spread evenly over every member. (RAID10 with an even
/// number of pairs once alternated the copy by chunk number alone, which is the pair's
/// parity there: members 1 and 2 of a four-member RAID10 were never read.)
#[test]
fn mirror_reads_spread_over_every_member() {
    for (level, members) in [
        (Level::Raid1, 2),
        (Level::Raid1, 3),
        (Level::Raid10, 2),
        (Level::Raid10, 3),
        (Level::Raid10, 4),
        (Level::Raid10, 6),
        (Level::Raid10, 8),
    ] {
        let (array, _) = mem_array(level, members, CHUNK, 48 * CHUNK, None);
        let size = array.size();
        block_on(array.write(0, payload(3, size as usize))).unwrap();
        let reads = |m: usize| array.array().status().members[m].io.read.count;
        let before: Vec<u64> = (0..members).map(reads).collect();
        let mut off = 0;
        while off < size {
            block_on(array.read(off, CHUNK)).unwrap();
            off += CHUNK;
        }
        let got: Vec<u64> = (0..members).map(|m| reads(m) - before[m]).collect();
        let even = size / CHUNK / members as u64;
        for (m, &n) in got.iter().enumerate() {
            assert!(
                n * 4 >= even * 3 && n * 3 <= even * 4,
                "{level} of {members}: member {m} served {n} of the reads, about {even} each \
                 expected: {got:?}"
            );
        }
    }
}
