//! uraid engine, in layers (ARCHITECTURE.md "Layout"):
//! * `reactor`, `buf`, `dev`, `net`: io_uring reactors, aligned buffers, member devices,
//!   socket I/O;
//! * `members`: the member set, typed health, member I/O with timeouts and the error policy;
//! * `metadata`: superblock rounds, dirty/clean, the failure barrier;
//! * `stripe`: the stripe lock table, stripe reads and decode, stripe write execution;
//! * `array`: request execution over all of the above for every level;
//! * `journal`: the journal device (write-ahead log of stripe updates, replay, checkpoints);
//! * `recovery`: background work under the stripe locks (resync);
//! * `alloc`, `volume`: the allocation map and the client-facing volume on top of the array;
//! * `shard`, `metrics`: per-thread counters and latency histograms, summed when read;
//! * `assemble`: creating arrays, reading superblocks, deciding and opening an assembly.

pub mod alloc;
pub mod array;
pub mod assemble;
pub mod bitmap;
pub mod buf;
pub mod dev;
mod error;
pub mod journal;
pub mod members;
pub mod metadata;
pub mod metrics;
pub mod net;
pub mod reactor;
pub mod recovery;
pub mod shard;
mod stripe;
pub mod volume;

pub use alloc::ReadPiece;
pub use array::{Array, ArrayError, ArrayOptions, StatsSnapshot, WriteBuf};
pub use buf::{IoBuf, Segments};
pub use dev::{Access, BlockDev, FileDev, Holder, OpenError};
pub use members::ErrorPolicy;
pub use metadata::MemberId;
pub use reactor::{Runtime, RuntimeHandle};
pub use recovery::{
    Priority, RebuildReport, ReplaceOutcome, ResyncReport, ScrubMode, ScrubReport, Throttle,
};
pub use volume::{Run, Volume};
