//! uraid's pure core: geometry, parity codec and on-disk format.
//!
//! Nothing here performs I/O, spawns threads or contains `unsafe` (the ISA-L kernels are
//! behind the safe `uraid-isal` boundary). Everything is deterministic and unit-testable.
#![forbid(unsafe_code)]

pub mod alloc;
pub mod assemble;
pub mod badblocks;
pub mod bitmap;
pub mod codec;
pub mod config;
pub mod format;
pub mod fuzz;
pub mod geometry;
pub mod gf;
pub mod http;
pub mod journal;
pub mod members;
pub mod plan;
pub mod scrub;

pub use codec::Codec;
pub use format::{MemberState, Superblock};
pub use geometry::{Extent, Geometry, Level, Role};
pub use members::MemberSet;
pub use plan::{plan_write, Shard, WritePlan};
