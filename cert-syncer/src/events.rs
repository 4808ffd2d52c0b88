//! Kubernetes Events about what the sync changed, on the pod (`POD_NAME`) or, for node mode, on
//! the Node (`NODE_NAME`), rate-limited so a flapping object cannot flood the apiserver.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};

/// At most one event per reason and object in this window.
const WINDOW: Duration = Duration::from_secs(10);

/// Publishes core/v1 Events on the pod (or the Node).
pub struct EventRecorder {
    api: Api<Event>,
    involved: Option<ObjectReference>,
    last: Mutex<HashMap<(String, String), Instant>>,
}

impl EventRecorder {
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
            last: Mutex::new(HashMap::new()),
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
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Records `reason` about `object` (e.g. `secret/serving-cert`); `warning` marks failures.
    /// Failures to publish are logged, never fatal.
    pub async fn record(&self, reason: &str, object: &str, message: String, warning: bool) {
        let Some(involved) = &self.involved else {
            return;
        };
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let key = (reason.to_owned(), object.to_owned());
            if last.get(&key).is_some_and(|at| at.elapsed() < WINDOW) {
                tracing::debug!(reason, object, "event rate-limited");
                return;
            }
            last.insert(key, Instant::now());
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
            tracing::warn!(reason, object, error = %err, "cannot publish event");
        }
    }
}
