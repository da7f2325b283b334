//! A FLUSH flushes exactly the members written since the last flush (members.rs,
//! `FlushState`): a member with nothing new is not asked, and what the FLUSH covered survives
//! a power cut that loses every member's volatile cache.

use futures::executor::block_on;
use uraid_core::Level;
use uraid_engine::Volume;
use uraid_sim::crash::{cached_volume, reassemble, Clock};
use uraid_sim::{payload, read_all, MemDev};

const CHUNK: u64 = 4096;
const ROWS: u64 = 32;

/// (writes, flushes) issued to each member so far.
fn member_io(vol: &Volume<MemDev>) -> Vec<(u64, u64)> {
    vol.array()
        .status()
        .members
        .iter()
        .map(|m| (m.io.write.count, m.io.flush.count))
        .collect()
}

/// The members whose writes (`.0`) or flushes (`.1`) went up between two readings.
fn grew(before: &[(u64, u64)], after: &[(u64, u64)], pick: fn(&(u64, u64)) -> u64) -> Vec<usize> {
    (0..before.len())
        .filter(|&i| pick(&after[i]) > pick(&before[i]))
        .collect()
}

#[test]
fn a_flush_asks_only_the_members_written_since_the_last_one() {
    let clock = Clock::new(0, 7);
    let (vol, _faults) = cached_volume(Level::Raid6, 6, CHUNK, ROWS, &clock);
    let size = vol.size();
    let mut want = payload(1, size as usize).to_vec();
    block_on(vol.write(0, payload(1, size as usize))).unwrap();
    let before = member_io(&vol);
    block_on(vol.flush()).unwrap();
    let after = member_io(&vol);
    assert_eq!(
        grew(&before, &after, |x| x.1),
        (0..6).collect::<Vec<_>>(),
        "every member was written"
    );

    // Nothing written since: no member is asked.
    block_on(vol.flush()).unwrap();
    assert_eq!(
        member_io(&vol),
        after,
        "a flush with nothing to make durable"
    );

    // One small write (a read-modify-write of its data chunk and the two parities): the
    // flush goes to exactly the members it wrote.
    for (n, off) in [5 * CHUNK + 512, 17 * CHUNK, 40 * CHUNK + 1024]
        .into_iter()
        .enumerate()
    {
        let before = member_io(&vol);
        let data = payload(10 + n as u64, 1024);
        want[off as usize..off as usize + 1024].copy_from_slice(&data);
        block_on(vol.write(off, data)).unwrap();
        block_on(vol.flush()).unwrap();
        let after = member_io(&vol);
        let written = grew(&before, &after, |x| x.0);
        assert_eq!(
            written.len(),
            3,
            "a RAID6 read-modify-write writes three members"
        );
        assert_eq!(grew(&before, &after, |x| x.1), written, "write at {off}");
    }

    // The power goes and every member loses its whole cache: the flushed data is there.
    clock.power_cut_with(|_, _| false);
    let images = clock.images().expect("images");
    let back = reassemble(&images, &[true; 6]).expect("reassembles");
    assert!(read_all(&back) == want, "flushed writes survive the cut");
}
