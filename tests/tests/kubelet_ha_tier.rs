//! The three-node tier itself (`e2e::node::ha`): three nodes on this machine, each in its own
//! network and mount namespace with its own containerd, kubelet and the three static pods of
//! `manifests/` as rendered, over a three-member etcd with TLS peers, woken from the slept state
//! of `kubelet_full_recovery.rs`. Proves: every etcd member lists all three (a quorum); every
//! container of the three pods runs on every node; each node's kube-apiserver recovers (serves
//! `localhost` verified by the current `localhost-serving-ca`); each node's `localhost:6443` is
//! its own (each kubelet's CSR went through its own node's kube-apiserver, by the audit logs);
//! dropped, the tier leaves no namespace, process, mount or directory behind. Prints what the
//! nodes cost (CPU, memory) while they recover and `E2E_HA_IDLE_SECS` (20) idle seconds after.
//! `E2E_HA_HOLD=1` keeps the recovered tier up for a person (how to enter each node and a
//! kubeconfig per node are printed) until the printed file is removed. Skips (passing, with
//! `SKIP: <reason>`) where the node tier or namespaces are unavailable.

use std::collections::BTreeSet;
use std::time::Duration;

use e2e::install_crypto_provider;
use e2e::node::ha::etcd_cluster::member_names;
use e2e::node::ha::probes::{KUBELET_CLIENT_SIGNER, requested_cn};
use e2e::node::ha::tier::{Tier, node_name};
use e2e::node::ha::timeline::{Milestone, Watch, node_logs, watch};
use e2e::node::ha::usage::Sampler;
use e2e::node::kcm_plane::{KCM_POD, KCM_RECOVERY, KCM_SERVER, KCM_SYNC};
use e2e::node::scheduler::{POD as SCHEDULER_POD, RECOVERY, SCHEDULER, SYNC};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams};

const NODES: usize = 3;

/// `E2E_HA_IDLE_SECS` (default 20): how long the usage of the recovered tier is sampled.
fn idle_seconds() -> u64 {
    std::env::var("E2E_HA_IDLE_SECS")
        .ok()
        .map(|v| v.parse().expect("E2E_HA_IDLE_SECS is a number"))
        .unwrap_or(20)
}

/// With `E2E_HA_HOLD=1`, keeps the recovered tier running for a person to look at (how to
/// enter each node, a kubeconfig per node) until the printed file is removed.
async fn hold(tier: &Tier) {
    if std::env::var_os("E2E_HA_HOLD").is_none() {
        return;
    }
    let file = tier.tmp.path().join("hold");
    std::fs::write(&file, "remove this file to tear the three-node tier down\n").unwrap();
    for index in 0..tier.nodes.len() {
        eprintln!(
            "{}: {}\n    kubectl --kubeconfig {} get nodes",
            tier.nodes[index].env.name,
            tier.enter_command(index),
            tier.admin_kubeconfig(index).display()
        );
    }
    eprintln!("holding the tier: rm {} to tear it down", file.display());
    while file.exists() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_run_the_static_pods_over_one_etcd_and_leave_nothing_behind() {
    e2e::require_ha!();
    install_crypto_provider();
    let mut tier = Tier::prepare(NODES).await;
    let names: BTreeSet<String> = (0..NODES).map(node_name).collect();
    for index in 0..NODES {
        let listed: BTreeSet<String> = member_names(tier.etcd(index))
            .unwrap_or_else(|err| panic!("member {index}: {err}"))
            .into_iter()
            .collect();
        assert_eq!(listed, names, "etcd member {index} lists every member");
    }

    let all: Vec<usize> = (0..NODES).collect();
    let usage = Sampler::start(tier.network_namespaces());
    tier.wake(&all);
    let wanted = Watch {
        nodes: all.clone(),
        milestones: vec![
            Milestone::ApiserverRunning,
            Milestone::AnswersRecovery,
            Milestone::ServesValidLocalhost,
        ],
        cluster: vec![],
        within: Duration::from_secs(600),
        host_approvers: false,
    };
    let timeline = match watch(&mut tier, &wanted).await {
        Ok(timeline) => timeline,
        Err((timeline, missing)) => {
            timeline.print(&names.iter().cloned().collect::<Vec<_>>());
            let logs: String = all.iter().map(|&i| node_logs(&tier, i)).collect();
            panic!("not reached: {missing:?}\n{logs}");
        }
    };
    timeline.print(&tier.names());
    usage.print(
        "kubelets' start → every kube-apiserver recovered",
        &tier.names(),
    );

    let pods: [(&str, [&str; 3]); 3] = [
        (
            "kube-apiserver",
            [
                "kube-apiserver",
                "kube-apiserver-cert-syncer",
                "kube-apiserver-cert-regeneration-controller",
            ],
        ),
        (KCM_POD, [KCM_SERVER, KCM_SYNC, KCM_RECOVERY]),
        (SCHEDULER_POD, [SCHEDULER, SYNC, RECOVERY]),
    ];
    for node in &tier.nodes {
        for (pod, containers) in &pods {
            tokio::task::block_in_place(|| {
                node.node
                    .wait_running(pod, containers, Duration::from_secs(180));
            });
        }
    }

    let idle = idle_seconds();
    usage.reset(NODES);
    tokio::time::sleep(Duration::from_secs(idle)).await;
    usage.print("idle after the kube-apiservers' recovery", &tier.names());
    drop(usage);

    // Each node's localhost is its own: its kubelet's CSR was created through its own
    // kube-apiserver (the audit log it is in), and no other node's.
    let csrs: Api<CertificateSigningRequest> = Api::all(tier.admin(0));
    let mut owner = std::collections::BTreeMap::new();
    e2e::wait_until("every node's kubelet CSR", Duration::from_secs(120), || {
        let csrs = csrs.clone();
        async move {
            csrs.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items
                    .iter()
                    .filter(|c| c.spec.signer_name == KUBELET_CLIENT_SIGNER)
                    .filter_map(requested_cn)
                    .collect::<BTreeSet<_>>()
                    .len()
                    == NODES
            })
        }
    })
    .await;
    for csr in csrs.list(&ListParams::default()).await.unwrap().items {
        if let (Some(name), Some(cn)) = (csr.metadata.name.clone(), requested_cn(&csr)) {
            owner.insert(name, cn);
        }
    }
    for write in tier.writes() {
        if write.resource == "certificatesigningrequests"
            && write.verb == "create"
            && write.succeeded()
            && let Some(cn) = owner.get(&write.name)
        {
            assert_eq!(
                cn,
                &format!("system:node:{}", node_name(write.node)),
                "CSR {} went through {}'s kube-apiserver",
                write.name,
                node_name(write.node)
            );
        }
    }

    hold(&tier).await;

    // Torn down: nothing of the tier is left.
    let pids: Vec<u32> = (0..NODES).flat_map(|i| tier.pids(i)).collect();
    assert!(pids.len() > 3 * 10, "the nodes' processes: {pids:?}");
    let dir = tier.tmp.path().to_owned();
    let tag = format!("crha-{}", std::process::id());
    drop(tier);
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(!netns.contains(&tag), "network namespaces left: {netns}");
    let alive: Vec<&u32> = pids
        .iter()
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    assert!(alive.is_empty(), "processes left: {alive:?}");
    assert!(!dir.exists(), "{} left", dir.display());
    assert!(!std::path::Path::new(&format!("/run/{tag}")).exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&tag), "mounts left:\n{mounts}");
}
