//! The settle property, the general guard against write loops: for generated configs (serving
//! hostnames of every legal shape — DNS names, wildcards, IPv4, IPv6 in several spellings,
//! IPv4-mapped — client users with unsorted, repeated groups, both key types, validities from
//! minutes to years, both modes) and generated cluster states (signer missing, valid at any
//! age, expired, not a CA, garbage, from the future; bundles missing or holding odd but legal
//! certificates: a subjectUniqueID CA, a CA over 64 KiB, a leaf, an expired CA, a CA from the
//! future, an unparsable block; targets missing, garbage, valid, for other names, from another
//! CA, expired), a pass that wrote, followed by a second pass over the result, writes nothing.
//!
//! A property test ([`proptest`]) run by the normal test suite with a bounded case count
//! (`PROPTEST_CASES`, default [`DEFAULT_CASES`]), and no regression files written.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::json;

use super::Mode;
use super::config;
use super::pass::{Pass, Reads, Report};
use crate::kube::events::EventRecorder;
use crate::kube::fake_api::FakeApi;
use crate::pki::KeyType;
use crate::pki::{self, Identity, KeyPairPem};

/// Cases per run when `PROPTEST_CASES` is not set: about 3 s in a debug build (100: 5 s).
const DEFAULT_CASES: u32 = 64;

const DAY: u64 = 86_400;

/// Target validity and refresh periods, pairwise (refresh ≤ validity, both above the 5m
/// backdate).
const PERIODS: [(&str, &str); 5] = [
    ("10m", "6m"),
    ("1h", "30m"),
    ("1d", "12h"),
    ("30d", "15d"),
    ("400d", "300d"),
];

/// A serving hostname of one of the legal shapes, spelled as a user may write it.
fn hostname() -> impl Strategy<Value = String> {
    (0u8..10, 0u16..300).prop_map(|(shape, i)| match shape {
        0 => format!("h{i}.example.com"),
        1 => format!("*.w{i}.example.com"),
        2 => format!("10.{}.{}.1", i / 256, i % 256),
        3 => format!("2001:db8::{i:x}"),
        4 => format!("2001:0db8:0000:0000::{i:04x}"),
        5 => format!("2001:DB8:0:0:0:0:0:{i:X}"),
        6 => format!("::ffff:10.0.{}.1", i % 256),
        7 => format!("H{i}.Example.COM"),
        8 => "::1".to_owned(),
        _ => "localhost".to_owned(),
    })
}

#[derive(Debug, Clone)]
enum TargetKind {
    Serving(Vec<String>),
    Client { user: String, groups: Vec<String> },
}

fn target_kind() -> impl Strategy<Value = TargetKind> {
    prop_oneof![
        3 => prop::collection::vec(hostname(), 1..5).prop_map(TargetKind::Serving),
        1 => (0u8..5, prop::collection::vec(0u8..4, 0..4)).prop_map(|(user, groups)| {
            TargetKind::Client {
                user: format!("system:user-{user}"),
                groups: groups.iter().map(|g| format!("group-{g}")).collect(),
            }
        }),
    ]
}

#[derive(Debug, Clone, Copy)]
enum SignerState {
    Missing,
    /// Issued this many percent of its validity ago.
    Valid(u8),
    Expired,
    NotACa,
    Garbage,
    Future,
}

fn signer_state() -> impl Strategy<Value = SignerState> {
    prop_oneof![
        1 => Just(SignerState::Missing),
        3 => (0u8..100).prop_map(SignerState::Valid),
        1 => Just(SignerState::Expired),
        1 => Just(SignerState::NotACa),
        1 => Just(SignerState::Garbage),
        1 => Just(SignerState::Future),
    ]
}

#[derive(Debug, Clone, Copy)]
enum BundleCa {
    /// The signer's certificate, when there is one.
    Signer,
    OldValid,
    OldExpired,
    SubjectUniqueId,
    Oversized,
    NotACa,
    Future,
    Unparsable,
}

fn bundle_ca() -> impl Strategy<Value = BundleCa> {
    prop_oneof![
        3 => Just(BundleCa::Signer),
        1 => Just(BundleCa::OldValid),
        1 => Just(BundleCa::OldExpired),
        1 => Just(BundleCa::SubjectUniqueId),
        1 => Just(BundleCa::Oversized),
        1 => Just(BundleCa::NotACa),
        1 => Just(BundleCa::Future),
        1 => Just(BundleCa::Unparsable),
    ]
}

#[derive(Debug, Clone, Copy)]
enum TargetState {
    Missing,
    Garbage,
    /// Issued by the signer for the configured identity, this many percent of its validity ago.
    Valid(u8),
    OtherNames,
    OtherCa,
    Expired,
}

fn target_state() -> impl Strategy<Value = TargetState> {
    prop_oneof![
        1 => Just(TargetState::Missing),
        1 => Just(TargetState::Garbage),
        3 => (0u8..100).prop_map(TargetState::Valid),
        1 => Just(TargetState::OtherNames),
        1 => Just(TargetState::OtherCa),
        1 => Just(TargetState::Expired),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    rsa: bool,
    rotate: bool,
    apiserver_date: bool,
    signer_period: usize,
    signer: SignerState,
    bundle: Option<Vec<BundleCa>>,
    targets: Vec<(TargetKind, usize, TargetState)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::bool::weighted(0.15),
        any::<bool>(),
        any::<bool>(),
        0..PERIODS.len(),
        signer_state(),
        prop::option::weighted(0.8, prop::collection::vec(bundle_ca(), 0..4)),
        prop::collection::vec((target_kind(), 0..PERIODS.len(), target_state()), 1..4),
    )
        .prop_map(
            |(rsa, rotate, apiserver_date, signer_period, signer, bundle, targets)| Case {
                rsa,
                rotate,
                apiserver_date,
                signer_period,
                signer,
                bundle,
                targets,
            },
        )
}

fn yaml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

fn config_text(case: &Case) -> String {
    let (validity, refresh) = PERIODS[case.signer_period];
    let mut text = format!(
        "namespace: ns\nkey-type: {}\nsigners:\n  - {{ name: signer, validity: {validity}, refresh: {refresh} }}\nbundles:\n  - {{ name: ca, signers: [signer] }}\ntargets:\n",
        if case.rsa { "rsa-2048" } else { "ecdsa-p256" }
    );
    for (i, (kind, period, _)) in case.targets.iter().enumerate() {
        let (validity, refresh) = PERIODS[*period];
        let identity = match kind {
            TargetKind::Serving(names) => format!("serving: {{ hostnames: {} }}", yaml_list(names)),
            TargetKind::Client { user, groups } => {
                format!(
                    "client: {{ user: {user:?}, groups: {} }}",
                    yaml_list(groups)
                )
            }
        };
        text.push_str(&format!(
            "  - {{ name: t{i}, signer: signer, {identity}, validity: {validity}, refresh: {refresh} }}\n"
        ));
    }
    text
}

fn seconds(text: &str) -> u64 {
    crate::base::time::parse_duration(text).unwrap().as_secs()
}

fn secret(name: &str, cert_pem: &str, key_pem: &str) -> serde_json::Value {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let data = [("tls.crt", cert_pem), ("tls.key", key_pem)]
        .into_iter()
        .map(|(key, text)| (key.to_owned(), ByteString(text.as_bytes().to_vec())))
        .collect();
    serde_json::to_value(Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Default::default()
    })
    .unwrap()
}

const GARBAGE: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

/// Stores the case's cluster state in `api`.
fn seed(api: &FakeApi, case: &Case, rotation: &config::Rotation, now: i64) {
    let key_type = if case.rsa {
        KeyType::Rsa2048
    } else {
        KeyType::EcdsaP256
    };
    let (validity, _) = PERIODS[case.signer_period];
    let validity = seconds(validity);
    let ca_at = |issued: i64, validity: u64| {
        pki::new_signer_of(
            KeyType::EcdsaP256,
            &format!("ns_signer@{issued}"),
            issued,
            Duration::ZERO,
            Duration::from_secs(validity),
        )
        .unwrap()
    };
    let other_ca = ca_at(now - DAY as i64, 100 * DAY);
    let signer: Option<KeyPairPem> = match case.signer {
        SignerState::Missing => None,
        SignerState::Valid(pct) => Some(
            pki::new_signer_of(
                key_type,
                "ns_signer@1",
                now - (validity * u64::from(pct) / 100) as i64,
                Duration::ZERO,
                Duration::from_secs(validity),
            )
            .unwrap(),
        ),
        SignerState::Expired => Some(ca_at(now - 2 * validity as i64, validity)),
        SignerState::NotACa => Some(
            pki::new_leaf(
                &other_ca,
                &Identity::Serving {
                    hostnames: vec!["localhost".into()],
                },
                now,
                Duration::ZERO,
                Duration::from_secs(DAY),
            )
            .unwrap(),
        ),
        SignerState::Future => Some(ca_at(now + 365 * DAY as i64, validity)),
        SignerState::Garbage => {
            api.put(
                "/api/v1/namespaces/ns/secrets/signer",
                secret("signer", GARBAGE, "not a key"),
            );
            None
        }
    };
    if let Some(signer) = &signer {
        api.put(
            "/api/v1/namespaces/ns/secrets/signer",
            secret("signer", &signer.cert_pem(), &signer.key_pem),
        );
    }
    if let Some(cas) = &case.bundle {
        let text: String = cas
            .iter()
            .map(|ca| match ca {
                BundleCa::Signer => signer.as_ref().map(|s| s.cert().pem()).unwrap_or_default(),
                BundleCa::OldValid => ca_at(now - 10 * DAY as i64, 100 * DAY).cert().pem(),
                BundleCa::OldExpired => ca_at(now - 200 * DAY as i64, 100 * DAY).cert().pem(),
                BundleCa::SubjectUniqueId => {
                    testkit::pki::Ca::with_subject_unique_id("foreign uid ca").cert_pem
                }
                BundleCa::Oversized => testkit::pki::Ca::oversized("foreign big ca").cert_pem,
                BundleCa::NotACa => testkit::pki::Ca::new("x").leaf(&["x.example"], 10).cert_pem,
                BundleCa::Future => ca_at(now + 365 * DAY as i64, 100 * DAY).cert().pem(),
                BundleCa::Unparsable => GARBAGE.to_owned(),
            })
            .collect();
        api.put(
            "/api/v1/namespaces/ns/configmaps/ca",
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": "ca", "namespace": "ns" },
                "data": { "ca-bundle.crt": text },
            }),
        );
    }
    for (i, (_, period, state)) in case.targets.iter().enumerate() {
        let Some(config) = rotation
            .targets
            .iter()
            .find(|t| t.object.name == format!("t{i}"))
        else {
            continue; // refused at load: nothing to seed
        };
        let validity = seconds(PERIODS[*period].0);
        let issuer = match (&signer, case.signer) {
            (Some(signer), SignerState::Valid(_)) => signer,
            _ => &other_ca,
        };
        let issue = |issuer: &KeyPairPem, identity: &Identity, issued: i64| {
            pki::new_leaf(
                issuer,
                identity,
                issued,
                Duration::ZERO,
                Duration::from_secs(validity),
            )
            .unwrap()
        };
        let pair = match state {
            TargetState::Missing => continue,
            TargetState::Garbage => {
                api.put(
                    &format!("/api/v1/namespaces/ns/secrets/t{i}"),
                    secret(&format!("t{i}"), GARBAGE, "not a key"),
                );
                continue;
            }
            TargetState::Valid(pct) => issue(
                issuer,
                &config.identity,
                now - (validity * u64::from(*pct) / 100) as i64,
            ),
            TargetState::OtherNames => issue(
                issuer,
                &Identity::Serving {
                    hostnames: vec!["other.example".into()],
                },
                now,
            ),
            TargetState::OtherCa => issue(&other_ca, &config.identity, now),
            TargetState::Expired => issue(issuer, &config.identity, now - 2 * validity as i64),
        };
        api.put(
            &format!("/api/v1/namespaces/ns/secrets/t{i}"),
            secret(&format!("t{i}"), &pair.cert_pem(), &pair.key_pem),
        );
    }
}

async fn pass(api: &FakeApi, rotation: &config::Rotation, case: &Case, now: i64) -> Report {
    let client = api.client();
    let events = std::sync::Arc::new(EventRecorder::new(client.clone(), "ns", None));
    Pass {
        client: &client,
        reads: Reads::Live,
        rotation,
        mode: if case.rotate {
            Mode::Rotate
        } else {
            Mode::ExpiredOnly
        },
        now,
        apiserver_now: case.apiserver_date.then_some(now),
        events: &events,
        brake: None,
        lease_lost: None,
    }
    .run()
    .await
}

fn labels(report: &Report) -> Vec<String> {
    report
        .written
        .iter()
        .map(|w| format!("{} {}: {}", w.kind, w.object, w.reason))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(DEFAULT_CASES),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_pass_over_what_the_previous_pass_wrote_writes_nothing(case in case()) {
        let text = config_text(&case);
        let rotation = config::parse(&text).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let now = crate::base::time::unix_now();
        let api = FakeApi::new();
        seed(&api, &case, &rotation, now);
        let (first, second) = runtime.block_on(async {
            let first = pass(&api, &rotation, &case, now).await;
            let second = pass(&api, &rotation, &case, now).await;
            (first, second)
        });
        prop_assert!(
            second.written.is_empty(),
            "config:\n{text}\nfirst pass wrote {:?} (failures {:?});\nsecond pass wrote {:?} (failures {:?})",
            labels(&first),
            first.failures,
            labels(&second),
            second.failures
        );
    }
}
