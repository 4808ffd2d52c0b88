//! Kubernetes Events about what the sync changed, on the pod (`POD_NAME`) or, for node mode, on
//! the Node (`NODE_NAME`), rate-limited so a flapping object cannot flood the apiserver.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};

/// At most one event per reason and object in this window.
const WINDOW: Duration = Duration::from_secs(10);

/// Publishes core/v1 Events on the pod (or the Node).
pub struct EventRecorder {
    api: Api<Event>,
    involved: Option<ObjectReference>,
    limit: RateLimit,
}

/// At most one event per (reason, object) per window, on tokio's clock.
#[derive(Debug)]
struct RateLimit {
    window: Duration,
    last: Mutex<HashMap<(String, String), Instant>>,
}

impl RateLimit {
    fn new(window: Duration) -> RateLimit {
        RateLimit {
            window,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an event about `object` for `reason` may go out now (and if so, remembers it).
    fn allow(&self, reason: &str, object: &str) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        // Forget what is past its window, so a long run does not keep every object ever seen.
        last.retain(|_, at| now.duration_since(*at) < self.window);
        let key = (reason.to_owned(), object.to_owned());
        if last.contains_key(&key) {
            return false;
        }
        last.insert(key, now);
        true
    }
}

/// Where a job's Events go: chosen by the job's settings, built once by the app shell's start-up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EventsOn<'a> {
    /// The job records no Events.
    Nothing,
    /// On the pod `pod_name` in `namespace` (none when the pod's name is not known).
    Pod {
        namespace: &'a str,
        pod_name: Option<&'a str>,
    },
    /// On the Node `node_name` (none when the node's name is not known).
    Node { node_name: Option<&'a str> },
}

impl EventRecorder {
    /// The recorder for `on`; one that records nothing for [`EventsOn::Nothing`].
    pub(crate) fn on(client: kube::Client, on: EventsOn<'_>) -> EventRecorder {
        match on {
            EventsOn::Nothing => EventRecorder::new(client, "default", None),
            EventsOn::Pod {
                namespace,
                pod_name,
            } => EventRecorder::new(client, namespace, pod_name),
            EventsOn::Node { node_name } => EventRecorder::for_node(client, node_name),
        }
    }

    pub fn new(client: kube::Client, namespace: &str, pod_name: Option<&str>) -> EventRecorder {
        EventRecorder {
            api: Api::namespaced(client, namespace),
            involved: pod_name.map(|name| ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectReference::default()
            }),
            limit: RateLimit::new(WINDOW),
        }
    }

    /// Events on the Node `node_name` (in namespace `default`, with the node name as uid, as
    /// the kubelet records them, so `kubectl describe node` shows them).
    pub fn for_node(client: kube::Client, node_name: Option<&str>) -> EventRecorder {
        EventRecorder {
            api: Api::namespaced(client, "default"),
            involved: node_name.map(|name| ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(name.to_owned()),
                uid: Some(name.to_owned()),
                ..ObjectReference::default()
            }),
            limit: RateLimit::new(WINDOW),
        }
    }

    /// Records `reason` about `object` (e.g. `secret/serving-cert`); `warning` marks failures.
    /// Failures to publish are logged, never fatal.
    pub async fn record(&self, reason: &str, object: &str, message: String, warning: bool) {
        let Some(involved) = &self.involved else {
            return;
        };
        if !self.limit.allow(reason, object) {
            tracing::debug!(reason, object, "event rate-limited");
            return;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some("cert-syncer-".to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: involved.clone(),
            reason: Some(reason.to_owned()),
            message: Some(message),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            source: Some(EventSource {
                component: Some("cert-syncer".to_owned()),
                host: None,
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            reporting_component: Some("cert-syncer".to_owned()),
            reporting_instance: involved.name.clone(),
            ..Event::default()
        };
        if let Err(err) = self.api.create(&PostParams::default(), &event).await {
            tracing::warn!(reason, object, error = %crate::base::error::chain(&err), "cannot publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_event_per_reason_and_object_per_window() {
        let limit = RateLimit::new(WINDOW);
        assert!(limit.allow("CertificateUpdated", "secret/a"));
        assert!(!limit.allow("CertificateUpdated", "secret/a"));
        // Another object or another reason has its own window.
        assert!(limit.allow("CertificateUpdated", "secret/b"));
        assert!(limit.allow("CertificateUpdateFailed", "secret/a"));
        tokio::time::advance(WINDOW - Duration::from_millis(1)).await;
        assert!(!limit.allow("CertificateUpdated", "secret/a"));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(limit.allow("CertificateUpdated", "secret/a"));
        assert!(!limit.allow("CertificateUpdated", "secret/a"));
        // Entries past their window are forgotten.
        tokio::time::advance(WINDOW).await;
        assert!(limit.allow("x", "y"));
        assert_eq!(limit.last.lock().unwrap().len(), 1);
    }
}
