//! Superblocks are read from disks that may hold anything (`uraid_core::fuzz::superblock`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzz::superblock(data));
