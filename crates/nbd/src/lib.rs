//! uraid's NBD target. `proto` is the wire format (pure, fuzzed); `access` the allow and
//! deny lists (pure); `tls` STARTTLS's credentials and sessions; `server` runs listeners and
//! connections on the engine's reactors.

pub mod access;
pub mod proto;
pub mod server;
pub mod tls;

pub use server::{op_index, Config, Server, ServerStats, OPS};
