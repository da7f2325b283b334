//! Background recovery work, under the same stripe locks as client writes: resync of an
//! array that was not stopped cleanly (`resync.rs`), rebuild of new members (`rebuild.rs`),
//! replace (`replace.rs`) and scrub (`scrub.rs`). These walks drive the array (they sit above
//! `array/` and reach its components through its accessors); the state the array's request
//! paths consult while they run (resync's synced set, progress, the replace under way, scrub
//! counts, throttle) is `background.rs`, below the array. The threads they run on are the
//! supervisor's (supervisor.rs).
//!
//! Each walk says what one unit of its work is (a `walk::Walk`); one loop (`walk::run`)
//! drives all of them: pause and stop, the throttle (`Pacer`), batches spread over the
//! reactors (`fan_out`), and progress published through `Progress` (status, metrics,
//! `uraid watch`), cleared on every exit.

mod readd;
mod rebuild;
mod replace;
mod resync;
mod scrub;
mod walk;

pub use crate::background::{Priority, Progress, ProgressView, ScrubMode, ScrubReport, Throttle};
pub use rebuild::RebuildReport;
pub use replace::{ReplaceOutcome, PERSIST_EVERY as REPLACE_PERSIST_EVERY};
pub use resync::ResyncReport;

use crate::array::Array;
use crate::dev::BlockDev;

impl<D: BlockDev> Array<D> {
    /// Sets the throttle of background work (resync, rebuild, scrub); running walks apply
    /// it from their next round.
    pub fn set_throttle(&self, t: Throttle) {
        *self
            .recovery()
            .throttle
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = t;
    }

    /// The throttle background work applies now.
    pub fn throttle(&self) -> Throttle {
        self.recovery().throttle_now()
    }
}
