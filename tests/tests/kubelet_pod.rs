//! What the kubelet adds to the recovery (`kubelet_recovery.rs`'s slept control plane): a
//! sidecar killed mid-recovery (SIGKILL to its container's task, while the synced `localhost`
//! pair is still expired) is restarted by the kubelet (`restartCount` ≥ 1 in the mirror pod)
//! and the recovery completes; the sidecars' probes as the kubelet sees them (every container
//! of the mirror pod Ready in the API); and the files the sync container wrote on the hostPath:
//! Secrets' keys 0600, ConfigMaps' 0644, owned by root. Skips (passing, with `SKIP: <reason>`)
//! where the node tier cannot run.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use e2e::install_crypto_provider;
use e2e::node::profile_objects::{KS, POD};
use e2e::node::scenario::{WakeOptions, Woken, not_after, now};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const SYNC: &str = "kube-apiserver-cert-syncer";

/// Every file under `dir` (symlinks followed, `..`-prefixed generation dirs skipped: their
/// files are reached through the links), with its content.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for kind in ["secrets", "configmaps"] {
        let Ok(objects) = std::fs::read_dir(dir.join(kind)) else {
            continue;
        };
        for object in objects.filter_map(Result::ok) {
            for entry in std::fs::read_dir(object.path())
                .unwrap()
                .filter_map(Result::ok)
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("..") {
                    continue;
                }
                if let Ok(bytes) = std::fs::read(entry.path()) {
                    out.insert(entry.path(), bytes);
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restarts_a_sidecar_killed_mid_recovery_and_reports_its_probes() {
    e2e::require_node!();
    install_crypto_provider();
    let mut woken = Woken::start(WakeOptions::default()).await;
    let before = files(woken.certs());
    let serving = woken
        .plane
        .cert_file("secrets/localhost-serving-cert-certkey/tls.crt");

    woken.apiserver_running().await;
    woken.recovery_answers().await;

    // Mid-recovery: the sync sidecar dies while the synced pair is still expired.
    let killed = woken
        .node
        .running_container(POD, SYNC)
        .unwrap_or_else(|| woken.fail("the sync sidecar does not run"));
    let pem = std::fs::read_to_string(&serving).unwrap();
    assert!(
        not_after(&pem) < now(),
        "killed mid-recovery: the synced localhost pair is still expired"
    );
    let out = woken
        .node
        .containerd
        .ctr(&["tasks", "kill", "-s", "SIGKILL", &killed]);
    assert!(out.status.success(), "{out:?}");
    woken.milestone("sync sidecar killed (SIGKILL)");

    // The kubelet restarts it and the recovery completes.
    woken
        .wait("the kubelet runs a new sync container", || async {
            woken
                .node
                .running_container(POD, SYNC)
                .is_some_and(|id| id != killed)
        })
        .await;
    woken.cert_dir_healed().await;
    woken.verified().await;
    woken.node_ready().await;

    // The probes as the kubelet reports them: every container Ready, the sync one restarted.
    let pods: Api<Pod> = Api::namespaced(woken.plane.admin(), KS);
    let mirror = format!("{POD}-{}", woken.node.name);
    let statuses = || async {
        pods.get(&mirror)
            .await
            .ok()
            .and_then(|p| p.status)
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
    };
    woken
        .wait("every container of the mirror pod Ready", || async {
            let statuses = statuses().await;
            statuses.len() == 3 && statuses.iter().all(|s| s.ready)
        })
        .await;
    let restarts: BTreeMap<String, i32> = statuses()
        .await
        .into_iter()
        .map(|s| (s.name, s.restart_count))
        .collect();
    eprintln!("restart counts: {restarts:?}");
    assert!(
        restarts[SYNC] >= 1,
        "the kubelet restarted {SYNC}: {restarts:?}"
    );

    // The files the container wrote on the hostPath: keys 0600, bundles 0644, root's.
    let after = files(woken.certs());
    let rewritten: Vec<&PathBuf> = after
        .iter()
        .filter(|(path, bytes)| before.get(*path) != Some(*bytes))
        .map(|(path, _)| path)
        .collect();
    assert!(
        rewritten.iter().any(|p| p.ends_with("tls.key"))
            && rewritten.iter().any(|p| p.ends_with("ca-bundle.crt")),
        "the container rewrote keys and bundles: {rewritten:?}"
    );
    for path in rewritten {
        let meta = std::fs::metadata(path).unwrap();
        let expected = if path.starts_with(woken.certs().join("secrets")) {
            0o600
        } else {
            0o644
        };
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid(), meta.gid()),
            (expected, 0, 0),
            "{}",
            path.display()
        );
    }
}
