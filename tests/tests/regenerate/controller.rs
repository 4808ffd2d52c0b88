//! `cert-syncer regenerate` as a process against an apiserver (`mini-apiserver` and the real
//! kube-apiserver, `e2e::both_backends!`) over the recovery connection:
//! expired-only vs rotate, an expired signer with its bundle and leaf, three replicas racing,
//! garbage data under fresh annotations, and a clock set back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use e2e::syncer::{NS, bundle_config_map, regenerate_command};
use e2e::{Backend, Ca, CertSpec, both_backends, metric_sum};
use futures::StreamExt;
use k8s_openapi::ByteString;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use testkit::files::rename_into;
use time::OffsetDateTime;

use super::fixture::{
    Fixture, candidate, chains_to, controller, days, der_of, event_reasons, fixture, keep_writing,
    metrics_of, object_metric,
};

both_backends!(
    expired_only_leaves_a_cert_at_99_percent_alone_and_rotate_replaces_it,
    an_expired_signer_is_replaced_the_bundle_keeps_valid_old_cas_and_leaves_chain_to_it,
    three_replicas_racing_write_each_object_exactly_once_and_settle,
    garbage_under_fresh_annotations_is_regenerated_and_a_clock_set_back_is_refused,
    with_leader_election_one_replica_acts_and_a_standby_takes_over_when_it_dies,
    a_local_clock_three_years_ahead_replaces_nothing_still_valid_at_the_apiservers_time,
    a_signer_written_while_the_clock_was_ahead_is_regenerated_once_the_clock_is_fixed,
    wildcards_ip_literals_and_odd_bundle_cas_are_issued_once_not_in_a_loop,
    a_writer_that_disagrees_meets_a_bounded_number_of_writes,
);

async fn bundle_has(f: &Fixture, pem: &str) -> bool {
    f.bundle().await.contains(&der_of(pem))
}

fn serial_of(pem: &str) -> String {
    let der = der_of(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.raw_serial_as_string()
}

fn validity_of(pem: &str) -> (i64, i64) {
    let der = der_of(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    )
}

async fn expired_only_leaves_a_cert_at_99_percent_alone_and_rotate_replaces_it(backend: Backend) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let mut ca = Ca::with_validity(now - days(100), now + days(100));
    f.seed(&mut ca, &[], (now - days(99), now + days(1))).await;
    let before = f.versions().await;
    let leaf_before = f.pem_of("serving-cert", "tls.crt").await;

    let (ok, log) = f.once(&["--mode", "expired-only"]);
    assert!(ok, "{log}");
    assert_eq!(
        f.versions().await,
        before,
        "nothing may be written, not even metadata"
    );
    let secret = f.secrets.get("serving-cert").await.unwrap();
    assert!(
        secret.metadata.annotations.is_none(),
        "no annotations added to a valid object"
    );

    let (ok, log) = f.once(&["--mode", "rotate"]);
    assert!(ok, "{log}");
    let after = f.versions().await;
    assert_eq!(
        after["serving-signer"], before["serving-signer"],
        "the signer is mid-life"
    );
    assert_eq!(after["serving-ca"], before["serving-ca"]);
    assert_ne!(after["serving-cert"], before["serving-cert"]);
    let leaf = f.pem_of("serving-cert", "tls.crt").await;
    assert_ne!(serial_of(&leaf), serial_of(&leaf_before));
    chains_to(&leaf, &f.bundle().await).unwrap();
    assert!(log.contains("past 80% of its lifetime"), "{log}");
}

async fn an_expired_signer_is_replaced_the_bundle_keeps_valid_old_cas_and_leaves_chain_to_it(
    backend: Backend,
) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let mut expired = Ca::with_validity(now - days(60), now - days(1));
    let older_valid = Ca::with_validity(now - days(10), now + days(300));
    f.seed(
        &mut expired,
        &[&older_valid],
        (now - days(30), now - days(2)),
    )
    .await;

    let (ok, log) = f.once(&[]);
    assert!(ok, "{log}");
    let signer = f.pem_of("serving-signer", "tls.crt").await;
    assert_ne!(der_of(&signer), der_of(&expired.cert_pem));
    let (signer_nb, signer_na) = validity_of(&signer);
    let now = now.unix_timestamp();
    assert!(
        signer_nb <= now - 290 && signer_nb >= now - 400,
        "backdated about 5 minutes"
    );
    assert!(
        (signer_na - (now + 200 * 86_400)).abs() < 120,
        "valid for 200 days"
    );

    // The leaf found at the start of the pass was issued by the expired CA: the CA stays until
    // that leaf is re-issued (this pass), and goes in the next pass.
    let bundle = f.bundle().await;
    assert_eq!(bundle.len(), 3, "the expired CA is kept one more pass");
    assert!(bundle.contains(&der_of(&expired.cert_pem)));
    assert!(
        bundle.contains(&der_of(&older_valid.cert_pem)),
        "a valid old CA is kept"
    );
    assert!(bundle.contains(&der_of(&signer)), "the new CA is added");
    let (ok, log) = f.once(&[]);
    assert!(ok, "{log}");
    let bundle = f.bundle().await;
    assert_eq!(bundle.len(), 2, "the expired CA is pruned");
    assert!(!bundle.contains(&der_of(&expired.cert_pem)));

    let leaf = f.pem_of("serving-cert", "tls.crt").await;
    chains_to(&leaf, &bundle).unwrap();
    let (_, leaf_na) = validity_of(&leaf);
    assert!(leaf_na <= signer_na, "a leaf never outlives its signer");
    let secret = f.secrets.get("serving-cert").await.unwrap();
    let annotations = secret.metadata.annotations.unwrap();
    let not_after = OffsetDateTime::parse(
        &annotations["auth.openshift.io/certificate-not-after"],
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(not_after.unix_timestamp(), leaf_na);
    assert_eq!(
        annotations["auth.openshift.io/certificate-hostnames"],
        "127.0.0.1,localhost"
    );
    assert!(
        annotations["auth.openshift.io/certificate-issuer"]
            .starts_with("openshift-kube-apiserver_serving-signer@")
    );

    // A second pass finds nothing to do.
    let before = f.versions().await;
    let (ok, log) = f.once(&[]);
    assert!(ok, "{log}");
    assert_eq!(f.versions().await, before);
}

async fn three_replicas_racing_write_each_object_exactly_once_and_settle(backend: Backend) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let mut expired = Ca::with_validity(now - days(60), now - days(1));
    f.seed(&mut expired, &[], (now - days(30), now - days(2)))
        .await;

    // Count every write from here on.
    let secrets_rv = f
        .secrets
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let maps_rv = f
        .config_maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let writes = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let mut watchers = Vec::new();
    {
        let (api, w) = (f.secrets.clone(), writes.clone());
        watchers.push(tokio::spawn(async move {
            let stream = api
                .watch(&WatchParams::default(), &secrets_rv)
                .await
                .unwrap();
            futures::pin_mut!(stream);
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Added(o) | WatchEvent::Modified(o) = event {
                    *w.lock()
                        .unwrap()
                        .entry(o.metadata.name.unwrap())
                        .or_default() += 1;
                }
            }
        }));
        let (api, w) = (f.config_maps.clone(), writes.clone());
        watchers.push(tokio::spawn(async move {
            let stream = api.watch(&WatchParams::default(), &maps_rv).await.unwrap();
            futures::pin_mut!(stream);
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Added(o) | WatchEvent::Modified(o) = event {
                    *w.lock()
                        .unwrap()
                        .entry(o.metadata.name.unwrap())
                        .or_default() += 1;
                }
            }
        }));
    }

    let racers: Vec<_> = (0..3)
        .map(|_| {
            regenerate_command(&f.api, &f.config, &["--once"])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for racer in racers {
        let output = racer.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&output.stderr);
        eprintln!("[racer]\n{log}");
        assert!(
            output.status.success(),
            "every replica settles cleanly:\n{log}"
        );
    }
    // Long-running replicas on the settled objects: they must find nothing to do.
    let mut long_running: Vec<_> = (0..3)
        .map(|_| {
            regenerate_command(&f.api, &f.config, &[])
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for child in &mut long_running {
        assert!(child.try_wait().unwrap().is_none(), "a replica exited");
        let _ = child.kill();
        let _ = child.wait();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for watcher in watchers {
        watcher.abort();
    }
    let writes = writes.lock().unwrap().clone();
    assert_eq!(
        writes,
        BTreeMap::from([
            ("serving-ca".to_owned(), 2),
            ("serving-cert".to_owned(), 1),
            ("serving-signer".to_owned(), 1),
        ]),
        "exactly one write per object and change: the bundle gains the new CA, then (once the \
         leaf no longer chains to it) loses the expired one"
    );
    assert!(
        !bundle_has(&f, &expired.cert_pem).await,
        "the expired CA is pruned"
    );
    let bundle = f.bundle().await;
    chains_to(&f.pem_of("serving-cert", "tls.crt").await, &bundle).unwrap();
}

async fn garbage_under_fresh_annotations_is_regenerated_and_a_clock_set_back_is_refused(
    backend: Backend,
) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let mut ca = Ca::with_validity(now - days(10), now + days(150));
    f.seed(&mut ca, &[], (now - days(1), now + days(50))).await;
    // Garbage data, annotations that claim a fresh certificate.
    let mut secret = f.secrets.get("serving-cert").await.unwrap();
    secret.data = Some(BTreeMap::from([
        (
            "tls.crt".to_owned(),
            ByteString(b"-----BEGIN CERTIFICATE-----\ngarbage\n".to_vec()),
        ),
        ("tls.key".to_owned(), ByteString(b"not a key".to_vec())),
    ]));
    secret.metadata.annotations = Some(BTreeMap::from([
        (
            "auth.openshift.io/certificate-not-after".to_owned(),
            "2099-01-01T00:00:00Z".to_owned(),
        ),
        (
            "auth.openshift.io/certificate-not-before".to_owned(),
            "2020-01-01T00:00:00Z".to_owned(),
        ),
        (
            "auth.openshift.io/certificate-issuer".to_owned(),
            "whatever".to_owned(),
        ),
    ]));
    f.secrets
        .replace("serving-cert", &PostParams::default(), &secret)
        .await
        .unwrap();
    let (ok, log) = f.once(&[]);
    assert!(ok, "{log}");
    let leaf = f.pem_of("serving-cert", "tls.crt").await;
    chains_to(&leaf, &f.bundle().await).unwrap();
    assert!(log.contains("unusable"), "{log}");

    // The clock two days back: earlier than the notBefore of the certificate just written.
    // Something needs writing (the bundle was emptied), yet nothing may be written.
    f.config_maps
        .replace("serving-ca", &PostParams::default(), &{
            let mut map = f.config_maps.get("serving-ca").await.unwrap();
            map.data = Some(BTreeMap::from([(
                "ca-bundle.crt".to_owned(),
                String::new(),
            )]));
            map
        })
        .await
        .unwrap();
    let before = f.versions().await;
    let back = (now - days(2)).unix_timestamp().to_string();
    let (ok, log) = f.once(&["--now", &back]);
    assert!(!ok, "a refused pass exits non-zero");
    assert!(log.contains("refusing to regenerate"), "{log}");
    assert!(
        log.contains("secret openshift-kube-apiserver/"),
        "names the object: {log}"
    );
    assert_eq!(f.versions().await, before);
    // With the clock right again, the bundle is repaired.
    let (ok, log) = f.once(&[]);
    assert!(ok, "{log}");
    assert_eq!(f.bundle().await.len(), 1);
}

async fn with_leader_election_one_replica_acts_and_a_standby_takes_over_when_it_dies(
    backend: Backend,
) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let mut ca = Ca::with_validity(now - days(10), now + days(150));
    f.seed(&mut ca, &[], (now - days(1), now + days(50))).await;

    let mut first = candidate(&f);
    e2e::wait_until(
        "the first replica to lead",
        Duration::from_secs(10),
        || async { first.stderr_text().contains("became leader") },
    )
    .await;
    let second = candidate(&f);
    e2e::wait_until(
        "the second replica to wait",
        Duration::from_secs(10),
        || async { second.stderr_text().contains("waiting: the lease is held") },
    )
    .await;

    // Only the leader acts: the target deleted, the leader recreates it.
    f.secrets
        .delete("serving-cert", &Default::default())
        .await
        .unwrap();
    e2e::wait_until(
        "the leader to recreate the target",
        Duration::from_secs(10),
        || async { first.stderr_text().contains("regenerated") },
    )
    .await;
    assert!(
        !second.stderr_text().contains("regenerated"),
        "the standby acted"
    );

    // The leader dies without releasing: the standby takes over after the lease duration.
    first.kill();
    e2e::wait_until("the standby to lead", Duration::from_secs(10), || async {
        second.stderr_text().contains("became leader")
    })
    .await;
    f.secrets
        .delete("serving-cert", &Default::default())
        .await
        .unwrap();
    e2e::wait_until(
        "the new leader to recreate the target",
        Duration::from_secs(10),
        || async { second.stderr_text().contains("regenerated") },
    )
    .await;
    chains_to(
        &f.pem_of("serving-cert", "tls.crt").await,
        &f.bundle().await,
    )
    .unwrap();
}

/// `--now` three years ahead stands for a local clock that jumped: the apiserver's `Date` says
/// otherwise, so the valid signer, its CA in the bundle and the leaf are all kept.
async fn a_local_clock_three_years_ahead_replaces_nothing_still_valid_at_the_apiservers_time(
    backend: Backend,
) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let mut ca = Ca::with_validity(now - days(10), now + days(150));
    f.seed(&mut ca, &[], (now - days(1), now + days(50))).await;
    let before = f.versions().await;
    let ahead = (now + days(3 * 365)).unix_timestamp().to_string();
    let (ok, log) = f.once(&["--now", &ahead]);
    assert!(ok, "{log}");
    assert_eq!(f.versions().await, before, "nothing written: {log}");
    assert_eq!(f.bundle().await, vec![der_of(&ca.cert_pem)]);
    assert!(log.contains("ahead of the apiserver"), "says why: {log}");
}

/// A signer and leaf that a regenerate wrote while its clock was three years ahead (notBefore
/// in the future, not-before annotation matching): with the clock right again, they are not
/// valid now by either clock, so they are regenerated instead of refusing every pass.
async fn a_signer_written_while_the_clock_was_ahead_is_regenerated_once_the_clock_is_fixed(
    backend: Backend,
) {
    let f = fixture(backend).await;
    let now = OffsetDateTime::now_utc();
    let ahead = now + days(3 * 365);
    let mut ca = Ca::with_validity(ahead - time::Duration::minutes(5), ahead + days(200));
    f.seed(
        &mut ca,
        &[],
        (ahead - time::Duration::minutes(5), ahead + days(100)),
    )
    .await;
    for name in ["serving-signer", "serving-cert"] {
        let mut secret = f.secrets.get(name).await.unwrap();
        let (not_before, _) = validity_of(&f.pem_of(name, "tls.crt").await);
        let at = OffsetDateTime::from_unix_timestamp(not_before)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        secret.metadata.annotations = Some(BTreeMap::from([(
            "auth.openshift.io/certificate-not-before".to_owned(),
            at,
        )]));
        f.secrets
            .replace(name, &PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let (ok, log) = f.once(&[]);
    assert!(ok, "not refused: {log}");
    assert!(log.contains("not valid before"), "{log}");
    let signer = f.pem_of("serving-signer", "tls.crt").await;
    assert_ne!(
        der_of(&signer),
        der_of(&ca.cert_pem),
        "the signer is replaced"
    );
    let bundle = f.bundle().await;
    assert!(bundle.contains(&der_of(&signer)));
    chains_to(&f.pem_of("serving-cert", "tls.crt").await, &bundle).unwrap();
    // Settled: a second pass writes nothing.
    let before = f.versions().await;
    let (ok, log) = f.once(&[]);
    assert!(ok, "{log}");
    assert_eq!(f.versions().await, before);
}

/// Names and CAs that once made the controller re-issue in a loop, as a new user would meet
/// them: a serving target for `["*.apps.example.com", "apps.example.com"]`, one for the IPv6
/// literal `2001:0db8::1`, and a CA bundle that also holds a foreign CA with a
/// subjectUniqueID. Each used to be re-issued about 15 times a second, forever; each must be
/// written once.
async fn wildcards_ip_literals_and_odd_bundle_cas_are_issued_once_not_in_a_loop(backend: Backend) {
    let f = fixture(backend).await;
    let config = r#"
namespace: openshift-kube-apiserver
signers:
  - { name: serving-signer, validity: 200d, refresh: 150d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - { name: serving-cert, signer: serving-signer, serving: { hostnames: ["*.apps.example.com", apps.example.com] }, validity: 100d, refresh: 50d }
  - { name: v6-cert, signer: serving-signer, serving: { hostnames: ["2001:0db8::1"] }, validity: 100d, refresh: 50d }
"#;
    rename_into(&f.config, config.as_bytes());
    let foreign = Ca::with_subject_unique_id("foreign ca with a subjectUniqueID");
    f.config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("serving-ca", &foreign.cert_pem),
        )
        .await
        .unwrap();
    let process = controller(&f);
    e2e::wait_until("both targets", Duration::from_secs(20), || async {
        metric_sum(
            &metrics_of(&process),
            "cert_regenerate_regenerations_total",
            &["kind=\"target\""],
        ) >= 2.0
    })
    .await;
    let settled = f.versions().await;
    // Three seconds: at the old rate, some 45 writes of each target.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let metrics = metrics_of(&process);
    for target in ["serving-cert", "v6-cert"] {
        let object = format!("object=\"{NS}/{target}\"");
        assert_eq!(
            metric_sum(
                &metrics,
                "cert_regenerate_regenerations_total",
                &[object.as_str()]
            ),
            1.0,
            "{target} is written once"
        );
    }
    assert_eq!(
        f.versions().await,
        settled,
        "nothing written after the first pass settled"
    );
    let pem = f.pem_of("serving-cert", "tls.crt").await;
    assert!(
        bundle_has(&f, &foreign.cert_pem).await,
        "the foreign CA stays in the bundle"
    );
    let mut roots = rustls::RootCertStore::empty();
    for ca in f.bundle().await {
        let _ = roots.add(ca); // the foreign CA is no anchor for rustls
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from("console.apps.example.com").unwrap(),
            &[],
            UnixTime::now(),
        )
        .expect("the wildcard leaf serves a name it covers");
    let v6 = f.pem_of("v6-cert", "tls.crt").await;
    let v6_der = der_of(&v6);
    let (_, cert) = x509_parser::parse_x509_certificate(&v6_der).unwrap();
    let want = "2001:db8::1"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    let sans = &cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names;
    assert!(
        sans.iter().any(|name| matches!(
            name,
            x509_parser::extensions::GeneralName::IPAddress(ip) if *ip == want.as_slice()
        )),
        "{sans:?}"
    );
    let (code, _) = e2e::plain_http_get(&process.addr.to_string(), "/readyz");
    assert_eq!(code, 200);
}

/// Another writer keeps putting back a leaf for other names (valid, from the same signer):
/// ours writes the target at most 3 times (its write budget), then holds it, and says so: an
/// Event `RegenerationLoop`, `cert_regenerate_writes_held_total`, and `/readyz`. Before, every
/// change was answered with a new key: as many writes as the other writer made.
async fn a_writer_that_disagrees_meets_a_bounded_number_of_writes(backend: Backend) {
    let f = fixture(backend).await;
    let process = controller(&f);
    e2e::wait_until("the first pass", Duration::from_secs(20), || async {
        metric_sum(
            &metrics_of(&process),
            "cert_regenerate_regenerations_total",
            &["kind=\"target\""],
        ) >= 1.0
    })
    .await;
    let signer = Ca::from_pems(
        &f.pem_of("serving-signer", "tls.crt").await,
        &f.pem_of("serving-signer", "tls.key").await,
    );
    let theirs = signer.issue(&CertSpec::server(&["localhost"]));
    let fights = keep_writing(6, Duration::from_millis(200), || async {
        let mut secret = f.secrets.get("serving-cert").await.unwrap();
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        data.insert(
            "tls.crt".into(),
            ByteString(theirs.cert_pem.clone().into_bytes()),
        );
        data.insert(
            "tls.key".into(),
            ByteString(theirs.key_pem.clone().into_bytes()),
        );
        f.secrets
            .replace("serving-cert", &PostParams::default(), &secret)
            .await
            .is_ok()
    })
    .await;
    let metrics = metrics_of(&process);
    let ours = object_metric(
        &metrics,
        "cert_regenerate_regenerations_total",
        "serving-cert",
    );
    let held = object_metric(
        &metrics,
        "cert_regenerate_writes_held_total",
        "serving-cert",
    );
    eprintln!("the other writer wrote {fights} times; ours {ours}, held {held}");
    assert!(fights >= 10, "the other writer kept writing ({fights})");
    assert!(ours <= 3.0, "at most the budget of writes: {ours}");
    assert!(held >= 1.0, "the held writes are counted: {held}");
    assert_eq!(
        metric_sum(&metrics, "cert_regenerate_held_objects", &[]),
        1.0
    );
    let (code, body) = e2e::plain_http_get(&process.addr.to_string(), "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("loop:") && body.contains("serving-cert"),
        "{body}"
    );
    let reasons = event_reasons(&f).await;
    assert!(
        reasons.iter().any(|r| r == "RegenerationLoop"),
        "{reasons:?}"
    );
    // Theirs stays while held: ours does not answer every change with a new key.
    assert_eq!(f.pem_of("serving-cert", "tls.crt").await, theirs.cert_pem);
}
