//! Unit tests of the intermediate step of a [`Pass`] (`phases::intermediates`, `phases::copies`) against
//! an in-memory apiserver ([`crate::kube::fake_api`]): the whole kube-controller-manager chain created,
//! left alone when healthy, rotated by the manual trigger, and published after the delay. (A
//! file of its own, beside `phases/`.)

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::Mode;
use super::config::{self, Rotation};
use super::pass::{Pass, Reads, Report};
use crate::kube::events::EventRecorder;
use crate::kube::fake_api::FakeApi;
use crate::pki::{self, Cert, KeyPairPem};

/// The kube-controller-manager's chain in two namespaces, with a 60 s publication delay.
const CONFIG: &str = r#"
namespace: op
backdate: 10s
signers:
  - { name: csr-signer-signer, validity: 60d, refresh: 30d }
bundles:
  - { name: csr-controller-signer-ca, signers: [csr-signer-signer] }
intermediates:
  - name: csr-signer
    signer: csr-signer-signer
    common-name: kube-csr-signer
    validity: 30d
    refresh: 15d
    bundle: csr-signer-ca
    publish: { namespace: kcm, delay: 60s }
unions:
  - { name: csr-controller-ca, bundles: [csr-signer-ca, op/csr-controller-signer-ca] }
copies:
  - { configmap: csr-controller-ca, to: { namespace: managed } }
  - { secret: client, namespace: managed, to: { namespace: kcm } }
"#;

async fn pass(api: &FakeApi, rotation: &Rotation, mode: Mode, now: i64) -> Report {
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(client.clone(), "op", None));
    Pass {
        client: &client,
        rotation,
        mode,
        now,
        apiserver_now: None,
        events: &events,
        reads: Reads::Live,
        brake: None,
        lease_lost: None,
    }
    .run()
    .await
}

fn written(report: &Report) -> Vec<String> {
    report
        .written
        .iter()
        .map(|w| format!("{} {} {}", w.kind, w.object, w.reason_label))
        .collect()
}

fn secret(api: &FakeApi, ns: &str, name: &str) -> Secret {
    serde_json::from_value(
        api.get(&format!("/api/v1/namespaces/{ns}/secrets/{name}"))
            .unwrap(),
    )
    .unwrap()
}

fn pair(api: &FakeApi, ns: &str, name: &str) -> KeyPairPem {
    let data = secret(api, ns, name).data.unwrap();
    KeyPairPem::parse(&data["tls.crt"].0, &data["tls.key"].0).unwrap()
}

fn bundle(api: &FakeApi, ns: &str, name: &str) -> Vec<Cert> {
    let map: ConfigMap = serde_json::from_value(
        api.get(&format!("/api/v1/namespaces/{ns}/configmaps/{name}"))
            .unwrap(),
    )
    .unwrap();
    pki::parse_bundle(map.data.unwrap()["ca-bundle.crt"].as_bytes()).0
}

fn has(certs: &[Cert], cert: &Cert) -> bool {
    certs.iter().any(|c| c.der == cert.der)
}

#[tokio::test]
async fn the_chain_is_created_then_left_alone_and_a_new_ca_is_published_after_the_delay() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
    let now = crate::base::time::unix_now();
    // The kube-apiserver's client certificate the copy follows.
    let client_pair = pki::new_signer(
        "client",
        now,
        Default::default(),
        std::time::Duration::from_secs(86_400),
    )
    .unwrap();
    let client_secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("client".into()),
            namespace: Some("managed".into()),
            labels: Some([("a".to_owned(), "b".to_owned())].into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("tls.crt", client_pair.cert_pem().into_bytes()),
                ("tls.key", client_pair.key_pem.clone().into_bytes()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), k8s_openapi::ByteString(v)))
            .collect(),
        ),
        ..Default::default()
    };
    api.put(
        "/api/v1/namespaces/managed/secrets/client",
        serde_json::to_value(client_secret).unwrap(),
    );

    let report = pass(&api, &rotation, Mode::ExpiredOnly, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        written(&report),
        [
            "signer op/csr-signer-signer missing",
            "bundle op/csr-controller-signer-ca missing",
            "target op/csr-signer missing",
            "bundle op/csr-signer-ca missing",
            "bundle op/csr-controller-ca missing",
            // What kube-apiserver folds into client-ca holds the CA before it is published.
            "copy managed/csr-controller-ca missing",
            "copy kcm/client missing",
            "published kcm/csr-signer missing",
        ]
    );
    let root = pair(&api, "op", "csr-signer-signer");
    let csr = pair(&api, "op", "csr-signer");
    assert!(csr.cert().is_ca && pki::issued_by(csr.cert(), root.cert()));
    assert_eq!(csr.chain.len(), 2);
    let published = pair(&api, "kcm", "csr-signer");
    assert_eq!(
        published.chain.len(),
        1,
        "the CA alone, as library-go publishes it"
    );
    assert_eq!(published.cert().der, csr.cert().der);
    let controller_ca = bundle(&api, "op", "csr-controller-ca");
    assert!(has(&controller_ca, csr.cert()) && has(&controller_ca, root.cert()));
    assert_eq!(controller_ca.len(), 2);
    assert_eq!(bundle(&api, "managed", "csr-controller-ca").len(), 2);
    let copy = secret(&api, "kcm", "client");
    assert_eq!(copy.data, secret(&api, "managed", "client").data);
    assert_eq!(copy.metadata.labels.unwrap()["a"], "b");

    // A healthy set: nothing written, in either mode.
    for mode in [Mode::ExpiredOnly, Mode::Rotate] {
        let again = pass(&api, &rotation, mode, now + 5).await;
        assert!(
            again.failures.is_empty() && again.written.is_empty(),
            "{again:?}"
        );
    }

    // The manual trigger on csr-signer (rotate mode): a new CA at once, collected into the
    // bundles next to the old one; the published copy stays the old CA for the delay.
    let mut stored = secret(&api, "op", "csr-signer");
    stored
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("auth.openshift.io/certificate-not-after");
    api.put(
        "/api/v1/namespaces/op/secrets/csr-signer",
        serde_json::to_value(&stored).unwrap(),
    );
    let t = now + 20;
    let report = pass(&api, &rotation, Mode::Rotate, t).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        written(&report),
        [
            "target op/csr-signer annotation",
            "bundle op/csr-signer-ca ca-added",
            "bundle op/csr-controller-ca ca-added",
            "copy managed/csr-controller-ca changed",
        ]
    );
    let new = pair(&api, "op", "csr-signer");
    let signer_ca = bundle(&api, "op", "csr-signer-ca");
    assert!(has(&signer_ca, new.cert()) && has(&signer_ca, csr.cert()));
    assert_eq!(pair(&api, "kcm", "csr-signer").cert().der, csr.cert().der);
    // Made at t (notBefore t - 10 s + backdate 10 s), published at t + 60 s: the pass asks to
    // be woken then.
    assert_eq!(report.next_deadline, Some(t + 60));
    let early = pass(&api, &rotation, Mode::Rotate, t + 59).await;
    assert!(early.written.is_empty(), "{early:?}");
    let due = pass(&api, &rotation, Mode::Rotate, t + 60).await;
    assert_eq!(written(&due), ["published kcm/csr-signer delay-passed"]);
    assert_eq!(pair(&api, "kcm", "csr-signer").cert().der, new.cert().der);
    // The old CA stays trusted until it expires.
    assert!(has(&bundle(&api, "op", "csr-controller-ca"), csr.cert()));
}

#[tokio::test]
async fn a_bundle_holds_the_cas_of_the_bundles_it_includes_and_a_missing_one_adds_nothing() {
    let api = FakeApi::new();
    let rotation = config::parse(
        r#"
namespace: kas
signers:
  - { name: kubelet-signer, validity: 60d, refresh: 30d }
bundles:
  - name: client-ca
    signers: [kubelet-signer]
    include: [managed/csr-controller-ca]
"#,
    )
    .unwrap();
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
    let read_only: Vec<String> = rotation.read_only().map(|(_, o)| o.to_string()).collect();
    assert_eq!(read_only, ["managed/csr-controller-ca"]);
    let now = crate::base::time::unix_now();
    // Absent: the bundle is its signer's CA alone, and that is not a failure.
    let report = pass(&api, &rotation, Mode::ExpiredOnly, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(bundle(&api, "kas", "client-ca").len(), 1);
    // The kube-controller-manager's CAs appear: folded in, one write; then nothing.
    let day = std::time::Duration::from_secs(86_400);
    let csr = pki::new_signer("kube-csr-signer_@1", now, Default::default(), day).unwrap();
    let expired = pki::new_signer(
        "kube-csr-signer_@0",
        now - 2 * 86_400,
        Default::default(),
        day,
    )
    .unwrap();
    let text = pki::bundle_pem(&[csr.cert().clone(), expired.cert().clone()]);
    api.put(
        "/api/v1/namespaces/managed/configmaps/csr-controller-ca",
        serde_json::json!({
            "metadata": { "name": "csr-controller-ca", "namespace": "managed" },
            "data": { "ca-bundle.crt": text }
        }),
    );
    let report = pass(&api, &rotation, Mode::ExpiredOnly, now + 1).await;
    assert_eq!(written(&report), ["bundle kas/client-ca ca-added"]);
    let client_ca = bundle(&api, "kas", "client-ca");
    assert_eq!(
        client_ca.len(),
        2,
        "the signer's CA and the unexpired included one"
    );
    assert!(has(&client_ca, csr.cert()) && !has(&client_ca, expired.cert()));
    let again = pass(&api, &rotation, Mode::ExpiredOnly, now + 2).await;
    assert!(
        again.written.is_empty() && again.failures.is_empty(),
        "{again:?}"
    );
    // Exact (issue 28, F5): a CA that left the included bundle leaves this one on the next
    // pass; the bundle's own signer's CA stays.
    api.put(
        "/api/v1/namespaces/managed/configmaps/csr-controller-ca",
        serde_json::json!({
            "metadata": { "name": "csr-controller-ca", "namespace": "managed" },
            "data": { "ca-bundle.crt": "" }
        }),
    );
    let report = pass(&api, &rotation, Mode::ExpiredOnly, now + 3).await;
    assert_eq!(written(&report), ["bundle kas/client-ca ca-removed"]);
    let client_ca = bundle(&api, "kas", "client-ca");
    assert_eq!(client_ca.len(), 1);
    assert!(!has(&client_ca, csr.cert()));
    // An include that is not namespace/name is a broken item.
    let broken = config::parse(
        "namespace: kas\nsigners: [{ name: s, validity: 1d, refresh: 12h }]\nbundles: [{ name: b, signers: [s], include: [nowhere] }]\n",
    )
    .unwrap();
    assert!(
        broken.broken[0].reason.contains("namespace/name"),
        "{:?}",
        broken.broken
    );
}

#[tokio::test]
async fn an_intermediates_bundle_collects_the_ca_and_its_verified_issuer_only() {
    // Issue 28, F5: csr-signer-ca took every certificate of csr-signer's tls.crt, so an
    // unrelated CA (or a leaf) put there became trusted for every client certificate.
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = crate::base::time::unix_now();
    let report = pass(&api, &rotation, Mode::ExpiredOnly, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let ca = pair(&api, "op", "csr-signer");
    let issuer = pair(&api, "op", "csr-signer-signer");
    let day = std::time::Duration::from_secs(86_400);
    let stranger = pki::new_signer("stranger", now, Default::default(), day).unwrap();
    let leaf = pki::new_leaf(
        &stranger,
        &pki::Identity::Client {
            user: "someone".into(),
            groups: vec![],
        },
        now,
        Default::default(),
        day,
    )
    .unwrap();
    // The same CA and key, its tls.crt now with a stranger CA and a leaf after the issuer.
    let mut secret = secret(&api, "op", "csr-signer");
    let chain = pki::bundle_pem(&[
        ca.cert().clone(),
        issuer.cert().clone(),
        stranger.cert().clone(),
        leaf.cert().clone(),
    ]);
    secret.data.as_mut().unwrap().insert(
        "tls.crt".into(),
        k8s_openapi::ByteString(chain.into_bytes()),
    );
    api.put(
        "/api/v1/namespaces/op/secrets/csr-signer",
        serde_json::to_value(&secret).unwrap(),
    );
    let report = pass(&api, &rotation, Mode::ExpiredOnly, now + 1).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    for (ns, name) in [("op", "csr-signer-ca"), ("op", "csr-controller-ca")] {
        let held = bundle(&api, ns, name);
        assert!(
            has(&held, ca.cert()) && has(&held, issuer.cert()),
            "{ns}/{name}"
        );
        assert!(
            !has(&held, stranger.cert()),
            "{ns}/{name} trusts the stranger CA"
        );
        assert!(!has(&held, leaf.cert()), "{ns}/{name} holds a leaf");
    }
}

/// Two copies of objects nothing here writes: a CA bundle and a client certificate.
const COPIES: &str = r#"
namespace: op
copies:
  - { configmap: ca, namespace: src, to: { namespace: dst } }
  - { secret: client, namespace: src, to: { namespace: dst } }
"#;

fn put_secret(api: &FakeApi, ns: &str, name: &str, cert: &[u8], key: &[u8]) {
    let data = [("tls.crt", cert), ("tls.key", key)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), k8s_openapi::ByteString(v.to_vec())))
        .collect();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    api.put(
        &format!("/api/v1/namespaces/{ns}/secrets/{name}"),
        serde_json::to_value(secret).unwrap(),
    );
}

fn put_bundle(api: &FakeApi, ns: &str, name: &str, pem: &str) {
    let map = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some([("ca-bundle.crt".to_owned(), pem.to_owned())].into()),
        ..Default::default()
    };
    api.put(
        &format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
        serde_json::to_value(map).unwrap(),
    );
}

fn config_map(api: &FakeApi, ns: &str, name: &str) -> ConfigMap {
    serde_json::from_value(
        api.get(&format!("/api/v1/namespaces/{ns}/configmaps/{name}"))
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_copy_is_never_replaced_by_an_emptied_truncated_expired_or_garbage_source() {
    let api = FakeApi::new();
    let rotation = config::parse(COPIES).unwrap();
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
    let now = crate::base::time::unix_now();
    let day = std::time::Duration::from_secs(86_400);
    let good = pki::new_signer("good", now, Default::default(), day).unwrap();
    let expired = pki::new_signer("old", now - 10 * 86_400, Default::default(), day).unwrap();
    put_secret(
        &api,
        "src",
        "client",
        good.cert_pem().as_bytes(),
        good.key_pem.as_bytes(),
    );
    put_bundle(&api, "src", "ca", &good.cert_pem());
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(
        client.clone(),
        "op",
        Some("regenerate-pod"),
    ));
    let run = || Pass {
        client: &client,
        rotation: &rotation,
        mode: Mode::ExpiredOnly,
        now,
        apiserver_now: None,
        events: &events,
        reads: Reads::Live,
        lease_lost: None,
        brake: None,
    };
    let report = run().run().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        written(&report),
        ["copy dst/ca missing", "copy dst/client missing"]
    );
    let (copied_secret, copied_map) = (
        secret(&api, "dst", "client").data,
        config_map(&api, "dst", "ca").data,
    );

    let cert = good.cert_pem();
    let truncated = &cert[..cert.len() / 2];
    let expired_cert = expired.cert_pem();
    let bad: [(&str, &[u8], &[u8]); 4] = [
        ("emptied", b"", b""),
        ("truncated", truncated.as_bytes(), good.key_pem.as_bytes()),
        (
            "expired",
            expired_cert.as_bytes(),
            expired.key_pem.as_bytes(),
        ),
        ("garbage", b"not a certificate", b"not a key"),
    ];
    for (what, cert, key) in bad {
        put_secret(&api, "src", "client", cert, key);
        put_bundle(&api, "src", "ca", std::str::from_utf8(cert).unwrap());
        let report = run().run().await;
        assert!(report.written.is_empty(), "{what}: {:?}", report.written);
        assert_eq!(secret(&api, "dst", "client").data, copied_secret, "{what}");
        assert_eq!(config_map(&api, "dst", "ca").data, copied_map, "{what}");
        assert_eq!(report.failures.len(), 2, "{what}: {:?}", report.failures);
        for failure in &report.failures {
            assert!(
                failure.reason.contains("not copied from src/"),
                "{what}: {failure}"
            );
        }
    }
    // Each refusal said so in an Event on the pod, naming the source and the copy.
    let refused: Vec<String> = api
        .objects_under("/api/v1/namespaces/op/events/")
        .into_iter()
        .filter(|e| e["reason"] == "CopyRefused")
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        refused
            .iter()
            .any(|m| m.contains("dst/client") && m.contains("src/client")),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|m| m.contains("dst/ca") && m.contains("src/ca")),
        "{refused:?}"
    );

    // A renewed source is copied again.
    let renewed = pki::new_signer("renewed", now, Default::default(), day).unwrap();
    put_secret(
        &api,
        "src",
        "client",
        renewed.cert_pem().as_bytes(),
        renewed.key_pem.as_bytes(),
    );
    put_bundle(&api, "src", "ca", &renewed.cert_pem());
    let report = run().run().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        written(&report),
        ["copy dst/ca changed", "copy dst/client changed"]
    );
}

/// A copy goes through the one write: a destination Secret of a type regenerate does not own
/// is refused (kept, failed, an Event names it); once the Lease is lost nothing is written.
#[tokio::test]
async fn a_copy_is_refused_onto_a_foreign_secret_type_and_after_the_lease_is_lost() {
    let api = FakeApi::new();
    let rotation = config::parse(COPIES).unwrap();
    let now = crate::base::time::unix_now();
    let day = std::time::Duration::from_secs(86_400);
    let good = pki::new_signer("good", now, Default::default(), day).unwrap();
    put_secret(
        &api,
        "src",
        "client",
        good.cert_pem().as_bytes(),
        good.key_pem.as_bytes(),
    );
    put_bundle(&api, "src", "ca", &good.cert_pem());
    let pull_secret = serde_json::json!({
        "metadata": { "name": "client", "namespace": "dst" },
        "type": "kubernetes.io/dockerconfigjson",
        "data": { ".dockerconfigjson": "e30=" },
    });
    api.put("/api/v1/namespaces/dst/secrets/client", pull_secret);
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(
        client.clone(),
        "op",
        Some("regenerate-pod"),
    ));
    let lost = tokio_util::sync::CancellationToken::new();
    let run = || Pass {
        client: &client,
        rotation: &rotation,
        mode: Mode::ExpiredOnly,
        now,
        apiserver_now: None,
        events: &events,
        reads: Reads::Live,
        lease_lost: Some(&lost),
        brake: None,
    };

    let report = run().run().await;
    assert_eq!(written(&report), ["copy dst/ca missing"]);
    let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].starts_with("secret dst/client: ")
            && failures[0].contains("kubernetes.io/dockerconfigjson")
            && failures[0].contains("does not manage"),
        "{failures:?}"
    );
    let kept = secret(&api, "dst", "client");
    assert!(kept.data.unwrap().contains_key(".dockerconfigjson"));
    let refused: Vec<String> = api
        .objects_under("/api/v1/namespaces/op/events/")
        .into_iter()
        .filter(|e| e["reason"] == "CertificateRegenerationRefused")
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        refused.iter().any(|m| m.contains("dst/client")),
        "{refused:?}"
    );

    // The source changes, but this replica has lost the Lease: nothing is written.
    let renewed = pki::new_signer("renewed", now, Default::default(), day).unwrap();
    put_bundle(&api, "src", "ca", &renewed.cert_pem());
    lost.cancel();
    let report = run().run().await;
    assert!(report.written.is_empty(), "{:?}", report.written);
    let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
    assert!(
        failures.iter().any(|f| f.starts_with(
            "configmap dst/ca: not written: this replica \
             lost the leader-election lease"
        )),
        "{failures:?}"
    );
    assert_eq!(
        config_map(&api, "dst", "ca").data.unwrap()["ca-bundle.crt"],
        good.cert_pem()
    );
}
