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

mod contract;
mod dir;
mod host_file;

pub(crate) use contract::{Sink, SinkError, Wrote};

use super::settings::{ObjectSpec, Settings};

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
