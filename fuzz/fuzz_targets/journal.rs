//! Journal device bytes read at assembly (`uraid_core::fuzz::journal`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uraid_core::fuzz::journal(data);
});
