//! What `regenerate` runs with: plain values, turned from the flags by `cli`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::Mode;

/// The settings of one `regenerate` run (each field is the flag of the same name).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub connection: crate::kube::connection::Settings,
    /// The rotation config file (exactly one of `config` and `profile`).
    pub config: Option<PathBuf>,
    /// A built-in rotation set.
    pub profile: Option<super::Profile>,
    /// The type of new keys, over the config's or profile's.
    pub key_type: Option<crate::pki::KeyType>,
    /// The profile's hostnames when the cluster's config objects do not give them.
    pub service_network_ip: Vec<std::net::IpAddr>,
    /// The OpenShift release the profile models (`release`).
    pub openshift_version: String,
    pub api_hostname: Option<String>,
    pub api_int_hostname: Option<String>,
    pub mode: Mode,
    /// One pass, then exit.
    pub once: bool,
    pub metrics_listen: Option<SocketAddr>,
    /// This pod, for Events and the Lease identity.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// Act only while holding the Lease.
    pub leader_elect: bool,
    pub leader_elect_lease_name: String,
    pub leader_elect_namespace: Option<String>,
    pub leader_elect_lease_duration: Duration,
    pub leader_elect_renew_deadline: Duration,
    pub leader_elect_retry_period: Duration,
    /// A kind of a namespace with more declared objects than this is watched namespace-wide.
    pub namespace_watch_threshold: usize,
    /// Evaluate as if the time were this (Unix seconds): drills and tests only.
    pub now: Option<i64>,
}

impl Settings {
    /// Where Events go: the pod's namespace, else `default`.
    pub(crate) fn events_namespace(&self) -> &str {
        self.pod_namespace.as_deref().unwrap_or("default")
    }

    /// Where the Lease lives: `--leader-elect-namespace`, else the pod's namespace, else
    /// `default`.
    pub(crate) fn lease_namespace(&self) -> &str {
        self.leader_elect_namespace
            .as_deref()
            .or(self.pod_namespace.as_deref())
            .unwrap_or("default")
    }
}
