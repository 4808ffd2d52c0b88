//! `GET /metrics` (Prometheus text, any authenticated user): how clients use the server, so
//! tests and load tools can check it from outside.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `mini_apiserver_watches_open` | `resource` | watch streams open now |
//! | `mini_apiserver_requests_total` | `verb`, `resource` | object requests by verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::resource::Resource;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    resource: &'static str,
}

/// The server's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    watches: Family<ResourceLabels, Gauge>,
    requests: Family<RequestLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::default();
        let watches = Family::<ResourceLabels, Gauge>::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "mini_apiserver_watches_open",
            "Watch streams open now",
            watches.clone(),
        );
        registry.register(
            "mini_apiserver_requests",
            "Object requests by verb and resource",
            requests.clone(),
        );
        Metrics {
            registry,
            watches,
            requests,
        }
    }
}

impl Metrics {
    /// Counts one request.
    pub fn request(&self, verb: &'static str, resource: Resource) {
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                resource: resource.plural(),
            })
            .inc();
    }

    /// Counts a watch stream as open until the guard is dropped.
    pub fn watch_opened(&self, resource: Resource) -> WatchGuard {
        let gauge = self
            .watches
            .get_or_create(&ResourceLabels {
                resource: resource.plural(),
            })
            .clone();
        gauge.inc();
        WatchGuard { gauge }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// Holds one watch in `mini_apiserver_watches_open`.
#[derive(Debug)]
pub struct WatchGuard {
    gauge: Gauge,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_watches_are_counted_until_their_guard_drops() {
        let metrics = Metrics::default();
        let first = metrics.watch_opened(Resource::Secrets);
        let second = metrics.watch_opened(Resource::Secrets);
        metrics.request("list", Resource::Secrets);
        let text = metrics.encode();
        assert!(
            text.contains("mini_apiserver_watches_open{resource=\"secrets\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("mini_apiserver_requests_total{verb=\"list\",resource=\"secrets\"} 1"),
            "{text}"
        );
        drop((first, second));
        assert!(
            metrics
                .encode()
                .contains("mini_apiserver_watches_open{resource=\"secrets\"} 0")
        );
    }
}
