//! What a sink is: the [`Sink`] trait and what its methods answer. A leaf: every sink implements
//! it, the applier drives it.

use std::path::Path;

use crate::kube::fetched::Fetched;

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// The disk already held exactly this.
    Unchanged,
    Written,
}

/// Why a sink kept what it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SinkError {
    /// The object's content does not fit this sink (a key missing, not certificates, a key name
    /// that is not a file name): the previous files are kept and the object is not ready. Not
    /// retried: only a new version of the object can fix it.
    Refused(String),
    /// The disk failed (full, I/O): the previous files are kept; retried with backoff.
    Failed(String),
}

impl std::fmt::Display for SinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkError::Refused(why) | SinkError::Failed(why) => f.write_str(why),
        }
    }
}

/// One destination of an object's state.
pub(crate) trait Sink: Send + Sync + 'static {
    /// Where it writes: logs, Events and repair counts name it.
    fn path(&self) -> &Path;

    /// Writes what this sink takes of the object, atomically: a reader sees the old content or
    /// the new, never a mix.
    fn write(&self, fetched: &Fetched) -> Result<Wrote, SinkError>;

    /// An optional object is gone: removes what this sink wrote. `Ok(true)` when something was
    /// removed; a sink whose file other components trust keeps it (`Ok(false)`).
    fn remove(&self) -> Result<bool, SinkError>;

    /// Whether [`remove`](Sink::remove) would delete something now: the one case where a watched
    /// absence is confirmed with a live GET first (see `sync/worker.rs`).
    fn holds_files(&self) -> bool;

    /// The resync: makes the disk match `fetched` again if something changed or removed it
    /// behind our back, and says why it rewrote (`None`: nothing to repair). Content the sink
    /// refused when it arrived is left alone.
    fn repair(&self, fetched: &Fetched) -> Result<Option<&'static str>, SinkError>;

    /// The resync of an optional object known to be absent: removes files that reappeared, and
    /// says why (`None`: nothing there).
    fn repair_absent(&self) -> Result<Option<&'static str>, SinkError>;
}
