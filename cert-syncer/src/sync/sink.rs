//! Where an object's state goes on disk: one [`Sink`] per destination, chosen per object in one
//! place ([`for_object`]). The [`Applier`](super::apply::Applier) drives every sink of an object
//! the same way (write, remove when an optional object is gone, repair at the resync) and owns
//! what is common to all of them: metrics, readiness and Events.
//!
//! - [`dir`]: the object's directory, every key a file, swapped in at once through `..data` (the
//!   kubelet's Secret volume layout);
//! - [`host_file`]: one key of the object as a host file (`--file`), certificates only.
//!
//! A new layout is a new file here and a line in [`for_object`] (plus the flag that asks for it
//! in `cli.rs` and its field in [`Settings`]).
//!
//! Sink methods block (file system calls): the applier calls them off the async workers.

mod dir;
mod host_file;

use std::path::Path;

use super::settings::{ObjectSpec, Settings};
use crate::fetched::Fetched;

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

/// The sinks of `object`, in write order: its directory when it is mirrored, then its `--file`
/// host files.
pub(crate) fn for_object(settings: &Settings, object: &ObjectSpec) -> Vec<Box<dyn Sink>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if object.mirror {
        sinks.push(Box::new(dir::ObjectDir::new(
            &settings.destination,
            object.kind,
            &object.name,
        )));
    }
    for mapping in settings
        .files
        .iter()
        .filter(|f| f.kind == object.kind && f.name == object.name)
    {
        sinks.push(Box::new(host_file::HostFile::new(mapping.clone())));
    }
    sinks
}
