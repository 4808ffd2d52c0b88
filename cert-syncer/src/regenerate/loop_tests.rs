//! Unit tests of the loop class (issue 28) at the level of passes against the in-memory
//! apiserver: the write budget against a writer that disagrees and one that deletes, on a clock
//! the test moves; and
//! the issue's reproductions (wildcards, IP literals, odd bundle CAs, a foreign CA from the
//! future without the apiserver's `Date`, a signer key after `EC PARAMETERS`) settling after
//! one write. Helpers from `pass_tests`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::json;

use super::Mode;
use super::brake::{Brake, MAX_HOLD, WINDOW};
use super::config::{self, Rotation};
use super::pass::{Pass, Reads, Report};
use super::pass_tests::{
    CONFIG, DAY, config_map_path, now, pass, secret_path, signer_at, stored_bundle, stored_pair,
    tls_secret, writes, written,
};
use crate::kube::events::EventRecorder;
use crate::kube::fake_api::FakeApi;
use crate::pki::{self, KeyPairPem};

/// A pass as the controller's loop makes it: with the per-object write budget.
pub(super) async fn braked_pass(
    api: &FakeApi,
    rotation: &Rotation,
    now: i64,
    brake: &Brake,
) -> Report {
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(
        client.clone(),
        "ns",
        Some("regenerate-pod"),
    ));
    let report = Pass {
        client: &client,
        reads: Reads::Live,
        rotation,
        mode: Mode::ExpiredOnly,
        now,
        apiserver_now: None,
        events: &events,
        brake: Some(brake),
        lease_lost: None,
    }
    .run()
    .await;
    for write in &report.written {
        brake.record(write.kind, &write.object);
    }
    report
}

/// A brake on a clock the test moves (`advance`), from `now`.
pub(super) fn brake_at(now: i64) -> (Brake, Arc<AtomicI64>) {
    let clock = Arc::new(AtomicI64::new(now));
    let read = Arc::clone(&clock);
    (
        Brake::new(3, WINDOW, MAX_HOLD, move || read.load(Ordering::SeqCst)),
        clock,
    )
}

pub(super) fn advance(clock: &AtomicI64, seconds: i64) {
    clock.fetch_add(seconds, Ordering::SeqCst);
}

pub(super) fn event_reasons(api: &FakeApi) -> Vec<String> {
    api.objects_under("/api/v1/namespaces/ns/events/")
        .iter()
        .map(|event| event["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Another controller that disagrees keeps putting back a leaf for other names (valid, from
/// the same signer): the target is rewritten three times, then held (not written, a
/// `RegenerationLoop` Event, `report.held`) until its first write is ten minutes old; then one
/// more write, and held again, for twice as long.
#[tokio::test]
async fn a_disagreeing_writer_meets_the_write_budget_not_an_endless_loop() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let (brake, clock) = brake_at(now);
    let first = braked_pass(&api, &rotation, now, &brake).await;
    assert_eq!(first.written.len(), 3, "{:?}", written(&first));
    let signer = stored_pair(&api, "signer");
    let ca = testkit::pki::Ca::from_pems(&signer.cert_pem(), &signer.key_pem);
    let theirs = ca.issue(&testkit::pki::CertSpec::server(&["localhost"]));
    let fight = || {
        let pair =
            KeyPairPem::parse(theirs.cert_pem.as_bytes(), theirs.key_pem.as_bytes()).unwrap();
        let mut secret = tls_secret("serving", &pair, "kubernetes.io/tls");
        secret["metadata"]["resourceVersion"] = json!(null);
        api.put(&secret_path("serving"), secret);
    };
    let mut ours = 1; // the first write (missing) counts too
    let mut held = 0;
    for _ in 0..20 {
        fight();
        advance(&clock, 5);
        let report = braked_pass(&api, &rotation, now, &brake).await;
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        ours += report.written.len();
        held += report.held.len();
    }
    assert_eq!(
        ours, 3,
        "three writes of the target within the window, then none"
    );
    assert_eq!(held, 18);
    assert!(event_reasons(&api).contains(&"RegenerationLoop".to_owned()));
    // Theirs is left in place while held: it is valid, the disagreement is about names.
    assert_eq!(stored_pair(&api, "serving").cert().der.to_vec(), theirs.der);
    // Ten minutes after the first write: one write, then held again, now for 20 minutes: the
    // fight went on.
    advance(&clock, 600 - 100);
    fight();
    let report = braked_pass(&api, &rotation, now, &brake).await;
    assert_eq!(written(&report), ["target ns/serving hostnames"]);
    fight();
    let report = braked_pass(&api, &rotation, now, &brake).await;
    assert!(report.written.is_empty(), "{:?}", written(&report));
    assert_eq!(report.held.len(), 1);
    assert!(
        matches!(report.held[0].by, super::report::HeldBy::Brake { level: 2, length } if length == 2 * WINDOW),
        "{:?}",
        report.held
    );
}

/// A controller that deletes the target as soon as it exists: "missing" is no longer exempt
/// (issue 35 item 6). Before, every deletion was answered with a new key at watch speed;
/// now three writes, then the object stays deleted for the hold, then escalating holds.
#[tokio::test]
async fn a_controller_that_keeps_deleting_an_object_meets_the_budget_too() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let (brake, clock) = brake_at(now);
    let first = braked_pass(&api, &rotation, now, &brake).await;
    assert_eq!(first.written.len(), 3, "{:?}", written(&first));
    let mut ours = 1;
    let mut held = 0;
    for _ in 0..30 {
        api.remove(&secret_path("serving"));
        advance(&clock, 2);
        let report = braked_pass(&api, &rotation, now, &brake).await;
        ours += report
            .written
            .iter()
            .filter(|w| w.object.name == "serving")
            .count();
        held += report.held.len();
    }
    assert_eq!(ours, 3, "three creations within the window, then none");
    assert_eq!(held, 28);
    assert!(event_reasons(&api).contains(&"RegenerationLoop".to_owned()));
    assert!(
        api.get(&secret_path("serving")).is_none(),
        "left deleted while held"
    );
}

/// The issue's reproductions, each at the level of one pass: a wildcard serving target, a
/// non-canonical IPv6 literal, a CA bundle that also holds foreign CAs webpki cannot take as
/// anchors (a subjectUniqueID, over 64 KiB). The first pass writes; the second writes nothing
/// (before: the target was judged `ChainBroken` and re-issued on every pass).
#[tokio::test]
async fn wildcards_ip_literals_and_odd_bundle_cas_settle_after_one_write() {
    let api = FakeApi::new();
    let config = r#"
namespace: ns
key-type: ecdsa-p256
signers:
  - { name: signer, validity: 100d, refresh: 50d }
bundles:
  - { name: ca, signers: [signer] }
targets:
  - { name: serving, signer: signer, serving: { hostnames: ["*.apps.example.com", apps.example.com] }, validity: 30d, refresh: 15d }
  - { name: wild-only, signer: signer, serving: { hostnames: ["*.apps.example.com"] }, validity: 30d, refresh: 15d }
  - { name: v6, signer: signer, serving: { hostnames: ["2001:0db8::1", localhost] }, validity: 30d, refresh: 15d }
  - { name: client, signer: signer, client: { user: "system:admin", groups: [b, a] }, validity: 30d, refresh: 15d }
"#;
    let rotation = config::parse(config).unwrap();
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
    let odd = [
        testkit::pki::Ca::with_subject_unique_id("foreign uid ca"),
        testkit::pki::Ca::oversized("foreign big ca"),
    ];
    let text: String = odd.iter().map(|ca| ca.cert_pem.as_str()).collect();
    api.put(
        &config_map_path("ca"),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": "ca", "namespace": "ns" },
            "data": { "ca-bundle.crt": text },
        }),
    );
    let now = now();
    let first = pass(&api, &rotation, now).await;
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    assert_eq!(first.written.len(), 6, "{:?}", written(&first));
    assert_eq!(stored_bundle(&api, "ca").len(), 3, "the foreign CAs stay");
    let before = writes(&api);
    let again = pass(&api, &rotation, now).await;
    assert!(
        again.failures.is_empty() && again.written.is_empty(),
        "{:?} {:?}",
        written(&again),
        again.failures
    );
    assert_eq!(writes(&api), before);
}

/// Without the apiserver's `Date`, a foreign CA in a bundle that starts a year from now says
/// nothing about our clock: the pass goes on (before: every pass was refused).
#[tokio::test]
async fn a_foreign_future_ca_in_a_bundle_does_not_stop_the_pass_without_the_apiservers_date() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let future = signer_at(now + 365 * DAY as i64, 100);
    api.put(
        &config_map_path("ca"),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": "ca", "namespace": "ns" },
            "data": { "ca-bundle.crt": future.cert().pem() },
        }),
    );
    let report = pass(&api, &rotation, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(written(&report).contains(&"target ns/serving missing".to_owned()));
    // A foreign signer from the future is skipped on its own, not regenerated.
    let other = FakeApi::new();
    other.put(
        &secret_path("signer"),
        tls_secret("signer", &future, "kubernetes.io/tls"),
    );
    let report = pass(&other, &rotation, now).await;
    let failures = report
        .failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(failures.contains("secret ns/signer: skipped"), "{failures}");
    assert_eq!(writes(&other), 0);
}

/// A signer whose `tls.key` starts with OpenSSL's `EC PARAMETERS` block signs its targets
/// (before: judged usable, then rcgen read the parameters block as the key and failed).
#[tokio::test]
async fn a_signer_key_after_an_ec_parameters_block_issues_the_targets() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let mut signer = signer_at(now - DAY as i64, 100);
    signer.key_pem = format!(
        "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}",
        signer.key_pem
    );
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &signer, "kubernetes.io/tls"),
    );
    let report = pass(&api, &rotation, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(!written(&report).iter().any(|w| w.starts_with("signer")));
    assert!(pki::issued_by(
        stored_pair(&api, "serving").cert(),
        signer.cert()
    ));
}
