//! Watches, as every subcommand opens them: kube-runtime's watcher with a watch timeout (every
//! watch asks the server to end it after `timeoutSeconds`, below the connection's read idle
//! timeout, see [`crate::kube::connection::Settings::watch_timeout_seconds`], so a quiet watch ends
//! cleanly and is resumed from its resourceVersion instead of being cut as a dead connection).
//!
//! - [`watch_object`]: one named object (a `metadata.name` field selector);
//! - [`namespace_wide`] + [`NamedObjects`]: one list+watch for every object of a kind in a
//!   namespace, reduced to the named ones, each handed over once per state (`sync` with many
//!   names, and `regenerate`'s cache);
//! - [`list_watch`]: the same events for one object by name (`regenerate`'s cache where a
//!   namespace holds few declared objects).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;

use futures::{Stream, StreamExt, future};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// The watcher config for every watch: kube's defaults with `timeoutSeconds`.
pub fn config(timeout_seconds: u32) -> watcher::Config {
    watcher::Config::default().timeout(timeout_seconds)
}

/// One named object: `Some` when it exists (created or changed), `None` when it is absent
/// (deleted, or missing from a list). As `kube::runtime::watcher::watch_object`.
pub fn watch_object<K>(
    api: Api<K>,
    name: &str,
    timeout_seconds: u32,
) -> impl Stream<Item = Result<Option<K>, watcher::Error>> + Send + use<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let fields = format!("metadata.name={name}");
    watcher::watcher(api, config(timeout_seconds).fields(&fields))
        .scan(false, |seen, event| {
            if matches!(event, Ok(Event::Init)) {
                *seen = false;
            } else if matches!(event, Ok(Event::InitApply(_))) {
                *seen = true;
            }
            future::ready(Some((*seen, event)))
        })
        .filter_map(|(seen, event)| async move {
            match event {
                Ok(Event::Apply(object) | Event::InitApply(object)) => Some(Ok(Some(object))),
                Ok(Event::Delete(_)) => Some(Ok(None)),
                Ok(Event::InitDone) if !seen => Some(Ok(None)),
                Ok(Event::Init | Event::InitDone) => None,
                Err(err) => Some(Err(err)),
            }
        })
}

/// Every object of `api`'s kind in its namespace: one list (quorum read, in pages), then one
/// watch resumed from its resourceVersion (relist on 410), retried with kube's default backoff.
pub fn namespace_wide<K>(
    api: Api<K>,
    timeout_seconds: u32,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    list_watch(api, None, timeout_seconds)
}

/// As [`namespace_wide`], or with `name` only that object (a `metadata.name` field selector on
/// the list and the watch, which RBAC authorises by `resourceNames`), as raw watcher events
/// for [`NamedObjects`].
pub fn list_watch<K>(
    api: Api<K>,
    name: Option<&str>,
    timeout_seconds: u32,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = match name {
        Some(name) => config(timeout_seconds).fields(&format!("metadata.name={name}")),
        None => config(timeout_seconds),
    };
    watcher::watcher(api, config).default_backoff()
}

/// The HTTP status behind a watcher error, if any.
pub fn error_status(err: &watcher::Error) -> Option<u16> {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        _ => None,
    }
}

/// The last state of a named object handed over, to recognise what was already handed over.
#[derive(Debug, PartialEq, Eq)]
enum Handed {
    Version(String),
    Absent,
}

/// What one event of a [`namespace_wide`] watcher means for the named objects.
#[derive(Debug)]
pub struct Changes<K> {
    /// Named objects in a state not handed over before: `Some` present, `None` absent.
    pub changed: Vec<(String, Option<K>)>,
    /// Named objects seen again in a state already handed over.
    pub unchanged: u64,
    /// Objects of the namespace that are not named.
    pub unnamed: u64,
    /// The event ended a list (the first or a relist): every named object has been handed
    /// over in its listed state or as absent.
    pub listed: bool,
}

impl<K> Default for Changes<K> {
    fn default() -> Changes<K> {
        Changes {
            changed: Vec::new(),
            unchanged: 0,
            unnamed: 0,
            listed: false,
        }
    }
}

/// Turns [`namespace_wide`] watcher events into changes of the named objects: an object whose
/// resourceVersion was already handed over (every object of a relist that did not change, a
/// duplicate after a resumed watch) costs a map lookup; objects that are not named cost a name
/// lookup; a named object missing from a list is handed over as absent, as a 404 would be.
#[derive(Debug)]
pub struct NamedObjects {
    /// Every named object, with the last state handed over (`None`: nothing yet).
    handed: HashMap<String, Option<Handed>>,
    /// Named objects present in the list in progress (between `Init` and `InitDone`).
    listed: HashSet<String>,
}

impl NamedObjects {
    pub fn new(names: impl IntoIterator<Item = String>) -> NamedObjects {
        NamedObjects {
            handed: names.into_iter().map(|name| (name, None)).collect(),
            listed: HashSet::new(),
        }
    }

    pub fn observe<K: kube::Resource>(&mut self, event: Event<K>) -> Changes<K> {
        let mut changes = Changes::default();
        match event {
            Event::Init => self.listed.clear(),
            Event::InitApply(object) => {
                if let Some(name) = object.meta().name.as_deref()
                    && self.handed.contains_key(name)
                {
                    self.listed.insert(name.to_owned());
                }
                self.present(object, &mut changes);
            }
            Event::Apply(object) => self.present(object, &mut changes),
            Event::Delete(object) => match object.meta().name.as_deref() {
                Some(name) if self.handed.contains_key(name) => {
                    let name = name.to_owned();
                    self.absent(&name, &mut changes)
                }
                _ => changes.unnamed += 1,
            },
            Event::InitDone => {
                let missing: Vec<String> = self
                    .handed
                    .keys()
                    .filter(|name| !self.listed.contains(*name))
                    .cloned()
                    .collect();
                for name in missing {
                    self.absent(&name, &mut changes);
                }
                self.listed.clear();
                changes.listed = true;
            }
        }
        changes
    }

    fn present<K: kube::Resource>(&mut self, object: K, changes: &mut Changes<K>) {
        let Some(name) = object.meta().name.clone() else {
            changes.unnamed += 1;
            return;
        };
        let Some(handed) = self.handed.get_mut(&name) else {
            changes.unnamed += 1;
            return;
        };
        let version = object.meta().resource_version.as_deref().unwrap_or("");
        // Every object the apiserver sends has a resourceVersion; one without is never assumed
        // to be known.
        if !version.is_empty() && *handed == Some(Handed::Version(version.to_owned())) {
            changes.unchanged += 1;
            return;
        }
        *handed = Some(Handed::Version(version.to_owned()));
        changes.changed.push((name, Some(object)));
    }

    fn absent<K>(&mut self, name: &str, changes: &mut Changes<K>) {
        let Some(handed) = self.handed.get_mut(name) else {
            return;
        };
        if *handed == Some(Handed::Absent) {
            changes.unchanged += 1;
            return;
        }
        *handed = Some(Handed::Absent);
        changes.changed.push((name.to_owned(), None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;

    fn secret(name: &str, version: &str) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.to_owned());
        secret.metadata.resource_version = Some(version.to_owned());
        secret
    }

    /// The changes as `name=version` or `name=absent`, sorted.
    fn changed(changes: &Changes<Secret>) -> Vec<String> {
        let mut changed: Vec<String> = changes
            .changed
            .iter()
            .map(|(name, object)| match object {
                Some(object) => format!(
                    "{name}={}",
                    object.metadata.resource_version.as_deref().unwrap_or("")
                ),
                None => format!("{name}=absent"),
            })
            .collect();
        changed.sort();
        changed
    }

    /// One whole list: (changes, unchanged, unnamed, whether the last event ended the list).
    fn list(named: &mut NamedObjects, objects: &[Secret]) -> (Vec<String>, u64, u64, bool) {
        let mut all = Changes::default();
        let events = std::iter::once(Event::Init)
            .chain(objects.iter().cloned().map(Event::InitApply))
            .chain(std::iter::once(Event::InitDone));
        for event in events {
            let changes = named.observe(event);
            all.changed.extend(changes.changed);
            all.unchanged += changes.unchanged;
            all.unnamed += changes.unnamed;
            all.listed = changes.listed;
        }
        (changed(&all), all.unchanged, all.unnamed, all.listed)
    }

    #[test]
    fn the_first_list_hands_over_every_named_object_and_marks_the_missing_ones_absent() {
        let mut named = NamedObjects::new(["a".to_owned(), "b".to_owned()]);
        let (changed, unchanged, unnamed, listed) =
            list(&mut named, &[secret("a", "1"), secret("other", "2")]);
        assert_eq!(changed, ["a=1", "b=absent"]);
        assert_eq!((unchanged, unnamed, listed), (0, 1, true));
    }

    #[test]
    fn a_relist_of_unchanged_objects_means_no_changes() {
        let mut named = NamedObjects::new(["a".to_owned(), "b".to_owned()]);
        list(&mut named, &[secret("a", "1"), secret("b", "2")]);
        let (changed, unchanged, _, _) = list(&mut named, &[secret("a", "1"), secret("b", "2")]);
        assert!(changed.is_empty(), "{changed:?}");
        assert_eq!(unchanged, 2);
    }

    #[test]
    fn a_relist_hands_over_only_what_changed_or_disappeared() {
        let mut named = NamedObjects::new(["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        list(
            &mut named,
            &[secret("a", "1"), secret("b", "2"), secret("c", "3")],
        );
        let (changed, unchanged, _, _) = list(&mut named, &[secret("a", "1"), secret("b", "7")]);
        assert_eq!(changed, ["b=7", "c=absent"]);
        assert_eq!(unchanged, 1);
        // Still absent in the next relist: nothing more to do.
        let (changed, _, _, _) = list(&mut named, &[secret("a", "1"), secret("b", "7")]);
        assert!(changed.is_empty(), "{changed:?}");
    }

    #[test]
    fn watch_events_hand_over_new_versions_and_deletions_once() {
        let mut named = NamedObjects::new(["a".to_owned()]);
        list(&mut named, &[secret("a", "1")]);
        let applied = named.observe(Event::Apply(secret("a", "5")));
        assert_eq!(changed(&applied), ["a=5"]);
        assert!(!applied.listed);
        // The same version again (a resumed watch repeating itself): skipped.
        let repeated = named.observe(Event::Apply(secret("a", "5")));
        assert!(repeated.changed.is_empty());
        assert_eq!(repeated.unchanged, 1);
        assert_eq!(
            changed(&named.observe(Event::Delete(secret("a", "6")))),
            ["a=absent"]
        );
        assert!(
            named
                .observe(Event::Delete(secret("a", "6")))
                .changed
                .is_empty()
        );
        assert_eq!(
            changed(&named.observe(Event::Apply(secret("a", "9")))),
            ["a=9"]
        );
        let other = named.observe(Event::Apply(secret("unrelated", "10")));
        assert!(other.changed.is_empty());
        assert_eq!(other.unnamed, 1);
    }
}
