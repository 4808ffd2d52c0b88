//! `cert-syncer regenerate --profile openshift-kube-apiserver` next to OpenShift's own
//! `cert-regeneration-controller` (the operator binary of `../shared/openshift`), on the real
//! kube-apiserver:
//!
//! - `empty_cluster_*`: ours creates the whole set; OpenShift's controller then writes nothing.
//! - `on_openshifts_pki_*`: OpenShift's controller creates its PKI; ours (expired-only) runs
//!   `E2E_OPENSHIFT_IDLE_SECS` (default 60) and writes nothing; then an expired set (every
//!   signer and target but `localhost-recovery` expired) is recovered by ours, OpenShift's
//!   controller writes nothing afterwards, and a target it issues from our signer verifies.
//! - `the_manual_trigger_*` (no operator needed): three replicas with leader election are all
//!   Ready and one acts; removing `certificate-not-after` from a signer rotates it (and in rotate
//!   mode its targets) while the bundles keep the old CA.
//! - `client_ca_*` (no operator needed): `client-ca` is exactly the union
//!   of OpenShift's seven sources in their order — a CA in none of them leaves on the next pass,
//!   a deleted `client-ca` comes back with every source's CAs, no label, expired CAs and leaves
//!   dropped.
//! - `a_dual_stack_*`: both `status.serviceNetwork` CIDRs give their host 1 in
//!   `service-network-serving-certkey`, and OpenShift's controller then writes nothing.
//! - `started_before_kube_apiserver_*` (no operator needed) and `a_grant_that_comes_after_*`:
//!   started while kube-apiserver does not answer, or while its RBAC refuses the cluster's
//!   objects (as for a moment after it starts on a woken node), ours waits, running and not
//!   ready, and creates the set once it can read them.
//!
//! Ours runs with the default `--openshift-version` (5.0); the operator binary is its `main`,
//! whose rotation is sped up 60× (12 h targets). Lifetimes are compared against 5.0's (30 d
//! targets); its controller, in RefreshOnlyWhenExpired mode, re-issues nothing that is valid
//! and its metadata is 5.0's, so the two still agree object for object.
//!
//! Writes are counted per user from the apiserver's audit log (ours and OpenShift's controller
//! have tokens of their own) and checked by resourceVersions. Skips (passing, `SKIP: <reason>`)
//! without the real kube-apiserver, and for the first two without the operator binary or
//! `kubectl` (for OpenShift's CRDs and `cluster-objects.sh`).

// Each scenario is `<scenario>::real`, as the real-apiserver variants of the other tests are
// named: .config/nextest.toml gives those a longer leash (4 × 60 s).
mod empty_cluster_ours_creates_the_set_then_openshifts_controller_writes_nothing {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::empty_cluster_ours_creates_the_set_then_openshifts_controller_writes_nothing().await;
    }
}

mod on_openshifts_pki_ours_idles_then_recovers_an_expired_set_that_openshift_accepts {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::on_openshifts_pki_ours_idles_then_recovers_an_expired_set_that_openshift_accepts()
            .await;
    }
}

mod the_manual_trigger_rotates_a_signer_and_three_replicas_are_all_ready_one_acts {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::the_manual_trigger_rotates_a_signer_and_three_replicas_are_all_ready_one_acts()
            .await;
    }
}

mod client_ca_is_the_exact_union_of_openshifts_seven_sources {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::client_ca_is_the_exact_union_of_openshifts_seven_sources().await;
    }
}

mod a_dual_stack_service_network_gives_both_ips_and_openshifts_controller_agrees {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::a_dual_stack_service_network_gives_both_ips_and_openshifts_controller_agrees().await;
    }
}

mod a_grant_that_comes_after_the_start_is_waited_for_then_the_set_is_created {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::a_grant_that_comes_after_the_start_is_waited_for_then_the_set_is_created().await;
    }
}

mod started_before_kube_apiserver_answers_it_waits_not_ready_then_creates_the_set {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::started_before_kube_apiserver_answers_it_waits_not_ready_then_creates_the_set()
            .await;
    }
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::envtest::{RealApiServer, RealOptions, User, audit_records};
use e2e::{ChildProcess, bin_path, install_crypto_provider, require_real_apiserver};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

// The profile's namespaces and objects, written once for this file and the node tier.
use e2e::node::profile_objects::{BUNDLES, CM, KS, OP, SIGNERS, TARGETS};

const OURS_TOKEN: &str = "ours-regen-token";
const THEIRS_TOKEN: &str = "theirs-regen-token";
/// A user granted nothing at first (`late.token`).
const LATE_TOKEN: &str = "late-regen-token";
const LATE_USER: &str = "late-regen";
const LEASE: &str = "cert-regeneration-controller-lock";
/// The hostnames as flags, for a cluster without OpenShift's config objects (also the
/// kube-controller-manager profile's tests').
pub(crate) const HOSTNAME_FLAGS: [&str; 6] = [
    "--service-network-ip",
    "172.30.0.1",
    "--api-hostname",
    "api.cluster.example.com",
    "--api-int-hostname",
    "api-int.cluster.example.com",
];

/// The profile as `cert-syncer` reads it from its YAML (`profiles/openshift-kube-apiserver.yaml`).
fn profile() -> cert_syncer::regenerate::config::Rotation {
    cert_syncer::regenerate::profile_objects(
        cert_syncer::regenerate::Profile::OpenshiftKubeApiserver,
    )
    .expect("the built-in profile parses")
}

/// How many objects the profile writes (its signers, bundles and targets).
fn profile_size() -> usize {
    profile().written().count()
}

/// The one object of the profile OpenShift's cert-regeneration-controller does not write (the
/// operator's resource-sync copies it in a running cluster; the profile's YAML says why).
const NOT_WRITTEN_BY_OPENSHIFT: (&str, &str) = (KS, "aggregator-client-ca");

fn secrets() -> Vec<(&'static str, &'static str)> {
    SIGNERS
        .iter()
        .map(|name| (OP, *name))
        .chain(TARGETS.iter().copied())
        .collect()
}

fn secs(var: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// `../shared/openshift` next to the checkout (or, from a worktree under `wt/`, next to its
/// parent).
fn shared_openshift() -> PathBuf {
    let root = e2e::envtest::repo_root();
    let beside = root.join("../shared/openshift");
    if beside.exists() {
        beside
    } else {
        root.join("../../shared/openshift")
    }
}

/// The operator binary: `OPENSHIFT_OPERATOR`, else what `../shared/openshift/setup` unpacks;
/// and `kubectl` for its CRDs and cluster objects.
fn operator() -> Result<PathBuf, String> {
    // Set, it must be there (relative to the repository root): a typo fails, never skips.
    let binary = match testkit::env::existing("OPENSHIFT_OPERATOR") {
        Some(path) => path,
        None => {
            let setup = shared_openshift().join("setup");
            if !setup.exists() {
                return Err(format!(
                    "no OpenShift operator binary: OPENSHIFT_OPERATOR is not set and {} does not exist",
                    setup.display()
                ));
            }
            let out = Command::new(&setup)
                .output()
                .map_err(|err| format!("{}: {err}", setup.display()))?;
            if !out.status.success() {
                return Err(format!("{} failed", setup.display()));
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
                .join("cluster-kube-apiserver-operator")
        }
    };
    if !binary.exists() {
        return Err(format!("{} does not exist", binary.display()));
    }
    match Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(out) if out.status.success() => Ok(binary),
        _ => Err("kubectl is not installed (needed for OpenShift's CRDs)".to_owned()),
    }
}

macro_rules! require_operator {
    () => {
        match operator() {
            Ok(path) => path,
            Err(reason) => {
                eprintln!("SKIP: {reason}");
                return;
            }
        }
    };
}

struct Cluster {
    api: RealApiServer,
    admin: kube::Client,
    /// A kubeconfig for OpenShift's controller (its own token).
    theirs_kubeconfig: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    async fn start(openshift_objects: bool) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let options = RealOptions {
            audit: true,
            users: vec![
                User::new(OURS_TOKEN, "ours-regen", &["system:masters"]),
                User::new(THEIRS_TOKEN, "theirs-regen", &["system:masters"]),
                // Allowed nothing until a test grants it something.
                User::new(LATE_TOKEN, LATE_USER, &[]),
            ],
            ..RealOptions::default()
        };
        let dir = tmp.path().join("api");
        let api = tokio::task::block_in_place(|| RealApiServer::start_with(&dir, &options));
        for (file, token) in [("ours.token", OURS_TOKEN), ("late.token", LATE_TOKEN)] {
            std::fs::write(dir.join(file), token).unwrap();
            std::fs::set_permissions(
                dir.join(file),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .unwrap();
        }
        let kubeconfig = |token: &str, name: &str| {
            let path = dir.join(format!("{name}.kubeconfig"));
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
                     certificate-authority: {}\n    tls-server-name: localhost-recovery\nusers:\n- name: u\n  \
                     user:\n    token: {token}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n\
                     current-context: x\n",
                    api.url(),
                    dir.join("recovery-ca.crt").display()
                ),
            )
            .unwrap();
            path
        };
        let admin_kubeconfig = kubeconfig(&api.token, "admin");
        let theirs_kubeconfig = kubeconfig(THEIRS_TOKEN, "theirs");
        let admin = api.recovery_client();
        if openshift_objects {
            let shared = shared_openshift();
            let kubectl = |args: &[&str]| {
                Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&admin_kubeconfig)
                    .args(args)
                    .output()
                    .unwrap()
            };
            let applied = kubectl(&[
                "apply",
                "-f",
                &shared.join("crds.yaml").display().to_string(),
            ]);
            assert!(applied.status.success(), "{applied:?}");
            e2e::wait_until("the CRDs served", Duration::from_secs(30), || async {
                kubectl(&["get", "kubeapiservers.operator.openshift.io"])
                    .status
                    .success()
            })
            .await;
            let objects = Command::new(shared.join("cluster-objects.sh"))
                .arg(&admin_kubeconfig)
                .output()
                .unwrap();
            assert!(objects.status.success(), "{objects:?}");
        } else {
            for ns in [KS, OP, CM] {
                api.create_namespace(ns).await;
            }
        }
        Cluster {
            api,
            admin,
            theirs_kubeconfig,
            _tmp: tmp,
        }
    }

    fn ours(&self, extra: &[&str]) -> Command {
        self.ours_with_token("ours.token", extra)
    }

    /// [`Cluster::ours`] with the token of `token_file` (in the apiserver's directory).
    fn ours_with_token(&self, token_file: &str, extra: &[&str]) -> Command {
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .arg("regenerate")
            .args(["--server", &self.api.url()])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(self.api.dir.join("recovery-ca.crt"))
            .arg("--token-file")
            .arg(self.api.dir.join(token_file))
            .args(["--profile", "openshift-kube-apiserver"])
            .args(extra)
            .env("RUST_LOG", "info");
        command
    }

    /// One pass of ours; its log.
    fn ours_once(&self, extra: &[&str]) -> String {
        let mut args = vec!["--once"];
        args.extend_from_slice(extra);
        let out = self.ours(&args).output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("[ours --once {extra:?}]\n{log}");
        assert!(out.status.success(), "ours --once failed:\n{log}");
        log
    }

    fn theirs(&self, operator: &Path, tag: &str) -> ChildProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(operator);
        command
            .arg("cert-regeneration-controller")
            .arg("--kubeconfig")
            .arg(&self.theirs_kubeconfig)
            .args(["--namespace", KS])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("OPERATOR_IMAGE_VERSION", "4.20.0")
            .env("POD_NAMESPACE", KS)
            .env("POD_NAME", format!("theirs-{tag}"));
        ChildProcess::spawn_logged(
            command,
            &self.api.dir.join(format!("theirs-{tag}.log")),
            ([127, 0, 0, 1], port).into(),
        )
        .unwrap()
    }

    fn theirs_log(&self, tag: &str) -> String {
        std::fs::read_to_string(self.api.dir.join(format!("theirs-{tag}.log"))).unwrap_or_default()
    }

    /// resourceVersion of every managed object that exists.
    async fn versions(&self) -> BTreeMap<String, String> {
        let mut versions = BTreeMap::new();
        for (ns, name) in secrets() {
            let api: Api<Secret> = Api::namespaced(self.admin.clone(), ns);
            if let Some(s) = api.get_opt(name).await.unwrap() {
                versions.insert(
                    format!("secret {ns}/{name}"),
                    s.metadata.resource_version.unwrap(),
                );
            }
        }
        for (ns, name) in BUNDLES {
            let api: Api<ConfigMap> = Api::namespaced(self.admin.clone(), ns);
            if let Some(m) = api.get_opt(name).await.unwrap() {
                versions.insert(
                    format!("configmap {ns}/{name}"),
                    m.metadata.resource_version.unwrap(),
                );
            }
        }
        versions
    }

    /// Writes to Secrets and ConfigMaps by `user`, from audit record `from` on.
    fn writes_by(&self, user: &str, from: usize) -> Vec<String> {
        audit_records(&self.api.dir.join("audit.log"))
            .into_iter()
            .skip(from)
            .filter(|r| {
                r.user == user
                    && ["create", "update", "patch", "delete"].contains(&r.verb.as_str())
                    && ["secrets", "configmaps"].contains(&r.resource.as_str())
            })
            .map(|r| {
                format!(
                    "{} {} {}/{} -> {}",
                    r.verb,
                    r.resource,
                    r.namespace.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    r.code
                )
            })
            .collect()
    }

    fn audit_len(&self) -> usize {
        audit_records(&self.api.dir.join("audit.log")).len()
    }

    /// Reads (get, list, watch) of Secrets and ConfigMaps by `user`, from audit record `from`
    /// on: (verb, resource, namespace, name).
    fn reads_by(&self, user: &str, from: usize) -> Vec<(String, String, String, Option<String>)> {
        audit_records(&self.api.dir.join("audit.log"))
            .into_iter()
            .skip(from)
            .filter(|r| {
                r.user == user
                    && ["get", "list", "watch"].contains(&r.verb.as_str())
                    && ["secrets", "configmaps"].contains(&r.resource.as_str())
            })
            .map(|r| (r.verb, r.resource, r.namespace.unwrap_or_default(), r.name))
            .collect()
    }

    fn requests_by(&self, user: &str, from: usize) -> usize {
        audit_records(&self.api.dir.join("audit.log"))
            .into_iter()
            .skip(from)
            .filter(|r| r.user == user)
            .count()
    }

    async fn secret(&self, ns: &str, name: &str) -> Secret {
        Api::<Secret>::namespaced(self.admin.clone(), ns)
            .get(name)
            .await
            .unwrap()
    }

    async fn bundle(&self, ns: &str, name: &str) -> Vec<Vec<u8>> {
        let map = Api::<ConfigMap>::namespaced(self.admin.clone(), ns)
            .get(name)
            .await
            .unwrap();
        ders(map.data.unwrap()["ca-bundle.crt"].as_bytes())
    }

    /// Who holds the Lease, if anyone.
    async fn lease_holder(&self) -> Option<String> {
        Api::<Lease>::namespaced(self.admin.clone(), KS)
            .get_opt(LEASE)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    }

    /// Waits until OpenShift's controller holds the Lease, then watches `window` more.
    async fn run_theirs_for(&self, operator: &Path, tag: &str, window: Duration) -> ChildProcess {
        let _ = Api::<Lease>::namespaced(self.admin.clone(), KS)
            .delete(LEASE, &DeleteParams::default())
            .await;
        let mut theirs = self.theirs(operator, tag);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Its identity is the host name, not POD_NAME: its own log says when it leads.
        while !(self.lease_holder().await.is_some()
            && self.theirs_log(tag).contains("Successfully acquired lease"))
        {
            assert!(
                theirs.has_exited().is_none(),
                "OpenShift's controller exited:\n{}",
                self.theirs_log(tag)
            );
            assert!(
                Instant::now() < deadline,
                "OpenShift's controller did not take the Lease:\n{}",
                self.theirs_log(tag)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(window).await;
        assert!(
            theirs.has_exited().is_none(),
            "OpenShift's controller exited:\n{}",
            self.theirs_log(tag)
        );
        theirs
    }
}

fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap().to_vec())
        .collect()
}

struct Facts {
    not_before: i64,
    not_after: i64,
    rsa_sha256: bool,
    issuer_cn: String,
    subject_cn: String,
}

fn facts(der: &[u8]) -> Facts {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let cn = |name: &x509_parser::x509::X509Name<'_>| {
        name.iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    Facts {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        rsa_sha256: cert.signature_algorithm.algorithm.to_id_string() == "1.2.840.113549.1.1.11"
            && cert.public_key().algorithm.algorithm.to_id_string() == "1.2.840.113549.1.1.1",
        issuer_cn: cn(cert.issuer()),
        subject_cn: cn(cert.subject()),
    }
}

fn issued_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (_, leaf) = x509_parser::parse_x509_certificate(leaf).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(ca).unwrap();
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

fn leaf_of(secret: &Secret) -> Vec<u8> {
    ders(&secret.data.as_ref().unwrap()["tls.crt"].0)
        .into_iter()
        .next()
        .unwrap()
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Every managed Secret holds a certificate valid now.
async fn all_valid(cluster: &Cluster) -> Result<(), String> {
    let at = now();
    for (ns, name) in secrets() {
        let api: Api<Secret> = Api::namespaced(cluster.admin.clone(), ns);
        let Some(secret) = api.get_opt(name).await.unwrap() else {
            return Err(format!("{ns}/{name} missing"));
        };
        let f = facts(&leaf_of(&secret));
        if !(f.not_before <= at && at < f.not_after) {
            return Err(format!("{ns}/{name} not valid now"));
        }
    }
    Ok(())
}

async fn empty_cluster_ours_creates_the_set_then_openshifts_controller_writes_nothing() {
    require_real_apiserver!();
    let operator = require_operator!();
    install_crypto_provider();
    let cluster = Cluster::start(true).await;

    // A flag that disagrees with networks.config.openshift.io/cluster is refused, naming both.
    let refused = cluster
        .ours(&["--once", "--service-network-ip", "10.0.0.1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{text}");
    assert!(
        text.contains("10.0.0.1") && text.contains("172.30.0.1") && text.contains("disagrees"),
        "{text}"
    );
    assert!(
        cluster.versions().await.is_empty(),
        "written before refusing"
    );

    let started = Instant::now();
    let log = cluster.ours_once(&[]);
    let created = started.elapsed();
    let versions = cluster.versions().await;
    assert_eq!(versions.len(), profile_size(), "{versions:#?}\n{log}");
    for (ns, name) in secrets() {
        let f = facts(&leaf_of(&cluster.secret(ns, name).await));
        assert!(f.rsa_sha256, "{ns}/{name} is not RSA with SHA-256");
    }
    all_valid(&cluster).await.unwrap();
    // Release 5.0's lifetimes (the default `--openshift-version`), not those of the operator
    // binary's `main` (12 h, sped up 60× for development): compared against the release.
    for (ns, name, days) in [
        (KS, "kubelet-client", 30),
        (OP, "aggregator-client-signer", 30),
        (OP, "kube-apiserver-to-kubelet-signer", 365),
        (OP, "node-system-admin-signer", 1095),
        (OP, "node-system-admin-client", 730),
    ] {
        let f = facts(&leaf_of(&cluster.secret(ns, name).await));
        assert_eq!(
            f.not_after - f.not_before,
            days * 86_400 + 300,
            "{ns}/{name}"
        );
    }
    let refresh = |secret: &Secret| {
        secret.metadata.annotations.as_ref().unwrap()["certificates.openshift.io/refresh-period"]
            .clone()
    };
    assert_eq!(
        refresh(&cluster.secret(KS, "kubelet-client").await),
        "360h0m0s"
    );
    assert_eq!(
        refresh(&cluster.secret(OP, "kube-apiserver-to-kubelet-signer").await),
        "7008h0m0s"
    );
    eprintln!(
        "ours created the set of {} objects in {created:?}",
        versions.len()
    );

    let from = cluster.audit_len();
    let window = secs("E2E_OPENSHIFT_SETTLE_SECS", 20);
    let theirs = cluster.run_theirs_for(&operator, "a", window).await;
    let writes = cluster.writes_by("theirs-regen", from);
    let after = cluster.versions().await;
    eprintln!(
        "OpenShift's controller, {window:?} after taking the Lease: {} requests, writes {writes:#?}",
        cluster.requests_by("theirs-regen", from)
    );
    assert!(
        writes.is_empty(),
        "OpenShift's controller wrote: {writes:#?}"
    );
    assert_eq!(after, versions, "resourceVersions changed");
    drop(theirs);
}

async fn on_openshifts_pki_ours_idles_then_recovers_an_expired_set_that_openshift_accepts() {
    require_real_apiserver!();
    let operator = require_operator!();
    install_crypto_provider();
    let cluster = Cluster::start(true).await;

    // 1. OpenShift's controller creates its PKI (every object of the profile but
    //    NOT_WRITTEN_BY_OPENSHIFT), settled for 5 s.
    let theirs_size = profile_size() - 1;
    let mut theirs = cluster.theirs(&operator, "create");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut stable_since = Instant::now();
    let mut last = BTreeMap::new();
    loop {
        let versions = cluster.versions().await;
        if versions != last {
            last = versions;
            stable_since = Instant::now();
        } else if last.len() == theirs_size && stable_since.elapsed() > Duration::from_secs(5) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "OpenShift's controller did not settle: {} objects\n{}",
            last.len(),
            cluster.theirs_log("create")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    theirs.kill();
    // Killed without releasing its Lease: free it, as its lease duration would.
    Api::<Lease>::namespaced(cluster.admin.clone(), KS)
        .delete(LEASE, &DeleteParams::default())
        .await
        .unwrap();
    // What the operator's resource-sync does in a cluster: the aggregator CA copy.
    let source = Api::<ConfigMap>::namespaced(cluster.admin.clone(), CM)
        .get("kube-apiserver-aggregator-client-ca")
        .await
        .unwrap();
    let copy = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(NOT_WRITTEN_BY_OPENSHIFT.1.into()),
            annotations: Some(BTreeMap::from([(
                "openshift.io/owning-component".to_owned(),
                "kube-apiserver".to_owned(),
            )])),
            ..Default::default()
        },
        data: source.data,
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(cluster.admin.clone(), NOT_WRITTEN_BY_OPENSHIFT.0)
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
    let recovery: Vec<Secret> = vec![
        cluster
            .secret(OP, "localhost-recovery-serving-signer")
            .await,
        cluster
            .secret(KS, "localhost-recovery-serving-certkey")
            .await,
    ];
    let recovery_bundle = Api::<ConfigMap>::namespaced(cluster.admin.clone(), OP)
        .get("localhost-recovery-serving-ca")
        .await
        .unwrap();

    // 2. Ours, expired-only, as the static pod runs it: not one write.
    let versions = cluster.versions().await;
    assert_eq!(versions.len(), profile_size());
    let from = cluster.audit_len();
    let idle = secs("E2E_OPENSHIFT_IDLE_SECS", 60);
    let mut ours = ChildProcess::start(cluster.ours(&[
        "--mode",
        "expired-only",
        "--leader-elect",
        "--leader-elect-namespace",
        KS,
        "--metrics-listen",
        "127.0.0.1:0",
    ]));
    tokio::time::sleep(idle).await;
    let writes = cluster.writes_by("ours-regen", from);
    let requests = cluster.requests_by("ours-regen", from);
    ours.terminate(Duration::from_secs(10));
    let log = ours.stderr_text();
    eprintln!("ours on OpenShift's PKI for {idle:?}: {requests} requests, writes {writes:#?}");
    assert!(log.contains("became leader"), "{log}");
    assert!(writes.is_empty(), "ours wrote: {writes:#?}\n{log}");
    assert_eq!(
        cluster.versions().await,
        versions,
        "resourceVersions changed"
    );
    // Reads by name only (the token cannot list the other Secrets of these
    // namespaces): one list and one watch at a time per declared object, a `metadata.name`
    // field selector each; no GET per object per pass (the apiserver's clock comes from
    // /version), no list or watch of a whole namespace.
    let reads = cluster.reads_by("ours-regen", from);
    let count = |verb: &str| reads.iter().filter(|r| r.0 == verb).count();
    let rotation = cert_syncer::regenerate::profile_objects(
        cert_syncer::regenerate::Profile::OpenshiftKubeApiserver,
    )
    .unwrap();
    let declared: std::collections::BTreeSet<(String, String, String)> = rotation
        .objects()
        .map(|(kind, o)| {
            (
                kind.plural().to_owned(),
                o.namespace.clone(),
                o.name.clone(),
            )
        })
        .collect();
    let watched: std::collections::BTreeSet<(String, String, String)> = reads
        .iter()
        .filter(|r| r.0 == "watch")
        .map(|r| (r.1.clone(), r.2.clone(), r.3.clone().unwrap_or_default()))
        .collect();
    // Each watch asks to end after 60 s (two thirds of the 90 s read idle timeout) and is
    // resumed: one request per object per minute, plus the first.
    let watches_allowed = declared.len() * (idle.as_secs() as usize / 60 + 2);
    eprintln!(
        "ours' reads on OpenShift's PKI in {idle:?}: {} lists, {} watches of {} objects, {} gets",
        count("list"),
        count("watch"),
        watched.len(),
        count("get")
    );
    assert!(
        reads.iter().all(|r| r.3.is_some()),
        "a list or watch of a whole namespace: {reads:#?}"
    );
    assert_eq!(watched, declared, "one watch per declared object");
    assert_eq!(
        count("list"),
        declared.len(),
        "one list per declared object: {reads:#?}"
    );
    assert!(
        count("watch") <= watches_allowed,
        "{} watches, at most {watches_allowed} expected: {reads:#?}",
        count("watch")
    );
    assert_eq!(count("get"), 0, "a GET per object: {reads:#?}");

    // 3. The expired set: everything made eleven years ago by ours, then the valid
    //    localhost-recovery objects OpenShift made put back.
    for (ns, name) in secrets() {
        let _ = Api::<Secret>::namespaced(cluster.admin.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await;
    }
    for (ns, name) in BUNDLES {
        let _ = Api::<ConfigMap>::namespaced(cluster.admin.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await;
    }
    let long_ago = (now() - 11 * 365 * 86_400).to_string();
    cluster.ours_once(&["--now", &long_ago]);
    for mut secret in recovery {
        let ns = secret.metadata.namespace.clone().unwrap();
        let name = secret.metadata.name.clone().unwrap();
        let current = cluster.secret(&ns, &name).await;
        secret.metadata.resource_version = current.metadata.resource_version;
        secret.metadata.uid = current.metadata.uid;
        Api::<Secret>::namespaced(cluster.admin.clone(), &ns)
            .replace(&name, &PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let mut bundle = recovery_bundle;
    let current = Api::<ConfigMap>::namespaced(cluster.admin.clone(), OP)
        .get("localhost-recovery-serving-ca")
        .await
        .unwrap();
    bundle.metadata.resource_version = current.metadata.resource_version;
    bundle.metadata.uid = current.metadata.uid;
    Api::<ConfigMap>::namespaced(cluster.admin.clone(), OP)
        .replace(
            "localhost-recovery-serving-ca",
            &PostParams::default(),
            &bundle,
        )
        .await
        .unwrap();
    let at = now();
    for (ns, name) in secrets() {
        let f = facts(&leaf_of(&cluster.secret(ns, name).await));
        assert_eq!(
            f.not_after < at,
            !name.starts_with("localhost-recovery"),
            "{ns}/{name}"
        );
    }

    // 4. Ours recovers it (two passes: the second prunes the expired CAs once the leaves are
    //    re-issued, as a running controller does on its own writes' watch events).
    let from = cluster.audit_len();
    let started = Instant::now();
    cluster.ours_once(&[]);
    let first_pass = started.elapsed();
    cluster.ours_once(&[]);
    let recovered = started.elapsed();
    all_valid(&cluster).await.unwrap();
    let writes = cluster.writes_by("ours-regen", from);
    eprintln!(
        "ours recovered the expired set: all valid after the first pass {first_pass:?}, both \
         passes {recovered:?}; {} writes, {} requests",
        writes.len(),
        cluster.requests_by("ours-regen", from)
    );
    for (ns, name) in BUNDLES {
        for der in cluster.bundle(ns, name).await {
            assert!(
                facts(&der).not_after > now(),
                "{ns}/{name} keeps an expired CA"
            );
        }
    }

    // 5. OpenShift's controller on what ours recovered: nothing to write.
    let versions = cluster.versions().await;
    let from = cluster.audit_len();
    let window = secs("E2E_OPENSHIFT_SETTLE_SECS", 20);
    let theirs = cluster.run_theirs_for(&operator, "after", window).await;
    let writes = cluster.writes_by("theirs-regen", from);
    eprintln!("OpenShift's controller after our recovery: writes {writes:#?}");
    assert!(
        writes.is_empty(),
        "OpenShift's controller wrote: {writes:#?}\n{}",
        cluster.theirs_log("after")
    );
    assert_eq!(cluster.versions().await, versions);

    // 6. library-go issues from our signer: the kubelet client certificate deleted, OpenShift's
    //    controller re-issues it from the signer ours made, and it verifies.
    let signer = cluster.secret(OP, "kube-apiserver-to-kubelet-signer").await;
    Api::<Secret>::namespaced(cluster.admin.clone(), KS)
        .delete("kubelet-client", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let issued = loop {
        if let Some(secret) = Api::<Secret>::namespaced(cluster.admin.clone(), KS)
            .get_opt("kubelet-client")
            .await
            .unwrap()
        {
            break secret;
        }
        assert!(
            Instant::now() < deadline,
            "OpenShift's controller did not re-issue kubelet-client:\n{}",
            cluster.theirs_log("after")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(theirs);
    let leaf = leaf_of(&issued);
    let ca = leaf_of(&signer);
    assert!(
        issued_by(&leaf, &ca),
        "the leaf does not verify with our signer"
    );
    let f = facts(&leaf);
    assert!(f.rsa_sha256);
    assert_eq!(f.issuer_cn, facts(&ca).subject_cn);
    assert_eq!(f.subject_cn, "system:kube-apiserver");
    assert_eq!(
        cluster
            .secret(OP, "kube-apiserver-to-kubelet-signer")
            .await
            .metadata
            .resource_version,
        signer.metadata.resource_version,
        "the signer was replaced instead of used"
    );
}

async fn readyz(addr: std::net::SocketAddr) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let _ = tcp
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut text = String::new();
    let _ = tcp.read_to_string(&mut text).await;
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

async fn the_manual_trigger_rotates_a_signer_and_three_replicas_are_all_ready_one_acts() {
    require_real_apiserver!();
    install_crypto_provider();
    let cluster = Cluster::start(false).await;

    // Three replicas with leader election: all Ready, one acts.
    let mut replicas: Vec<ChildProcess> = (0..3)
        .map(|i| {
            let mut args = vec![
                "--leader-elect",
                "--leader-elect-namespace",
                KS,
                "--leader-elect-lease-duration",
                "5s",
                "--leader-elect-renew-deadline",
                "4s",
                "--leader-elect-retry-period",
                "1s",
                "--metrics-listen",
                "127.0.0.1:0",
            ];
            args.extend_from_slice(&HOSTNAME_FLAGS);
            let mut command = cluster.ours(&args);
            command.env("POD_NAME", format!("replica-{i}"));
            ChildProcess::start(command)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut codes = Vec::new();
        for replica in &replicas {
            codes.push(readyz(replica.addr).await);
        }
        if codes.iter().all(|c| *c == 200) && cluster.versions().await.len() == profile_size() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readiness {codes:?}:\n{}",
            replicas
                .iter()
                .map(|c| c.stderr_text())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs: Vec<String> = replicas.iter().map(|c| c.stderr_text()).collect();
    let leaders = logs.iter().filter(|l| l.contains("became leader")).count();
    let actors = logs.iter().filter(|l| l.contains("regenerated")).count();
    assert_eq!((leaders, actors), (1, 1), "{logs:#?}");
    for replica in &mut replicas {
        replica.terminate(Duration::from_secs(10));
    }

    // The manual trigger, rotate mode: kube-apiserver-to-kubelet-signer loses its not-after.
    let secrets_op: Api<Secret> = Api::namespaced(cluster.admin.clone(), OP);
    let old_signer = cluster.secret(OP, "kube-apiserver-to-kubelet-signer").await;
    let old_ca = leaf_of(&old_signer);
    let old_client = leaf_of(&cluster.secret(KS, "kubelet-client").await);
    let mut edited = old_signer.clone();
    edited
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("auth.openshift.io/certificate-not-after");
    secrets_op
        .replace(
            "kube-apiserver-to-kubelet-signer",
            &PostParams::default(),
            &edited,
        )
        .await
        .unwrap();
    let before = cluster.versions().await;
    let mut args = vec!["--mode", "rotate"];
    args.extend_from_slice(&HOSTNAME_FLAGS);
    let log = cluster.ours_once(&args);
    assert!(log.contains("certificate-not-after missing"), "{log}");
    let new_ca = leaf_of(&cluster.secret(OP, "kube-apiserver-to-kubelet-signer").await);
    assert_ne!(new_ca, old_ca, "the signer was not regenerated");
    for (ns, name) in [
        (OP, "kube-apiserver-to-kubelet-client-ca"),
        (KS, "client-ca"),
    ] {
        let bundle = cluster.bundle(ns, name).await;
        assert!(
            bundle.contains(&old_ca) && bundle.contains(&new_ca),
            "{ns}/{name} must keep the old CA and add the new one"
        );
    }
    let new_client = leaf_of(&cluster.secret(KS, "kubelet-client").await);
    assert_ne!(new_client, old_client);
    assert!(issued_by(&new_client, &new_ca));
    let after = cluster.versions().await;
    let changed: Vec<&String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        changed,
        [
            "configmap openshift-kube-apiserver-operator/kube-apiserver-to-kubelet-client-ca",
            "configmap openshift-kube-apiserver/client-ca",
            "secret openshift-kube-apiserver-operator/kube-apiserver-to-kubelet-signer",
            "secret openshift-kube-apiserver/kubelet-client",
        ],
        "{log}"
    );

    // Expired-only mode decides as library-go's RefreshOnlyWhenExpired: the signer and its
    // bundles, not its (valid) targets.
    let old_signer = cluster.secret(OP, "node-system-admin-signer").await;
    let old_client = leaf_of(&cluster.secret(OP, "node-system-admin-client").await);
    let mut edited = old_signer.clone();
    edited
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("auth.openshift.io/certificate-not-after");
    secrets_op
        .replace("node-system-admin-signer", &PostParams::default(), &edited)
        .await
        .unwrap();
    cluster.ours_once(&HOSTNAME_FLAGS);
    let new_ca = leaf_of(&cluster.secret(OP, "node-system-admin-signer").await);
    assert_ne!(new_ca, leaf_of(&old_signer));
    assert!(
        cluster
            .bundle(OP, "node-system-admin-ca")
            .await
            .contains(&new_ca)
    );
    assert_eq!(
        leaf_of(&cluster.secret(OP, "node-system-admin-client").await),
        old_client,
        "expired-only mode re-issued a valid target"
    );
    // And nothing more to do after that.
    let settled = cluster.versions().await;
    cluster.ours_once(&HOSTNAME_FLAGS);
    assert_eq!(cluster.versions().await, settled);
}

/// A ConfigMap `ns/name` whose `ca-bundle.crt` is `pem`.
/// On a woken node the controller starts with kube-apiserver, before that answers: it waits,
/// not ready and saying why, instead of exiting into the kubelet's crash-loop backoff, and
/// creates the set once kube-apiserver answers.
/// Waits until `ours` has logged each of `logged` (its wait for the cluster's values), then
/// checks that it keeps running, not ready, through three retries (0.5 s, 1 s, 2 s).
async fn assert_waiting_not_ready(ours: &mut ChildProcess, logged: &[&str]) {
    e2e::wait_until("the wait logged", Duration::from_secs(20), || {
        let log = ours.stderr_text();
        let waiting = logged.iter().all(|line| log.contains(line));
        async move { waiting }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        ours.has_exited(),
        None,
        "it exited:\n{}",
        ours.stderr_text()
    );
    assert_eq!(readyz(ours.addr).await, 503);
}

/// Waits (60 s) until `ours` is ready and the whole set exists, `after` what.
async fn wait_ready_with_the_set(cluster: &Cluster, ours: &ChildProcess, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(readyz(ours.addr).await == 200 && cluster.versions().await.len() == profile_size()) {
        assert!(
            Instant::now() < deadline,
            "the set was not created after {after}:\n{}",
            ours.stderr_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        ours.stderr_text().contains("the cluster's values are read"),
        "{}",
        ours.stderr_text()
    );
}

async fn started_before_kube_apiserver_answers_it_waits_not_ready_then_creates_the_set() {
    require_real_apiserver!();
    install_crypto_provider();
    let mut cluster = Cluster::start(false).await;
    tokio::task::block_in_place(|| cluster.api.kill_apiserver());
    let mut args = vec!["--metrics-listen", "127.0.0.1:0"];
    args.extend_from_slice(&HOSTNAME_FLAGS);
    let mut ours = ChildProcess::start(cluster.ours(&args));
    assert_waiting_not_ready(&mut ours, &["the cluster's values cannot be read yet"]).await;

    tokio::task::block_in_place(|| cluster.api.restart());
    wait_ready_with_the_set(&cluster, &ours, "kube-apiserver came back").await;
    ours.terminate(Duration::from_secs(10));
}

/// Right after kube-apiserver answers, its authorizer refuses what RBAC allows a moment later
/// (seen on the node: the pod's controller got 403 on `networks.config.openshift.io/cluster`,
/// had no hostnames and exited, and the kubelet restarted it). With no hostname flags, a 403 on
/// the cluster's objects keeps the controller waiting, not ready and saying why; once the
/// grant is there it reads OpenShift's objects and creates the set.
async fn a_grant_that_comes_after_the_start_is_waited_for_then_the_set_is_created() {
    require_real_apiserver!();
    let _operator = require_operator!();
    install_crypto_provider();
    let cluster = Cluster::start(true).await;
    let mut ours = ChildProcess::start(
        cluster.ours_with_token("late.token", &["--metrics-listen", "127.0.0.1:0"]),
    );
    let waiting = [
        "the cluster's values cannot be read yet",
        "not allowed (403)",
    ];
    assert_waiting_not_ready(&mut ours, &waiting).await;
    assert!(cluster.versions().await.is_empty(), "written while waiting");

    let late = e2e::rbac::subject("User", LATE_USER, None);
    e2e::rbac::bind_cluster_role(&cluster.admin, LATE_USER, "cluster-admin", vec![late]).await;
    wait_ready_with_the_set(&cluster, &ours, "the grant").await;
    // The hostnames are OpenShift's objects', not flags' (there are none).
    let serving = leaf_of(&cluster.secret(KS, "service-network-serving-certkey").await);
    assert!(
        ip_sans(&serving).contains(&"172.30.0.1".parse().unwrap()),
        "{:?}",
        ip_sans(&serving)
    );
    ours.terminate(Duration::from_secs(10));
}

async fn put_bundle(cluster: &Cluster, ns: &str, name: &str, pem: &str) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), ns);
    let map = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("ca-bundle.crt".into(), pem.into())])),
        ..Default::default()
    };
    match api.get_opt(name).await.unwrap() {
        None => {
            api.create(&PostParams::default(), &map).await.unwrap();
        }
        Some(existing) => {
            let mut map = map;
            map.metadata.resource_version = existing.metadata.resource_version;
            api.replace(name, &PostParams::default(), &map)
                .await
                .unwrap();
        }
    }
}

async fn client_ca_is_the_exact_union_of_openshifts_seven_sources() {
    require_real_apiserver!();
    install_crypto_provider();
    let cluster = Cluster::start(false).await;
    cluster.api.create_namespace("openshift-config").await;
    // The four sources of other components, as the installer and the kube-controller-manager
    // leave them: one CA each; the user's bundle also holds a leaf, the bootstrap bundle also
    // an expired CA. Neither may reach client-ca.
    let admin = testkit::pki::Ca::new("admin-kubeconfig-signer");
    let csr = testkit::pki::Ca::new("kube-csr-signer_@1");
    let user = testkit::pki::Ca::new("user-client-signer");
    let bootstrap = testkit::pki::Ca::new("kubelet-bootstrap-kubeconfig-signer");
    let now_utc = time::OffsetDateTime::now_utc();
    let expired = testkit::pki::Ca::root(
        "expired-bootstrap-signer",
        now_utc - time::Duration::days(400),
        now_utc - time::Duration::days(1),
    );
    let user_leaf = user.leaf(&["not-a-ca.example.com"], 30);
    put_bundle(
        &cluster,
        "openshift-config",
        "admin-kubeconfig-client-ca",
        &admin.cert_pem,
    )
    .await;
    put_bundle(&cluster, CM, "csr-controller-ca", &csr.cert_pem).await;
    put_bundle(
        &cluster,
        KS,
        "user-client-ca",
        &format!("{}{}", user.cert_pem, user_leaf.cert_pem),
    )
    .await;
    put_bundle(
        &cluster,
        CM,
        "kubelet-bootstrap-kubeconfig",
        &format!("{}{}", expired.cert_pem, bootstrap.cert_pem),
    )
    .await;

    let log = cluster.ours_once(&HOSTNAME_FLAGS);
    // What OpenShift's ManageClientCABundle makes of the seven sources, in their order.
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for (ns, name) in [
        ("openshift-config", "admin-kubeconfig-client-ca"),
        (CM, "csr-controller-ca"),
        (OP, "kube-apiserver-to-kubelet-client-ca"),
        (OP, "kube-control-plane-signer-ca"),
        (KS, "user-client-ca"),
        (CM, "kubelet-bootstrap-kubeconfig"),
        (OP, "node-system-admin-ca"),
    ] {
        for der in cluster.bundle(ns, name).await {
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            let valid = cert.validity().not_after.timestamp() > now();
            if cert.is_ca() && valid && !expected.contains(&der) {
                expected.push(der);
            }
        }
    }
    assert_eq!(expected.len(), 7, "one CA per source");
    let client_ca = || async {
        Api::<ConfigMap>::namespaced(cluster.admin.clone(), KS)
            .get("client-ca")
            .await
            .unwrap()
    };
    let map = client_ca().await;
    assert_eq!(
        cluster.bundle(KS, "client-ca").await,
        expected,
        "client-ca is not the union of the seven sources in their order\n{log}"
    );
    assert!(
        map.metadata.labels.unwrap_or_default().is_empty(),
        "client-ca carries a label"
    );
    assert_eq!(
        map.metadata.annotations.unwrap_or_default()["openshift.io/owning-component"],
        "kube-apiserver"
    );
    let leaf_der = ders(user_leaf.cert_pem.as_bytes()).remove(0);
    assert!(!cluster.bundle(KS, "client-ca").await.contains(&leaf_der));

    // A CA in none of the seven sources leaves on the next pass (no sticky members).
    let foreign = testkit::pki::Ca::new("foreign-ca");
    let current = client_ca().await.data.unwrap()["ca-bundle.crt"].clone();
    put_bundle(
        &cluster,
        KS,
        "client-ca",
        &format!("{current}{}", foreign.cert_pem),
    )
    .await;
    assert_eq!(cluster.bundle(KS, "client-ca").await.len(), 8);
    let log = cluster.ours_once(&HOSTNAME_FLAGS);
    assert_eq!(
        cluster.bundle(KS, "client-ca").await,
        expected,
        "the foreign CA stayed in client-ca\n{log}"
    );
    assert!(log.contains("ca-removed"), "{log}");

    // A CA that left its source leaves client-ca too.
    put_bundle(&cluster, KS, "user-client-ca", "").await;
    cluster.ours_once(&HOSTNAME_FLAGS);
    let user_der = ders(user.cert_pem.as_bytes()).remove(0);
    let without_user: Vec<Vec<u8>> = expected
        .iter()
        .filter(|d| **d != user_der)
        .cloned()
        .collect();
    assert_eq!(cluster.bundle(KS, "client-ca").await, without_user);
    put_bundle(&cluster, KS, "user-client-ca", &user.cert_pem).await;

    // A deleted client-ca is recreated with every source's CAs, without a label.
    Api::<ConfigMap>::namespaced(cluster.admin.clone(), KS)
        .delete("client-ca", &DeleteParams::default())
        .await
        .unwrap();
    let log = cluster.ours_once(&HOSTNAME_FLAGS);
    assert_eq!(
        cluster.bundle(KS, "client-ca").await,
        expected,
        "the recreated client-ca lacks a source's CA\n{log}"
    );
    assert!(
        client_ca()
            .await
            .metadata
            .labels
            .unwrap_or_default()
            .is_empty()
    );

    // Settled: a further pass writes nothing.
    let version = client_ca().await.metadata.resource_version;
    cluster.ours_once(&HOSTNAME_FLAGS);
    assert_eq!(client_ca().await.metadata.resource_version, version);
}

/// The IP addresses among a certificate's subjectAltNames.
fn ip_sans(der: &[u8]) -> Vec<std::net::IpAddr> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => Some(std::net::IpAddr::from(<[u8; 4]>::try_from(*bytes).unwrap())),
                16 => Some(std::net::IpAddr::from(
                    <[u8; 16]>::try_from(*bytes).unwrap(),
                )),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

async fn a_dual_stack_service_network_gives_both_ips_and_openshifts_controller_agrees() {
    require_real_apiserver!();
    let operator = require_operator!();
    install_crypto_provider();
    let cluster = Cluster::start(true).await;
    // networks.config.openshift.io/cluster, dual-stack.
    let resource = kube::api::ApiResource {
        group: "config.openshift.io".into(),
        version: "v1".into(),
        api_version: "config.openshift.io/v1".into(),
        kind: "Network".into(),
        plural: "networks".into(),
    };
    let networks: Api<kube::api::DynamicObject> = Api::all_with(cluster.admin.clone(), &resource);
    networks
        .patch_status(
            "cluster",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "status": { "serviceNetwork": ["172.30.0.0/16", "fd02::/112"] }
            })),
        )
        .await
        .unwrap();

    let log = cluster.ours_once(&[]);
    let serving = leaf_of(&cluster.secret(KS, "service-network-serving-certkey").await);
    let ips = ip_sans(&serving);
    for ip in ["172.30.0.1", "fd02::1"] {
        assert!(
            ips.contains(&ip.parse().unwrap()),
            "{ip} is not in service-network-serving-certkey: {ips:?}\n{log}"
        );
    }
    // 5.0's lifetime, not the operator main's 12 h: 30 days (plus the 5 minute backdate).
    let f = facts(&serving);
    assert_eq!(f.not_after - f.not_before, 30 * 86_400 + 300);

    // OpenShift's controller computes the same hostnames from the same object: it re-issues
    // nothing (with the first CIDR only, it re-issued this certificate, and ours then again).
    let versions = cluster.versions().await;
    let from = cluster.audit_len();
    let window = secs("E2E_OPENSHIFT_SETTLE_SECS", 20);
    let theirs = cluster.run_theirs_for(&operator, "dual", window).await;
    let writes = cluster.writes_by("theirs-regen", from);
    assert!(
        writes.is_empty(),
        "OpenShift's controller wrote: {writes:#?}\n{}",
        cluster.theirs_log("dual")
    );
    assert_eq!(
        cluster.versions().await,
        versions,
        "resourceVersions changed"
    );
    drop(theirs);

    // An empty list is refused, as the operator refuses it, before anything is written.
    networks
        .patch_status(
            "cluster",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "status": { "serviceNetwork": [] } })),
        )
        .await
        .unwrap();
    let refused = cluster.ours(&["--once"]).output().unwrap();
    let text = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{text}");
    assert!(text.contains("status.serviceNetwork is empty"), "{text}");
}

/// (namespace, name) pairs as a set.
fn named<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> std::collections::BTreeSet<(String, String)> {
    pairs
        .into_iter()
        .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
        .collect()
}

/// The object lists these tests and the node tier check by name (`e2e::node::profile_objects`)
/// are the profile's YAML as `cert-syncer` reads it: every signer, bundle and target, no more.
#[test]
fn the_object_lists_the_tests_check_are_the_profiles_yaml() {
    use cert_syncer::kind::Kind;
    let rotation = profile();
    let written = |kind: Kind| {
        named(
            rotation
                .written()
                .filter(|(k, _)| *k == kind)
                .map(|(_, o)| (o.namespace.as_str(), o.name.as_str())),
        )
    };
    assert_eq!(named(secrets()), written(Kind::Secret));
    assert_eq!(named(BUNDLES), written(Kind::ConfigMap));
    assert_eq!(
        named(SIGNERS.iter().map(|name| (OP, *name))),
        named(
            rotation
                .signers
                .iter()
                .map(|s| (s.object.namespace.as_str(), s.object.name.as_str()))
        )
    );
    assert!(
        written(Kind::ConfigMap).contains(&(
            NOT_WRITTEN_BY_OPENSHIFT.0.to_owned(),
            NOT_WRITTEN_BY_OPENSHIFT.1.to_owned()
        )),
        "{NOT_WRITTEN_BY_OPENSHIFT:?} is not in the profile"
    );
}
