//! The error of an array request or command.

use uraid_core::geometry::{Level, SECTOR};
use uraid_core::MemberSet;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ArrayError {
    #[error("request at offset {off} length {len} is beyond the end of the volume ({size} bytes)")]
    OutOfRange { off: u64, len: u64, size: u64 },
    #[error("request at offset {off} length {len} is not aligned to {SECTOR}-byte sectors")]
    Misaligned { off: u64, len: u64 },
    #[error("array has failed: {lost} of {members} members lost, {level} tolerates {tolerates}")]
    Failed {
        lost: usize,
        members: usize,
        level: Level,
        tolerates: usize,
    },
    /// Media errors on members `members` and no redundancy left to reconstruct from: this
    /// request fails, the array keeps serving everything else.
    #[error(
        "unreadable: media error on member(s) {members} and no redundancy left for this stripe"
    )]
    Unreadable { members: MemberSet },
    #[error("reactor stopped before the request finished")]
    Shutdown,
    /// An operator command the array cannot carry out (never a client request's error).
    #[error("{0}")]
    Refused(String),
}
