//! Flags of `cert-syncer restart-on-change` (kept apart from the other subcommands' flags).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::connection_args::ConnectionArgs;
use crate::base::error::ConfigError;
use crate::base::time::parse_duration;
use crate::restart::{Pair, Settings, Target};

/// Servers that reload their certificate files themselves: restarting one only takes it away.
const RELOADING_SERVERS: &[&str] = &["kube-apiserver"];

/// Flags of `cert-syncer restart-on-change`.
#[derive(Debug, Args)]
pub struct RestartOnChangeArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// A container of this pod to restart, and the executable its process runs: NAME=EXECUTABLE,
    /// NAME its name in the pod (for Events and metrics), EXECUTABLE the absolute path of its
    /// `command` (the process's `argv[0]`). Repeatable. The pod needs `shareProcessNamespace: true`
    /// and this sidecar the container's user. kube-apiserver is refused: it reloads its files.
    #[arg(long = "container", value_name = "NAME=EXECUTABLE", required = true)]
    pub containers: Vec<String>,
    /// A certificate and key that container NAME reads only at start (a kubeconfig's client
    /// certificate): NAME=CERT,KEY, absolute paths as this sidecar sees them (one path twice for
    /// a file that holds both). Repeatable; every container needs one. When the bytes change,
    /// were written after the container's process started, and every pair of the container
    /// parses, its key fits and it is valid now, the process gets SIGTERM and the kubelet starts
    /// the container again.
    #[arg(long = "pair", value_name = "NAME=CERT,KEY", required = true)]
    pub pairs: Vec<String>,
    /// At most this many restarts of one container within --restart-window; a further restart
    /// waits (an Event, `cert_syncer_container_restarts_held_total{reason="brake"}`) and then
    /// happens for the newest pair.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_restarts: u32,
    /// The window of --max-restarts.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub restart_window: Duration,
    /// Look at the files and processes this often besides inotify's wake-ups (a safety net).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub recheck_interval: Duration,
    /// How often the servers re-read their pairs themselves (client-go's 5m for
    /// kube-controller-manager and kube-scheduler); 0: only at start. A server that re-reads is
    /// restarted only when what it runs with is unusable (expired, unfit, unknown) before its
    /// next re-read (+1m); otherwise it takes the new pair itself and keeps its leader Lease.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub reload_period: Duration,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Name of this pod, for Kubernetes Events (downward API).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of this pod, for Kubernetes Events (downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
}

impl RestartOnChangeArgs {
    /// The job's settings.
    ///
    /// # Errors
    /// A container name that is not a DNS label or appears twice, a relative executable or
    /// path, kube-apiserver as a target, a pair of an unknown container, a container without a
    /// pair.
    pub(crate) fn settings(&self) -> Result<Settings, ConfigError> {
        let mut targets: Vec<Target> = Vec::new();
        for spec in &self.containers {
            let target = container(spec)?;
            if targets.iter().any(|t| t.container == target.container) {
                return Err(ConfigError(format!(
                    "--container {}: named twice",
                    target.container
                )));
            }
            targets.push(target);
        }
        for spec in &self.pairs {
            let (name, pair) = pair(spec)?;
            let target = targets
                .iter_mut()
                .find(|t| t.container == name)
                .ok_or_else(|| {
                    ConfigError(format!(
                        "--pair {spec}: no --container {name} (name the container first)"
                    ))
                })?;
            target.pairs.push(pair);
        }
        if let Some(bare) = targets.iter().find(|t| t.pairs.is_empty()) {
            return Err(ConfigError(format!(
                "--container {}: no --pair {}=CERT,KEY names a file it reads",
                bare.container, bare.container
            )));
        }
        Ok(Settings {
            connection: self.connection.settings(),
            targets,
            max_restarts: self.max_restarts as usize,
            restart_window: self.restart_window,
            recheck_interval: self.recheck_interval.max(Duration::from_secs(1)),
            reload_period: (!self.reload_period.is_zero()).then_some(self.reload_period),
            metrics_listen: self.metrics_listen,
            pod_name: self.pod_name.clone().filter(|n| !n.is_empty()),
            pod_namespace: self.pod_namespace.clone().filter(|n| !n.is_empty()),
        })
    }
}

/// `NAME=EXECUTABLE`.
fn container(spec: &str) -> Result<Target, ConfigError> {
    let bad = |why: &str| ConfigError(format!("--container {spec}: {why}"));
    let (name, executable) = spec
        .split_once('=')
        .ok_or_else(|| bad("not NAME=EXECUTABLE"))?;
    if !crate::base::names::is_dns_label(name) {
        return Err(bad("NAME is not a container name (a DNS label)"));
    }
    let executable = PathBuf::from(executable);
    if !executable.is_absolute() {
        return Err(bad("EXECUTABLE is not an absolute path"));
    }
    let file_name = executable.file_name().and_then(|f| f.to_str());
    if let Some(server) = file_name.filter(|f| RELOADING_SERVERS.contains(f)) {
        return Err(bad(&format!(
            "{server} reloads its certificate files itself and is never restarted"
        )));
    }
    Ok(Target {
        container: name.to_owned(),
        executable,
        pairs: Vec::new(),
    })
}

/// `NAME=CERT,KEY`.
fn pair(spec: &str) -> Result<(String, Pair), ConfigError> {
    let bad = |why: &str| ConfigError(format!("--pair {spec}: {why}"));
    let (name, files) = spec
        .split_once('=')
        .ok_or_else(|| bad("not NAME=CERT,KEY"))?;
    let (cert, key) = files
        .split_once(',')
        .ok_or_else(|| bad("not NAME=CERT,KEY"))?;
    let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
    if !cert.is_absolute() || !key.is_absolute() {
        return Err(bad("CERT and KEY must be absolute paths"));
    }
    Ok((name.to_owned(), Pair { cert, key }))
}

#[cfg(test)]
mod tests {
    use crate::app::cli::{Cli, Command};
    use clap::Parser;

    fn settings(more: &[&str]) -> Result<crate::restart::Settings, String> {
        let mut argv = vec![
            "cert-syncer",
            "restart-on-change",
            "--server",
            "https://127.0.0.1:6443",
        ];
        argv.extend_from_slice(more);
        let cli = Cli::try_parse_from(argv).map_err(|err| err.to_string())?;
        let Command::RestartOnChange(args) = &cli.command else {
            unreachable!()
        };
        args.settings().map_err(|err| err.0)
    }

    const KCM: &str = "kube-controller-manager=/usr/local/bin/kube-controller-manager";
    const PAIR: &str = "kube-controller-manager=/certs/tls.crt,/certs/tls.key";

    #[test]
    fn a_container_and_its_pairs_make_a_target() {
        let settings = settings(&["--container", KCM, "--pair", PAIR]).unwrap();
        assert_eq!(settings.targets.len(), 1);
        let target = &settings.targets[0];
        assert_eq!(target.container, "kube-controller-manager");
        assert_eq!(
            target.executable,
            std::path::Path::new("/usr/local/bin/kube-controller-manager")
        );
        assert_eq!(target.pairs[0].key, std::path::Path::new("/certs/tls.key"));
        assert_eq!(
            (settings.max_restarts, settings.restart_window.as_secs()),
            (3, 600)
        );
    }

    #[test]
    fn kube_apiserver_is_never_a_target() {
        let err = settings(&[
            "--container",
            "kube-apiserver=/usr/local/bin/kube-apiserver",
            "--pair",
            "kube-apiserver=/c/tls.crt,/c/tls.key",
        ])
        .unwrap_err();
        assert!(
            err.contains("reloads its certificate files itself"),
            "{err}"
        );
    }

    #[test]
    fn every_pair_names_a_container_and_every_container_has_a_pair() {
        for (args, wanted) in [
            (vec!["--container", KCM], "required"),
            (vec!["--pair", PAIR], "required"),
            (
                vec!["--container", KCM, "--pair", "other=/c/tls.crt,/c/tls.key"],
                "no --container other",
            ),
            (
                vec![
                    "--container",
                    KCM,
                    "--container",
                    "s=/bin/s",
                    "--pair",
                    PAIR,
                ],
                "--container s: no --pair",
            ),
            (
                vec!["--container", KCM, "--container", KCM, "--pair", PAIR],
                "twice",
            ),
            (
                vec!["--container", "Bad_Name=/bin/x", "--pair", PAIR],
                "DNS label",
            ),
            (vec!["--container", "x=bin/x", "--pair", PAIR], "absolute"),
            (
                vec![
                    "--container",
                    KCM,
                    "--pair",
                    "kube-controller-manager=c.crt,/k",
                ],
                "absolute",
            ),
            (
                vec![
                    "--container",
                    KCM,
                    "--pair",
                    "kube-controller-manager=/c.crt",
                ],
                "NAME=CERT,KEY",
            ),
        ] {
            let err = settings(&args).unwrap_err();
            assert!(err.contains(wanted), "{args:?}: {err}");
        }
    }
}
