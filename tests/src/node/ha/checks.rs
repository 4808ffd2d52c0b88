//! The scenarios' common steps and verdicts: watch the wake (failing with every node's logs),
//! and the end state checked as a whole ([`super::invariants`], [`super::writes`]), each
//! failing with every violation named.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};

use super::invariants::{
    ApiState, check_api, check_cert_dir, namespace_data, rotations, signed_by,
};
use super::probes::{KUBELET_CLIENT_SIGNER, requested_cn};
use super::tier::Tier;
use super::timeline::{Milestone, Timeline, Watch, node_logs, watch};
use crate::node::kcm_plane::KCM_NS;
use crate::node::profile_objects::KS;

/// `E2E_HA_WITHIN_SECS` (default 900): how long a wake may take from the first kubelet start
/// to its last milestone (kube-controller-manager 1.20 re-reads its client certificate every 5
/// minutes; three control planes on a loaded 2-core machine).
pub fn within() -> Duration {
    Duration::from_secs(
        std::env::var("E2E_HA_WITHIN_SECS")
            .ok()
            .map(|v| {
                v.parse()
                    .expect("E2E_HA_WITHIN_SECS is a number of seconds")
            })
            .unwrap_or(900),
    )
}

/// Every milestone on `nodes`, and the cluster-wide ones.
pub fn everything(nodes: &[usize]) -> Watch {
    Watch {
        nodes: nodes.to_vec(),
        milestones: Milestone::PER_NODE.to_vec(),
        cluster: Milestone::CLUSTER.to_vec(),
        within: within(),
    }
}

/// [`watch`], failing with the timeline so far and every watched node's logs.
///
/// # Panics
/// When a milestone is not reached in time.
pub async fn reach(tier: &mut Tier, wanted: &Watch) -> Timeline {
    match watch(tier, wanted).await {
        Ok(timeline) => {
            timeline.print(&tier.names());
            timeline
        }
        Err((timeline, missing)) => {
            timeline.print(&tier.names());
            let logs: String = wanted.nodes.iter().map(|&i| node_logs(tier, i)).collect();
            panic!(
                "not reached within {:?}: {missing:#?}\n{logs}",
                wanted.within
            );
        }
    }
}

/// CSR name → the `system:node:NAME` it requests, for every kubelet client CSR.
///
/// # Panics
/// When the CSRs cannot be listed.
pub async fn csr_owners(client: &kube::Client) -> BTreeMap<String, String> {
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    csrs.list(&ListParams::default())
        .await
        .expect("the CSRs")
        .items
        .into_iter()
        .filter(|c| c.spec.signer_name == KUBELET_CLIENT_SIGNER)
        .filter_map(|c| Some((c.metadata.name.clone()?, requested_cn(&c)?)))
        .collect()
}

/// Nothing half done (see [`half_done`]).
///
/// # Panics
/// With every violation.
pub async fn assert_nothing_half_done(tier: &Tier, via: usize, nodes: &[usize]) {
    let wrong = half_done(tier, via, nodes).await;
    assert!(
        wrong.is_empty(),
        "half-done state:\n  {}",
        wrong.join("\n  ")
    );
}

/// What is half done (see [`super::invariants`]; empty: nothing): in the API (read through
/// `via`'s kube-apiserver), and on the disks of `nodes` once their syncs caught up (looked at
/// for up to 90 s); each node's kubelet client certificate issued by the recovered
/// `csr-signer` and trusted by kube-apiserver's `client-ca`.
pub async fn half_done(tier: &Tier, via: usize, nodes: &[usize]) -> Vec<String> {
    let client = tier.admin(via);
    let rotations = rotations();
    let state = match ApiState::read(&client, &rotations).await {
        Ok(state) => state,
        Err(err) => return vec![format!("reading the profiles' objects: {err}")],
    };
    let mut wrong: Vec<String> = rotations
        .iter()
        .flat_map(|(profile, rotation)| check_api(profile, rotation, &state))
        .collect();

    let secrets = |ns: &str| Api::<Secret>::namespaced(client.clone(), ns);
    let tls_crt = |s: Secret| {
        String::from_utf8(
            s.data
                .unwrap_or_default()
                .remove("tls.crt")
                .map(|b| b.0)
                .unwrap_or_default(),
        )
        .unwrap_or_default()
    };
    let signer = match secrets(KCM_NS).get("csr-signer").await {
        Ok(secret) => tls_crt(secret),
        Err(err) => return vec![format!("csr-signer: {err}")],
    };
    let client_ca = state
        .config_maps
        .get(&(KS.to_owned(), "client-ca".to_owned()))
        .and_then(|d| d.get("ca-bundle.crt").cloned())
        .unwrap_or_default();
    for &index in nodes {
        let name = &tier.nodes[index].env.name;
        match tier.kubelet_cert_der(index) {
            Some(der) => {
                let current = super::invariants::certificates(&signer);
                if !current.first().is_some_and(|ca| signed_by(&der, ca)) {
                    wrong.push(format!(
                        "{name}: its kubelet certificate is not issued by the recovered csr-signer"
                    ));
                }
                let cas = super::invariants::certificates(&client_ca);
                if !cas.iter().any(|ca| signed_by(&der, ca)) {
                    wrong.push(format!(
                        "{name}: kube-apiserver's client-ca does not trust its kubelet certificate"
                    ));
                }
            }
            None => wrong.push(format!("{name}: no kubelet client certificate on its disk")),
        }
    }

    let dirs = [
        (tier.plane.certs.clone(), KS),
        (tier.kcm.certs.clone(), KCM_NS),
        (
            tier.kcm.scheduler.certs.clone(),
            crate::node::scheduler::NAMESPACE,
        ),
    ];
    let mut on_disk = Vec::new();
    for _ in 0..45 {
        on_disk.clear();
        for &index in nodes {
            for (dir, namespace) in &dirs {
                let data = match namespace_data(&client, namespace).await {
                    Ok(data) => data,
                    Err(err) => {
                        on_disk.push(format!("{namespace}: {err}"));
                        continue;
                    }
                };
                for problem in check_cert_dir(&tier.host_path(index, dir), &data) {
                    on_disk.push(format!("{}: {problem}", tier.nodes[index].env.name));
                }
            }
        }
        if on_disk.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    wrong.extend(on_disk);
    wrong
}

/// Every etcd member lists every node's member (one cluster, a quorum).
///
/// # Panics
/// When a member cannot answer or lists others.
pub fn assert_one_etcd_cluster(tier: &mut Tier) {
    let names: std::collections::BTreeSet<String> = tier.names().into_iter().collect();
    for index in 0..tier.nodes.len() {
        let listed: std::collections::BTreeSet<String> =
            super::etcd_cluster::member_names(tier.etcd(index))
                .unwrap_or_else(|err| panic!("etcd member {index}: {err}"))
                .into_iter()
                .collect();
        assert_eq!(listed, names, "etcd member {index} lists every member");
    }
}

/// Each node's `localhost` is its own: each kubelet CSR was created through the kube-apiserver
/// of the node it is for (the audit log it is in), and every node's kubelet made one.
///
/// # Panics
/// When a CSR went through another node, or a node made none within 120 s.
pub async fn assert_own_localhost(tier: &Tier) {
    let client = tier.admin(0);
    let count = tier.nodes.len();
    crate::wait_until("every node's kubelet CSR", Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            csr_owners(&client)
                .await
                .values()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == count
        }
    })
    .await;
    let owners = csr_owners(&client).await;
    let names = tier.names();
    for write in tier.writes() {
        if write.resource == "certificatesigningrequests"
            && write.verb == "create"
            && write.succeeded()
            && let Some(cn) = owners.get(&write.name)
        {
            assert_eq!(
                cn,
                &format!("system:node:{}", names[write.node]),
                "CSR {} went through {}'s kube-apiserver",
                write.name,
                names[write.node]
            );
        }
    }
}

/// What is wrong with the approvals of the nodes' approvers (empty: nothing): each node's
/// kubelet CSR approved by our approver (`approve-kubelet-csr`, the node's
/// `kube-controller-manager-csr-approver` container), whose message names this node and the
/// SHA-256 of the expired certificate on this node's own disk (the container read the node's
/// `/var/lib/kubelet/pki` through the kubelet's link), through this node's kube-apiserver, as
/// `manifests/rbac/csr-approver.yaml`'s account (its own RBAC).
pub async fn own_approvals(tier: &Tier) -> Vec<String> {
    use sha2::Digest;
    let client = tier.admin(0);
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let listed = match csrs.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(err) => return vec![format!("listing the CSRs: {err}")],
    };
    let writes = tier.writes();
    let account = format!(
        "system:serviceaccount:{KS}:{}",
        crate::node::kcm_plane::APPROVER_ACCOUNT
    );
    let mut wrong = Vec::new();
    for (index, node) in tier.nodes.iter().enumerate() {
        let name = &node.env.name;
        let slept = std::fs::read_to_string(node.root.join(super::node_files::SLEPT_IDENTITY))
            .expect("the node's slept kubelet certificate");
        let fingerprint: String = sha2::Sha256::digest(crate::node::scenario::first_der(&slept))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let cn = format!("system:node:{name}");
        let approved: Vec<&CertificateSigningRequest> = listed
            .iter()
            .filter(|c| c.spec.signer_name == KUBELET_CLIENT_SIGNER)
            .filter(|c| requested_cn(c).as_deref() == Some(cn.as_str()))
            .filter(|c| super::probes::approved_with(c, super::probes::APPROVED_BY_OURS))
            .collect();
        let [csr] = approved.as_slice() else {
            wrong.push(format!(
                "{name}: {} CSRs approved by our approver, not 1",
                approved.len()
            ));
            continue;
        };
        let csr_name = csr.metadata.name.clone().unwrap_or_default();
        let message = csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Approved")
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        for expected in [
            format!("on node {name}:"),
            format!("(sha256:{fingerprint}) is expired"),
        ] {
            if !message.contains(&expected) {
                wrong.push(format!(
                    "{name}: CSR {csr_name}'s approval does not say {expected:?}: {message}"
                ));
            }
        }
        let through: Vec<(usize, &str)> = writes
            .iter()
            .filter(|w| w.subresource == "approval" && w.name == csr_name && w.succeeded())
            .map(|w| (w.node, w.user.as_str()))
            .collect();
        if through != [(index, account.as_str())] {
            wrong.push(format!(
                "{name}: CSR {csr_name} approved through (node, user) {through:?}, not once through its own node by {account}"
            ));
        }
    }
    wrong
}

/// Drops the tier and checks that nothing of it is left: no network namespace of this
/// process, none of the nodes' processes, no mount, no directory.
///
/// # Panics
/// Naming what is left.
pub fn assert_torn_down(tier: Tier) {
    let pids: Vec<u32> = (0..tier.nodes.len()).flat_map(|i| tier.pids(i)).collect();
    assert!(
        !pids.is_empty(),
        "the nodes run processes before the teardown"
    );
    let dir = tier.tmp.path().to_owned();
    let tag = format!("{}{}", super::namespaces::PREFIX, std::process::id());
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
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(!mounts.contains(&tag), "mounts left:\n{mounts}");
}
