//! The leader dies mid-pass (`e2e::node::ha`, three nodes woken from the slept state of
//! `kubelet_full_recovery.rs`): the node whose kube-apiserver regeneration controller holds
//! the Lease (`cert-regeneration-controller-lock`) loses power as soon as its first write of a
//! profile object is in its kube-apiserver's audit log: every process of the node (kubelet,
//! containerd, the containers, its etcd member) SIGKILLed at once. Proves: the kill landed in
//! the middle of the pass (the dead leader wrote some of the objects, not all); another node's
//! controller takes the Lease over within the lease duration plus one retry period of the
//! manifest's flags (measured from the kill, printed); the two others recover everything
//! (every milestone on both: their kube-apiservers, CSRs, kubelets, nodes Ready, pods bound);
//! nothing half done (every certificate chains to the bundle its consumers verify it with, no
//! CA without its bundle, no trust widened, every `..data` generation on both disks complete);
//! no certificate regenerated twice across the two leaders, no write refused with 409.
//!
//! Skips (passing, with `SKIP: <reason>`) where the node tier or namespaces are unavailable.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cert_syncer::cli::Command;
use e2e::install_crypto_provider;
use e2e::manifests::{self, REGENERATE_CONTAINER};
use e2e::node::ha::checks::{assert_nothing_half_done, everything, reach, within};
use e2e::node::ha::tier::Tier;
use e2e::node::ha::writes::{WriteReport, profile_objects};
use e2e::node::profile_objects::KS;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

const NODES: usize = 3;

/// The kube-apiserver pod's regeneration controller, as kube-apiserver authenticates it.
const REGENERATOR: &str =
    "system:serviceaccount:openshift-kube-apiserver:cert-regeneration-controller";

/// The Lease name and timing of the regeneration sidecar, from the rendered pod's flags.
fn lease_of_the_pod() -> (String, Duration, Duration) {
    let pod = e2e::node::pod::render_pod();
    let container = manifests::container(&pod, REGENERATE_CONTAINER);
    let argv = manifests::argv(&pod, container);
    let cli = manifests::parse_cert_syncer(&argv, &manifests::environment(&pod, container))
        .expect("the regeneration sidecar's flags");
    let Command::Regenerate(args) = cli.command else {
        panic!("{REGENERATE_CONTAINER} runs regenerate");
    };
    assert!(
        args.leader_elect,
        "the pod's regeneration controller elects a leader"
    );
    (
        args.leader_elect_lease_name.clone(),
        args.leader_elect_lease_duration,
        args.leader_elect_retry_period,
    )
}

/// The holder of the Lease, read through `client`.
async fn holder(client: &kube::Client, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), KS);
    match tokio::time::timeout(Duration::from_secs(5), leases.get_opt(name)).await {
        Ok(Ok(Some(lease))) => lease.spec?.holder_identity.filter(|h| !h.is_empty()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_dies_mid_pass_and_another_node_finishes_it() {
    e2e::require_ha!();
    install_crypto_provider();
    let (lease, duration, retry) = lease_of_the_pod();
    let mut tier = Tier::prepare(NODES).await;
    let all: Vec<usize> = (0..NODES).collect();
    tier.wake(&all);
    let woke = Instant::now();
    let objects = profile_objects();

    // The leader: the node through which the regeneration controller's first write goes.
    let leader = loop {
        let first = tier
            .writes()
            .into_iter()
            .find(|w| w.user == REGENERATOR && w.succeeded() && objects.contains(&w.object()));
        if let Some(write) = first {
            break write.node;
        }
        assert!(
            woke.elapsed() < within(),
            "no regeneration within {:?}",
            within()
        );
        for index in 0..NODES {
            tier.keep_kubelet(index);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tier.power_off(leader);
    let killed = Instant::now();
    let names = tier.names();
    eprintln!(
        "+{} ms: {} (the leader) lost power after its first write",
        woke.elapsed().as_millis(),
        names[leader]
    );
    let by_leader: BTreeSet<String> = tier
        .writes()
        .into_iter()
        .filter(|w| w.node == leader && w.user == REGENERATOR && w.succeeded())
        .map(|w| w.object())
        .filter(|o| objects.contains(o))
        .collect();

    // Another node's controller takes the Lease over.
    let survivors: Vec<usize> = all.iter().copied().filter(|&i| i != leader).collect();
    // The holder is the candidate's pod name (`kube-apiserver-NODE`, the downward API). Watched
    // beside the survivors' milestones (from the kill on).
    let dead = format!("-{}", names[leader]);
    let takeover = {
        let (client, lease, limit) = (
            tier.admin(survivors[0]),
            lease.clone(),
            duration + retry + Duration::from_secs(120),
        );
        tokio::spawn(async move {
            while killed.elapsed() < limit {
                if let Some(h) = holder(&client, &lease).await
                    && !h.ends_with(&dead)
                {
                    eprintln!(
                        "+{} ms after the kill: {h} holds {lease} (lease duration {duration:?}, retry period {retry:?})",
                        killed.elapsed().as_millis()
                    );
                    return Some(killed.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            None
        })
    };
    reach(&mut tier, &everything(&survivors)).await;
    let takeover = takeover
        .await
        .expect("the Lease watch")
        .unwrap_or_else(|| panic!("nobody took {lease} over"));
    assert!(
        takeover <= duration + retry + Duration::from_secs(30),
        "the Lease was taken over {takeover:?} after the kill: more than the lease duration {duration:?} plus a retry period {retry:?}"
    );

    let report = WriteReport::of(&tier.writes());
    report.print(&names);
    let written: BTreeSet<&String> = report.per_object.keys().collect();
    eprintln!(
        "before it died, the leader wrote {} of the {} objects the recovery wrote",
        by_leader.len(),
        written.len()
    );
    assert!(
        !by_leader.is_empty() && by_leader.len() < written.len(),
        "the kill did not land in the middle of the pass: the leader wrote {} of {} objects",
        by_leader.len(),
        written.len()
    );
    let duplicates = report.duplicates();
    let conflicts = report.conflicts.len();
    assert!(
        duplicates.is_empty() && conflicts == 0,
        "duplicate regenerations across the two leaders: {duplicates:#?}; writes refused with 409: {conflicts}"
    );
    assert_nothing_half_done(&tier, survivors[0], &survivors).await;
}
