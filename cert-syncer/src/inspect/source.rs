//! What `inspect` reads, whatever it was read from: groups of named byte strings.

use std::path::PathBuf;

use crate::base::kind::Kind;

/// Entries that belong together: the files of one directory, or the keys of one object.
/// Certificates are paired with keys and bundles within a group first.
#[derive(Debug)]
pub(super) struct Group {
    pub origin: Origin,
    /// Sorted by name.
    pub entries: Vec<Entry>,
}

/// Where a group was read from.
#[derive(Debug, Clone)]
pub(super) enum Origin {
    /// A directory. For the kubelet `..data` layout the entries are the files of the generation
    /// `..data` pointed to when it was read, named as their visible links.
    Dir(PathBuf),
    /// A Secret or ConfigMap; the entries are its keys.
    Object {
        kind: Kind,
        namespace: String,
        name: String,
    },
}

/// The entry name of an object that does not decode (its error stands for all its keys).
pub(super) const WHOLE_OBJECT: &str = "(object)";

/// One file or key.
#[derive(Debug)]
pub(super) struct Entry {
    pub name: String,
    /// The content, or why it could not be read.
    pub bytes: Result<Vec<u8>, String>,
}

impl Origin {
    /// How rows name entry `name` of this group: the file's path, or
    /// `secrets/NAME/KEY` / `configmaps/NAME/KEY` (the layout `sync` writes).
    pub(super) fn source(&self, name: &str) -> String {
        match self {
            Origin::Dir(dir) => dir.join(name).display().to_string(),
            Origin::Object {
                kind, name: object, ..
            } => format!("{}/{object}/{name}", kind.plural()),
        }
    }
}
