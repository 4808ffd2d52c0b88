//! The node wakes up: [`Woken::start`] prepares the slept control plane
//! ([`super::cluster::ControlPlane`]), starts containerd with the images of
//! `scripts/build-images`, places the rendered pod and starts the kubelet; the `wait_*` methods
//! return the milestones of the recovery, from the kubelet's start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::api::Api;

use super::cluster::ControlPlane;
use super::images;
use super::kubelet::{KubeletOptions, Node};
use super::profile_objects::{KS, POD};
use crate::process::ChildProcess;
use crate::tls::handshake_leaf;

/// Every milestone must be reached this long after the kubelet started (a loaded 2-core CI
/// machine).
pub const WITHIN: Duration = Duration::from_secs(240);

/// The source of the host bundle node mode keeps for clients of `https://localhost:6443`: the
/// CA bundle of `localhost`'s serving certificate.
pub const LOCALHOST_CA_SOURCE: &str =
    "configmap/openshift-kube-apiserver-operator/localhost-serving-ca/ca-bundle.crt";

/// kube-apiserver in the pod.
pub const ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 6443);

/// The `notAfter` of the first certificate of `pem`, as a Unix time.
///
/// # Panics
/// When `pem` holds no certificate.
pub fn not_after(pem: &str) -> i64 {
    let der = first_der(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    cert.validity().not_after.timestamp()
}

/// The DER of the first certificate of `pem`.
///
/// # Panics
/// When `pem` holds no certificate.
pub fn first_der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a PEM certificate")
        .to_vec()
}

/// Now, as a Unix time.
pub fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// How the node is woken.
#[derive(Debug, Clone, Default)]
pub struct WakeOptions {
    /// Sources (`KIND/NAMESPACE/NAME/KEY`) of the kubelet's `authentication.x509.clientCAFile`,
    /// kept by `cert-syncer node` (started with the recovery); none: no client CA file.
    pub kubelet_client_ca_sources: Vec<String>,
    /// The kubelet's `--node-ip` ([`KubeletOptions::node_ip`]); `None`: 127.0.0.1.
    pub node_ip: Option<std::net::IpAddr>,
    /// The pod's kustomization under `manifests/` ([`ControlPlane::prepare_pod`]); `None`:
    /// `static-pod`, ours.
    pub pod_dir: Option<&'static str>,
}

/// A node woken on the slept control plane. Dropped: node mode, the node (kubelet, containers,
/// containerd, mounts, pod logs), etcd, the files, in this order.
pub struct Woken {
    node_modes: Vec<ChildProcess>,
    /// The node.
    pub node: Node,
    /// The control plane's files and etcd.
    pub plane: ControlPlane,
    /// The kubelet's start.
    pub started: Instant,
    /// The host bundle of the `localhost` serving CA (kept by node mode once started).
    pub localhost_ca: PathBuf,
    /// The kubelet's client CA file (kept by node mode), when [`WakeOptions`] named sources.
    pub kubelet_client_ca: Option<PathBuf>,
    options: WakeOptions,
    /// The test's directory.
    pub tmp: tempfile::TempDir,
}

impl std::fmt::Debug for Woken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Woken")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Woken {
    /// Prepares the slept state, builds and imports the images, places the pod and starts the
    /// kubelet (registered through `localhost-recovery`).
    pub async fn start(options: WakeOptions) -> Woken {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let root = tmp.path().join("root");
        let plane = ControlPlane::prepare_pod(
            &root,
            &super::kubelet::node_name(),
            options.pod_dir.unwrap_or(super::pod::STATIC_POD_DIR),
        )
        .await;
        let mut node = tokio::task::block_in_place(|| Node::start(&tmp.path().join("node"), &[]));
        tokio::task::block_in_place(|| images::build_and_import(&node.containerd));
        let kubelet_client_ca = (!options.kubelet_client_ca_sources.is_empty())
            .then(|| root.join("etc/kubernetes/kubelet-ca.crt"));
        if let Some(file) = &kubelet_client_ca {
            // The file as the node had it when it went to sleep: the expired
            // `kube-apiserver-to-kubelet-client-ca` bundle (the kubelet needs a file to start;
            // node mode replaces a file that holds nothing unexpired). Not `client-ca`: it
            // holds unexpired CAs (the installer's admin CA) that the rotated bundle lacks, and
            // node mode rightly refuses to drop every unexpired certificate of a file.
            testkit::rename::rename_into(file, plane.kubelet_ca_when_slept.as_bytes());
        }
        node.place_manifest("kube-apiserver-pod.yaml", &plane.pod_manifest());
        let started = tokio::task::block_in_place(|| {
            node.start_kubelet(&KubeletOptions {
                kubeconfig: Some(plane.kubelet_kubeconfig.clone()),
                client_ca_file: kubelet_client_ca.clone(),
                node_ip: options.node_ip,
                ..KubeletOptions::default()
            })
            .started
        });
        Woken {
            node_modes: Vec::new(),
            node,
            localhost_ca: root.join("etc/kubernetes/localhost-serving-ca.crt"),
            kubelet_client_ca,
            plane,
            started,
            options,
            tmp,
        }
    }

    /// A woken node whose test prepared more than [`Woken::start`] does (more pods, other
    /// kubelet flags): its plane, its node with the kubelet started at `started`.
    pub fn assemble(
        node: Node,
        plane: ControlPlane,
        started: Instant,
        options: WakeOptions,
        tmp: tempfile::TempDir,
    ) -> Woken {
        Woken {
            node_modes: Vec::new(),
            localhost_ca: plane.root.join("etc/kubernetes/localhost-serving-ca.crt"),
            kubelet_client_ca: None,
            node,
            plane,
            started,
            options,
            tmp,
        }
    }

    /// The time since the kubelet started, printed with `what`.
    pub fn milestone(&self, what: &str) -> Duration {
        let elapsed = self.started.elapsed();
        eprintln!("milestone +{:>6} ms: {what}", elapsed.as_millis());
        elapsed
    }

    /// Panics with `what` and the logs of the kubelet and the pod's containers.
    pub fn fail(&self, what: &str) -> ! {
        let node = &self.node;
        panic!(
            "{what} (within {WITHIN:?} of the kubelet's start)\nkubelet:\n{}\nkubelet about kube-apiserver:\n{}\nkube-apiserver:\n{}\nsync:\n{}\nregenerate:\n{}",
            node.kubelet_log_tail(),
            node.kubelet_errors_about("kube-apiserver"),
            node.container_log(POD, "kube-apiserver"),
            node.container_log(POD, "kube-apiserver-cert-syncer"),
            node.container_log(POD, "kube-apiserver-cert-regeneration-controller"),
        )
    }

    /// Polls `probe` every 50 ms until it holds; fails after [`WITHIN`].
    pub async fn wait<F, Fut>(&self, what: &str, mut probe: F) -> Duration
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        while !probe().await {
            if self.started.elapsed() > WITHIN {
                self.fail(&format!("not reached: {what}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.milestone(what)
    }

    /// Waits until the pod's kube-apiserver container runs.
    pub async fn apiserver_running(&self) -> Duration {
        self.wait("kube-apiserver container running", || async {
            self.node.running_container(POD, "kube-apiserver").is_some()
        })
        .await
    }

    /// Waits until kube-apiserver answers on `localhost-recovery` (verified with the recovery
    /// CA), then starts node mode for the host bundles.
    pub async fn recovery_answers(&mut self) -> Duration {
        let recovery_ca = self.plane.recovery_ca.clone();
        let elapsed = self
            .wait("kube-apiserver answers localhost-recovery", || {
                let ca = recovery_ca.clone();
                async move {
                    handshake_leaf(SocketAddr::from(ADDR), "localhost-recovery", &ca)
                        .await
                        .is_ok()
                }
            })
            .await;
        let mut files = vec![(
            self.localhost_ca.clone(),
            vec![LOCALHOST_CA_SOURCE.to_owned()],
        )];
        if let Some(file) = &self.kubelet_client_ca {
            files.push((file.clone(), self.options.kubelet_client_ca_sources.clone()));
        }
        for (file, sources) in files {
            let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
            let command = self
                .plane
                .node_mode_command(&file, &sources, &["--grace-period", "0s"]);
            self.node_modes
                .push(tokio::task::block_in_place(|| ChildProcess::start(command)));
        }
        elapsed
    }

    /// Waits until the node is Ready and its mirror pod is in the API.
    pub async fn node_ready(&self) -> Duration {
        let admin = self.plane.admin();
        let nodes: Api<KubeNode> = Api::all(admin.clone());
        let pods: Api<Pod> = Api::namespaced(admin, KS);
        let name = self.node.name.clone();
        let mirror = format!("{POD}-{name}");
        self.wait("node Ready, mirror pod in the API", || {
            let (nodes, pods, name, mirror) =
                (nodes.clone(), pods.clone(), name.clone(), mirror.clone());
            async move {
                let ready = matches!(nodes.get_opt(&name).await, Ok(Some(n)) if is_ready(&n));
                ready && matches!(pods.get_opt(&mirror).await, Ok(Some(_)))
            }
        })
        .await
    }

    /// Waits until the synced `localhost` serving pair is valid again.
    pub async fn cert_dir_healed(&self) -> Duration {
        let serving = self
            .plane
            .cert_file("secrets/localhost-serving-cert-certkey/tls.crt");
        self.wait("the synced localhost pair is valid again", || async {
            std::fs::read_to_string(&serving).is_ok_and(|pem| not_after(&pem) > now())
        })
        .await
    }

    /// Waits until a client trusting only node mode's host bundle verifies
    /// `https://localhost:6443`; returns the elapsed time and the served serial.
    pub async fn verified(&self) -> (Duration, String) {
        loop {
            if let Ok(trusted) = std::fs::read_to_string(&self.localhost_ca)
                && let Ok(leaf) =
                    handshake_leaf(SocketAddr::from(ADDR), "localhost", &trusted).await
            {
                return (
                    self.milestone(
                        "a client trusting only node mode's bundle verifies https://localhost:6443",
                    ),
                    leaf.serial,
                );
            }
            if self.started.elapsed() > WITHIN {
                self.fail("no verified handshake for localhost");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `kubectl --kubeconfig K ARGS` as the admin through `https://localhost:6443`, trusting
    /// only node mode's host bundle: its output.
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        let kubeconfig = self.plane.admin_kubeconfig(
            &self.tmp.path().join("kubectl.kubeconfig"),
            &self.localhost_ca,
        );
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    /// The node's directory of the pod's cert dir.
    pub fn certs(&self) -> &Path {
        &self.plane.certs
    }
}

/// Whether `node`'s `Ready` condition is `True`.
pub fn is_ready(node: &KubeNode) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}
