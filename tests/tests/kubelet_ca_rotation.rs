//! The seeds' own scenario (MCO 4.12 vs 4.16), on the real node: the kubelet authenticates
//! kube-apiserver's client certificate with `authentication.x509.clientCAFile` pointing at a
//! file in the node's directory (`etc/kubernetes/kubelet-ca.crt`), kept by `cert-syncer node`
//! (a host process, as the machine-config daemon is on OpenShift) from
//! `kube-apiserver-to-kubelet-client-ca`. `kube-apiserver-to-kubelet-signer` is rotated the
//! documented way (its `auth.openshift.io/certificate-not-after` annotation removed) with
//! `cert-syncer regenerate --mode rotate --once` (the pod's sidecar watches the signer and
//! usually acts on the trigger first, in its own mode, leaving `kubelet-client` on the old
//! signer: the same trigger on `kubelet-client` then re-issues it); the new `kubelet-client` is synced into the
//! cert dir by the sidecar, kube-apiserver uses it, node mode rewrites the kubelet's CA file,
//! the kubelet reloads it. `kubectl logs` of the pod on the node runs every 200 ms throughout:
//! the test prints how many calls failed and the longest gap between two successful ones, and
//! asserts none failed and nothing restarted (kubelet, containers). Skips (passing, with
//! `SKIP: <reason>`) where the node tier cannot run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::install_crypto_provider;
use e2e::node::profile_objects::{KS, OP, POD};
use e2e::node::scenario::{WakeOptions, Woken, first_der};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams};

const SIGNER: &str = "kube-apiserver-to-kubelet-signer";
const KUBELET_CA_SOURCE: &str =
    "configmap/openshift-kube-apiserver-operator/kube-apiserver-to-kubelet-client-ca/ca-bundle.crt";

fn certs_of(pem: &str) -> Vec<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect()
}

fn issued_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (_, leaf) = x509_parser::parse_x509_certificate(leaf).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(ca).unwrap();
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// One `kubectl logs` call's outcome.
#[derive(Debug, Clone)]
struct Call {
    at: Instant,
    ok: bool,
    error: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_ca_rotation_keeps_kubectl_logs_working_without_a_restart() {
    e2e::require_node!();
    install_crypto_provider();
    // kube-apiserver reaches the kubelet by the Node's InternalIP: an address the kubelet
    // accepts, on the loopback interface (held until the test ends).
    let node_address = match e2e::node::loopback_node_ip() {
        Ok(address) => address,
        Err(reason) => {
            println!("SKIP: {reason}");
            return;
        }
    };
    let mut woken = Woken::start(WakeOptions {
        kubelet_client_ca_sources: vec![KUBELET_CA_SOURCE.to_owned()],
        node_ip: Some(node_address.ip),
        ..WakeOptions::default()
    })
    .await;
    woken.apiserver_running().await;
    woken.recovery_answers().await;
    woken.cert_dir_healed().await;
    woken.verified().await;
    woken.node_ready().await;
    let mirror = format!("{POD}-{}", woken.node.name);
    let logs_args = [
        "logs",
        "-n",
        KS,
        mirror.as_str(),
        "-c",
        "kube-apiserver-cert-syncer",
        "--tail=1",
    ];
    woken
        .wait(
            "kubectl logs works (kubelet-client valid, the kubelet trusts its signer)",
            || async { woken.kubectl(&logs_args).status.success() },
        )
        .await;

    let admin = woken.plane.admin();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), KS);
    let restarts = || async {
        pods.get(&mirror)
            .await
            .unwrap()
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.name, s.restart_count, s.container_id))
            .collect::<Vec<_>>()
    };
    // The baseline once the mirror pod reports every container (its status can lag the
    // containers: an empty list here once made the comparison below fail with nothing restarted).
    let containers = woken
        .plane
        .pod
        .spec
        .as_ref()
        .map_or(0, |s| s.containers.len());
    let deadline = Instant::now() + Duration::from_secs(60);
    let restarts_before = loop {
        let now = restarts().await;
        if now.len() == containers && now.iter().all(|(_, _, id)| id.is_some()) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the mirror pod reports its {containers} containers within 60 s: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let kubelet_ca = woken.kubelet_client_ca.clone().unwrap();
    let kubelet_client = woken.plane.cert_file("secrets/kubelet-client/tls.crt");
    let old_client = first_der(&std::fs::read_to_string(&kubelet_client).unwrap());
    let signers: Api<Secret> = Api::namespaced(admin.clone(), OP);
    let old_signer = signers.get(SIGNER).await.unwrap();
    let old_ca =
        first_der(&String::from_utf8(old_signer.data.unwrap()["tls.crt"].0.clone()).unwrap());

    // `kubectl logs` every 200 ms from here on.
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kubeconfig = woken.plane.admin_kubeconfig(
        &woken.tmp.path().join("logs.kubeconfig"),
        &woken.localhost_ca,
    );
    let logger = {
        let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
        let args: Vec<String> = logs_args.iter().map(|s| (*s).to_owned()).collect();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at = Instant::now();
                let out = std::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(&args)
                    .arg("--request-timeout=5s")
                    .output()
                    .expect("kubectl runs");
                calls.lock().unwrap().push(Call {
                    at,
                    ok: out.status.success(),
                    error: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                });
                std::thread::sleep(Duration::from_millis(200).saturating_sub(at.elapsed()));
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The documented trigger, then one rotate pass as an operator would run it.
    let rotation = Instant::now();
    signers
        .patch(
            SIGNER,
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(serde_json::json!([{
                    "op": "remove",
                    "path": "/metadata/annotations/auth.openshift.io~1certificate-not-after"
                }]))
                .unwrap(),
            ),
        )
        .await
        .expect("the annotation removed");
    let out = tokio::task::block_in_place(|| {
        woken
            .plane
            .regenerate_command(&["--mode", "rotate", "--once"])
            .output()
            .unwrap()
    });
    assert!(
        out.status.success(),
        "regenerate --mode rotate --once: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_signer = signers.get(SIGNER).await.unwrap();
    let new_ca =
        first_der(&String::from_utf8(new_signer.data.unwrap()["tls.crt"].0.clone()).unwrap());
    assert_ne!(new_ca, old_ca, "the signer rotated");
    // The pod's regeneration sidecar watches the signer and acts on the trigger too, usually
    // before the operator's run: it then regenerates the signer in its own mode, which (like
    // library-go's normal rotation) leaves `kubelet-client` on the previous signer until its
    // refresh, and the rotate run finds no trigger left. The same documented trigger on the
    // target then re-issues it from the new signer.
    let targets: Api<Secret> = Api::namespaced(admin.clone(), KS);
    let client_pem =
        |secret: Secret| String::from_utf8(secret.data.unwrap()["tls.crt"].0.clone()).unwrap();
    if issued_by(
        &first_der(&client_pem(targets.get("kubelet-client").await.unwrap())),
        &new_ca,
    ) {
        eprintln!("rotation: the rotate run re-issued kubelet-client from the new signer");
    } else {
        eprintln!(
            "rotation: the pod's sidecar rotated the signer first; kubelet-client re-issued by \
             removing its own certificate-not-after annotation"
        );
        targets
            .patch(
                "kubelet-client",
                &PatchParams::default(),
                &Patch::Json::<()>(
                    serde_json::from_value(serde_json::json!([{
                        "op": "remove",
                        "path": "/metadata/annotations/auth.openshift.io~1certificate-not-after"
                    }]))
                    .unwrap(),
                ),
            )
            .await
            .expect("the kubelet-client annotation removed");
    }

    let synced = woken
        .wait(
            "the sync sidecar wrote a kubelet-client from the new signer",
            || async {
                std::fs::read_to_string(&kubelet_client)
                    .is_ok_and(|pem| issued_by(&first_der(&pem), &new_ca))
            },
        )
        .await;
    let rewritten = woken
        .wait(
            "node mode rewrote the kubelet's CA file with the new signer",
            || async {
                std::fs::read_to_string(&kubelet_ca)
                    .is_ok_and(|pem| certs_of(&pem).contains(&new_ca))
            },
        )
        .await;
    let ca_file = certs_of(&std::fs::read_to_string(&kubelet_ca).unwrap());
    assert!(
        ca_file.contains(&old_ca),
        "the old signer stays trusted until what it issued is gone"
    );
    assert_ne!(
        first_der(&std::fs::read_to_string(&kubelet_client).unwrap()),
        old_client
    );
    eprintln!(
        "rotation: kubelet-client synced {} ms, kubelet CA file rewritten {} ms after the trigger",
        synced.saturating_sub(rotation - woken.started).as_millis(),
        rewritten
            .saturating_sub(rotation - woken.started)
            .as_millis()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    logger.join().unwrap();

    let calls = calls.lock().unwrap().clone();
    let failed: Vec<&Call> = calls.iter().filter(|c| !c.ok).collect();
    let oks: Vec<Instant> = calls.iter().filter(|c| c.ok).map(|c| c.at).collect();
    let longest_gap = oks
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!(
        "kubectl logs every 200 ms through the rotation: {} calls, {} failed, longest gap between \
         successes {} ms",
        calls.len(),
        failed.len(),
        longest_gap.as_millis()
    );
    let errors: Vec<&str> = failed.iter().map(|c| c.error.as_str()).collect();
    assert!(failed.is_empty(), "failed kubectl logs calls: {errors:#?}");
    assert!(calls.len() >= 20, "the calls ran: {}", calls.len());

    // Nothing restarted.
    assert_eq!(restarts().await, restarts_before, "no container restarted");
    assert!(
        woken.node.kubelet().is_some_and(|k| k.is_running()),
        "the kubelet still runs"
    );
}
