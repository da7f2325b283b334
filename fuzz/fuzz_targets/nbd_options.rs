//! The NBD option phase around STARTTLS (`uraid_nbd::server::fuzz_options`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_nbd::server::fuzz_options(data));
