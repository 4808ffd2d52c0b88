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
    /// a bootstrap token (`system:bootstrap:<token-id>` in `system:bootstrappers`) and the node
    /// itself. Its groups are checked too: a service account
    /// (`system:serviceaccount:NS:NAME`, OpenShift's node-bootstrapper) must carry exactly
    /// `system:serviceaccounts`, `system:serviceaccounts:NS` and `system:authenticated`; any
    /// other username exactly the `--bootstrap-group`s and `system:authenticated`.
    #[arg(long, value_name = "USERNAME")]
    pub bootstrap_user: Vec<String>,
    /// The groups (repeatable) a `--bootstrap-user` that is not a service account must carry,
    /// exactly (`system:authenticated` is added); required with such a user.
    #[arg(long, value_name = "GROUP")]
    pub bootstrap_group: Vec<String>,
    /// Approve only CSRs created after the kubelet's certificate on disk expired less this margin
    /// (the kubelet's, the apiserver's and this node's clocks may disagree this much) [default:
    /// 5m].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub clock_skew_margin: Option<Duration>,
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
    /// An empty or invalid `--node-name`, an empty `--bootstrap-user` or `--bootstrap-group`, a
    /// user that is not a service account without `--bootstrap-group` (or groups with none), a
    /// relative path.
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
        if self.bootstrap_group.iter().any(|g| g.trim().is_empty()) {
            return Err(ConfigError("--bootstrap-group is empty".to_owned()));
        }
        let bootstrap_users = self.bootstrap_users()?;
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
                bootstrap_users,
                clock_skew: self
                    .clock_skew_margin
                    .map_or(crate::approve::CLOCK_SKEW, |margin| {
                        i64::try_from(margin.as_secs()).unwrap_or(i64::MAX)
                    }),
            },
            kubelet_client_cert: self.kubelet_client_cert.clone(),
            recheck_interval: self.recheck_interval.max(Duration::from_secs(1)),
            metrics_listen: self.metrics_listen,
        })
    }
}

impl ApproveKubeletCsrArgs {
    /// Each `--bootstrap-user` with the groups its CSRs must carry.
    fn bootstrap_users(&self) -> Result<Vec<crate::approve::BootstrapUser>, ConfigError> {
        let is_account = |u: &str| u.starts_with("system:serviceaccount:");
        if !self.bootstrap_group.is_empty() && self.bootstrap_user.iter().all(|u| is_account(u)) {
            return Err(ConfigError(
                "--bootstrap-group names the groups of a --bootstrap-user that is not a service account; there is none (a service account's groups are fixed)".to_owned(),
            ));
        }
        self.bootstrap_user
            .iter()
            .map(|user| {
                let groups = if is_account(user) {
                    &[][..]
                } else {
                    &self.bootstrap_group[..]
                };
                crate::approve::BootstrapUser::new(user, groups).ok_or_else(|| {
                    ConfigError(if is_account(user) {
                        format!("--bootstrap-user {user:?} is not system:serviceaccount:NAMESPACE:NAME")
                    } else {
                        format!(
                            "--bootstrap-user {user:?} is not a service account: name the groups its CSRs carry with --bootstrap-group"
                        )
                    })
                })
            })
            .collect()
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
        assert!(settings.policy.bootstrap_users.is_empty());
        assert_eq!(settings.policy.clock_skew, 300);
        assert_eq!(
            settings.kubelet_client_cert,
            std::path::Path::new("/var/lib/kubelet/pki/kubelet-client-current.pem")
        );
    }

    #[test]
    fn a_bootstrap_user_comes_with_its_groups() {
        let settings = |more: &[&str]| {
            let mut argv = vec!["--node-name", "master-0"];
            argv.extend_from_slice(more);
            let cli = parse(&argv).unwrap();
            let Command::ApproveKubeletCsr(args) = &cli.command else {
                unreachable!()
            };
            args.settings()
        };
        let groups = |argv: &[&str]| -> Vec<String> {
            let users = settings(argv).unwrap().policy.bootstrap_users;
            users[0].groups.iter().cloned().collect()
        };
        let account = "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper";
        assert_eq!(
            groups(&["--bootstrap-user", account]),
            [
                "system:authenticated",
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-machine-config-operator"
            ]
        );
        assert_eq!(
            groups(&[
                "--bootstrap-user",
                "kubelet-bootstrap",
                "--bootstrap-group",
                "system:bootstrappers",
            ]),
            ["system:authenticated", "system:bootstrappers"]
        );
        for bad in [
            &["--bootstrap-user", "kubelet-bootstrap"][..],
            &["--bootstrap-user", account, "--bootstrap-group", "x"],
            &["--bootstrap-user", "system:serviceaccount:nonamespace"],
            &["--bootstrap-group", ""],
        ] {
            let err = settings(bad).expect_err("refused");
            assert!(err.0.contains("--bootstrap-"), "{bad:?}: {}", err.0);
        }
    }
}
