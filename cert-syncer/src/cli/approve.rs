//! Flags of `cert-syncer approve-kubelet-csr` (kept apart from the other subcommands' flags).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::connection_args::ConnectionArgs;
use crate::error::ConfigError;
use crate::time::parse_duration;

/// Flags of `cert-syncer approve-kubelet-csr`.
#[derive(Debug, Args)]
pub struct ApproveKubeletCsrArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// This node's name (required: the only node whose CSRs are approved,
    /// `CN=system:node:NODE`). From the downward API's `spec.nodeName` in a pod.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The kubelet's client certificate on this node; CSRs are approved only while it is
    /// expired or absent (unreadable or not a certificate: nothing is approved).
    #[arg(
        long,
        default_value = "/var/lib/kubelet/pki/kubelet-client-current.pem"
    )]
    pub kubelet_client_cert: PathBuf,
    /// Also accept CSRs created by this username as the bootstrap identity (repeatable), besides
    /// `system:bootstrap:<token-id>` in group `system:bootstrappers` and the node itself.
    #[arg(long, value_name = "USERNAME")]
    pub bootstrap_user: Vec<String>,
    /// Decide about pending CSRs again this often (the kubelet's certificate may expire while a
    /// CSR waits).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub recheck_interval: Duration,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

impl ApproveKubeletCsrArgs {
    /// The approver's settings.
    ///
    /// # Errors
    /// An empty or invalid `--node-name`, an empty `--bootstrap-user`, a relative path.
    pub(crate) fn settings(&self) -> Result<crate::approve::Settings, ConfigError> {
        if !crate::names::is_dns_subdomain(&self.node_name) {
            return Err(ConfigError(format!(
                "--node-name {:?} is not a node name (a DNS subdomain); it is required",
                self.node_name
            )));
        }
        if self.bootstrap_user.iter().any(|u| u.trim().is_empty()) {
            return Err(ConfigError("--bootstrap-user is empty".to_owned()));
        }
        if !self.kubelet_client_cert.is_absolute() {
            return Err(ConfigError(format!(
                "--kubelet-client-cert {} is not absolute",
                self.kubelet_client_cert.display()
            )));
        }
        Ok(crate::approve::Settings {
            connection: self.connection.settings(),
            policy: crate::approve::Policy {
                node_name: self.node_name.clone(),
                bootstrap_users: self.bootstrap_user.clone(),
            },
            kubelet_client_cert: self.kubelet_client_cert.clone(),
            recheck_interval: self.recheck_interval.max(Duration::from_secs(1)),
            metrics_listen: self.metrics_listen,
        })
    }
}
