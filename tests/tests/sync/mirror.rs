//! `cert-syncer sync` as a process against an apiserver (`mini-apiserver` and the real
//! kube-apiserver: every scenario runs on both, see `e2e::both_backends!`) over TLS with SNI
//! `localhost-recovery` and a token: Secrets and ConfigMaps mirrored to disk, read by
//! `https-server` through reload-lib.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::syncer::{NS, read, tls_secret};
use e2e::{Backend, Ca, Server, Syncer, TestApi, bin, both_backends, install_crypto_provider};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, PostParams};

/// The bound on each wait for the processes to act (a limit, not a delay).
const WITHIN: Duration = Duration::from_secs(20);

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// What [`seed_serving_cert_and_client_ca`] created, and the clients to change it.
struct Seeded {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    ca: Ca,
    cert: String,
    key: String,
}

/// Creates, in `NS`, the Secret `serving-cert` (a `localhost` leaf) and the ConfigMap `client-ca`
/// (its CA in `ca-bundle.crt`): the objects every scenario here syncs.
async fn seed_serving_cert_and_client_ca(api: &TestApi) -> Seeded {
    let client = api.recovery_client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, NS);
    let ca = Ca::default();
    let (cert, key, _) = ca.localhost_leaf();
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving-cert", &cert, &key),
        )
        .await
        .unwrap();
    config_maps
        .create(
            &PostParams::default(),
            &e2e::syncer::bundle_config_map("client-ca", &ca.cert_pem),
        )
        .await
        .unwrap();
    Seeded {
        secrets,
        config_maps,
        ca,
        cert,
        key,
    }
}

both_backends!(
    secrets_and_config_maps_are_mirrored_and_served_by_a_reloading_server,
    a_key_that_would_escape_or_shadow_the_layout_is_refused_and_nothing_is_written,
    files_changed_or_removed_behind_the_syncers_back_are_repaired_by_the_resync_without_requests
);

async fn secrets_and_config_maps_are_mirrored_and_served_by_a_reloading_server(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let Seeded {
        secrets,
        config_maps,
        ca,
        cert,
        key,
    } = seed_serving_cert_and_client_ca(&api).await;
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("optional-cert", &cert, &key),
        )
        .await
        .unwrap();

    let dest = tmp.path().join("resources");
    let host_file = tmp.path().join("host/kubelet-ca.crt");
    std::fs::create_dir_all(host_file.parent().unwrap()).unwrap();
    let syncer = Syncer::start(
        &api,
        &dest,
        &[
            "--secrets",
            "serving-cert",
            "--optional-secrets",
            "optional-cert",
            "--configmaps",
            "client-ca",
            "--file",
            &format!("configmap/client-ca/ca-bundle.crt={}", host_file.display()),
        ],
    );
    let serving = dest.join("secrets/serving-cert");
    e2e::wait_until("the first sync", WITHIN, || async {
        read(&serving.join("tls.crt")).as_deref() == Some(cert.as_str())
    })
    .await;
    e2e::wait_until("the ConfigMap", WITHIN, || async {
        read(&dest.join("configmaps/client-ca/ca-bundle.crt")).is_some()
    })
    .await;
    e2e::wait_until("the host file", WITHIN, || async {
        read(&host_file).as_deref() == Some(ca.cert_pem.as_str())
    })
    .await;
    e2e::wait_until("readiness", WITHIN, || async { syncer.readyz().0 == 200 }).await;
    assert_eq!(mode(&serving.join("tls.key")), 0o600);
    assert_eq!(
        mode(&dest.join("configmaps/client-ca/ca-bundle.crt")),
        0o644
    );
    assert!(
        std::fs::symlink_metadata(serving.join("..data"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // A reloading server on the synced files follows Secret updates made through the API.
    let mut command = Command::new(bin("https-server"));
    command
        .args(["--listen", "127.0.0.1:0", "--cert"])
        .arg(serving.join("tls.crt"))
        .arg("--key")
        .arg(serving.join("tls.key"));
    let https = Server::start(command);
    let client_config = ca.client_config();
    let mut latencies = Vec::new();
    for _ in 0..200 {
        let (cert, key, serial) = ca.localhost_leaf();
        let started = Instant::now();
        let mut current = secrets.get("serving-cert").await.unwrap();
        current.data = tls_secret("serving-cert", &cert, &key).data;
        secrets
            .replace("serving-cert", &PostParams::default(), &current)
            .await
            .unwrap();
        loop {
            let (status, _) = e2e::https_get(https.addr, "localhost", client_config.clone(), "/")
                .await
                .unwrap();
            assert_eq!(status, 200);
            let served = served_serial(https.addr, &client_config).await;
            if served == serial {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "serial {serial} not served"
            );
        }
        latencies.push(started.elapsed());
    }
    latencies.sort();
    eprintln!(
        "sync: API update -> new serial served over 200 updates: p50 {:?} p99 {:?} max {:?} (debug build)",
        latencies[100], latencies[197], latencies[199]
    );

    // A key removed from the object: its file is pruned.
    let mut current = config_maps.get("client-ca").await.unwrap();
    current
        .data
        .as_mut()
        .unwrap()
        .insert("extra".to_owned(), "x".to_owned());
    config_maps
        .replace("client-ca", &PostParams::default(), &current)
        .await
        .unwrap();
    e2e::wait_until("the new key", WITHIN, || async {
        read(&dest.join("configmaps/client-ca/extra")).is_some()
    })
    .await;
    let mut current = config_maps.get("client-ca").await.unwrap();
    current.data.as_mut().unwrap().remove("extra");
    config_maps
        .replace("client-ca", &PostParams::default(), &current)
        .await
        .unwrap();
    e2e::wait_until("the key pruned", WITHIN, || async {
        std::fs::symlink_metadata(dest.join("configmaps/client-ca/extra")).is_err()
    })
    .await;

    // Optional object deleted: directory removed. Required object deleted: files kept, not ready.
    secrets
        .delete("optional-cert", &DeleteParams::default())
        .await
        .unwrap();
    e2e::wait_until("the optional directory removed", WITHIN, || async {
        !dest.join("secrets/optional-cert").exists()
    })
    .await;
    let kept = read(&serving.join("tls.crt")).unwrap();
    secrets
        .delete("serving-cert", &DeleteParams::default())
        .await
        .unwrap();
    e2e::wait_until("not ready", WITHIN, || async { syncer.readyz().0 == 503 }).await;
    assert_eq!(read(&serving.join("tls.crt")).unwrap(), kept);
    let (_, reasons) = syncer.readyz();
    assert!(reasons.contains("secret/serving-cert"), "{reasons}");
    let metrics = syncer.metrics();
    assert!(
        metrics.contains(
            "cert_syncer_syncs_total{kind=\"secret\",name=\"serving-cert\",result=\"written\"}"
        ),
        "{metrics}"
    );
}

async fn served_serial(
    addr: std::net::SocketAddr,
    config: &std::sync::Arc<rustls::ClientConfig>,
) -> String {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).unwrap();
    cert.raw_serial_as_string()
        .replace(':', "")
        .trim_start_matches('0')
        .to_owned()
}

async fn a_key_that_would_escape_or_shadow_the_layout_is_refused_and_nothing_is_written(
    backend: Backend,
) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let secrets: Api<Secret> = Api::namespaced(api.recovery_client(), NS);
    let mut evil = tls_secret("evil", "c", "k");
    evil.data
        .as_mut()
        .unwrap()
        .insert("..data".to_owned(), ByteString(b"x".to_vec()));
    let created = secrets.create(&PostParams::default(), &evil).await;
    if backend == Backend::Real {
        // kube-apiserver validates data keys (`IsConfigMapKey`: no key starting with `..`), so
        // such an object never exists there; mini-apiserver accepts it, which is how the
        // syncer's own refusal is tested below.
        let err = created.expect_err("kube-apiserver refuses a `..data` key");
        assert!(err.to_string().contains(".."), "{err}");
    } else {
        created.unwrap();
    }
    // A key like `../x` never gets this far: the apiserver refuses it.
    let mut traversal = tls_secret("traversal", "c", "k");
    traversal
        .data
        .as_mut()
        .unwrap()
        .insert("../x".to_owned(), ByteString(b"x".to_vec()));
    assert!(
        secrets
            .create(&PostParams::default(), &traversal)
            .await
            .is_err()
    );
    if backend == Backend::Real {
        return; // nothing for the syncer to refuse
    }

    let dest = tmp.path().join("resources");
    let mut syncer = Syncer::start(&api, &dest, &["--optional-secrets", "evil"]);
    // Give it time to see the object and refuse it.
    e2e::wait_until("the refusal to be counted", WITHIN, || async {
        syncer.metrics().contains("result=\"error\"")
    })
    .await;
    assert!(!dest.join("secrets/evil/tls.crt").exists());
    assert!(!dest.join("secrets/x").exists() && !tmp.path().join("x").exists());
    syncer.process.kill();
}

/// The resync (`--resync-interval`): files changed or removed on disk behind the syncer's back
/// are rewritten from the last object seen, on both ways of following (one watcher per object,
/// and one namespace-wide watcher), without a single GET; counted per reason; and a disk that
/// matches is left alone.
async fn files_changed_or_removed_behind_the_syncers_back_are_repaired_by_the_resync_without_requests(
    backend: Backend,
) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let Seeded { ca, cert, key, .. } = seed_serving_cert_and_client_ca(&api).await;

    // Per object, and namespace-wide (threshold 0), each with its own directory and host file.
    let mut syncers = Vec::new();
    for (name, threshold) in [("per-object", "50"), ("namespace-wide", "0")] {
        let dest = tmp.path().join(name);
        let host_file = tmp.path().join(format!("{name}-kubelet-ca.crt"));
        let syncer = Syncer::start(
            &api,
            &dest,
            &[
                "--secrets",
                "serving-cert",
                "--configmaps",
                "client-ca",
                "--file",
                &format!("configmap/client-ca/ca-bundle.crt={}", host_file.display()),
                "--namespace-watch-threshold",
                threshold,
                "--resync-interval",
                "1s",
            ],
        );
        e2e::wait_until("the first sync", WITHIN, || async {
            read(&dest.join("secrets/serving-cert/tls.crt")).as_deref() == Some(cert.as_str())
                && read(&dest.join("configmaps/client-ca/ca-bundle.crt")).as_deref()
                    == Some(ca.cert_pem.as_str())
                && read(&host_file).as_deref() == Some(ca.cert_pem.as_str())
        })
        .await;
        e2e::wait_until("readiness", WITHIN, || async { syncer.readyz().0 == 200 }).await;
        syncers.push((name, dest, host_file, syncer));
    }
    let gets = (
        api.request_count("get", "secrets").await,
        api.request_count("get", "configmaps").await,
    );

    for (name, dest, host_file, syncer) in &syncers {
        let tls_crt = dest.join("secrets/serving-cert/tls.crt");
        let tls_key = dest.join("secrets/serving-cert/tls.key");
        let bundle_dir = dest.join("configmaps/client-ca");
        // Content changed through the key's link, a key's link removed, a whole object's
        // directory removed, and the host file changed.
        std::fs::write(&tls_crt, "tampered").unwrap();
        std::fs::remove_file(&tls_key).unwrap();
        std::fs::remove_dir_all(&bundle_dir).unwrap();
        std::fs::write(host_file, "tampered").unwrap();
        e2e::wait_until(&format!("{name}: the disk repaired"), WITHIN, || async {
            read(&tls_crt).as_deref() == Some(cert.as_str())
                && read(&tls_key).as_deref() == Some(key.as_str())
                && read(&bundle_dir.join("ca-bundle.crt")).as_deref() == Some(ca.cert_pem.as_str())
                && read(host_file).as_deref() == Some(ca.cert_pem.as_str())
        })
        .await;
        assert_eq!(mode(&tls_key), 0o600, "{name}");
        let repairs = |metrics: &str, labels: &[&str]| {
            e2e::metric_sum(metrics, "cert_syncer_resync_repairs_total", labels)
        };
        // Counted once the files are in place: wait for the counts too. The content change and
        // the removed link of the Secret are found in one resync or in two (the first rewrite
        // repairs both), so its reason is `changed` or `file-removed`.
        let counted = |metrics: &str| {
            repairs(metrics, &["name=\"serving-cert\""]) >= 1.0
                && repairs(metrics, &["name=\"client-ca\"", "reason=\"missing\""]) >= 1.0
                && repairs(metrics, &["name=\"client-ca\"", "reason=\"changed\""]) >= 1.0
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut metrics = syncer.metrics();
        while !counted(&metrics) {
            assert!(
                Instant::now() < deadline,
                "{name}: repairs not counted: {metrics}"
            );
            std::thread::sleep(Duration::from_millis(50));
            metrics = syncer.metrics();
        }
        // Once the disk matches, the resync leaves it alone: no more repairs, no new generation.
        // Two more resyncs of each object (the first may have started before this snapshot)
        // prove at least one whole pass over a matching disk.
        let settled = repairs(&metrics, &[]);
        let generation = std::fs::read_link(dest.join("secrets/serving-cert/..data")).unwrap();
        let resyncs = |metrics: &str, object: &str| {
            e2e::metric_sum(
                metrics,
                "cert_syncer_resyncs_total",
                &[&format!("name=\"{object}\"")],
            )
        };
        let before = ["serving-cert", "client-ca"].map(|object| resyncs(&metrics, object));
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut metrics = syncer.metrics();
        while ["serving-cert", "client-ca"]
            .iter()
            .zip(before)
            .any(|(object, before)| resyncs(&metrics, object) < before + 2.0)
        {
            assert!(
                Instant::now() < deadline,
                "{name}: no further resyncs: {metrics}"
            );
            std::thread::sleep(Duration::from_millis(50));
            metrics = syncer.metrics();
        }
        assert_eq!(repairs(&metrics, &[]), settled, "{name}");
        assert_eq!(
            std::fs::read_link(dest.join("secrets/serving-cert/..data")).unwrap(),
            generation,
            "{name}"
        );
    }
    // All of it from memory: not one GET (the confirming GETs of a watched change) since.
    assert_eq!(
        (
            api.request_count("get", "secrets").await,
            api.request_count("get", "configmaps").await,
        ),
        gets,
        "the resync made API requests"
    );
}
