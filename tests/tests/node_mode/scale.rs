//! Node mode at scale: N `cert-syncer node` processes (one per simulated node, each its own
//! host file) against one real kube-apiserver, following one ConfigMap (the OpenShift preset's
//! source). Per update: the requests and watch events the apiserver serves (its own
//! `/metrics` deltas), and the time until all N files hold the new bundle (p50/p99 over every
//! file of every update); at rest: CPU per process over an idle window, and RSS.
//!
//! N is 20 by default (CI: 2 cores); `E2E_NODE_SCALE=100` runs the full figure. Skips
//! (passing, with `SKIP: <reason>`) when no real kube-apiserver is available.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::envtest::RealApiServer;
use e2e::syncer::bundle_config_map;
use e2e::tls::p50_p99;
use e2e::{
    Ca, ChildProcess, bin_path, install_crypto_provider, metric_sum, require_real_apiserver,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

const NS: &str = "openshift-config-managed";
const CM: &str = "kube-apiserver-client-ca";
/// Updates measured.
const UPDATES: usize = 10;
/// The idle window CPU is measured over.
const IDLE: Duration = Duration::from_secs(10);

fn scale() -> usize {
    std::env::var("E2E_NODE_SCALE")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(20)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(14) + field(15)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn first_der(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .expect("a certificate")
        .expect("PEM")
        .to_vec()
}

fn holds(path: &PathBuf, der: &[u8]) -> bool {
    std::fs::read(path).is_ok_and(|bytes| {
        CertificateDer::pem_slice_iter(&bytes).any(|c| c.is_ok_and(|c| c.as_ref() == der))
    })
}

/// Requests on configmaps by verb, and ConfigMap watch events, from the apiserver's metrics.
fn api_counts(api: &RealApiServer) -> [f64; 4] {
    let text = api.metrics();
    let verb = |v: &str| {
        metric_sum(
            &text,
            "apiserver_request_total",
            &[&format!("verb=\"{v}\""), "resource=\"configmaps\""],
        )
    };
    [
        verb("GET"),
        verb("LIST"),
        verb("WATCH"),
        metric_sum(
            &text,
            "apiserver_watch_events_total",
            &["kind=\"ConfigMap\""],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_nodes_follow_one_source_with_one_watch_event_each_and_no_requests_per_update() {
    require_real_apiserver!();
    install_crypto_provider();
    let nodes = scale();
    let tmp = tempfile::tempdir().unwrap();
    let api = tokio::task::block_in_place(|| RealApiServer::start(&tmp.path().join("apiserver")));
    api.create_namespace(NS).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(api.recovery_client(), NS);
    let mut previous = Ca::default();
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map(CM, &previous.cert_pem),
        )
        .await
        .unwrap();
    let files: Vec<PathBuf> = (0..nodes)
        .map(|i| {
            let dir = tmp.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            dir.join("kubelet-ca.crt")
        })
        .collect();
    // The CA inline, as in a pod's in-cluster config: no CA file to watch, so each process
    // needs one inotify instance (its host file's directory), as on a real node; 100 processes
    // with two each would exceed the default per-user limit of 128 instances here.
    let kubeconfig = tmp.path().join("kubeconfig");
    {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&api.recovery_ca);
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\n\
                 users:\n- name: u\n  user:\n    tokenFile: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
                api.url(),
                api.dir.join("token").display()
            ),
        )
        .unwrap();
    }
    let started = Instant::now();
    let processes: Vec<ChildProcess> = tokio::task::block_in_place(|| {
        files
            .iter()
            .enumerate()
            .map(|(i, file)| {
                let mut command = Command::new(bin_path("cert-syncer"));
                command
                    .arg("node")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--tls-server-name-override", "localhost-recovery"])
                    .args([
                        "--metrics-listen",
                        "127.0.0.1:0",
                        "--preset",
                        "openshift-kubelet-ca",
                    ])
                    .arg("--file")
                    .arg(file)
                    .args(["--node-name", &format!("node-{i}")])
                    .env("RUST_LOG", "warn");
                ChildProcess::start(command)
            })
            .collect()
    });
    let first = first_der(&previous.cert_pem);
    e2e::wait_until(
        "every node's first write",
        Duration::from_secs(120),
        || async { files.iter().all(|f| holds(f, &first)) },
    )
    .await;
    eprintln!(
        "{nodes} node-mode processes started and wrote their files in {} ms",
        started.elapsed().as_millis()
    );

    // At rest: CPU over an idle window, RSS.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: Vec<u64> = processes.iter().map(|p| cpu_ticks(p.child.id())).collect();
    tokio::time::sleep(IDLE).await;
    let idle_ticks: Vec<u64> = processes
        .iter()
        .zip(&before)
        .map(|(p, b)| cpu_ticks(p.child.id()).saturating_sub(*b))
        .collect();
    let rss: Vec<u64> = processes.iter().map(|p| rss_kib(p.child.id())).collect();
    let total_idle: u64 = idle_ticks.iter().sum();
    let mut sorted_rss = rss.clone();
    sorted_rss.sort_unstable();
    eprintln!(
        "idle {} s: CPU ticks (10 ms) summed over {nodes} processes {total_idle}, max per process {}; RSS per process median {} KiB, max {} KiB",
        IDLE.as_secs(),
        idle_ticks.iter().max().unwrap(),
        sorted_rss[nodes / 2],
        sorted_rss[nodes - 1]
    );

    let mut per_file = Vec::new();
    let mut all_files = Vec::new();
    let mut deltas = Vec::new();
    for update in 0..UPDATES {
        let next = Ca::default();
        let der = first_der(&next.cert_pem);
        let counts_before = api_counts(&api);
        let start = Instant::now();
        config_maps
            .replace(
                CM,
                &PostParams::default(),
                &bundle_config_map(CM, &format!("{}{}", previous.cert_pem, next.cert_pem)),
            )
            .await
            .unwrap();
        let mut pending: Vec<usize> = (0..nodes).collect();
        while !pending.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "update {update}: {} files not updated within 30 s",
                pending.len()
            );
            pending.retain(|i| {
                if holds(&files[*i], &der) {
                    per_file.push(start.elapsed());
                    false
                } else {
                    true
                }
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        all_files.push(start.elapsed());
        // Let the last watch events be counted, then read the deltas.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let counts_after = api_counts(&api);
        deltas.push(std::array::from_fn::<f64, 4, _>(|i| {
            counts_after[i] - counts_before[i]
        }));
        previous = next;
    }
    // Another ConfigMap of the namespace changes: a namespace-wide watch would carry it to
    // every node; the per-object watches (field selector) carry nothing.
    let other_before = api_counts(&api);
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("unrelated", &previous.cert_pem),
        )
        .await
        .unwrap();
    for _ in 0..2 {
        config_maps
            .replace(
                "unrelated",
                &PostParams::default(),
                &bundle_config_map("unrelated", &Ca::default().cert_pem),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other_after = api_counts(&api);
    let unrelated_events = other_after[3] - other_before[3];
    eprintln!(
        "3 changes of another ConfigMap in the namespace: {unrelated_events} watch events to the {nodes} nodes (a namespace-wide watch per node would get {})",
        3 * nodes
    );
    assert_eq!(
        unrelated_events, 0.0,
        "per-object watches carry no other object's changes"
    );
    let (p50, p99) = p50_p99(&per_file);
    let (all_p50, all_p99) = p50_p99(&all_files);
    let sum = |i: usize| deltas.iter().map(|d| d[i]).sum::<f64>() / UPDATES as f64;
    eprintln!(
        "{nodes} nodes, {UPDATES} updates: per update the apiserver served GET {:.1}, LIST {:.1}, WATCH {:.1} requests on configmaps and {:.1} ConfigMap watch events; \
         update -> file written p50 {} ms, p99 {} ms; update -> all {nodes} files p50 {} ms, p99 {} ms",
        sum(0),
        sum(1),
        sum(2),
        sum(3),
        p50.as_millis(),
        p99.as_millis(),
        all_p50.as_millis(),
        all_p99.as_millis()
    );
    // No request per update and node: the watch carries the change.
    assert_eq!(
        sum(0) + sum(1),
        0.0,
        "no GET or LIST per update: {deltas:?}"
    );
    // One watch event per node and update (the apiserver counts the events it sends).
    assert!(sum(3) >= nodes as f64, "a watch event per node: {deltas:?}");
    // At rest nothing runs: at most one tick (10 ms) per process over the window on average.
    assert!(total_idle <= nodes as u64, "idle CPU ticks {idle_ticks:?}");
    let polling = processes
        .iter()
        .filter(|p| p.stderr_text().contains("polling it"))
        .count();
    eprintln!(
        "{} of {nodes} processes watch their file with inotify, {polling} poll it (inotify instance limit)",
        nodes - polling
    );
    for process in &processes {
        assert!(
            !process.stderr_text().contains("ERROR"),
            "a node-mode process logged an error:\n{}",
            process.stderr_text()
        );
    }
}
