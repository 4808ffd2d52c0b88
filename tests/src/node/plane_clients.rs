//! How a test reaches the woken control plane: admin clients and kubeconfigs, and the host
//! processes an operator would run against it (`regenerate`, `node`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::cluster::ControlPlane;
use super::kubeconfig::kubeconfig;
use super::profile_objects::URL;
use crate::process::bin_path;

impl ControlPlane {
    /// The pod as the kubelet reads it (JSON, which is YAML).
    pub fn pod_manifest(&self) -> String {
        serde_json::to_string_pretty(&self.pod).expect("the pod serialises")
    }

    /// An admin client of the pod's kube-apiserver through `localhost-recovery`.
    pub fn admin(&self) -> kube::Client {
        let mut config = crate::apiserver::recovery_config(URL, &self.recovery_ca);
        config.auth_info.token = Some(self.admin_token.clone().into());
        config.read_timeout = Some(Duration::from_secs(10));
        kube::Client::try_from(config).expect("a kube client")
    }

    /// A kubeconfig for kubectl as the admin: `https://localhost:6443` (SNI `localhost`),
    /// trusting only `ca`; written to `path`.
    pub fn admin_kubeconfig(&self, path: &Path, ca: &Path) -> PathBuf {
        std::fs::write(
            path,
            kubeconfig(
                "https://localhost:6443",
                None,
                ca,
                &BTreeMap::from([("token", self.admin_token.clone())]),
            ),
        )
        .unwrap();
        path.to_owned()
    }

    /// `cert-syncer regenerate --profile openshift-kube-apiserver EXTRA` as a host process on
    /// the pod's kube-apiserver (`localhost-recovery`, the admin token): an operator's manual
    /// run.
    pub fn regenerate_command(&self, extra: &[&str]) -> Command {
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .arg("regenerate")
            .args(["--server", URL])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(
                self.resources
                    .join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
            )
            .arg("--token-file")
            .arg(self.admin_token_file())
            .args(["--profile", "openshift-kube-apiserver"])
            .args(extra)
            .env("RUST_LOG", "info");
        command
    }

    /// The admin token in a 0600 file (`ROOT/admin.token`).
    pub fn admin_token_file(&self) -> PathBuf {
        let token = self.root.join("admin.token");
        testkit::rename::rename_into_with_mode(&token, self.admin_token.as_bytes(), 0o600);
        token
    }

    /// `cert-syncer node` as a host process keeping `file` from `sources`
    /// (`KIND/NAMESPACE/NAME/KEY`), connected like the sidecars (`localhost-recovery`, the
    /// recovery CA of the resource dir) with the admin token.
    pub fn node_mode_command(&self, file: &Path, sources: &[&str], extra: &[&str]) -> Command {
        let token = self.admin_token_file();
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .arg("node")
            .args(["--server", URL])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(
                self.resources
                    .join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
            )
            .arg("--token-file")
            .arg(token)
            .args(["--metrics-listen", "127.0.0.1:0"])
            .arg("--file")
            .arg(file)
            .args(sources.iter().flat_map(|s| ["--source", s]))
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            );
        command
    }

    /// The cert dir file `kind/name/key` (`secrets/localhost-serving-cert-certkey/tls.crt`).
    pub fn cert_file(&self, relative: &str) -> PathBuf {
        self.certs.join(relative)
    }
}
