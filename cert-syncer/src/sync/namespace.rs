//! Namespace-wide following for large sets: one list+watch per kind for the whole namespace,
//! filtered here to the named objects, instead of one watch connection per name.
//!
//! - One kube-runtime watcher per kind (resume by resourceVersion, relist on 410, backoff). Its
//!   lists are quorum reads (`ListSemantic::MostRecent`, kube's default) in pages of 500, so the
//!   start-up costs one list (two pages for 1,000 objects), not one list and one GET per object.
//! - The dispatcher ([`Tracker`]) remembers the last state it handed to each named object. An
//!   object whose resourceVersion was already handed over (every object of a relist that did not
//!   change, a duplicate after a resumed watch) costs a map lookup and nothing else; objects that
//!   are not named cost a name lookup.
//! - Each named object has a worker task holding at most one pending state: a newer state
//!   replaces an older one not yet written (bursts coalesce, writes land in order), and a failed
//!   write is retried with backoff until it succeeds or a newer state arrives. Workers take one
//!   of the `--write-parallelism` permits for each attempt. A worker re-applies the last state
//!   it settled to the disk every resync period (from memory, no request).
//!
//! # No confirming GET for present objects
//! The per-name path confirms every change with a live GET. Here the object in hand comes from a
//! quorum list or from the watch that follows it in resourceVersion order, so a GET would return
//! the same object (or a newer one whose event is already on its way) at the price of one request
//! per object, which at start-up is the GET storm this path exists to avoid. Removal is the one
//! destructive step: an optional object that is deleted (or missing from a relist) while its
//! directory exists is confirmed absent with a live GET first, as library-go's certsyncpod does;
//! if the GET finds it, the live object is written instead.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::Instrument;

use super::apply::Desired;
use super::follow::{Follower, Resync, Retry};
use super::settings::ObjectSpec;
use crate::decode::Raw;
use crate::fetched::{ToFetched, TryFetched};
use crate::metrics::WatchEventLabels;

/// Follows the named `objects` (all of one kind) with one namespace-wide watcher until shutdown.
pub(super) async fn follow<K>(context: Arc<Follower>, objects: Vec<ObjectSpec>)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + ToFetched
        + Send
        + Sync
        + 'static,
{
    let Some(kind) = objects.first().map(|o| o.kind) else {
        return;
    };
    let namespace = &context.applier.settings.namespace;
    let what = format!("{}s in namespace {namespace}", kind.label());
    let api: Api<Raw<K>> = Api::namespaced(context.client.clone(), namespace);
    let mut slots = HashMap::new();
    let mut workers = Vec::new();
    for object in &objects {
        let slot = Arc::new(Slot::default());
        slots.insert(object.name.clone(), Arc::clone(&slot));
        workers.push(tokio::spawn(work(
            Arc::clone(&context),
            api.clone(),
            object.clone(),
            slot,
        )));
    }
    let mut tracker = Tracker::new(objects.iter().map(|o| o.name.clone()));
    let count = |result: &'static str, n: u64| {
        if n > 0 {
            context
                .applier
                .metrics
                .watch_events
                .get_or_create(&WatchEventLabels {
                    kind: kind.label(),
                    result,
                })
                .inc_by(n);
        }
    };
    let stream = watcher::watcher(
        api,
        crate::watch::config(context.connection.watch_timeout_seconds),
    )
    .default_backoff();
    futures::pin_mut!(stream);
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            () = context.shutdown.cancelled() => break,
        };
        match item {
            None => break,
            Some(Ok(event)) => {
                context.auth_ok();
                context.applier.readiness.clear("tls");
                if matches!(event, Event::InitDone) {
                    tracing::debug!(kind = kind.label(), "namespace list done");
                }
                let observed = tracker.observe(event);
                count("changed", observed.work.len() as u64);
                count("unchanged", observed.unchanged);
                count("unnamed", observed.unnamed);
                for (name, desired) in observed.work {
                    if let Some(slot) = slots.get(&name) {
                        slot.put(desired);
                    }
                }
            }
            Some(Err(err)) => context.watch_failed(&what, &err),
        }
    }
    // Workers stop at their next await point; a write in progress runs to completion inside
    // spawn_blocking.
    for worker in workers {
        let _ = worker.await;
    }
}

/// The last state handed to a worker, to recognise what it already has.
#[derive(Debug, PartialEq, Eq)]
enum Handed {
    Version(String),
    Absent,
}

/// The work one watcher event means.
#[derive(Debug, Default)]
struct Observed {
    /// Named objects with a state their worker does not have yet.
    work: Vec<(String, Desired)>,
    /// Named objects seen again in a state already handed over.
    unchanged: u64,
    /// Objects of the namespace that are not named.
    unnamed: u64,
}

/// Turns watcher events into work for the named objects, skipping states already handed over.
#[derive(Debug)]
struct Tracker {
    /// Every named object, with the last state handed to its worker (`None`: nothing yet).
    handed: HashMap<String, Option<Handed>>,
    /// Named objects present in the list in progress (between `Init` and `InitDone`).
    listed: HashSet<String>,
}

impl Tracker {
    fn new(names: impl IntoIterator<Item = String>) -> Tracker {
        Tracker {
            handed: names.into_iter().map(|name| (name, None)).collect(),
            listed: HashSet::new(),
        }
    }

    fn observe<K: kube::Resource + TryFetched>(&mut self, event: Event<K>) -> Observed {
        let mut observed = Observed::default();
        match event {
            Event::Init => self.listed.clear(),
            Event::InitApply(object) => {
                if let Some(name) = object.meta().name.as_deref()
                    && self.handed.contains_key(name)
                {
                    self.listed.insert(name.to_owned());
                }
                self.present(&object, &mut observed);
            }
            Event::Apply(object) => self.present(&object, &mut observed),
            Event::Delete(object) => match object.meta().name.as_deref() {
                Some(name) if self.handed.contains_key(name) => self.absent(name, &mut observed),
                _ => observed.unnamed += 1,
            },
            Event::InitDone => {
                let missing: Vec<String> = self
                    .handed
                    .keys()
                    .filter(|name| !self.listed.contains(*name))
                    .cloned()
                    .collect();
                for name in missing {
                    self.absent(&name, &mut observed);
                }
                self.listed.clear();
            }
        }
        observed
    }

    fn present<K: kube::Resource + TryFetched>(&mut self, object: &K, observed: &mut Observed) {
        let Some(name) = object.meta().name.as_deref() else {
            observed.unnamed += 1;
            return;
        };
        let Some(handed) = self.handed.get_mut(name) else {
            observed.unnamed += 1;
            return;
        };
        let version = object.meta().resource_version.as_deref().unwrap_or("");
        // Every object the apiserver sends has a resourceVersion; one without is never assumed
        // to be known.
        if !version.is_empty() && *handed == Some(Handed::Version(version.to_owned())) {
            observed.unchanged += 1;
            return;
        }
        *handed = Some(Handed::Version(version.to_owned()));
        let desired = match object.try_fetched() {
            Ok(fetched) => Desired::Present(fetched),
            Err(err) => Desired::Undecodable(err),
        };
        observed.work.push((name.to_owned(), desired));
    }

    fn absent(&mut self, name: &str, observed: &mut Observed) {
        let Some(handed) = self.handed.get_mut(name) else {
            return;
        };
        if *handed == Some(Handed::Absent) {
            observed.unchanged += 1;
            return;
        }
        *handed = Some(Handed::Absent);
        observed.work.push((name.to_owned(), Desired::Absent));
    }
}

/// Hands a state from the dispatcher to one object's worker: the newest state replaces one the
/// worker has not taken yet.
#[derive(Debug, Default)]
struct Slot {
    desired: Mutex<Option<Desired>>,
    notify: Notify,
}

impl Slot {
    fn put(&self, desired: Desired) {
        *self.desired.lock().unwrap_or_else(|p| p.into_inner()) = Some(desired);
        // Stores a permit when the worker is busy, so the state is picked up after the write.
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Desired> {
        self.desired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// One named object's worker: applies each state handed over, retries a failed one with
/// backoff until it settles or a newer state replaces it, and re-applies the settled state to
/// the disk every resync period.
async fn work<K>(context: Arc<Follower>, api: Api<Raw<K>>, object: ObjectSpec, slot: Arc<Slot>)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + ToFetched,
{
    let mut pending: Option<Desired> = None;
    let mut settled_state: Option<Desired> = None;
    let mut retry = Retry::default();
    let mut resync = Resync::new(context.resync_interval);
    loop {
        tokio::select! {
            () = slot.notify.notified() => {
                let Some(desired) = slot.take() else { continue };
                pending = Some(desired);
                retry.reset();
            }
            () = retry.wait() => {}
            () = resync.tick() => {
                // A failed repair is logged and tried again at the next tick.
                if let (None, Some(desired)) = (&pending, &settled_state) {
                    let _permit = context.write_permit().await;
                    context.applier.resync(&object, desired).await;
                }
                continue;
            }
            () = context.shutdown.cancelled() => return,
        }
        let Some(desired) = pending.take() else {
            continue;
        };
        let (settled, applied) = {
            let _permit = context.write_permit().await;
            let span = tracing::info_span!("sync", object = %object.label(), secret.namespace = %context.applier.settings.namespace, retry = ?retry.delay());
            apply(&context, &object, &api, desired)
                .instrument(span)
                .await
        };
        if settled {
            settled_state = Some(applied);
        } else {
            pending = Some(applied);
        }
        retry.after(settled);
    }
}

/// Writes or removes; returns whether it settled (`false`: worth retrying) and the state it
/// applied: `desired`, or what the live GET found instead.
async fn apply<K>(
    context: &Follower,
    object: &ObjectSpec,
    api: &Api<Raw<K>>,
    desired: Desired,
) -> (bool, Desired)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + ToFetched,
{
    let applier = &context.applier;
    match desired {
        // Nothing to remove (required objects keep their files): no need to ask.
        Desired::Absent if object.required || !applier.object_dir(object).exists() => (
            applier.apply(object, &Desired::Absent).await,
            Desired::Absent,
        ),
        // Removing files: confirm with a live GET first (which writes the object if it exists).
        Desired::Absent => match context.reconcile(object, api, false).await {
            (settled, Some(confirmed)) => (settled, confirmed),
            (settled, None) => (settled, Desired::Absent),
        },
        desired => (applier.apply(object, &desired).await, desired),
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

    /// The work as `name=version` or `name=absent`, sorted.
    fn work(observed: &Observed) -> Vec<String> {
        let mut work: Vec<String> = observed
            .work
            .iter()
            .map(|(name, desired)| match desired {
                Desired::Present(fetched) => format!("{name}={}", fetched.resource_version),
                Desired::Undecodable(err) => format!("{name}=undecodable {}", err.field),
                Desired::Absent => format!("{name}=absent"),
            })
            .collect();
        work.sort();
        work
    }

    fn list(tracker: &mut Tracker, objects: &[Secret]) -> (Vec<String>, u64, u64) {
        let mut all = Observed::default();
        let events = std::iter::once(Event::Init)
            .chain(objects.iter().cloned().map(Event::InitApply))
            .chain(std::iter::once(Event::InitDone));
        for event in events {
            let observed = tracker.observe(event);
            all.work.extend(observed.work);
            all.unchanged += observed.unchanged;
            all.unnamed += observed.unnamed;
        }
        (work(&all), all.unchanged, all.unnamed)
    }

    #[test]
    fn the_first_list_hands_over_every_named_object_and_marks_the_missing_ones_absent() {
        let mut tracker = Tracker::new(["a".to_owned(), "b".to_owned()]);
        let (work, unchanged, unnamed) =
            list(&mut tracker, &[secret("a", "1"), secret("other", "2")]);
        assert_eq!(work, ["a=1", "b=absent"]);
        assert_eq!((unchanged, unnamed), (0, 1));
    }

    #[test]
    fn a_relist_of_unchanged_objects_means_no_work() {
        let mut tracker = Tracker::new(["a".to_owned(), "b".to_owned()]);
        list(&mut tracker, &[secret("a", "1"), secret("b", "2")]);
        let (work, unchanged, _) = list(&mut tracker, &[secret("a", "1"), secret("b", "2")]);
        assert!(work.is_empty(), "{work:?}");
        assert_eq!(unchanged, 2);
    }

    #[test]
    fn a_relist_hands_over_only_what_changed_or_disappeared() {
        let mut tracker = Tracker::new(["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        list(
            &mut tracker,
            &[secret("a", "1"), secret("b", "2"), secret("c", "3")],
        );
        let (work, unchanged, _) = list(&mut tracker, &[secret("a", "1"), secret("b", "7")]);
        assert_eq!(work, ["b=7", "c=absent"]);
        assert_eq!(unchanged, 1);
        // Still absent in the next relist: nothing more to do.
        let (work, _, _) = list(&mut tracker, &[secret("a", "1"), secret("b", "7")]);
        assert!(work.is_empty(), "{work:?}");
    }

    #[test]
    fn watch_events_hand_over_new_versions_and_deletions_once() {
        let mut tracker = Tracker::new(["a".to_owned()]);
        list(&mut tracker, &[secret("a", "1")]);
        assert_eq!(
            work(&tracker.observe(Event::Apply(secret("a", "5")))),
            ["a=5"]
        );
        // The same version again (a resumed watch repeating itself): skipped.
        let repeated = tracker.observe(Event::Apply(secret("a", "5")));
        assert!(repeated.work.is_empty());
        assert_eq!(repeated.unchanged, 1);
        assert_eq!(
            work(&tracker.observe(Event::Delete(secret("a", "6")))),
            ["a=absent"]
        );
        assert!(
            tracker
                .observe(Event::Delete(secret("a", "6")))
                .work
                .is_empty()
        );
        assert_eq!(
            work(&tracker.observe(Event::Apply(secret("a", "9")))),
            ["a=9"]
        );
        let other = tracker.observe(Event::Apply(secret("unrelated", "10")));
        assert!(other.work.is_empty());
        assert_eq!(other.unnamed, 1);
    }
}
