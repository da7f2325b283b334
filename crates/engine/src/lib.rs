//! uraid engine, in layers; a module imports only from layers below it (ARCHITECTURE.md
//! "Layout"):
//! 1. `reactor`, `buf`, `dev`, `net`, `shard`, `metrics`, `error`: io_uring reactors,
//!    aligned buffers, member devices, socket I/O, per-thread counters, `ArrayError`;
//! 2. `members`: the member set, typed health, member I/O with timeouts and the error policy;
//! 3. `metadata` (`Metadata`): superblock rounds, dirty/clean, the failure barrier, and the
//!    error policy applied to whole-array operations (`each_live`) — over `&Members`;
//! 4. `bitmap` (`WriteIntent`), `journal` (`Journal`, replay of the records), `stripe`
//!    (`StripeLocks`), `background` (`Recovery`: resync's synced set, walk progress, the
//!    replace under way, scrub counts, throttle) — each takes the components it uses as
//!    arguments;
//! 5. `array`: the composition of the above and request execution for every level
//!    (array/{stripe_io,stripe_write,journal,admin}.rs are part of it);
//! 6. `recovery` (resync, rebuild, replace, scrub walks), `volume` (the allocation map and the
//!    client-facing volume; `alloc` is its map, `readahead` its read-ahead state), `assemble` (creating arrays, reading
//!    superblocks, core's assembly decision, opening an assembly, `assemble::replay`): they
//!    drive the array through its methods and component accessors;
//! 7. `supervisor` (`Supervisor`): the threads of a serving volume's background work (the
//!    walks, the bitmap daemon, the spare watcher) and the operator commands that start and
//!    end it, refused with a typed `Refusal`.

pub mod alloc;
pub mod array;
pub mod assemble;
mod background;
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
pub mod readahead;
pub mod recovery;
pub mod shard;
pub mod slow;
mod stripe;
pub mod supervisor;
pub mod volume;

pub use alloc::ReadPiece;
pub use array::{
    Added, Array, ArrayError, ArrayOptions, ArrayStatus, BitmapStatus, Identity, MemberErrors,
    MemberStatus, ScrubStatus, StatsSnapshot, WriteBuf,
};
pub use buf::{IoBuf, Segments};
pub use dev::{Access, BlockDev, FileDev, Holder, OpenError};
pub use members::{Departed, ErrorPolicy, MemberState};
pub use metadata::MemberId;
pub use reactor::{Runtime, RuntimeHandle};
pub use readahead::ReadAheadStats;
pub use recovery::{
    Priority, RebuildReport, ReplaceOutcome, ResyncReport, ScrubMode, ScrubReport, Throttle,
    REPLACE_PERSIST_EVERY,
};
pub use supervisor::{Refusal, RefusalKind, Supervisor};
pub use volume::{Run, Volume};
