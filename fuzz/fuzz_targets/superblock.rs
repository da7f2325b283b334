//! Superblocks are read from disks that may hold anything: decoding must never panic, and a
//! block that decodes must re-encode to a block that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_core::Superblock;

fuzz_target!(|data: &[u8]| {
    if let Ok(sb) = Superblock::decode(data) {
        let again = Superblock::decode(&sb.encode()).expect("re-encoded superblock decodes");
        assert_eq!(again, sb);
    }
});
