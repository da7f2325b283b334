//! uraid's NBD target. `proto` is the wire format (pure, fuzzed); `server` runs listeners and
//! connections on the engine's reactors.

pub mod proto;
pub mod server;

pub use server::{op_index, Config, Server, ServerStats, OPS};
