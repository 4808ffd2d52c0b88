//! Watch fan-out: each watch is a task that reads the store's history after the last
//! resourceVersion it sent and streams JSON lines to its client.
//!
//! Nothing is pushed to watchers: the store only announces its newest resourceVersion (a
//! `tokio::sync::watch`), and every watcher pulls the shared, pre-encoded history entries it has
//! not sent yet. So a slow client delays only itself (its bounded channel fills up and its task
//! waits), events are never lost nor repeated, and a watcher that falls behind the bounded
//! history gets `410 Expired` in-stream and relists, as with kube-apiserver.
//!
//! Memory per watch is bounded (issue #18, item 7): the initial objects are shared with the
//! store (no copy of the namespace per watcher) and encoded one at a time; lines go to the
//! connection in chunks of at most [`CHUNK`] bytes through a channel of `BUFFER` chunks; the
//! history is read [`crate::store::CHANGES_PER_READ`] entries at a time. A client that takes
//! nothing for [`STALL_TIMEOUT`] while events wait is disconnected (kube-apiserver also closes
//! watchers that cannot keep up); it re-watches from its last resourceVersion, or relists.
//!
//! Semantics, following <https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-watch>:
//! `resourceVersion` unset or `"0"`: the current objects as `ADDED`, then changes; `"N"`: changes
//! after N (410 if N left the history, or is newer than this server has ever been);
//! `sendInitialEvents=true`: the current objects as `ADDED`, a `BOOKMARK` annotated
//! `k8s.io/initial-events-end`, then changes. Bookmarks (`allowWatchBookmarks`) carry the last
//! resourceVersion examined, so filtered watches resume close to now. The stream ends after
//! `timeoutSeconds` (default 30 min); clients re-watch from their last resourceVersion.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::change::{Change, ChangeKind, event_line};
use crate::meta::meta_str;
use crate::metrics::WatchGuard;
use crate::resource::Resource;
use crate::select::Selector;
use crate::status::ApiError;
use crate::store::{CHANGES_PER_READ, Store};
use examples::serve::Body;

/// Chunks buffered per watcher before its task waits for the client.
const BUFFER: usize = 16;
/// The largest chunk of a watch line handed to the connection at once.
pub const CHUNK: usize = 16 * 1024;
/// How long a watcher may take nothing while events wait, before its connection is closed.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The sending end of one watch stream.
#[derive(Debug)]
struct Sink {
    tx: mpsc::Sender<Bytes>,
    /// Closes the client's connection.
    abort: CancellationToken,
}

impl Sink {
    /// Sends one line in chunks; `false` when the stream must end (the client left, or took
    /// nothing for [`STALL_TIMEOUT`]: then its connection is closed).
    async fn send(&self, line: Bytes) -> bool {
        let mut offset = 0;
        while offset < line.len() {
            let end = line.len().min(offset + CHUNK);
            match tokio::time::timeout(STALL_TIMEOUT, self.tx.send(line.slice(offset..end))).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return false,
                Err(_) => {
                    tracing::info!(
                        "Closing a watch whose client has read nothing for {STALL_TIMEOUT:?}"
                    );
                    self.abort.cancel();
                    return false;
                }
            }
            offset = end;
        }
        true
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The current objects as `ADDED`, then changes (`resourceVersion` unset or `"0"`).
    Current,
    /// The current objects as `ADDED`, then the initial-events-end bookmark, then changes
    /// (`sendInitialEvents=true`).
    InitialEvents,
    /// Changes after this resourceVersion.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// The resource watched.
    pub resource: Resource,
    /// Its namespace, or `None` for all namespaces.
    pub namespace: Option<String>,
    /// Label and field selectors.
    pub selector: Selector,
    /// Where to start.
    pub start: Start,
    /// When the stream ends.
    pub timeout: Duration,
    /// Whether `BOOKMARK` events are sent.
    pub bookmarks: bool,
    /// Time between bookmarks.
    pub bookmark_interval: Duration,
    /// Ends the stream (server shutdown), so graceful shutdown does not wait for watches.
    pub shutdown: CancellationToken,
}

impl WatchRequest {
    fn matches(&self, resource: Resource, object: &Value) -> bool {
        resource == self.resource
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == meta_str(object, "namespace"))
            && self.selector.matches(object)
    }

    /// The event this watch sends for `change`, if any. With a selector, a modification that
    /// makes an object match is ADDED, one that makes it stop matching is DELETED with the
    /// previous state at the new resourceVersion (kube-apiserver's watch cache does the same).
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        let now = self.matches(change.resource, &change.object);
        let before = match (&change.previous, change.kind) {
            (Some(previous), ChangeKind::Modified) => self.matches(change.resource, previous),
            _ => now,
        };
        match (before, now) {
            (true, true) => Some(change.line.clone()),
            (false, true) => Some(event_line("ADDED", &change.object)),
            (true, false) => {
                let mut last = change.previous.as_deref().cloned().unwrap_or(Value::Null);
                last["metadata"]["resourceVersion"] = Value::from(change.rv.to_string());
                Some(event_line("DELETED", &last))
            }
            (false, false) => None,
        }
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({
            "kind": self.resource.kind(),
            "apiVersion": self.resource.api_version(),
            "metadata": metadata,
        });
        event_line("BOOKMARK", &object)
    }
}

/// Starts a watch: HTTP 200 with a body of JSON lines. Errors after the start (410 Expired)
/// are sent in-stream as an `ERROR` event, as kube-apiserver does; that is what makes clients
/// relist (kube-runtime treats a non-200 answer to a resumed watch as retryable, not as a
/// reason to relist).
/// `open` counts the stream in the metrics while its task runs.
/// `abort` closes the client's connection (used when it stops reading).
pub fn respond(
    store: &Arc<Store>,
    request: WatchRequest,
    open: WatchGuard,
    abort: CancellationToken,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(BUFFER);
    let store = Arc::clone(store);
    tokio::spawn(async move {
        let _open = open;
        let sink = Sink { tx, abort };
        if let Err(err) = stream(&store, &request, &sink).await {
            tracing::debug!(
                resource = request.resource.plural(),
                reason = err.reason,
                message = %err.message,
                "Watch ended with an error event"
            );
            sink.send(event_line("ERROR", &err.to_status())).await;
        }
    });
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, std::io::Error>(Frame::data(bytes)), rx))
    }));
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(body))
        .expect("static response parts are valid")
}

/// The watch loop; returns when the client leaves, the timeout passes, or with the error to
/// send.
async fn stream(store: &Store, request: &WatchRequest, sink: &Sink) -> Result<(), ApiError> {
    // Subscribe before reading anything, so no change between the read and the wait is missed.
    let mut latest = store.subscribe();
    latest.borrow_and_update();
    let mut last = match request.start {
        Start::After(rv) => rv,
        Start::Current | Start::InitialEvents => {
            let (items, rv, _) = store.list_shared(
                request.resource,
                request.namespace.as_deref(),
                &request.selector,
                None,
                None,
            );
            for item in items {
                if !sink.send(event_line("ADDED", &item)).await {
                    return Ok(());
                }
            }
            if request.start == Start::InitialEvents && !sink.send(request.bookmark(rv, true)).await
            {
                return Ok(());
            }
            rv
        }
    };
    let deadline = tokio::time::Instant::now() + request.timeout;
    let mut bookmark_timer = tokio::time::interval_at(
        tokio::time::Instant::now() + request.bookmark_interval,
        request.bookmark_interval,
    );
    bookmark_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        loop {
            let page = store.changes_since(last)?;
            let complete = page.len() < CHANGES_PER_READ;
            for change in page {
                if let Some(line) = request.event_for(&change)
                    && !sink.send(line).await
                {
                    return Ok(());
                }
                last = change.rv;
            }
            if complete {
                break;
            }
        }
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return Ok(()) },
            () = tokio::time::sleep_until(deadline) => return Ok(()),
            _ = bookmark_timer.tick(), if request.bookmarks => {
                if !sink.send(request.bookmark(last, false)).await {
                    return Ok(());
                }
            }
            () = sink.tx.closed() => return Ok(()),
            () = request.shutdown.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(start: Start) -> WatchRequest {
        WatchRequest {
            resource: Resource::ConfigMaps,
            namespace: Some("ns".into()),
            selector: Selector::default(),
            start,
            timeout: Duration::from_secs(60),
            bookmarks: true,
            bookmark_interval: Duration::from_secs(5),
            shutdown: CancellationToken::new(),
        }
    }

    fn create(store: &Store, namespace: &str, name: &str) {
        store
            .create(
                Resource::ConfigMaps,
                namespace,
                json!({"metadata": {"name": name}}),
            )
            .unwrap();
    }

    async fn next(rx: &mut mpsc::Receiver<Bytes>) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an event in time")
            .expect("the stream is open");
        serde_json::from_slice(&line).unwrap()
    }

    fn spawn(store: &Arc<Store>, request: WatchRequest) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(BUFFER);
        let store = Arc::clone(store);
        tokio::spawn(async move {
            let sink = Sink {
                tx,
                abort: CancellationToken::new(),
            };
            if let Err(err) = stream(&store, &request, &sink).await {
                sink.send(event_line("ERROR", &err.to_status())).await;
            }
        });
        rx
    }

    #[tokio::test]
    async fn a_label_watch_sees_objects_start_and_stop_matching() {
        let store = Arc::new(Store::open(None, 100).unwrap());
        let label = |name: &str, tier: &str| {
            store
                .patch(
                    Resource::ConfigMaps,
                    "ns",
                    name,
                    crate::store::PatchKind::Merge,
                    json!({"metadata": {"labels": {"tier": tier}}}),
                )
                .unwrap();
        };
        create(&store, "ns", "a");
        create(&store, "ns", "b");
        label("a", "cp");
        let mut watch = request(Start::After(store.resource_version()));
        watch.selector = Selector::parse(Resource::ConfigMaps, Some("tier=cp"), None).unwrap();
        let mut rx = spawn(&store, watch);
        label("b", "cp");
        label("a", "dp");
        label("b", "cp2");
        let added = next(&mut rx).await;
        assert_eq!(added["type"], "ADDED");
        assert_eq!(added["object"]["metadata"]["name"], "b");
        let deleted = next(&mut rx).await;
        assert_eq!(deleted["type"], "DELETED");
        assert_eq!(deleted["object"]["metadata"]["name"], "a");
        // The last matching state, at the version of the change that ended the match.
        assert_eq!(deleted["object"]["metadata"]["labels"]["tier"], "cp");
        assert_eq!(deleted["object"]["metadata"]["resourceVersion"], "5");
        let gone = next(&mut rx).await;
        assert_eq!(
            (
                gone["type"].as_str(),
                gone["object"]["metadata"]["name"].as_str()
            ),
            (Some("DELETED"), Some("b"))
        );
    }

    #[tokio::test]
    async fn a_watch_from_a_version_sends_later_matching_changes_in_order() {
        let store = Arc::new(Store::open(None, 100).unwrap());
        create(&store, "ns", "a");
        let mut rx = spawn(&store, request(Start::After(1)));
        create(&store, "other", "x");
        create(&store, "ns", "b");
        store
            .patch(
                Resource::ConfigMaps,
                "ns",
                "b",
                crate::store::PatchKind::Merge,
                json!({"data": {"k": "v"}}),
            )
            .unwrap();
        let first = next(&mut rx).await;
        assert_eq!(
            (
                first["type"].as_str(),
                first["object"]["metadata"]["name"].as_str()
            ),
            (Some("ADDED"), Some("b"))
        );
        let second = next(&mut rx).await;
        assert_eq!(second["type"], "MODIFIED");
        assert_eq!(second["object"]["metadata"]["resourceVersion"], "4");
    }

    #[tokio::test]
    async fn initial_events_end_with_an_annotated_bookmark() {
        let store = Arc::new(Store::open(None, 100).unwrap());
        create(&store, "ns", "a");
        create(&store, "ns", "b");
        let mut rx = spawn(&store, request(Start::InitialEvents));
        assert_eq!(next(&mut rx).await["object"]["metadata"]["name"], "a");
        assert_eq!(next(&mut rx).await["object"]["metadata"]["name"], "b");
        let bookmark = next(&mut rx).await;
        assert_eq!(bookmark["type"], "BOOKMARK");
        assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], "2");
        assert_eq!(
            bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bookmarks_carry_the_last_version_examined() {
        let store = Arc::new(Store::open(None, 100).unwrap());
        let mut rx = spawn(&store, request(Start::After(0)));
        create(&store, "other", "x");
        let bookmark = next(&mut rx).await;
        assert_eq!(bookmark["type"], "BOOKMARK");
        assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], "1");
    }

    #[tokio::test]
    async fn a_watch_from_expired_history_gets_a_410_event() {
        let store = Arc::new(Store::open(None, 2).unwrap());
        for name in ["a", "b", "c", "d"] {
            create(&store, "ns", name);
        }
        let mut rx = spawn(&store, request(Start::After(1)));
        let event = next(&mut rx).await;
        assert_eq!(event["type"], "ERROR");
        assert_eq!(event["object"]["code"], 410);
        assert_eq!(event["object"]["reason"], "Expired");
    }

    #[tokio::test]
    async fn the_stream_ends_at_shutdown() {
        let store = Arc::new(Store::open(None, 100).unwrap());
        let watch = request(Start::After(0));
        let shutdown = watch.shutdown.clone();
        let mut rx = spawn(&store, watch);
        shutdown.cancel();
        let end = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        assert_eq!(end.expect("the stream ends"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_stream_ends_at_the_timeout() {
        let store = Arc::new(Store::open(None, 100).unwrap());
        let mut watch = request(Start::After(0));
        watch.timeout = Duration::from_secs(3);
        watch.bookmarks = false;
        let mut rx = spawn(&store, watch);
        assert!(rx.recv().await.is_none());
    }
}
