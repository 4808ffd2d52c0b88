//! The declared objects as `regenerate`'s watches last saw them: one list+watch per namespace
//! and kind the config names ([`crate::watch::namespace_wide`], reduced to the declared names by
//! [`crate::watch::NamedObjects`], the machinery `sync` uses for large sets), instead of one
//! watch per object and a GET of every object in every pass. OpenShift's controller reads from
//! shared informers the same way.
//!
//! - A pass reads here; an object that does not exist is absent here, as a 404 was.
//! - The loop's first pass waits until every watched namespace has been listed ([`Cache::ready`]).
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
use crate::decode::{DecodeError, Raw};
use crate::kind::Kind;
use crate::watch::{Changes, NamedObjects};

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
    /// (kind, namespace) pairs whose first list has not completed.
    unlisted: BTreeSet<(Kind, String)>,
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
    /// The declared names per (kind, namespace): one watch each.
    groups: BTreeMap<(Kind, String), Vec<String>>,
    /// Bumped on every change a watch brings (not on our own writes).
    generation: watch::Sender<u64>,
}

impl Cache {
    /// An empty cache for the objects `rotation` declares; nothing is watched yet.
    pub fn new(rotation: &Rotation) -> Cache {
        let mut groups: BTreeMap<(Kind, String), Vec<String>> = BTreeMap::new();
        for (kind, object) in rotation.objects() {
            let names = groups.entry((kind, object.namespace.clone())).or_default();
            if !names.contains(&object.name) {
                names.push(object.name.clone());
            }
        }
        Cache {
            state: Mutex::new(State {
                unlisted: groups.keys().cloned().collect(),
                ..State::default()
            }),
            groups,
            generation: watch::Sender::new(0),
        }
    }

    /// The (kind, namespace) pairs watched, one watch each.
    pub fn watched(&self) -> impl Iterator<Item = &(Kind, String)> {
        self.groups.keys()
    }

    /// Starts one namespace-wide watch per (kind, namespace); they run until aborted.
    pub fn spawn_watches(
        self: &Arc<Self>,
        client: &kube::Client,
        timeout_seconds: u32,
    ) -> Vec<JoinHandle<()>> {
        self.groups
            .iter()
            .map(|((kind, namespace), names)| {
                let (cache, client) = (Arc::clone(self), client.clone());
                let (namespace, names) = (namespace.clone(), names.clone());
                match kind {
                    Kind::Secret => tokio::spawn(cache.follow::<Secret>(
                        client,
                        namespace,
                        names,
                        timeout_seconds,
                    )),
                    Kind::ConfigMap => tokio::spawn(cache.follow::<ConfigMap>(
                        client,
                        namespace,
                        names,
                        timeout_seconds,
                    )),
                }
            })
            .collect()
    }

    async fn follow<K: Cached>(
        self: Arc<Self>,
        client: kube::Client,
        namespace: String,
        names: Vec<String>,
        timeout_seconds: u32,
    ) {
        let api: Api<Raw<K>> = Api::namespaced(client, &namespace);
        let mut named = NamedObjects::new(names);
        let stream = crate::watch::namespace_wide(api, timeout_seconds);
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    if matches!(event, Event::InitDone) {
                        tracing::debug!(kind = K::KIND.label(), %namespace, "namespace listed");
                    }
                    self.observe::<K>(&namespace, named.observe(event));
                }
                Err(err) if matches!(crate::watch::error_status(&err), Some(401 | 403)) => {
                    // Roles from before the namespace-wide watches granted list and watch by
                    // name only: say what is missing, not just that a watch failed.
                    tracing::error!(kind = K::KIND.label(), %namespace, error = %crate::error::chain(&err), "the apiserver refuses to list and watch {}s in {namespace}; regenerate needs list and watch on every {} of that namespace (manifests/rbac/cert-regeneration-controller.yaml); no pass runs until it can; retrying with backoff", K::KIND.label(), K::KIND.api_kind())
                }
                Err(err) => {
                    tracing::warn!(kind = K::KIND.label(), %namespace, error = %crate::error::chain(&err), "watch failed; retrying with backoff")
                }
            }
        }
    }

    /// Stores what one watch event changed; bumps the generation if anything did.
    pub fn observe<K: Cached>(&self, namespace: &str, changes: Changes<Raw<K>>) {
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
        if changes.listed && state.unlisted.remove(&(K::KIND, namespace.to_owned())) {
            changed = true;
        }
        drop(state);
        if changed {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// Resolves once every watched namespace has been listed.
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
        let cache = Cache::new(&config::parse(CONFIG).unwrap());
        let watched: Vec<String> = cache
            .watched()
            .map(|(kind, ns)| format!("{} {ns}", kind.label()))
            .collect();
        assert_eq!(watched, ["secret a", "secret b", "configmap b"]);
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
        let cache = Cache::new(&config::parse(CONFIG).unwrap());
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
        let cache = Arc::new(Cache::new(&config::parse(CONFIG).unwrap()));
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
}
