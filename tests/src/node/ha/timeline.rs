//! The wake's milestones, per node and cluster-wide, each recorded when first seen to hold:
//! [`watch`] looks at every pending milestone at once (rounds about 200 ms apart) until all held or
//! the time is up, keeping the woken kubelets running (systemd's `Restart=always`). Each node's
//! approver is the kube-controller-manager pod's container, as rendered.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::probes::APPROVED_BY_OURS;
use super::tier::Tier;
use crate::node::kcm_plane::{KCM_NS, KCM_POD, KCM_SERVER};
use crate::node::profile_objects::POD;
use crate::node::scenario::{not_after, now};

/// One milestone of the wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Milestone {
    /// The node's kube-apiserver container runs.
    ApiserverRunning,
    /// It answers `localhost-recovery`.
    AnswersRecovery,
    /// It serves `localhost` with a certificate the current `localhost-serving-ca` verifies.
    ServesValidLocalhost,
    /// The node's kubelet CSR approved by our approver (the node's
    /// `kube-controller-manager-csr-approver` container).
    CsrApproved,
    /// The node's CSR signed (a certificate issued).
    CsrSigned,
    /// The kubelet's new client certificate on the node's disk.
    KubeletCertOnDisk,
    /// The node `Ready`.
    NodeReady,
    /// A pod bound to the node by the scheduler.
    PodBound,
    /// Cluster-wide: `csr-signer` regenerated and published.
    CsrSignerRegenerated,
    /// Cluster-wide: a kube-controller-manager renewed its leader Lease since the wake (it
    /// authenticates with its new client certificate).
    ControllerManagerLease,
    /// Cluster-wide: a kube-scheduler renewed its leader Lease since the wake.
    SchedulerLease,
}

impl Milestone {
    /// Every per-node milestone, in the order they normally come.
    pub const PER_NODE: [Milestone; 8] = [
        Milestone::ApiserverRunning,
        Milestone::AnswersRecovery,
        Milestone::ServesValidLocalhost,
        Milestone::CsrApproved,
        Milestone::CsrSigned,
        Milestone::KubeletCertOnDisk,
        Milestone::NodeReady,
        Milestone::PodBound,
    ];

    /// Every cluster-wide milestone.
    pub const CLUSTER: [Milestone; 3] = [
        Milestone::CsrSignerRegenerated,
        Milestone::ControllerManagerLease,
        Milestone::SchedulerLease,
    ];

    /// What it is, in words.
    pub fn name(self) -> &'static str {
        match self {
            Milestone::ApiserverRunning => "kube-apiserver container running",
            Milestone::AnswersRecovery => "kube-apiserver answers localhost-recovery",
            Milestone::ServesValidLocalhost => {
                "kube-apiserver serves localhost verified by the current localhost-serving-ca"
            }
            Milestone::CsrApproved => "the node's kubelet CSR approved by its approver",
            Milestone::CsrSigned => "the node's CSR signed",
            Milestone::KubeletCertOnDisk => "the kubelet's new client certificate on its disk",
            Milestone::NodeReady => "node Ready",
            Milestone::PodBound => "a pod bound to the node by the scheduler",
            Milestone::CsrSignerRegenerated => "csr-signer regenerated and published",
            Milestone::ControllerManagerLease => {
                "kube-controller-manager renewed its leader Lease (new client certificate)"
            }
            Milestone::SchedulerLease => {
                "kube-scheduler renewed its leader Lease (new client certificate)"
            }
        }
    }

    /// Whether it holds now, on node `index` (cluster-wide ones: through its kube-apiserver);
    /// `client` is an admin client of that node's kube-apiserver; `since` the wake's wall
    /// clock (Unix seconds).
    pub async fn holds(self, tier: &Tier, index: usize, client: &kube::Client, since: i64) -> bool {
        match self {
            Milestone::ApiserverRunning => tier.nodes[index]
                .node
                .running_container(POD, "kube-apiserver")
                .is_some(),
            Milestone::AnswersRecovery => tier.answers_recovery(index).await,
            Milestone::ServesValidLocalhost => tier.serves_valid_localhost(index, client).await,
            Milestone::CsrApproved => tier
                .node_csrs(index, client)
                .await
                .iter()
                .any(|c| super::probes::approved_with(c, APPROVED_BY_OURS)),
            Milestone::CsrSigned => tier.node_csrs(index, client).await.iter().any(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.certificate.as_ref())
                    .is_some_and(|b| !b.0.is_empty())
            }),
            Milestone::KubeletCertOnDisk => tier.kubelet_cert_valid(index),
            Milestone::NodeReady => tier.node_ready(index, client).await,
            Milestone::PodBound => tier.pod_bound(index, client).await,
            Milestone::CsrSignerRegenerated => {
                let secrets: Api<Secret> = Api::namespaced(client.clone(), KCM_NS);
                matches!(
                    tokio::time::timeout(Duration::from_secs(5), secrets.get_opt("csr-signer")).await,
                    Ok(Ok(Some(s))) if s.data.as_ref().and_then(|d| d.get("tls.crt")).is_some_and(|b| {
                        std::str::from_utf8(&b.0).is_ok_and(|pem| not_after(pem) > now())
                    })
                )
            }
            Milestone::ControllerManagerLease => {
                lease_renewed(client, "kube-system", "kube-controller-manager", since).await
            }
            Milestone::SchedulerLease => {
                lease_renewed(
                    client,
                    crate::node::scheduler::NAMESPACE,
                    "kube-scheduler",
                    since,
                )
                .await
            }
        }
    }
}

/// The Lease `namespace/name` is held and was renewed at or after `since` (Unix seconds).
async fn lease_renewed(client: &kube::Client, namespace: &str, name: &str, since: i64) -> bool {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Ok(Ok(Some(lease))) =
        tokio::time::timeout(Duration::from_secs(5), leases.get_opt(name)).await
    else {
        return false;
    };
    let spec = lease.spec.unwrap_or_default();
    spec.holder_identity.is_some_and(|h| !h.is_empty())
        && spec.renew_time.is_some_and(|t| t.0.as_second() >= since)
}

/// When each milestone first held: per node, from that node's kubelet start; cluster-wide,
/// from the first kubelet start of the wake.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// (milestone, node) → time; cluster-wide milestones have node `None`.
    pub times: BTreeMap<(Milestone, Option<usize>), Duration>,
}

impl Timeline {
    /// The time of `milestone` on `node`.
    pub fn at(&self, milestone: Milestone, node: Option<usize>) -> Option<Duration> {
        self.times.get(&(milestone, node)).copied()
    }

    /// Prints the table: one row per milestone, one column per node.
    pub fn print(&self, nodes: &[String]) {
        let header: Vec<String> = nodes.iter().map(|n| format!("{n:>10}")).collect();
        eprintln!(
            "{:<78} {}",
            "milestone (ms after the kubelet's start)",
            header.join(" ")
        );
        for milestone in Milestone::PER_NODE {
            let cells: Vec<String> = (0..nodes.len())
                .map(|i| match self.at(milestone, Some(i)) {
                    Some(t) => format!("{:>10}", t.as_millis()),
                    None => format!("{:>10}", "-"),
                })
                .collect();
            eprintln!("{:<78} {}", milestone.name(), cells.join(" "));
        }
        for milestone in Milestone::CLUSTER {
            if let Some(t) = self.at(milestone, None) {
                eprintln!(
                    "{:<78} {:>10} (cluster-wide)",
                    milestone.name(),
                    t.as_millis()
                );
            }
        }
    }
}

/// What to watch: `milestones` on each of `nodes`, and the cluster-wide `cluster` (looked at
/// through the first of `nodes` whose kube-apiserver answers).
#[derive(Debug, Clone)]
pub struct Watch {
    /// The nodes.
    pub nodes: Vec<usize>,
    /// Their milestones.
    pub milestones: Vec<Milestone>,
    /// The cluster-wide ones.
    pub cluster: Vec<Milestone>,
    /// How long all may take from the first kubelet start.
    pub within: Duration,
}

/// Watches until every milestone of `watch` held (returns the timeline) or the time is up
/// (returns the timeline so far and what is missing).
///
/// # Errors
/// The milestones that did not hold, with the timeline so far.
pub async fn watch(tier: &mut Tier, watch: &Watch) -> Result<Timeline, (Timeline, Vec<String>)> {
    watch_with(tier, watch, |_, _| {}).await
}

/// [`watch`], calling `on_tick` with the tier and the time since the first kubelet start at
/// every round of looks (a fault injected at a chosen moment).
///
/// # Errors
/// The milestones that did not hold, with the timeline so far.
pub async fn watch_with(
    tier: &mut Tier,
    watch: &Watch,
    mut on_tick: impl FnMut(&mut Tier, Duration),
) -> Result<Timeline, (Timeline, Vec<String>)> {
    let first = watch
        .nodes
        .iter()
        .filter_map(|&i| tier.nodes[i].started)
        .min()
        .expect("the watched nodes were woken");
    let since = now() - i64::try_from(first.elapsed().as_secs()).unwrap_or(0) - 1;
    let clients: BTreeMap<usize, kube::Client> =
        watch.nodes.iter().map(|&i| (i, tier.admin(i))).collect();
    let mut timeline = Timeline::default();
    let mut pending: Vec<(Milestone, Option<usize>)> = watch
        .nodes
        .iter()
        .flat_map(|&i| watch.milestones.iter().map(move |&m| (m, Some(i))))
        .chain(watch.cluster.iter().map(|&m| (m, None)))
        .collect();
    while !pending.is_empty() && first.elapsed() < watch.within {
        on_tick(tier, first.elapsed());
        for &index in &watch.nodes {
            tier.keep_kubelet(index);
        }
        // Every pending look at once (a look may wait seconds for a kube-apiserver that is
        // starting): each milestone's time is when its own look answered.
        let tier_ref: &Tier = tier;
        let looks = pending.iter().map(|&(milestone, node)| {
            let (index, from) = match node {
                Some(i) => (i, tier_ref.nodes[i].started.expect("woken")),
                None => (watch.nodes[0], first),
            };
            let client = &clients[&index];
            async move {
                let held = milestone.holds(tier_ref, index, client, since).await;
                (milestone, node, held.then(|| from.elapsed()))
            }
        });
        let mut still = Vec::new();
        for (milestone, node, held) in futures::future::join_all(looks).await {
            match held {
                Some(at) => {
                    timeline.times.insert((milestone, node), at);
                    let who = node.map_or("cluster".to_owned(), |i| tier.nodes[i].env.name.clone());
                    // `examples::milestones`' format, the series the node: `timeline-plot`
                    // draws a run's output as it is.
                    eprintln!(
                        "milestone {who} +{:>6} ms: {}",
                        at.as_millis(),
                        milestone.name()
                    );
                }
                None => still.push((milestone, node)),
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if pending.is_empty() {
        Ok(timeline)
    } else {
        let missing = pending
            .iter()
            .map(|(m, n)| match n {
                Some(i) => format!("{}: {}", tier.nodes[*i].env.name, m.name()),
                None => format!("cluster: {}", m.name()),
            })
            .collect();
        Err((timeline, missing))
    }
}

/// The logs of node `index`'s kubelet and pods' containers (for failure messages).
pub fn node_logs(tier: &Tier, index: usize) -> String {
    let node = &tier.nodes[index].node;
    let containers = [
        (POD, "kube-apiserver"),
        (POD, "kube-apiserver-cert-syncer"),
        (POD, "kube-apiserver-cert-regeneration-controller"),
        (KCM_POD, KCM_SERVER),
        (KCM_POD, crate::node::kcm_plane::KCM_SYNC),
        (KCM_POD, crate::node::kcm_plane::KCM_RECOVERY),
        (KCM_POD, crate::node::kcm_plane::KCM_RESTARTER),
        (KCM_POD, crate::node::kcm_plane::KCM_APPROVER),
        (
            crate::node::scheduler::POD,
            crate::node::scheduler::SCHEDULER,
        ),
        (
            crate::node::scheduler::POD,
            crate::node::scheduler::RESTARTER,
        ),
    ];
    let mut text = format!(
        "=== {} kubelet:\n{}\n",
        tier.nodes[index].env.name,
        node.kubelet_log_tail()
    );
    for (pod, container) in containers {
        text.push_str(&format!(
            "--- {pod}/{container}:\n{}\n",
            node.container_log(pod, container)
        ));
    }
    text
}

/// How long from `start` something took, for messages.
pub fn since(start: Instant) -> String {
    format!("+{} ms", start.elapsed().as_millis())
}
