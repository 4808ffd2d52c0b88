//! The object store: one increasing resourceVersion for everything, a bounded history of changes
//! for watches, optional persistence to a state file (see [`super::persist`]).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::persist::{self, PERSISTED_HISTORY, SavedChangeView, StateView};
use super::resource::{Resource, is_dns_subdomain};
use super::select::Selector;
use super::status::ApiError;

/// Changes kept for watches to resume from; older resourceVersions get 410 Expired.
pub const DEFAULT_HISTORY: usize = 10_000;

/// The most changes [`Store::changes_since`] returns at once.
pub const CHANGES_PER_READ: usize = 64;

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
    /// The watch event line (`{"type":…,"object":…}` and a newline), encoded once for all
    /// watchers.
    pub line: Bytes,
}

impl Change {
    fn new(rv: u64, kind: ChangeKind, resource: Resource, object: Arc<Value>) -> Change {
        let line = event_line(kind.event_type(), &object);
        Change {
            rv,
            kind,
            resource,
            object,
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

type Key = (Resource, String, String);

#[derive(Debug)]
struct Inner {
    rv: u64,
    /// Shared with history entries and open watches' initial lists, never copied per watcher.
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Arc<Change>>,
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

/// Whether a write is stored or only checked (`?dryRun=All`): a dry run validates and answers
/// as the write would, but changes nothing, bumps no resourceVersion, saves nothing and sends
/// no watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Store the change.
    Commit,
    /// Only validate and answer.
    DryRun,
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

/// Conditions a delete must meet (`DeleteOptions.preconditions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The object must have this resourceVersion.
    pub resource_version: Option<String>,
    /// The object must have this uid.
    pub uid: Option<String>,
}

impl Store {
    /// An empty store, or the one saved in `state_file` if it exists. `capacity` is the number
    /// of changes kept for watches.
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
        if let Some(state) = state_file
            .as_deref()
            .map(persist::load)
            .transpose()?
            .flatten()
        {
            inner.rv = state.resource_version;
            for (resource, object) in state.objects {
                let key = (
                    resource,
                    meta_str(&object, "namespace"),
                    meta_str(&object, "name"),
                );
                inner.objects.insert(key, Arc::new(object));
            }
            // Watches resume across the restart from any version the saved tail covers.
            inner.floor = state.history_floor.unwrap_or(state.resource_version);
            let mut expected = inner.floor;
            for saved in state.history {
                if saved.rv <= expected || saved.rv > state.resource_version {
                    anyhow::bail!(
                        "corrupt state file {}: history out of order at resourceVersion {}",
                        state_file
                            .as_deref()
                            .unwrap_or_else(|| std::path::Path::new(""))
                            .display(),
                        saved.rv
                    );
                }
                expected = saved.rv;
                inner.history.push_back(Arc::new(Change::new(
                    saved.rv,
                    saved.kind,
                    saved.resource,
                    Arc::new(saved.object),
                )));
            }
            while inner.history.len() > inner.capacity {
                if let Some(dropped) = inner.history.pop_front() {
                    inner.floor = dropped.rv;
                }
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
            .map(|object| Value::clone(object))
            .ok_or_else(|| ApiError::not_found(resource.plural(), resource.kind(), name))
    }

    /// Matching objects in (namespace, name) order after `after` (a continue position: the last
    /// object returned), at most `limit`; returns them, the list's resourceVersion and the next
    /// continue position.
    pub fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
        limit: Option<usize>,
        after: Option<&(String, String)>,
    ) -> (Vec<Value>, u64, Option<(String, String)>) {
        let (items, rv, next) = self.list_shared(resource, namespace, selector, limit, after);
        (items.iter().map(|o| Value::clone(o)).collect(), rv, next)
    }

    /// [`Store::list`] without copying the objects (for watches, which may be slow to send
    /// them: they must not hold a copy of the namespace each).
    pub fn list_shared(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
        limit: Option<usize>,
        after: Option<&(String, String)>,
    ) -> (Vec<Arc<Value>>, u64, Option<(String, String)>) {
        let inner = self.lock();
        let mut items: Vec<Arc<Value>> = Vec::new();
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
                    .map(|o| (meta_str(o, "namespace"), meta_str(o, "name")));
                break;
            }
            items.push(Arc::clone(object));
        }
        (items, inner.rv, next)
    }

    /// Changes after `since`, in order. `Err` (410 Expired) when some of them are no longer in
    /// history, or when `since` is newer than anything this store has produced (a client that
    /// knew another incarnation of the server: waiting for that version would skip events).
    pub fn changes_since(&self, since: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        let inner = self.lock();
        if since < inner.floor {
            return Err(ApiError::expired(format!(
                "too old resource version: {since} ({})",
                inner.floor + 1
            )));
        }
        if since > inner.rv {
            return Err(ApiError::expired(format!(
                "too large resource version: {since}, current: {}",
                inner.rv
            )));
        }
        // History is in resourceVersion order: find the tail with a binary search. At most
        // CHANGES_PER_READ at a time, so a watcher that is slow to send them does not keep
        // history alive that the store has already dropped.
        let start = inner.history.partition_point(|c| c.rv <= since);
        let end = inner.history.len().min(start + CHANGES_PER_READ);
        Ok(inner.history.range(start..end).cloned().collect())
    }

    /// Creates an object (201).
    pub fn create(
        &self,
        resource: Resource,
        namespace: &str,
        body: Value,
    ) -> Result<Value, ApiError> {
        self.create_in(Mode::Commit, resource, namespace, body)
    }

    /// [`Store::create`], or with [`Mode::DryRun`] only its validation and answer.
    pub fn create_in(
        &self,
        mode: Mode,
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
        if mode == Mode::DryRun {
            // Never stored, so it has no resourceVersion (as kube-apiserver answers).
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("resourceVersion");
            }
            return Ok(object);
        }
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
        self.update_in(Mode::Commit, resource, namespace, name, body)
    }

    /// [`Store::update`], or with [`Mode::DryRun`] only its validation and answer.
    pub fn update_in(
        &self,
        mode: Mode,
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
            .map(|object| Value::clone(object))
            .ok_or_else(|| ApiError::not_found(resource.plural(), resource.kind(), name))?;
        let object = normalize(resource, namespace, body, Some(name))?;
        self.replace(mode, &mut inner, key, current, object, true)
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
        self.patch_in(Mode::Commit, resource, namespace, name, kind, patch)
    }

    /// [`Store::patch`], or with [`Mode::DryRun`] only its validation and answer.
    pub fn patch_in(
        &self,
        mode: Mode,
        resource: Resource,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (resource, namespace.to_owned(), name.to_owned());
        let Some(current) = inner.objects.get(&key).map(|object| Value::clone(object)) else {
            if kind == PatchKind::Apply {
                drop(inner);
                // Indexing a non-object Value mutably panics: check the shape first.
                let mut body = patch;
                match body.as_object_mut().map(|o| {
                    o.entry("metadata")
                        .or_insert_with(|| Value::Object(Map::new()))
                }) {
                    Some(Value::Object(metadata)) => {
                        metadata.insert("name".into(), json!(name));
                    }
                    _ => {
                        return Err(ApiError::bad_request(
                            "an apply patch must be an object with an object metadata",
                        ));
                    }
                }
                return self.create_in(mode, resource, namespace, body);
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
        // A patched object that does not decode is 422 in kube-apiserver (400 for a request body).
        let object = normalize(resource, namespace, patched, Some(name)).map_err(|err| {
            if err.code == 400 {
                ApiError::invalid(resource.kind(), name, err.message)
            } else {
                err
            }
        })?;
        // A patch that names a resourceVersion is a precondition, like an update.
        let check = kind != PatchKind::Json
            || object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"];
        self.replace(mode, &mut inner, key, current, object, check)
    }

    /// Deletes an object if it meets `preconditions`; returns its last state (with the
    /// resourceVersion of the deletion).
    pub fn delete(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Value, ApiError> {
        self.delete_in(Mode::Commit, resource, namespace, name, preconditions)
    }

    /// [`Store::delete`], or with [`Mode::DryRun`] only its checks and answer.
    pub fn delete_in(
        &self,
        mode: Mode,
        resource: Resource,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (resource, namespace.to_owned(), name.to_owned());
        let Some(current) = inner.objects.get(&key) else {
            return Err(ApiError::not_found(
                resource.plural(),
                resource.kind(),
                name,
            ));
        };
        for (field, wanted) in [
            ("resourceVersion", &preconditions.resource_version),
            ("uid", &preconditions.uid),
        ] {
            if let Some(wanted) = wanted
                && meta_str_opt(current, field).as_ref() != Some(wanted)
            {
                return Err(ApiError::conflict(resource.plural(), resource.kind(), name));
            }
        }
        let object = Value::clone(current);
        if mode == Mode::DryRun {
            return Ok(object);
        }
        self.commit(&mut inner, key, object, ChangeKind::Deleted)
    }

    fn replace(
        &self,
        mode: Mode,
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
        if mode == Mode::DryRun {
            return Ok(unchanged);
        }
        self.commit(inner, key, object, ChangeKind::Modified)
    }

    /// Records a change (a new object, a new state, or a deletion) with the next
    /// resourceVersion, saves the state file, and only then tells watchers. When the state
    /// cannot be saved, the change is undone and the client gets a 500: an acknowledged write
    /// is never lost in a restart (issue #18, item 9).
    fn commit(
        &self,
        inner: &mut Inner,
        key: Key,
        mut object: Value,
        kind: ChangeKind,
    ) -> Result<Value, ApiError> {
        let rv = inner.rv + 1;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let resource = key.0;
        let shared = Arc::new(object);
        let previous = if kind == ChangeKind::Deleted {
            inner.objects.remove(&key)
        } else {
            inner.objects.insert(key.clone(), Arc::clone(&shared))
        };
        let (old_rv, old_floor) = (inner.rv, inner.floor);
        inner.rv = rv;
        inner.history.push_back(Arc::new(Change::new(
            rv,
            kind,
            resource,
            Arc::clone(&shared),
        )));
        let mut dropped = Vec::new();
        while inner.history.len() > inner.capacity {
            if let Some(change) = inner.history.pop_front() {
                inner.floor = change.rv;
                dropped.push(change);
            }
        }
        if let Err(err) = self.persist(inner) {
            inner.rv = old_rv;
            inner.floor = old_floor;
            inner.history.pop_back();
            for change in dropped.into_iter().rev() {
                inner.history.push_front(change);
            }
            match previous {
                Some(previous) => inner.objects.insert(key, previous),
                None => inner.objects.remove(&key),
            };
            let err: &dyn std::error::Error = err.as_ref();
            tracing::error!(
                error = err,
                "Cannot save the state file; the change is refused"
            );
            return Err(ApiError::internal(
                "the change cannot be saved (state file); nothing was changed",
            ));
        }
        self.latest.send_replace(rv);
        Ok(Value::clone(&shared))
    }

    /// Writes the state file (under the store lock, so saves are in order and a watcher never
    /// sees a change that a restart would lose).
    fn persist(&self, inner: &Inner) -> anyhow::Result<()> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        let keep = inner.history.len().min(PERSISTED_HISTORY);
        let skipped = inner.history.len() - keep;
        let history_floor = match skipped {
            0 => inner.floor,
            n => inner.history[n - 1].rv,
        };
        let state = StateView {
            resource_version: inner.rv,
            objects: inner
                .objects
                .iter()
                .map(|((r, _, _), o)| (*r, &**o))
                .collect(),
            history: inner
                .history
                .range(skipped..)
                .map(|c| SavedChangeView {
                    rv: c.rv,
                    kind: c.kind,
                    resource: c.resource,
                    object: &c.object,
                })
                .collect(),
            history_floor: Some(history_floor),
        };
        persist::save(path, &state)
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
        // Empty and null maps are not stored (Go's omitempty in kube-apiserver).
        if metadata
            .get(field)
            .is_some_and(|m| m.is_null() || m.as_object().is_some_and(Map::is_empty))
        {
            metadata.remove(field);
        }
        if let Some(map) = metadata.get(field)
            && !(map.is_null()
                || map
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string)))
        {
            // A decoding error in kube-apiserver (the field is a map of strings): 400.
            return Err(ApiError::bad_request(format!(
                "metadata.{field}: values must be strings"
            )));
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
        Resource::Events => {
            // The fields kube-apiserver always writes out (Go zero values).
            for (key, empty) in [
                ("eventTime", Value::Null),
                ("firstTimestamp", Value::Null),
                ("lastTimestamp", Value::Null),
                ("reportingComponent", json!("")),
                ("reportingInstance", json!("")),
                ("source", json!({})),
            ] {
                object.entry(key).or_insert(empty);
            }
        }
        Resource::Leases => {}
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
    // kube-apiserver checks Event names only as path segments.
    let valid = if resource == Resource::Events {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
    } else {
        is_dns_subdomain(name)
    };
    if valid {
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
        store
            .delete(Resource::Secrets, "ns", "a", &Preconditions::default())
            .unwrap();
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
    fn state_and_history_survive_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let store = Store::open(Some(path.clone()), 100).unwrap();
        store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        store.create(Resource::Secrets, "ns", secret("b")).unwrap();
        drop(store);
        let store = Store::open(Some(path.clone()), 100).unwrap();
        assert_eq!(store.resource_version(), 2);
        assert!(store.get(Resource::Secrets, "ns", "b").is_ok());
        let resumed = store.changes_since(1).unwrap();
        assert_eq!(resumed.len(), 1);
        assert_eq!(resumed[0].rv, 2);
        assert_eq!(store.changes_since(0).unwrap().len(), 2);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn only_the_newest_history_is_saved_and_older_versions_expire_after_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let store = Store::open(Some(path.clone()), 10_000).unwrap();
        let total = PERSISTED_HISTORY as u64 + 10;
        for i in 0..total {
            store
                .create(
                    Resource::ConfigMaps,
                    "ns",
                    json!({"metadata": {"name": format!("c{i}")}}),
                )
                .unwrap();
        }
        assert!(store.changes_since(0).is_ok(), "in memory: all of it");
        drop(store);
        let store = Store::open(Some(path), 10_000).unwrap();
        assert_eq!(store.changes_since(9).unwrap_err().code, 410);
        let mut replayed = 0;
        let mut since = 10;
        while let Some(last) = store.changes_since(since).unwrap().last() {
            replayed += store.changes_since(since).unwrap().len();
            since = last.rv;
        }
        assert_eq!(replayed, PERSISTED_HISTORY, "the saved tail");
    }

    #[test]
    fn a_version_newer_than_the_store_is_expired_not_waited_for() {
        let store = Store::open(None, 100).unwrap();
        store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        assert_eq!(store.changes_since(1).unwrap().len(), 0);
        let err = store.changes_since(50).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
    }

    #[test]
    fn an_apply_to_a_missing_object_with_a_non_object_body_is_refused_not_a_panic() {
        let store = Store::open(None, 100).unwrap();
        for body in [
            json!("text"),
            json!([1]),
            json!(7),
            json!({"metadata": "x"}),
        ] {
            let err = store
                .patch(Resource::ConfigMaps, "ns", "a", PatchKind::Apply, body)
                .unwrap_err();
            assert_eq!(err.code, 400);
        }
        assert!(store.get(Resource::ConfigMaps, "ns", "a").is_err());
    }

    #[test]
    fn delete_preconditions_conflict_when_they_do_not_hold() {
        let store = Store::open(None, 100).unwrap();
        let created = store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        let stale = Preconditions {
            resource_version: Some("99".into()),
            uid: None,
        };
        assert_eq!(
            store
                .delete(Resource::Secrets, "ns", "a", &stale)
                .unwrap_err()
                .code,
            409
        );
        let current = Preconditions {
            resource_version: Some(meta_str(&created, "resourceVersion")),
            uid: Some(meta_str(&created, "uid")),
        };
        let deleted = store
            .delete(Resource::Secrets, "ns", "a", &current)
            .unwrap();
        assert_eq!(deleted["metadata"]["resourceVersion"], "2");
    }

    #[test]
    fn watch_lines_are_encoded_once_as_json() {
        let store = Store::open(None, 100).unwrap();
        store.create(Resource::Secrets, "ns", secret("a")).unwrap();
        let change = &store.changes_since(0).unwrap()[0];
        assert!(change.line.ends_with(b"\n"));
        let event: Value = serde_json::from_slice(&change.line).unwrap();
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"], *change.object);
    }
}
