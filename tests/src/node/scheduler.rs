//! The kube-scheduler pod on the node tier: `manifests/static-pod-ks` rendered as a user renders
//! it, its host paths moved under the woken control plane's root, its node files (the repo's
//! `kube-scheduler-pod-1`, the recovery CA, the sidecars' tokens from the running
//! kube-apiserver) in place, and the manifest handed to the kubelet. The cert dir starts empty:
//! everything the scheduler authenticates with comes through its sidecars.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Pod;

use super::kubelet::Node;
use super::pod::{host_path, rewrite_host_paths};
use super::scenario::Woken;
use crate::manifests;

/// The scheduler's namespace.
pub const NAMESPACE: &str = "openshift-kube-scheduler";
/// The static pod's name (the mirror pod is `openshift-kube-scheduler-NODE`).
pub const POD: &str = "openshift-kube-scheduler";
/// Its containers.
pub const SCHEDULER: &str = "kube-scheduler";
/// The `sync` sidecar.
pub const SYNC: &str = "kube-scheduler-cert-syncer";
/// The `regenerate --profile openshift-kube-scheduler` sidecar.
pub const RECOVERY: &str = "kube-scheduler-recovery-controller";
/// The pod's `restart-on-change` sidecar (restarts [`SCHEDULER`] on a new client certificate).
pub const RESTARTER: &str = "kube-scheduler-cert-restarter";
/// The client certificate: issued by the kube-apiserver's profile in
/// `openshift-config-managed`, copied into [`NAMESPACE`], synced into the cert dir.
pub const CLIENT_CERT: &str = "kube-scheduler-client-cert-key";

/// `kubectl kustomize manifests/static-pod-ks`.
///
/// # Panics
/// When kubectl fails or the output is not one Pod.
pub fn render_scheduler_pod() -> Pod {
    let dir = manifests::dir().join("static-pod-ks");
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::from_slice(&out.stdout).expect("manifests/static-pod-ks renders to one Pod")
}

/// The scheduler pod placed on a woken node.
#[derive(Debug)]
pub struct SchedulerPod {
    /// The pod as the kubelet reads it (host paths under the plane's root).
    pub pod: Pod,
    /// Its resource dir on the host.
    pub resources: PathBuf,
    /// Its cert dir on the host (written by the sync sidecar alone).
    pub certs: PathBuf,
}

impl SchedulerPod {
    /// Prepares the node files and places the pod; call once kube-apiserver serves (the
    /// sidecars' tokens are requested from it). The cert dir is left empty.
    ///
    /// # Panics
    /// When a file cannot be written or a token cannot be had.
    pub async fn place(woken: &Woken) -> SchedulerPod {
        let rendered = render_scheduler_pod();
        let pod = rewrite_host_paths(rendered.clone(), &woken.plane.root);
        let resources = host_path(&pod, "resource-dir");
        let certs = host_path(&pod, "cert-dir");
        copy_files(
            &manifests::dir().join("node/etc/kubernetes/static-pod-resources/kube-scheduler-pod-1"),
            &resources,
        );
        write(
            &resources.join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
            &woken.plane.recovery_ca,
            0o644,
        );
        // Each sidecar's token, for the account its kubeconfig's token file belongs to.
        super::tokens::write_container_tokens(&woken.plane.admin(), &pod, &rendered, &resources)
            .await;
        woken.node.place_manifest(
            "kube-scheduler-pod.yaml",
            &serde_json::to_string_pretty(&pod).expect("the pod serialises"),
        );
        SchedulerPod {
            pod,
            resources,
            certs,
        }
    }

    /// The synced client certificate file (`tls.crt`) or key (`tls.key`).
    pub fn client_file(&self, key: &str) -> PathBuf {
        self.certs.join("secrets").join(CLIENT_CERT).join(key)
    }

    /// The logs of the pod's containers (for failure messages).
    pub fn logs(node: &Node) -> String {
        [SCHEDULER, SYNC, RECOVERY, RESTARTER]
            .iter()
            .map(|c| format!("{c}:\n{}\n", node.container_log(POD, c)))
            .collect()
    }
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().expect("a parent")).unwrap();
    testkit::rename::rename_into_with_mode(path, text.as_bytes(), mode);
}

/// Copies the files of `from` into `to` (directories created).
fn copy_files(from: &Path, to: &Path) {
    let mut pending = BTreeMap::from([(from.to_owned(), to.to_owned())]);
    while let Some((from, to)) = pending.pop_first() {
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(&from)
            .unwrap_or_else(|err| panic!("{}: {err}", from.display()))
            .filter_map(Result::ok)
        {
            let target = to.join(entry.file_name());
            if entry.path().is_dir() {
                pending.insert(entry.path(), target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
}
