//! What the regenerate tests of this binary share: an apiserver (`mini-apiserver` or the real
//! kube-apiserver), a config of one signer, its bundle and one serving target in the
//! `openshift-kube-apiserver` namespace, and `cert-syncer regenerate` against it (`--once`, a
//! controller, a leader-election candidate).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::syncer::{NS, bundle_config_map, regenerate_command, tls_secret};
use e2e::{ApiEndpoint, Backend, Ca, CertSpec, TestApi, install_crypto_provider};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use testkit::files::rename_into;
use time::OffsetDateTime;

pub(crate) const CONFIG: &str = r#"
namespace: openshift-kube-apiserver
signers:
  - { name: serving-signer, validity: 200d, refresh: 150d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - name: serving-cert
    signer: serving-signer
    serving: { hostnames: [localhost, 127.0.0.1] }
    validity: 100d
    refresh: 50d
"#;

pub(crate) fn days(n: i64) -> time::Duration {
    time::Duration::days(n)
}

pub(crate) struct Fixture {
    pub(crate) _tmp: tempfile::TempDir,
    pub(crate) api: TestApi,
    pub(crate) config: PathBuf,
    pub(crate) secrets: Api<Secret>,
    pub(crate) config_maps: Api<ConfigMap>,
}

pub(crate) async fn fixture(backend: Backend) -> Fixture {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let config = tmp.path().join("rotation.yaml");
    rename_into(&config, CONFIG.as_bytes());
    let client = api.client_with_token(ADMIN_TOKEN);
    Fixture {
        secrets: Api::namespaced(client.clone(), NS),
        config_maps: Api::namespaced(client, NS),
        _tmp: tmp,
        api,
        config,
    }
}

impl Fixture {
    /// Stores signer `ca`, a bundle of `ca` and `others`, and a serving leaf valid in
    /// `leaf_window`.
    pub(crate) async fn seed(
        &self,
        ca: &mut Ca,
        others: &[&Ca],
        leaf_window: (OffsetDateTime, OffsetDateTime),
    ) {
        let signer = tls_secret("serving-signer", &ca.cert_pem, &ca.key_pem());
        self.secrets
            .create(&PostParams::default(), &signer)
            .await
            .unwrap();
        let pem: String = std::iter::once(ca.cert_pem.as_str())
            .chain(others.iter().map(|c| c.cert_pem.as_str()))
            .collect();
        self.config_maps
            .create(
                &PostParams::default(),
                &bundle_config_map("serving-ca", &pem),
            )
            .await
            .unwrap();
        let leaf = ca.issue(
            &CertSpec::server(&["localhost", "127.0.0.1"]).valid(leaf_window.0, leaf_window.1),
        );
        self.secrets
            .create(
                &PostParams::default(),
                &tls_secret("serving-cert", &leaf.cert_pem, &leaf.key_pem),
            )
            .await
            .unwrap();
    }

    pub(crate) fn once(&self, extra: &[&str]) -> (bool, String) {
        run_once(&self.api, &self.config, extra)
    }

    pub(crate) async fn versions(&self) -> BTreeMap<String, String> {
        let mut versions = BTreeMap::new();
        for name in ["serving-signer", "serving-cert"] {
            if let Some(secret) = self.secrets.get_opt(name).await.unwrap() {
                versions.insert(name.to_owned(), secret.metadata.resource_version.unwrap());
            }
        }
        if let Some(map) = self.config_maps.get_opt("serving-ca").await.unwrap() {
            versions.insert(
                "serving-ca".to_owned(),
                map.metadata.resource_version.unwrap(),
            );
        }
        versions
    }

    pub(crate) async fn pem_of(&self, name: &str, key: &str) -> String {
        let secret = self.secrets.get(name).await.unwrap();
        String::from_utf8(secret.data.unwrap()[key].0.clone()).unwrap()
    }

    pub(crate) async fn bundle(&self) -> Vec<CertificateDer<'static>> {
        let map = self.config_maps.get("serving-ca").await.unwrap();
        let text = map.data.unwrap()["ca-bundle.crt"].clone();
        CertificateDer::pem_slice_iter(text.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }
}

pub(crate) fn run_once(api: &impl ApiEndpoint, config: &Path, extra: &[&str]) -> (bool, String) {
    let output = regenerate_command(api, config, &["--once"])
        .args(extra)
        .output()
        .expect("cert-syncer runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    eprintln!("[cert-syncer regenerate --once {extra:?}]\n{stderr}");
    (output.status.success(), stderr)
}

pub(crate) fn der_of(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// Verifies `leaf` for `localhost` against `bundle`, now.
pub(crate) fn chains_to(leaf: &str, bundle: &[CertificateDer<'static>]) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in bundle {
        roots.add(ca.clone()).map_err(|e| e.to_string())?;
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(
            &der_of(leaf),
            &[],
            &ServerName::try_from("localhost").unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A long-running `regenerate` with a short leader election, its stderr collected.
pub(crate) fn candidate(f: &Fixture) -> e2e::ChildProcess {
    // ChildProcess waits for `listening on`: the metrics listener prints it.
    let mut command = regenerate_command(
        &f.api,
        &f.config,
        &[
            "--leader-elect",
            "--leader-elect-namespace",
            NS,
            "--leader-elect-lease-duration",
            "2s",
            "--leader-elect-renew-deadline",
            "1500ms",
            "--leader-elect-retry-period",
            "200ms",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    command.env("RUST_LOG", "info");
    e2e::ChildProcess::start(command)
}

/// A long-running `regenerate` (no leader election) with its metrics and health endpoint.
pub(crate) fn controller(f: &Fixture) -> e2e::ChildProcess {
    let mut command = regenerate_command(&f.api, &f.config, &["--metrics-listen", "127.0.0.1:0"]);
    // Events go on this (pretend) pod, in the test namespace.
    command
        .env("RUST_LOG", "info")
        .env("POD_NAME", "cert-regeneration-controller")
        .env("POD_NAMESPACE", NS);
    e2e::ChildProcess::start(command)
}

pub(crate) fn metrics_of(process: &e2e::ChildProcess) -> String {
    e2e::plain_http_get(&process.addr.to_string(), "/metrics").1
}

/// Another writer: `write` every `every` for `seconds` (each `true` when it changed something),
/// then half a second for ours to answer; how many writes changed something.
pub(crate) async fn keep_writing<F, Fut>(
    seconds: u64,
    every: std::time::Duration,
    mut write: F,
) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let mut wrote = 0;
    while std::time::Instant::now() < deadline {
        if write().await {
            wrote += 1;
        }
        tokio::time::sleep(every).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    wrote
}

/// The sum of the series of metric `name` for `object` (`NS/object`).
pub(crate) fn object_metric(metrics: &str, name: &str, object: &str) -> f64 {
    let label = format!("object=\"{NS}/{object}\"");
    e2e::metric_sum(metrics, name, &[label.as_str()])
}

/// The reasons of the Events in the test namespace.
pub(crate) async fn event_reasons(f: &Fixture) -> Vec<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(f.api.client_with_token(ADMIN_TOKEN), NS);
    events
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}
