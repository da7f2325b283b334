//! Every NBD parser of client bytes: option headers, GO/INFO data, meta-context queries,
//! request headers. None may panic; whatever parses must be within the spec's limits.
#![no_main]
use libfuzzer_sys::fuzz_target;
use uraid_nbd::proto;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = proto::parse_go(data) {
        assert!(g.name.len() <= proto::MAX_STRING);
    }
    if let Ok(m) = proto::parse_meta(data) {
        assert!(m.queries.iter().all(|q| q.len() <= proto::MAX_STRING));
    }
    let _ = proto::parse_request(data);
    if let Some(h) = data.get(..16) {
        let _ = proto::parse_option_header(h.try_into().unwrap());
    }
});
