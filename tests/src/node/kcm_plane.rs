//! The kube-controller-manager's half of the slept control plane, and the kubelet's expired
//! identity (issue 27, items 2 and 3): added to a prepared [`ControlPlane`] before the kubelet
//! starts.
//!
//! [`KcmPlane::prepare`] starts a host kube-apiserver on the plane's etcd again
//! ([`SeedApiServer`]) and, with the real programs:
//! 1. makes the `openshift-kube-controller-manager` profile's set eleven years ago
//!    (`regenerate --profile openshift-kube-controller-manager --once --now …`): the CSR signer
//!    chain, its published `csr-signer` and the copy of the (equally expired)
//!    `kube-controller-manager-client-cert-key` are all expired; the pod's `client-ca` and
//!    `aggregator-client-ca` are the kube-apiserver's, as the KCM operator copies them;
//! 2. writes the pod's resource dir (`manifests/node/…/kube-controller-manager-pod-1`, the
//!    recovery CA, the sidecars' tokens) and its cert dir (`sync` with the pod's own lists);
//! 3. gives the kubelet what a master node has after the sleep: a client certificate from the
//!    old `csr-signer`, expired (in `--cert-dir`, `kubelet-client-current.pem`, and a kubeconfig
//!    naming it, as the kubelet writes them), and a bootstrap kubeconfig with the long-lived
//!    token of OpenShift's `openshift-machine-config-operator/node-bootstrapper`;
//! 4. the tokens of the pod's containers that have a kubeconfig (the sidecars, and the kubelet
//!    CSR approver, [`KCM_APPROVER`], as `manifests/rbac/csr-approver.yaml`'s account), and the
//!    approver's token as a host file too ([`KcmPlane::approver_command`]);
//! 5. the kube-scheduler pod's files as the sleep left them ([`SleptScheduler`]).

use super::tokens::{bound_service_account, token_of, write_container_tokens};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use testkit::pki::{Ca, CertSpec};

use super::cluster::ControlPlane;
use super::ks_plane::SleptScheduler;
use super::kubeconfig::kubeconfig;
use super::pod::{host_path, mount_at_host_path, raw_argv, rewrite_host_paths};
use super::profile_objects::{KS, URL};
use super::seed::SeedApiServer;
use crate::manifests;
use crate::process::{ChildProcess, bin_path, run_checked};

/// The kube-controller-manager's namespace.
pub const KCM_NS: &str = "openshift-kube-controller-manager";
/// Its operator's namespace (the CSR signer chain).
pub const KCM_OP: &str = "openshift-kube-controller-manager-operator";
/// The static pod's name (the mirror pod is `kube-controller-manager-NODE`).
pub const KCM_POD: &str = "kube-controller-manager";
/// The pod's server container.
pub const KCM_SERVER: &str = "kube-controller-manager";
/// The pod's sync sidecar.
pub const KCM_SYNC: &str = "kube-controller-manager-cert-syncer";
/// The pod's regeneration sidecar.
pub const KCM_RECOVERY: &str = "kube-controller-manager-recovery-controller";
/// The pod's `restart-on-change` sidecar (restarts [`KCM_SERVER`] on a new client certificate).
pub const KCM_RESTARTER: &str = "kube-controller-manager-cert-restarter";
/// The pod's kubelet CSR approver (`approve-kubelet-csr`).
pub const KCM_APPROVER: &str = "kube-controller-manager-csr-approver";
/// The kubelet's bootstrap identity on OpenShift (its bootstrap kubeconfig's token).
pub const BOOTSTRAPPER: (&str, &str) = ("openshift-machine-config-operator", "node-bootstrapper");
/// [`BOOTSTRAPPER`] as a username (`approve-kubelet-csr --bootstrap-user`).
pub const BOOTSTRAP_USER: &str =
    "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper";
/// The approver's account (`manifests/rbac/csr-approver.yaml`).
pub const APPROVER_ACCOUNT: &str = "kubelet-csr-approver";

/// The kube-controller-manager pod's files and the kubelet's slept identity.
#[derive(Debug)]
pub struct KcmPlane {
    /// The rendered `manifests/static-pod-kcm`, host paths under the plane's root.
    pub pod: Pod,
    /// Its resource dir on the host.
    pub resources: PathBuf,
    /// Its cert dir on the host (kept by its sync sidecar).
    pub certs: PathBuf,
    /// The published `csr-signer` as it was when the node went to sleep (expired; PEM).
    pub slept_csr_signer: String,
    /// The kubelet's `--cert-dir` (`kubelet-client-current.pem`: expired, from the old
    /// `csr-signer`).
    pub kubelet_cert_dir: PathBuf,
    /// The kubelet's `--kubeconfig` (its client certificate: `kubelet-client-current.pem`).
    pub kubelet_kubeconfig: PathBuf,
    /// The kubelet's `--bootstrap-kubeconfig` (the node-bootstrapper's token).
    pub bootstrap_kubeconfig: PathBuf,
    /// The approver's token file (0600).
    pub approver_token: PathBuf,
    /// The kube-scheduler pod as the sleep left it.
    pub scheduler: SleptScheduler,
}

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..ObjectMeta::default()
    }
}

/// `kubectl kustomize manifests/<dir>`: a static pod as a user renders it.
///
/// # Panics
/// When kubectl fails or the output is not one Pod.
pub fn render(dir: &str) -> Pod {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(manifests::dir().join(dir))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("manifests/{dir} renders to one Pod: {err}"))
}

/// The pod with kube-controller-manager serving on 127.0.0.1 only (`--bind-address`; the
/// manifest leaves the default, every address, as a control-plane node needs for its metrics):
/// servers in tests listen on the loopback, and the kubelet probes it there.
pub fn bind_to_loopback(mut pod: Pod) -> Pod {
    for container in pod
        .spec
        .as_mut()
        .map(|s| s.containers.iter_mut())
        .into_iter()
        .flatten()
        .filter(|c| c.name == KCM_SERVER)
    {
        let args = container.args.get_or_insert_with(Vec::new);
        args.retain(|arg| !arg.starts_with("--bind-address"));
        args.push("--bind-address=127.0.0.1".to_owned());
    }
    pod
}

/// The flags of the pod's kube-apiserver that the data in etcd depends on (a seed apiserver on
/// the same etcd must agree).
fn same_flags(plane: &ControlPlane) -> Vec<String> {
    let argv = raw_argv(&plane.pod, manifests::SERVER_CONTAINER);
    [
        "etcd-prefix",
        "service-account-issuer",
        "api-audiences",
        "service-cluster-ip-range",
        "storage-media-type",
    ]
    .iter()
    .filter_map(|name| manifests::flag(&argv, name).map(|value| format!("--{name}={value}")))
    .collect()
}

/// The PEM of `key` of a Secret.
fn field(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().expect("data")[key].0.clone()).expect("UTF-8")
}

/// (notBefore, notAfter) of the first certificate of `pem`.
fn window(pem: &str) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let der = super::scenario::first_der(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    let at = |t: x509_parser::time::ASN1Time| {
        time::OffsetDateTime::from_unix_timestamp(t.timestamp()).expect("a time")
    };
    (
        at(cert.validity().not_before),
        at(cert.validity().not_after),
    )
}

impl KcmPlane {
    /// Adds the kube-controller-manager's half and the kubelet's slept identity to `plane`
    /// (see the module docs). Call it after [`ControlPlane::prepare`], before the kubelet
    /// starts; blocking parts run in `block_in_place` (a multi-thread runtime).
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare(plane: &ControlPlane, node: &str) -> KcmPlane {
        let root = &plane.root;
        let rendered = render("static-pod-kcm");
        let pod = mount_at_host_path(
            bind_to_loopback(rewrite_host_paths(rendered.clone(), root)),
            "kubelet-pki",
        );
        let resources = host_path(&pod, "resource-dir");
        let certs = host_path(&pod, "cert-dir");
        let seed_keys = root.join("seed");
        let flags = same_flags(plane);
        let seed = tokio::task::block_in_place(|| {
            SeedApiServer::start(
                &root.join("seed-kcm"),
                &plane.etcd,
                (&seed_keys.join("sa.key"), &seed_keys.join("sa.pub")),
                &flags,
            )
        });
        let admin = seed.admin();
        let pp = PostParams::default();
        let secrets = |ns: &str| Api::<Secret>::namespaced(admin.clone(), ns);
        let config_maps = |ns: &str| Api::<ConfigMap>::namespaced(admin.clone(), ns);

        // The copies the KCM operator makes of the kube-apiserver's client CAs.
        for name in ["client-ca", "aggregator-client-ca"] {
            let source = config_maps(KS)
                .get(name)
                .await
                .unwrap_or_else(|err| panic!("{KS}/{name}: {err}"));
            config_maps(KCM_NS)
                .create(
                    &pp,
                    &ConfigMap {
                        metadata: meta(Some(KCM_NS), name),
                        data: source.data,
                        ..ConfigMap::default()
                    },
                )
                .await
                .unwrap_or_else(|err| panic!("{KCM_NS}/{name}: {err}"));
        }

        // The CSR signer chain, made eleven years ago: all expired.
        let long_ago =
            (time::OffsetDateTime::now_utc().unix_timestamp() - 11 * 365 * 86_400).to_string();
        let mut regenerate = Command::new(bin_path("cert-syncer"));
        regenerate
            .arg("regenerate")
            .args(["--server", &seed.url()])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(seed.dir.join("recovery-ca.crt"))
            .arg("--token-file")
            .arg(seed.dir.join("token"))
            .args(["--profile", "openshift-kube-controller-manager", "--once"])
            .args(["--now", &long_ago])
            .env("RUST_LOG", "warn");
        tokio::task::block_in_place(|| {
            run_checked(
                &mut regenerate,
                "regenerate --profile openshift-kube-controller-manager --once",
            );
        });
        let slept_signer = secrets(KCM_NS)
            .get("csr-signer")
            .await
            .expect("the published csr-signer");
        let slept_csr_signer = field(&slept_signer, "tls.crt");

        // Service accounts: the kubelet's bootstrap identity (OpenShift's node-bootstrapper,
        // allowed to create CSRs by the built-in `system:node-bootstrapper` role, not to have
        // them approved), and the tokens of the pod's sidecars and of the approver.
        let (bootstrap_ns, bootstrap_account) = BOOTSTRAPPER;
        let _ = Api::<Namespace>::all(admin.clone())
            .create(
                &pp,
                &Namespace {
                    metadata: meta(None, bootstrap_ns),
                    ..Namespace::default()
                },
            )
            .await;
        bound_service_account(
            &admin,
            (bootstrap_ns, bootstrap_account),
            "e2e-node-bootstrapper",
            "system:node-bootstrapper",
        )
        .await;
        let write = |path: &Path, text: &str, mode: u32| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            testkit::rename::rename_into_with_mode(path, text.as_bytes(), mode);
        };

        // The resource dir: the node files the repository ships, the recovery CA, the tokens.
        copy_tree(
            &manifests::dir()
                .join("node/etc/kubernetes/static-pod-resources/kube-controller-manager-pod-1"),
            &resources,
        );
        write(
            &resources.join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
            &plane.recovery_ca,
            0o644,
        );
        write_container_tokens(&admin, &pod, &rendered, &resources).await;
        let approver_token = root.join("etc/kubernetes/kubelet-csr-approver.token");
        write(
            &approver_token,
            &token_of(&admin, KS, APPROVER_ACCOUNT).await,
            0o600,
        );

        // The cert dir: `sync` with the pod's own lists, before the sleep.
        let sync_argv = raw_argv(&pod, KCM_SYNC);
        let lists: Vec<String> = sync_argv
            .iter()
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
            .cloned()
            .collect();
        let mut sync = Command::new(bin_path("cert-syncer"));
        sync.arg("sync")
            .args(["--server", &seed.url()])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(seed.dir.join("recovery-ca.crt"))
            .arg("--token-file")
            .arg(seed.dir.join("token"))
            .args(["--namespace", KCM_NS, "--metrics-listen", "127.0.0.1:0"])
            .arg("--destination-dir")
            .arg(&certs)
            .args(&lists)
            .env("RUST_LOG", "warn");
        let mut sync = tokio::task::block_in_place(|| ChildProcess::start(sync));
        let addr = sync.addr;
        crate::wait_until(
            "the host sync to write the kube-controller-manager's cert dir (its /readyz)",
            Duration::from_secs(60),
            || async move { crate::plain_http_get(&addr.to_string(), "/readyz").0 == 200 },
        )
        .await;
        tokio::task::block_in_place(|| sync.terminate(Duration::from_secs(10)));
        drop(sync);

        // The kubelet: a client certificate from the old csr-signer, expired with it, where the
        // kubelet keeps it; the bootstrap kubeconfig.
        let signer_key = field(&slept_signer, "tls.key");
        let old_signer = Ca::from_pems(&slept_csr_signer, &signer_key);
        let (not_before, not_after) = window(&slept_csr_signer);
        let identity = old_signer.issue(
            &CertSpec::client(&format!("system:node:{node}"))
                .organization("system:nodes")
                .valid(
                    not_before + time::Duration::hours(1),
                    not_after - time::Duration::hours(1),
                ),
        );
        let kubelet_cert_dir = host_path(&pod, "kubelet-pki");
        std::fs::create_dir_all(&kubelet_cert_dir).unwrap();
        let pair = kubelet_cert_dir.join("kubelet-client-2015-01-01-00-00-00.pem");
        write(
            &pair,
            &format!("{}{}", identity.cert_pem, identity.key_pem),
            0o600,
        );
        let current = kubelet_cert_dir.join("kubelet-client-current.pem");
        std::os::unix::fs::symlink(&pair, &current).unwrap();
        let recovery_ca_file = resources.join("configmaps/kube-apiserver-server-ca/ca-bundle.crt");
        let kubelet_kubeconfig = root.join("var/lib/kubelet/kubeconfig");
        std::fs::write(
            &kubelet_kubeconfig,
            kubeconfig(
                "https://localhost:6443",
                Some("localhost-recovery"),
                &recovery_ca_file,
                &BTreeMap::from([
                    ("client-certificate", current.display().to_string()),
                    ("client-key", current.display().to_string()),
                ]),
            ),
        )
        .unwrap();
        let bootstrap_kubeconfig = root.join("etc/kubernetes/kubeconfig-bootstrap");
        write(
            &bootstrap_kubeconfig,
            &kubeconfig(
                "https://localhost:6443",
                Some("localhost-recovery"),
                &recovery_ca_file,
                &BTreeMap::from([(
                    "token",
                    token_of(&admin, bootstrap_ns, bootstrap_account).await,
                )]),
            ),
            0o600,
        );
        let scheduler = SleptScheduler::prepare(plane, &seed, &long_ago).await;
        tokio::task::block_in_place(|| seed.stop());

        KcmPlane {
            pod,
            resources,
            certs,
            slept_csr_signer,
            kubelet_cert_dir,
            kubelet_kubeconfig,
            bootstrap_kubeconfig,
            approver_token,
            scheduler,
        }
    }

    /// The pod as the kubelet reads it (JSON, which is YAML).
    pub fn pod_manifest(&self) -> String {
        serde_json::to_string_pretty(&self.pod).expect("the pod serialises")
    }

    /// The kubelet's flags for a bootstrap after the sleep: `--bootstrap-kubeconfig`,
    /// `--rotate-certificates`, `--cert-dir`.
    pub fn kubelet_args(&self) -> Vec<String> {
        vec![
            format!(
                "--bootstrap-kubeconfig={}",
                self.bootstrap_kubeconfig.display()
            ),
            "--rotate-certificates".to_owned(),
            format!("--cert-dir={}", self.kubelet_cert_dir.display()),
        ]
    }

    /// The kubelet's client certificate on disk (`kubelet-client-current.pem`).
    pub fn kubelet_client_cert(&self) -> PathBuf {
        self.kubelet_cert_dir.join("kubelet-client-current.pem")
    }

    /// `cert-syncer approve-kubelet-csr` for `node` as a host process (the pod runs the same
    /// approver as its container [`KCM_APPROVER`]; this is for a test that runs it outside a
    /// pod), connected like the sidecars (`localhost-recovery`, the recovery CA) with its own account's token, accepting
    /// the node-bootstrapper as the bootstrap identity.
    pub fn approver_command(&self, node: &str) -> Command {
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .arg("approve-kubelet-csr")
            .args(["--server", URL])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(
                self.resources
                    .join("configmaps/kube-apiserver-server-ca/ca-bundle.crt"),
            )
            .arg("--token-file")
            .arg(&self.approver_token)
            .args(["--node-name", node])
            .arg("--kubelet-client-cert")
            .arg(self.kubelet_client_cert())
            .args(["--bootstrap-user", BOOTSTRAP_USER])
            .args(["--recheck-interval", "5s"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            );
        command
    }

    /// Turns `restart-on-change` off in the controller manager's and the scheduler's pods
    /// ([`super::pod::without_restarters`]): the baseline of the whole recovery's benchmark.
    pub fn without_restarters(&mut self) {
        self.pod = super::pod::without_restarters(self.pod.clone());
        self.scheduler.pod = super::pod::without_restarters(self.scheduler.pod.clone());
    }

    /// The cert dir file `kind/name/key`.
    pub fn cert_file(&self, relative: &str) -> PathBuf {
        self.certs.join(relative)
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
