//! What survives a restart: the state file (objects, resourceVersion and a tail of the watch
//! history, written atomically after every change). The seed directory is [`crate::seed`].

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::change::ChangeKind;
use crate::resource::Resource;

/// How many of the newest history entries the state file keeps, so watches resume across a
/// restart without a relist. Older starting points get 410 Expired after a restart.
pub const PERSISTED_HISTORY: usize = 256;

/// One history entry as saved.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SavedChange {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// The resource.
    pub resource: Resource,
    /// The object after the change (its last state, for deletes).
    pub object: Value,
}

/// The content of the state file.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// The newest resourceVersion.
    pub resource_version: u64,
    /// Every object, with its resource.
    pub objects: Vec<(Resource, Value)>,
    /// The newest changes, oldest first (absent in files written before history was saved).
    #[serde(default)]
    pub history: Vec<SavedChange>,
    /// Every change above this resourceVersion is in `history`. Absent in older files: then
    /// nothing before the restart can be replayed.
    #[serde(default)]
    pub history_floor: Option<u64>,
}

/// Reads the state file; `None` when it does not exist yet.
///
/// # Errors
/// An unreadable or corrupt file, named.
pub fn load(path: &Path) -> anyhow::Result<Option<State>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("corrupt state file {}", path.display())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("cannot read state file {}", path.display())),
    }
}

/// [`State`] by reference, for saving without copying every object.
#[derive(Debug, serde::Serialize)]
pub struct StateView<'a> {
    /// The newest resourceVersion.
    pub resource_version: u64,
    /// Every object, with its resource.
    pub objects: Vec<(Resource, &'a Value)>,
    /// The newest changes, oldest first.
    pub history: Vec<SavedChangeView<'a>>,
    /// Every change above this resourceVersion is in `history`.
    pub history_floor: Option<u64>,
}

/// [`SavedChange`] by reference.
#[derive(Debug, serde::Serialize)]
pub struct SavedChangeView<'a> {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// The resource.
    pub resource: Resource,
    /// The object after the change.
    pub object: &'a Value,
}

/// Writes the state file atomically (temporary file, fsync, rename), owner-only: it holds
/// Secrets.
///
/// # Errors
/// Encoding or I/O failures, with the path.
pub fn save(path: &Path, state: &StateView<'_>) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(state).context("cannot encode the state")?;
    reload_lib::fs::write_file_atomic(path, &bytes, 0o600)
        .with_context(|| format!("cannot save the state file {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_state_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = format!("{:#}", load(&path).unwrap_err());
        assert!(err.contains("state.json"), "{err}");
        assert!(load(&tmp.path().join("absent.json")).unwrap().is_none());
    }
}
