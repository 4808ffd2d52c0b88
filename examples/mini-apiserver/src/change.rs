//! One change of the store (an object added, modified or deleted at a resourceVersion), as the
//! history keeps it, the state file saves it and watches send it.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::resource::Resource;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Updated or patched.
    Modified,
    /// Deleted (the object is the last state).
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn event_type(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One entry of the history, shared by every watcher that sends it.
#[derive(Debug)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// The resource.
    pub resource: Resource,
    /// The object after the change (its last state, for deletes), shared with the store.
    pub object: Arc<Value>,
    /// The object before a modification: a watch with a selector turns a change into ADDED
    /// (starts matching) or DELETED (stops matching) by it. Not kept in the state file (after
    /// a restart, the reloaded history matches on the new state only).
    pub previous: Option<Arc<Value>>,
    /// The watch event line (`{"type":…,"object":…}` and a newline), encoded once for all
    /// watchers.
    pub line: Bytes,
}

impl Change {
    pub(crate) fn new(
        rv: u64,
        kind: ChangeKind,
        resource: Resource,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) -> Change {
        let line = event_line(kind.event_type(), &object);
        Change {
            rv,
            kind,
            resource,
            object,
            previous: previous.filter(|_| kind == ChangeKind::Modified),
            line,
        }
    }
}

/// One watch event as a JSON line.
pub fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut bytes = Vec::with_capacity(256);
    bytes.extend_from_slice(b"{\"type\":\"");
    bytes.extend_from_slice(event_type.as_bytes());
    bytes.extend_from_slice(b"\",\"object\":");
    // Encoding a `Value` to a Vec cannot fail (string keys only, no I/O).
    let _ = serde_json::to_writer(&mut bytes, object);
    bytes.extend_from_slice(b"}\n");
    Bytes::from(bytes)
}
