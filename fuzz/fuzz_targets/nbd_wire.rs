//! Every NBD parser of client bytes (`uraid_nbd::proto::fuzz_wire`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_nbd::proto::fuzz_wire(data));
