//! A reload never undoes a revocation, shown with real files, real inotify and real TLS
//! handshakes over 127.0.0.1 (the rules: `src/policy/crls.rs`). An older CRL of the same series
//! (issuer, key, scope) replayed while still unexpired is refused, also when its CA left the
//! bundle and came back, and also for a partitioned CRL that is not its issuer's first; a CRL
//! dropped while its CA stays (or a CA back without the CRLs it had) is refused; a new CRL put
//! before the one that led its issuer is refused. Each time the CRLs in force keep revoking.

mod common;

use std::path::Path;

use common::*;
use reload_lib::{InvalidMaterial, ServingSet};

/// Renames `files` into place in order, waits until the set rejects what they make for the
/// reason `expected`, and checks it: a failed reload, the CRL file `named`, nothing published.
async fn refused(
    set: &ServingSet,
    files: &[(&Path, &str)],
    named: &Path,
    expected: fn(&InvalidMaterial) -> bool,
) {
    let (before, generation) = (set.status().reloads_failed, set.status().generation);
    for (path, content) in files {
        rename_into(path, content.as_bytes());
    }
    let status = wait_status(set, |s| {
        s.reloads_failed > before && reason(s).as_ref().is_some_and(expected)
    })
    .await;
    let err = status.last_error.as_ref().expect("a rejection").to_string();
    assert!(err.contains(&named.display().to_string()), "{err}");
    assert_eq!(status.generation, generation, "nothing published: {err}");
}

/// Replaces `crl` by `bytes` and checks the rejection as [`refused`] does.
async fn crl_reload_refused(
    set: &ServingSet,
    crl: &Path,
    bytes: &[u8],
    expected: fn(&InvalidMaterial) -> bool,
) {
    let text = std::str::from_utf8(bytes).expect("PEM CRLs");
    refused(set, &[(crl, text)], crl, expected).await;
}

/// A client of `server_ca`'s `localhost` presenting `pair`, without resumption.
fn client(server_ca: &Ca, pair: &Pair) -> std::sync::Arc<rustls::ClientConfig> {
    no_resumption(&client_config(&[&server_ca.cert_pem], Some(pair)))
}

/// A server CA, a client CA, a temporary directory and the client CA's bundle file in it.
fn one_client_ca() -> (Ca, Ca, tempfile::TempDir, std::path::PathBuf) {
    init_tracing();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    (server_ca, client_ca, tmp, bundle)
}

fn is_older(reason: &InvalidMaterial) -> bool {
    matches!(reason, InvalidMaterial::CrlOlder { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_unexpired_crl_never_replaces_a_newer_one() {
    let (server_ca, client_ca, tmp, bundle) = one_client_ca();
    let (alice, bob) = (client_ca.client("alice"), client_ca.client("bob"));
    // The kit numbers CRLs in the order they are made: `before` precedes `revoking_alice`. Both
    // are fresh (nextUpdate in a day), so only their order tells them apart.
    let before = client_ca.crl(&[]);
    let revoking_alice = client_ca.crl(&[alice.serial_number]);
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&crl, &revoking_alice).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let alice_serial = alice.serial_number;
    let alice = no_resumption(&client_config(&[&server_ca.cert_pem], Some(&alice)));
    let bob_config = no_resumption(&client_config(&[&server_ca.cert_pem], Some(&bob)));
    assert!(handshake(addr, "localhost", alice.clone()).await.is_err());
    handshake(addr, "localhost", bob_config.clone())
        .await
        .expect("bob is not revoked");

    // The older CRL, replayed: refused, alice stays out.
    crl_reload_refused(&set, &crl, before.as_bytes(), |r| {
        matches!(r, InvalidMaterial::CrlOlder { .. })
    })
    .await;
    assert!(
        handshake(addr, "localhost", alice.clone()).await.is_err(),
        "an older CRL un-revoked alice"
    );
    // A newer one listed after the older one: rustls checks with the first CRL of an issuer, so
    // the file is as old as its first CRL of that issuer.
    let newer = client_ca.crl(&[alice_serial, bob.serial_number]);
    crl_reload_refused(&set, &crl, format!("{before}{newer}").as_bytes(), |r| {
        matches!(r, InvalidMaterial::CrlOlder { .. })
    })
    .await;
    assert!(handshake(addr, "localhost", alice.clone()).await.is_err());

    // A newer CRL is accepted at once: it revokes bob as well.
    rename_into(&crl, newer.as_bytes());
    wait_status(&set, |s| s.generation == 2 && s.last_error.is_none()).await;
    assert!(handshake(addr, "localhost", alice).await.is_err());
    assert!(
        handshake(addr, "localhost", bob_config).await.is_err(),
        "the newer CRL revokes bob"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_dropped_while_its_ca_stays_trusted_is_refused() {
    init_tracing();
    let server_ca = Ca::new("server-ca");
    let (ca1, ca2) = (Ca::new("client-ca-1"), Ca::new("client-ca-2"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, format!("{}{}", ca1.cert_pem, ca2.cert_pem)).unwrap();
    let (alice, bob, carol) = (ca1.client("alice"), ca1.client("bob"), ca2.client("carol"));
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(
        &crl,
        format!("{}{}", ca1.crl(&[alice.serial_number]), ca2.crl(&[])),
    )
    .unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let config = |pair: &Pair| no_resumption(&client_config(&[&server_ca.cert_pem], Some(pair)));
    let (alice, bob, carol) = (config(&alice), config(&bob), config(&carol));
    assert!(handshake(addr, "localhost", alice.clone()).await.is_err());
    handshake(addr, "localhost", bob.clone()).await.unwrap();
    handshake(addr, "localhost", carol.clone()).await.unwrap();

    // CA 1's CRL is gone (a newer CRL of CA 2 alone) while CA 1 stays in the bundle: refused,
    // and the CRLs in force keep serving: alice out, bob and carol in.
    crl_reload_refused(&set, &crl, ca2.crl(&[]).as_bytes(), |r| {
        matches!(r, InvalidMaterial::CrlDropped { issuer, .. } if issuer.contains("client-ca-1"))
    })
    .await;
    assert!(
        handshake(addr, "localhost", alice.clone()).await.is_err(),
        "alice is still revoked"
    );
    handshake(addr, "localhost", bob.clone())
        .await
        .expect("the last good CRLs keep serving: bob gets in");
    handshake(addr, "localhost", carol.clone()).await.unwrap();

    // Removing CA 1 with its CRL is a shrink of trust, accepted: CA 1's clients are out.
    rename_into(&bundle, ca2.cert_pem.as_bytes());
    rename_into(&crl, ca2.crl(&[]).as_bytes());
    wait_status(&set, |s| {
        s.served.iter().filter(|c| c.source == "client-ca").count() == 1 && s.last_error.is_none()
    })
    .await;
    assert!(handshake(addr, "localhost", alice).await.is_err());
    assert!(handshake(addr, "localhost", bob).await.is_err());
    handshake(addr, "localhost", carol).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_removed_and_re_added_with_an_older_crl_does_not_un_revoke() {
    init_tracing();
    let server_ca = Ca::new("server-ca");
    let (ca1, ca2) = (Ca::new("client-ca-1"), Ca::new("client-ca-2"));
    let tmp = tempfile::tempdir().unwrap();
    let (alice, bob, carol) = (ca1.client("alice"), ca1.client("bob"), ca2.client("carol"));
    // Numbered in the order made: `old` (alice not yet revoked) precedes `revoking_alice`.
    let old = ca1.crl(&[]);
    let revoking_alice = ca1.crl(&[alice.serial_number]);
    let ca2_crl = ca2.crl(&[]);
    let both = format!("{}{}", ca1.cert_pem, ca2.cert_pem);
    let bundle = tmp.path().join("client-ca.crt");
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&bundle, &both).unwrap();
    std::fs::write(&crl, format!("{revoking_alice}{ca2_crl}")).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let (alice, bob, carol) = (
        client(&server_ca, &alice),
        client(&server_ca, &bob),
        client(&server_ca, &carol),
    );
    assert!(handshake(addr, "localhost", alice.clone()).await.is_err());
    handshake(addr, "localhost", bob.clone()).await.unwrap();

    // CA 1 leaves the bundle with its CRL: accepted, its clients are out.
    rename_into(&crl, ca2_crl.as_bytes());
    rename_into(&bundle, ca2.cert_pem.as_bytes());
    wait_status(&set, |s| {
        s.served.iter().filter(|c| c.source == "client-ca").count() == 1 && s.last_error.is_none()
    })
    .await;
    assert!(handshake(addr, "localhost", bob.clone()).await.is_err());

    // CA 1 back with its older CRL: refused, alice is not un-revoked.
    refused(
        &set,
        &[(&crl, &format!("{old}{ca2_crl}")), (&bundle, &both)],
        &crl,
        is_older,
    )
    .await;
    assert!(
        handshake(addr, "localhost", alice.clone()).await.is_err(),
        "CA 1 removed and re-added with an older CRL un-revoked alice"
    );
    // CA 1 back without any CRL: refused as well (its revocations were checked).
    refused(
        &set,
        &[(&crl, &ca2_crl), (&bundle, &both)],
        &crl,
        |r| matches!(r, InvalidMaterial::CrlDropped { issuer, .. } if issuer.contains("client-ca-1")),
    )
    .await;
    assert!(handshake(addr, "localhost", alice.clone()).await.is_err());
    handshake(addr, "localhost", carol.clone()).await.unwrap();

    // CA 1 back with the CRL it left with: accepted; bob in, alice still out.
    rename_into(&crl, format!("{revoking_alice}{ca2_crl}").as_bytes());
    wait_status(&set, |s| {
        s.served.iter().filter(|c| c.source == "client-ca").count() == 2 && s.last_error.is_none()
    })
    .await;
    handshake(addr, "localhost", bob).await.unwrap();
    handshake(addr, "localhost", carol).await.unwrap();
    assert!(handshake(addr, "localhost", alice).await.is_err());
}

const PARTITION_A: &str = "http://crl.example/partition-a.crl";
const PARTITION_B: &str = "http://crl.example/partition-b.crl";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_partitioned_crl_is_refused_even_when_it_is_not_the_first() {
    let (server_ca, client_ca, tmp, bundle) = one_client_ca();
    let issue =
        |cn: &str, uri: &str| client_ca.issue(&CertSpec::client(cn).crl_distribution_point(uri));
    let (alice, carol, dave) = (
        issue("alice", PARTITION_A),
        issue("carol", PARTITION_B),
        issue("dave", PARTITION_B),
    );
    // Partition B's CRLs in order: `b_old` revokes nobody, `b_new` revokes carol.
    let b_old = client_ca.crl_scoped(&[], PARTITION_B);
    let a = client_ca.crl_scoped(&[], PARTITION_A);
    let b_new = client_ca.crl_scoped(&[carol.serial_number], PARTITION_B);
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&crl, format!("{a}{b_new}")).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let (alice, carol, dave) = (
        client(&server_ca, &alice),
        client(&server_ca, &carol),
        client(&server_ca, &dave),
    );
    // Each client checked against its own partition's CRL.
    handshake(addr, "localhost", alice.clone()).await.unwrap();
    handshake(addr, "localhost", dave.clone()).await.unwrap();
    assert!(handshake(addr, "localhost", carol.clone()).await.is_err());

    // Partition B rolled back behind an unchanged (then a newer) partition A: refused.
    crl_reload_refused(&set, &crl, format!("{a}{b_old}").as_bytes(), is_older).await;
    let a_newer = client_ca.crl_scoped(&[], PARTITION_A);
    crl_reload_refused(&set, &crl, format!("{a_newer}{b_old}").as_bytes(), is_older).await;
    assert!(
        handshake(addr, "localhost", carol.clone()).await.is_err(),
        "a rolled back partition un-revoked carol"
    );
    handshake(addr, "localhost", dave).await.unwrap();

    // Partition A moves on alone: accepted, carol still out.
    rename_into(&crl, format!("{a_newer}{b_new}").as_bytes());
    wait_status(&set, |s| s.generation == 2 && s.last_error.is_none()).await;
    assert!(handshake(addr, "localhost", carol).await.is_err());
    handshake(addr, "localhost", alice).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_crl_put_first_cannot_hide_the_revocations_of_the_one_that_led() {
    let (server_ca, client_ca, tmp, bundle) = one_client_ca();
    // Alice's certificate names no CRL distribution point: rustls checks her against the first
    // CRL of her issuer, whatever its scope.
    let alice = client_ca.client("alice");
    let whole = client_ca.crl(&[alice.serial_number]);
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&crl, &whole).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let alice = client(&server_ca, &alice);
    assert!(handshake(addr, "localhost", alice.clone()).await.is_err());

    // A newer partitioned CRL (revoking nobody) put before it: it would take alice over.
    let partition = client_ca.crl_scoped(&[], PARTITION_B);
    crl_reload_refused(&set, &crl, format!("{partition}{whole}").as_bytes(), |r| {
        matches!(r, InvalidMaterial::CrlReordered { .. })
    })
    .await;
    assert!(
        handshake(addr, "localhost", alice.clone()).await.is_err(),
        "a CRL put first un-revoked alice"
    );
    // After it: accepted, alice still out.
    rename_into(&crl, format!("{whole}{partition}").as_bytes());
    wait_status(&set, |s| s.generation == 2 && s.last_error.is_none()).await;
    assert!(handshake(addr, "localhost", alice).await.is_err());
}
