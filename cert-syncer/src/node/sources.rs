//! The source objects' watchers: one kube-runtime watcher per object (field selector
//! `metadata.name`, resumed by resourceVersion, backoff on errors), each version decoded and
//! handed to the node loop with the object's index.

use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::WatchStreamExt;
use tokio::sync::mpsc;

use super::settings::ObjectRef;
use crate::kube::decode::Raw;
use crate::kube::fetched::{Fetched, TryFetched};

/// What a source object's watcher reports.
pub enum Seen {
    Object(Fetched),
    Absent,
    Undecodable(String),
    WatchError(String),
}

/// Follows one object and reports every version (and its absence) on `tx`.
pub async fn follow<K>(
    client: kube::Client,
    object: &ObjectRef,
    timeout_seconds: u32,
    index: usize,
    tx: mpsc::UnboundedSender<(usize, Seen)>,
) where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    Raw<K>: TryFetched,
{
    let api: Api<Raw<K>> = Api::namespaced(client, &object.namespace);
    let stream =
        crate::kube::watch::watch_object(api, &object.name, timeout_seconds).default_backoff();
    forward(stream, index, tx).await;
}

async fn forward<O: TryFetched>(
    stream: impl Stream<Item = Result<Option<O>, kube::runtime::watcher::Error>>,
    index: usize,
    tx: mpsc::UnboundedSender<(usize, Seen)>,
) {
    futures::pin_mut!(stream);
    while let Some(item) = stream.next().await {
        let seen = match item {
            Ok(Some(object)) => match object.try_fetched() {
                Ok(fetched) => Seen::Object(fetched),
                Err(err) => Seen::Undecodable(err.to_string()),
            },
            Ok(None) => Seen::Absent,
            Err(err) => Seen::WatchError(err.to_string()),
        };
        if tx.send((index, seen)).is_err() {
            return;
        }
    }
}
