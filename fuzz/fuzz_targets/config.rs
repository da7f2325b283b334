//! The config file parser (`uraid_core::config::fuzz_config`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::config::fuzz_config(data));
