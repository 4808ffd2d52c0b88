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

use std::time::Duration;

use e2e::install_crypto_provider;
use e2e::node::ha::checks::{assert_one_etcd_cluster, assert_own_localhost, assert_torn_down};
use e2e::node::ha::tier::Tier;
use e2e::node::ha::timeline::{Milestone, Watch, node_logs, watch};
use e2e::node::ha::usage::Sampler;
use e2e::node::kcm_plane::{KCM_POD, KCM_RECOVERY, KCM_SERVER, KCM_SYNC};
use e2e::node::scheduler::{POD as SCHEDULER_POD, RECOVERY, SCHEDULER, SYNC};

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
    assert_one_etcd_cluster(&mut tier);

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
            timeline.print(&tier.names());
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

    assert_own_localhost(&tier).await;
    hold(&tier).await;

    assert_torn_down(tier);
}
