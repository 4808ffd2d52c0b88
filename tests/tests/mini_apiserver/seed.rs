//! `mini-apiserver --seed-dir`: YAML (multi-document) and JSON manifests loaded at start.

use e2e::{ApiServer, install_crypto_provider};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_manifests_are_loaded_at_start() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let seed = tmp.path().join("seed");
    std::fs::create_dir(&seed).unwrap();
    std::fs::write(
        seed.join("objects.yaml"),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: serving-cert\n  namespace: ns\nstringData:\n  tls.crt: hello\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: client-ca\n  namespace: ns\ndata:\n  ca-bundle.crt: pem\n",
    )
    .unwrap();
    std::fs::write(
        seed.join("lease.json"),
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"leader","namespace":"ns"},"spec":{"holderIdentity":"a"}}"#,
    )
    .unwrap();
    let server = ApiServer::start(tmp.path(), &["--seed-dir", seed.to_str().unwrap()]);
    let client = server.recovery_client();
    let secret = Api::<Secret>::namespaced(client.clone(), "ns")
        .get("serving-cert")
        .await
        .unwrap();
    assert_eq!(secret.data.unwrap()["tls.crt"].0, b"hello");
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), "ns")
        .get("client-ca")
        .await
        .unwrap();
    assert_eq!(config_map.data.unwrap()["ca-bundle.crt"], "pem");
    let lease = Api::<Lease>::namespaced(client, "ns")
        .get("leader")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("a"));
}

#[test]
fn a_malformed_seed_manifest_stops_the_server_with_the_file_named() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = tmp.path().join("seed");
    std::fs::create_dir(&seed).unwrap();
    std::fs::write(seed.join("bad.yaml"), "kind: [unclosed\n").unwrap();
    std::fs::write(tmp.path().join("tokens.csv"), "t,u,1\n").unwrap();
    let output = std::process::Command::new(e2e::bin("mini-apiserver"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--cert",
            "/nonexistent",
            "--key",
            "/nonexistent",
        ])
        .arg("--token-auth-file")
        .arg(tmp.path().join("tokens.csv"))
        .arg("--seed-dir")
        .arg(&seed)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.yaml"), "{stderr}");
}
