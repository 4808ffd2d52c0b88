//! `cert-syncer sync` as a process, connected to an apiserver ([`ApiEndpoint`]: mini or real) the way the static pod's
//! sidecar is: `https://127.0.0.1:PORT`, SNI `localhost-recovery`, the recovery CA file and the
//! token file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use crate::backend::ApiEndpoint;
use crate::process::{ChildProcess, bin_path};

pub use crate::backend::NS;

/// A running `cert-syncer sync`; its [`ChildProcess::addr`] is the metrics/health address.
#[derive(Debug)]
pub struct Syncer {
    /// The process (stderr kept for assertions).
    pub process: ChildProcess,
}

/// How to start a syncer: the connection flags point at `api`'s files unless overridden.
#[derive(Debug, Clone)]
pub struct SyncerSpec {
    /// `--server`.
    pub server: String,
    /// `--ca-file`.
    pub ca_file: PathBuf,
    /// `--token-file`.
    pub token_file: PathBuf,
    /// `--destination-dir`.
    pub destination: PathBuf,
    /// Further flags (objects, files, ...).
    pub extra: Vec<String>,
}

impl SyncerSpec {
    /// The recovery connection to `api`, writing into `destination`.
    pub fn new(api: &impl ApiEndpoint, destination: &Path, extra: &[&str]) -> SyncerSpec {
        SyncerSpec {
            server: api.url(),
            ca_file: api.dir().join("recovery-ca.crt"),
            token_file: api.dir().join("token"),
            destination: destination.to_owned(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// The command line.
    pub fn command(&self) -> Command {
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .arg("sync")
            .args(["--server", &self.server])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(&self.ca_file)
            .arg("--token-file")
            .arg(&self.token_file)
            .args(["--namespace", NS, "--metrics-listen", "127.0.0.1:0"])
            .arg("--destination-dir")
            .arg(&self.destination)
            .args(&self.extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            );
        command
    }

    /// Starts it and waits for its metrics listener.
    ///
    /// # Panics
    /// When it does not start (the message has its stderr).
    pub fn start(&self) -> Syncer {
        Syncer {
            process: ChildProcess::start(self.command()),
        }
    }
}

impl Syncer {
    /// Starts a syncer on `api`'s recovery connection.
    ///
    /// # Panics
    /// When it does not start.
    pub fn start(api: &impl ApiEndpoint, destination: &Path, extra: &[&str]) -> Syncer {
        SyncerSpec::new(api, destination, extra).start()
    }

    /// The metrics/health address as `host:port`.
    pub fn metrics_addr(&self) -> String {
        self.process.addr.to_string()
    }

    /// `GET /readyz`: (status, body).
    pub fn readyz(&self) -> (u16, String) {
        crate::metrics::plain_http_get(&self.metrics_addr(), "/readyz")
    }

    /// `GET /metrics` body.
    pub fn metrics(&self) -> String {
        crate::metrics::plain_http_get(&self.metrics_addr(), "/metrics").1
    }
}

/// `cert-syncer SUBCOMMAND` on `api`'s recovery connection, as the pods' sidecars connect
/// (`--server`, SNI `localhost-recovery`, the recovery CA, the admin token file), logging at
/// `RUST_LOG` (default `info`).
pub fn recovery_command(subcommand: &str, api: &impl ApiEndpoint) -> Command {
    let mut command = Command::new(bin_path("cert-syncer"));
    command
        .arg(subcommand)
        .args(["--server", &api.url()])
        .args(["--tls-server-name-override", "localhost-recovery"])
        .arg("--ca-file")
        .arg(api.dir().join("recovery-ca.crt"))
        .arg("--token-file")
        .arg(api.dir().join("token"))
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or("info".into()),
        );
    command
}

/// `cert-syncer regenerate --config CONFIG` on `api`'s recovery connection, plus `extra`.
pub fn regenerate_command(api: &impl ApiEndpoint, config: &Path, extra: &[&str]) -> Command {
    let mut command = recovery_command("regenerate", api);
    command.arg("--config").arg(config).args(extra);
    command
}

/// A ConfigMap holding `ca-bundle.crt`.
pub fn bundle_config_map(name: &str, pem: &str) -> k8s_openapi::api::core::v1::ConfigMap {
    k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "ca-bundle.crt".to_owned(),
            pem.to_owned(),
        )])),
        ..Default::default()
    }
}

/// A `kubernetes.io/tls`-shaped Secret with `tls.crt` and `tls.key`.
pub fn tls_secret(name: &str, cert: &str, key: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("tls.crt".to_owned(), ByteString(cert.as_bytes().to_vec())),
            ("tls.key".to_owned(), ByteString(key.as_bytes().to_vec())),
        ])),
        ..Default::default()
    }
}

/// Reads a file; `None` when it is missing or unreadable.
pub fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}
