//! `cert-syncer approve-kubelet-csr` against the real kube-apiserver (1.20, certificates.k8s.io/v1):
//! CSRs are created by the identities that really create them (a bootstrap-token-like user
//! `system:bootstrap:abcdef` in `system:bootstrappers`, the node `system:node:master-0` in
//! `system:nodes`, and others), so `spec.username`/`spec.groups` are the apiserver's, not ours.
//! The approver runs as the `kubelet-csr-approver` service account under exactly the
//! ClusterRole of `manifests/rbac/csr-approver.yaml` (the real RBAC authorizer decides, including
//! `approve` on the signer).
//!
//! 1. With a valid kubelet client certificate on disk it approves nothing (the good CSR is left
//!    pending with the reason logged); a CSR an admin denied stays denied.
//! 2. Once the certificate on disk has expired, the pending good CSR is approved on the next
//!    recheck (no CSR event needed), a new good CSR from the bootstrap identity and one from the
//!    node itself are approved (condition `Approved`, reason `AutoApprovedExpiredNodeClientCert`),
//!    and each refusal (other node, other signer, extra usage, missing usage, extra subject
//!    field, SAN, another requester) stays pending with no condition and a log line naming its
//!    reason.
//! 3. Garbage at the certificate's path approves nothing (fail closed); once the file is
//!    absent the waiting CSR is approved.
//!
//! mini-apiserver serves no CSRs: real kube-apiserver only; skips with a printed reason otherwise.

mod a_kubelet_csr_is_approved_only_in_a_recovery_and_every_refusal_stays_pending {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::scenario().await;
    }
}

use std::process::Command;
use std::time::Duration;

use e2e::envtest::{RealApiServer, RealOptions, User};
use e2e::{ChildProcess, bin_path, install_crypto_provider, require_real_apiserver, wait_until};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use testkit::csr::certificate_request;
use testkit::files::rename_into;
use testkit::pki::{Ca, CertSpec, KeyKind};

const APPROVER_TOKEN: &str = "kubelet-csr-approver-token";
const BOOTSTRAP_TOKEN: &str = "bootstrap-abcdef-token";
const NODE_TOKEN: &str = "node-master-0-token";
const ALICE_TOKEN: &str = "alice-token";
const KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const KUBELET_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

fn kubelet_subject(node: &str) -> Vec<(&'static str, String)> {
    vec![
        ("O", "system:nodes".to_owned()),
        ("CN", format!("system:node:{node}")),
    ]
}

struct Csr {
    name: &'static str,
    token: &'static str,
    subject: Vec<(&'static str, String)>,
    sans: &'static [&'static str],
    signer: &'static str,
    usages: Vec<&'static str>,
    /// The reason's words in the approver's log line (`None`: approved).
    refusal: Option<&'static str>,
}

impl Csr {
    fn good(name: &'static str, token: &'static str) -> Csr {
        Csr {
            name,
            token,
            subject: kubelet_subject("master-0"),
            sans: &[],
            signer: KUBELET_SIGNER,
            usages: KUBELET_USAGES.to_vec(),
            refusal: None,
        }
    }

    fn refused(mut self, reason: &'static str) -> Csr {
        self.refusal = Some(reason);
        self
    }

    async fn create(&self, api: &RealApiServer) {
        let subject: Vec<(&str, &str)> =
            self.subject.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let request = certificate_request(&subject, self.sans, KeyKind::EcdsaP256);
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(self.name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: self.signer.to_owned(),
                usages: Some(self.usages.iter().map(|u| (*u).to_owned()).collect()),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        Api::<CertificateSigningRequest>::all(api.client_with_token(self.token))
            .create(&PostParams::default(), &csr)
            .await
            .unwrap_or_else(|err| panic!("creating CSR {} as {}: {err}", self.name, self.token));
    }
}

async fn conditions(admin: &kube::Client, name: &str) -> Vec<CertificateSigningRequestCondition> {
    Api::<CertificateSigningRequest>::all(admin.clone())
        .get(name)
        .await
        .unwrap_or_else(|err| panic!("CSR {name}: {err}"))
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
}

async fn wait_approved(admin: &kube::Client, name: &str) {
    wait_until(
        &format!("CSR {name} approved"),
        Duration::from_secs(30),
        || async {
            conditions(admin, name)
                .await
                .iter()
                .any(|c| c.type_ == "Approved")
        },
    )
    .await;
    let conditions = conditions(admin, name).await;
    let approved = conditions.iter().find(|c| c.type_ == "Approved").unwrap();
    assert_eq!(approved.status, "True");
    assert_eq!(
        approved.reason.as_deref(),
        Some("AutoApprovedExpiredNodeClientCert")
    );
    let message = approved.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("is expired at") || message.contains("is absent"),
        "{approved:?}"
    );
    assert_eq!(conditions.len(), 1, "{conditions:?}");
}

/// Waits for the approver's log line about `name` naming `reason`.
async fn wait_logged(approver: &ChildProcess, name: &str, reason: &str) {
    wait_until(
        &format!("a log line leaving {name} alone because {reason}"),
        Duration::from_secs(30),
        || async {
            approver.stderr_text().lines().any(|line| {
                line.contains("leaving kubelet client CSR alone")
                    && line.contains(name)
                    && line.contains(reason)
            })
        },
    )
    .await;
}

async fn apply_rbac(admin: &kube::Client) {
    // The shipped ClusterRole and binding, as they are.
    for role in e2e::manifests::of_kind::<ClusterRole>("ClusterRole") {
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
    }
    for binding in e2e::manifests::of_kind::<ClusterRoleBinding>("ClusterRoleBinding") {
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    // Who may create CSRs (as `system:node-bootstrapper` grants in a cluster).
    let name = "test:csr-creators";
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["certificates.k8s.io".to_owned()]),
            resources: Some(vec!["certificatesigningrequests".to_owned()]),
            verbs: vec!["create".to_owned(), "get".to_owned()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let subjects = vec![
        e2e::rbac::subject("Group", "system:bootstrappers", None),
        e2e::rbac::subject("Group", "system:nodes", None),
        e2e::rbac::subject("User", "alice", None),
    ];
    e2e::rbac::bind_cluster_role(admin, name, name, subjects).await;
}

async fn scenario() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = RealApiServer::start_with(
        &tmp.path().join("apiserver"),
        &RealOptions {
            users: vec![
                User::service_account(
                    APPROVER_TOKEN,
                    "openshift-kube-apiserver",
                    "kubelet-csr-approver",
                ),
                User::new(
                    BOOTSTRAP_TOKEN,
                    "system:bootstrap:abcdef",
                    &["system:bootstrappers"],
                ),
                User::new(NODE_TOKEN, "system:node:master-0", &["system:nodes"]),
                User::new(ALICE_TOKEN, "alice", &[]),
            ],
            ..RealOptions::default()
        },
    );
    let admin = api.client_with_token(&api.token);
    apply_rbac(&admin).await;
    let token = tmp.path().join("approver.token");
    rename_into(&token, APPROVER_TOKEN.as_bytes());
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    // The kubelet's client certificate: valid for now.
    let ca = Ca::new("kubelet-signer");
    let cert_file = tmp.path().join("kubelet-client-current.pem");
    let valid = ca.issue(
        &CertSpec::client("system:node:master-0")
            .organization("system:nodes")
            .days(30),
    );
    rename_into(&cert_file, valid.bundle().as_bytes());

    let mut command = Command::new(bin_path("cert-syncer"));
    command
        .arg("approve-kubelet-csr")
        .args(["--server", &api.url()])
        .args(["--tls-server-name-override", "localhost-recovery"])
        .arg("--ca-file")
        .arg(api.dir.join("recovery-ca.crt"))
        .arg("--token-file")
        .arg(&token)
        .args(["--node-name", "master-0"])
        .arg("--kubelet-client-cert")
        .arg(&cert_file)
        .args(["--recheck-interval", "1s"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let approver = ChildProcess::start(command);

    // 1. A valid certificate on disk: nothing is approved.
    let early = Csr::good("early-bootstrap", BOOTSTRAP_TOKEN);
    early.create(&api).await;
    let denied = Csr::good("denied-by-admin", BOOTSTRAP_TOKEN);
    denied.create(&api).await;
    wait_logged(&approver, "early-bootstrap", "not a recovery").await;
    wait_logged(&approver, "denied-by-admin", "not a recovery").await;
    assert!(conditions(&admin, "early-bootstrap").await.is_empty());
    // An admin denies one; it must stay denied whatever the disk says later.
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let mut object = csrs.get("denied-by-admin").await.unwrap();
    object.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Denied".to_owned(),
            status: "True".to_owned(),
            reason: Some("TestDenied".to_owned()),
            ..CertificateSigningRequestCondition::default()
        }]),
        ..CertificateSigningRequestStatus::default()
    });
    csrs.replace_subresource(
        "approval",
        "denied-by-admin",
        &PostParams::default(),
        &object,
    )
    .await
    .unwrap();
    wait_logged(&approver, "denied-by-admin", "already denied").await;
    // A few rechecks later, still nothing approved.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(conditions(&admin, "early-bootstrap").await.is_empty());

    // 2. The certificate on disk expires: a recovery.
    let expired = ca.issue(
        &CertSpec::client("system:node:master-0")
            .organization("system:nodes")
            .expired(1),
    );
    rename_into(&cert_file, expired.bundle().as_bytes());
    wait_approved(&admin, "early-bootstrap").await;

    let extra_usage = {
        let mut csr = Csr::good("extra-usage", BOOTSTRAP_TOKEN).refused("are not the kubelet's");
        csr.usages.push("server auth");
        csr
    };
    let missing_usage = {
        let mut csr = Csr::good("missing-usage", BOOTSTRAP_TOKEN).refused("are not the kubelet's");
        csr.usages.retain(|u| *u != "client auth");
        csr
    };
    let other_node = {
        let mut csr = Csr::good("other-node", BOOTSTRAP_TOKEN).refused("another node");
        csr.subject = kubelet_subject("master-1");
        csr
    };
    let other_signer = {
        let mut csr = Csr::good("other-signer", BOOTSTRAP_TOKEN);
        csr.signer = "kubernetes.io/kube-apiserver-client";
        csr
    };
    let extra_field = {
        let mut csr =
            Csr::good("extra-subject-field", BOOTSTRAP_TOKEN).refused("other than CN and O");
        csr.subject.push(("OU", "x".to_owned()));
        csr
    };
    let san = {
        let mut csr = Csr::good("with-san", BOOTSTRAP_TOKEN).refused("subject alternative names");
        csr.sans = &["master-0"];
        csr
    };
    let another_requester = Csr::good("another-requester", ALICE_TOKEN)
        .refused("neither the bootstrap identity nor this node");
    let all = [
        Csr::good("bootstrap", BOOTSTRAP_TOKEN),
        Csr::good("from-the-node", NODE_TOKEN),
        extra_usage,
        missing_usage,
        other_node,
        other_signer,
        extra_field,
        san,
        another_requester,
    ];
    for csr in &all {
        csr.create(&api).await;
    }
    for csr in &all {
        match csr.refusal {
            None if csr.signer == KUBELET_SIGNER => wait_approved(&admin, csr.name).await,
            None => {} // checked below: never seen, never acted on
            Some(reason) => wait_logged(&approver, csr.name, reason).await,
        }
    }
    // The other signer's CSR is not even seen (the watch selects the kubelet signer).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left: Vec<&str> = all
        .iter()
        .filter(|c| c.refusal.is_some() || c.signer != KUBELET_SIGNER)
        .map(|c| c.name)
        .collect();
    assert_eq!(left.len(), 7, "{left:?}");
    for name in left {
        assert!(
            conditions(&admin, name).await.is_empty(),
            "{name} was acted on"
        );
    }
    let denied = conditions(&admin, "denied-by-admin").await;
    assert!(
        denied.iter().all(|c| c.type_ == "Denied") && denied.len() == 1,
        "{denied:?}"
    );
    // Each refusal was logged once (once per CSR and reason), however many rechecks ran.
    let log = approver.stderr_text();
    for csr in all.iter().filter(|c| c.refusal.is_some()) {
        let lines = log
            .lines()
            .filter(|l| l.contains("leaving kubelet client CSR alone") && l.contains(csr.name))
            .count();
        assert_eq!(lines, 1, "{}: {lines} log lines", csr.name);
    }

    // 3. Garbage at the certificate's path: "cannot tell", so nothing is approved (fail
    // closed); once the file is gone (absent), the waiting CSR is approved on a recheck.
    rename_into(&cert_file, b"not a certificate\n");
    let during_garbage = Csr::good("during-garbage", BOOTSTRAP_TOKEN);
    during_garbage.create(&api).await;
    wait_logged(&approver, "during-garbage", "cannot tell").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(conditions(&admin, "during-garbage").await.is_empty());
    std::fs::remove_file(&cert_file).unwrap();
    wait_approved(&admin, "during-garbage").await;

    let (_, metrics) = e2e::plain_http_get(&approver.addr.to_string(), "/metrics");
    assert!(
        metrics.contains("cert_syncer_kubelet_csr_decisions_total{result=\"approved\"} 4"),
        "{metrics}"
    );
}
