//! Three control-plane nodes wake from the slept state of `kubelet_full_recovery.rs`
//! (`e2e::node::ha`: three nodes in their own namespaces on this machine, a three-member etcd
//! over TLS, the three static pods of `manifests/` on each, each node's approver the
//! kube-controller-manager pod's container).
//!
//! - `all_three_wake`: all three wake together (every etcd member lists all three). Every profile object regenerated exactly once
//!   cluster-wide (each node's kube-apiserver audit log: no certificate written twice, no bundle
//!   written twice with the same CAs), 0 fights (no object written through two nodes, no 409 on
//!   one), every node's approver approved only its own kubelet's CSR, once, through its own
//!   kube-apiserver, naming the expired certificate on its own node's disk; every milestone on
//!   every node (its kube-apiserver serves `localhost` verified by the current bundle, its CSR
//!   approved and signed, the new certificate on its disk, node Ready, a pod bound to it by the
//!   scheduler); each node's `localhost:6443` its own (its kubelet's CSR went through its own
//!   kube-apiserver); nothing half done in the API or on any node's disk; the tier torn down
//!   leaves no namespace, process, mount or directory. Prints the timeline per
//!   node and what the nodes cost (CPU, memory; `E2E_HA_IDLE_SECS` idle seconds after).
//!   `E2E_HA_RUNS=N` repeats it and prints p50 per node.
//! - `the_third_wakes_late`: two nodes wake (two etcd members: a quorum) and recover; the third
//!   (its etcd member too) wakes `E2E_HA_STAGGER_SECS` (30) later and recovers from what the
//!   others wrote: no write of a profile object after it woke, none through its kube-apiserver.
//!
//! Skip (passing, with `SKIP: <reason>`) where the node tier or namespaces are unavailable.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::install_crypto_provider;
use e2e::node::ha::checks::{
    assert_nothing_half_done, assert_one_etcd_cluster, assert_own_localhost, assert_torn_down,
    csr_owners, everything, own_approvals, reach,
};
use e2e::node::ha::tier::Tier;
use e2e::node::ha::timeline::{Milestone, Timeline};
use e2e::node::ha::usage::Sampler;
use e2e::node::ha::writes::{WriteReport, wrong_approvals};
use e2e::tls::p50_p99;

const NODES: usize = 3;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
        .unwrap_or(default)
}

/// The writes of the wake judged: no duplicate regeneration, no fight, every approval right.
async fn assert_writes(tier: &Tier, via: usize) -> WriteReport {
    let names = tier.names();
    let writes = tier.writes();
    let report = WriteReport::of(&writes);
    report.print(&names);
    let duplicates = report.duplicates();
    let fights = report.fights(&names);
    let owners = csr_owners(&tier.admin(via)).await;
    let approvals = wrong_approvals(&writes, &owners, &names);
    eprintln!(
        "duplicate regenerations: {}, fights: {}, wrong approvals: {}",
        duplicates.len(),
        fights.len(),
        approvals.len()
    );
    assert!(
        duplicates.is_empty() && fights.is_empty() && approvals.is_empty(),
        "duplicates: {duplicates:#?}\nfights: {fights:#?}\nwrong approvals: {approvals:#?}"
    );
    assert!(report.total() > 0, "the wake regenerated something");
    let approvers = own_approvals(tier).await;
    assert!(approvers.is_empty(), "the approvers: {approvers:#?}");
    eprintln!(
        "each node's approver (its kube-controller-manager pod's container) approved its own kubelet's CSR only, once, from its own disk"
    );
    report
}

async fn wake_all_once() -> Timeline {
    let mut tier = Tier::prepare(NODES).await;
    assert_one_etcd_cluster(&mut tier);
    let all: Vec<usize> = (0..NODES).collect();
    let usage = Sampler::start(tier.network_namespaces());
    tier.wake(&all);
    let timeline = reach(&mut tier, &everything(&all)).await;
    usage.print(
        "kubelets' start → every node Ready and a pod bound on each",
        &tier.names(),
    );
    usage.reset(NODES);
    tokio::time::sleep(Duration::from_secs(env_number("E2E_HA_IDLE_SECS", 20))).await;
    usage.print("idle, recovered", &tier.names());
    drop(usage);

    assert_own_localhost(&tier).await;
    assert_writes(&tier, 0).await;
    assert_nothing_half_done(&tier, 0, &all).await;
    let restarts: Vec<u32> = tier
        .nodes
        .iter()
        .map(|n| n.node.kubelet_restarts())
        .collect();
    eprintln!("kubelet restarts per node: {restarts:?}");
    assert_torn_down(tier);
    timeline
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_three_wake() {
    e2e::require_ha!();
    install_crypto_provider();
    let runs = env_number("E2E_HA_RUNS", 1);
    let began = Instant::now();
    let mut all = Vec::new();
    for run in 0..runs {
        eprintln!("=== run {} of {runs}", run + 1);
        all.push(wake_all_once().await);
    }
    eprintln!(
        "three nodes wake, {runs} run(s) in {} s: p50 (p99) per node, ms from its kubelet's start",
        began.elapsed().as_secs()
    );
    let names: Vec<String> = (0..NODES).map(e2e::node::ha::tier::node_name).collect();
    for milestone in Milestone::PER_NODE {
        let cells: Vec<String> = (0..NODES)
            .map(|node| {
                let samples: Vec<Duration> = all
                    .iter()
                    .filter_map(|t| t.at(milestone, Some(node)))
                    .collect();
                let (p50, p99) = p50_p99(&samples);
                format!("{} {} ({})", names[node], p50.as_millis(), p99.as_millis())
            })
            .collect();
        eprintln!("  {:<78} {}", milestone.name(), cells.join(", "));
    }
    for milestone in Milestone::CLUSTER {
        let samples: Vec<Duration> = all.iter().filter_map(|t| t.at(milestone, None)).collect();
        let (p50, p99) = p50_p99(&samples);
        eprintln!(
            "  {:<78} cluster {} ({})",
            milestone.name(),
            p50.as_millis(),
            p99.as_millis()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_third_wakes_late() {
    e2e::require_ha!();
    install_crypto_provider();
    let mut tier = Tier::prepare(NODES).await;
    let (early, late) = ([0, 1], 2);
    // The third node is off: its etcd member too (the other two are a quorum).
    tier.etcd(late).kill();
    tier.wake(&early);
    reach(&mut tier, &everything(&early)).await;
    let before = WriteReport::of(&tier.writes());
    let stagger = env_number("E2E_HA_STAGGER_SECS", 30);
    eprintln!(
        "two nodes recovered ({} writes of the profiles' objects); the third wakes in {stagger} s",
        before.total()
    );
    tokio::time::sleep(Duration::from_secs(stagger)).await;

    tokio::task::block_in_place(|| {
        let etcd = tier.etcd(late);
        etcd.restart();
        etcd.wait_healthy(Duration::from_secs(90));
    });
    tier.wake(&[late]);
    let mut wanted = everything(&[late]);
    wanted.cluster.clear();
    reach(&mut tier, &wanted).await;

    let after = assert_writes(&tier, late).await;
    let names = tier.names();
    let through_late: Vec<String> = after
        .per_object
        .iter()
        .flat_map(|(object, writes)| {
            writes
                .iter()
                .filter(|w| w.node == late)
                .map(move |w| format!("{object} by {}", w.user))
        })
        .collect();
    let added: BTreeMap<&String, (usize, usize)> = after
        .per_object
        .iter()
        .map(|(object, writes)| {
            let earlier = before.per_object.get(object).map_or(0, Vec::len);
            (object, (earlier, writes.len()))
        })
        .filter(|(_, (earlier, now))| earlier != now)
        .collect();
    assert!(
        through_late.is_empty() && added.is_empty(),
        "{} recovered from what the others wrote, regenerating nothing: written through it {through_late:#?}, \
         written since it woke (before, after) {added:#?}",
        names[late]
    );
    assert_nothing_half_done(&tier, late, &[0, 1, late]).await;
}
