//! The kube-controller-manager's half of the recovery on the real
//! kube-apiserver: `cert-syncer regenerate --profile openshift-kube-controller-manager` and the
//! same set in namespaces of its own (the profile's text with other namespaces and delays), one
//! namespace set per scenario on one shared apiserver:
//!
//! 1. Empty cluster, the profile as the static pod runs it — as its service account, with
//!    exactly the Roles of `manifests/rbac/` applied (the real RBAC authorizer decides), with
//!    leader election and Events, after and before the kube-apiserver's profile (which folds
//!    the copied `csr-controller-ca` into its `client-ca`): the whole set is created, the
//!    intermediate `csr-signer` is a CA issued by `csr-signer-signer`, its published copy holds
//!    it alone, and a client certificate issued from the published CA (by the testkit, as the
//!    kube-controller-manager's CSR signer would) is authenticated by the real kube-apiserver
//!    once that `client-ca` is its client CA file (and refused before); then zero writes,
//!    once and over a window of the running controller (resourceVersions unchanged).
//! 2. Expired set (signer of the signer, intermediate and published copy all expired): recovered
//!    in one pass, the published copy replaced at once despite the 5-minute delay.
//! 3. Rotate mode, a valid published copy: the manual trigger gives a new intermediate at once;
//!    its publication waits for the delay (8 s here); the old CA stays in the bundles.
//!
//! Skips (passing, `SKIP: <reason>`) without the real kube-apiserver.

// `<scenario>::real`, as the real-apiserver variants of the other tests are named:
// .config/nextest.toml gives those a longer leash (4 × 60 s).
mod the_kcm_chain_is_created_recovered_left_alone_and_published_after_the_delay {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::scenarios().await;
    }
}

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::envtest::{RealApiServer, RealOptions, User, create_namespace};
use e2e::{ChildProcess, bin_path, install_crypto_provider, require_real_apiserver};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use testkit::files::rename_into;
use testkit::pki::{Ca, CertSpec};

const OP: &str = "openshift-kube-controller-manager-operator";
const KCM: &str = "openshift-kube-controller-manager";
const CM: &str = "openshift-config-managed";
const KAS: &str = "openshift-kube-apiserver";
const KAS_OP: &str = "openshift-kube-apiserver-operator";
/// The recovery controller's service account (`manifests/rbac/kube-controller-manager.yaml`).
const SA_TOKEN: &str = "kcm-recovery-token";

/// The profile's text, for the variants in namespaces of their own.
fn profile_text() -> String {
    let path = e2e::envtest::repo_root()
        .join("cert-syncer/src/regenerate/profiles/openshift-kube-controller-manager.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// One scenario's namespaces (the profile's three, renamed).
struct Set {
    op: String,
    kcm: String,
    managed: String,
}

impl Set {
    fn profile() -> Set {
        Set {
            op: OP.into(),
            kcm: KCM.into(),
            managed: CM.into(),
        }
    }

    fn named(prefix: &str) -> Set {
        Set {
            op: format!("{prefix}-op"),
            kcm: format!("{prefix}-kcm"),
            managed: format!("{prefix}-managed"),
        }
    }

    /// The profile's text in this set's namespaces, with `replace` applied.
    fn config(&self, replace: &[(&str, &str)]) -> String {
        let mut text = profile_text()
            .replace(OP, "@OP@")
            .replace(KCM, &self.kcm)
            .replace("@OP@", &self.op)
            .replace(CM, &self.managed);
        for (from, to) in replace {
            assert!(text.contains(from), "{from:?} in the profile");
            text = text.replace(from, to);
        }
        text
    }

    /// Every object the set writes: (kind, namespace, name).
    fn written(&self) -> Vec<(&'static str, String, &'static str)> {
        vec![
            ("secret", self.op.clone(), "csr-signer-signer"),
            ("configmap", self.op.clone(), "csr-controller-signer-ca"),
            ("secret", self.op.clone(), "csr-signer"),
            ("configmap", self.op.clone(), "csr-signer-ca"),
            ("configmap", self.op.clone(), "csr-controller-ca"),
            ("secret", self.kcm.clone(), "csr-signer"),
            ("configmap", self.managed.clone(), "csr-controller-ca"),
        ]
    }
}

struct Cluster {
    api: RealApiServer,
    admin: kube::Client,
    dir: PathBuf,
}

impl Cluster {
    async fn namespaces(&self, set: &Set) {
        for ns in [&set.op, &set.kcm, &set.managed] {
            create_namespace(&self.admin, ns).await;
        }
    }

    /// `cert-syncer regenerate` over the recovery connection, with the admin token.
    fn ours(&self, extra: &[&str]) -> Command {
        self.ours_as(&self.api.dir.join("token"), extra)
    }

    /// `cert-syncer regenerate` as the static pod's service account (its Roles from
    /// `manifests/rbac/`), in the pod's namespace.
    fn ours_as_the_pod(&self, extra: &[&str]) -> Command {
        let mut command = self.ours_as(&self.dir.join("sa.token"), extra);
        command
            .env("POD_NAME", "kube-controller-manager-node-1")
            .env("POD_NAMESPACE", KCM);
        command
    }

    fn ours_as(&self, token_file: &std::path::Path, extra: &[&str]) -> Command {
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .arg("regenerate")
            .args(["--server", &self.api.url()])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(self.api.dir.join("recovery-ca.crt"))
            .arg("--token-file")
            .arg(token_file)
            .args(extra)
            .env("RUST_LOG", "info");
        command
    }

    fn once(&self, extra: &[&str]) -> String {
        self.run_once(self.ours(&["--once"]), extra)
    }

    fn run_once(&self, mut command: Command, extra: &[&str]) -> String {
        let out = command.args(extra).output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("[regenerate --once {extra:?}]\n{log}");
        assert!(out.status.success(), "regenerate --once failed:\n{log}");
        log
    }

    /// A config file for `set`.
    fn config_file(&self, set: &Set, replace: &[(&str, &str)]) -> PathBuf {
        let path = self.dir.join(format!("{}.yaml", set.op));
        rename_into(&path, set.config(replace).as_bytes());
        path
    }

    async fn secret(&self, ns: &str, name: &str) -> Secret {
        Api::<Secret>::namespaced(self.admin.clone(), ns)
            .get(name)
            .await
            .unwrap_or_else(|err| panic!("secret {ns}/{name}: {err}"))
    }

    async fn bundle(&self, ns: &str, name: &str) -> Vec<Vec<u8>> {
        let map = Api::<ConfigMap>::namespaced(self.admin.clone(), ns)
            .get(name)
            .await
            .unwrap_or_else(|err| panic!("configmap {ns}/{name}: {err}"));
        ders(map.data.unwrap()["ca-bundle.crt"].as_bytes())
    }

    async fn versions(&self, set: &Set) -> BTreeMap<String, String> {
        let mut versions = BTreeMap::new();
        for (kind, ns, name) in set.written() {
            let rv = match kind {
                "secret" => Api::<Secret>::namespaced(self.admin.clone(), &ns)
                    .get_opt(name)
                    .await
                    .unwrap()
                    .and_then(|o| o.metadata.resource_version),
                _ => Api::<ConfigMap>::namespaced(self.admin.clone(), &ns)
                    .get_opt(name)
                    .await
                    .unwrap()
                    .and_then(|o| o.metadata.resource_version),
            };
            if let Some(rv) = rv {
                versions.insert(format!("{kind} {ns}/{name}"), rv);
            }
        }
        versions
    }
}

fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.expect("PEM").to_vec())
        .collect()
}

/// What a test needs to know of a certificate.
#[derive(Debug)]
struct Facts {
    common_name: String,
    issuer: String,
    is_ca: bool,
    not_before: i64,
    not_after: i64,
    rsa_sha256: bool,
}

fn facts(der: &[u8]) -> Facts {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let cn = |name: &x509_parser::x509::X509Name<'_>| {
        name.iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    Facts {
        common_name: cn(cert.subject()),
        issuer: cn(cert.issuer()),
        is_ca: cert.is_ca(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        rsa_sha256: cert.signature_algorithm.algorithm
            == x509_parser::oid_registry::OID_PKCS1_SHA256WITHRSA,
    }
}

fn issued_by(cert: &[u8], ca: &[u8]) -> bool {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(ca).unwrap();
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

fn data(secret: &Secret, key: &str) -> Vec<u8> {
    secret.data.as_ref().unwrap()[key].0.clone()
}

fn text(secret: &Secret, key: &str) -> String {
    String::from_utf8(data(secret, key)).unwrap()
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

async fn scenarios() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = RealApiServer::start_with(
        &tmp.path().join("apiserver"),
        &RealOptions {
            users: vec![User::service_account(
                SA_TOKEN,
                KCM,
                "cert-recovery-controller",
            )],
            ..RealOptions::default()
        },
    );
    let admin = api.client_with_token(&api.token);
    let roles = e2e::rbac::apply_manifest_rbac(&admin).await;
    assert!(roles >= 4, "{roles} RBAC objects");
    {
        use std::os::unix::fs::PermissionsExt;
        let token = tmp.path().join("sa.token");
        rename_into(&token, SA_TOKEN.as_bytes());
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let cluster = Cluster {
        api,
        admin,
        dir: tmp.path().to_owned(),
    };
    empty_cluster_the_profile_creates_a_chain_the_apiserver_trusts_then_writes_nothing(&cluster)
        .await;
    an_expired_set_is_recovered_and_its_published_copy_replaced_at_once(&cluster).await;
    rotate_mode_publishes_a_new_ca_only_after_the_delay_and_keeps_the_old_one_trusted(&cluster)
        .await;
}

async fn empty_cluster_the_profile_creates_a_chain_the_apiserver_trusts_then_writes_nothing(
    cluster: &Cluster,
) {
    let set = Set::profile();
    cluster.namespaces(&set).await;
    for ns in [KAS, KAS_OP] {
        create_namespace(&cluster.admin, ns).await;
    }
    // The kube-apiserver's half first, as on a recovering master: among others it writes the
    // kube-controller-manager's client certificate into openshift-config-managed.
    let mut kas_profile = vec!["--profile", "openshift-kube-apiserver"];
    kas_profile.extend_from_slice(&crate::openshift_parity::HOSTNAME_FLAGS);
    cluster.once(&kas_profile);
    let client_ca_before = cluster.bundle(KAS, "client-ca").await;

    // The controller as the pod runs it: its loop (passes read a cache fed by watches of each
    // declared object by name), leader-elected, as the pod's service account under the
    // shipped Roles.
    let started = Instant::now();
    let profile = ["--profile", "openshift-kube-controller-manager"];
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let controller = ChildProcess::start(cluster.ours_as_the_pod(&[
        "--profile",
        "openshift-kube-controller-manager",
        "--leader-elect",
        "--leader-elect-lease-name",
        "cert-recovery-controller-lock",
        "--metrics-listen",
        &metrics.to_string(),
    ]));
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.versions(&set).await.len() < set.written().len() {
        assert!(
            Instant::now() < deadline,
            "the set was not created within 60 s: {:#?}",
            cluster.versions(&set).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the set was created in {:?}", started.elapsed());
    // Settled: the pass after the creating one may still prune; wait for 3 s without a write.
    let mut versions = cluster.versions(&set).await;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3) {
        assert!(Instant::now() < deadline, "the set never settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = cluster.versions(&set).await;
        if now != versions {
            versions = now;
            quiet_since = Instant::now();
        }
    }
    assert_eq!(versions.len(), set.written().len(), "{versions:#?}");

    let root = cluster.secret(OP, "csr-signer-signer").await;
    let root_der = ders(&data(&root, "tls.crt")).remove(0);
    let root_facts = facts(&root_der);
    assert!(root_facts.is_ca && root_facts.rsa_sha256, "{root_facts:?}");
    assert!(
        root_facts
            .common_name
            .starts_with(&format!("{OP}_csr-signer-signer@")),
        "{root_facts:?}"
    );
    let csr = cluster.secret(OP, "csr-signer").await;
    let chain = ders(&data(&csr, "tls.crt"));
    assert_eq!(chain.len(), 2, "tls.crt: the CA, then its issuer");
    assert_eq!(chain[1], root_der);
    let csr_facts = facts(&chain[0]);
    assert!(csr_facts.is_ca && csr_facts.rsa_sha256, "{csr_facts:?}");
    assert!(
        csr_facts.common_name.starts_with("kube-csr-signer_@"),
        "{csr_facts:?}"
    );
    assert_eq!(csr_facts.issuer, root_facts.common_name);
    assert!(issued_by(&chain[0], &root_der));
    assert_eq!(
        csr_facts.not_after - csr_facts.not_before,
        30 * 86_400 + 300,
        "30 days from a notBefore 5 minutes back"
    );
    let labels = csr.metadata.labels.clone().unwrap();
    assert_eq!(
        labels["auth.openshift.io/managed-certificate-type"],
        "target"
    );
    let annotations = csr.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["certificates.openshift.io/refresh-period"],
        "360h0m0s"
    );
    assert_eq!(
        annotations["openshift.io/owning-component"],
        "kube-controller-manager"
    );

    // Published: the CA alone, with its key, and (4.15 on) its source's annotations.
    let published = cluster.secret(KCM, "csr-signer").await;
    assert_eq!(ders(&data(&published, "tls.crt")), [chain[0].clone()]);
    assert_eq!(data(&published, "tls.key"), data(&csr, "tls.key"));
    assert_eq!(published.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        published.metadata.annotations.clone().unwrap_or_default(),
        annotations,
        "the published csr-signer does not carry its source's annotations"
    );
    // csr-signer-ca: no label (OpenShift creates it without); csr-controller-ca: described.
    let map = |ns: &str, name: &str| {
        let api = Api::<ConfigMap>::namespaced(cluster.admin.clone(), ns);
        let name = name.to_owned();
        async move { api.get(&name).await.unwrap() }
    };
    assert!(
        map(OP, "csr-signer-ca")
            .await
            .metadata
            .labels
            .unwrap_or_default()
            .is_empty(),
        "csr-signer-ca has a label"
    );
    assert_eq!(
        map(OP, "csr-controller-ca")
            .await
            .metadata
            .annotations
            .unwrap_or_default()["openshift.io/description"],
        "CA to recognize the CSRs (both serving and client) signed by the kube-controller-manager."
    );

    // csr-controller-ca: the intermediate and the root; copied as it is.
    let mut controller_ca = cluster.bundle(OP, "csr-controller-ca").await;
    controller_ca.sort();
    let mut expected = chain.clone();
    expected.sort();
    assert_eq!(controller_ca, expected);
    let managed = Api::<ConfigMap>::namespaced(cluster.admin.clone(), CM)
        .get("csr-controller-ca")
        .await
        .unwrap();
    let source = Api::<ConfigMap>::namespaced(cluster.admin.clone(), OP)
        .get("csr-controller-ca")
        .await
        .unwrap();
    assert_eq!(managed.data, source.data);
    let copied = cluster
        .secret(KCM, "kube-controller-manager-client-cert-key")
        .await;
    let client = cluster
        .secret(CM, "kube-controller-manager-client-cert-key")
        .await;
    assert_eq!(copied.data, client.data);

    // The kube-apiserver's half folds the copied csr-controller-ca into its client-ca.
    let log = cluster.once(&kas_profile);
    assert!(
        log.contains("configmap=openshift-kube-apiserver/client-ca"),
        "{log}"
    );
    let client_ca = cluster.bundle(KAS, "client-ca").await;
    assert_eq!(
        client_ca.len(),
        client_ca_before.len() + 2,
        "the intermediate and its root added"
    );
    assert!(client_ca.contains(&chain[0]) && client_ca.contains(&root_der));

    // A kubelet's client certificate, issued from the published CA as the CSR signer would
    // (the leaf alone), is refused by the real kube-apiserver, then authenticated once that
    // client-ca is its client CA file (which the kube-apiserver pod's syncer keeps in step).
    let signer = Ca::from_pems(&text(&published, "tls.crt"), &text(&published, "tls.key"));
    let node = signer.issue(&CertSpec::client("system:node:node-1").organization("system:nodes"));
    let status = || async {
        let config = e2e::tls::client_config_with_cert(
            &cluster.api.serving_ca,
            &node.cert_pem,
            &node.key_pem,
        );
        e2e::tls::https_get(cluster.api.addr(), "localhost", config, "/api")
            .await
            .map(|(status, _)| status)
            .unwrap_or(0)
    };
    assert_eq!(
        status().await,
        401,
        "trusted before csr-controller-ca was added"
    );
    let client_ca_file = cluster.api.dir.join("client-ca.crt");
    let mut client_ca = std::fs::read_to_string(&client_ca_file).unwrap();
    let folded = Api::<ConfigMap>::namespaced(cluster.admin.clone(), KAS)
        .get("client-ca")
        .await
        .unwrap();
    client_ca.push_str(&folded.data.unwrap()["ca-bundle.crt"]);
    rename_into(&client_ca_file, client_ca.as_bytes());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = status().await;
        if got != 401 && got != 0 {
            assert!(got == 200 || got == 403, "{got}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the kube-apiserver never authenticated a certificate from the published CA"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A healthy set: one more pass (`--once`, live reads) writes nothing, nor does the running
    // controller over a window.
    cluster.run_once(cluster.ours(&["--once"]), &profile);
    assert_eq!(cluster.versions(&set).await, versions, "written by --once");
    e2e::wait_until("the controller ready", Duration::from_secs(60), || async {
        readyz(metrics).await == 200
    })
    .await;
    let window = Duration::from_secs(
        std::env::var("E2E_KCM_IDLE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    tokio::time::sleep(window).await;
    assert_eq!(
        cluster.versions(&set).await,
        versions,
        "written by the running controller within {window:?}"
    );
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(cluster.admin.clone(), KCM)
            .get("cert-recovery-controller-lock")
            .await
            .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("kube-controller-manager-node-1")
    );
    drop(controller);
}

async fn readyz(addr: std::net::SocketAddr) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let _ = tcp
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn an_expired_set_is_recovered_and_its_published_copy_replaced_at_once(cluster: &Cluster) {
    let set = Set::named("expired");
    cluster.namespaces(&set).await;
    let config = cluster.config_file(&set, &[]);
    let config = config.to_str().unwrap();
    // The whole set as a pass 61 days ago made it: everything has expired since.
    let then = (now() - 61 * 86_400).to_string();
    cluster.once(&["--config", config, "--now", &then]);
    let old_root = ders(&data(
        &cluster.secret(&set.op, "csr-signer-signer").await,
        "tls.crt",
    ));
    let old_csr = ders(&data(
        &cluster.secret(&set.op, "csr-signer").await,
        "tls.crt",
    ));
    let old_published = ders(&data(
        &cluster.secret(&set.kcm, "csr-signer").await,
        "tls.crt",
    ));
    assert_eq!(old_published[0], old_csr[0]);
    for der in [&old_root[0], &old_csr[0]] {
        assert!(facts(der).not_after < now(), "expired");
    }

    let log = cluster.once(&["--config", config]);
    let at = now();
    let root = ders(&data(
        &cluster.secret(&set.op, "csr-signer-signer").await,
        "tls.crt",
    ));
    let csr = ders(&data(
        &cluster.secret(&set.op, "csr-signer").await,
        "tls.crt",
    ));
    assert_ne!(root[0], old_root[0]);
    assert_ne!(csr[0], old_csr[0]);
    assert!(issued_by(&csr[0], &root[0]));
    for der in [&root[0], &csr[0]] {
        let f = facts(der);
        assert!(f.not_before <= at && at < f.not_after, "{f:?}");
    }
    // Published at once, although the delay is 5 minutes: the copy had expired.
    let published = ders(&data(
        &cluster.secret(&set.kcm, "csr-signer").await,
        "tls.crt",
    ));
    assert_eq!(published, [csr[0].clone()]);
    assert!(log.contains("the published CA expired"), "{log}");
    // Updated with the new source's annotations: none of the expired CA's dates stays.
    let source = cluster.secret(&set.op, "csr-signer").await;
    let copy = cluster.secret(&set.kcm, "csr-signer").await;
    for key in [
        "auth.openshift.io/certificate-not-after",
        "auth.openshift.io/certificate-not-before",
        "auth.openshift.io/certificate-issuer",
    ] {
        assert_eq!(
            copy.metadata.annotations.as_ref().unwrap()[key],
            source.metadata.annotations.as_ref().unwrap()[key],
            "{key} of the published copy is stale"
        );
    }
    // The expired CAs are gone from every bundle; the new ones are in.
    for name in [
        "csr-signer-ca",
        "csr-controller-ca",
        "csr-controller-signer-ca",
    ] {
        let bundle = cluster.bundle(&set.op, name).await;
        assert!(
            bundle.iter().all(|der| facts(der).not_after > at),
            "{name} kept an expired CA"
        );
        assert!(bundle.contains(&root[0]), "{name}");
    }
    let mut copy = cluster.bundle(&set.managed, "csr-controller-ca").await;
    let mut source = cluster.bundle(&set.op, "csr-controller-ca").await;
    copy.sort();
    source.sort();
    assert_eq!(copy, source);
}

async fn rotate_mode_publishes_a_new_ca_only_after_the_delay_and_keeps_the_old_one_trusted(
    cluster: &Cluster,
) {
    let set = Set::named("rotate");
    cluster.namespaces(&set).await;
    let (backdate, delay) = (2, 8);
    let config = cluster.config_file(
        &set,
        &[("backdate: 5m", "backdate: 2s"), ("delay: 5m", "delay: 8s")],
    );
    let config = config.to_str().unwrap();
    cluster.once(&["--config", config]);
    let secrets = |ns: &str| Api::<Secret>::namespaced(cluster.admin.clone(), ns);
    let old = ders(&data(
        &cluster.secret(&set.op, "csr-signer").await,
        "tls.crt",
    ))
    .remove(0);
    let published_before = cluster.secret(&set.kcm, "csr-signer").await;
    assert_eq!(
        ders(&data(&published_before, "tls.crt")),
        std::slice::from_ref(&old)
    );

    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let controller = ChildProcess::start(cluster.ours(&[
        "--config",
        config,
        "--mode",
        "rotate",
        "--metrics-listen",
        &metrics.to_string(),
    ]));
    e2e::wait_until("the controller ready", Duration::from_secs(60), || async {
        readyz(metrics).await == 200
    })
    .await;

    // OpenShift's manual trigger on the intermediate.
    let mut csr = cluster.secret(&set.op, "csr-signer").await;
    csr.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("auth.openshift.io/certificate-not-after");
    secrets(&set.op)
        .replace("csr-signer", &PostParams::default(), &csr)
        .await
        .unwrap();

    // Observe the intermediate and its published copy until the copy holds the new CA.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut new: Option<(Vec<u8>, i64)> = None;
    let published_at = loop {
        let stored = ders(&data(
            &cluster.secret(&set.op, "csr-signer").await,
            "tls.crt",
        ))
        .remove(0);
        let published = cluster.secret(&set.kcm, "csr-signer").await;
        let seen = time::OffsetDateTime::now_utc().unix_timestamp();
        if stored != old && new.is_none() {
            let f = facts(&stored);
            new = Some((stored.clone(), f.not_before + backdate + delay));
        }
        let current = ders(&data(&published, "tls.crt")).remove(0);
        if let Some((der, publish_at)) = &new {
            if current == *der {
                break (*publish_at, seen);
            }
            assert_eq!(current, old, "published something else");
            assert_eq!(
                published.metadata.resource_version, published_before.metadata.resource_version,
                "the published copy was written before the delay"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the new CA was never published (new: {})",
            new.is_some()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (publish_at, seen) = published_at;
    assert!(
        seen >= publish_at,
        "published at {seen}, before notBefore + backdate + delay = {publish_at}"
    );
    assert!(
        seen <= publish_at + 30,
        "published at {seen}, long after {publish_at}"
    );
    let (new, _) = new.unwrap();
    // Both CAs are trusted: the old one until it expires.
    for (ns, name) in [
        (&set.op, "csr-signer-ca"),
        (&set.op, "csr-controller-ca"),
        (&set.managed, "csr-controller-ca"),
    ] {
        let bundle = cluster.bundle(ns, name).await;
        assert!(
            bundle.contains(&old) && bundle.contains(&new),
            "{ns}/{name}"
        );
    }
    drop(controller);
}
