//! Hostile objects and a hostile destination tree, against a real
//! `mini-apiserver` and `cert-syncer` processes: an undecodable Secret is named (object and
//! field) without any of its bytes in a log, and does not stop the others; a symlinked object
//! directory is refused, and nothing outside the destination changes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::syncer::{NS, tls_secret};
use e2e::{ApiServer, Ca, CertSpec, Syncer, bin_path, install_crypto_provider};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

/// The bound on each wait for the processes to act (a limit, not a delay).
const WITHIN: Duration = Duration::from_secs(30);

/// 32-character pieces of a PEM body: any one in a log means key bytes leaked.
fn fragments(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| {
            l.as_bytes()
                .chunks(32)
                .filter(|c| c.len() == 32)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn assert_no_key(who: &str, log: &str, key_pem: &str) {
    use base64::Engine;
    assert!(
        !log.contains("PRIVATE KEY"),
        "{who} logged a PEM private key"
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(key_pem);
    for fragment in fragments(key_pem).into_iter().chain(
        b64.as_bytes()
            .chunks(32)
            .filter(|c| c.len() == 32)
            .map(|c| String::from_utf8(c.to_vec()).unwrap()),
    ) {
        assert!(!log.contains(&fragment), "{who} logged private key bytes");
    }
}

/// Creates `bad`: a Secret with `immutable: "yes"` (not a boolean) and a private key, sent as
/// raw JSON (a typed client cannot even express it).
async fn create_undecodable(client: &kube::Client, key_pem: &str, cert_pem: &str) {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bad", "namespace": NS},
        "immutable": "yes",
        "data": {"tls.crt": b64(cert_pem), "tls.key": b64(key_pem)},
    });
    let request = http::Request::post(format!("/api/v1/namespaces/{NS}/secrets"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    client
        .request_text(request)
        .await
        .expect("mini-apiserver stores the undecodable Secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_secret_is_named_never_dumped_and_does_not_stop_the_others() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = ApiServer::start(tmp.path(), &[]);
    let client = api.client_with_token(ADMIN_TOKEN);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let ca = Ca::default();
    let good = ca.issue(&CertSpec::server(&["localhost"]));
    let bad = ca.issue(&CertSpec::server(&["bad.example"]));
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("good", &good.cert_pem, &good.key_pem),
        )
        .await
        .unwrap();
    create_undecodable(&client, &bad.key_pem, &bad.cert_pem).await;

    // Both ways of following: one watch per object, and one namespace-wide watch.
    for (mode, extra) in [
        ("per-object", vec!["--secrets", "good,bad"]),
        (
            "namespace-wide",
            vec!["--secrets", "good,bad", "--namespace-watch-threshold", "0"],
        ),
    ] {
        let dest = tmp.path().join(mode);
        let syncer = Syncer::start(&api, &dest, &extra);
        let key = dest.join("secrets/good/tls.key");
        e2e::wait_until(&format!("{mode}: good written"), WITHIN, || async {
            std::fs::read_to_string(&key).ok().as_deref() == Some(good.key_pem.as_str())
        })
        .await;
        e2e::wait_until(
            &format!("{mode}: the bad object reported"),
            WITHIN,
            || async {
                let log = syncer.process.stderr_text();
                log.contains("cannot decode the object") && log.contains("secret/bad")
            },
        )
        .await;
        let log = syncer.process.stderr_text();
        assert!(
            log.contains("immutable"),
            "{mode}: the field is named: {log}"
        );
        assert!(!dest.join("secrets/bad").exists(), "{mode}");
        assert_no_key(mode, &log, &bad.key_pem);
        assert_no_key(mode, &log, &good.key_pem);
        let (status, _) = syncer.readyz();
        assert_eq!(status, 503, "{mode}: an undecodable object is not ready");
    }

    // inspect --namespace: the bad object is a finding (exit 1), the good one is listed.
    let output = Command::new(bin_path("cert-syncer"))
        .args(["inspect", "--namespace", NS, "--server", &api.url()])
        .args(["--tls-server-name-override", "localhost-recovery"])
        .arg("--ca-file")
        .arg(api.dir.join("recovery-ca.crt"))
        .arg("--token-file")
        .arg(api.dir.join("token"))
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("good") && text.contains("bad"), "{text}");
    assert!(text.contains("immutable"), "{text}");
    assert_no_key("inspect", &text, &bad.key_pem);
}

fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().into_string().unwrap();
        if path.is_dir() {
            for (inner, bytes) in listing(&path) {
                out.push((format!("{name}/{inner}"), bytes));
            }
        } else {
            out.push((name, std::fs::read(&path).unwrap()));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_object_directory_is_refused_and_nothing_outside_changes() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = ApiServer::start(tmp.path(), &[]);
    let secrets: Api<Secret> = Api::namespaced(api.client_with_token(ADMIN_TOKEN), NS);
    let ca = Ca::default();
    let leaf = ca.issue(&CertSpec::server(&["localhost"]));
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving-cert", &leaf.cert_pem, &leaf.key_pem),
        )
        .await
        .unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("..olddir")).unwrap();
    std::fs::write(outside.join("..olddir/keep"), "keep").unwrap();
    std::fs::write(outside.join("tls.crt"), "precious").unwrap();
    let before = listing(&outside);
    let dest = tmp.path().join("dest");
    std::fs::create_dir_all(dest.join("secrets")).unwrap();
    let link = dest.join("secrets/serving-cert");
    std::os::unix::fs::symlink(&outside, &link).unwrap();

    let syncer = Syncer::start(&api, &dest, &["--secrets", "serving-cert"]);
    e2e::wait_until("the refusal", WITHIN, || async {
        syncer
            .process
            .stderr_text()
            .contains("refusing to write or remove through")
    })
    .await;
    let log = syncer.process.stderr_text();
    assert!(
        log.contains(&link.display().to_string()),
        "names the path: {log}"
    );
    assert_eq!(listing(&outside), before, "nothing outside changed");
    assert_eq!(syncer.readyz().0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_mapping_writes_one_key_only_and_a_missing_object_is_not_ready() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = ApiServer::start(tmp.path(), &[]);
    let secrets: Api<Secret> = Api::namespaced(api.client_with_token(ADMIN_TOKEN), NS);
    let ca = Ca::default();
    let leaf = ca.issue(&CertSpec::server(&["localhost"]));
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving-cert", &leaf.cert_pem, &leaf.key_pem),
        )
        .await
        .unwrap();
    let dest = tmp.path().join("dest");
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let cert_file = host.join("serving.crt");
    let missing_file = host.join("missing.crt");
    let syncer = Syncer::start(
        &api,
        &dest,
        &[
            "--file",
            &format!("secret/serving-cert/tls.crt={}", cert_file.display()),
            "--file",
            &format!("secret/absent-cert/tls.crt={}", missing_file.display()),
        ],
    );
    e2e::wait_until("the host file", WITHIN, || async {
        std::fs::read_to_string(&cert_file).ok().as_deref() == Some(leaf.cert_pem.as_str())
    })
    .await;
    e2e::wait_until("the missing object reported", WITHIN, || async {
        syncer.process.stderr_text().contains("secret/absent-cert")
    })
    .await;
    // Only the mapped key left the apiserver: no copy of the Secret (its key) in the destination.
    assert!(
        !dest.join("secrets/serving-cert").exists(),
        "the whole Secret was mirrored"
    );
    let (status, body) = syncer.readyz();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("absent-cert"), "{body}");
    assert!(!missing_file.exists());
}

const ROTATION: &str = r#"
namespace: openshift-kube-apiserver
signers:
  - { name: serving-signer, validity: 30d, refresh: 15d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - name: pull-secret
    signer: serving-signer
    serving: { hostnames: [localhost] }
    validity: 10d
    refresh: 5d
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regenerate_refuses_a_secret_type_it_does_not_own() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = ApiServer::start(tmp.path(), &[]);
    let secrets: Api<Secret> = Api::namespaced(api.client_with_token(ADMIN_TOKEN), NS);
    let pull = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("pull-secret".to_owned()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".to_owned()),
        data: Some(std::collections::BTreeMap::from([(
            ".dockerconfigjson".to_owned(),
            k8s_openapi::ByteString(b"{\"auths\":{}}".to_vec()),
        )])),
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &pull).await.unwrap();
    let config = tmp.path().join("rotation.yaml");
    std::fs::write(&config, ROTATION).unwrap();
    let output = e2e::syncer::regenerate_command(&api, &config, &["--once"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("kubernetes.io/dockerconfigjson") && stderr.contains("does not manage"),
        "{stderr}"
    );
    let after = secrets.get("pull-secret").await.unwrap();
    let keys: Vec<&String> = after.data.as_ref().unwrap().keys().collect();
    assert_eq!(
        keys,
        [".dockerconfigjson"],
        "nothing was added to the pull secret"
    );
    // The signer and its bundle, which it does own, were still created.
    assert!(secrets.get_opt("serving-signer").await.unwrap().is_some());
}

const TWO_TARGETS: &str = r#"
namespace: openshift-kube-apiserver
signers:
  - { name: serving-signer, validity: 30d, refresh: 15d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - name: from-the-future
    signer: serving-signer
    serving: { hostnames: [localhost] }
    validity: 10d
    refresh: 5d
  - name: expired-cert
    signer: serving-signer
    serving: { hostnames: [localhost] }
    validity: 10d
    refresh: 5d
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_certificate_with_a_future_not_before_does_not_stop_the_other_regenerations() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = ApiServer::start(tmp.path(), &[]);
    let client = api.client_with_token(ADMIN_TOKEN);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let now = time::OffsetDateTime::now_utc();
    let ca = Ca::with_validity(
        now - time::Duration::days(1),
        now + time::Duration::days(800),
    );
    let future = ca.issue(&CertSpec::server(&["localhost"]).valid(
        now + time::Duration::days(365),
        now + time::Duration::days(400),
    ));
    let expired = ca.issue(&CertSpec::server(&["localhost"]).valid(
        now - time::Duration::days(20),
        now - time::Duration::days(2),
    ));
    for (name, cert, key) in [
        ("serving-signer", ca.cert_pem.clone(), ca.key_pem()),
        (
            "from-the-future",
            future.cert_pem.clone(),
            future.key_pem.clone(),
        ),
        (
            "expired-cert",
            expired.cert_pem.clone(),
            expired.key_pem.clone(),
        ),
    ] {
        secrets
            .create(&PostParams::default(), &tls_secret(name, &cert, &key))
            .await
            .unwrap();
    }
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, NS);
    config_maps
        .create(
            &PostParams::default(),
            &e2e::syncer::bundle_config_map("serving-ca", &ca.cert_pem),
        )
        .await
        .unwrap();
    let config = tmp.path().join("rotation.yaml");
    std::fs::write(&config, TWO_TARGETS).unwrap();
    let output = e2e::syncer::regenerate_command(&api, &config, &["--once"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "the stray is a failure: {stderr}"
    );
    assert!(stderr.contains("from-the-future"), "{stderr}");
    let regenerated = secrets.get("expired-cert").await.unwrap();
    assert_ne!(
        regenerated.data.unwrap()["tls.crt"].0,
        expired.cert_pem.as_bytes(),
        "the expired certificate was regenerated despite the stray: {stderr}"
    );
    let stray = secrets.get("from-the-future").await.unwrap();
    assert_eq!(
        stray.data.unwrap()["tls.crt"].0,
        future.cert_pem.as_bytes(),
        "the stray is left alone"
    );
}
