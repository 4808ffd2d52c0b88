//! Unit tests of one [`Pass`] against an in-memory apiserver ([`crate::kube::fake_api`]): signers,
//! bundles and targets each on their own, what is written, what is left alone, and how
//! conflicts and foreign objects are handled; and a pass reading from the watches' cache: no
//! GET, its own writes remembered, a stale copy costing a conflict and never a blind write.
//! (A file of its own, beside `pass.rs`.)

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;

use super::Mode;
use super::cache::Cache;
use super::config::{self, Rotation};
use super::pass::{Pass, Reads, Report};
use crate::base::kind::Kind;
use crate::kube::decode::Raw;
use crate::kube::events::EventRecorder;
use crate::kube::fake_api::FakeApi;
use crate::kube::watch::Changes;
use crate::pki::{self, Cert, KeyPairPem};

pub(super) const DAY: u64 = 86_400;

pub(super) const CONFIG: &str = r#"
namespace: ns
signers:
  - { name: signer, validity: 100d, refresh: 50d }
bundles:
  - { name: ca, signers: [signer] }
targets:
  - { name: serving, signer: signer, serving: { hostnames: [localhost, 127.0.0.1] }, validity: 30d, refresh: 15d }
"#;

pub(super) fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/ns/secrets/{name}")
}

pub(super) fn config_map_path(name: &str) -> String {
    format!("/api/v1/namespaces/ns/configmaps/{name}")
}

pub(super) async fn pass(api: &FakeApi, rotation: &Rotation, now: i64) -> Report {
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(client.clone(), "ns", None));
    Pass {
        client: &client,
        reads: Reads::Live,
        rotation,
        mode: Mode::ExpiredOnly,
        now,
        apiserver_now: None,
        events: &events,
        brake: None,
        lease_lost: None,
    }
    .run()
    .await
}

pub(super) fn now() -> i64 {
    crate::base::time::unix_now()
}

/// The pair stored in a Secret.
pub(super) fn stored_pair(api: &FakeApi, name: &str) -> KeyPairPem {
    let secret: Secret = serde_json::from_value(api.get(&secret_path(name)).unwrap()).unwrap();
    let data = secret.data.unwrap();
    KeyPairPem::parse(&data["tls.crt"].0, &data["tls.key"].0).unwrap()
}

/// The CAs stored in a bundle.
pub(super) fn stored_bundle(api: &FakeApi, name: &str) -> Vec<Cert> {
    let map: ConfigMap = serde_json::from_value(api.get(&config_map_path(name)).unwrap()).unwrap();
    let (certs, problems) = pki::parse_bundle(map.data.unwrap()["ca-bundle.crt"].as_bytes());
    assert!(problems.is_empty(), "{problems:?}");
    certs
}

pub(super) fn written(report: &Report) -> Vec<String> {
    report
        .written
        .iter()
        .map(|w| format!("{} {} {}", w.kind, w.object, w.reason_label))
        .collect()
}

pub(super) fn writes(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("PUT") || r.starts_with("POST"))
        .count()
}

/// A Secret holding `pair`, as someone else (or an earlier pass) wrote it.
pub(super) fn tls_secret(name: &str, pair: &KeyPairPem, type_: &str) -> serde_json::Value {
    use k8s_openapi::ByteString;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            ..Default::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(
            [
                ("tls.crt", pair.cert_pem().into_bytes()),
                ("tls.key", pair.key_pem.clone().into_bytes()),
            ]
            .into_iter()
            .map(|(key, bytes)| (key.to_owned(), ByteString(bytes)))
            .collect(),
        ),
        ..Default::default()
    };
    serde_json::to_value(secret).unwrap()
}

pub(super) fn signer_at(issued: i64, days: u64) -> KeyPairPem {
    pki::new_signer(
        &format!("ns_signer@{issued}"),
        issued,
        Duration::ZERO,
        Duration::from_secs(days * DAY),
    )
    .unwrap()
}

#[tokio::test]
async fn an_empty_namespace_gets_signer_bundle_and_target_and_a_second_pass_writes_nothing() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let report = pass(&api, &rotation, now()).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        written(&report),
        [
            "signer ns/signer missing",
            "bundle ns/ca missing",
            "target ns/serving missing"
        ]
    );
    let signer = stored_pair(&api, "signer");
    assert!(signer.cert().is_ca);
    let bundle = stored_bundle(&api, "ca");
    assert_eq!(bundle.len(), 1);
    assert_eq!(bundle[0].der, signer.cert().der);
    let serving = stored_pair(&api, "serving");
    assert_eq!(serving.cert().hostnames, ["127.0.0.1", "localhost"]);
    assert!(pki::issued_by(serving.cert(), signer.cert()));
    assert!(report.next_deadline.is_some());

    let before = writes(&api);
    let again = pass(&api, &rotation, now()).await;
    assert!(
        again.failures.is_empty() && again.written.is_empty(),
        "{again:?}"
    );
    assert_eq!(writes(&api), before, "a valid set is never written");
}

#[tokio::test]
async fn signers_an_expired_one_is_replaced_and_a_foreign_secret_type_is_refused() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let expired = signer_at(now - 200 * DAY as i64, 100);
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &expired, "kubernetes.io/tls"),
    );
    let report = pass(&api, &rotation, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(
        written(&report).contains(&"signer ns/signer expired".to_owned()),
        "{:?}",
        written(&report)
    );
    let replaced = stored_pair(&api, "signer");
    assert_ne!(replaced.cert().der, expired.cert().der);
    assert!(!replaced.cert().is_expired_at(now));

    // A Secret of another type is someone else's: no key is ever written into it, and what
    // depends on the signer is skipped, not guessed.
    let foreign = FakeApi::new();
    foreign.put(
        &secret_path("signer"),
        tls_secret("signer", &expired, "kubernetes.io/dockerconfigjson"),
    );
    let report = pass(&foreign, &rotation, now).await;
    assert!(report.written.is_empty(), "{:?}", written(&report));
    let failures = report
        .failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(failures.contains("refusing"), "{failures}");
    assert!(
        failures.contains("configmap ns/ca: skipped, signer ns/signer unavailable"),
        "{failures}"
    );
    assert!(
        failures.contains("secret ns/serving: skipped, signer ns/signer unavailable"),
        "{failures}"
    );
    assert_eq!(writes(&foreign), 0);
}

#[tokio::test]
async fn bundles_keep_valid_old_cas_drop_expired_ones_and_retry_after_a_conflict() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let current = signer_at(now - DAY as i64, 100);
    let old = signer_at(now - 50 * DAY as i64, 100);
    let expired = signer_at(now - 150 * DAY as i64, 100);
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &current, "kubernetes.io/tls"),
    );
    let text = pki::bundle_pem(&[old.cert().clone(), expired.cert().clone()]);
    api.put(
        &config_map_path("ca"),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": "ca", "namespace": "ns" },
            "data": { "ca-bundle.crt": text },
        }),
    );
    // The first write of the bundle meets a concurrent change: re-read, decide again.
    api.conflict_next_writes(1);
    let report = pass(&api, &rotation, now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(written(&report).contains(&"bundle ns/ca ca-replaced".to_owned()));
    let bundle: Vec<Vec<u8>> = stored_bundle(&api, "ca")
        .iter()
        .map(|c| c.der.to_vec())
        .collect();
    assert_eq!(bundle.len(), 2, "the old valid CA and the current signer");
    assert!(bundle.contains(&old.cert().der.to_vec()));
    assert!(bundle.contains(&current.cert().der.to_vec()));
    assert!(!bundle.contains(&expired.cert().der.to_vec()));
    // The signer itself was valid: not written.
    assert!(!written(&report).iter().any(|w| w.starts_with("signer")));
}

#[tokio::test]
async fn targets_a_leaf_whose_hostnames_drifted_is_reissued_from_the_current_signer() {
    let api = FakeApi::new();
    let now = now();
    let first = pass(&api, &config::parse(CONFIG).unwrap(), now).await;
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    let old = stored_pair(&api, "serving");

    let moved = CONFIG.replace("[localhost, 127.0.0.1]", "[api.example, 127.0.0.1]");
    let report = pass(&api, &config::parse(&moved).unwrap(), now).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(written(&report), ["target ns/serving hostnames"]);
    let new = stored_pair(&api, "serving");
    assert_eq!(new.cert().hostnames, ["127.0.0.1", "api.example"]);
    assert_ne!(new.cert().der, old.cert().der);
    let signer = stored_pair(&api, "signer");
    assert!(pki::issued_by(new.cert(), signer.cert()));
    // Signer and bundle were fine: left alone.
    assert_eq!(stored_bundle(&api, "ca").len(), 1);
}

/// A cache that has listed namespace `ns` as the fake apiserver holds it now (what the
/// watches' first lists bring).
fn listed_cache(api: &FakeApi, rotation: &Rotation) -> Cache {
    let cache = Cache::new(rotation, 0);
    let mut secrets: Changes<Raw<Secret>> = Changes::default();
    let mut maps: Changes<Raw<ConfigMap>> = Changes::default();
    for (kind, object) in rotation.objects() {
        let name = object.name.clone();
        match kind {
            Kind::Secret => secrets.changed.push((
                name,
                api.get(&secret_path(&object.name))
                    .map(|v| serde_json::from_value(v).unwrap()),
            )),
            Kind::ConfigMap => maps.changed.push((
                name,
                api.get(&config_map_path(&object.name))
                    .map(|v| serde_json::from_value(v).unwrap()),
            )),
        }
    }
    secrets.listed = true;
    maps.listed = true;
    cache.observe::<Secret>("ns", secrets);
    cache.observe::<ConfigMap>("ns", maps);
    cache
}

/// What the watch brings for `name` now (its current version in the fake apiserver).
fn watched_secret(api: &FakeApi, name: &str) -> Changes<Raw<Secret>> {
    let mut changes = Changes::default();
    let raw = serde_json::from_value(api.get(&secret_path(name)).unwrap()).unwrap();
    changes.changed.push((name.to_owned(), Some(raw)));
    changes
}

async fn cached_pass(api: &FakeApi, cache: &Cache, rotation: &Rotation, now: i64) -> Report {
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(client.clone(), "ns", None));
    Pass {
        client: &client,
        reads: Reads::Cached(cache),
        rotation,
        mode: Mode::ExpiredOnly,
        now,
        apiserver_now: None,
        events: &events,
        brake: None,
        lease_lost: None,
    }
    .run()
    .await
}

fn gets(api: &FakeApi) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.starts_with("GET"))
        .collect()
}

#[tokio::test]
async fn a_pass_on_the_cache_reads_nothing_from_the_api_and_remembers_its_own_writes() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let cache = listed_cache(&api, &rotation);
    let changes = cache.subscribe();
    let report = cached_pass(&api, &cache, &rotation, now()).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        written(&report),
        [
            "signer ns/signer missing",
            "bundle ns/ca missing",
            "target ns/serving missing"
        ]
    );
    assert_eq!(gets(&api), Vec::<String>::new(), "a GET per object");
    // Our own writes are in the cache: nothing changed that should wake a pass, and the next
    // pass finds the set valid without a single request.
    assert!(!changes.has_changed().unwrap());
    assert_eq!(
        cache.get::<Secret>(&rotation.signers[0].object).unwrap(),
        Some(serde_json::from_value(api.get(&secret_path("signer")).unwrap()).unwrap())
    );
    let before = api.requests().len();
    let again = cached_pass(&api, &cache, &rotation, now()).await;
    assert!(
        again.failures.is_empty() && again.written.is_empty(),
        "{again:?}"
    );
    assert_eq!(api.requests()[before..], [] as [String; 0]);
    // The watch events of those writes bring versions the cache already holds: no wake.
    cache.observe::<Secret>("ns", watched_secret(&api, "signer"));
    assert!(!changes.has_changed().unwrap());
}

#[tokio::test]
async fn a_stale_cache_costs_one_conflict_then_the_pass_decides_on_the_version_the_watch_brings() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let expired = signer_at(now - 200 * DAY as i64, 100);
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &expired, "kubernetes.io/tls"),
    );
    let cache = Arc::new(listed_cache(&api, &rotation));
    // Someone else replaced the expired signer; the cache has not seen it yet.
    let theirs = signer_at(now - DAY as i64, 100);
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &theirs, "kubernetes.io/tls"),
    );
    // The watch brings it a moment after our write was refused.
    let watch = {
        let (api, cache) = (api.clone(), Arc::clone(&cache));
        tokio::spawn(async move {
            while !api
                .requests()
                .iter()
                .any(|r| r == "PUT /api/v1/namespaces/ns/secrets/signer")
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cache.observe::<Secret>("ns", watched_secret(&api, "signer"));
        })
    };
    let report = cached_pass(&api, &cache, &rotation, now).await;
    watch.await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.conflicts, 1);
    // Decided again on their signer: valid, kept; the bundle and the target come from it.
    assert_eq!(
        written(&report),
        ["bundle ns/ca missing", "target ns/serving missing"]
    );
    assert_eq!(stored_pair(&api, "signer").cert().der, theirs.cert().der);
    assert!(pki::issued_by(
        stored_pair(&api, "serving").cert(),
        theirs.cert()
    ));
    assert_eq!(gets(&api), Vec::<String>::new(), "read again by GET");
}

#[tokio::test(start_paused = true)]
async fn a_conflict_the_watch_never_explains_gives_the_item_up_until_the_next_pass() {
    let api = FakeApi::new();
    let rotation = config::parse(CONFIG).unwrap();
    let now = now();
    let cache = listed_cache(&api, &rotation);
    // The signer exists in the API but the cache says absent: the create meets 409
    // AlreadyExists, and no watch event ever comes (a broken watch).
    let theirs = signer_at(now - DAY as i64, 100);
    api.put(
        &secret_path("signer"),
        tls_secret("signer", &theirs, "kubernetes.io/tls"),
    );
    let report = cached_pass(&api, &cache, &rotation, now).await;
    assert_eq!(report.conflicts, 1);
    let failures = report
        .failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        failures.contains("secret ns/signer: after a conflict: changed since read, and the watch has not brought the new version"),
        "{failures}"
    );
    // Never written over: their signer is still there, nothing depending on it was guessed.
    assert_eq!(stored_pair(&api, "signer").cert().der, theirs.cert().der);
    assert!(report.written.is_empty(), "{:?}", written(&report));
}

#[tokio::test(start_paused = true)]
async fn a_pass_writes_nothing_after_the_lease_is_lost() {
    // Each write is answered a second after it arrives; the Lease is lost at 1.5 s, while the
    // pass is between its second and third write (signer at 0 s, bundle at 1 s, target at 2 s
    // if it were still leading).
    let api = FakeApi::new();
    api.set_write_latency(Duration::from_secs(1));
    let rotation = config::parse(CONFIG).unwrap();
    let lost = tokio_util::sync::CancellationToken::new();
    let writes_at_loss = {
        let (api, lost) = (api.clone(), lost.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            lost.cancel();
            writes(&api)
        })
    };
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(client.clone(), "ns", None));
    let report = Pass {
        client: &client,
        reads: Reads::Live,
        rotation: &rotation,
        mode: Mode::ExpiredOnly,
        now: now(),
        apiserver_now: None,
        events: &events,
        lease_lost: Some(&lost),
        brake: None,
    }
    .run()
    .await;
    let writes_at_loss = writes_at_loss.await.unwrap();
    assert_eq!(
        writes_at_loss, 2,
        "signer and bundle were sent before the loss"
    );
    assert_eq!(writes(&api), writes_at_loss, "no write after the loss");
    assert!(api.get(&secret_path("serving")).is_none());
    assert_eq!(
        written(&report),
        ["signer ns/signer missing", "bundle ns/ca missing"]
    );
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.reason.contains("lost the leader-election lease")),
        "{:?}",
        report.failures
    );
}
