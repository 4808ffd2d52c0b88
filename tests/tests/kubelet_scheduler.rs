//! The kube-scheduler pod under a real kubelet (issue 27, item 1): on the slept control plane of
//! `kubelet_recovery.rs` (the whole `openshift-kube-apiserver` PKI expired, the scheduler's
//! client certificate `openshift-config-managed/kube-scheduler-client-cert-key` among it), the
//! kube-apiserver pod recovers; then the rendered `manifests/static-pod-ks` is placed with an
//! empty cert dir. Its `regenerate --profile openshift-kube-scheduler` sidecar copies the
//! re-issued certificate into `openshift-kube-scheduler`, its `sync` sidecar writes it into the
//! cert dir, and the real kube-scheduler v1.20.2 (its kubeconfig names only that synced pair)
//! takes its Lease and binds a pod to the node. Then the source is deleted: the kube-apiserver
//! pod's sidecar issues a new one, the copy and the synced file follow (new serial on disk), and
//! the scheduler binds a second pod, in the same container (its `restart-on-change` sidecar
//! leaves a rotation between valid pairs to the scheduler's own re-read). Milestones are printed from the kubelet's start. Skips
//! (passing, with `SKIP: <reason>`) where the node tier cannot run.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use e2e::install_crypto_provider;
use e2e::node::pod::workload;
use e2e::node::profile_objects::{CM, OP};
use e2e::node::scenario::{WakeOptions, Woken, first_der, not_after, now};
use e2e::node::scheduler::{CLIENT_CERT, NAMESPACE, POD, SCHEDULER, SchedulerPod};
use e2e::tls::serial_of;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};

/// Each scheduler milestone must be reached this long after the previous step (the scheduler
/// exits until its pair is synced; the kubelet's restart back-off is 10 s, 20 s, 40 s…).
const STEP: Duration = Duration::from_secs(180);

/// The PEM `tls.crt` of a Secret, if it has one.
fn tls_crt(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get("tls.crt")?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The serial of the first certificate of `pem`.
fn serial(pem: &str) -> String {
    serial_of(&first_der(pem))
}

/// The subject CN of the first certificate of `pem`.
fn common_name(pem: &str) -> String {
    let der = first_der(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The issuer DN of the first certificate of `pem`, and its subject DN.
fn issuer_and_subject(pem: &str) -> (String, String) {
    let der = first_der(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    (cert.issuer().to_string(), cert.subject().to_string())
}

/// Polls `probe` every 100 ms until it returns `Some`; fails after [`STEP`] with the kubelet's
/// and the scheduler pod's logs.
async fn step<T, F, Fut>(woken: &Woken, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let begun = Instant::now();
    loop {
        if let Some(value) = probe().await {
            woken.milestone(what);
            return value;
        }
        if begun.elapsed() > STEP {
            panic!(
                "not reached within {STEP:?}: {what}\nkubelet about the scheduler:\n{}\n{}",
                woken.node.kubelet_errors_about("scheduler"),
                SchedulerPod::logs(&woken.node)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates `name` in `default` and waits until the scheduler has bound it to the node.
async fn bind(woken: &Woken, pods: &Api<Pod>, name: &str) {
    pods.create(&PostParams::default(), &workload(name, None))
        .await
        .unwrap_or_else(|err| panic!("create pod {name}: {err}"));
    let node = woken.node.name.clone();
    let bound = step(woken, &format!("the scheduler binds pod {name}"), || {
        let (pods, node) = (pods.clone(), node.clone());
        async move {
            let pod = pods.get(name).await.ok()?;
            pod.spec?.node_name.filter(|n| *n == node)
        }
    })
    .await;
    assert_eq!(bound, woken.node.name);
    let scheduled = pods
        .get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True");
    assert!(scheduled, "{name}: condition PodScheduled=True");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_authenticates_with_its_synced_client_certificate_and_binds_pods() {
    e2e::require_node!();
    install_crypto_provider();
    let mut woken = Woken::start(WakeOptions::default()).await;
    woken.apiserver_running().await;
    woken.recovery_answers().await;
    woken.cert_dir_healed().await;
    woken.node_ready().await;

    let admin = woken.plane.admin();
    let source: Api<Secret> = Api::namespaced(admin.clone(), CM);
    let copies: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    assert!(
        copies.get_opt(CLIENT_CERT).await.unwrap().is_none(),
        "no copy before the scheduler pod runs"
    );
    // The kube-apiserver pod's sidecar re-issues the scheduler's expired client certificate.
    let issued = step(
        &woken,
        "openshift-config-managed/kube-scheduler-client-cert-key re-issued",
        || {
            let source = source.clone();
            async move {
                let pem = tls_crt(&source.get(CLIENT_CERT).await.ok()?)?;
                (not_after(&pem) > now()).then_some(pem)
            }
        },
    )
    .await;
    assert_eq!(common_name(&issued), "system:kube-scheduler");
    // Issued by the recovered (valid) kube-control-plane-signer.
    let signers: Api<Secret> = Api::namespaced(admin.clone(), OP);
    let signer = tls_crt(&signers.get("kube-control-plane-signer").await.unwrap())
        .expect("the signer's tls.crt");
    assert!(
        not_after(&signer) > now(),
        "kube-control-plane-signer recovered"
    );
    assert_eq!(
        issuer_and_subject(&issued).0,
        issuer_and_subject(&signer).1,
        "issued by the recovered kube-control-plane-signer"
    );

    // The scheduler pod, its cert dir empty: the scheduler has no client certificate but the
    // one its sidecars bring.
    let ks = SchedulerPod::place(&woken).await;
    woken.milestone("scheduler pod placed, cert dir empty");
    assert!(
        std::fs::read_dir(&ks.certs).unwrap().next().is_none(),
        "{} is empty",
        ks.certs.display()
    );
    let copied = step(
        &woken,
        "the recovery controller copied it into openshift-kube-scheduler",
        || {
            let copies = copies.clone();
            async move { tls_crt(&copies.get(CLIENT_CERT).await.ok()?) }
        },
    )
    .await;
    assert_eq!(serial(&copied), serial(&issued), "the copy is the source");
    let crt = ks.client_file("tls.crt");
    let synced = step(&woken, "the sync sidecar wrote the pair", || {
        let crt = crt.clone();
        async move { std::fs::read_to_string(&crt).ok() }
    })
    .await;
    assert_eq!(synced, copied, "the synced tls.crt is the Secret's");
    let key = std::fs::metadata(ks.client_file("tls.key")).expect("tls.key synced");
    assert_eq!((key.mode() & 0o777, key.uid()), (0o600, 0));

    // The scheduler: running, leading, binding.
    step(&woken, "kube-scheduler container running", || async {
        woken.node.running_container(POD, SCHEDULER).map(|_| ())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let holder = step(&woken, "kube-scheduler holds its Lease", || {
        let leases = leases.clone();
        async move {
            leases
                .get("kube-scheduler")
                .await
                .ok()?
                .spec?
                .holder_identity
                .filter(|h| !h.is_empty())
        }
    })
    .await;
    eprintln!("Lease openshift-kube-scheduler/kube-scheduler held by {holder}");
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    // No kube-controller-manager runs here to make `default`'s account (admission wants it).
    if accounts.get_opt("default").await.unwrap().is_none() {
        accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))
                    .unwrap(),
            )
            .await
            .expect("the default service account");
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    bind(&woken, &pods, "scheduled-1").await;

    // Re-issue: the source deleted, the kube-apiserver pod's sidecar makes a new one; the copy
    // and the synced file follow; the scheduler still binds. Its pair on disk stays valid past
    // client-go's re-read, so its restarter (`--reload-period=5m`) leaves the rotation to it:
    // the same container, leading throughout (a restart would cost it its Lease).
    let before_rotation = woken.node.container_ids(POD, SCHEDULER);
    source
        .delete(CLIENT_CERT, &DeleteParams::default())
        .await
        .expect("delete the source");
    woken.milestone("openshift-config-managed/kube-scheduler-client-cert-key deleted");
    let old = serial(&issued);
    let reissued = step(&woken, "the source re-issued (new serial)", || {
        let (source, old) = (source.clone(), old.clone());
        async move {
            let pem = tls_crt(&source.get(CLIENT_CERT).await.ok()?)?;
            (serial(&pem) != old).then_some(pem)
        }
    })
    .await;
    step(&woken, "the copy follows", || {
        let (copies, new) = (copies.clone(), serial(&reissued));
        async move { (serial(&tls_crt(&copies.get(CLIENT_CERT).await.ok()?)?) == new).then_some(()) }
    })
    .await;
    let resynced = step(
        &woken,
        "the synced file changes to the new certificate",
        || {
            let (crt, new) = (crt.clone(), serial(&reissued));
            async move {
                let pem = std::fs::read_to_string(&crt).ok()?;
                (serial(&pem) == new).then_some(pem)
            }
        },
    )
    .await;
    assert_ne!(serial(&resynced), serial(&synced));
    assert_eq!(common_name(&resynced), "system:kube-scheduler");
    bind(&woken, &pods, "scheduled-2").await;

    assert_eq!(
        woken.node.container_ids(POD, SCHEDULER),
        before_rotation,
        "a rotation to a valid pair left to the scheduler's own re-read, no restart"
    );
    let restarts = woken
        .node
        .container_ids(POD, SCHEDULER)
        .len()
        .saturating_sub(1);
    eprintln!(
        "kube-scheduler containers started: {} (restarts while its pair was not yet synced: {restarts})",
        restarts + 1
    );
}
