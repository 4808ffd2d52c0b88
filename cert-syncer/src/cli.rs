//! Command-line flags. Each flag's doc comment is its help text.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Keeps a static pod's certificates on disk in step with the apiserver.
#[derive(Debug, Parser)]
#[command(name = "cert-syncer", version)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// Log output formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The jobs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mirror named Secrets and ConfigMaps of one namespace into a directory.
    Sync(SyncArgs),
    /// Regenerate signers, CA bundles and certificates declared in a config file, by default
    /// only when they are expired or missing.
    Regenerate(RegenerateArgs),
    /// List every certificate in directories or in a namespace's Secrets and ConfigMaps, with
    /// its validity, key match and chain; exit 1 when anything is expired, mismatched, does not
    /// chain or cannot be read.
    Inspect(InspectArgs),
}

/// How to reach the apiserver (kubeconfig, or explicit flags).
#[derive(Debug, Args, Clone)]
pub struct ConnectionArgs {
    /// kubeconfig file (its current context). Without it, --server or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Apiserver URL, e.g. https://127.0.0.1:6443 (instead of a kubeconfig).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub server: Option<String>,
    /// CA bundle that the apiserver's certificate must chain to (with --server).
    #[arg(long, requires = "server")]
    pub ca_file: Option<PathBuf>,
    /// File holding the bearer token (with --server); re-read when it changes.
    #[arg(long, requires = "server")]
    pub token_file: Option<PathBuf>,
    /// TLS server name (SNI and verification) to use instead of the URL's host, e.g.
    /// `localhost-recovery`.
    #[arg(long)]
    pub tls_server_name_override: Option<String>,
    /// INSECURE: allow an `http://` server (no TLS: anyone on the path reads and forges every
    /// object). Without it a non-`https` server is refused. Even with it no credential is ever
    /// sent in clear text: a token file, a kubeconfig token or client certificate, or a CA file
    /// together with an `http://` server is refused.
    #[arg(long)]
    pub insecure_plain_http: bool,
    /// Give up on a connection attempt (TCP connect and TLS handshake) after this long.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
    /// Give up on a request when the server sends nothing for this long (headers or body).
    /// Watches ask the server to end them after two thirds of it, so an idle watch is never
    /// cut by this timeout.
    #[arg(long, value_parser = parse_duration, default_value = "90s")]
    pub read_idle_timeout: Duration,
}

impl ConnectionArgs {
    /// `timeoutSeconds` for watches: two thirds of `--read-idle-timeout` (at least 1 s), so a
    /// quiet watch ends cleanly (and is resumed) before the idle timeout would cut it.
    pub fn watch_timeout_seconds(&self) -> u32 {
        let seconds = self.read_idle_timeout.as_secs() * 2 / 3;
        seconds.clamp(1, 3600) as u32
    }
}

/// Flags of `cert-syncer sync`.
#[derive(Debug, Args)]
pub struct SyncArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Namespace of the objects.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Directory to write into: `<dir>/secrets/<name>/<key>`, `<dir>/configmaps/<name>/<key>`.
    #[arg(long)]
    pub destination_dir: PathBuf,
    /// Required Secrets (comma-separated). While one is absent, files are kept and /readyz fails.
    #[arg(long, value_delimiter = ',')]
    pub secrets: Vec<String>,
    /// Optional Secrets (comma-separated). When one is deleted, its directory is removed.
    #[arg(long, value_delimiter = ',')]
    pub optional_secrets: Vec<String>,
    /// Required ConfigMaps (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub configmaps: Vec<String>,
    /// Optional ConfigMaps (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub optional_configmaps: Vec<String>,
    /// Also write one key of one object to a host file: KIND/NAME/KEY=PATH, KIND being `secret`
    /// or `configmap` (repeatable). The content must be PEM certificates; the file is replaced
    /// atomically.
    #[arg(long = "file", value_name = "KIND/NAME/KEY=PATH")]
    pub files: Vec<String>,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Name of this pod, for Kubernetes Events (downward API).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Exit non-zero after the apiserver has refused our credentials (401/403) this long, so the
    /// kubelet restarts the container.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub auth_failure_exit_after: Duration,
    /// A kind (Secrets, ConfigMaps) with more named objects than this is followed with one
    /// namespace-wide list+watch, filtered here to the named objects, instead of one watch
    /// connection per object. That needs `list` and `watch` on the whole kind in the namespace
    /// (RBAC without resourceNames). 0: always namespace-wide.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub namespace_watch_threshold: usize,
    /// At most this many objects are written, removed or confirmed at once; the others wait
    /// their turn (a large first sync does not start hundreds of writes and fsyncs together).
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub write_parallelism: u32,
}

/// Flags of `cert-syncer regenerate`.
#[derive(Debug, Args)]
pub struct RegenerateArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The rotation config (YAML): signers, bundles, targets.
    #[arg(long, required_unless_present = "profile", conflicts_with = "profile")]
    pub config: Option<PathBuf>,
    /// A built-in set instead of --config: `openshift-kube-apiserver` is what OpenShift's
    /// cert-regeneration-controller manages for the kube-apiserver.
    #[arg(long, value_enum)]
    pub profile: Option<crate::regenerate::Profile>,
    /// Type of newly generated keys (overrides the config's `key-type`; default rsa-2048).
    #[arg(long, value_enum)]
    pub key_type: Option<crate::regenerate::KeyType>,
    /// With --profile: the service network's first IP, when the cluster has no
    /// networks.config.openshift.io/cluster (refused if it disagrees with that object).
    #[arg(long, requires = "profile")]
    pub service_network_ip: Option<std::net::IpAddr>,
    /// With --profile: the external API load balancer's hostname, when the cluster has no
    /// infrastructures.config.openshift.io/cluster (refused if it disagrees).
    #[arg(long, requires = "profile")]
    pub api_hostname: Option<String>,
    /// With --profile: the internal API load balancer's hostname (as --api-hostname).
    #[arg(long, requires = "profile")]
    pub api_int_hostname: Option<String>,
    /// `expired-only` acts only on expired or missing material (the recovery controller);
    /// `rotate` also rotates past 80 % of the lifetime or the refresh period.
    #[arg(long, value_enum, default_value_t = crate::regenerate::Mode::ExpiredOnly)]
    pub mode: crate::regenerate::Mode,
    /// Run one pass and exit: 0 when everything is valid or was regenerated, 1 when anything
    /// failed (including broken config items).
    #[arg(long)]
    pub once: bool,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Name of this pod, for Kubernetes Events (downward API).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of this pod, for Kubernetes Events (downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Run passes only while holding a coordination.k8s.io Lease, so one replica acts and logs
    /// (the others wait). Off by default: optimistic concurrency already makes replicas safe.
    #[arg(long)]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "cert-regeneration-controller-lock")]
    pub leader_elect_lease_name: String,
    /// Namespace of the Lease (default: POD_NAMESPACE, else `default`).
    #[arg(long)]
    pub leader_elect_namespace: Option<String>,
    /// How long a Lease is honoured without renewal before a standby takes over.
    #[arg(long, value_parser = parse_duration, default_value = "137s")]
    pub leader_elect_lease_duration: Duration,
    /// The leader gives up (and exits 1) when it could not renew for this long.
    #[arg(long, value_parser = parse_duration, default_value = "107s")]
    pub leader_elect_renew_deadline: Duration,
    /// How often to renew, or to retry acquiring.
    #[arg(long, value_parser = parse_duration, default_value = "26s")]
    pub leader_elect_retry_period: Duration,
    /// Evaluate as if the time were this (RFC 3339 or Unix seconds). For drills and tests of
    /// the clock-skew guard; never set in production.
    #[arg(long, hide = true)]
    pub now: Option<String>,
}

/// Flags of `cert-syncer inspect`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").args(["dir", "namespace"]).required(true).multiple(true)))]
pub struct InspectArgs {
    /// Directory to inspect, recursively (repeatable): a resource directory written by `sync`
    /// (read through each object's current `..data` generation) or plain PEM files (`X.crt` with
    /// `X.key`, `ca-bundle.crt`).
    #[arg(long, value_name = "DIR")]
    pub dir: Vec<PathBuf>,
    /// Inspect every Secret and ConfigMap of this namespace through the API (connection flags
    /// as for `sync`).
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// CA bundle that every certificate must chain to (repeatable). Without it, a certificate
    /// must chain to a CA bundle in its own directory or object if there is one, and is
    /// otherwise looked up in every bundle found.
    #[arg(long, value_name = "FILE")]
    pub ca_bundle: Vec<PathBuf>,
    /// Mark certificates that expire within this as `expiring` (a warning: the exit code stays
    /// 0). `30s`, `5m`, `12h`, `7d`.
    #[arg(long, value_parser = parse_duration, default_value = "7d")]
    pub warn_within: Duration,
    /// Print a JSON array (one object per certificate or unreadable file) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Evaluate as if the time were this (RFC 3339 or Unix seconds). For tests and drills.
    #[arg(long, hide = true)]
    pub now: Option<String>,
}

/// A configuration error: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// `250ms`, `30s`, `5m`, `1h`, `7d` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Some(millis) = text.strip_suffix("ms") {
        return millis
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration {text:?}"));
    }
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let unit_seconds: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "invalid duration unit in {text:?} (use s, m, h or d)"
            ));
        }
    };
    value
        .checked_mul(unit_seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("duration {text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
