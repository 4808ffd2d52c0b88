//! The kube-scheduler's part of the slept control plane (issue 27, item 3): the pod of
//! `manifests/static-pod-ks` as it was when the node went to sleep — its node files and tokens,
//! and its cert dir as its `sync` sidecar left it, holding the copy of
//! `kube-scheduler-client-cert-key` that expired with the rest. Made by
//! [`crate::node::kcm_plane::KcmPlane::prepare`] while its seed apiserver runs; the scheduler
//! pod is then placed with the other two before the kubelet starts (unlike
//! [`super::scheduler::SchedulerPod::place`], which places it on a recovered plane with an
//! empty cert dir).

use super::tokens::write_container_tokens;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::cluster::ControlPlane;
use super::pod::{host_path, raw_argv, rewrite_host_paths};
use super::scheduler::{CLIENT_CERT, NAMESPACE, SYNC, render_scheduler_pod};
use super::seed::SeedApiServer;
use crate::manifests;
use crate::process::{ChildProcess, bin_path};

/// The scheduler pod's files as the sleep left them.
#[derive(Debug)]
pub struct SleptScheduler {
    /// The rendered pod, host paths under the plane's root.
    pub pod: Pod,
    /// Its cert dir on the host.
    pub certs: PathBuf,
}

impl SleptScheduler {
    /// The synced client certificate (`tls.crt`) or key (`tls.key`).
    pub fn client_file(&self, key: &str) -> PathBuf {
        self.certs.join("secrets").join(CLIENT_CERT).join(key)
    }

    /// The pod as the kubelet reads it.
    pub fn pod_manifest(&self) -> String {
        serde_json::to_string_pretty(&self.pod).expect("the pod serialises")
    }

    /// Prepares the scheduler pod's files on `seed` (the plane's etcd): its profile's copy made
    /// eleven years ago (`long_ago`, Unix seconds), the node files and tokens, the cert dir by
    /// `sync` with the pod's own list.
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare(plane: &ControlPlane, seed: &SeedApiServer, long_ago: &str) -> Self {
        let rendered = render_scheduler_pod();
        let pod = rewrite_host_paths(rendered.clone(), &plane.root);
        let resources = host_path(&pod, "resource-dir");
        let certs = host_path(&pod, "cert-dir");
        let connect = |command: &mut Command| {
            command
                .args(["--server", &seed.url()])
                .args(["--tls-server-name-override", "localhost-recovery"])
                .arg("--ca-file")
                .arg(seed.dir.join("recovery-ca.crt"))
                .arg("--token-file")
                .arg(seed.dir.join("token"))
                .env("RUST_LOG", "warn");
        };

        // The copy of the (expired) client certificate, as the recovery controller made it
        // before the sleep.
        let mut regenerate = Command::new(bin_path("cert-syncer"));
        regenerate.arg("regenerate");
        connect(&mut regenerate);
        regenerate
            .args(["--profile", "openshift-kube-scheduler", "--once"])
            .args(["--now", long_ago]);
        tokio::task::block_in_place(|| {
            let out = regenerate.output().expect("cert-syncer runs");
            assert!(
                out.status.success(),
                "regenerate --profile openshift-kube-scheduler --once: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        });

        // Node files and the sidecars' tokens (the seed signs them with the pod's key).
        copy_tree(
            &manifests::dir().join("node/etc/kubernetes/static-pod-resources/kube-scheduler-pod-1"),
            &resources,
        );
        write(
            &resources.join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
            &plane.recovery_ca,
            0o644,
        );
        write_container_tokens(&seed.admin(), &pod, &rendered, &resources).await;

        // The cert dir as the sync sidecar left it.
        let lists: Vec<String> = raw_argv(&pod, SYNC)
            .into_iter()
            .filter(|a| {
                [
                    "--secrets=",
                    "--configmaps=",
                    "--optional-secrets=",
                    "--optional-configmaps=",
                ]
                .iter()
                .any(|flag| a.starts_with(flag))
            })
            .collect();
        let mut sync = Command::new(bin_path("cert-syncer"));
        sync.arg("sync");
        connect(&mut sync);
        sync.args(["--namespace", NAMESPACE, "--metrics-listen", "127.0.0.1:0"])
            .arg("--destination-dir")
            .arg(&certs)
            .args(&lists);
        let mut sync = tokio::task::block_in_place(|| ChildProcess::start(sync));
        let addr = sync.addr;
        crate::wait_until(
            "the host sync to write the kube-scheduler's cert dir (its /readyz)",
            Duration::from_secs(60),
            || async move { crate::plain_http_get(&addr.to_string(), "/readyz").0 == 200 },
        )
        .await;
        tokio::task::block_in_place(|| sync.terminate(Duration::from_secs(10)));
        SleptScheduler { pod, certs }
    }
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().expect("a parent")).unwrap();
    testkit::rename::rename_into_with_mode(path, text.as_bytes(), mode);
}

/// Copies the files of `from` into `to` (directories created; existing files replaced).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from)
        .unwrap_or_else(|err| panic!("{}: {err}", from.display()))
        .filter_map(Result::ok)
    {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
