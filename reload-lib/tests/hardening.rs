//! Ways trust could fail open, each shown with real files, real inotify and real handshakes
//! over 127.0.0.1: CRLs that fail open, session tickets surviving a trust shrink, hostile files,
//! .... A CRL replayed, dropped or shadowed: `crl_rollback.rs`. Key bytes in errors and logs:
//! `key_bytes.rs`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use reload_lib::{ClientAuth, InvalidMaterial, ServingSet};

// ---------------------------------------------------------------------------------------------
// Item 1: a configured CRL source must yield at least one parsed CRL.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_file_without_a_crl_is_refused_at_start_up_and_a_der_crl_is_read_as_der() {
    init_tracing();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    for (what, bytes) in [
        ("empty", &b""[..]),
        (
            "an HTML error page",
            b"<html><body>502 Bad Gateway</body></html>\n",
        ),
        ("a certificate", client_ca.cert_pem.as_bytes()),
        ("DER garbage", &[0x30, 0x03, 0x02, 0x01, 0x01][..]),
    ] {
        std::fs::write(&crl, bytes).unwrap();
        let err = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
            .await
            .expect_err(what);
        assert!(
            err.to_string().contains(&crl.display().to_string()),
            "{what}: {err}"
        );
    }

    // A DER CRL revoking alice is a CRL: alice is refused, bob gets in.
    let (alice, bob) = (client_ca.client("alice"), client_ca.client("bob"));
    std::fs::write(&crl, client_ca.crl_der(&[alice.serial_number])).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let alice_client = client_config(&[&server_ca.cert_pem], Some(&alice));
    let bob_client = client_config(&[&server_ca.cert_pem], Some(&bob));
    assert!(handshake(addr, "localhost", alice_client).await.is_err());
    handshake(addr, "localhost", bob_client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_replaced_by_something_that_is_not_a_crl_is_rejected_and_revocation_holds() {
    init_tracing();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    let alice = client_ca.client("alice");
    std::fs::write(&crl, client_ca.crl(&[alice.serial_number])).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let alice_client = no_resumption(&client_config(&[&server_ca.cert_pem], Some(&alice)));
    assert!(
        handshake(addr, "localhost", alice_client.clone())
            .await
            .is_err()
    );

    for (what, bytes) in [
        ("an HTML error page", &b"<html>404</html>\n"[..]),
        ("whitespace", b"\n\n"),
        ("a certificate", client_ca.cert_pem.as_bytes()),
    ] {
        let before = set.status().reloads_failed;
        rename_into(&crl, bytes);
        let status = wait_status(&set, |s| s.reloads_failed > before).await;
        let err = status.last_error.expect(what);
        assert!(
            err.to_string().contains(&crl.display().to_string()),
            "{what}: {err}"
        );
        assert_eq!(status.generation, 1, "{what}: nothing published");
        assert!(
            handshake(addr, "localhost", alice_client.clone())
                .await
                .is_err(),
            "{what}: alice is still revoked"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_and_recreating_the_crl_never_publishes_a_snapshot_without_it() {
    init_tracing();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    let alice = client_ca.client("alice");
    std::fs::write(&crl, client_ca.crl(&[alice.serial_number])).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let alice_client = no_resumption(&client_config(&[&server_ca.cert_pem], Some(&alice)));

    for round in 0..20u64 {
        // `rm; echo -n > file`, then the next CRL: the set must see the empty file (reject it)
        // before the good one arrives, and revocation must hold in between.
        let generation = set.status().generation;
        std::fs::remove_file(&crl).unwrap();
        std::fs::write(&crl, "").unwrap();
        let seen = wait_status(&set, |s| {
            s.generation > generation
                || s.last_error.as_ref().and_then(|e| e.invalid_material())
                    == Some(&InvalidMaterial::Empty)
        })
        .await;
        assert_eq!(
            seen.generation, generation,
            "round {round}: an empty CRL file was published"
        );
        assert!(
            handshake(addr, "localhost", alice_client.clone())
                .await
                .is_err(),
            "round {round}: alice got in"
        );
        std::fs::write(
            &crl,
            client_ca.crl(&[alice.serial_number, 1_000_000 + round]),
        )
        .unwrap();
        wait_status(&set, |s| {
            s.generation > generation && s.last_error.is_none()
        })
        .await;
    }
    assert!(
        handshake(addr, "localhost", alice_client).await.is_err(),
        "alice got in after the last round"
    );
}

// ---------------------------------------------------------------------------------------------
// Item 2: stateless tickets must not outlive a trust shrink, whatever `configure` does.

fn shared_ticketer(config: &mut rustls::ServerConfig) {
    static TICKETER: std::sync::OnceLock<Arc<dyn rustls::server::ProducesTickets>> =
        std::sync::OnceLock::new();
    config.ticketer =
        Arc::clone(TICKETER.get_or_init(|| rustls::crypto::aws_lc_rs::Ticketer::new().unwrap()));
    config.send_tls13_tickets = 4;
}

async fn resumption_after_trust_shrink(tls12: bool) {
    init_tracing();
    let server_ca = Ca::new("server-ca");
    let (ca1, ca2) = (Ca::new("client-ca-1"), Ca::new("client-ca-2"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, format!("{}{}", ca1.cert_pem, ca2.cert_pem)).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&crl, format!("{}{}", ca1.crl(&[]), ca2.crl(&[]))).unwrap();
    let set = mtls_set(
        tmp.path(),
        &server_ca,
        &bundle,
        Some(&crl),
        Some(shared_ticketer),
    )
    .await
    .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let make = |pair: &Pair| {
        if tls12 {
            client_config_tls12(&[&server_ca.cert_pem], Some(pair))
        } else {
            client_config(&[&server_ca.cert_pem], Some(pair))
        }
    };
    let (one, bob, carol) = (ca1.client("one"), ca2.client("bob"), ca2.client("carol"));
    let (one, bob, carol) = (make(&one), make(&bob), make(&carol));
    for client in [&one, &bob, &carol] {
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
                .resumed,
            "tickets work"
        );
    }

    // Revoke bob: his ticket must not bring him back in.
    std::fs::write(
        tmp.path().join("next.crl"),
        format!("{}{}", ca1.crl(&[]), ca2.crl(&[client_serial(&bob)])),
    )
    .unwrap();
    std::fs::rename(tmp.path().join("next.crl"), &crl).unwrap();
    wait_status(&set, |s| s.generation == 2).await;
    assert!(
        handshake(addr, "localhost", bob.clone()).await.is_err(),
        "a revoked client resumed (tls12: {tls12})"
    );

    // Remove CA 1: its client's ticket must not bring it back in.
    rename_into(&bundle, ca2.cert_pem.as_bytes());
    std::fs::write(&crl, ca2.crl(&[client_serial(&bob)])).unwrap();
    wait_status(&set, |s| {
        s.served.iter().filter(|c| c.source == "client-ca").count() == 1 && s.last_error.is_none()
    })
    .await;
    assert!(
        handshake(addr, "localhost", one.clone()).await.is_err(),
        "a client of a removed CA resumed (tls12: {tls12})"
    );
    // Carol is still trusted and gets in (a full handshake).
    assert!(!handshake(addr, "localhost", carol).await.unwrap().resumed);
}

/// The serial the client config presents (its leaf's), for CRLs.
fn client_serial(config: &Arc<rustls::ClientConfig>) -> u64 {
    let certified = config
        .client_auth_cert_resolver
        .resolve(&[], &[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
        .unwrap();
    let info = reload_lib::CertInfo::from_der(&certified.cert[0]).unwrap();
    u64::from_str_radix(&info.serial, 16).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_tickets_from_a_shared_ticketer_do_not_survive_a_trust_shrink() {
    resumption_after_trust_shrink(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_tickets_from_a_shared_ticketer_do_not_survive_a_trust_shrink() {
    resumption_after_trust_shrink(true).await;
}

// ---------------------------------------------------------------------------------------------
// Item 9: a CRL must be issued by a CA of the bundle.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_from_an_unrelated_ca_is_rejected() {
    init_tracing();
    let (server_ca, client_ca, stranger) = (
        Ca::new("server-ca"),
        Ca::new("client-ca"),
        Ca::new("stranger"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    std::fs::write(&crl, stranger.crl(&[])).unwrap();
    let err = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.invalid_material(),
            Some(InvalidMaterial::CrlIssuerUnknown { .. })
        ),
        "{err}"
    );

    std::fs::write(&crl, client_ca.crl(&[])).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let bob = no_resumption(&client_config(
        &[&server_ca.cert_pem],
        Some(&client_ca.client("bob")),
    ));
    handshake(addr, "localhost", bob.clone()).await.unwrap();
    rename_into(&crl, stranger.crl(&[]).as_bytes());
    let status = wait_status(&set, |s| s.last_error.is_some()).await;
    assert!(
        matches!(
            status.last_error.as_ref().unwrap().invalid_material(),
            Some(InvalidMaterial::CrlIssuerUnknown { .. })
        ),
        "{:?}",
        status.last_error
    );
    handshake(addr, "localhost", bob).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Item 4: hostile files at watched paths: regular files only, a size cap, nothing hangs.

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    assert!(
        std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_fifo_a_device_a_directory_or_a_huge_file_is_refused_without_hanging() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let good = ca.leaf(&["localhost"], 30);
    let dir = PairDir::new(tmp.path(), Writer::Rename, &good);
    let huge = tmp.path().join("huge");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let limit = Duration::from_secs(20);

    // At start-up: each is an error naming the file, quickly.
    type Make = Box<dyn Fn(&Path)>;
    let hostile: Vec<(&str, Make)> = vec![
        ("a FIFO", Box::new(mkfifo)),
        (
            "/dev/zero",
            Box::new(|p: &Path| {
                let _ = std::fs::remove_file(p);
                std::os::unix::fs::symlink("/dev/zero", p).unwrap();
            }),
        ),
        (
            "a directory",
            Box::new(|p: &Path| {
                let _ = std::fs::remove_file(p);
                std::fs::create_dir(p).unwrap();
            }),
        ),
        (
            "a 100 MiB file",
            Box::new(move |p: &Path| {
                let _ = std::fs::remove_file(p);
                std::os::unix::fs::symlink(&huge, p).unwrap();
            }),
        ),
    ];
    for (what, make) in &hostile {
        make(&dir.cert());
        let started = tokio::time::timeout(limit, ServingSet::builder(dir.paths()).start())
            .await
            .unwrap_or_else(|_| panic!("start() hung on {what}"));
        let err = started.expect_err(what);
        assert!(err.to_string().contains("tls.crt"), "{what}: {err}");
        if std::fs::metadata(dir.cert()).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir(dir.cert()).unwrap();
        } else {
            std::fs::remove_file(dir.cert()).unwrap();
        }
    }

    // After start-up, on a current-thread runtime: rejected, the old pair serves, the next good
    // write is picked up.
    rename_into(&dir.cert(), good.cert_pem.as_bytes());
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = no_resumption(&client_config(&[&ca.cert_pem], None));
    for (what, make) in &hostile {
        let before = set.status().reloads_failed;
        make(&dir.cert());
        let status = tokio::time::timeout(limit, async {
            let mut rx = set.subscribe();
            rx.wait_for(|s| s.reloads_failed > before)
                .await
                .unwrap()
                .clone()
        })
        .await
        .unwrap_or_else(|_| panic!("{what} was never rejected"));
        assert!(
            status.last_error.unwrap().to_string().contains("tls.crt"),
            "{what}"
        );
        let seen = tokio::time::timeout(limit, handshake(addr, "localhost", client.clone()))
            .await
            .unwrap_or_else(|_| panic!("the server hung on {what}"))
            .unwrap();
        assert_eq!(seen.serial, good.serial, "{what}");
        let _ = std::fs::remove_dir(dir.cert());
        let next = ca.leaf(&["localhost"], 30);
        rename_into(&dir.key(), next.key_pem.as_bytes());
        rename_into(&dir.cert(), next.cert_pem.as_bytes());
        tokio::time::timeout(
            limit,
            wait_for_serial(addr, "localhost", &client, &next.serial),
        )
        .await
        .unwrap_or_else(|_| panic!("the good write after {what} was not served"));
        rename_into(&dir.key(), good.key_pem.as_bytes());
        rename_into(&dir.cert(), good.cert_pem.as_bytes());
        wait_for_serial(addr, "localhost", &client, &good.serial).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Item 8: not-yet-valid chains, intermediates' validity, CRL nextUpdate.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_yet_valid_or_expired_intermediate_chain_never_replaces_a_valid_one() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let good = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::Kubelet, &good);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();

    let future = ca.leaf_between(
        &["localhost"],
        time::Duration::days(1),
        time::Duration::days(30),
    );
    dir.write(&future);
    let status = wait_status(&set, |s| s.last_error.is_some()).await;
    assert!(
        matches!(reason(&status), Some(InvalidMaterial::NotYetValid { .. })),
        "{:?}",
        status.last_error
    );

    // A valid leaf under an expired intermediate: the chain is expired.
    let intermediate = ca.intermediate("expired-intermediate", -1);
    let leaf = intermediate.leaf(&["localhost"], 30);
    dir.write_raw(
        leaf.chain_with(&intermediate).as_bytes(),
        leaf.key_pem.as_bytes(),
    );
    let status = wait_status(&set, |s| {
        matches!(reason(s), Some(InvalidMaterial::Expired { .. }))
    })
    .await;
    assert_eq!(status.generation, 1);
    assert_eq!(set.current().certificate_for(None).serial, good.serial);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_crl_never_replaces_a_fresh_one() {
    init_tracing();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    let alice = client_ca.client("alice");
    std::fs::write(&crl, client_ca.crl(&[alice.serial_number])).unwrap();
    let set = mtls_set(tmp.path(), &server_ca, &bundle, Some(&crl), None)
        .await
        .unwrap();
    // An old CRL (past its nextUpdate) that does not list alice, replayed.
    rename_into(
        &crl,
        client_ca
            .crl_next_update(&[], -time::Duration::hours(1))
            .as_bytes(),
    );
    let status = wait_status(&set, |s| s.last_error.is_some()).await;
    assert!(
        matches!(reason(&status), Some(InvalidMaterial::CrlStale { .. })),
        "{:?}",
        status.last_error
    );
    let addr = echo_server(set.acceptor()).await;
    let alice = no_resumption(&client_config(&[&server_ca.cert_pem], Some(&alice)));
    assert!(handshake(addr, "localhost", alice).await.is_err());
}

// ---------------------------------------------------------------------------------------------
// Item 10: a shorter chain read mid-write does not replace the full one at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_that_lost_its_intermediate_is_refused_until_it_is_read_again_unchanged() {
    init_tracing();
    let root = Ca::new("root");
    let intermediate = root.intermediate("intermediate", 365);
    let tmp = tempfile::tempdir().unwrap();
    let leaf = intermediate.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::InPlace, &leaf);
    dir.write_raw(
        leaf.chain_with(&intermediate).as_bytes(),
        leaf.key_pem.as_bytes(),
    );
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    assert_eq!(set.current().certified_key_for(None).cert.len(), 2);
    let mut rx = set.subscribe();
    // What a reader sees between the leaf and the intermediate of an in-place write (written
    // here by rename, so that the truncation is not seen first).
    rename_into(&dir.cert(), leaf.cert_pem.as_bytes());
    let first = tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .unwrap()
        .map(|()| rx.borrow_and_update().clone())
        .unwrap();
    assert!(
        matches!(reason(&first), Some(InvalidMaterial::ChainShortened { .. })),
        "the first pass must refuse the shortened chain: {:?} (generation {})",
        first.last_error,
        first.generation
    );
    // Read again unchanged: a deliberate change, accepted.
    wait_status(&set, |s| s.generation == 2 && s.last_error.is_none()).await;
    assert_eq!(set.current().certified_key_for(None).cert.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Item 11: a set outlives the runtime that started it.

#[test]
fn a_set_keeps_reloading_after_the_runtime_that_started_it_shut_down() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let mut dir = PairDir::new(tmp.path(), Writer::Rename, &ca.leaf(&["localhost"], 30));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let set = runtime
        .block_on(
            ServingSet::builder(dir.paths())
                .resync_interval(None)
                .start(),
        )
        .unwrap();
    drop(runtime);
    let next = ca.leaf(&["localhost"], 30);
    dir.write(&next);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while set.current().certificate_for(None).serial != next.serial {
        assert!(
            std::time::Instant::now() < deadline,
            "the rotation was not picked up: {:?}",
            set.status()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------------
// Item 12: the client side applies the server's rules to its identity.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_identity_never_replaces_a_valid_one() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let roots = tmp.path().join("roots.crt");
    std::fs::write(&roots, &ca.cert_pem).unwrap();
    let me = ca.client("me");
    let mut identity = PairDir::new(&tmp.path().join("identity"), Writer::Kubelet, &me);
    let client = reload_lib::ClientTls::builder(&roots)
        .identity(identity.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    identity.write(&ca.leaf(&["me"], -1));
    let mut rx = client.subscribe();
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.last_error.is_some() || s.generation > 1),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    assert!(
        matches!(reason(&status), Some(InvalidMaterial::Expired { .. })),
        "{:?} generation {}",
        status.last_error,
        status.generation
    );
    assert_eq!(client.status().served[0].info.serial, me.serial);
}

// ---------------------------------------------------------------------------------------------
// Item 13: no task per dropped set; a writer that keeps the file open is seen.

#[tokio::test(flavor = "current_thread")]
async fn dropped_sets_leave_no_sighup_task_behind() {
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = PairDir::new(tmp.path(), Writer::Rename, &ca.leaf(&["localhost"], 30));
    let metrics = tokio::runtime::Handle::current().metrics();
    let base = metrics.num_alive_tasks();
    for _ in 0..20 {
        let set = ServingSet::builder(dir.paths())
            .resync_interval(None)
            .start()
            .await
            .unwrap();
        set.reload_on_sighup().unwrap();
        drop(set);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > base {
        assert!(
            std::time::Instant::now() < deadline,
            "{} tasks left behind",
            metrics.num_alive_tasks() - base
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_file_kept_open_is_seen_before_it_is_closed() {
    use std::io::Write as _;
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let roots = tmp.path().join("roots.crt");
    let (ca1, ca2) = (Ca::new("one"), Ca::new("two"));
    std::fs::write(&roots, &ca1.cert_pem).unwrap();
    let client = reload_lib::ClientTls::builder(&roots)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&roots)
        .unwrap();
    file.write_all(ca2.cert_pem.as_bytes()).unwrap();
    file.flush().unwrap();
    let mut rx = client.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.served.len() == 2),
    )
    .await
    .expect("an append to a file still open was not seen")
    .unwrap();
    drop(file);
}

// ---------------------------------------------------------------------------------------------
// Item 14: `ClientAuth::Request` completes the handshake and hands over the verdict.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_mode_completes_every_handshake_and_reports_what_the_certificate_proved() {
    use reload_lib::ClientIdentity;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init_tracing();
    let (server_ca, client_ca, stranger) = (
        Ca::new("server-ca"),
        Ca::new("client-ca"),
        Ca::new("stranger"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = PairDir::new(
        &tmp.path().join("tls"),
        Writer::Rename,
        &server_ca.leaf(&["localhost"], 30),
    );
    let bundle = tmp.path().join("client-ca.crt");
    std::fs::write(&bundle, &client_ca.cert_pem).unwrap();
    let crl = tmp.path().join("client-ca.crl");
    let revoked = client_ca.client("revoked");
    std::fs::write(&crl, client_ca.crl(&[revoked.serial_number])).unwrap();
    let set = ServingSet::builder(dir.paths())
        .client_ca(&bundle, ClientAuth::Request)
        .client_crl(&crl)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = set.acceptor();
    // The server answers each connection with the verdict.
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok((mut tls, identity)) = acceptor.accept_with_identity(tcp).await else {
                    return;
                };
                let verdict = match identity {
                    ClientIdentity::Verified(leaf) => format!("verified {}", leaf.subject),
                    ClientIdentity::Rejected { reason, .. } => format!("rejected {reason}"),
                    _ => "anonymous".to_owned(),
                };
                let _ = tls.write_all(verdict.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let verdict = |config: Arc<rustls::ClientConfig>| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(config);
        let mut tls = connector
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .expect("the handshake completes");
        let mut reply = String::new();
        tls.read_to_string(&mut reply).await.unwrap();
        reply
    };
    let roots = [server_ca.cert_pem.as_str()];
    let alice = client_config(&roots, Some(&client_ca.client("alice")));
    assert_eq!(verdict(no_resumption(&alice)).await, "verified CN=alice");
    assert_eq!(verdict(client_config(&roots, None)).await, "anonymous");
    for (what, pair) in [
        ("expired", client_ca.client_valid_for("old", -1)),
        ("unknown issuer", stranger.client("mallory")),
        ("revoked", revoked),
    ] {
        let reply = verdict(client_config(&roots, Some(&pair))).await;
        assert!(reply.starts_with("rejected "), "{what}: {reply}");
    }

    // Resumed sessions are checked against the trust in force: alice's CA removed.
    assert!(verdict(alice.clone()).await.starts_with("verified"));
    let other = Ca::new("other-client-ca");
    rename_into(&bundle, other.cert_pem.as_bytes());
    rename_into(&crl, other.crl(&[]).as_bytes());
    wait_status(&set, |s| {
        s.last_error.is_none()
            && s.served
                .iter()
                .any(|c| c.info.subject == "CN=other-client-ca")
    })
    .await;
    let reply = verdict(alice).await;
    assert!(reply.starts_with("rejected "), "{reply}");
}

// ---------------------------------------------------------------------------------------------
// Item 15: Kubernetes Pod Certificates (one credential-bundle file: key + chain) and
// ClusterTrustBundle projections (a file of CA certificates), in projected volumes written the
// kubelet's way (`..data` swaps).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_certificate_bundles_serve_and_cluster_trust_bundles_trust_across_rotations() {
    use reload_lib::fs::{AtomicDirWriter, FileContent};
    use std::collections::BTreeMap;
    init_tracing();
    let root = Ca::new("signer-root");
    let signer = root.intermediate("signer", 365);
    let tmp = tempfile::tempdir().unwrap();
    // What the kubelet projects for a pod: `podCertificate` with `credentialBundlePath`
    // (PRIVATE KEY block, then the chain, leaf first) and `clusterTrustBundle` with `path`.
    let project = |writer: &AtomicDirWriter, pair: &Pair, trust: &str| {
        let files = BTreeMap::from([
            (
                "credentialbundle.pem".to_owned(),
                FileContent::new(
                    format!("{}{}", pair.key_pem, pair.chain_with(&signer)).into_bytes(),
                    0o600,
                ),
            ),
            (
                "trust-bundle.pem".to_owned(),
                FileContent::new(trust.as_bytes().to_vec(), 0o644),
            ),
        ]);
        writer.write(&files).unwrap();
    };
    let server_volume = AtomicDirWriter::new(tmp.path().join("server"));
    let client_volume = AtomicDirWriter::new(tmp.path().join("client"));
    let server_pair = signer.leaf(&["api.ns.svc"], 1);
    project(&server_volume, &server_pair, &root.cert_pem);
    project(
        &client_volume,
        &signer.client("system:serviceaccount:ns:app"),
        &root.cert_pem,
    );

    let set = ServingSet::builder(reload_lib::CertKeyPaths::bundle(
        server_volume.dir().join("credentialbundle.pem"),
    ))
    .client_ca(
        server_volume.dir().join("trust-bundle.pem"),
        ClientAuth::Required,
    )
    .resync_interval(None)
    .start()
    .await
    .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = reload_lib::ClientTls::builder(client_volume.dir().join("trust-bundle.pem"))
        .identity(reload_lib::CertKeyPaths::bundle(
            client_volume.dir().join("credentialbundle.pem"),
        ))
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let seen = handshake(addr, "api.ns.svc", no_resumption(&client.config()))
        .await
        .unwrap();
    assert_eq!(seen.serial, server_pair.serial);
    assert_eq!(set.current().certified_key_for(None).cert.len(), 2);

    // Short-lived credentials rotate; both sides follow.
    for _ in 0..3 {
        let next = signer.leaf(&["api.ns.svc"], 1);
        project(&server_volume, &next, &root.cert_pem);
        project(
            &client_volume,
            &signer.client("system:serviceaccount:ns:app"),
            &root.cert_pem,
        );
        wait_for_serial(
            addr,
            "api.ns.svc",
            &no_resumption(&client.config()),
            &next.serial,
        )
        .await;
    }
    // An empty ClusterTrustBundle projection (no bundle matched the selector) is refused: the
    // client keeps trusting the last good roots instead of trusting nothing.
    project(
        &client_volume,
        &signer.client("system:serviceaccount:ns:app"),
        "",
    );
    let mut rx = client.subscribe();
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.last_error.is_some()),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    assert_eq!(
        status.last_error.unwrap().invalid_material(),
        Some(&InvalidMaterial::Empty)
    );
    handshake(addr, "api.ns.svc", no_resumption(&client.config()))
        .await
        .unwrap();
}
