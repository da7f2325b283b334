//! The control socket's request-head parser (`uraid_core::fuzz::http_head`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzz::http_head(data));
