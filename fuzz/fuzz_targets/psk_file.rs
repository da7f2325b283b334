//! psktool key files (`uraid_nbd::tls::psk::fuzz_psk`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_nbd::tls::psk::fuzz_psk(data));
