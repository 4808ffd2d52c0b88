//! mini-apiserver under careless or hostile clients: lowercase `bearer`, writes that
//! cannot be saved, and watchers that never read. Real processes and sockets.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::{ApiServer, install_crypto_provider, metric_sum, wait_until};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type TlsStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to the server as cert-syncer makes it (SNI `localhost-recovery`).
async fn connect(server: &ApiServer) -> TlsStream {
    let tcp = tokio::net::TcpStream::connect(server.server.addr)
        .await
        .unwrap();
    tokio_rustls::TlsConnector::from(e2e::tls::client_config(&server.recovery_ca))
        .connect(ServerName::try_from("localhost-recovery").unwrap(), tcp)
        .await
        .unwrap()
}

/// One HTTP/1.1 request on a fresh connection; returns (status code, body).
async fn request(server: &ApiServer, head: &str, body: &str) -> (u16, String) {
    let mut tls = connect(server).await;
    let text = format!(
        "{head}\r\nHost: localhost-recovery\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(text.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut response)).await;
    testkit::http::RawResponse::parse(&response).status_and_body()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive_as_in_kube_apiserver() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let (status, body) = request(
            &server,
            &format!(
                "GET /api/v1/namespaces/ns/secrets HTTP/1.1\r\nAuthorization: {scheme} {ADMIN_TOKEN}"
            ),
            "",
        )
        .await;
        assert_eq!(status, 200, "{scheme}: {body}");
    }
    for header in [
        format!("Basic {ADMIN_TOKEN}"),
        format!("bearer{ADMIN_TOKEN}"),
        "bearer wrong".to_owned(),
    ] {
        let (status, _) = request(
            &server,
            &format!("GET /api/v1/namespaces/ns/secrets HTTP/1.1\r\nAuthorization: {header}"),
            "",
        )
        .await;
        assert_eq!(status, 401, "{header:?} must not authenticate");
    }
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("v".to_owned(), value.to_owned())])),
        ..Default::default()
    }
}

fn api_code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

/// When the state file cannot be written, the write is refused with a 500
/// and not kept in memory; nothing acknowledged is lost in a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_cannot_be_saved_is_refused_and_an_acknowledged_one_survives() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let mut server = ApiServer::start(tmp.path(), &["--state-file", state.to_str().unwrap()]);
    let maps: Api<ConfigMap> = Api::namespaced(server.recovery_client(), "ns");
    maps.create(&PostParams::default(), &config_map("saved", "one"))
        .await
        .unwrap();

    // The state file becomes impossible to replace (root ignores permissions; a non-empty
    // directory in its place makes the atomic rename fail for anyone).
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("blocker"), "x").unwrap();
    let err = maps
        .create(&PostParams::default(), &config_map("unsaved", "x"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), 500, "{err}");
    assert_eq!(api_code(&maps.get("unsaved").await.unwrap_err()), 404);
    let mut changed = maps.get("saved").await.unwrap();
    changed.data = config_map("saved", "two").data;
    let err = maps
        .replace("saved", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), 500, "{err}");
    let err = maps.delete("saved", &Default::default()).await.unwrap_err();
    assert_eq!(api_code(&err), 500, "{err}");
    let kept = maps.get("saved").await.unwrap();
    assert_eq!(
        kept.data.unwrap()["v"],
        "one",
        "the refused update is not kept"
    );
    assert!(
        server
            .server
            .stderr_text()
            .contains("Cannot save the state file"),
        "the failure is logged"
    );

    // Saving works again: the next write is acknowledged and survives a crash.
    std::fs::remove_dir_all(&state).unwrap();
    maps.create(&PostParams::default(), &config_map("after", "y"))
        .await
        .unwrap();
    server.restart();
    let maps: Api<ConfigMap> = Api::namespaced(server.recovery_client(), "ns");
    assert_eq!(maps.get("saved").await.unwrap().data.unwrap()["v"], "one");
    assert!(maps.get("after").await.is_ok());
    assert_eq!(api_code(&maps.get("unsaved").await.unwrap_err()), 404);
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Watches whose clients read nothing hold a bounded amount of memory (no copy
/// of the namespace per watch) and are disconnected once they stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_that_read_nothing_cost_bounded_memory_and_are_disconnected() {
    const OBJECTS: usize = 60;
    const SIZE: usize = 256 * 1024;
    const WATCHERS: usize = 20;
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let maps: Api<ConfigMap> = Api::namespaced(server.recovery_client(), "big");
    let payload = "x".repeat(SIZE);
    for i in 0..OBJECTS {
        maps.create(
            &PostParams::default(),
            &config_map(&format!("big-{i}"), &payload),
        )
        .await
        .unwrap();
    }
    let pid = server.server.child.id();
    let before = rss_bytes(pid);

    // Watchers that send their request and never read the answer.
    let mut stalled = Vec::new();
    for _ in 0..WATCHERS {
        let mut tls = connect(&server).await;
        tls.write_all(
            format!(
                "GET /api/v1/namespaces/big/configmaps?watch=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        stalled.push(tls);
    }
    wait_until("every watch is open", Duration::from_secs(30), || async {
        metric_sum(
            &server.metrics().await,
            "mini_apiserver_watches_open",
            &["configmaps"],
        ) >= WATCHERS as f64
    })
    .await;
    // Each watch starts on its initial objects at once; watch the peak for a while.
    let mut peak = before;
    for _ in 0..30 {
        peak = peak.max(rss_bytes(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let namespace_bytes = (OBJECTS * SIZE) as u64;
    let growth = peak.saturating_sub(before);
    eprintln!(
        "RSS {} MiB -> peak {} MiB with {WATCHERS} stalled watches on a {} MiB namespace",
        before >> 20,
        peak >> 20,
        namespace_bytes >> 20
    );
    // One copy of the namespace per watcher would be 20 × 15 MiB.
    assert!(
        growth < 4 * namespace_bytes,
        "{WATCHERS} stalled watches grew RSS by {} MiB",
        growth >> 20
    );

    // They are disconnected: the watches end, and each client reads to the end of its stream.
    wait_until(
        "the stalled watches are closed",
        Duration::from_secs(90),
        || async {
            metric_sum(
                &server.metrics().await,
                "mini_apiserver_watches_open",
                &["configmaps"],
            ) == 0.0
        },
    )
    .await;
    let mut tls = stalled.pop().unwrap();
    let mut sink = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(60), tls.read_to_end(&mut sink)).await;
    assert!(end.is_ok(), "the server closed the connection");
    assert!(
        sink.len() < OBJECTS * SIZE,
        "the stream ended before every object was sent ({} bytes)",
        sink.len()
    );

    // A reading watcher is unaffected.
    let (status, _) = request(
        &server,
        &format!(
            "GET /api/v1/namespaces/big/configmaps?limit=1 HTTP/1.1\r\nAuthorization: Bearer {ADMIN_TOKEN}"
        ),
        "",
    )
    .await;
    assert_eq!(status, 200);
}
