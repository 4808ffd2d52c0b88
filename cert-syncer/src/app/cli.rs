//! Command-line flags. Each flag's doc comment is its help text.
//!
//! This is the only module that knows clap: each subcommand's flags are turned into the plain
//! settings its job runs with (`Command::job`), validated on the way (names, durations,
//! `--file` mappings, `--now`), so the jobs never see a flag type and a bad flag is a
//! [`ConfigError`] (exit code 2) before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::base::error::ConfigError;
use crate::base::time::{parse_duration, parse_now};
use crate::{inspect, regenerate, sync};

mod approve;
mod connection_args;
mod node;
mod restart;
pub use approve::ApproveKubeletCsrArgs;
pub use connection_args::ConnectionArgs;
pub use node::{NodeArgs, NodePreset};
pub use restart::RestartOnChangeArgs;

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
    /// Keep one host file (a CA bundle such as the kubelet's `kubelet-ca.crt`) assembled from
    /// keys of ConfigMaps and Secrets, on every node (a DaemonSet).
    Node(NodeArgs),
    /// Opt-in, one per node: approve this node's kubelet client CSRs (signer
    /// kubernetes.io/kube-apiserver-client-kubelet, subject exactly CN=system:node:NODE,
    /// O=system:nodes, the kubelet's usages, from the bootstrap identity or the node) only while
    /// the kubelet's client certificate on disk is expired or absent; leave anything else alone.
    ApproveKubeletCsr(ApproveKubeletCsrArgs),
    /// Opt-in, a sidecar in a pod with `shareProcessNamespace: true`: restart (SIGTERM) a
    /// container of the pod whose server reads its client certificate only at start, when that
    /// certificate changes on disk to a valid pair; never kube-apiserver, never into a broken
    /// pair, at most --max-restarts per --restart-window.
    RestartOnChange(RestartOnChangeArgs),
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
    /// or `configmap` (repeatable). The content must be PEM certificates and nothing else (a
    /// private key or any other block is refused, the file kept); the file is replaced
    /// atomically, 0644.
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
    /// Every this long, check each object's files on disk against the last state seen from the
    /// apiserver and rewrite what was changed or removed behind our back (from memory: no API
    /// request; logged and counted in `cert_syncer_resync_repairs_total`). 0 turns it off.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub resync_interval: Duration,
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
    /// cert-regeneration-controller manages for the kube-apiserver,
    /// `openshift-kube-controller-manager` what its cert-recovery-controller manages for the
    /// kube-controller-manager (the CSR signer chain), `openshift-kube-scheduler` the copy of
    /// the kube-scheduler's client certificate its recovery controller makes.
    #[arg(long, value_enum)]
    pub profile: Option<RegenerateProfile>,
    /// Type of newly generated keys (overrides the config's `key-type`; default rsa-2048).
    #[arg(long, value_enum)]
    pub key_type: Option<KeyType>,
    /// With --profile: the service network's first IP, when the cluster has no
    /// networks.config.openshift.io/cluster (refused if it disagrees with that object); once
    /// per family on a dual-stack cluster, in the object's order.
    #[arg(long, requires = "profile")]
    pub service_network_ip: Vec<std::net::IpAddr>,
    /// With --profile: the OpenShift release whose lifetimes, refresh periods and metadata
    /// the profile writes (4.14 … 5.0; `docs/openshift.md` has the table).
    #[arg(long, requires = "profile", default_value = crate::regenerate::release::DEFAULT)]
    pub openshift_version: String,
    /// With --profile: the external API load balancer's hostname, when the cluster has no
    /// infrastructures.config.openshift.io/cluster (refused if it disagrees).
    #[arg(long, requires = "profile")]
    pub api_hostname: Option<String>,
    /// With --profile: the internal API load balancer's hostname (as --api-hostname).
    #[arg(long, requires = "profile")]
    pub api_int_hostname: Option<String>,
    /// `expired-only` acts only on expired or missing material (the recovery controller);
    /// `rotate` also rotates past 80 % of the lifetime or the refresh period.
    #[arg(long, value_enum, default_value_t = RegenerateMode::ExpiredOnly)]
    pub mode: RegenerateMode,
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
    /// A kind (Secrets, ConfigMaps) of a namespace with more declared objects than this is
    /// watched with one namespace-wide list+watch (RBAC `list`/`watch` on every object of
    /// that kind there), instead of one list+watch per object by name (RBAC by
    /// resourceNames), as `sync --namespace-watch-threshold`. 0: always namespace-wide.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub namespace_watch_threshold: usize,
    /// Evaluate as if the time were this (RFC 3339 or Unix seconds). For drills and tests of
    /// the clock-skew guard; never set in production.
    #[arg(long, hide = true)]
    pub now: Option<String>,
}

/// `--mode` of `regenerate`: when to act.
/// `--profile`: a built-in rotation set (the job's [`regenerate::Profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RegenerateProfile {
    /// OpenShift's kube-apiserver PKI: the signers, CA bundles and targets the operator's
    /// cert-regeneration-controller manages.
    OpenshiftKubeApiserver,
    /// OpenShift's kube-controller-manager PKI: the CSR signer chain (an intermediate CA and
    /// its delayed publication) and the copies its cert-recovery-controller manages.
    OpenshiftKubeControllerManager,
    /// OpenShift's kube-scheduler: the copy of its client certificate into
    /// `openshift-kube-scheduler` its recovery controller makes.
    OpenshiftKubeScheduler,
}

impl From<RegenerateProfile> for regenerate::Profile {
    fn from(profile: RegenerateProfile) -> regenerate::Profile {
        match profile {
            RegenerateProfile::OpenshiftKubeApiserver => {
                regenerate::Profile::OpenshiftKubeApiserver
            }
            RegenerateProfile::OpenshiftKubeControllerManager => {
                regenerate::Profile::OpenshiftKubeControllerManager
            }
            RegenerateProfile::OpenshiftKubeScheduler => {
                regenerate::Profile::OpenshiftKubeScheduler
            }
        }
    }
}

/// `--key-type`: the algorithm of new keys (`pki::KeyType`, which `regenerate` uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyType {
    /// RSA 2048-bit with SHA-256 (library-go's choice; the default).
    #[value(name = "rsa-2048")]
    Rsa2048,
    /// ECDSA on P-256 with SHA-256.
    #[value(name = "ecdsa-p256")]
    EcdsaP256,
    /// ECDSA P-384 signers, P-256 leaves (library-go's pairing under ConfigurablePKI).
    #[value(name = "ecdsa-p384")]
    EcdsaP384,
}

impl From<KeyType> for crate::pki::KeyType {
    fn from(key_type: KeyType) -> crate::pki::KeyType {
        match key_type {
            KeyType::Rsa2048 => crate::pki::KeyType::Rsa2048,
            KeyType::EcdsaP256 => crate::pki::KeyType::EcdsaP256,
            KeyType::EcdsaP384 => crate::pki::KeyType::EcdsaP384,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RegenerateMode {
    /// Only expired or missing material (and serving hostname or client identity drift, and a
    /// chain that no longer reaches the bundle): never fights the normal rotation operator.
    ExpiredOnly,
    /// Also rotate past 80 % of the lifetime or past notBefore + refresh, as library-go does.
    Rotate,
}

impl From<RegenerateMode> for regenerate::Mode {
    fn from(mode: RegenerateMode) -> regenerate::Mode {
        match mode {
            RegenerateMode::ExpiredOnly => regenerate::Mode::ExpiredOnly,
            RegenerateMode::Rotate => regenerate::Mode::Rotate,
        }
    }
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

/// A subcommand's settings: what its job runs with.
pub(crate) enum Job {
    Sync(sync::Settings),
    Regenerate(regenerate::Settings),
    Inspect(inspect::Settings),
    Node(crate::node::Settings),
    ApproveKubeletCsr(crate::approve::Settings),
    RestartOnChange(crate::restart::Settings),
}

impl Command {
    /// The settings of this subcommand, validated.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag and what is wrong with it.
    pub(crate) fn job(&self) -> Result<Job, ConfigError> {
        Ok(match self {
            Command::Sync(args) => Job::Sync(args.settings()?),
            Command::Regenerate(args) => Job::Regenerate(args.settings()?),
            Command::Inspect(args) => Job::Inspect(args.settings()?),
            Command::Node(args) => Job::Node(args.settings()?),
            Command::ApproveKubeletCsr(args) => Job::ApproveKubeletCsr(args.settings()?),
            Command::RestartOnChange(args) => Job::RestartOnChange(args.settings()?),
        })
    }
}

impl SyncArgs {
    pub(crate) fn settings(&self) -> Result<sync::Settings, ConfigError> {
        let (objects, files) = sync::Settings::objects(&sync::Named {
            secrets: &self.secrets,
            optional_secrets: &self.optional_secrets,
            configmaps: &self.configmaps,
            optional_configmaps: &self.optional_configmaps,
            files: &self.files,
        })?;
        if self.namespace.is_empty() {
            return Err(ConfigError(
                "--namespace (or POD_NAMESPACE) is empty".to_owned(),
            ));
        }
        Ok(sync::Settings {
            connection: self.connection.settings(),
            namespace: self.namespace.clone(),
            destination: self.destination_dir.clone(),
            objects,
            files,
            namespace_watch_threshold: self.namespace_watch_threshold,
            metrics_listen: self.metrics_listen,
            pod_name: self.pod_name.clone(),
            auth_failure_exit_after: self.auth_failure_exit_after,
            write_parallelism: self.write_parallelism as usize,
            resync_interval: self.resync_interval,
        })
    }
}

impl RegenerateArgs {
    pub(crate) fn settings(&self) -> Result<regenerate::Settings, ConfigError> {
        Ok(regenerate::Settings {
            connection: self.connection.settings(),
            config: self.config.clone(),
            profile: self.profile.map(Into::into),
            key_type: self.key_type.map(Into::into),
            service_network_ip: self.service_network_ip.clone(),
            openshift_version: self.openshift_version.clone(),
            api_hostname: self.api_hostname.clone(),
            api_int_hostname: self.api_int_hostname.clone(),
            mode: self.mode.into(),
            once: self.once,
            metrics_listen: self.metrics_listen,
            pod_name: self.pod_name.clone(),
            pod_namespace: self.pod_namespace.clone(),
            leader_elect: self.leader_elect,
            leader_elect_lease_name: self.leader_elect_lease_name.clone(),
            leader_elect_namespace: self.leader_elect_namespace.clone(),
            leader_elect_lease_duration: self.leader_elect_lease_duration,
            leader_elect_renew_deadline: self.leader_elect_renew_deadline,
            leader_elect_retry_period: self.leader_elect_retry_period,
            namespace_watch_threshold: self.namespace_watch_threshold,
            now: self.now.as_deref().map(parse_now).transpose()?,
        })
    }
}

impl InspectArgs {
    pub(crate) fn settings(&self) -> Result<inspect::Settings, ConfigError> {
        Ok(inspect::Settings {
            connection: self.connection.settings(),
            dirs: self.dir.clone(),
            namespace: self.namespace.clone(),
            ca_bundles: self.ca_bundle.clone(),
            warn_within: self.warn_within,
            json: self.json,
            now: self.now.as_deref().map(parse_now).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
