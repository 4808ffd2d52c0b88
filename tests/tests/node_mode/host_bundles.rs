//! `cert-syncer node` against the real kube-apiserver: the host CA bundle it keeps is the
//! apiserver's own `--client-ca-file`, loaded by the same fsnotify loader as the kubelet's
//! `clientCAFile`, so "a client certificate of the new signer is accepted" is the consumer
//! contract, proven end to end. Also: sources across namespaces in order, garbage in one source
//! (last good content kept, Event and metric naming object and key), a second writer (no
//! flapping, one foreign-content series at a time), and bundles the guard refuses (no unexpired
//! CA, or nothing of what the file trusts kept). Skips (passing, with `SKIP: <reason>`) when no real kube-apiserver is available.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::envtest::{RealApiServer, RealOptions};
use e2e::syncer::bundle_config_map;
use e2e::tls::p50_p99;
use e2e::{
    Ca, ChildProcess, bin_path, install_crypto_provider, metric_sum, plain_http_get,
    require_real_apiserver,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use testkit::files::rename_into as write_atomic;

/// Updates measured for the consumer contract.
const UPDATES: usize = 50;
/// How long one update may take before it counts as missed (the p99 is held to 1 s).
const SERVED_WITHIN: Duration = Duration::from_secs(10);
/// The OpenShift preset's source.
const PRESET_NS: &str = "openshift-config-managed";
const PRESET_CM: &str = "kube-apiserver-client-ca";

/// `cert-syncer node` on `api`'s recovery connection (admin token), keeping `file`.
fn node_command(api: &RealApiServer, file: &Path, sources: &[String], extra: &[&str]) -> Command {
    let mut command = Command::new(bin_path("cert-syncer"));
    command
        .arg("node")
        .args(["--server", &api.url()])
        .args(["--tls-server-name-override", "localhost-recovery"])
        .arg("--ca-file")
        .arg(api.dir.join("recovery-ca.crt"))
        .arg("--token-file")
        .arg(api.dir.join("token"))
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--file")
        .arg(file)
        .args(sources.iter().flat_map(|s| ["--source", s.as_str()]))
        .args(extra)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or("info".into()),
        );
    command
}

fn metrics(node: &ChildProcess) -> String {
    plain_http_get(&node.addr.to_string(), "/metrics").1
}

/// The certificates (DER) of a PEM text, in order.
fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.expect("PEM certificates").to_vec())
        .collect()
}

fn ders_of(cas: &[&Ca]) -> Vec<Vec<u8>> {
    cas.iter()
        .flat_map(|ca| ders(ca.cert_pem.as_bytes()))
        .collect()
}

fn file_ders(path: &Path) -> Option<Vec<Vec<u8>>> {
    std::fs::read(path).ok().map(|bytes| ders(&bytes))
}

async fn wait_for_ders(path: &Path, expected: &[Vec<u8>], what: &str) {
    e2e::wait_until(what, Duration::from_secs(60), || async {
        file_ders(path).as_deref() == Some(expected)
    })
    .await;
}

fn secret(name: &str, key: &str, value: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(value.to_vec()),
        )])),
        ..Secret::default()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// Events on Node `node` (namespace `default`), as `reason: message`.
async fn node_events(client: &kube::Client, node: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("Node"))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_trusts_each_signer_node_mode_adds_and_refuses_each_one_removed() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    // The node's /etc/kubernetes: the apiserver's --client-ca-file is the node-mode file,
    // seeded before it starts (it needs one to start).
    let host = tmp.path().join("etc-kubernetes");
    let file = host.join("kubelet-ca.crt");
    let mut oldest = Ca::default();
    write_atomic(&file, oldest.cert_pem.as_bytes());
    let options = RealOptions {
        extra_args: vec![format!("--client-ca-file={}", file.display())],
        ..RealOptions::default()
    };
    let dir = tmp.path().join("apiserver");
    let api = tokio::task::block_in_place(|| RealApiServer::start_with(&dir, &options));
    api.create_namespace(PRESET_NS).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(api.recovery_client(), PRESET_NS);
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map(PRESET_CM, &oldest.cert_pem),
        )
        .await
        .unwrap();
    // The OpenShift preset's source, into our file (the default grace period: the seeded file
    // already holds the source's certificate, so nothing is written at start).
    let node = ChildProcess::start(node_command(
        &api,
        &file,
        &[],
        &["--preset", "openshift-kubelet-ca", "--node-name", "node-0"],
    ));
    e2e::wait_until("node mode ready", Duration::from_secs(60), || async {
        plain_http_get(&node.addr.to_string(), "/readyz").0 == 200
    })
    .await;
    assert_eq!(
        metric_sum(&metrics(&node), "cert_syncer_node_writes_total", &[]),
        0.0
    );

    assert!(
        api.authenticates_client_cert(&mut oldest, "seed").await,
        "the seeded signer is trusted"
    );

    // Each update: the source gains a new signer and drops the one before the previous.
    let mut previous = Ca::default();
    config_maps
        .replace(
            PRESET_CM,
            &PostParams::default(),
            &bundle_config_map(
                PRESET_CM,
                &format!("{}{}", oldest.cert_pem, previous.cert_pem),
            ),
        )
        .await
        .unwrap();
    e2e::wait_until("the first added signer", Duration::from_secs(60), || {
        api.authenticates_client_cert(&mut previous, "warm-up")
    })
    .await;
    let mut latencies = Vec::new();
    let mut missed = Vec::new();
    for update in 1..=UPDATES {
        let mut next = Ca::default();
        let start = Instant::now();
        config_maps
            .replace(
                PRESET_CM,
                &PostParams::default(),
                &bundle_config_map(
                    PRESET_CM,
                    &format!("{}{}", previous.cert_pem, next.cert_pem),
                ),
            )
            .await
            .unwrap();
        let user = format!("client-{update}");
        let mut served = None;
        while start.elapsed() < SERVED_WITHIN {
            if api.authenticates_client_cert(&mut next, &user).await {
                served = Some(start.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        match served {
            Some(latency) => latencies.push(latency),
            None => missed.push(update),
        }
        assert!(
            api.authenticates_client_cert(&mut previous, &format!("kept-{update}"))
                .await,
            "update {update}: the previous signer, still in the source, keeps working"
        );
        assert!(
            !api.authenticates_client_cert(&mut oldest, &format!("dropped-{update}"))
                .await,
            "update {update}: the signer removed from the source is refused"
        );
        oldest = previous;
        previous = next;
    }
    let (p50, p99) = p50_p99(&latencies);
    let max = latencies.iter().max().copied().unwrap_or_default();
    eprintln!(
        "node mode -> kube-apiserver --client-ca-file: {} of {UPDATES} updates served; \
         update -> new signer accepted p50 {} ms, p99 {} ms, max {} ms",
        latencies.len(),
        p50.as_millis(),
        p99.as_millis(),
        max.as_millis()
    );
    assert!(missed.is_empty(), "updates not picked up: {missed:?}");
    assert!(p99 <= Duration::from_secs(1), "p99 {p99:?} is over 1 s");
    // One write per update, never more.
    let text = metrics(&node);
    assert_eq!(
        metric_sum(&text, "cert_syncer_node_writes_total", &[]),
        (UPDATES + 1) as f64
    );
    assert_eq!(
        metric_sum(&text, "cert_syncer_node_bundle_certificates", &[]),
        2.0
    );
    assert_eq!(
        metric_sum(&text, "cert_syncer_node_write_errors_total", &[]),
        0.0
    );
    let events = node_events(&api.recovery_client(), "node-0").await;
    assert!(
        events.iter().any(|e| e.starts_with("HostFileWritten:")),
        "an Event on the Node for the writes: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_across_namespaces_are_assembled_in_order_and_a_bad_one_keeps_its_last_good_part() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = tokio::task::block_in_place(|| RealApiServer::start(&tmp.path().join("apiserver")));
    let admin = api.recovery_client();
    api.create_namespace("ns-a").await;
    api.create_namespace("ns-b").await;
    let (a1, a2, a3, b1) = (Ca::default(), Ca::default(), Ca::default(), Ca::default());
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "ns-a");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "ns-b");
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("bundle-a", &format!("{}{}", a1.cert_pem, a2.cert_pem)),
        )
        .await
        .unwrap();
    // The second source repeats a1: it is kept once, at its first place.
    secrets
        .create(
            &PostParams::default(),
            &secret(
                "bundle-b",
                "ca.crt",
                format!("{}{}", b1.cert_pem, a1.cert_pem).as_bytes(),
            ),
        )
        .await
        .unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let file = host.join("ca-bundle.crt");
    let marker = tmp.path().join("post-write.log");
    let node = ChildProcess::start(node_command(
        &api,
        &file,
        &[
            "configmap/ns-a/bundle-a/ca-bundle.crt".to_owned(),
            "secret/ns-b/bundle-b/ca.crt".to_owned(),
        ],
        &[
            "--node-name",
            "node-7",
            "--mode",
            "0640",
            // A post-write action: one line per write of node mode.
            "--post-write-command",
            "sh",
            "--post-write-command",
            "-c",
            "--post-write-command",
            &format!("echo written >> {}", marker.display()),
        ],
    ));
    wait_for_ders(&file, &ders_of(&[&a1, &a2, &b1]), "the assembled bundle").await;
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let good = std::fs::read(&file).unwrap();

    // Garbage in the Secret: the file keeps its content, an Event and a metric name it.
    let garbage =
        b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
    secrets
        .replace(
            "bundle-b",
            &PostParams::default(),
            &secret("bundle-b", "ca.crt", garbage),
        )
        .await
        .unwrap();
    let labels = [
        "kind=\"secret\"",
        "namespace=\"ns-b\"",
        "name=\"bundle-b\"",
        "key=\"ca.crt\"",
    ];
    e2e::wait_until("the error metric", Duration::from_secs(30), || async {
        metric_sum(
            &metrics(&node),
            "cert_syncer_node_source_errors_total",
            &labels,
        ) >= 1.0
    })
    .await;
    assert_eq!(
        std::fs::read(&file).unwrap(),
        good,
        "the file keeps its last good content"
    );
    let (status, body) = plain_http_get(&node.addr.to_string(), "/readyz");
    assert_eq!(status, 503);
    assert!(body.contains("secret ns-b/bundle-b key ca.crt"), "{body}");
    e2e::wait_until("the Event on the Node", Duration::from_secs(30), || async {
        node_events(&admin, "node-7").await.iter().any(|e| {
            e.starts_with("SourceInvalid:") && e.contains("secret ns-b/bundle-b key ca.crt")
        })
    })
    .await;

    // The other source still rotates; the bad one contributes its last good certificates.
    config_maps
        .replace(
            "bundle-a",
            &PostParams::default(),
            &bundle_config_map("bundle-a", &format!("{}{}", a2.cert_pem, a3.cert_pem)),
        )
        .await
        .unwrap();
    wait_for_ders(
        &file,
        &ders_of(&[&a2, &a3, &b1, &a1]),
        "a rotation of the good source",
    )
    .await;

    // Fixed: back to ready, the file follows.
    secrets
        .replace(
            "bundle-b",
            &PostParams::default(),
            &secret("bundle-b", "ca.crt", b1.cert_pem.as_bytes()),
        )
        .await
        .unwrap();
    wait_for_ders(&file, &ders_of(&[&a2, &a3, &b1]), "the fixed source").await;
    e2e::wait_until("ready again", Duration::from_secs(30), || async {
        plain_http_get(&node.addr.to_string(), "/readyz").0 == 200
    })
    .await;
    let text = metrics(&node);
    assert_eq!(
        metric_sum(&text, "cert_syncer_node_source_valid", &labels),
        1.0
    );
    assert_eq!(
        metric_sum(&text, "cert_syncer_node_bundle_certificates", &[]),
        3.0
    );
    assert_eq!(metric_sum(&text, "cert_syncer_node_writes_total", &[]), 3.0);
    // The post-write action ran once per write, never for the refused version.
    e2e::wait_until(
        "the third post-write action",
        Duration::from_secs(30),
        || async {
            metric_sum(
                &metrics(&node),
                "cert_syncer_node_post_write_actions_total",
                &["result=\"ok\""],
            ) == 3.0
        },
    )
    .await;
    assert_eq!(std::fs::read_to_string(&marker).unwrap().lines().count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_rewriting_the_file_never_makes_node_mode_flap() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = tokio::task::block_in_place(|| RealApiServer::start(&tmp.path().join("apiserver")));
    api.create_namespace("writer").await;
    let ours = Ca::default();
    let config_maps: Api<ConfigMap> = Api::namespaced(api.recovery_client(), "writer");
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("bundle", &ours.cert_pem),
        )
        .await
        .unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let file = host.join("kubelet-ca.crt");
    let grace = Duration::from_secs(5);
    let node = ChildProcess::start(node_command(
        &api,
        &file,
        &["configmap/writer/bundle/ca-bundle.crt".to_owned()],
        &["--node-name", "node-w", "--grace-period", "5s"],
    ));
    wait_for_ders(&file, &ders_of(&[&ours]), "the first write").await;
    let writes = || metric_sum(&metrics(&node), "cert_syncer_node_writes_total", &[]);
    // The file is renamed into place before the counter moves: wait for the count, not the file.
    e2e::wait_until(
        "the first write counted",
        Duration::from_secs(30),
        || async { writes() >= 1.0 },
    )
    .await;
    assert_eq!(writes(), 1.0);

    // 100 rewrites with the same certificates (another formatting, as the MCD writes them):
    // nothing to do.
    let same = format!("{}\n", ours.cert_pem.replace("\r\n", "\n"));
    for _ in 0..100 {
        write_atomic(&file, same.as_bytes());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(writes(), 1.0, "identical certificates are never rewritten");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), same);
    assert_eq!(
        metric_sum(
            &metrics(&node),
            "cert_syncer_node_foreign_writes_total",
            &[]
        ),
        0.0
    );

    // 100 rewrites with other content, 20 ms apart (2 s, under the grace period of 5 s): node
    // mode waits for the writer to be quiet, then wins once. The other writer lags a rotation
    // (it still has our signer; replacing a bundle that shares nothing is refused).
    let (x, y) = (Ca::default(), Ca::default());
    let mut last = Vec::new();
    for i in 0..100 {
        last = if i % 2 == 0 {
            format!("{}{}", x.cert_pem, ours.cert_pem)
        } else {
            format!("{}{}", y.cert_pem, ours.cert_pem)
        }
        .into_bytes();
        write_atomic(&file, &last);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let quiet_since = Instant::now();
    assert_eq!(writes(), 1.0, "no write while the other writer is active");
    assert_eq!(std::fs::read(&file).unwrap(), last);
    // One foreign-content series, for the content there now: the two contents the writer
    // alternated between do not leave a series each behind.
    let fingerprint = sha256_hex(&last);
    let foreign_series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("cert_syncer_node_foreign_content{"))
            .map(str::to_owned)
            .collect()
    };
    e2e::wait_until(
        "the series of the last content",
        Duration::from_secs(3),
        || async {
            foreign_series(&metrics(&node))
                .iter()
                .any(|l| l.contains(&fingerprint))
        },
    )
    .await;
    let series = foreign_series(&metrics(&node));
    assert_eq!(
        series.len(),
        1,
        "one series, the current content: {series:?}"
    );
    wait_for_ders(
        &file,
        &ders_of(&[&ours]),
        "node mode's content after the grace period",
    )
    .await;
    let waited = quiet_since.elapsed();
    assert!(
        waited >= grace - Duration::from_millis(300),
        "replaced after {waited:?}, before the grace period"
    );
    // Another grace period: no flapping.
    tokio::time::sleep(grace + Duration::from_secs(1)).await;
    let text = metrics(&node);
    eprintln!(
        "second writer: 200 rewrites (100 same certificates, 100 different); node-mode writes {} (1 initial + 1 takeover), replaced {} ms after the writer went quiet (grace {} ms)",
        metric_sum(&text, "cert_syncer_node_writes_total", &[]),
        waited.as_millis(),
        grace.as_millis()
    );
    assert_eq!(metric_sum(&text, "cert_syncer_node_writes_total", &[]), 2.0);
    assert_eq!(
        metric_sum(&text, "cert_syncer_node_takeovers_total", &[]),
        1.0
    );
    assert!(
        foreign_series(&text).is_empty(),
        "the replaced content's series is gone:\n{text}"
    );
    let events = node_events(&api.recovery_client(), "node-w").await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("ForeignContentReplaced:") && e.contains(&fingerprint)),
        "an Event names the replaced content's fingerprint: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_with_no_unexpired_ca_or_unrelated_to_the_file_is_refused_and_the_file_kept() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = tokio::task::block_in_place(|| RealApiServer::start(&tmp.path().join("apiserver")));
    let admin = api.recovery_client();
    api.create_namespace("guard").await;
    let a = Ca::default();
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "guard");
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("bundle", &a.cert_pem),
        )
        .await
        .unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let file = host.join("kubelet-ca.crt");
    let node = ChildProcess::start(node_command(
        &api,
        &file,
        &["configmap/guard/bundle/ca-bundle.crt".to_owned()],
        &["--node-name", "node-g"],
    ));
    wait_for_ders(&file, &ders_of(&[&a]), "the first write").await;
    let good = std::fs::read(&file).unwrap();

    let now = time::OffsetDateTime::now_utc();
    let expired = Ca::with_validity(now - time::Duration::days(2), now - time::Duration::days(1));
    let leaf = a.issue(&e2e::CertSpec::server(&["leaf.example"])).cert_pem;
    let unrelated = Ca::default();
    for (what, content, reason) in [
        ("all expired", expired.cert_pem.clone(), "no-unexpired-ca"),
        ("not a CA", leaf, "no-unexpired-ca"),
        (
            "unrelated",
            unrelated.cert_pem.clone(),
            "removes-every-unexpired",
        ),
    ] {
        let before = metric_sum(
            &metrics(&node),
            "cert_syncer_node_bundle_refusals_total",
            &[&format!("reason=\"{reason}\"")],
        );
        let updated = config_maps
            .replace(
                "bundle",
                &PostParams::default(),
                &bundle_config_map("bundle", &content),
            )
            .await
            .unwrap();
        let version = updated.metadata.resource_version.unwrap();
        e2e::wait_until(what, Duration::from_secs(30), || async {
            metric_sum(
                &metrics(&node),
                "cert_syncer_node_bundle_refusals_total",
                &[&format!("reason=\"{reason}\"")],
            ) > before
        })
        .await;
        assert_eq!(
            std::fs::read(&file).unwrap(),
            good,
            "{what}: the file is kept"
        );
        let text = metrics(&node);
        assert_eq!(
            metric_sum(&text, "cert_syncer_node_bundle_refused", &[]),
            1.0,
            "{what}"
        );
        assert_eq!(
            metric_sum(&text, "cert_syncer_node_writes_total", &[]),
            1.0,
            "{what}"
        );
        let (status, body) = plain_http_get(&node.addr.to_string(), "/readyz");
        assert_eq!(status, 503, "{what}");
        let named =
            format!("configmap guard/bundle key ca-bundle.crt at resourceVersion {version}");
        assert!(body.contains(&named), "{what}: {body}");
        let logged = node.stderr_text();
        assert!(
            logged.contains("refusing to write the host file") && logged.contains(&named),
            "{what}: the log names the source object and the reason:\n{logged}"
        );
    }
    e2e::wait_until(
        "the Events on the Node",
        Duration::from_secs(30),
        || async {
            let events = node_events(&admin, "node-g").await;
            events
                .iter()
                .any(|e| e.starts_with("BundleRefused:") && e.contains("no unexpired CA"))
                && events
                    .iter()
                    .any(|e| e.starts_with("BundleRefused:") && e.contains("would remove every"))
        },
    )
    .await;

    // A rotation that keeps the signer the file holds is written; the refusal ends.
    config_maps
        .replace(
            "bundle",
            &PostParams::default(),
            &bundle_config_map("bundle", &format!("{}{}", a.cert_pem, unrelated.cert_pem)),
        )
        .await
        .unwrap();
    wait_for_ders(
        &file,
        &ders_of(&[&a, &unrelated]),
        "the overlapping rotation",
    )
    .await;
    e2e::wait_until("ready again", Duration::from_secs(30), || async {
        plain_http_get(&node.addr.to_string(), "/readyz").0 == 200
    })
    .await;
    assert_eq!(
        metric_sum(&metrics(&node), "cert_syncer_node_bundle_refused", &[]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_the_host_path_is_an_error_naming_it_never_a_hang() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = tokio::task::block_in_place(|| RealApiServer::start(&tmp.path().join("apiserver")));
    api.create_namespace("fifo").await;
    let ca = Ca::default();
    Api::<ConfigMap>::namespaced(api.recovery_client(), "fifo")
        .create(
            &PostParams::default(),
            &bundle_config_map("bundle", &ca.cert_pem),
        )
        .await
        .unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let file = host.join("kubelet-ca.crt");
    assert!(
        Command::new("mkfifo")
            .arg(&file)
            .status()
            .unwrap()
            .success()
    );
    let node = ChildProcess::start(node_command(
        &api,
        &file,
        &["configmap/fifo/bundle/ca-bundle.crt".to_owned()],
        &["--node-name", "node-f"],
    ));
    // A blocking open of a FIFO without a writer never returns: the error must come instead.
    let shown = file.display().to_string();
    e2e::wait_until(
        "/readyz names the FIFO",
        Duration::from_secs(30),
        || async {
            let (status, body) = plain_http_get(&node.addr.to_string(), "/readyz");
            status == 503 && body.contains("a FIFO") && body.contains(&shown)
        },
    )
    .await;
    assert!(
        node.stderr_text().contains("a FIFO"),
        "{}",
        node.stderr_text()
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&file)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // The loop is alive: once the FIFO is gone the file is written.
    std::fs::remove_file(&file).unwrap();
    wait_for_ders(&file, &ders_of(&[&ca]), "the file after the FIFO").await;
}
