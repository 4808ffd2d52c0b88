//! The declared objects as `regenerate`'s watches last saw them, instead of a GET of every
//! object in every pass (OpenShift's controller reads from shared informers the same way). Per
//! namespace and kind, as `sync` decides it (`--namespace-watch-threshold`): up to the threshold
//! of declared objects, one list+watch per object by name (a `metadata.name` field selector:
//! RBAC grants it by `resourceNames`, so the token cannot read the namespace's other Secrets,
//! etcd's client keys among them); above it, one namespace-wide list+watch
//! ([`crate::kube::watch::namespace_wide`]). Both are reduced to the declared names by
//! [`crate::kube::watch::NamedObjects`]. [`watch_plan`] is the one decision, for the watches and for
//! the RBAC they need ([`crate::app::access`]).
//!
//! - A pass reads here; an object that does not exist is absent here, as a 404 was.
//! - The loop's first pass waits until every watch has listed ([`Cache::ready`]).
//! - Every change bumps a generation the loop waits on ([`Cache::subscribe`]): a change wakes a
//!   pass, as each object's own watch did.
//! - Writes keep optimistic concurrency: they carry the resourceVersion read here. After a
//!   successful write the answer is stored ([`Cache::written`]), so the watch event of our own
//!   write is recognised as known and wakes nothing; a 409 means this copy was stale: the pass
//!   waits until the watch brings a newer version ([`Cache::newer`]) and decides again, never
//!   writing over what it has not seen.
//!
//! Only the declared objects are kept (others of the namespace pass through the watch and are
//! dropped): no other Secret's key stays in memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::watcher::Event;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::{ObjectRef, Rotation};
use crate::base::kind::Kind;
use crate::kube::decode::{DecodeError, Raw};
use crate::kube::watch::{Changes, NamedObjects};

/// One declared object as last seen: its resourceVersion and the object, or why it does not
/// decode (reported by the pass as the item's failure, by field, never with a value).
#[derive(Clone)]
pub(crate) struct Entry<K> {
    version: String,
    object: Result<K, DecodeError>,
}

/// What is known of the declared objects of one kind. An object is missing from the map until
/// its namespace has been listed; after that it is `Some` (present) or `None` (absent).
pub(crate) type Objects<K> = HashMap<ObjectRef, Option<Entry<K>>>;

/// Everything the cache knows, behind one lock.
#[derive(Default)]
pub(crate) struct State {
    secrets: Objects<Secret>,
    config_maps: Objects<ConfigMap>,
    /// Watches whose first list has not completed.
    unlisted: BTreeSet<WatchKey>,
}

/// One list+watch of the cache: every object of a kind in a namespace (`name: None`), or one
/// object by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WatchKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: Option<String>,
}

impl std::fmt::Display for WatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            None => write!(f, "every {} in {}", self.kind.label(), self.namespace),
            Some(name) => write!(f, "{} {}/{name}", self.kind.label(), self.namespace),
        }
    }
}

/// The watches for the objects `rotation` declares, each with the declared names it hands
/// over: per (kind, namespace), one by name per object up to `namespace_watch_threshold`
/// declared objects, else one namespace-wide (0: always namespace-wide).
pub(crate) fn watch_plan(
    rotation: &Rotation,
    namespace_watch_threshold: usize,
) -> Vec<(WatchKey, Vec<String>)> {
    let mut groups: BTreeMap<(Kind, String), Vec<String>> = BTreeMap::new();
    for (kind, object) in rotation.objects() {
        let names = groups.entry((kind, object.namespace.clone())).or_default();
        if !names.contains(&object.name) {
            names.push(object.name.clone());
        }
    }
    let mut plan = Vec::new();
    for ((kind, namespace), names) in groups {
        if names.len() > namespace_watch_threshold {
            let key = WatchKey {
                kind,
                namespace,
                name: None,
            };
            plan.push((key, names));
        } else {
            for name in names {
                let key = WatchKey {
                    kind,
                    namespace: namespace.clone(),
                    name: Some(name.clone()),
                };
                plan.push((key, vec![name]));
            }
        }
    }
    plan
}

/// A kind the cache holds.
pub(crate) trait Cached:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + DeserializeOwned
    + Serialize
    + Clone
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    fn objects(state: &mut State) -> &mut Objects<Self>;
}

impl Cached for Secret {
    const KIND: Kind = Kind::Secret;
    fn objects(state: &mut State) -> &mut Objects<Secret> {
        &mut state.secrets
    }
}

impl Cached for ConfigMap {
    const KIND: Kind = Kind::ConfigMap;
    fn objects(state: &mut State) -> &mut Objects<ConfigMap> {
        &mut state.config_maps
    }
}

/// The declared objects as the namespace-wide watches last saw them.
pub(crate) struct Cache {
    state: Mutex<State>,
    /// The watches ([`watch_plan`]) and the declared names each hands over.
    watches: Vec<(WatchKey, Vec<String>)>,
    /// Bumped on every change a watch brings (not on our own writes).
    generation: watch::Sender<u64>,
}

impl Cache {
    /// An empty cache for the objects `rotation` declares, watched as [`watch_plan`] says;
    /// nothing is watched yet.
    pub fn new(rotation: &Rotation, namespace_watch_threshold: usize) -> Cache {
        let watches = watch_plan(rotation, namespace_watch_threshold);
        Cache {
            state: Mutex::new(State {
                unlisted: watches.iter().map(|(key, _)| key.clone()).collect(),
                ..State::default()
            }),
            watches,
            generation: watch::Sender::new(0),
        }
    }

    /// The watches, one list+watch each.
    pub fn watched(&self) -> impl Iterator<Item = &WatchKey> {
        self.watches.iter().map(|(key, _)| key)
    }

    /// Starts the watches; they run until aborted.
    pub fn spawn_watches(
        self: &Arc<Self>,
        client: &kube::Client,
        timeout_seconds: u32,
    ) -> Vec<JoinHandle<()>> {
        self.watches
            .iter()
            .map(|(key, names)| {
                let (cache, client) = (Arc::clone(self), client.clone());
                let (key, names) = (key.clone(), names.clone());
                match key.kind {
                    Kind::Secret => {
                        tokio::spawn(cache.follow::<Secret>(client, key, names, timeout_seconds))
                    }
                    Kind::ConfigMap => {
                        tokio::spawn(cache.follow::<ConfigMap>(client, key, names, timeout_seconds))
                    }
                }
            })
            .collect()
    }

    async fn follow<K: Cached>(
        self: Arc<Self>,
        client: kube::Client,
        key: WatchKey,
        names: Vec<String>,
        timeout_seconds: u32,
    ) {
        let api: Api<Raw<K>> = Api::namespaced(client, &key.namespace);
        let mut named = NamedObjects::new(names);
        let stream = crate::kube::watch::list_watch(api, key.name.as_deref(), timeout_seconds);
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    if matches!(event, Event::InitDone) {
                        tracing::debug!(watch = %key, "listed");
                    }
                    self.observe_watch::<K>(&key, named.observe(event));
                }
                Err(err) if matches!(crate::kube::watch::error_status(&err), Some(401 | 403)) => {
                    // Say what is missing, not just that a watch failed.
                    let needs = match &key.name {
                        None => format!(
                            "list and watch on every {} of {}",
                            K::KIND.api_kind(),
                            key.namespace
                        ),
                        Some(name) => format!(
                            "list and watch on {} {name} (resourceNames) in {}",
                            K::KIND.api_kind(),
                            key.namespace
                        ),
                    };
                    tracing::error!(watch = %key, error = %crate::base::error::chain(&err), "the apiserver refuses to list and watch {key}; regenerate needs {needs} (see manifests/rbac/ and `--namespace-watch-threshold`); no pass runs until it can; retrying with backoff")
                }
                Err(err) => {
                    tracing::warn!(watch = %key, error = %crate::base::error::chain(&err), "watch failed; retrying with backoff")
                }
            }
        }
    }

    /// Stores what one event of the namespace-wide watch of `namespace` changed (tests).
    #[cfg(test)]
    pub fn observe<K: Cached>(&self, namespace: &str, changes: Changes<Raw<K>>) {
        let key = WatchKey {
            kind: K::KIND,
            namespace: namespace.to_owned(),
            name: None,
        };
        self.observe_watch(&key, changes);
    }

    /// Stores what one event of the watch `key` changed; bumps the generation if anything did.
    pub fn observe_watch<K: Cached>(&self, key: &WatchKey, changes: Changes<Raw<K>>) {
        let namespace = key.namespace.as_str();
        let mut state = self.lock();
        let mut changed = false;
        for (name, raw) in changes.changed {
            let object = ObjectRef {
                namespace: namespace.to_owned(),
                name,
            };
            let entry = raw.map(|raw| Entry {
                version: raw.meta().resource_version.clone().unwrap_or_default(),
                object: raw.decode(),
            });
            let objects = K::objects(&mut state);
            let same = match (objects.get(&object), &entry) {
                (Some(Some(old)), Some(new)) => old.version == new.version,
                (Some(None), None) => true,
                _ => false,
            };
            if !same {
                objects.insert(object, entry);
                changed = true;
            }
        }
        if changes.listed && state.unlisted.remove(key) {
            changed = true;
        }
        drop(state);
        if changed {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// Resolves once every watch has listed.
    pub async fn ready(&self) {
        let mut generation = self.generation.subscribe();
        while !self.lock().unlisted.is_empty() {
            // The sender lives as long as the cache.
            let _ = generation.changed().await;
        }
    }

    /// A receiver that sees every change the watches bring.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The object as last seen: `None` when it does not exist.
    ///
    /// # Errors
    /// It does not decode (by field), or its namespace has not been listed yet.
    pub fn get<K: Cached>(&self, object: &ObjectRef) -> Result<Option<K>, String> {
        match K::objects(&mut self.lock()).get(object) {
            None => Err("not listed yet".to_owned()),
            Some(None) => Ok(None),
            Some(Some(entry)) => entry
                .object
                .clone()
                .map(Some)
                .map_err(|err| format!("cannot decode: {err}")),
        }
    }

    /// Waits up to `timeout` until the object's state differs from `than` (a resourceVersion;
    /// `None`: absent). Whether it did.
    pub async fn newer<K: Cached>(
        &self,
        object: &ObjectRef,
        than: Option<&str>,
        timeout: Duration,
    ) -> bool {
        let mut generation = self.generation.subscribe();
        let moved = || match K::objects(&mut self.lock()).get(object) {
            None => false,
            Some(None) => than.is_some(),
            Some(Some(entry)) => than != Some(entry.version.as_str()),
        };
        tokio::time::timeout(timeout, async {
            while !moved() {
                let _ = generation.changed().await;
            }
        })
        .await
        .is_ok()
    }

    /// Stores our own write (the apiserver's answer), if the cache still holds the version it
    /// was based on (`None`: absent): the watch event of that write is then known and wakes no
    /// pass. A cache that has moved on already holds that write or a later one: left as it is.
    pub fn written<K: Cached>(&self, object: &ObjectRef, based_on: Option<&str>, written: &K) {
        let Some(version) = written.meta().resource_version.clone() else {
            return;
        };
        let mut state = self.lock();
        let objects = K::objects(&mut state);
        let current = match objects.get(object) {
            Some(Some(entry)) => Some(entry.version.as_str()),
            Some(None) => None,
            None => return,
        };
        if current == based_on {
            objects.insert(
                object.clone(),
                Some(Entry {
                    version,
                    object: Ok(written.clone()),
                }),
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::config;

    const CONFIG: &str = r#"
signers:
  - { name: signer, namespace: a, validity: 100d, refresh: 50d }
  - { name: other-signer, namespace: a, validity: 100d, refresh: 50d }
bundles:
  - { name: ca, namespace: b, signers: [signer] }
targets:
  - { name: serving, namespace: b, signer: signer, serving: { hostnames: [localhost] }, validity: 30d, refresh: 15d }
"#;

    fn object(namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    fn raw(name: &str, version: &str) -> Raw<Secret> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "resourceVersion": version },
        }))
        .unwrap()
    }

    fn listed<K>(objects: Vec<(&str, Option<Raw<K>>)>) -> Changes<Raw<K>> {
        Changes {
            changed: objects
                .into_iter()
                .map(|(name, raw)| (name.to_owned(), raw))
                .collect(),
            listed: true,
            ..Changes::default()
        }
    }

    fn version(cache: &Cache, object: &ObjectRef) -> Option<String> {
        cache
            .get::<Secret>(object)
            .unwrap()
            .and_then(|s| s.metadata.resource_version)
    }

    #[tokio::test(start_paused = true)]
    async fn one_watch_per_namespace_and_kind_and_ready_once_each_has_listed() {
        let cache = Cache::new(&config::parse(CONFIG).unwrap(), 0);
        let watched: Vec<String> = cache.watched().map(ToString::to_string).collect();
        assert_eq!(
            watched,
            [
                "every secret in a",
                "every secret in b",
                "every configmap in b"
            ]
        );
        assert_eq!(
            cache.get::<Secret>(&object("a", "signer")),
            Err("not listed yet".to_owned())
        );
        let ready = cache.ready();
        tokio::pin!(ready);
        cache.observe::<Secret>("a", listed(vec![("signer", Some(raw("signer", "1")))]));
        cache.observe::<Secret>("b", listed(vec![("serving", None)]));
        assert!(futures::poll!(&mut ready).is_pending(), "configmaps in b");
        cache.observe::<ConfigMap>("b", listed(vec![("ca", None)]));
        assert!(futures::poll!(&mut ready).is_ready());
        // Listed: present, or absent as a 404 was.
        assert_eq!(version(&cache, &object("a", "signer")), Some("1".into()));
        assert_eq!(cache.get::<Secret>(&object("b", "serving")), Ok(None));
    }

    #[tokio::test(start_paused = true)]
    async fn changes_wake_once_and_our_own_writes_are_known_to_the_watch() {
        let cache = Cache::new(&config::parse(CONFIG).unwrap(), 0);
        let signer = object("a", "signer");
        cache.observe::<Secret>("a", listed(vec![("signer", Some(raw("signer", "1")))]));
        let mut changes = cache.subscribe();
        // Our write based on version 1 is remembered; its watch event then changes nothing.
        let ours: Secret = raw("signer", "2").decode().unwrap();
        cache.written(&signer, Some("1"), &ours);
        assert_eq!(version(&cache, &signer), Some("2".into()));
        cache.observe::<Secret>("a", listed(vec![("signer", Some(raw("signer", "2")))]));
        assert!(!changes.has_changed().unwrap());
        // Someone else's version wakes.
        cache.observe::<Secret>("a", listed(vec![("signer", Some(raw("signer", "3")))]));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        // A write based on a version the cache has moved past never replaces the newer one.
        cache.written(&signer, Some("2"), &raw("signer", "4").decode().unwrap());
        assert_eq!(version(&cache, &signer), Some("3".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn newer_waits_for_a_version_other_than_the_one_written_against() {
        let cache = Arc::new(Cache::new(&config::parse(CONFIG).unwrap(), 0));
        let signer = object("a", "signer");
        cache.observe::<Secret>("a", listed(vec![("signer", None)]));
        // Absent, and still absent: times out.
        assert!(
            !cache
                .newer::<Secret>(&signer, None, Duration::from_secs(10))
                .await
        );
        // Already moved on (our copy said version 0): at once.
        cache.observe::<Secret>("a", listed(vec![("signer", Some(raw("signer", "1")))]));
        assert!(
            cache
                .newer::<Secret>(&signer, Some("0"), Duration::ZERO)
                .await
        );
        // A newer version arriving while waiting.
        let feeder = {
            let cache = Arc::clone(&cache);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                cache.observe::<Secret>("a", listed(vec![("signer", Some(raw("signer", "5")))]));
            })
        };
        assert!(
            cache
                .newer::<Secret>(&signer, Some("1"), Duration::from_secs(10))
                .await
        );
        feeder.await.unwrap();
        assert_eq!(version(&cache, &signer), Some("5".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn up_to_the_threshold_each_object_is_watched_by_name_and_ready_once_each_listed() {
        // Two Secrets in a, one Secret and one ConfigMap in b; threshold 1: the Secrets of a
        // namespace-wide, the others by name.
        let cache = Cache::new(&config::parse(CONFIG).unwrap(), 1);
        let watched: Vec<String> = cache.watched().map(ToString::to_string).collect();
        assert_eq!(
            watched,
            ["every secret in a", "secret b/serving", "configmap b/ca"]
        );
        // The default threshold: every object by name.
        let by_name = Cache::new(&config::parse(CONFIG).unwrap(), 50);
        assert!(by_name.watched().all(|key| key.name.is_some()));
        assert_eq!(by_name.watched().count(), 4);

        let ready = cache.ready();
        tokio::pin!(ready);
        cache.observe::<Secret>("a", listed(vec![("signer", None), ("other-signer", None)]));
        let serving = WatchKey {
            kind: Kind::Secret,
            namespace: "b".into(),
            name: Some("serving".into()),
        };
        cache.observe_watch::<Secret>(
            &serving,
            listed(vec![("serving", Some(raw("serving", "3")))]),
        );
        assert!(futures::poll!(&mut ready).is_pending(), "configmap b/ca");
        let ca = WatchKey {
            kind: Kind::ConfigMap,
            namespace: "b".into(),
            name: Some("ca".into()),
        };
        cache.observe_watch::<ConfigMap>(&ca, listed(vec![("ca", None)]));
        assert!(futures::poll!(&mut ready).is_ready());
        assert_eq!(version(&cache, &object("b", "serving")), Some("3".into()));
    }
}
