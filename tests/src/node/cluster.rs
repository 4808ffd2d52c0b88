//! The control plane a node wakes up to after months: the rendered `manifests/static-pod` (the
//! real kube-apiserver and our two sidecars), its node files, and etcd holding the cluster's
//! objects, with the whole OpenShift kube-apiserver PKI of the `openshift-kube-apiserver`
//! profile expired (every signer and target; `localhost-recovery` valid), the cert dir as `sync`
//! left it.
//!
//! [`ControlPlane::prepare`] builds that state with the real programs, in order:
//! 1. etcd (TLS, client certificates) and a host kube-apiserver on it ([`SeedApiServer`]) with
//!    the pod's service-account key, issuer, etcd prefix and service network;
//! 2. OpenShift's CRDs and cluster objects (`../shared/openshift`), `manifests/` (namespaces,
//!    service accounts, the sidecars' RBAC), an admin service account, the sidecars' tokens
//!    (TokenRequest: the pod's key signs them), the kubelet's CSR CA
//!    (`openshift-config-managed/csr-controller-ca`, outside the profile, valid), the objects
//!    the sync list requires that the profile does not make (service-account key, kubeconfigs);
//! 3. `cert-syncer regenerate --once` now (the valid `localhost-recovery` objects are kept),
//!    then everything again eleven years ago (`--now`), then the recovery objects put back;
//! 4. `cert-syncer sync` with the pod's own lists writes the cert dir; the resource dir gets
//!    `manifests/node/…/kube-apiserver-pod-1`, the recovery pair and CA, the tokens and etcd's
//!    client files;
//! 5. the seed apiserver stops. Only etcd runs when the kubelet is started.

use super::tokens::{bound_service_account, token_of, write_container_tokens};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use testkit::pki::{Ca, CertSpec};

use super::etcd::Etcd;
use super::inputs::openshift_dir;
use super::kubeconfig::kubeconfig;
use super::pod::{
    STATIC_POD_DIR, bind_apiserver_to_loopback, host_path, pin_host_ip, raw_argv, render_pod,
    render_pod_from, rewrite_host_paths,
};
use super::profile_objects::{ADMIN_ACCOUNT, BUNDLES, CM, KS, OP, profile_secrets};
use super::seed::SeedApiServer;
use crate::manifests::{self, SERVER_CONTAINER, SYNC_CONTAINER};
use crate::process::{ChildProcess, bin_path, run_checked};

/// The slept control plane's files and etcd (see the module docs).
pub struct ControlPlane {
    /// The node's `/`: the pod's host paths are rewritten under it.
    pub root: PathBuf,
    /// The resource dir (`R`, revisioned) on the host.
    pub resources: PathBuf,
    /// The cert dir (`C`, kept by the sync sidecar) on the host.
    pub certs: PathBuf,
    /// etcd (TLS), running.
    pub etcd: Etcd,
    /// The `localhost-recovery` serving CA (PEM; valid).
    pub recovery_ca: String,
    /// The admin service account's token (cluster-admin).
    pub admin_token: String,
    /// The kubelet's kubeconfig (`system:node:NODE` from the CSR CA, through
    /// `localhost-recovery`).
    pub kubelet_kubeconfig: PathBuf,
    /// The rendered pod, host paths rewritten, as the kubelet reads it.
    pub pod: Pod,
    /// The CSR signer (`csr-controller-ca`), for more node client certificates.
    pub csr_signer: Ca,
    /// `kube-apiserver-to-kubelet-client-ca` as it was when the node went to sleep (expired):
    /// what a kubelet's client CA file held then.
    pub kubelet_ca_when_slept: String,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    }
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

impl ControlPlane {
    /// Builds the slept state under `root` for node `node` (see the module docs). Blocking
    /// parts run in `block_in_place`: call it on a multi-thread runtime.
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare(root: &Path, node: &str) -> ControlPlane {
        Self::prepare_pod(root, node, STATIC_POD_DIR).await
    }

    /// [`ControlPlane::prepare`] for the pod of the kustomization `manifests/POD_DIR` (the real
    /// pod, or the peer [`super::pod::OPENSHIFT_PEER_DIR`]); `manifests/POD_DIR/cluster` is
    /// applied after `manifests/` when it exists (what that pod's sidecars need in the API).
    /// The cert dir is primed with the real pod's sync lists (upstream's, the same objects
    /// OpenShift's `cert-syncer` has built in).
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare_pod(root: &Path, node: &str, pod_dir: &str) -> ControlPlane {
        let etcd = tokio::task::block_in_place(|| Etcd::start(&root.join("var/lib/etcd")));
        Self::prepare_pod_on(root, node, pod_dir, etcd).await
    }

    /// [`ControlPlane::prepare_pod`] on a running `etcd` (one member of the three-node tier's
    /// cluster, reached at its [`Etcd::url`]); the plane keeps it.
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare_pod_on(
        root: &Path,
        node: &str,
        pod_dir: &str,
        etcd: Etcd,
    ) -> ControlPlane {
        let pod = bind_apiserver_to_loopback(pin_host_ip(rewrite_host_paths(
            render_pod_from(pod_dir),
            root,
        )));
        let resources = host_path(&pod, "resource-dir");
        let certs = host_path(&pod, "cert-dir");
        let server_argv = raw_argv(&pod, SERVER_CONTAINER);

        // The pod's service-account key: the seed apiserver signs the tokens with it.
        let seed_dir = root.join("seed");
        std::fs::create_dir_all(&seed_dir).unwrap();
        let (sa_key, sa_pub) = testkit::pki::key_pair_pem(testkit::pki::KeyKind::Rsa2048);
        std::fs::write(seed_dir.join("sa.key"), &sa_key).unwrap();
        std::fs::write(seed_dir.join("sa.pub"), &sa_pub).unwrap();
        // Flags the data in etcd depends on: the same as the pod's.
        let same: Vec<String> = [
            "etcd-prefix",
            "service-account-issuer",
            "api-audiences",
            "service-cluster-ip-range",
            "storage-media-type",
        ]
        .iter()
        .filter_map(|name| {
            manifests::flag(&server_argv, name).map(|value| format!("--{name}={value}"))
        })
        .collect();
        let seed = tokio::task::block_in_place(|| {
            SeedApiServer::start(
                &seed_dir,
                &etcd,
                (&seed_dir.join("sa.key"), &seed_dir.join("sa.pub")),
                &same,
            )
        });
        let admin = seed.admin();

        // OpenShift's cluster objects (the regeneration sidecar reads the service network and
        // API hostnames from them), then manifests/.
        let shared = openshift_dir().unwrap_or_else(|reason| panic!("{reason}"));
        let kubectl = |args: &[&str]| {
            let mut command = Command::new("kubectl");
            command
                .arg("--kubeconfig")
                .arg(seed.kubeconfig())
                .args(args);
            command
        };
        run_checked(
            &mut kubectl(&[
                "apply",
                "-f",
                &shared.join("crds.yaml").display().to_string(),
            ]),
            "kubectl apply crds.yaml",
        );
        let served = testkit::wait::poll_until(Duration::from_secs(60), || {
            kubectl(&["get", "networks.config.openshift.io"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|_| ())
        });
        assert!(served.is_some(), "OpenShift's CRDs were not served");
        run_checked(
            Command::new(shared.join("cluster-objects.sh")).arg(seed.kubeconfig()),
            "cluster-objects.sh",
        );
        run_checked(
            &mut kubectl(&["apply", "-k", &manifests::dir().display().to_string()]),
            "kubectl apply -k manifests/",
        );
        let pod_cluster = manifests::dir().join(pod_dir).join("cluster");
        if pod_cluster.join("kustomization.yaml").is_file() {
            run_checked(
                &mut kubectl(&["apply", "-k", &pod_cluster.display().to_string()]),
                &format!("kubectl apply -k manifests/{pod_dir}/cluster"),
            );
        }

        // The admin, and the sidecars' tokens (their kubeconfigs name the files).
        bound_service_account(&admin, (KS, ADMIN_ACCOUNT), ADMIN_ACCOUNT, "cluster-admin").await;
        let pp = PostParams::default();
        let admin_token = token_of(&admin, KS, ADMIN_ACCOUNT).await;

        // The resource dir: the node files the repository ships, then the revisioned secrets.
        copy_tree(
            &manifests::dir().join("node/etc/kubernetes/static-pod-resources/kube-apiserver-pod-1"),
            &resources,
        );
        write_container_tokens(&admin, &pod, &manifests::pod(), &resources).await;
        let write = |relative: &str, text: &str, mode: u32| {
            let path = resources.join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            testkit::rename::rename_into_with_mode(&path, text.as_bytes(), mode);
        };
        write(
            "configmaps/etcd-serving-ca/ca-bundle.crt",
            &etcd.serving_ca,
            0o644,
        );
        write("secrets/etcd-client/tls.crt", &etcd.client.cert_pem, 0o600);
        write("secrets/etcd-client/tls.key", &etcd.client.key_pem, 0o600);

        // Objects of the sync list outside the profile; the kubelet's CSR signer.
        let csr_signer = Ca::new("kube-csr-signer");
        let secrets = |ns: &str| Api::<Secret>::namespaced(admin.clone(), ns);
        let config_maps = |ns: &str| Api::<ConfigMap>::namespaced(admin.clone(), ns);
        config_maps(CM)
            .create(
                &pp,
                &ConfigMap {
                    metadata: meta(CM, "csr-controller-ca"),
                    data: Some(BTreeMap::from([(
                        "ca-bundle.crt".to_owned(),
                        csr_signer.cert_pem.clone(),
                    )])),
                    ..ConfigMap::default()
                },
            )
            .await
            .expect("csr-controller-ca");
        secrets(KS)
            .create(
                &pp,
                &Secret {
                    metadata: meta(KS, "bound-service-account-signing-key"),
                    data: Some(BTreeMap::from([
                        ("service-account.key".to_owned(), bytes(&sa_key)),
                        ("service-account.pub".to_owned(), bytes(&sa_pub)),
                    ])),
                    ..Secret::default()
                },
            )
            .await
            .expect("bound-service-account-signing-key");
        let stub = |server: &str| {
            kubeconfig(
                server,
                None,
                Path::new("/etc/kubernetes/static-pod-resources/configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
                &BTreeMap::from([(
                    "client-certificate",
                    "/etc/kubernetes/static-pod-certs/secrets/control-plane-node-admin-client-cert-key/tls.crt".to_owned(),
                )]),
            )
        };
        secrets(KS)
            .create(
                &pp,
                &Secret {
                    metadata: meta(KS, "node-kubeconfigs"),
                    data: Some(BTreeMap::from([
                        (
                            "localhost.kubeconfig".to_owned(),
                            bytes(&stub("https://localhost:6443")),
                        ),
                        (
                            "localhost-recovery.kubeconfig".to_owned(),
                            bytes(&stub("https://localhost:6443")),
                        ),
                        (
                            "lb-ext.kubeconfig".to_owned(),
                            bytes(&stub("https://api.cluster.example.com:6443")),
                        ),
                        (
                            "lb-int.kubeconfig".to_owned(),
                            bytes(&stub("https://api-int.cluster.example.com:6443")),
                        ),
                    ])),
                    ..Secret::default()
                },
            )
            .await
            .expect("node-kubeconfigs");
        for name in [
            "control-plane-node-kubeconfig",
            "check-endpoints-kubeconfig",
        ] {
            config_maps(KS)
                .create(
                    &pp,
                    &ConfigMap {
                        metadata: meta(KS, name),
                        data: Some(BTreeMap::from([(
                            "kubeconfig".to_owned(),
                            stub("https://localhost:6443"),
                        )])),
                        ..ConfigMap::default()
                    },
                )
                .await
                .unwrap_or_else(|err| panic!("{name}: {err}"));
        }

        // The PKI: made now, the valid recovery objects kept; made again eleven years ago;
        // the recovery objects put back.
        let regenerate = |extra: &[&str]| {
            let mut command = Command::new(bin_path("cert-syncer"));
            command
                .arg("regenerate")
                .args(["--server", &seed.url()])
                .args(["--tls-server-name-override", "localhost-recovery"])
                .arg("--ca-file")
                .arg(seed.dir.join("recovery-ca.crt"))
                .arg("--token-file")
                .arg(seed.dir.join("token"))
                .args(["--profile", "openshift-kube-apiserver", "--once"])
                .args(extra)
                .env("RUST_LOG", "warn");
            tokio::task::block_in_place(|| {
                run_checked(&mut command, "cert-syncer regenerate --once")
            });
        };
        regenerate(&[]);
        let recovery = [
            (OP, "localhost-recovery-serving-signer"),
            (KS, "localhost-recovery-serving-certkey"),
        ];
        let mut kept = Vec::new();
        for (ns, name) in recovery {
            kept.push(secrets(ns).get(name).await.unwrap());
        }
        let kept_bundle = config_maps(OP)
            .get("localhost-recovery-serving-ca")
            .await
            .unwrap();
        for (ns, name) in profile_secrets() {
            let _ = secrets(ns).delete(name, &DeleteParams::default()).await;
        }
        for (ns, name) in BUNDLES {
            let _ = config_maps(ns).delete(name, &DeleteParams::default()).await;
        }
        let long_ago =
            (time::OffsetDateTime::now_utc().unix_timestamp() - 11 * 365 * 86_400).to_string();
        regenerate(&["--now", &long_ago]);
        let kubelet_ca_when_slept = config_maps(OP)
            .get("kube-apiserver-to-kubelet-client-ca")
            .await
            .expect("the slept kube-apiserver-to-kubelet-client-ca")
            .data
            .and_then(|mut data| data.remove("ca-bundle.crt"))
            .expect("its ca-bundle.crt");
        for mut secret in kept {
            let (ns, name) = (
                secret.metadata.namespace.clone().unwrap(),
                secret.metadata.name.clone().unwrap(),
            );
            let current = secrets(&ns).get(&name).await.unwrap();
            secret.metadata.resource_version = current.metadata.resource_version;
            secret.metadata.uid = current.metadata.uid;
            secrets(&ns).replace(&name, &pp, &secret).await.unwrap();
        }
        let mut bundle = kept_bundle;
        let current = config_maps(OP)
            .get("localhost-recovery-serving-ca")
            .await
            .unwrap();
        bundle.metadata.resource_version = current.metadata.resource_version;
        bundle.metadata.uid = current.metadata.uid;
        config_maps(OP)
            .replace("localhost-recovery-serving-ca", &pp, &bundle)
            .await
            .unwrap();

        // The revisioned recovery pair and the CA the sidecars' kubeconfigs trust.
        let recovery_pair = secrets(KS)
            .get("localhost-recovery-serving-certkey")
            .await
            .unwrap();
        let field = |secret: &Secret, key: &str| {
            String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
        };
        let recovery_signer = secrets(OP)
            .get("localhost-recovery-serving-signer")
            .await
            .unwrap();
        let recovery_ca = field(&recovery_signer, "tls.crt");
        write(
            "secrets/localhost-recovery-serving-certkey/tls.crt",
            &field(&recovery_pair, "tls.crt"),
            0o600,
        );
        write(
            "secrets/localhost-recovery-serving-certkey/tls.key",
            &field(&recovery_pair, "tls.key"),
            0o600,
        );
        write(
            "configmaps/kube-apiserver-server-ca/ca-bundle.crt",
            &recovery_ca,
            0o644,
        );

        // Before the sleep: `sync`, with the pod's own lists, wrote the cert dir.
        let sync_argv = raw_argv(&render_pod(), SYNC_CONTAINER);
        let lists: Vec<String> = sync_argv
            .iter()
            .filter(|a| {
                [
                    "--secrets",
                    "--configmaps",
                    "--optional-secrets",
                    "--optional-configmaps",
                ]
                .iter()
                .any(|flag| a.starts_with(&format!("{flag}=")))
            })
            .cloned()
            .collect();
        let lists: Vec<&str> = lists.iter().map(String::as_str).collect();
        let spec = crate::syncer::SyncerSpec::new(&seed, &certs, &lists);
        let mut sync = tokio::task::block_in_place(|| ChildProcess::start(spec.command()));
        let addr = sync.addr;
        crate::wait_until(
            "the host sync to write the whole cert dir (its /readyz)",
            Duration::from_secs(60),
            || async move { crate::plain_http_get(&addr.to_string(), "/readyz").0 == 200 },
        )
        .await;
        tokio::task::block_in_place(|| sync.terminate(Duration::from_secs(10)));
        drop(sync);
        tokio::task::block_in_place(|| seed.stop());

        // The kubelet's identity, from the CSR signer; it trusts the recovery CA.
        let kubelet_dir = root.join("var/lib/kubelet-identity");
        std::fs::create_dir_all(&kubelet_dir).unwrap();
        let identity = csr_signer.issue(
            &CertSpec::client(&format!("system:node:{node}"))
                .organization("system:nodes")
                .days(365),
        );
        testkit::pki::write_pair(
            &kubelet_dir.join("kubelet-client.crt"),
            &kubelet_dir.join("kubelet-client.key"),
            &identity,
        );
        let kubelet_kubeconfig = kubelet_dir.join("kubeconfig");
        std::fs::write(
            &kubelet_kubeconfig,
            kubeconfig(
                "https://localhost:6443",
                Some("localhost-recovery"),
                &resources.join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
                &BTreeMap::from([
                    (
                        "client-certificate",
                        kubelet_dir.join("kubelet-client.crt").display().to_string(),
                    ),
                    (
                        "client-key",
                        kubelet_dir.join("kubelet-client.key").display().to_string(),
                    ),
                ]),
            ),
        )
        .unwrap();

        ControlPlane {
            root: root.to_owned(),
            resources,
            certs,
            etcd,
            recovery_ca,
            admin_token,
            kubelet_kubeconfig,
            pod,
            csr_signer,
            kubelet_ca_when_slept,
        }
    }
}

/// Copies the files of `from` into `to` (directories created; existing files replaced).
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from)
        .unwrap_or_else(|err| panic!("{}: {err}", from.display()))
        .filter_map(Result::ok)
    {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
