//! Replays the committed fuzz corpus (fuzz/corpus/TARGET) through the same entry points the
//! fuzz targets call, on every test run: inputs that once crashed a parser, and the seeds,
//! stay fixed without a fuzzer installed. `scripts/fuzz.sh` does the fuzzing itself.

use std::path::PathBuf;

fn replay(target: &str, entry: impl Fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        entry(&data);
        n += 1;
    }
    assert!(n > 0, "no corpus for {target} in {}", dir.display());
    println!("{target}: {n} inputs replayed");
}

#[test]
fn superblock_corpus() {
    replay("superblock", uraid_core::fuzz::superblock);
}

#[test]
fn nbd_wire_corpus() {
    replay("nbd_wire", uraid_nbd::proto::fuzz_wire);
}

#[test]
fn map_page_corpus() {
    replay("map_page", |d| {
        uraid_core::fuzz::map_page(d);
        uraid_engine::alloc::fuzz_map_copies(d);
    });
}

#[test]
fn http_head_corpus() {
    replay("http_head", uraid_core::fuzz::http_head);
}

#[test]
fn bitmap_corpus() {
    replay("bitmap", uraid_core::bitmap::fuzz_copies);
}

#[test]
fn journal_corpus() {
    replay("journal", uraid_core::fuzz::journal);
}

#[test]
fn config_corpus() {
    replay("config", uraid_core::config::fuzz_config);
}

#[test]
fn nbd_options_corpus() {
    replay("nbd_options", uraid_nbd::server::fuzz_options);
}

#[test]
fn psk_file_corpus() {
    replay("psk_file", uraid_nbd::tls::psk::fuzz_psk);
}
