//! `mini-apiserver` driven by kube-rs over TLS exactly as cert-syncer drives it: SNI
//! `localhost-recovery`, the recovery CA, a bearer token file.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::{ApiServer, Ca, install_crypto_provider};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

fn secret(name: &str, value: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "v".to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

fn value(secret: &Secret) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()["v"].0.clone()).unwrap()
}

fn api_code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_conflicts_and_errors_through_kube_rs() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let secrets: Api<Secret> =
        Api::namespaced(server.recovery_client(), "openshift-kube-apiserver");

    let created = secrets
        .create(&PostParams::default(), &secret("serving-cert", "one"))
        .await
        .unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(value(&secrets.get("serving-cert").await.unwrap()), "one");

    // Update with the current resourceVersion, then again with the stale one: 409.
    let mut update = created.clone();
    update.data = secret("serving-cert", "two").data;
    let updated = secrets
        .replace("serving-cert", &PostParams::default(), &update)
        .await
        .unwrap();
    assert!(
        updated
            .metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv1.parse().unwrap()
    );
    let err = secrets
        .replace("serving-cert", &PostParams::default(), &update)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), 409);

    // Create of an existing name: 409 AlreadyExists; missing: 404.
    let err = secrets
        .create(&PostParams::default(), &secret("serving-cert", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err}"
    );
    assert_eq!(api_code(&secrets.get("missing").await.unwrap_err()), 404);
    assert!(secrets.get_opt("missing").await.unwrap().is_none());

    // Patches: merge and JSON patch; stringData merged into data.
    let patch = serde_json::json!({"stringData": {"w": "plain"}});
    let patched = secrets
        .patch(
            "serving-cert",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["w"].0, b"plain");

    // List with a field selector, labels and pagination.
    for i in 0..5 {
        let mut s = secret(&format!("page-{i}"), "p");
        s.metadata.labels = Some(BTreeMap::from([("page".to_owned(), "yes".to_owned())]));
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let page = secrets
        .list(&ListParams::default().labels("page=yes").limit(2))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    let mut names: Vec<String> = page
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    let mut token = page.metadata.continue_;
    while let Some(next) = token.filter(|t| !t.is_empty()) {
        let page = secrets
            .list(
                &ListParams::default()
                    .labels("page=yes")
                    .limit(2)
                    .continue_token(&next),
            )
            .await
            .unwrap();
        names.extend(page.items.iter().map(|s| s.metadata.name.clone().unwrap()));
        token = page.metadata.continue_;
    }
    assert_eq!(names, ["page-0", "page-1", "page-2", "page-3", "page-4"]);
    let one = secrets
        .list(&ListParams::default().fields("metadata.name=page-3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);

    secrets
        .delete("serving-cert", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_code(&secrets.get("serving-cert").await.unwrap_err()),
        404
    );

    // Bad input: an invalid name is 422, and the server keeps serving.
    let err = secrets
        .create(&PostParams::default(), &secret("Not_Valid", "x"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), 422);
    let config_maps: Api<ConfigMap> =
        Api::namespaced(server.recovery_client(), "openshift-kube-apiserver");
    assert!(
        config_maps
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // A wrong token: 401 with a Status body.
    std::fs::write(tmp.path().join("token"), "wrong").unwrap();
    let client = server.recovery_client();
    let err = Api::<Secret>::namespaced(client, "x")
        .get("y")
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_sees_every_change_in_order() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    secrets
        .create(&PostParams::default(), &secret("s", "0"))
        .await
        .unwrap();
    let stream = watcher(
        secrets.clone(),
        watcher::Config::default().fields("metadata.name=s"),
    );
    let seen = tokio::spawn(async move {
        let mut values = Vec::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                    values.push(value(&s));
                    if values.last().map(String::as_str) == Some("100") {
                        return values;
                    }
                }
                watcher::Event::Delete(_) => panic!("unexpected delete"),
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
        }
        values
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 1..=100 {
        let mut current = secrets.get("s").await.unwrap();
        current.data = secret("s", &i.to_string()).data;
        secrets
            .replace("s", &PostParams::default(), &current)
            .await
            .unwrap();
    }
    let values = tokio::time::timeout(Duration::from_secs(30), seen)
        .await
        .unwrap()
        .unwrap();
    let expected: Vec<String> = (0..=100).map(|i| i.to_string()).collect();
    assert_eq!(values, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_after_a_restart_and_relist_after_410() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let mut server = ApiServer::start(
        tmp.path(),
        &["--state-file", state.to_str().unwrap(), "--history", "5"],
    );
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    let created = secrets
        .create(&PostParams::default(), &secret("s", "before"))
        .await
        .unwrap();
    let old_rv = created.metadata.resource_version.unwrap();

    // More changes than the history holds: a raw watch from the old version gets 410 in-stream.
    for i in 0..10 {
        secrets
            .create(&PostParams::default(), &secret(&format!("filler-{i}"), "x"))
            .await
            .unwrap();
    }
    let mut raw = secrets
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match raw.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }

    // A kube watcher survives a restart (state file) and sees the next change.
    let stream = watcher::watch_object(secrets.clone(), "s");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(Some(s)) = item {
                let _ = tx.send(value(&s));
            }
        }
    });
    assert_eq!(rx.recv().await.unwrap(), "before");
    server.restart();
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    assert_eq!(
        value(&secrets.get("s").await.unwrap()),
        "before",
        "state survived"
    );
    let mut current = secrets.get("s").await.unwrap();
    current.data = secret("s", "after").data;
    secrets
        .replace("s", &PostParams::default(), &current)
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if rx.recv().await.unwrap() == "after" {
                return;
            }
        }
    })
    .await;
    assert!(
        seen.is_ok(),
        "the watcher did not see the change made after the restart"
    );
}

async fn served_serial(addr: std::net::SocketAddr, name: &str, ca_pem: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from(name.to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    reload_serial(&leaf)
}

fn reload_serial(leaf: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).unwrap();
    cert.raw_serial_as_string()
        .replace(':', "")
        .trim_start_matches('0')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_selects_the_recovery_certificate_and_rotations_are_served() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let recovery = served_serial(
        server.server.addr,
        "localhost-recovery",
        &server.recovery_ca,
    )
    .await;
    let default = served_serial(server.server.addr, "localhost", &server.serving_ca).await;
    assert_ne!(recovery, default);

    // Rotate the recovery certificate on disk (rename into place, key first).
    let mut ca = Ca::new();
    let (cert, key, serial) = ca.leaf_for(&["localhost-recovery"]);
    std::fs::write(tmp.path().join("recovery-ca-2.crt"), &ca.pem).unwrap();
    for (name, content) in [("tls.key", key), ("tls.crt", cert)] {
        let path = tmp.path().join("recovery").join(name);
        std::fs::write(path.with_extension("tmp"), content).unwrap();
        std::fs::rename(path.with_extension("tmp"), path).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let roots = format!("{}{}", server.recovery_ca, ca.pem);
        if served_serial(server.server.addr, "localhost-recovery", &roots).await == serial {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated recovery certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The default name still gets the default certificate.
    assert_eq!(
        served_serial(server.server.addr, "localhost", &server.serving_ca).await,
        default
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_watcher_relists_when_its_resource_version_expired() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let mut server = ApiServer::start(
        tmp.path(),
        &["--state-file", state.to_str().unwrap(), "--history", "5"],
    );
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    secrets
        .create(&PostParams::default(), &secret("s", "0"))
        .await
        .unwrap();
    // With backoff, as every real client: the reconnect waits at least 800 ms, while the ten
    // updates below take a few milliseconds.
    let stream = kube::runtime::WatchStreamExt::default_backoff(watcher(
        secrets.clone(),
        watcher::Config::default().fields("metadata.name=s"),
    ));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let label = match item {
                Ok(watcher::Event::Init) => "init".to_owned(),
                Ok(watcher::Event::InitApply(s)) => format!("init-apply {}", value(&s)),
                Ok(watcher::Event::Apply(s)) => format!("apply {}", value(&s)),
                Ok(_) => continue,
                Err(_) => continue,
            };
            if tx.send(label).is_err() {
                return;
            }
        }
    });
    assert_eq!(next_event(&mut rx).await, "init");
    assert_eq!(next_event(&mut rx).await, "init-apply 0");

    // While the watcher is disconnected (restart, then its reconnect backoff), more changes
    // happen than the history holds: its resourceVersion expires.
    server.restart();
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    for i in 1..=10 {
        let mut current = secrets.get("s").await.unwrap();
        current.data = secret("s", &i.to_string()).data;
        secrets
            .replace("s", &PostParams::default(), &current)
            .await
            .unwrap();
    }
    // It relists (a new Init) and ends on the latest value, never on a gap.
    let mut events = Vec::new();
    loop {
        let event = next_event(&mut rx).await;
        events.push(event.clone());
        if event == "init-apply 10" || event == "apply 10" {
            break;
        }
    }
    assert!(events.iter().any(|e| e == "init"), "no relist: {events:?}");
}

async fn next_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("no watcher event within 30 s")
        .expect("the watcher stopped")
}
