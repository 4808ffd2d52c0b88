//! `cert-syncer sync` as a process against an apiserver (`mini-apiserver` and the real
//! kube-apiserver: every scenario runs on both, see `e2e::both_backends!`) over TLS with SNI
//! `localhost-recovery` and a token: Secrets and ConfigMaps mirrored to disk, read by
//! `https-server` through reload-lib.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::syncer::{NS, read, tls_secret};
use e2e::{Backend, Ca, Server, Syncer, TestApi, bin, both_backends, install_crypto_provider};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, PostParams};

/// Waits (bounded) for `condition`.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

both_backends!(
    secrets_and_config_maps_are_mirrored_and_served_by_a_reloading_server,
    a_key_that_would_escape_or_shadow_the_layout_is_refused_and_nothing_is_written
);

async fn secrets_and_config_maps_are_mirrored_and_served_by_a_reloading_server(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
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
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("optional-cert", &cert, &key),
        )
        .await
        .unwrap();
    let bundle = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("client-ca".to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "ca-bundle.crt".to_owned(),
            ca.cert_pem.clone(),
        )])),
        ..Default::default()
    };
    config_maps
        .create(&PostParams::default(), &bundle)
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
    wait_until("the first sync", || {
        read(&serving.join("tls.crt")).as_deref() == Some(cert.as_str())
    });
    wait_until("the ConfigMap", || {
        read(&dest.join("configmaps/client-ca/ca-bundle.crt")).is_some()
    });
    wait_until("the host file", || {
        read(&host_file).as_deref() == Some(ca.cert_pem.as_str())
    });
    wait_until("readiness", || syncer.readyz().0 == 200);
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
    wait_until("the new key", || {
        read(&dest.join("configmaps/client-ca/extra")).is_some()
    });
    let mut current = config_maps.get("client-ca").await.unwrap();
    current.data.as_mut().unwrap().remove("extra");
    config_maps
        .replace("client-ca", &PostParams::default(), &current)
        .await
        .unwrap();
    wait_until("the key pruned", || {
        std::fs::symlink_metadata(dest.join("configmaps/client-ca/extra")).is_err()
    });

    // Optional object deleted: directory removed. Required object deleted: files kept, not ready.
    secrets
        .delete("optional-cert", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the optional directory removed", || {
        !dest.join("secrets/optional-cert").exists()
    });
    let kept = read(&serving.join("tls.crt")).unwrap();
    secrets
        .delete("serving-cert", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("not ready", || syncer.readyz().0 == 503);
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
    wait_until("the refusal to be counted", || {
        syncer.metrics().contains("result=\"error\"")
    });
    assert!(!dest.join("secrets/evil/tls.crt").exists());
    assert!(!dest.join("secrets/x").exists() && !tmp.path().join("x").exists());
    syncer.process.kill();
}
