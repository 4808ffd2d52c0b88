//! The object store: one increasing resourceVersion for everything, a bounded history of changes
//! for watches, optional persistence to a state file.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::resource::{Resource, is_dns_subdomain};
use super::select::Selector;
use super::status::ApiError;

/// Changes kept for watches to resume from; older resourceVersions get 410 Expired.
pub const DEFAULT_HISTORY: usize = 10_000;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// One entry of the history.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// The resource.
    pub resource: Resource,
    /// The object after the change (before, for deletes).
    pub object: Value,
}

type Key = (Resource, String, String);

#[derive(Debug)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    /// Every change with a resourceVersion above this is in `history`.
    floor: u64,
    capacity: usize,
    next_uid: u64,
}

/// The store. Cheap operations under one mutex; watchers are told about new resourceVersions
/// through a `watch` channel and read the history themselves, so a slow watcher never slows
/// writers and never loses events.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    latest: watch::Sender<u64>,
    state_file: Option<PathBuf>,
}

/// How a PATCH body is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 7386 merge patch (also used for strategic merge patches).
    Merge,
    /// RFC 6902 JSON patch.
    Json,
    /// Server-side apply, simplified: a merge patch that creates the object when absent.
    Apply,
}

/// The persisted state.
#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    resource_version: u64,
    objects: Vec<(Resource, Value)>,
}

impl Store {
    /// An empty store, or the one saved in `state_file` if it exists.
    ///
    /// # Errors
    /// An unreadable or corrupt state file, named.
    pub fn open(state_file: Option<PathBuf>, capacity: usize) -> anyhow::Result<Store> {
        let mut inner = Inner {
            rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            floor: 0,
            capacity: capacity.max(1),
            next_uid: 1,
        };
        if let Some(path) = &state_file {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let state: State = serde_json::from_slice(&bytes).map_err(|err| {
                        anyhow::anyhow!("corrupt state file {}: {err}", path.display())
                    })?;
                    inner.rv = state.resource_version;
                    // Nothing before a restart can be replayed: watches from older versions relist.
                    inner.floor = state.resource_version;
                    for (resource, object) in state.objects {
                        let key = (
                            resource,
                            meta_str(&object, "namespace"),
                            meta_str(&object, "name"),
                        );
                        inner.objects.insert(key, object);
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => anyhow::bail!("cannot read state file {}: {err}", path.display()),
            }
        }
        let (latest, _) = watch::channel(inner.rv);
        Ok(Store {
            inner: Mutex::new(inner),
            latest,
            state_file,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Notified with the newest resourceVersion after every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// One object.
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&(resource, namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource.plural(), resource.kind(), name))
    }

    /// Matching objects in name order after `after` (a continue token: the last name returned),
    /// at most `limit`; returns them, the list's resourceVersion and the next continue token.
    pub fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
        limit: Option<usize>,
        after: Option<&(String, String)>,
    ) -> (Vec<Value>, u64, Option<(String, String)>) {
        let inner = self.lock();
        let mut items = Vec::new();
        let mut next = None;
        for ((r, ns, name), object) in &inner.objects {
            if *r != resource || namespace.is_some_and(|n| n != ns) || !selector.matches(object) {
                continue;
            }
            if after.is_some_and(|(a_ns, a_name)| (ns, name) <= (a_ns, a_name)) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                next = items
                    .last()
                    .map(|o: &Value| (meta_str(o, "namespace"), meta_str(o, "name")));
                break;
            }
            items.push(object.clone());
        }
        (items, inner.rv, next)
    }

    /// Changes after `since`, in order; `Err` when some of them are no longer in history.
    pub fn changes_since(&self, since: u64) -> Result<Vec<Change>, ApiError> {
        let inner = self.lock();
        if since < inner.floor {
            return Err(ApiError::expired(format!(
                "too old resource version: {since} ({})",
                inner.floor + 1
            )));
        }
        // History is in resourceVersion order: find the tail with a binary search.
        let start = inner.history.partition_point(|c| c.rv <= since);
        Ok(inner.history.range(start..).cloned().collect())
    }

    /// Creates an object (201).
    pub fn create(
        &self,
        resource: Resource,
        namespace: &str,
        body: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let mut object = normalize(resource, namespace, body, None)?;
        let name = match meta_str_opt(&object, "name") {
            Some(name) => name,
            None => {
                let prefix = meta_str_opt(&object, "generateName").ok_or_else(|| {
                    ApiError::invalid(
                        resource.kind(),
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    )
                })?;
                let name = format!("{prefix}{}", random_suffix(inner.next_uid));
                object["metadata"]["name"] = json!(name);
                name
            }
        };
        check_name(resource, &name)?;
        let key = (resource, namespace.to_owned(), name.clone());
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(
                resource.plural(),
                resource.kind(),
                &name,
            ));
        }
        inner.next_uid += 1;
        let uid = uid(inner.next_uid);
        object["metadata"]["uid"] = json!(uid);
        object["metadata"]["creationTimestamp"] = json!(now_rfc3339());
        self.commit(&mut inner, key, object, ChangeKind::Added)
    }

    /// Replaces an object (PUT); a stale `metadata.resourceVersion` is a 409 Conflict.
    pub fn update(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        body: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (resource, namespace.to_owned(), name.to_owned());
        let current = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource.plural(), resource.kind(), name))?;
        let object = normalize(resource, namespace, body, Some(name))?;
        self.replace(&mut inner, key, current, object, true)
    }

    /// Patches an object; `Apply` creates it when absent.
    pub fn patch(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (resource, namespace.to_owned(), name.to_owned());
        let Some(current) = inner.objects.get(&key).cloned() else {
            if kind == PatchKind::Apply {
                drop(inner);
                let mut body = patch;
                body["metadata"]["name"] = json!(name);
                return self.create(resource, namespace, body);
            }
            return Err(ApiError::not_found(
                resource.plural(),
                resource.kind(),
                name,
            ));
        };
        let mut patched = current.clone();
        match kind {
            PatchKind::Merge | PatchKind::Apply => json_patch::merge(&mut patched, &patch),
            PatchKind::Json => {
                let operations: json_patch::Patch = serde_json::from_value(patch)
                    .map_err(|err| ApiError::bad_request(format!("invalid JSON patch: {err}")))?;
                json_patch::patch(&mut patched, &operations).map_err(|err| {
                    ApiError::invalid(
                        resource.kind(),
                        name,
                        format!("the JSON patch cannot be applied: {err}"),
                    )
                })?;
            }
        }
        let object = normalize(resource, namespace, patched, Some(name))?;
        // A patch that names a resourceVersion is a precondition, like an update.
        let check = kind != PatchKind::Json
            || object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"];
        self.replace(&mut inner, key, current, object, check)
    }

    /// Deletes an object; returns its last state.
    pub fn delete(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (resource, namespace.to_owned(), name.to_owned());
        let Some(mut object) = inner.objects.remove(&key) else {
            return Err(ApiError::not_found(
                resource.plural(),
                resource.kind(),
                name,
            ));
        };
        inner.rv += 1;
        object["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        self.record(&mut inner, resource, object.clone(), ChangeKind::Deleted);
        Ok(object)
    }

    fn replace(
        &self,
        inner: &mut Inner,
        key: Key,
        current: Value,
        mut object: Value,
        check_version: bool,
    ) -> Result<Value, ApiError> {
        let (resource, _, name) = &key;
        if check_version
            && let Some(sent) = meta_str_opt(&object, "resourceVersion")
            && Some(sent) != meta_str_opt(&current, "resourceVersion")
        {
            return Err(ApiError::conflict(resource.plural(), resource.kind(), name));
        }
        if let Some(uid) = meta_str_opt(&object, "uid")
            && Some(&uid) != meta_str_opt(&current, "uid").as_ref()
        {
            return Err(ApiError::conflict(resource.plural(), resource.kind(), name));
        }
        object["metadata"]["uid"] = current["metadata"]["uid"].clone();
        object["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"].clone();
        // An update that changes nothing does not bump the resourceVersion (as the apiserver).
        let mut unchanged = object.clone();
        unchanged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        if unchanged == current {
            return Ok(current);
        }
        self.commit(inner, key, object, ChangeKind::Modified)
    }

    fn commit(
        &self,
        inner: &mut Inner,
        key: Key,
        mut object: Value,
        kind: ChangeKind,
    ) -> Result<Value, ApiError> {
        inner.rv += 1;
        object["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        let resource = key.0;
        inner.objects.insert(key, object.clone());
        self.record(inner, resource, object.clone(), kind);
        Ok(object)
    }

    fn record(&self, inner: &mut Inner, resource: Resource, object: Value, kind: ChangeKind) {
        let rv = inner.rv;
        inner.history.push_back(Change {
            rv,
            kind,
            resource,
            object,
        });
        while inner.history.len() > inner.capacity {
            if let Some(dropped) = inner.history.pop_front() {
                inner.floor = dropped.rv;
            }
        }
        self.persist(inner);
        self.latest.send_replace(rv);
    }

    /// Writes the state file atomically (under the store lock, so saves are in order).
    fn persist(&self, inner: &Inner) {
        let Some(path) = &self.state_file else { return };
        let state = State {
            resource_version: inner.rv,
            objects: inner
                .objects
                .iter()
                .map(|((r, _, _), o)| (*r, o.clone()))
                .collect(),
        };
        let bytes = match serde_json::to_vec(&state) {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::error!(error = %err, "cannot encode the state");
                return;
            }
        };
        // The state holds Secrets: owner-only.
        if let Err(err) = reload_lib::fs::write_file_atomic(path, &bytes, 0o600) {
            tracing::error!(path = %path.display(), error = &err as &dyn std::error::Error, "cannot save the state file");
        }
    }
}

/// Validates and completes an object for `resource` in `namespace`: kind and apiVersion, name
/// (must equal `path_name` when given), namespace, Secret `stringData` and base64 `data`.
fn normalize(
    resource: Resource,
    namespace: &str,
    body: Value,
    path_name: Option<&str>,
) -> Result<Value, ApiError> {
    let Value::Object(mut object) = body else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    match object.get("kind") {
        None => {}
        Some(Value::String(kind)) if kind == resource.kind() => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the kind {other} does not match the resource {} (expected {})",
                resource.plural(),
                resource.kind()
            )));
        }
    }
    match object.get("apiVersion") {
        None => {}
        Some(Value::String(v)) if v == resource.api_version() => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the apiVersion {other} does not match {}",
                resource.api_version()
            )));
        }
    }
    object.insert("kind".into(), json!(resource.kind()));
    object.insert("apiVersion".into(), json!(resource.api_version()));
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(metadata) = metadata else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    match metadata.get("namespace") {
        None => {}
        Some(Value::String(ns)) if ns == namespace => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    metadata.insert("namespace".into(), json!(namespace));
    if let Some(path_name) = path_name {
        match metadata.get("name") {
            None => {
                metadata.insert("name".into(), json!(path_name));
            }
            Some(Value::String(name)) if name == path_name => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
        }
    }
    for field in ["labels", "annotations"] {
        if let Some(map) = metadata.get(field)
            && !(map.is_null()
                || map
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string)))
        {
            return Err(ApiError::invalid(
                resource.kind(),
                "",
                format!("metadata.{field}: values must be strings"),
            ));
        }
    }
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match resource {
        Resource::Secrets => normalize_secret(&mut object, &name)?,
        Resource::ConfigMaps => normalize_config_map(&object, &name)?,
        _ => {}
    }
    Ok(Value::Object(object))
}

fn normalize_secret(object: &mut Map<String, Value>, name: &str) -> Result<(), ApiError> {
    let invalid = |message: String| ApiError::invalid("Secret", name, message);
    let mut data = match object.remove("data") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(data)) => data,
        Some(_) => return Err(invalid("data: must be a map of base64 strings".to_owned())),
    };
    for (key, value) in &data {
        let decodes = value.as_str().is_some_and(|v| BASE64.decode(v).is_ok());
        if !decodes {
            return Err(invalid(format!(
                "data[{key}]: must be a base64-encoded string"
            )));
        }
    }
    match object.remove("stringData") {
        None | Some(Value::Null) => {}
        Some(Value::Object(strings)) => {
            for (key, value) in strings {
                let Value::String(text) = value else {
                    return Err(invalid(format!("stringData[{key}]: must be a string")));
                };
                data.insert(key, json!(BASE64.encode(text)));
            }
        }
        Some(_) => return Err(invalid("stringData: must be a map of strings".to_owned())),
    }
    for key in data.keys() {
        if !is_config_key(key) {
            return Err(invalid(format!(
                "data[{key}]: a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
            )));
        }
    }
    object.insert("data".into(), Value::Object(data));
    object.entry("type").or_insert_with(|| json!("Opaque"));
    Ok(())
}

fn normalize_config_map(object: &Map<String, Value>, name: &str) -> Result<(), ApiError> {
    let invalid = |message: String| ApiError::invalid("ConfigMap", name, message);
    if let Some(data) = object.get("data").filter(|d| !d.is_null()) {
        let Some(data) = data.as_object() else {
            return Err(invalid("data: must be a map of strings".to_owned()));
        };
        for (key, value) in data {
            if !value.is_string() || !is_config_key(key) {
                return Err(invalid(format!(
                    "data[{key}]: invalid key or non-string value"
                )));
            }
        }
    }
    if let Some(binary) = object.get("binaryData").filter(|d| !d.is_null()) {
        let Some(binary) = binary.as_object() else {
            return Err(invalid(
                "binaryData: must be a map of base64 strings".to_owned(),
            ));
        };
        for (key, value) in binary {
            if value.as_str().is_none_or(|v| BASE64.decode(v).is_err()) || !is_config_key(key) {
                return Err(invalid(format!(
                    "binaryData[{key}]: invalid key or not base64"
                )));
            }
        }
    }
    Ok(())
}

/// What the apiserver accepts as a Secret or ConfigMap key: `[-._a-zA-Z0-9]+`, at most 253
/// characters. (`..data` passes here, as it does in Kubernetes: rejecting it is the writer's job.)
fn is_config_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && key != "."
        && key != ".."
}

fn check_name(resource: Resource, name: &str) -> Result<(), ApiError> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            resource.kind(),
            name,
            "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        ))
    }
}

/// `metadata.<field>` as a string, empty when absent.
pub fn meta_str(object: &Value, field: &str) -> String {
    meta_str_opt(object, field).unwrap_or_default()
}

fn meta_str_opt(object: &Value, field: &str) -> Option<String> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .map(str::to_owned)
}

fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| time::OffsetDateTime::now_utc());
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A UUID-shaped identifier, unique within this store's life (and across restarts, by mixing in
/// the start time).
fn uid(counter: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let hex = format!(
        "{:016x}{:016x}",
        nanos,
        counter.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    );
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Five characters from `[bcdfghjklmnpqrstvwxz2456789]`, as generateName uses.
fn random_suffix(seed: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let mut x = (seed ^ nanos).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..5)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str) -> Value {
        json!({"metadata": {"name": name}, "stringData": {"tls.crt": "pem"}})
    }

    #[test]
    fn every_change_gets_the_next_resource_version_and_lands_in_history() {
        let store = Store::open(None, 100).unwrap();
        let created = store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        assert_eq!(created["metadata"]["resourceVersion"], "1");
        assert_eq!(created["data"]["tls.crt"], BASE64.encode("pem"));
        assert!(created.get("stringData").is_none());
        let mut changed = created.clone();
        changed["data"]["x"] = json!(BASE64.encode("y"));
        store.update(Resource::Secrets, "ns", "a", changed).unwrap();
        store.delete(Resource::Secrets, "ns", "a").unwrap();
        let kinds: Vec<_> = store
            .changes_since(0)
            .unwrap()
            .iter()
            .map(|c| (c.rv, c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                (1, ChangeKind::Added),
                (2, ChangeKind::Modified),
                (3, ChangeKind::Deleted)
            ]
        );
    }

    #[test]
    fn a_stale_update_conflicts_and_a_duplicate_create_already_exists() {
        let store = Store::open(None, 100).unwrap();
        let created = store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        let mut first = created.clone();
        first["data"]["x"] = json!("eA==");
        store.update(Resource::Secrets, "ns", "a", first).unwrap();
        let mut stale = created;
        stale["data"]["y"] = json!("eQ==");
        assert_eq!(
            store
                .update(Resource::Secrets, "ns", "a", stale)
                .unwrap_err()
                .code,
            409
        );
        assert_eq!(
            store
                .create(Resource::Secrets, "ns", secret("a"))
                .unwrap_err()
                .reason,
            "AlreadyExists"
        );
    }

    #[test]
    fn merge_and_json_patches_apply_and_apply_creates() {
        let store = Store::open(None, 100).unwrap();
        store
            .create(
                Resource::ConfigMaps,
                "ns",
                json!({"metadata": {"name": "a"}, "data": {"x": "1"}}),
            )
            .unwrap();
        let merged = store
            .patch(
                Resource::ConfigMaps,
                "ns",
                "a",
                PatchKind::Merge,
                json!({"data": {"y": "2"}}),
            )
            .unwrap();
        assert_eq!(merged["data"], json!({"x": "1", "y": "2"}));
        let patched = store
            .patch(
                Resource::ConfigMaps,
                "ns",
                "a",
                PatchKind::Json,
                json!([{"op": "remove", "path": "/data/x"}]),
            )
            .unwrap();
        assert_eq!(patched["data"], json!({"y": "2"}));
        let bad = store.patch(
            Resource::ConfigMaps,
            "ns",
            "a",
            PatchKind::Json,
            json!([{"op": "remove", "path": "/nope"}]),
        );
        assert_eq!(bad.unwrap_err().code, 422);
        let applied = store
            .patch(
                Resource::ConfigMaps,
                "ns",
                "b",
                PatchKind::Apply,
                json!({"data": {"z": "3"}}),
            )
            .unwrap();
        assert_eq!(applied["metadata"]["name"], "b");
        assert_eq!(
            store
                .patch(Resource::ConfigMaps, "ns", "c", PatchKind::Merge, json!({}))
                .unwrap_err()
                .code,
            404
        );
    }

    #[test]
    fn history_beyond_capacity_expires() {
        let store = Store::open(None, 2).unwrap();
        for name in ["a", "b", "c"] {
            store
                .create(
                    Resource::ConfigMaps,
                    "ns",
                    json!({"metadata": {"name": name}}),
                )
                .unwrap();
        }
        assert_eq!(store.changes_since(0).unwrap_err().code, 410);
        assert_eq!(store.changes_since(1).unwrap().len(), 2);
    }

    #[test]
    fn bad_input_is_rejected_without_a_state_change() {
        let store = Store::open(None, 100).unwrap();
        let cases = [
            json!({"metadata": {"name": "Bad_Name"}}),
            json!({"kind": "ConfigMap", "metadata": {"name": "a"}}),
            json!({"metadata": {"name": "a"}, "data": {"k": "not base64!"}}),
            json!({"metadata": {"name": "a", "namespace": "other"}}),
            json!("not an object"),
        ];
        for body in cases {
            assert!(
                store.create(Resource::Secrets, "ns", body.clone()).is_err(),
                "{body}"
            );
        }
        assert_eq!(store.resource_version(), 0);
    }

    #[test]
    fn state_survives_a_restart_and_older_versions_expire() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let store = Store::open(Some(path.clone()), 100).unwrap();
        store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        store.create(Resource::Secrets, "ns", secret("b")).unwrap();
        drop(store);
        let store = Store::open(Some(path.clone()), 100).unwrap();
        assert_eq!(store.resource_version(), 2);
        assert!(store.get(Resource::Secrets, "ns", "b").is_ok());
        assert_eq!(store.changes_since(1).unwrap_err().code, 410);
        assert!(store.changes_since(2).unwrap().is_empty());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
