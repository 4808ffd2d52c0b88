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
//! - Each named object has its worker (`worker.rs`, the same as for per-object following): the
//!   dispatcher hands it every changed state; what is written, retried, resynced or confirmed
//!   with a GET first is decided there.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;

use super::apply::Desired;
use super::settings::ObjectSpec;
use super::shared::Follower;
use super::worker;
use crate::kube::decode::Raw;
use crate::kube::fetched::ToFetched;
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
        let (slot, task) = worker::spawn(&context, &api, object);
        slots.insert(object.name.clone(), slot);
        workers.push(task);
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
                    if let Some(slot) = slots.get(&name) {
                        slot.put(Desired::of(object.as_ref()));
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
