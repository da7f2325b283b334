//! Allocation-map pages and the merge of map copies read from members
//! (`uraid_core::fuzz::map_page`, `uraid_engine::alloc::fuzz_map_copies`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uraid_core::fuzz::map_page(data);
    uraid_engine::alloc::fuzz_map_copies(data);
});
