// Over 600 lines because the store's one lock guards objects, history and persistence together; splitting the methods that take it would spread one invariant over files.
//! The object store: one increasing resourceVersion for everything, a bounded history of changes
//! for watches, optional persistence to a state file (see [`crate::persist`]). What an object
//! must look like to be stored is [`crate::admission`]'s job.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::admission::{check_name, check_update, finalizers, keep_deletion_mark, normalize};
use crate::change::{Change, ChangeKind};
use crate::meta::{meta_str, meta_str_opt, now_rfc3339, random_suffix, uid};
use crate::persist::{self, PERSISTED_HISTORY, SavedChangeView, StateView};
use crate::resource::Resource;
use crate::select::Selector;
use crate::status::ApiError;

/// Changes kept for watches to resume from; older resourceVersions get 410 Expired.
pub const DEFAULT_HISTORY: usize = 10_000;

/// The most changes [`Store::changes_since`] returns at once.
pub const CHANGES_PER_READ: usize = 64;

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
    /// RFC 7386 merge patch.
    Merge,
    /// Strategic merge patch (see [`crate::smp`]).
    Strategic,
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
                    None,
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
            PatchKind::Strategic => crate::smp::apply(&mut patched, &patch)?,
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
        let mut object = Value::clone(current);
        // Finalizers pending: the object stays, marked for deletion, until they are removed.
        if finalizers(&object).is_some_and(|f| !f.is_empty()) {
            if object["metadata"].get("deletionTimestamp").is_some() {
                return Ok(object);
            }
            object["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if mode == Mode::DryRun {
                return Ok(object);
            }
            return self.commit(&mut inner, key, object, ChangeKind::Modified);
        }
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
        check_update(*resource, name, &current, &object)?;
        // The update that removes the last finalizer of an object being deleted deletes it.
        let deleting = keep_deletion_mark(*resource, name, &current, &mut object)?;
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
        let finished = deleting && finalizers(&object).is_none_or(<[Value]>::is_empty);
        let kind = if finished {
            ChangeKind::Deleted
        } else {
            ChangeKind::Modified
        };
        self.commit(inner, key, object, kind)
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
            previous.clone(),
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

#[cfg(test)]
mod tests;
