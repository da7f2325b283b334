//! uraid engine: member I/O on io_uring reactors, array request execution (full-stripe,
//! reconstruct-write, read-modify-write, degraded reads), failure handling and assembly.

pub mod alloc;
pub mod array;
pub mod assemble;
pub mod buf;
pub mod dev;
pub mod net;
pub mod reactor;

pub use alloc::ReadPiece;
pub use array::{Array, ArrayError, WriteBuf};
pub use buf::{IoBuf, Segments};
pub use dev::{Access, BlockDev, FileDev, Holder, OpenError};
pub use reactor::{Runtime, RuntimeHandle};
