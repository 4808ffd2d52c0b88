//! The real kube-apiserver as the consumer of what `cert-syncer sync` writes: it serves an SNI
//! certificate from a synced Secret directory (`--tls-sni-cert-key`) and authenticates client
//! certificates against a synced CA bundle (`--client-ca-file`), and reloads both through its
//! own file watches (an inotify watch on each file, no periodic re-read: see
//! `reload_lib::fs`'s consumer contract). Every one of 100 consecutive updates made through the
//! API must be picked up, p99 within 1 s. Skips (passing, with `SKIP: <reason>`) when no real
//! kube-apiserver is available (see `e2e::envtest`).

use std::time::{Duration, Instant};

use e2e::envtest::RealApiServer;
use e2e::syncer::{NS, bundle_config_map, read, tls_secret};
use e2e::tls::p50_p99;
use e2e::{Ca, CertSpec, Syncer, handshake_leaf, install_crypto_provider, require_real_apiserver};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};

/// Consecutive updates measured.
const UPDATES: usize = 100;
/// The bound each update is held to (the p99 is asserted against 1 s; one update may take this
/// long before the run counts it as not served).
const SERVED_WITHIN: Duration = Duration::from_secs(10);
/// The first update after the apiserver restart waits for the syncer to reconnect.
const WARM_UP_WITHIN: Duration = Duration::from_secs(60);

/// Waits (bounded, 60 s) for `path` to exist.
async fn wait_for_file(path: &std::path::Path) {
    e2e::wait_until(
        &format!("{} to be synced", path.display()),
        Duration::from_secs(60),
        || async { read(path).is_some() },
    )
    .await;
}

/// Polls `served` until it holds or `within` passes; returns the time it took.
async fn time_until<F, Fut>(within: Duration, mut served: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < within {
        if served().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn report(what: &str, latencies: &[Duration], missed: &[usize]) {
    let (p50, p99) = p50_p99(latencies);
    let max = latencies.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{what}: {} of {UPDATES} updates served; update -> served p50 {} ms, p99 {} ms, max {} ms",
        latencies.len(),
        p50.as_millis(),
        p99.as_millis(),
        max.as_millis()
    );
    assert!(missed.is_empty(), "{what}: updates not served: {missed:?}");
    assert_eq!(latencies.len(), UPDATES);
    assert!(
        p99 <= Duration::from_secs(1),
        "{what}: p99 {p99:?} is over 1 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_serves_every_synced_sni_certificate_update() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("apiserver");
    let mut api = tokio::task::block_in_place(|| RealApiServer::start(&dir));
    api.create_namespace(NS).await;
    let secrets: Api<Secret> = Api::namespaced(api.recovery_client(), NS);
    let ca = Ca::default();
    let first = ca.issue(&CertSpec::server(&["localhost"]));
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving-cert", &first.cert_pem, &first.key_pem),
        )
        .await
        .unwrap();
    let dest = tmp.path().join("resources");
    let _syncer = Syncer::start(&api, &dest, &["--secrets", "serving-cert"]);
    let synced = dest.join("secrets/serving-cert");
    wait_for_file(&synced.join("tls.crt")).await;

    // The apiserver now serves `localhost` from the synced directory, as the static pod does.
    tokio::task::block_in_place(|| {
        api.restart_with_args(&[
            "--tls-sni-cert-key".to_owned(),
            format!(
                "{},{}:localhost",
                synced.join("tls.crt").display(),
                synced.join("tls.key").display()
            ),
        ]);
    });
    let addr = api.addr();
    assert_eq!(
        handshake_leaf(addr, "localhost", &ca.cert_pem)
            .await
            .unwrap()
            .serial,
        first.serial,
        "serves the synced pair after the restart"
    );

    let mut latencies = Vec::new();
    let mut missed = Vec::new();
    for update in 0..=UPDATES {
        let issued = ca.issue(&CertSpec::server(&["localhost"]));
        let start = Instant::now();
        secrets
            .replace(
                "serving-cert",
                &PostParams::default(),
                &tls_secret("serving-cert", &issued.cert_pem, &issued.key_pem),
            )
            .await
            .unwrap();
        let within = if update == 0 {
            WARM_UP_WITHIN
        } else {
            SERVED_WITHIN
        };
        let served = time_until(within, || async {
            handshake_leaf(addr, "localhost", &ca.cert_pem)
                .await
                .is_ok_and(|leaf| leaf.serial == issued.serial)
        })
        .await
        .map(|_| start.elapsed());
        match (update, served) {
            (0, Some(_)) => {} // the warm-up: the syncer may still be reconnecting
            (_, Some(latency)) => latencies.push(latency),
            (_, None) => missed.push(update),
        }
        assert!(
            update > 0 || served.is_some(),
            "the first update after the restart was not served within {WARM_UP_WITHIN:?}:\n{}",
            api.log_tail("kube-apiserver.log")
        );
    }
    report(
        "kube-apiserver --tls-sni-cert-key from cert-syncer sync",
        &latencies,
        &missed,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_accepts_client_certificates_of_every_synced_ca_bundle_update() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("apiserver");
    let mut api = tokio::task::block_in_place(|| RealApiServer::start(&dir));
    api.create_namespace(NS).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(api.recovery_client(), NS);
    let mut previous = Ca::default();
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("client-ca", &previous.cert_pem),
        )
        .await
        .unwrap();
    let dest = tmp.path().join("resources");
    let _syncer = Syncer::start(&api, &dest, &["--configmaps", "client-ca"]);
    let bundle = dest.join("configmaps/client-ca/ca-bundle.crt");
    wait_for_file(&bundle).await;
    tokio::task::block_in_place(|| {
        api.restart_with_args(&[format!("--client-ca-file={}", bundle.display())]);
    });
    assert!(
        api.authenticates_client_cert(&mut previous, "client-start")
            .await,
        "a client certificate of the synced bundle is accepted after the restart"
    );
    assert!(
        !api.authenticates_client_cert(&mut Ca::default(), "stranger")
            .await,
        "a client certificate of an unknown CA is not"
    );

    let mut latencies = Vec::new();
    let mut missed = Vec::new();
    for update in 0..=UPDATES {
        // Rotation as a CA bundle carries it: the previous CA and the new one.
        let mut next = Ca::default();
        let start = Instant::now();
        config_maps
            .replace(
                "client-ca",
                &PostParams::default(),
                &bundle_config_map(
                    "client-ca",
                    &format!("{}{}", previous.cert_pem, next.cert_pem),
                ),
            )
            .await
            .unwrap();
        let within = if update == 0 {
            WARM_UP_WITHIN
        } else {
            SERVED_WITHIN
        };
        let user = format!("client-{update}");
        let mut served = None;
        while start.elapsed() < within {
            if api.authenticates_client_cert(&mut next, &user).await {
                served = Some(start.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        match (update, served) {
            (0, Some(_)) => {}
            (_, Some(latency)) => latencies.push(latency),
            (_, None) => missed.push(update),
        }
        assert!(
            update > 0 || served.is_some(),
            "the first update after the restart was not picked up within {WARM_UP_WITHIN:?}:\n{}",
            api.log_tail("kube-apiserver.log")
        );
        previous = next;
    }
    report(
        "kube-apiserver --client-ca-file from cert-syncer sync",
        &latencies,
        &missed,
    );
}
