//! Write-intent bitmap copies read from members (`uraid_core::bitmap::fuzz_copies`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uraid_core::bitmap::fuzz_copies(data);
});
