//! Following objects one by one: one watcher per named object (a `metadata.name` field
//! selector: the least data on the wire, RBAC by resourceNames) feeding the object's worker
//! (`worker.rs`).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt;
use serde::de::DeserializeOwned;

use super::apply::Desired;
use super::settings::ObjectSpec;
use super::shared::Follower;
use super::worker;
use crate::base::kind::Kind;
use crate::kube::decode::Raw;
use crate::kube::fetched::ToFetched;

/// Follows one object with its own watcher until shutdown.
pub(super) async fn object(follower: Arc<Follower>, object: ObjectSpec) {
    match object.kind {
        Kind::Secret => one::<Secret>(&follower, &object).await,
        Kind::ConfigMap => one::<ConfigMap>(&follower, &object).await,
    }
}

async fn one<K>(follower: &Arc<Follower>, object: &ObjectSpec)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + ToFetched
        + Send
        + Sync
        + 'static,
{
    let namespace = &follower.applier.settings.namespace;
    let api: Api<Raw<K>> = Api::namespaced(follower.client.clone(), namespace);
    let (slot, worker) = worker::spawn(follower, &api, object);
    let stream = crate::kube::watch::watch_object(
        api,
        &object.name,
        follower.connection.watch_timeout_seconds,
    )
    .default_backoff();
    futures::pin_mut!(stream);
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            () = follower.shutdown.cancelled() => break,
        };
        match item {
            None => break,
            Some(Ok(seen)) => {
                follower.auth_ok();
                follower.applier.readiness.clear("tls");
                slot.put(Desired::of(seen.as_ref()));
            }
            Some(Err(err)) => follower.watch_failed(&object.label(), &err),
        }
    }
    // The worker stops at its next await point; a write in progress runs to completion
    // inside spawn_blocking.
    let _ = worker.await;
}
