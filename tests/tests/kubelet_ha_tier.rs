//! The three-node tier itself (`e2e::node::ha`): three nodes on this machine, each in its own
//! network and mount namespace with its own containerd, kubelet and the three static pods of
//! `manifests/` as rendered, over a three-member etcd with TLS peers, woken from the slept state
//! of `kubelet_full_recovery.rs`. Proves: every etcd member lists all three (a quorum); every
//! container of the three pods runs on every node; each node's kube-apiserver recovers (serves
//! `localhost` verified by the current `localhost-serving-ca`); each node's `localhost:6443` is
//! its own (each kubelet's CSR went through its own node's kube-apiserver, by the audit logs);
//! each node's approver, the kube-controller-manager pod's `kube-controller-manager-csr-approver`
//! container as rendered, approves its own kubelet's CSR, having read the expired certificate on
//! its own node's disk (`/var/lib/kubelet/pki` in the node's mount namespace), through its own
//! kube-apiserver as its own account (`manifests/rbac/csr-approver.yaml`); dropped, the tier
//! leaves no namespace, process, mount or directory behind; what a killed run left (named for a
//! process that no longer runs) is removed when the next starts, what a live run has is not. Prints what the
//! nodes cost (CPU, memory) while they recover and `E2E_HA_IDLE_SECS` (20) idle seconds after.
//! `E2E_HA_HOLD=1` keeps the recovered tier up for a person (how to enter each node and a
//! kubeconfig per node are printed) until the printed file is removed. Skips (passing, with
//! `SKIP: <reason>`) where the node tier or namespaces are unavailable.

use std::time::Duration;

use e2e::install_crypto_provider;
use e2e::node::ha::checks::{
    assert_one_etcd_cluster, assert_own_localhost, assert_torn_down, own_approvals,
};
use e2e::node::ha::namespaces::{Network, PREFIX, remove_leftovers};
use e2e::node::ha::tier::Tier;
use e2e::node::ha::timeline::{Milestone, Watch, node_logs, watch};
use e2e::node::ha::usage::Sampler;
use e2e::node::kcm_plane::{
    KCM_APPROVER, KCM_POD, KCM_RECOVERY, KCM_RESTARTER, KCM_SERVER, KCM_SYNC,
};
use e2e::node::scheduler::{POD as SCHEDULER_POD, RECOVERY, RESTARTER, SCHEDULER, SYNC};

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
            Milestone::CsrApproved,
        ],
        cluster: vec![],
        within: Duration::from_secs(600),
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

    let pods: [(&str, &[&str]); 3] = [
        (
            "kube-apiserver",
            &[
                "kube-apiserver",
                "kube-apiserver-cert-syncer",
                "kube-apiserver-cert-regeneration-controller",
            ],
        ),
        (
            KCM_POD,
            &[
                KCM_SERVER,
                KCM_SYNC,
                KCM_RECOVERY,
                KCM_RESTARTER,
                KCM_APPROVER,
            ],
        ),
        (SCHEDULER_POD, &[SCHEDULER, SYNC, RECOVERY, RESTARTER]),
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
    let wrong = own_approvals(&tier).await;
    assert!(wrong.is_empty(), "the approvers: {wrong:#?}");
    hold(&tier).await;

    assert_torn_down(tier);
}

/// What a run killed before its teardown leaves (its bridge with the tier's address, its nodes'
/// network namespaces, its mount namespaces' files on their private `/run` mount, a tmpfs in its
/// temporary directory), named for a process that no longer runs, is removed by the next run's
/// sweep; a live run's (this process's) is left alone.
#[test]
fn a_killed_runs_leftovers_are_removed_when_the_next_starts() {
    e2e::require_ha!();
    let dead = {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("true runs");
        child.wait().expect("true exits");
        child.id()
    };
    let tag = format!("{PREFIX}{dead}");
    // The killed run: its teardown never runs.
    std::mem::forget(Network::create_for(dead, 2).expect("the dead run's namespaces"));
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{tag}-"))
        .tempdir()
        .expect("the dead run's directory")
        .keep();
    let mounted = tmp.join("certs");
    std::fs::create_dir_all(&mounted).unwrap();
    let tmpfs = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mounted)
        .status()
        .expect("mount runs");
    assert!(tmpfs.success(), "a tmpfs in the dead run's directory");
    let live = Network::create(1).expect("this run's namespaces");
    let live_tag = format!("{PREFIX}{}", std::process::id());

    let removed = remove_leftovers();
    eprintln!("removed: {removed:#?}");

    // `crha-PID` followed by anything but a digit (`crha-12` is not `crha-123`'s).
    let named = |text: &str, tag: &str| {
        text.lines()
            .filter(|line| {
                line.match_indices(tag).any(|(at, _)| {
                    !line[at + tag.len()..]
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_digit())
                })
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let output = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .expect("runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let netns = output("ip", &["netns", "list"]);
    let links = output("ip", &["-o", "link", "show"]);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for (what, text) in [
        ("network namespaces", &netns),
        ("links", &links),
        ("mounts", &mounts),
    ] {
        let left = named(text, &tag);
        assert!(left.is_empty(), "{what} of the killed run left: {left:#?}");
        assert!(
            !named(text, &live_tag).is_empty(),
            "the live run's {what} were removed:\n{text}"
        );
    }
    assert!(!std::path::Path::new(&format!("/run/{tag}")).exists());
    assert!(!tmp.exists(), "{} left", tmp.display());
    drop(live);
}
