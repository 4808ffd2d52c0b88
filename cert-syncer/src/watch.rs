//! kube-runtime's `watch_object` with a watch timeout: every watch asks the server to end it
//! after `timeoutSeconds` (below the connection's read idle timeout, see
//! [`crate::connection::Settings::watch_timeout_seconds`]), so a quiet watch ends cleanly and is
//! resumed from its resourceVersion instead of being cut as a dead connection.

use std::fmt::Debug;

use futures::{Stream, StreamExt, future};
use kube::Api;
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
