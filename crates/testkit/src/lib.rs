//! Helpers for the workspace's integration tests (a dev-dependency only; nothing in a
//! shipped binary uses it).
//!
//! `nbd` is a hand-written NBD client for the server tests of `uraid-nbd` (in-process
//! server) and of `uraid` (`uraid serve` as a process). It lives in its own crate because
//! both crates' tests need it and a module under `crates/nbd/tests/` cannot be reached from
//! `crates/cli/tests/`. `uraid-nbd` lists this crate as a dev-dependency while this crate
//! depends on `uraid-nbd`; Cargo allows that cycle, and integration tests link the same
//! `uraid_nbd` library this crate does.

pub mod nbd;
