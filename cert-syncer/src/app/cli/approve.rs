//! Flags of `cert-syncer approve-kubelet-csr` (kept apart from the other subcommands' flags).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::connection_args::ConnectionArgs;
use crate::base::error::ConfigError;
use crate::base::time::parse_duration;

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
        if !crate::base::names::is_dns_subdomain(&self.node_name) {
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

#[cfg(test)]
mod tests {
    use crate::app::cli::{Cli, Command};
    use clap::Parser;

    fn parse(more: &[&str]) -> Result<Cli, clap::Error> {
        let mut argv = vec![
            "cert-syncer",
            "approve-kubelet-csr",
            "--server",
            "https://127.0.0.1:6443",
        ];
        argv.extend_from_slice(more);
        Cli::try_parse_from(argv)
    }

    #[test]
    fn the_node_name_is_required_and_must_be_a_node_name() {
        if std::env::var_os("NODE_NAME").is_none() {
            assert!(parse(&[]).is_err(), "--node-name has no default");
        }
        for bad in ["", "Master_0", "a/b"] {
            let cli = parse(&["--node-name", bad]).unwrap();
            let err = cli.command.job().err().expect("refused");
            assert!(err.0.contains("--node-name"), "{bad:?}: {}", err.0);
        }
        let cli = parse(&[
            "--node-name",
            "master-0",
            "--kubelet-client-cert",
            "rel.pem",
        ])
        .unwrap();
        assert!(cli.command.job().is_err(), "a relative certificate path");
        let cli = parse(&["--node-name", "master-0"]).unwrap();
        let Command::ApproveKubeletCsr(args) = &cli.command else {
            unreachable!()
        };
        let settings = args.settings().unwrap();
        assert_eq!(settings.policy.node_name, "master-0");
        assert_eq!(
            settings.kubelet_client_cert,
            std::path::Path::new("/var/lib/kubelet/pki/kubelet-client-current.pem")
        );
    }
}
