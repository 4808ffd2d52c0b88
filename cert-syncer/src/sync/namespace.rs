//! Namespace-wide following for large sets: one list+watch per kind for the whole namespace,
//! filtered here to the named objects, instead of one watch connection per name.
//!
//! - One kube-runtime watcher per kind (resume by resourceVersion, relist on 410, backoff). Its
//!   lists are quorum reads (`ListSemantic::MostRecent`, kube's default) in pages of 500, so the
//!   start-up costs one list (two pages for 1,000 objects), not one list and one GET per object.
//! - The dispatcher ([`NamedObjects`], shared with `regenerate`'s cache) remembers the last
//!   state it handed to each named object. An object whose resourceVersion was already handed
//!   over (every object of a relist that did not change, a duplicate after a resumed watch)
//!   costs a map lookup and nothing else; objects that are not named cost a name lookup.
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

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::Instrument;

use super::apply::Desired;
use super::follow::{Follower, Resync, Retry};
use super::settings::ObjectSpec;
use crate::kube::decode::Raw;
use crate::kube::fetched::{ToFetched, TryFetched};
use crate::kube::watch::NamedObjects;
use crate::sync::metrics::WatchEventLabels;

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
    let mut named = NamedObjects::new(objects.iter().map(|o| o.name.clone()));
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
    let stream = crate::kube::watch::namespace_wide(api, context.connection.watch_timeout_seconds);
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
                let changes = named.observe(event);
                count("changed", changes.changed.len() as u64);
                count("unchanged", changes.unchanged);
                count("unnamed", changes.unnamed);
                for (name, object) in changes.changed {
                    let desired = match object.map(|object| object.try_fetched()) {
                        Some(Ok(fetched)) => Desired::Present(fetched),
                        Some(Err(err)) => Desired::Undecodable(err),
                        None => Desired::Absent,
                    };
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
