//! `mini-apiserver` driven by kube-rs over TLS exactly as cert-syncer drives it: SNI
//! `localhost-recovery`, the recovery CA, a bearer token file.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::{ApiServer, Events, handshake_leaf, install_crypto_provider, wait_until};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;

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

/// A watcher event as a short label: `init`, `init-apply V`, `apply V`, `delete`, `init-done`
/// (V = the Secret's `v`); errors are skipped (the watcher retries).
fn label(item: Result<watcher::Event<Secret>, watcher::Error>) -> Option<String> {
    Some(match item.ok()? {
        watcher::Event::Init => "init".to_owned(),
        watcher::Event::InitApply(s) => format!("init-apply {}", value(&s)),
        watcher::Event::InitDone => "init-done".to_owned(),
        watcher::Event::Apply(s) => format!("apply {}", value(&s)),
        watcher::Event::Delete(_) => "delete".to_owned(),
    })
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
    let mut events = Events::spawn(
        watcher(
            secrets.clone(),
            watcher::Config::default().fields("metadata.name=s"),
        ),
        label,
    );
    assert_eq!(
        events.until(|e| e == "init-done").await,
        ["init", "init-apply 0", "init-done"]
    );
    for i in 1..=100 {
        let mut current = secrets.get("s").await.unwrap();
        current.data = secret("s", &i.to_string()).data;
        secrets
            .replace("s", &PostParams::default(), &current)
            .await
            .unwrap();
    }
    let seen = events.until(|e| e == "apply 100").await;
    let expected: Vec<String> = (1..=100).map(|i| format!("apply {i}")).collect();
    assert_eq!(seen, expected);
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
    let mut events = Events::spawn(
        kube::runtime::WatchStreamExt::default_backoff(watcher::watch_object(secrets.clone(), "s")),
        |item| match item {
            Ok(Some(s)) => Some(value(&s)),
            _ => None,
        },
    );
    assert_eq!(events.next().await, "before");
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
    events.until(|v| v == "after").await;
}

async fn served_serial(addr: std::net::SocketAddr, name: &str, ca_pem: &str) -> String {
    handshake_leaf(addr, name, ca_pem)
        .await
        .unwrap_or_else(|err| panic!("handshake with SNI {name}: {err}"))
        .serial
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_selects_the_recovery_certificate_and_rotations_are_served() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let mut server = ApiServer::start(tmp.path(), &[]);
    let addr = server.server.addr;
    let recovery = served_serial(addr, "localhost-recovery", &server.recovery_ca).await;
    let default = served_serial(addr, "localhost", &server.serving_ca).await;
    assert_ne!(recovery, default);
    // The recovery certificate does not verify for the default name, nor the reverse.
    assert!(
        handshake_leaf(addr, "localhost", &server.recovery_ca)
            .await
            .is_err()
    );
    assert!(
        handshake_leaf(addr, "localhost-recovery", &server.serving_ca)
            .await
            .is_err()
    );

    // Rotate the recovery certificate on disk: it is served, the default one is unchanged.
    let rotated = server.rotate_recovery();
    let recovery_ca = server.recovery_ca.clone();
    wait_until(
        "the rotated recovery certificate",
        Duration::from_secs(10),
        || {
            let (ca, rotated) = (recovery_ca.clone(), rotated.clone());
            async move { served_serial(addr, "localhost-recovery", &ca).await == rotated }
        },
    )
    .await;
    assert_eq!(
        served_serial(addr, "localhost", &server.serving_ca).await,
        default
    );

    // Rotate the default certificate: served for the default name; recovery unchanged.
    let rotated_default = server.rotate_serving();
    let serving_ca = server.serving_ca.clone();
    wait_until(
        "the rotated default certificate",
        Duration::from_secs(10),
        || {
            let (ca, rotated) = (serving_ca.clone(), rotated_default.clone());
            async move { served_serial(addr, "localhost", &ca).await == rotated }
        },
    )
    .await;
    assert_eq!(
        served_serial(addr, "localhost-recovery", &server.recovery_ca).await,
        rotated
    );

    // kube-rs over the rotated recovery certificate still works.
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    assert!(
        secrets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
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
    let mut events = Events::spawn(
        kube::runtime::WatchStreamExt::default_backoff(watcher(
            secrets.clone(),
            watcher::Config::default().fields("metadata.name=s"),
        )),
        label,
    );
    assert_eq!(events.next().await, "init");
    assert_eq!(events.next().await, "init-apply 0");

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
    let seen = events
        .until(|e| e == "init-apply 10" || e == "apply 10")
        .await;
    assert!(seen.iter().any(|e| e == "init"), "no relist: {seen:?}");
}

/// Sends a raw request through a kube client (its TLS, SNI and token); returns the `Status` of
/// an error answer, or `None` on success.
async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Option<Box<kube::core::Status>> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body)
        .unwrap();
    match client.request_text(request).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status),
        Err(other) => panic!("{method} {path}: not an API answer: {other}"),
    }
}

type BadRequest = (
    &'static str,
    &'static str,
    &'static str,
    Vec<u8>,
    u16,
    &'static str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_status_and_changes_nothing() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let client = server.recovery_client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "ns");
    secrets
        .create(&PostParams::default(), &secret("kept", "v"))
        .await
        .unwrap();
    let before = secrets.list(&ListParams::default()).await.unwrap();

    let collection = "/api/v1/namespaces/ns/secrets";
    let json = "application/json";
    let too_big = {
        let mut body = br#"{"metadata":{"name":"big"},"stringData":{"k":""#.to_vec();
        body.extend(std::iter::repeat_n(b'x', 4 * 1024 * 1024));
        body.extend_from_slice(br#""}}"#);
        body
    };
    // (method, path, content type, body, expected code, expected reason)
    let cases: Vec<BadRequest> = vec![
        (
            "POST",
            collection,
            json,
            b"{not json".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            collection,
            json,
            br#"{"kind":"ConfigMap","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            collection,
            json,
            br#"{"apiVersion":"v2","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            collection,
            json,
            br#"{"metadata":{"name":"Bad_Name"}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "POST",
            collection,
            json,
            br#"{"metadata":{"name":"x"},"data":{"k":"not base64!"}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "POST",
            collection,
            json,
            br#"{"metadata":{"name":"x"},"data":{"bad/key":"eA=="}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "POST",
            collection,
            json,
            br#"{"metadata":{}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "POST",
            collection,
            json,
            br#"[1,2]"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            collection,
            json,
            too_big,
            413,
            "RequestEntityTooLarge",
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns/secrets/kept",
            json,
            br#"{"metadata":{"name":"other"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns/secrets/kept",
            "text/plain",
            b"{}".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns/secrets/kept",
            "application/json-patch+json",
            br#"[{"op":"remove","path":"/nope"}]"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns/secrets/kept",
            "application/merge-patch+json",
            br#"{"data":{"k":7}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            json,
            vec![],
            404,
            "NotFound",
        ),
        ("PUT", collection, json, vec![], 405, "MethodNotAllowed"),
        (
            "DELETE",
            "/api/v1/namespaces/ns/secrets?dryRun=Some",
            json,
            vec![],
            422,
            "Invalid",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/secrets?labelSelector=a+in+b",
            json,
            vec![],
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/secrets?fieldSelector=spec.x%3D1",
            json,
            vec![],
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/secrets?continue=%21%21",
            json,
            vec![],
            400,
            "BadRequest",
        ),
    ];
    for (method, path, content_type, body, code, reason) in cases {
        let status = raw(&client, method, path, content_type, body)
            .await
            .unwrap_or_else(|| panic!("{method} {path} succeeded"));
        assert_eq!(
            (status.code, status.reason.as_str()),
            (code, reason),
            "{method} {path}: {}",
            status.message
        );
    }

    // Nothing changed, and the server still serves.
    let after = secrets.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(after.items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_rules_decide_who_may_do_what() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("rules.csv"),
        "# subject,verbs,namespaces,resources\n\
         group:system:masters,*,*,*\n\
         group:syncers,\"get,list,watch\",openshift-kube-apiserver,\"secrets,configmaps\"\n\
         viewer,*,*,*\n",
    )
    .unwrap();
    let rules = tmp.path().join("rules.csv");
    let server = ApiServer::start(
        tmp.path(),
        &["--authorization-file", rules.to_str().unwrap()],
    );
    let ns = "openshift-kube-apiserver";
    let admin: Api<Secret> = Api::namespaced(server.recovery_client(), ns);
    admin
        .create(&PostParams::default(), &secret("serving-cert", "v"))
        .await
        .unwrap();

    // The syncer (group `syncers`) may read Secrets in its namespace, and nothing more.
    let syncer = server.client_with_token("syncer-token");
    let syncer_secrets: Api<Secret> = Api::namespaced(syncer.clone(), ns);
    assert_eq!(
        value(&syncer_secrets.get("serving-cert").await.unwrap()),
        "v"
    );
    let mut stream = syncer_secrets
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        stream.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    let forbidden = |err: kube::Error| match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("not an API error: {other}"),
    };
    let err = syncer_secrets
        .create(&PostParams::default(), &secret("x", "v"))
        .await
        .unwrap_err();
    assert_eq!(forbidden(err), (403, "Forbidden".to_owned()));
    let other_ns: Api<Secret> = Api::namespaced(syncer.clone(), "default");
    assert_eq!(forbidden(other_ns.get("x").await.unwrap_err()).0, 403);
    let all: Api<Secret> = Api::all(syncer.clone());
    assert_eq!(
        forbidden(all.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    let leases: Api<Lease> = Api::namespaced(syncer, ns);
    assert_eq!(forbidden(leases.get("x").await.unwrap_err()).0, 403);

    // `viewer` has a rule for everything but is a --read-only-user: reads only.
    let viewer: Api<Secret> = Api::namespaced(server.client_with_token("read-only-token"), ns);
    assert_eq!(
        viewer
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        forbidden(
            viewer
                .delete("serving-cert", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .0,
        403
    );

    // A wrong or missing token: 401 with a Status body, discovery included.
    let stranger = server.client_with_token("not-a-token");
    let err = Api::<Secret>::namespaced(stranger.clone(), ns)
        .get("serving-cert")
        .await
        .unwrap_err();
    assert_eq!(forbidden(err), (401, "Unauthorized".to_owned()));
    assert!(stranger.apiserver_version().await.is_err());
    let anonymous = kube::Client::try_from(server.recovery_config()).unwrap();
    let err = Api::<Secret>::namespaced(anonymous, ns)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(forbidden(err).0, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_authenticate_their_cn_and_organizations() {
    install_crypto_provider();
    let pki = e2e::TempPki::new();
    let (client_ca, client_ca_path) = pki.ca("client-ca");
    let controller = pki.issue(
        &client_ca,
        "controller",
        &e2e::CertSpec::client("cert-regeneration-controller").organization("regenerators"),
    );
    let stranger_ca = e2e::Ca::default();
    let stranger_ca = stranger_ca;
    let stranger = pki.issue(
        &stranger_ca,
        "stranger",
        &e2e::CertSpec::client("cert-regeneration-controller").organization("regenerators"),
    );
    let expired = pki.issue(
        &client_ca,
        "expired",
        &e2e::CertSpec::client("cert-regeneration-controller")
            .organization("regenerators")
            .expired(1),
    );
    std::fs::write(
        pki.path().join("rules.csv"),
        "group:regenerators,*,openshift-kube-apiserver,secrets\n\
         user:cert-syncer,get,openshift-kube-apiserver,secrets\n",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let audit = tmp.path().join("audit.jsonl");
    let server = ApiServer::start(
        tmp.path(),
        &[
            // kube-apiserver's flag name.
            "--client-ca-file",
            client_ca_path.to_str().unwrap(),
            "--authorization-file",
            pki.path().join("rules.csv").to_str().unwrap(),
            "--audit-log",
            audit.to_str().unwrap(),
        ],
    );
    let with_cert = |files: &e2e::CertFiles, token: Option<&str>| {
        let mut config = server.recovery_config();
        config.auth_info.client_certificate = Some(files.cert.display().to_string());
        config.auth_info.client_key = Some(files.key.display().to_string());
        config.auth_info.token = token.map(|t| t.to_owned().into());
        kube::Client::try_from(config).unwrap()
    };
    let ns = "openshift-kube-apiserver";
    let forbidden = |err: kube::Error| match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("not an API error (a dead connection?): {other}"),
    };
    // A valid certificate: its CN and O authenticate (the rule for group regenerators).
    let secrets: Api<Secret> = Api::namespaced(with_cert(&controller, None), ns);
    secrets
        .create(&PostParams::default(), &secret("signer", "v"))
        .await
        .unwrap();
    // A certificate that does not verify never kills the connection (ClientAuth::Request): with
    // no token the request is a 401 at the HTTP layer, as kube-apiserver answers.
    for files in [&stranger, &expired] {
        let rejected: Api<Secret> = Api::namespaced(with_cert(files, None), ns);
        assert_eq!(forbidden(rejected.get("signer").await.unwrap_err()).0, 401);
    }
    // An expired certificate plus a valid token: the token's user (cert-syncer may only get),
    // never the certificate's (which could create).
    let by_token: Api<Secret> = Api::namespaced(with_cert(&expired, Some("syncer-token")), ns);
    by_token.get("signer").await.unwrap();
    assert_eq!(
        forbidden(
            by_token
                .create(&PostParams::default(), &secret("other", "v"))
                .await
                .unwrap_err()
        )
        .0,
        403
    );
    let users: Vec<(String, String, u16)> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                record["user"].as_str().unwrap().to_owned(),
                record["verb"].as_str().unwrap().to_owned(),
                record["code"].as_u64().unwrap() as u16,
            )
        })
        .collect();
    assert_eq!(
        users,
        [
            (
                "cert-regeneration-controller".to_owned(),
                "create".to_owned(),
                201
            ),
            ("cert-syncer".to_owned(), "get".to_owned(), 200),
            ("cert-syncer".to_owned(), "create".to_owned(), 403),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_patches_generate_name_and_preconditions_work_through_kube_rs() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let client = server.recovery_client();

    // Discovery: what `kubectl api-resources` and dynamic clients rely on.
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let mut found: Vec<String> = discovery
        .groups()
        .flat_map(|group| group.recommended_resources())
        .map(|(resource, _)| format!("{}/{}", resource.api_version, resource.plural))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            "authorization.k8s.io/v1/selfsubjectaccessreviews",
            "authorization.k8s.io/v1/selfsubjectrulesreviews",
            "coordination.k8s.io/v1/leases",
            "v1/configmaps",
            "v1/events",
            "v1/secrets"
        ]
    );

    // generateName, JSON patch, stringData merged into data on update.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "ns");
    let mut template = secret("", "v");
    template.metadata.name = None;
    template.metadata.generate_name = Some("signer-".to_owned());
    let generated = secrets
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let name = generated.metadata.name.clone().unwrap();
    assert!(
        name.starts_with("signer-") && name.len() == "signer-".len() + 5,
        "{name}"
    );
    let patch = serde_json::json!([
        {"op": "add", "path": "/metadata/labels", "value": {"rotated": "yes"}},
        {"op": "replace", "path": "/data/v", "value": "dHdv"}
    ]);
    let refused = raw(
        &client,
        "PATCH",
        &format!("/api/v1/namespaces/ns/secrets/{name}"),
        "application/json-patch+json",
        serde_json::to_vec(&patch).unwrap(),
    )
    .await;
    assert!(refused.is_none(), "{refused:?}");
    let patched = secrets.get(&name).await.unwrap();
    assert_eq!(patched.metadata.labels.as_ref().unwrap()["rotated"], "yes");
    assert_eq!(value(&patched), "two");
    let mut update = patched.clone();
    update.string_data = Some(BTreeMap::from([("w".to_owned(), "plain".to_owned())]));
    let updated = secrets
        .replace(&name, &PostParams::default(), &update)
        .await
        .unwrap();
    assert!(updated.string_data.is_none());
    assert_eq!(updated.data.as_ref().unwrap()["w"].0, b"plain");
    assert_eq!(value(&updated), "two");

    // Delete with a stale precondition: 409, and the object is still there.
    let stale = DeleteParams::default().preconditions(kube::api::Preconditions {
        resource_version: generated.metadata.resource_version.clone(),
        uid: None,
    });
    assert_eq!(
        api_code(&secrets.delete(&name, &stale).await.unwrap_err()),
        409
    );
    let current = DeleteParams::default().preconditions(kube::api::Preconditions {
        resource_version: updated.metadata.resource_version.clone(),
        uid: updated.metadata.uid.clone(),
    });
    secrets.delete(&name, &current).await.unwrap();
    assert!(secrets.get_opt(&name).await.unwrap().is_none());

    // Leases (server-side apply creates, then updates) and Events, namespaced.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "cert-regeneration-controller"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 137}
    });
    let applied = leases
        .patch(
            "cert-regeneration-controller",
            &PatchParams::apply("e2e"),
            &Patch::Apply(&lease),
        )
        .await
        .unwrap();
    assert_eq!(
        applied.spec.unwrap().holder_identity.as_deref(),
        Some("node-a")
    );
    let events: Api<Event> = Api::namespaced(client, "ns");
    let event = Event {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("signer.".to_owned()),
            ..Default::default()
        },
        reason: Some("CertificateRegenerated".to_owned()),
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Secret".to_owned()),
            name: Some("signer".to_owned()),
            namespace: Some("ns".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    events.create(&PostParams::default(), &event).await.unwrap();
    let listed = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        listed.items[0].reason.as_deref(),
        Some("CertificateRegenerated")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_streaming_lists_and_watch_timeouts() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &["--bookmark-interval", "0.2"]);
    let config_maps: Api<ConfigMap> = Api::namespaced(server.recovery_client(), "ns");
    let mut created = Vec::new();
    for name in ["a", "b"] {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        created.push(
            config_maps
                .create(&PostParams::default(), &cm)
                .await
                .unwrap(),
        );
    }
    let rv = created[1].metadata.resource_version.clone().unwrap();

    // A watch that allows bookmarks gets them, carrying the newest version examined.
    let mut stream = config_maps
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .expect("a bookmark within 5 s")
        .unwrap();
    match event {
        Some(WatchEvent::Bookmark(bookmark)) => {
            assert_eq!(bookmark.metadata.resource_version, rv)
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }

    // timeoutSeconds ends the stream.
    let mut short = config_maps
        .watch(&WatchParams::default().disable_bookmarks().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let end = tokio::time::timeout(Duration::from_secs(5), short.try_next())
        .await
        .expect("the watch ends after its timeout");
    assert!(end.unwrap().is_none());

    // A watcher using streaming lists (sendInitialEvents) gets both objects, then InitDone.
    let stream = watcher(
        config_maps.clone(),
        watcher::Config::default().streaming_lists(),
    );
    let mut stream = std::pin::pin!(stream);
    let mut initial = Vec::new();
    let collect = async {
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                watcher::Event::InitApply(cm) => initial.push(cm.metadata.name.unwrap()),
                watcher::Event::InitDone => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), collect)
        .await
        .expect("InitDone within 10 s");
    assert_eq!(initial, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_resumes_across_a_restart_without_relisting_or_losing_events() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let mut server = ApiServer::start(tmp.path(), &["--state-file", state.to_str().unwrap()]);
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    secrets
        .create(&PostParams::default(), &secret("s", "0"))
        .await
        .unwrap();
    let mut events = Events::spawn(
        kube::runtime::WatchStreamExt::default_backoff(watcher(
            secrets.clone(),
            watcher::Config::default().fields("metadata.name=s"),
        )),
        label,
    );
    assert_eq!(
        events.until(|e| e == "init-done").await,
        ["init", "init-apply 0", "init-done"]
    );

    // Crash and restart; change the object several times while the watcher reconnects (its
    // backoff) and after: it replays them from the saved history, in order, without a relist.
    server.restart();
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    assert_eq!(
        value(&secrets.get("s").await.unwrap()),
        "0",
        "state survived"
    );
    for i in 1..=5 {
        let mut current = secrets.get("s").await.unwrap();
        current.data = secret("s", &i.to_string()).data;
        secrets
            .replace("s", &PostParams::default(), &current)
            .await
            .unwrap();
    }
    secrets.delete("s", &DeleteParams::default()).await.unwrap();
    let seen = events.until(|e| e == "delete").await;
    assert_eq!(
        seen,
        [
            "apply 1", "apply 2", "apply 3", "apply 4", "apply 5", "delete"
        ],
        "a relist (init) or a lost, repeated or reordered event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_manifests_are_loaded_at_start_and_do_not_override_saved_state() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let seeds = tmp.path().join("seeds");
    std::fs::create_dir(&seeds).unwrap();
    std::fs::write(
        seeds.join("objects.yaml"),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: loadbalancer-serving-signer\n  \
         namespace: openshift-kube-apiserver-operator\nstringData:\n  v: seeded\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: client-ca\n  namespace: \
         openshift-kube-apiserver\ndata:\n  ca-bundle.crt: pem\n",
    )
    .unwrap();
    let state = tmp.path().join("state.json");
    let mut server = ApiServer::start(
        tmp.path(),
        &[
            "--seed-dir",
            seeds.to_str().unwrap(),
            "--state-file",
            state.to_str().unwrap(),
        ],
    );
    let secrets: Api<Secret> = Api::namespaced(
        server.recovery_client(),
        "openshift-kube-apiserver-operator",
    );
    let mut signer = secrets.get("loadbalancer-serving-signer").await.unwrap();
    assert_eq!(value(&signer), "seeded");
    let config_maps: Api<ConfigMap> =
        Api::namespaced(server.recovery_client(), "openshift-kube-apiserver");
    assert!(config_maps.get_opt("client-ca").await.unwrap().is_some());

    // Changed, restarted with the same seeds: the change stays.
    signer.data = secret("x", "changed").data;
    secrets
        .replace(
            "loadbalancer-serving-signer",
            &PostParams::default(),
            &signer,
        )
        .await
        .unwrap();
    server.restart();
    let secrets: Api<Secret> = Api::namespaced(
        server.recovery_client(),
        "openshift-kube-apiserver-operator",
    );
    assert_eq!(
        value(&secrets.get("loadbalancer-serving-signer").await.unwrap()),
        "changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_watches_and_exits_cleanly() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let mut server = ApiServer::start(tmp.path(), &[]);
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    let mut stream = secrets
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await
        .unwrap()
        .boxed();
    let started = std::time::Instant::now();
    // The drain timeout is 10 s: a clean exit well before it means the watch did not hold
    // shutdown up.
    let status = tokio::task::block_in_place(|| server.server.terminate(Duration::from_secs(8)))
        .expect("mini-apiserver still running 8 s after SIGTERM");
    assert!(status.success(), "exit status {status}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let end = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .expect("the watch stream ends");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

#[test]
fn start_up_errors_name_the_culprit_and_set_the_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = e2e::Ca::default();
    let (cert, key, _) = ca.localhost_leaf();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    std::fs::write(dir.join("tokens.csv"), "t0k3n-s3cr3t,alice,1\n").unwrap();
    std::fs::write(dir.join("bad-tokens.csv"), "ok,alice,1\nt0k3n-s3cr3t\n").unwrap();
    std::fs::write(dir.join("bad-rules.csv"), "alice,get\n").unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let run = |extra: &[&str], tokens: &str| {
        let output = std::process::Command::new(e2e::bin_path("mini-apiserver"))
            .args(["--listen", "127.0.0.1:0", "--cert", &path("tls.crt")])
            .args([
                "--key",
                &path("tls.key"),
                "--token-auth-file",
                &path(tokens),
            ])
            .args(extra)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["--sni", "localhost-recovery"], "tokens.csv");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--sni localhost-recovery"), "{stderr}");
    let (code, stderr) = run(
        &["--sni", "x=/nonexistent.crt,/nonexistent.key"],
        "tokens.csv",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent"), "{stderr}");
    let (code, stderr) = run(&[], "bad-tokens.csv");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("bad-tokens.csv") && stderr.contains("line 2"),
        "{stderr}"
    );
    assert!(!stderr.contains("t0k3n-s3cr3t"), "a token was printed");
    let (code, stderr) = run(
        &["--authorization-file", &path("bad-rules.csv")],
        "tokens.csv",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("bad-rules.csv"), "{stderr}");
    let (code, stderr) = run(&["--state-file", &path("tokens.csv")], "tokens.csv");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("corrupt state file"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_are_validated_and_answered_but_change_nothing() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let mut server = ApiServer::start(tmp.path(), &["--state-file", state.to_str().unwrap()]);
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    let created = secrets
        .create(&PostParams::default(), &secret("kept", "v1"))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = secrets
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    let dry_post = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let dry_patch = PatchParams {
        dry_run: true,
        ..Default::default()
    };

    // Each write answers as it would, and is checked as it would be.
    let would_create = secrets
        .create(&dry_post, &secret("ghost", "v"))
        .await
        .unwrap();
    assert_eq!(would_create.metadata.name.as_deref(), Some("ghost"));
    assert!(would_create.metadata.uid.is_some());
    let duplicate = secrets.create(&dry_post, &secret("kept", "v")).await;
    assert!(matches!(duplicate, Err(kube::Error::Api(s)) if s.code == 409));
    let bad_name = secrets.create(&dry_post, &secret("Bad_Name", "v")).await;
    assert!(matches!(bad_name, Err(kube::Error::Api(s)) if s.code == 422));
    let mut changed = created.clone();
    changed.data = secret("kept", "v2").data;
    let would_replace = secrets.replace("kept", &dry_post, &changed).await.unwrap();
    assert_eq!(would_replace.data.unwrap()["v"], ByteString(b"v2".to_vec()));
    let patch = serde_json::json!({"metadata": {"labels": {"dry": "yes"}}});
    let would_patch = secrets
        .patch("kept", &dry_patch, &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(would_patch.metadata.labels.unwrap()["dry"], "yes");
    let dry_delete = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    secrets.delete("kept", &dry_delete).await.unwrap();

    // Nothing changed: the object, the resourceVersion, the watch (the next event it gets is
    // the real write below), the state file after a restart.
    let now = secrets.get("kept").await.unwrap();
    assert_eq!(now.metadata.resource_version.as_deref(), Some(rv.as_str()));
    assert_eq!(now.data.unwrap()["v"], ByteString(b"v1".to_vec()));
    assert!(now.metadata.labels.is_none());
    assert!(secrets.get_opt("ghost").await.unwrap().is_none());
    secrets
        .create(&PostParams::default(), &secret("real", "v"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event within 10 s")
        .unwrap();
    match first {
        Some(WatchEvent::Added(object)) => {
            assert_eq!(object.metadata.name.as_deref(), Some("real"))
        }
        other => panic!("the first event must be the real create, got {other:?}"),
    }
    server.restart();
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    assert!(secrets.get_opt("ghost").await.unwrap().is_none());
    assert_eq!(
        secrets.get("kept").await.unwrap().metadata.resource_version,
        Some(rv)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_is_public_legacy_watch_paths_and_deletecollection_work() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let client = server.recovery_client();

    // /version without credentials (kube-apiserver's system:public-info-viewer); a bad token
    // is still a 401 there, and anything else needs credentials.
    let anonymous = kube::Client::try_from(server.recovery_config()).unwrap();
    assert_eq!(anonymous.apiserver_version().await.unwrap().major, "1");
    assert!(
        server
            .client_with_token("not-a-token")
            .apiserver_version()
            .await
            .is_err()
    );
    assert!(anonymous.list_api_groups().await.is_err());

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "legacy");
    let rv = config_maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for (name, tier) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([("tier".to_owned(), tier.to_owned())])),
                ..Default::default()
            },
            ..Default::default()
        };
        config_maps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }
    // The legacy watch paths: a collection, and one object (its name becomes a field selector).
    let watched = |path: String| {
        let client = client.clone();
        async move {
            let request = http::Request::get(path).body(Vec::new()).unwrap();
            let text = client.request_text(request).await.unwrap();
            text.lines()
                .map(|line| {
                    let event: serde_json::Value = serde_json::from_str(line).unwrap();
                    format!(
                        "{} {}",
                        event["type"].as_str().unwrap(),
                        event["object"]["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        watched(format!(
            "/api/v1/watch/namespaces/legacy/configmaps?resourceVersion={rv}&timeoutSeconds=1"
        ))
        .await,
        ["ADDED a", "ADDED b", "ADDED c"]
    );
    assert_eq!(
        watched(format!(
            "/api/v1/watch/namespaces/legacy/configmaps/b?resourceVersion={rv}&timeoutSeconds=1"
        ))
        .await,
        ["ADDED b"]
    );

    // deletecollection with a label selector (dry run first: nothing goes), through kube-rs.
    let dry = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    let by_tier = ListParams::default().labels("tier=x");
    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        let mut names: Vec<String> = list
            .items
            .into_iter()
            .filter_map(|cm| cm.metadata.name)
            .collect();
        names.sort();
        names
    };
    let would = config_maps.delete_collection(&dry, &by_tier).await.unwrap();
    assert_eq!(names(would.left().expect("a list")), ["a", "b"]);
    assert_eq!(
        names(config_maps.list(&ListParams::default()).await.unwrap()),
        ["a", "b", "c"]
    );
    let gone = config_maps
        .delete_collection(&DeleteParams::default(), &by_tier)
        .await
        .unwrap();
    assert_eq!(names(gone.left().expect("a list")), ["a", "b"]);
    assert_eq!(
        names(config_maps.list(&ListParams::default()).await.unwrap()),
        ["c"]
    );
}
