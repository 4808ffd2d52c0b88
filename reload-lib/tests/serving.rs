//! Public-API tests of serving sets: real files, real inotify, real handshakes over 127.0.0.1.

mod common;

use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ClientAuth, InvalidMaterial, ServingSet, WatchMode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_writer_style_rotates_the_served_certificate() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    for writer in WRITERS {
        let first = ca.leaf(&["localhost"], 30);
        let mut dir = PairDir::new(&tmp.path().join(format!("{writer:?}")), writer, &first);
        let set = ServingSet::builder(dir.paths())
            .resync_interval(None)
            .start()
            .await
            .unwrap();
        assert_eq!(set.watch_mode(), &WatchMode::Inotify);
        let addr = echo_server(set.acceptor()).await;
        let client = client_config(&[&ca.cert_pem], None);
        assert_eq!(
            handshake(addr, "localhost", no_resumption(&client))
                .await
                .unwrap()
                .serial,
            first.serial
        );
        for _ in 0..3 {
            let next = ca.leaf(&["localhost"], 30);
            dir.write(&next);
            wait_for_serial(addr, "localhost", &client, &next.serial).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_in_place_write_keeps_the_old_pair_until_the_key_arrives() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let dir = PairDir::new(tmp.path(), Writer::InPlace, &first);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = no_resumption(&client_config(&[&ca.cert_pem], None));

    let next = ca.leaf(&["localhost"], 30);
    std::fs::write(dir.cert(), &next.cert_pem).unwrap();
    // The truncation may be seen first (empty file, retried): wait for the settled torn state.
    let status = wait_status(&set, |s| {
        s.last_error.as_ref().and_then(|e| e.invalid_material())
            == Some(&InvalidMaterial::KeyMismatch)
    })
    .await;
    let err = status.last_error.unwrap();
    assert_eq!(
        err.invalid_material(),
        Some(&InvalidMaterial::KeyMismatch),
        "{err}"
    );
    assert_eq!(
        handshake(addr, "localhost", client.clone())
            .await
            .unwrap()
            .serial,
        first.serial
    );

    std::fs::write(dir.key(), &next.key_pem).unwrap();
    wait_for_serial(addr, "localhost", &client, &next.serial).await;
    assert!(set.status().last_error.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_pem_is_rejected_with_the_file_named_and_the_last_good_pair_keeps_serving() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::Rename, &first);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = no_resumption(&client_config(&[&ca.cert_pem], None));

    for garbage in [
        &b"not a certificate"[..],
        b"",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n",
    ] {
        let before = set.status().reloads_failed;
        dir.write_raw(garbage, first.key_pem.as_bytes());
        let status = wait_status(&set, |s| s.reloads_failed > before).await;
        let message = status.last_error.unwrap().to_string();
        assert!(
            message.contains(&dir.cert().display().to_string()),
            "{message}"
        );
        assert_eq!(
            handshake(addr, "localhost", client.clone())
                .await
                .unwrap()
                .serial,
            first.serial
        );
    }
    let next = ca.leaf(&["localhost"], 30);
    dir.write(&next);
    wait_for_serial(addr, "localhost", &client, &next.serial).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_another_pair_is_rejected() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::Kubelet, &first);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();

    let (a, b) = (ca.leaf(&["localhost"], 30), ca.leaf(&["localhost"], 30));
    dir.write_raw(a.cert_pem.as_bytes(), b.key_pem.as_bytes());
    let err = wait_status(&set, |s| s.reloads_failed > 0)
        .await
        .last_error
        .unwrap();
    assert_eq!(err.invalid_material(), Some(&InvalidMaterial::KeyMismatch));
    assert_eq!(
        set.current().certificate_for(Some("localhost")).serial,
        first.serial
    );
    // An explicit reload reports the same reason.
    let err = set.reload().await.unwrap_err();
    assert_eq!(
        err.invalid_material(),
        Some(&InvalidMaterial::KeyMismatch),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_served_only_when_nothing_better_exists() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    // At start-up an expired pair is all there is: it is served.
    let expired = ca.leaf(&["localhost"], -1);
    let mut dir = PairDir::new(tmp.path(), Writer::Kubelet, &expired);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    assert_eq!(
        set.current().certificate_for(Some("localhost")).serial,
        expired.serial
    );
    // An expired pair may replace an expired one.
    let expired2 = ca.leaf(&["localhost"], -2);
    dir.write(&expired2);
    assert!(set.reload().await.is_ok_and(|published| published) || set.status().generation == 2);
    assert_eq!(
        set.current().certificate_for(Some("localhost")).serial,
        expired2.serial
    );
    // A valid one replaces it.
    let valid = ca.leaf(&["localhost"], 30);
    dir.write(&valid);
    wait_status(&set, |s| s.served[0].info.serial == valid.serial).await;
    // But an expired one never replaces a valid one.
    let expired3 = ca.leaf(&["localhost"], -1);
    dir.write(&expired3);
    let err = set.reload().await.unwrap_err();
    assert!(
        matches!(
            err.invalid_material(),
            Some(InvalidMaterial::Expired { .. })
        ),
        "{err}"
    );
    assert_eq!(
        set.current().certificate_for(Some("localhost")).serial,
        valid.serial
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_directory_that_is_deleted_and_recreated_is_watched_again() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("a/b/certs");
    let first = ca.leaf(&["localhost"], 30);
    PairDir::new(&certs, Writer::Rename, &first);
    let set = ServingSet::builder(CertKeyPaths::new(
        certs.join("tls.crt"),
        certs.join("tls.key"),
    ))
    .resync_interval(None)
    .start()
    .await
    .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = client_config(&[&ca.cert_pem], None);

    for round in 0..3 {
        // Remove more than the directory itself on the second round.
        let removed = if round == 1 {
            tmp.path().join("a")
        } else {
            certs.clone()
        };
        std::fs::remove_dir_all(&removed).unwrap();
        // The removal is seen (files gone: rejected, last good kept).
        wait_status(&set, |s| s.last_error.is_some()).await;
        let next = ca.leaf(&["localhost"], 30);
        PairDir::new(&certs, Writer::Rename, &next);
        wait_for_serial(addr, "localhost", &client, &next.serial).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_picks_up_changes_where_there_are_no_events() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::InPlace, &first);
    let set = ServingSet::builder(dir.paths())
        .poll_only(true)
        .poll_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    assert!(matches!(set.watch_mode(), WatchMode::Polling(_)));
    let addr = echo_server(set.acceptor()).await;
    let client = client_config(&[&ca.cert_pem], None);
    let next = ca.leaf(&["localhost"], 30);
    dir.write(&next);
    wait_for_serial(addr, "localhost", &client, &next.serial).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_reload_trigger_a_re_read() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::Rename, &first);
    // No events, no resync: only explicit triggers can reload.
    let set = ServingSet::builder(dir.paths())
        .poll_only(true)
        .poll_interval(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    set.reload_on_sighup().unwrap();
    assert!(
        !set.reload().await.unwrap(),
        "unchanged files publish nothing"
    );

    let next = ca.leaf(&["localhost"], 30);
    dir.write(&next);
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_status(&set, |s| s.served[0].info.serial == next.serial).await;

    let last = ca.leaf(&["localhost"], 30);
    dir.write(&last);
    assert!(set.reload().await.unwrap());
    assert_eq!(set.current().certificate_for(None).serial, last.serial);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_selection_prefers_exact_names_then_one_label_wildcards_then_the_default() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let default = ca.leaf(&["default.test"], 30);
    let explicit = ca.leaf(&["api.test", "other.test"], 30);
    let wildcard = ca.leaf(&["*.apps.test"], 30);
    let from_cert = ca.leaf(&["api.test", "x.apps.test", "c.test", "127.0.0.1"], 30);
    let later_explicit = ca.leaf(&["api.test"], 30);
    let dirs: Vec<_> = [&default, &explicit, &wildcard, &from_cert, &later_explicit]
        .iter()
        .enumerate()
        .map(|(i, pair)| PairDir::new(&tmp.path().join(i.to_string()), Writer::Rename, pair))
        .collect();
    let set = ServingSet::builder(dirs[0].paths())
        .sni_from_certificate(dirs[3].paths())
        .sni("api.test", dirs[1].paths())
        .sni("*.apps.test", dirs[2].paths())
        .sni("API.test", dirs[4].paths())
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = no_resumption(&client_config(&[&ca.cert_pem], None));
    let cases = [
        ("api.test", &explicit), // configured beats taken-from-certificate; first configured wins
        ("x.apps.test", &from_cert), // an exact name beats a wildcard
        ("y.apps.test", &wildcard), // one label under the wildcard
        ("c.test", &from_cert),  // names taken from the certificate's SANs
        ("default.test", &default), // the default pair's own names
        ("other.test", &default), // a SAN that was not configured is not claimed
        ("a.b.apps.test", &default), // a wildcard covers one label only
        ("apps.test", &default),
        ("unknown.test", &default),
    ];
    for (name, want) in cases {
        // Verification would fail for names the default does not cover; look at what is sent.
        let mut config = (*client).clone();
        config
            .dangerous()
            .set_certificate_verifier(std::sync::Arc::new(AcceptAnything));
        let seen = handshake(addr, name, std::sync::Arc::new(config))
            .await
            .unwrap();
        assert_eq!(seen.serial, want.serial, "{name}");
        assert_eq!(
            set.current().certificate_for(Some(name)).serial,
            want.serial,
            "{name}"
        );
    }
    // No SNI at all: the default pair.
    let mut config = (*client).clone();
    config.enable_sni = false;
    assert_eq!(
        handshake(addr, "default.test", std::sync::Arc::new(config))
            .await
            .unwrap()
            .serial,
        default.serial
    );
    // An IP SAN is not an SNI name.
    assert_eq!(
        set.current().certificate_for(Some("127.0.0.1")).serial,
        default.serial
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_name_the_certificate_does_not_cover_is_refused() {
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let default = PairDir::new(
        &tmp.path().join("d"),
        Writer::Rename,
        &ca.leaf(&["a.test"], 30),
    );
    let mut sni = PairDir::new(
        &tmp.path().join("s"),
        Writer::Rename,
        &ca.leaf(&["b.test"], 30),
    );
    let err = ServingSet::builder(default.paths())
        .sni("c.test", sni.paths())
        .start()
        .await
        .unwrap_err();
    assert_eq!(
        err.invalid_material(),
        Some(&InvalidMaterial::NameNotCovered("c.test".into()))
    );
    assert!(err.to_string().contains("s/tls.crt"), "{err}");

    // At run time the same check keeps the last good pair.
    let set = ServingSet::builder(default.paths())
        .sni("b.test", sni.paths())
        .start()
        .await
        .unwrap();
    sni.write(&ca.leaf(&["c.test"], 30));
    // The writer replaces the certificate, then the key: the torn state in between is rejected
    // too (key mismatch); the settled state is rejected because the name is not covered.
    let not_covered = Some(&InvalidMaterial::NameNotCovered("b.test".into()));
    wait_status(&set, |s| {
        s.last_error.as_ref().and_then(|e| e.invalid_material()) == not_covered
    })
    .await;
    assert_eq!(
        set.current().certificate_for(Some("b.test")).dns_names,
        ["b.test"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumption_survives_a_serving_certificate_rotation() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let mut dir = PairDir::new(tmp.path(), Writer::Kubelet, &ca.leaf(&["localhost"], 30));
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = client_config(&[&ca.cert_pem], None);
    assert!(
        !handshake(addr, "localhost", client.clone())
            .await
            .unwrap()
            .resumed
    );
    assert!(
        handshake(addr, "localhost", client.clone())
            .await
            .unwrap()
            .resumed
    );

    let next = ca.leaf(&["localhost"], 30);
    dir.write(&next);
    assert!(set.reload().await.is_ok());
    wait_status(&set, |s| s.served[0].info.serial == next.serial).await;
    assert!(
        handshake(addr, "localhost", client).await.unwrap().resumed,
        "the session cache survives a rotation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_authenticated_by_a_removed_client_ca_cannot_resume() {
    init_tracing();
    let server_ca = Ca::new("server-ca");
    let (ca1, ca2) = (Ca::new("client-ca-1"), Ca::new("client-ca-2"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = PairDir::new(
        &tmp.path().join("tls"),
        Writer::Rename,
        &server_ca.leaf(&["localhost"], 30),
    );
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, format!("{}{}", ca1.cert_pem, ca2.cert_pem)).unwrap();
    let set = ServingSet::builder(dir.paths())
        .client_ca(&bundle, ClientAuth::Required)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client1 = client_config(&[&server_ca.cert_pem], Some(&ca1.client("one")));
    let client2 = client_config(&[&server_ca.cert_pem], Some(&ca2.client("two")));
    assert!(
        !handshake(addr, "localhost", client1.clone())
            .await
            .unwrap()
            .resumed
    );
    assert!(
        handshake(addr, "localhost", client1.clone())
            .await
            .unwrap()
            .resumed,
        "tickets work"
    );
    assert!(
        !handshake(addr, "localhost", client2.clone())
            .await
            .unwrap()
            .resumed
    );

    // Trust grows: sessions survive.
    let ca3 = Ca::new("client-ca-3");
    rename_into(
        &bundle,
        format!("{}{}{}", ca1.cert_pem, ca2.cert_pem, ca3.cert_pem).as_bytes(),
    );
    wait_status(&set, |s| s.generation == 2).await;
    assert!(
        handshake(addr, "localhost", client1.clone())
            .await
            .unwrap()
            .resumed
    );

    // Trust shrinks: CA 1 removed.
    rename_into(&bundle, ca2.cert_pem.as_bytes());
    wait_status(&set, |s| s.generation == 3).await;
    let err = handshake(addr, "localhost", client1.clone())
        .await
        .unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("unknown") || err.to_string().contains("alert"),
        "{err}"
    );
    // CA 2's client still gets in (with a full handshake: the cache was replaced).
    assert!(
        !handshake(addr, "localhost", client2.clone())
            .await
            .unwrap()
            .resumed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_side_follows_rotated_roots_and_identity() {
    init_tracing();
    let (server_ca1, server_ca2) = (Ca::new("server-ca-1"), Ca::new("server-ca-2"));
    let (client_ca1, client_ca2) = (Ca::new("client-ca-1"), Ca::new("client-ca-2"));
    let tmp = tempfile::tempdir().unwrap();
    // The server: certificate from server CA 2, accepts only client CA 2.
    let server_dir = PairDir::new(
        &tmp.path().join("server"),
        Writer::Rename,
        &server_ca2.leaf(&["localhost"], 30),
    );
    std::fs::write(tmp.path().join("client-ca.crt"), &client_ca2.cert_pem).unwrap();
    let server = ServingSet::builder(server_dir.paths())
        .client_ca(tmp.path().join("client-ca.crt"), ClientAuth::Required)
        .start()
        .await
        .unwrap();
    let addr = echo_server(server.acceptor()).await;

    // The client starts with the wrong roots and the wrong identity.
    let roots = tmp.path().join("roots.crt");
    std::fs::write(&roots, &server_ca1.cert_pem).unwrap();
    let mut identity = PairDir::new(
        &tmp.path().join("identity"),
        Writer::Kubelet,
        &client_ca1.client("me"),
    );
    let client = reload_lib::ClientTls::builder(&roots)
        .identity(identity.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let config = no_resumption(&client.config());
    let err = handshake(addr, "localhost", client.config())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    rename_into(&roots, server_ca2.cert_pem.as_bytes());
    let mut rx = client.subscribe();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.generation == 2))
        .await
        .unwrap()
        .unwrap();
    // Roots fixed; the server still refuses the identity.
    assert!(handshake(addr, "localhost", config.clone()).await.is_err());

    identity.write(&client_ca2.client("me-again"));
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.generation == 3))
        .await
        .unwrap()
        .unwrap();
    // The same ClientConfig object now succeeds.
    let seen = handshake(addr, "localhost", client.config()).await.unwrap();
    assert!(!seen.serial.is_empty());
}

/// For SNI tests that look at what the server sends rather than whether it verifies.
#[derive(Debug)]
struct AcceptAnything;

impl rustls::client::danger::ServerCertVerifier for AcceptAnything {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_update_revokes_a_client_certificate_and_its_sessions() {
    init_tracing();
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = PairDir::new(
        &tmp.path().join("tls"),
        Writer::Rename,
        &server_ca.leaf(&["localhost"], 30),
    );
    std::fs::write(tmp.path().join("client-ca.crt"), &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&crl, client_ca.crl(&[])).unwrap();
    let set = ServingSet::builder(dir.paths())
        .client_ca(tmp.path().join("client-ca.crt"), ClientAuth::Required)
        .client_crl(&crl)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let (alice, bob) = (client_ca.client("alice"), client_ca.client("bob"));
    let alice_client = client_config(&[&server_ca.cert_pem], Some(&alice));
    let bob_client = client_config(&[&server_ca.cert_pem], Some(&bob));
    handshake(addr, "localhost", alice_client.clone())
        .await
        .unwrap();
    assert!(
        handshake(addr, "localhost", alice_client.clone())
            .await
            .unwrap()
            .resumed
    );

    rename_into(&crl, client_ca.crl(&[alice.serial_number]).as_bytes());
    wait_status(&set, |s| s.generation == 2).await;
    let err = handshake(addr, "localhost", alice_client)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("Revoked") || err.to_string().contains("alert"),
        "{err}"
    );
    handshake(addr, "localhost", bob_client).await.unwrap();

    // A corrupt CRL keeps the last good one.
    rename_into(
        &crl,
        b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
    );
    let err = wait_status(&set, |s| s.last_error.is_some())
        .await
        .last_error
        .unwrap();
    assert!(
        matches!(err.invalid_material(), Some(InvalidMaterial::BadCrl { .. })),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_reloads_and_expose_expiry() {
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::Kubelet, &first);
    let mut registry = prometheus_client::registry::Registry::default();
    let set = ServingSet::builder(dir.paths())
        .name("api")
        .metrics(&mut registry)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    dir.write(&ca.leaf(&["localhost"], 30));
    wait_status(&set, |s| s.generation == 2).await;
    dir.write_raw(b"garbage", b"garbage");
    // Rejected, then retried (and rejected) shortly after: at least one failure.
    wait_status(&set, |s| s.reloads_failed >= 1).await;
    // The metrics task follows the status channel; give it a moment to catch up.
    let failures = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(r#"reload_reloads_total{set="api",result="error"} "#))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let text = loop {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        if failures(&text) >= 1 {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        text.contains(r#"reload_reloads_total{set="api",result="ok"} 2"#),
        "{text}"
    );
    assert!(text.contains(r#"reload_generation{set="api"} 2"#), "{text}");
    let not_after = set.status().served[0].info.not_after;
    assert!(
        text.contains(&format!(r#"reload_certificate_not_after_timestamp_seconds{{set="api",source="default"}} {not_after}"#)),
        "{text}"
    );
}
