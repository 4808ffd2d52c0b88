//! Unit tests of the rule of issue 35 item 5 at the level of passes against the in-memory
//! apiserver: a bundle write the brake holds does not count as written. Nothing is issued by,
//! or published for, a CA the bundles that must trust it do not hold: the dependent write
//! waits (`report.held`, `HeldBy::Trust`, a `WaitingForTrust` Event) and is made by the first
//! pass after the bundle holds the CA. Each case failed on the code before (the dependent
//! write went out in the same pass, with the held bundle's old content taken as written).

use super::config::{self, ObjectRef};
use super::loop_tests::{advance, brake_at, braked_pass, event_reasons};
use super::pass_tests::{DAY, secret_path, signer_at, stored_bundle, stored_pair, tls_secret};
use super::report::{HeldBy, Report};
use crate::kube::fake_api::FakeApi;
use crate::pki::{self, Cert, KeyPairPem};

fn object(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef {
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn has(certs: &[Cert], cert: &Cert) -> bool {
    certs.iter().any(|c| c.der == cert.der)
}

/// The write of `object` the pass deferred, and what it waits for.
fn waits_for(report: &Report, object: &ObjectRef) -> String {
    report
        .held
        .iter()
        .find_map(|h| match &h.by {
            HeldBy::Trust { waits_for } if h.object == *object => Some(waits_for.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{object} is not waiting: {:?}", report.held))
}

/// An expired signer and its expired leaf while a fight holds the signer's bundle: the signer
/// is regenerated (nothing is issued by it yet), the leaf is not re-issued by the new signer
/// that no bundle trusts (before: expired leaves were exempt from the brake and went out);
/// once the hold ends, the bundle gains the CA and the leaf is issued in the same pass.
#[tokio::test]
async fn an_expired_leaf_waits_while_the_brake_holds_its_signers_bundle() {
    let api = FakeApi::new();
    let rotation = config::parse(super::pass_tests::CONFIG).unwrap();
    let now = super::pass_tests::now();
    let old = signer_at(now - 200 * DAY as i64, 100);
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &old, "kubernetes.io/tls"),
    );
    let leaf = pki::new_leaf(
        &old,
        &rotation.targets[0].identity,
        now - 150 * DAY as i64,
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(30 * DAY),
    )
    .unwrap();
    api.put(
        &secret_path("serving"),
        tls_secret("serving", &leaf, "kubernetes.io/tls"),
    );
    api.put(
        &super::pass_tests::config_map_path("ca"),
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "ca", "namespace": "ns" },
            "data": { "ca-bundle.crt": pki::bundle_pem(std::slice::from_ref(old.cert())) },
        }),
    );
    let (brake, clock) = brake_at(now);
    let bundle = object("ns", "ca");
    for _ in 0..3 {
        brake.record("bundle", &bundle);
    }

    let report = braked_pass(&api, &rotation, now, &brake).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let written: Vec<String> = report
        .written
        .iter()
        .map(|w| w.object.to_string())
        .collect();
    assert_eq!(written, ["ns/signer"], "only the signer");
    let new = stored_pair(&api, "signer");
    assert!(!has(&stored_bundle(&api, "ca"), new.cert()), "held");
    let serving = object("ns", "serving");
    assert!(
        waits_for(&report, &serving).contains("configmap ns/ca to hold its signer's CA"),
        "{:?}",
        report.held
    );
    assert_eq!(
        stored_pair(&api, "serving").cert().der,
        leaf.cert().der,
        "not issued by a CA no bundle holds"
    );
    assert!(event_reasons(&api).contains(&"WaitingForTrust".to_owned()));

    // The hold ends: the bundle gains the CA, and the leaf from it follows in the same pass.
    advance(&clock, 600);
    let report = braked_pass(&api, &rotation, now, &brake).await;
    assert!(
        report.failures.is_empty() && report.held.is_empty(),
        "{report:?}"
    );
    assert!(has(&stored_bundle(&api, "ca"), new.cert()));
    assert!(pki::issued_by(
        stored_pair(&api, "serving").cert(),
        new.cert()
    ));
}

/// A client certificate kube-apiserver verifies with a union (`client-ca`): when the union's
/// write is held, the certificate from a new signer waits for it, even though its signer's own
/// bundle was written.
#[tokio::test]
async fn a_client_certificate_waits_for_the_union_its_verifier_uses() {
    let api = FakeApi::new();
    let rotation = config::parse(
        r#"
namespace: ns
signers: [{ name: cp-signer, validity: 60d, refresh: 30d }]
bundles: [{ name: cp-ca, signers: [cp-signer] }]
unions: [{ name: client-ca, bundles: [cp-ca] }]
targets:
  - { name: kcm-client, signer: cp-signer, client: { user: "system:kube-controller-manager" }, validity: 30d, refresh: 15d, priority: 2 }
"#,
    )
    .unwrap();
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
    let now = super::pass_tests::now();
    let (brake, _clock) = brake_at(now);
    let union = object("ns", "client-ca");
    for _ in 0..3 {
        brake.record("bundle", &union);
    }
    let report = braked_pass(&api, &rotation, now, &brake).await;
    let written: Vec<String> = report
        .written
        .iter()
        .map(|w| w.object.to_string())
        .collect();
    assert_eq!(written, ["ns/cp-signer", "ns/cp-ca"], "{:?}", report.held);
    assert!(
        waits_for(&report, &object("ns", "kcm-client")).contains("configmap ns/client-ca"),
        "{:?}",
        report.held
    );
    assert!(
        api.get(&secret_path("kcm-client")).is_none(),
        "not issued yet"
    );
}

/// The kube-controller-manager's chain after a sleep: `csr-signer` and its published copy
/// expired, the union's write held. The new CA is made and collected, but not published while
/// the union (and the copy kube-apiserver folds into `client-ca`) lacks it: kubelets would get
/// certificates nothing trusts (before: "expired" publications went out at once, and a held
/// union counted as written).
#[tokio::test]
async fn an_expired_publication_waits_while_the_brake_holds_the_union() {
    let api = FakeApi::new();
    let rotation = config::parse(
        r#"
namespace: op
backdate: 10s
signers: [{ name: csr-signer-signer, validity: 60d, refresh: 30d }]
bundles: [{ name: csr-controller-signer-ca, signers: [csr-signer-signer] }]
intermediates:
  - { name: csr-signer, signer: csr-signer-signer, common-name: kube-csr-signer, validity: 30d, refresh: 15d, bundle: csr-signer-ca, publish: { namespace: kcm, delay: 60s } }
unions: [{ name: csr-controller-ca, bundles: [csr-signer-ca, op/csr-controller-signer-ca] }]
copies: [{ configmap: csr-controller-ca, to: { namespace: managed } }]
"#,
    )
    .unwrap();
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
    let slept = super::pass_tests::now() - 31 * DAY as i64;
    let (brake, clock) = brake_at(slept);
    let first = braked_pass(&api, &rotation, slept, &brake).await;
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    let published_path = "/api/v1/namespaces/kcm/secrets/csr-signer";
    let read_pair = |path: &str| -> KeyPairPem {
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(api.get(path).unwrap()).unwrap();
        let data = secret.data.unwrap();
        KeyPairPem::parse(&data["tls.crt"].0, &data["tls.key"].0).unwrap()
    };
    let old = read_pair(published_path);

    // 31 days later: csr-signer and its copy expired; a fight holds the union.
    let now = super::pass_tests::now();
    advance(&clock, now - slept);
    let union = object("op", "csr-controller-ca");
    for _ in 0..3 {
        brake.record("bundle", &union);
    }
    let report = braked_pass(&api, &rotation, now, &brake).await;
    let new = read_pair("/api/v1/namespaces/op/secrets/csr-signer");
    assert_ne!(new.cert().der, old.cert().der, "a new CA is made");
    assert_eq!(
        read_pair(published_path).cert().der,
        old.cert().der,
        "not published while the union lacks it"
    );
    let waits = waits_for(&report, &object("kcm", "csr-signer"));
    assert!(
        waits.contains("configmap op/csr-controller-ca") && waits.contains("RegenerationLoop"),
        "{waits}"
    );

    // The hold ends: union, copy, then the publication, in one pass.
    advance(&clock, 600);
    let report = braked_pass(&api, &rotation, now, &brake).await;
    assert!(report.held.is_empty(), "{:?}", report.held);
    assert_eq!(read_pair(published_path).cert().der, new.cert().der);
}
