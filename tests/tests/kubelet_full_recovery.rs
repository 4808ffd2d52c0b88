//! The whole recovery after a sleep, on a node (issue 27, item 3; the enhancement's steps 1–17,
//! docs/openshift.md "The whole recovery on a node"): a real kubelet starts the rendered
//! `manifests/static-pod` (real kube-apiserver + our sidecars), `manifests/static-pod-kcm` (the
//! real kube-controller-manager v1.20.2 + our sidecars) and `manifests/static-pod-ks` (the real
//! kube-scheduler v1.20.2 + our sidecars) on a control plane whose whole PKI expired while the
//! node slept (`e2e::node::cluster`, `kcm_plane`, `ks_plane`: every signer and target of the
//! kube-apiserver and kube-controller-manager profiles, `localhost-recovery` valid; the three
//! cert dirs as `sync` left them). The kubelet itself starts with an
//! expired client certificate (from the old `csr-signer`) and a bootstrap kubeconfig (OpenShift's
//! `node-bootstrapper` token), as a master after a long sleep.
//!
//! Milestones from the kubelet's start, each asserted and printed (`NAMES`): kube-apiserver
//! container running; it answers `localhost-recovery`; it recovered (a client trusting only
//! node mode's host bundle verifies `https://localhost:6443`); the kubelet's CSR, created by the
//! bootstrap identity, approved by the approver (`cert-syncer approve-kubelet-csr`, the
//! kube-controller-manager pod's container `kube-controller-manager-csr-approver`, reading the
//! kubelet's certificate directory through a hostPath; watched alongside the others); the
//! controller manager's `csr-signer`
//! regenerated and published, its client certificate re-issued and copied, both synced into
//! its cert dir; the scheduler's client certificate re-issued, copied and synced;
//! kube-controller-manager and kube-scheduler authenticate with the new certificates (each
//! renews its leader Lease); the CSR signed by kube-controller-manager with the recovered
//! `csr-signer` (the issued certificate verifies with it, not with the slept one); the kubelet's
//! new client certificate on its disk; node Ready through it; the scheduler binds a pod to the
//! node.
//!
//! Restart what cannot reload (issue 37): kube-controller-manager and kube-scheduler 1.20 read
//! their kubeconfig's client certificate at start and then only every 5 minutes, so each pod's
//! `restart-on-change` sidecar restarts its server (SIGTERM; the kubelet starts it again) once
//! `sync` wrote the new pair: each restart is a milestone (its Event `RestartingContainer`),
//! asserted to come after the pair was synced and before the server authenticates; each
//! server ran in exactly two containers (one restart, counted on the node) with exactly one
//! Event and `cert_syncer_container_restarts_total` 1; and the kubelet never exited (it would
//! after 5 minutes without a valid client certificate). `E2E_NODE_RESTART=off` runs the same
//! scenario without the restarters (the benchmark's baseline: one container each, the
//! servers wait for client-go's re-read, and the kubelet is started again should it exit, as
//! systemd's `Restart=always` does).
//!
//! `E2E_NODE_RUNS=3` repeats the whole scenario and prints p50/p99 of every milestone
//! (BENCHMARKS.md). Skips (passing, with `SKIP: <reason>`) where the node tier cannot run.

use std::time::{Duration, Instant};

use e2e::install_crypto_provider;
use e2e::node::cluster::ControlPlane;
use e2e::node::kcm_plane::{
    BOOTSTRAP_USER, KCM_APPROVER, KCM_NS, KCM_POD, KCM_RECOVERY, KCM_RESTARTER, KCM_SERVER,
    KCM_SYNC, KcmPlane,
};
use e2e::node::pod::workload;
use e2e::node::scenario::{WakeOptions, Woken, first_der, is_ready, not_after, now};
use e2e::node::scheduler::{
    NAMESPACE as SCHEDULER_NS, POD as SCHEDULER_POD, RESTARTER as SCHEDULER_RESTARTER, SCHEDULER,
};
use e2e::node::{KubeletOptions, Node, images, kubelet::node_name};
use e2e::tls::p50_p99;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node as KubeNode, Pod, Secret};
use kube::api::{Api, ListParams, PostParams};

/// Every milestone within this of the kubelet's start: without the restarters
/// (`E2E_NODE_RESTART=off`) kube-controller-manager re-reads its client certificate every 5
/// minutes (client-go), and a loaded 2-core machine.
const WITHIN: Duration = Duration::from_secs(540);

/// The restart Event of `restart-on-change`.
const RESTARTING: &str = "RestartingContainer";

/// The milestones of one run, in order, with their names.
const NAMES: [&str; 16] = [
    "kube-apiserver container running",
    "kube-apiserver answers localhost-recovery",
    "kube-apiserver recovered: a client trusting node mode's bundle verifies localhost:6443",
    "the kubelet's CSR (bootstrap identity) approved by approve-kubelet-csr",
    "csr-signer regenerated and published in openshift-kube-controller-manager",
    "kube-controller-manager-client-cert-key re-issued and copied",
    "both synced into the kube-controller-manager's cert dir",
    "kube-scheduler-client-cert-key re-issued, copied and synced into the scheduler's cert dir",
    "kube-controller-manager restarted by its cert-restarter (Event RestartingContainer)",
    "kube-scheduler restarted by its cert-restarter (Event RestartingContainer)",
    "kube-controller-manager authenticates with its new client certificate (leader Lease renewed)",
    "kube-scheduler authenticates with its re-issued client certificate (leader Lease renewed)",
    "the kubelet's CSR signed by the recovered csr-signer",
    "the kubelet's new client certificate on its disk",
    "node Ready through its new client certificate",
    "kube-scheduler binds a pod to the node",
];

/// The run's state besides [`Woken`].
struct Run {
    woken: Woken,
    kcm: KcmPlane,
}

/// `E2E_NODE_RESTART`: `off` runs the pods without their `restart-on-change` sidecars (the
/// benchmark's baseline); default on.
fn restart_on() -> bool {
    match std::env::var("E2E_NODE_RESTART").as_deref() {
        Ok("off") => false,
        Ok("on") | Err(_) => true,
        Ok(other) => panic!("E2E_NODE_RESTART is `on` or `off`, not {other:?}"),
    }
}

impl Run {
    fn fail(&self, what: &str) -> ! {
        let node = &self.woken.node;
        panic!(
            "not reached: {what} (within {WITHIN:?} of the kubelet's start)\nkubelet:\n{}\n\
             kube-controller-manager:\n{}\nkcm sync:\n{}\nkcm recovery:\n{}\nkcm restarter:\n{}\n\
             scheduler restarter:\n{}\nkube-apiserver:\n{}\nkas regenerate:\n{}\napprover:\n{}",
            node.kubelet_log_tail(),
            node.container_log(KCM_POD, KCM_SERVER),
            node.container_log(KCM_POD, KCM_SYNC),
            node.container_log(KCM_POD, KCM_RECOVERY),
            node.container_log(KCM_POD, KCM_RESTARTER),
            node.container_log(SCHEDULER_POD, SCHEDULER_RESTARTER),
            node.container_log("kube-apiserver", "kube-apiserver"),
            node.container_log(
                "kube-apiserver",
                "kube-apiserver-cert-regeneration-controller"
            ),
            node.container_log(KCM_POD, KCM_APPROVER),
        )
    }

    /// Waits for every watcher (the harness starting the kubelet again should it exit, as
    /// systemd does); their times (`None` for a watcher not run), printed in time order with
    /// `names`.
    async fn collect(
        &mut self,
        names: &[&str],
        watchers: Vec<Option<tokio::task::JoinHandle<Option<Duration>>>>,
    ) -> Vec<Option<Duration>> {
        while !watchers
            .iter()
            .flatten()
            .all(tokio::task::JoinHandle::is_finished)
        {
            tokio::task::block_in_place(|| self.woken.node.keep_kubelet_running());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut times = Vec::new();
        for (name, watcher) in names.iter().zip(watchers) {
            let Some(watcher) = watcher else {
                times.push(None);
                continue;
            };
            match watcher.await.expect("a watcher") {
                Some(time) => times.push(Some(time)),
                None => self.fail(name),
            }
        }
        let mut printed: Vec<(Duration, &str)> = times
            .iter()
            .zip(names.iter().copied())
            .filter_map(|(time, name)| Some(((*time)?, name)))
            .collect();
        printed.sort();
        for (time, name) in printed {
            eprintln!("milestone +{:>6} ms: {name}", time.as_millis());
        }
        times
    }
}

/// Watches `probe` (every 100 ms, beside the others): the time since `started` when it first
/// held; `None` after [`WITHIN`].
fn watch<F, Fut>(started: Instant, mut probe: F) -> tokio::task::JoinHandle<Option<Duration>>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    tokio::spawn(async move {
        while started.elapsed() < WITHIN {
            if probe().await {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    })
}

/// A kubelet client CSR created by the bootstrap identity.
fn bootstrap_csr(c: &CertificateSigningRequest) -> bool {
    c.spec.signer_name == "kubernetes.io/kube-apiserver-client-kubelet"
        && c.spec.username.as_deref() == Some(BOOTSTRAP_USER)
}

/// Approved by `approve-kubelet-csr` (its reason; kube-controller-manager's own approver says
/// `AutoApproved`).
fn approved_by_ours(c: &CertificateSigningRequest) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conds| {
            conds.iter().any(|c| {
                c.type_ == "Approved"
                    && c.reason.as_deref() == Some("AutoApprovedExpiredNodeClientCert")
            })
        })
}

/// The certificate of `pem` verifies with the public key of the CA `ca_pem`.
fn issued_by(pem: &str, ca_pem: &str) -> bool {
    let (leaf_der, ca_der) = (first_der(pem), first_der(ca_pem));
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).expect("a certificate");
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("a CA certificate");
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

fn tls_crt(secret: &Secret) -> String {
    String::from_utf8(secret.data.as_ref().expect("data")["tls.crt"].0.clone()).expect("UTF-8")
}

/// The `RestartingContainer` Events in `namespace` (by `restart-on-change`).
async fn restart_events(admin: &kube::Client, namespace: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(admin.clone(), namespace);
    events
        .list(&ListParams::default().fields(&format!("reason={RESTARTING}")))
        .await
        .map(|list| list.items)
        .unwrap_or_default()
}

/// `cert_syncer_container_restarts_total` of `container` on the restarter's `/metrics` (the pods
/// use the host network: its listener is on the node's loopback).
fn restarts_counted(pod: &Pod, restarter: &str, container: &str) -> String {
    let argv = e2e::node::pod::raw_argv(pod, restarter);
    let listen = e2e::manifests::flag(&argv, "metrics-listen").expect("--metrics-listen");
    let (_, body) = e2e::plain_http_get(listen, "/metrics");
    let series = format!("cert_syncer_container_restarts_total{{container=\"{container}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or("absent")
        .to_owned()
}

async fn recover_once(restart: bool) -> Vec<Option<Duration>> {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let root = tmp.path().join("root");
    let name = node_name();
    let plane = ControlPlane::prepare(&root, &name).await;
    let mut kcm = KcmPlane::prepare(&plane, &name).await;
    if !restart {
        kcm.without_restarters();
    }

    // The slept state: everything of the controller manager's expired, the kubelet's too.
    let slept_client = std::fs::read_to_string(
        kcm.cert_file("secrets/kube-controller-manager-client-cert-key/tls.crt"),
    )
    .expect("sync wrote the controller manager's client certificate");
    let slept_signer_file = std::fs::read_to_string(kcm.cert_file("secrets/csr-signer/tls.crt"))
        .expect("sync wrote csr-signer");
    let slept_scheduler = std::fs::read_to_string(kcm.scheduler.client_file("tls.crt"))
        .expect("sync wrote the scheduler's client certificate");
    let slept_kubelet =
        std::fs::read_to_string(kcm.kubelet_client_cert()).expect("the kubelet's certificate");
    for (what, pem) in [
        (
            "the synced kube-controller-manager client certificate",
            &slept_client,
        ),
        ("the synced csr-signer", &slept_signer_file),
        ("the kubelet's client certificate", &slept_kubelet),
        (
            "the synced kube-scheduler client certificate",
            &slept_scheduler,
        ),
    ] {
        assert!(not_after(pem) < now(), "{what} expired during the sleep");
    }
    assert_eq!(slept_signer_file, kcm.slept_csr_signer);
    assert!(issued_by(&slept_kubelet, &kcm.slept_csr_signer));

    let mut node = tokio::task::block_in_place(|| Node::start(&tmp.path().join("node"), &[]));
    tokio::task::block_in_place(|| images::build_and_import(&node.containerd));
    node.place_manifest("kube-apiserver-pod.yaml", &plane.pod_manifest());
    node.place_manifest("kube-controller-manager-pod.yaml", &kcm.pod_manifest());
    node.place_manifest("kube-scheduler-pod.yaml", &kcm.scheduler.pod_manifest());
    let kubelet = KubeletOptions {
        kubeconfig: Some(kcm.kubelet_kubeconfig.clone()),
        extra_args: kcm.kubelet_args(),
        ..KubeletOptions::default()
    };
    let started = tokio::task::block_in_place(|| node.start_kubelet(&kubelet).started);
    let started_wall = now();
    let woken = Woken::assemble(node, plane, started, WakeOptions::default(), tmp);
    let mut run = Run { woken, kcm };
    let mut times = Vec::new();

    times.push(Some(run.woken.apiserver_running().await));
    times.push(Some(run.woken.recovery_answers().await));
    // From now on every milestone is watched concurrently (every 50-100 ms), so that each time
    // is when it first held, whatever the order. The kubelet's CSR, created with the bootstrap
    // token, is approved by ours once the kube-apiserver answers (signed only later, by the
    // recovered csr-signer).
    let csrs: Api<CertificateSigningRequest> = Api::all(run.woken.plane.admin());
    let approval = {
        let (csrs, started) = (csrs.clone(), run.woken.started);
        tokio::spawn(async move {
            while started.elapsed() < WITHIN {
                if let Ok(list) = csrs.list(&ListParams::default()).await
                    && list
                        .items
                        .iter()
                        .any(|c| bootstrap_csr(c) && approved_by_ours(c))
                {
                    return Some(started.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            None
        })
    };
    let admin = run.woken.plane.admin();
    let node_cn = format!("system:node:{}", run.woken.node.name);
    let node_name = run.woken.node.name.clone();

    // The scheduler's pod is created as soon as the API admits it (its `default` service account is made by kube-controller-manager once it
    // authenticates), and bound once the scheduler authenticates and the node is schedulable.
    let workloads: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let started = run.woken.started;
    let kcm_secrets: Api<Secret> = Api::namespaced(admin.clone(), KCM_NS);
    let valid_secret = |name: &'static str| {
        let api = kcm_secrets.clone();
        watch(started, move || {
            let api = api.clone();
            async move {
                matches!(api.get_opt(name).await, Ok(Some(s)) if not_after(&tls_crt(&s)) > now())
            }
        })
    };
    let valid_files = |files: Vec<std::path::PathBuf>| {
        watch(started, move || {
            let files = files.clone();
            async move {
                files.iter().all(|file| {
                    std::fs::read_to_string(file).is_ok_and(|pem| not_after(&pem) > now())
                })
            }
        })
    };
    // A Lease renewed since the kubelet started: only with a client certificate the
    // kube-apiserver accepts (the old ones expired before the processes started).
    let lease_renewed = |namespace: &str, name: &'static str| {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
        watch(started, move || {
            let leases = leases.clone();
            async move {
                let Ok(Some(lease)) = leases.get_opt(name).await else {
                    return false;
                };
                let spec = lease.spec.unwrap_or_default();
                spec.holder_identity.is_some_and(|h| !h.is_empty())
                    && spec
                        .renew_time
                        .is_some_and(|t| t.0.as_second() >= started_wall)
            }
        })
    };
    let signed = {
        let csrs = csrs.clone();
        watch(started, move || {
            let csrs = csrs.clone();
            async move {
                csrs.list(&ListParams::default()).await.is_ok_and(|l| {
                    l.items.iter().any(|c| {
                        bootstrap_csr(c)
                            && approved_by_ours(c)
                            && c.status
                                .as_ref()
                                .and_then(|s| s.certificate.as_ref())
                                .is_some_and(|b| !b.0.is_empty())
                    })
                })
            }
        })
    };
    let on_disk = run.kcm.kubelet_client_cert();
    let new_on_disk = {
        let file = on_disk.clone();
        watch(started, move || {
            let file = file.clone();
            async move { std::fs::read_to_string(&file).is_ok_and(|pem| not_after(&pem) > now()) }
        })
    };
    let ready = {
        let (nodes, name): (Api<KubeNode>, String) = (Api::all(admin.clone()), node_name.clone());
        watch(started, move || {
            let (nodes, name) = (nodes.clone(), name.clone());
            async move { matches!(nodes.get_opt(&name).await, Ok(Some(n)) if is_ready(&n)) }
        })
    };
    let bound = {
        let (pods, name) = (workloads.clone(), node_name.clone());
        watch(started, move || {
            let (pods, name) = (pods.clone(), name.clone());
            async move {
                if let Ok(None) = pods.get_opt("after-the-sleep").await {
                    let _ = pods
                        .create(&PostParams::default(), &workload("after-the-sleep", None))
                        .await;
                    return false;
                }
                matches!(pods.get_opt("after-the-sleep").await, Ok(Some(p)) if p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    == Some(name.as_str()))
            }
        })
    };
    // A restart by `restart-on-change`: its Event in the pod's namespace.
    let restarted = |namespace: &'static str| {
        let admin = admin.clone();
        restart.then(|| {
            watch(started, move || {
                let admin = admin.clone();
                async move { !restart_events(&admin, namespace).await.is_empty() }
            })
        })
    };
    let watchers = vec![
        Some(approval),
        Some(valid_secret("csr-signer")),
        Some(valid_secret("kube-controller-manager-client-cert-key")),
        Some(valid_files(vec![
            run.kcm.cert_file("secrets/csr-signer/tls.crt"),
            run.kcm
                .cert_file("secrets/kube-controller-manager-client-cert-key/tls.crt"),
        ])),
        Some(valid_files(vec![run.kcm.scheduler.client_file("tls.crt")])),
        restarted(KCM_NS),
        restarted(SCHEDULER_NS),
        Some(lease_renewed("kube-system", "kube-controller-manager")),
        Some(lease_renewed(SCHEDULER_NS, "kube-scheduler")),
        Some(signed),
        Some(new_on_disk),
        Some(ready),
        Some(bound),
    ];
    times.push(Some(run.woken.verified().await.0));
    times.extend(run.collect(&NAMES[3..], watchers).await);

    // The issued certificate: this node's, signed by the recovered csr-signer (not the slept
    // one), and the one the kubelet now has on its disk.
    let recovered_signer = tls_crt(&kcm_secrets.get("csr-signer").await.unwrap());
    let issued: Vec<String> = csrs
        .list(&ListParams::default())
        .await
        .expect("the CSRs")
        .items
        .into_iter()
        .filter(bootstrap_csr)
        .filter_map(|c| c.status?.certificate)
        .map(|b| String::from_utf8(b.0).expect("PEM"))
        .collect();
    assert!(!issued.is_empty(), "a certificate was issued");
    for pem in &issued {
        assert!(
            issued_by(pem, &recovered_signer),
            "the kubelet's certificate is signed by the recovered csr-signer"
        );
        assert!(!issued_by(pem, &run.kcm.slept_csr_signer));
        let der = first_der(pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(
            cert.subject().to_string().contains(&node_cn),
            "{}",
            cert.subject()
        );
    }
    let current = std::fs::read_to_string(&on_disk).expect("the kubelet's certificate");
    assert!(
        issued.iter().any(|i| first_der(i) == first_der(&current)),
        "the kubelet's certificate on disk is the one its CSR got"
    );

    // Restarted exactly once each by `restart-on-change` (on), or never (off: the new client
    // certificates were read by the running processes after client-go's 5 minutes). Counted
    // on the node (containerd): the mirror pods' restart counts are not posted while the
    // kubelet has no client certificate.
    let (kcm_containers, scheduler_containers) = (
        run.woken.node.container_ids(KCM_POD, KCM_SERVER).len(),
        run.woken.node.container_ids(SCHEDULER_POD, SCHEDULER).len(),
    );
    let kubelet_restarts = run.woken.node.kubelet_restarts();
    eprintln!(
        "containers run: kube-controller-manager {kcm_containers}, kube-scheduler \
         {scheduler_containers}; the kubelet started again {kubelet_restarts} time(s)"
    );
    if restart {
        assert_eq!(
            (kcm_containers, scheduler_containers),
            (2, 2),
            "kube-controller-manager and kube-scheduler each restarted exactly once:\n{}\n{}",
            run.woken.node.container_log(KCM_POD, KCM_RESTARTER),
            run.woken
                .node
                .container_log(SCHEDULER_POD, SCHEDULER_RESTARTER),
        );
        for (namespace, pod, restarter, server) in [
            (KCM_NS, &run.kcm.pod, KCM_RESTARTER, KCM_SERVER),
            (
                SCHEDULER_NS,
                &run.kcm.scheduler.pod,
                SCHEDULER_RESTARTER,
                SCHEDULER,
            ),
        ] {
            let events = restart_events(&admin, namespace).await;
            assert_eq!(
                events.len(),
                1,
                "one RestartingContainer Event in {namespace}"
            );
            let message = events[0].message.as_deref().unwrap_or_default();
            assert!(
                message.contains(server) && message.contains("SIGTERM"),
                "{message}"
            );
            assert_eq!(
                tokio::task::block_in_place(|| restarts_counted(pod, restarter, server)),
                "1",
                "cert_syncer_container_restarts_total of {server}"
            );
        }
        assert_eq!(kubelet_restarts, 0, "the kubelet never exited");
    } else {
        assert_eq!(
            (kcm_containers, scheduler_containers),
            (1, 1),
            "without the restarters, each server ran in one container"
        );
    }

    // What causes what: each step after the one it needs (within the watchers' polling: two
    // that hold within milliseconds of each other may be seen in either order).
    let t = &times;
    let after = |later: usize, earlier: usize| {
        let (Some(l), Some(e)) = (t[later], t[earlier]) else {
            return;
        };
        assert!(
            e <= l + Duration::from_millis(500),
            "{} (+{l:?}) before {} (+{e:?})",
            NAMES[later],
            NAMES[earlier],
        );
    };
    after(1, 0);
    after(2, 1);
    after(3, 1);
    for step in 4..=7 {
        after(step, 1);
    }
    after(6, 4);
    after(6, 5);
    after(8, 6);
    after(9, 7);
    after(10, 6);
    after(10, 8);
    after(11, 7);
    after(11, 9);
    after(12, 3);
    after(12, 10);
    after(13, 12);
    after(14, 13);
    after(15, 11);
    times
}

/// `E2E_NODE_RUNS`, default 1.
fn runs() -> usize {
    std::env::var("E2E_NODE_RUNS")
        .ok()
        .map(|v| v.parse().expect("E2E_NODE_RUNS is a number"))
        .unwrap_or(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_control_plane_and_the_kubelet_recover_after_the_sleep() {
    e2e::require_node!();
    install_crypto_provider();
    let runs = runs();
    let restart = restart_on();
    let mut all: Vec<Vec<Option<Duration>>> = Vec::new();
    let began = Instant::now();
    for run in 0..runs {
        let times = recover_once(restart).await;
        eprintln!(
            "run {}: {:?} ms",
            run + 1,
            times
                .iter()
                .map(|t| t.map(|t| t.as_millis()))
                .collect::<Vec<_>>()
        );
        all.push(times);
    }
    eprintln!(
        "node tier, full recovery, restart-on-change {}, {runs} run(s) in {} s: p50 / p99 from \
         the kubelet's start",
        if restart { "on" } else { "off" },
        began.elapsed().as_secs()
    );
    for (index, name) in NAMES.iter().enumerate() {
        let samples: Vec<Duration> = all.iter().filter_map(|t| t[index]).collect();
        if samples.is_empty() {
            eprintln!("  {:>2}. {name}: —", index + 1);
            continue;
        }
        let (p50, p99) = p50_p99(&samples);
        eprintln!(
            "  {:>2}. {name}: p50 {} ms, p99 {} ms",
            index + 1,
            p50.as_millis(),
            p99.as_millis()
        );
    }
}
