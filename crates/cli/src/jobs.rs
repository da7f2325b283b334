//! Operator commands a running server carries out for the control socket (`POST`): the
//! engine's `Supervisor` does them (scrub start/pause/resume/cancel, add, replace, fail,
//! remove); this maps its refusals to HTTP statuses.

use std::path::Path;
use std::sync::Arc;
use uraid_engine::supervisor::ScrubCommand;
use uraid_engine::{FileDev, RefusalKind, ScrubMode, Supervisor};

pub use uraid_engine::supervisor::Removal;

/// A command's refusal: HTTP status and message.
pub type Refusal = (u16, String);

/// The HTTP status and message of an engine refusal.
fn http(r: uraid_engine::Refusal) -> Refusal {
    let status = match r.kind {
        RefusalKind::Conflict => 409,
        RefusalKind::Stopping => 503,
        RefusalKind::Internal => 500,
    };
    (status, r.message)
}

pub struct Jobs {
    sup: Arc<Supervisor<FileDev>>,
}

impl Jobs {
    pub fn new(sup: Arc<Supervisor<FileDev>>) -> Jobs {
        Jobs { sup }
    }

    pub fn start_scrub(&self, mode: ScrubMode) -> Result<String, Refusal> {
        self.sup.start_scrub(mode).map_err(http)
    }

    /// `pause`, `resume` or `cancel` the running scrub.
    pub fn scrub_command(&self, cmd: &str) -> Result<String, Refusal> {
        let Some(c) = ScrubCommand::parse(cmd) else {
            return Err((404, format!("no scrub command {cmd:?}")));
        };
        self.sup.scrub_command(c).map_err(http)
    }

    /// Hot spares waiting (their device paths).
    pub fn spare_paths(&self) -> Vec<String> {
        self.sup.spare_names()
    }

    pub fn add(&self, path: &Path, force: bool) -> Result<String, Refusal> {
        self.sup.add(path, force).map_err(http)
    }

    pub fn replace(&self, i: usize, path: &Path, force: bool) -> Result<String, Refusal> {
        self.sup.replace(i, path, force).map_err(http)
    }

    /// Cancels the running replace of member `i` (every running one: None).
    pub fn replace_cancel(&self, i: Option<usize>) -> Result<String, Refusal> {
        self.sup.replace_cancel_of(i).map_err(http)
    }

    pub fn fail(&self, i: usize, force: bool) -> Result<String, Refusal> {
        self.sup.fail(i, force).map_err(http)
    }

    pub fn remove(&self, what: Removal, force: bool) -> Result<String, Refusal> {
        self.sup.remove(what, force).map_err(http)
    }
}
