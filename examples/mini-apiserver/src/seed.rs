//! The seed directory (`--seed-dir`): manifests whose objects are created at start when they do
//! not exist yet.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use crate::resource::Resource;
use crate::store::Store;

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
                name = %crate::meta::meta_str(&object, "name"),
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
}
