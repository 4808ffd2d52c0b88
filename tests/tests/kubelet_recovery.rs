//! The sleep, on a node: a real kubelet starts the rendered `manifests/static-pod` (the real
//! kube-apiserver v1.20.2 and our two sidecars, images from `scripts/build-images`) on a control
//! plane whose whole `openshift-kube-apiserver` PKI expired while the node slept
//! (`e2e::node::cluster`: every signer and target, `localhost-recovery` valid, the cert dir as
//! `sync` left it, the objects in etcd). kube-apiserver starts on the expired certificates; the
//! sidecars, in their containers with only the pod's RBAC and tokens, heal it. Done when a
//! client trusting only the bundle `cert-syncer node` keeps on the host
//! (`localhost-serving-ca`) verifies `https://localhost:6443` and `kubectl get --raw /readyz`
//! answers `ok` through it.
//!
//! Milestones from the kubelet's start are asserted in order and printed.
//! `E2E_NODE_RUNS=5` repeats the whole scenario and prints p50/p99 of kubelet start → verified
//! handshake (BENCHMARKS.md). Skips (passing, with `SKIP: <reason>`) where the node tier
//! cannot run.

use std::time::Duration;

use e2e::install_crypto_provider;
use e2e::node::profile_objects;
use e2e::node::scenario::{WakeOptions, Woken, first_der, not_after, now};
use e2e::tls::p50_p99;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

/// Milestones of one run, from the kubelet's start.
#[derive(Debug)]
struct Milestones {
    apiserver_running: Duration,
    recovery_answers: Duration,
    node_ready: Duration,
    cert_dir_healed: Duration,
    verified: Duration,
}

async fn recover_once() -> Milestones {
    let mut woken = Woken::start(WakeOptions::default()).await;
    let serving = woken
        .plane
        .cert_file("secrets/localhost-serving-cert-certkey/tls.crt");
    let slept = std::fs::read_to_string(&serving).expect("sync wrote the serving pair");
    assert!(
        not_after(&slept) < now(),
        "the synced localhost certificate expired during the sleep"
    );

    let apiserver_running = woken.apiserver_running().await;
    let recovery_answers = woken.recovery_answers().await;
    let cert_dir_healed = woken.cert_dir_healed().await;
    let (verified, serial) = woken.verified().await;
    let node_ready = woken.node_ready().await;

    let out = woken.kubectl(&["get", "--raw", "/readyz"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "kubectl get --raw /readyz through node mode's bundle alone: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(
        serial,
        e2e::serial_of(&first_der(&slept)),
        "a new certificate is served for localhost"
    );

    // Every signer and target of the profile is valid again in the API (waited for, printed as
    // a milestone: the pass that heals the serving certificates of the service network and the
    // load balancers may end after the localhost pair is verified).
    let admin = woken.plane.admin();
    let still_expired = || async {
        let mut expired = Vec::new();
        for (ns, name) in profile_objects::profile_secrets() {
            let secret = Api::<Secret>::namespaced(admin.clone(), ns)
                .get(name)
                .await
                .unwrap_or_else(|err| panic!("{ns}/{name}: {err}"));
            let pem = String::from_utf8(secret.data.unwrap()["tls.crt"].0.clone()).unwrap();
            if not_after(&pem) < now() {
                expired.push(format!("{ns}/{name}"));
            }
        }
        expired
    };
    let first_look = still_expired().await;
    if !first_look.is_empty() {
        eprintln!("still expired in the API when the node was Ready: {first_look:?}");
    }
    woken
        .wait("every profile Secret valid in the API", || async {
            still_expired().await.is_empty()
        })
        .await;

    assert!(apiserver_running <= recovery_answers);
    assert!(recovery_answers <= cert_dir_healed);
    assert!(cert_dir_healed <= verified);
    Milestones {
        apiserver_running,
        recovery_answers,
        node_ready,
        cert_dir_healed,
        verified,
    }
}

/// `E2E_NODE_RUNS`, default 1.
fn runs() -> usize {
    std::env::var("E2E_NODE_RUNS")
        .ok()
        .map(|v| v.parse().expect("E2E_NODE_RUNS is a number"))
        .unwrap_or(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_starts_the_pod_on_an_expired_pki_and_the_sidecars_heal_it() {
    e2e::require_node!();
    install_crypto_provider();
    let runs = runs();
    let mut times = Vec::new();
    for run in 0..runs {
        let milestones = recover_once().await;
        eprintln!(
            "run {}: container running {} ms, localhost-recovery {} ms, cert dir healed {} ms, \
             verified {} ms, node Ready by {} ms",
            run + 1,
            milestones.apiserver_running.as_millis(),
            milestones.recovery_answers.as_millis(),
            milestones.cert_dir_healed.as_millis(),
            milestones.verified.as_millis(),
            milestones.node_ready.as_millis()
        );
        times.push(milestones.verified);
    }
    let (p50, p99) = p50_p99(&times);
    eprintln!(
        "node tier: kubelet start -> verified handshake, {runs} run(s): p50 {} ms, p99 {} ms ({:?})",
        p50.as_millis(),
        p99.as_millis(),
        times.iter().map(Duration::as_millis).collect::<Vec<_>>()
    );
}
