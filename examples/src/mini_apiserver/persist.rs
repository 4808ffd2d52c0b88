//! What survives a restart: the state file (objects, resourceVersion and a tail of the watch
//! history, written atomically after every change) and the seed directory (manifests loaded at
//! start).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::resource::Resource;
use super::store::{ChangeKind, Store};

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

/// Creates every object of every manifest in `dir` that does not exist yet (so a restart with a
/// state file keeps the objects as they were changed). Files are read in name order:
/// `*.json` (one object, or a `List` with `items`), `*.yaml`/`*.yml` (`---`-separated documents,
/// each an object or a `List`). Returns how many objects were created.
///
/// # Errors
/// Unreadable files, malformed documents, unsupported kinds and invalid objects, each with the
/// file name. Nothing after the failing document is loaded.
pub fn seed(store: &Store, dir: &Path) -> anyhow::Result<usize> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read seed dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    paths.sort();
    let mut created = 0;
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let documents = parse_documents(&path, &text)?;
        for document in documents {
            if create_seeded(store, &path, document)? {
                created += 1;
            }
        }
    }
    Ok(created)
}

/// The objects of one manifest file, `List`s flattened.
fn parse_documents(path: &Path, text: &str) -> anyhow::Result<Vec<Value>> {
    let mut documents = Vec::new();
    if path.extension().is_some_and(|e| e == "json") {
        let value: Value = serde_json::from_str(text)
            .with_context(|| format!("malformed JSON in {}", path.display()))?;
        documents.push(value);
    } else {
        for document in serde_norway::Deserializer::from_str(text) {
            let value = <Value as serde::Deserialize>::deserialize(document)
                .with_context(|| format!("malformed YAML in {}", path.display()))?;
            if !value.is_null() {
                documents.push(value);
            }
        }
    }
    let mut objects = Vec::new();
    for document in documents {
        if document["kind"] == "List" {
            let items = document["items"]
                .as_array()
                .with_context(|| format!("{}: a List without items", path.display()))?;
            objects.extend(items.iter().cloned());
        } else {
            objects.push(document);
        }
    }
    Ok(objects)
}

fn create_seeded(store: &Store, path: &Path, object: Value) -> anyhow::Result<bool> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let resource = Resource::from_kind(&kind)
        .with_context(|| format!("{}: unsupported kind {kind:?}", path.display()))?;
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    match store.create(resource, &namespace, object) {
        Ok(object) => {
            tracing::info!(
                path = %path.display(),
                kind = %kind,
                namespace = %namespace,
                name = %super::store::meta_str(&object, "name"),
                "Seeded"
            );
            Ok(true)
        }
        Err(err) if err.reason == "AlreadyExists" => Ok(false),
        Err(err) => anyhow::bail!("{}: {}", path.display(), err.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_files_load_in_order_and_existing_objects_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("a.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: ns\nstringData:\n  k: v\n---\n\
             apiVersion: v1\nkind: List\nitems:\n- kind: ConfigMap\n  metadata: {name: c, namespace: ns}\n  data: {x: '1'}\n",
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("b.json"),
            r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"l"}}"#,
        )
        .unwrap();
        std::fs::write(tmp.path().join("ignored.txt"), "not a manifest").unwrap();
        let store = Store::open(None, 100).unwrap();
        assert_eq!(seed(&store, tmp.path()).unwrap(), 3);
        assert!(store.get(Resource::Secrets, "ns", "s").is_ok());
        assert!(store.get(Resource::ConfigMaps, "ns", "c").is_ok());
        assert!(store.get(Resource::Leases, "default", "l").is_ok());
        assert_eq!(seed(&store, tmp.path()).unwrap(), 0, "already there");
    }

    #[test]
    fn a_bad_seed_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("bad.yaml"),
            "kind: Pod\nmetadata: {name: p}\n",
        )
        .unwrap();
        let store = Store::open(None, 100).unwrap();
        let err = format!("{:#}", seed(&store, tmp.path()).unwrap_err());
        assert!(err.contains("bad.yaml") && err.contains("Pod"), "{err}");
    }

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
