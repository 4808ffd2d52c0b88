//! The three-node tier: N control-plane nodes on this machine as production runs three, each in
//! its own network namespace (its own loopback: each node's `localhost:6443` is its own
//! kube-apiserver, as the sidecars' kubeconfigs expect) and mount namespace (its own
//! `/etc/kubernetes`, `/var/lib/kubelet`, `/var/log`), with its own containerd, kubelet, the
//! three static pods of `manifests/` as rendered, and one member of a three-member etcd over TLS.
//! The nodes' addresses exist only in their namespaces and on the test's bridge
//! (198.51.100.0/24).
//!
//! The single-node harness does the work, parametrized by a [`NodeEnv`](super::env::NodeEnv)
//! (which namespaces to enter, where the node is reached): [`Node`](super::Node),
//! [`Containerd`](super::Containerd), [`Etcd`](super::etcd::Etcd), the slept
//! [`ControlPlane`](super::cluster::ControlPlane) and [`KcmPlane`](super::kcm_plane::KcmPlane).
//!
//! - [`namespaces`]: the bridge and each node's namespaces, torn down on drop; leftovers of a
//!   killed run removed at start (by the `crha-` prefix only);
//! - [`etcd_cluster`]: the three members;
//! - [`tier`]: [`Tier`](tier::Tier), the nodes as the sleep left them, woken by the test (and
//!   put back to that state between the fault rounds: `Tier::save_pristine`, `Tier::reset`);
//! - [`faults`]: what the fault rounds inject into a recovering node;
//! - [`checks`]: the scenarios' common steps and verdicts;
//! - [`invariants`]: nothing half done, in the API and on each node's disk;
//! - [`audit`] and [`writes`]: each node's kube-apiserver audit log, who wrote what through
//!   which node; duplicate regenerations, fights, wrong approvals;
//! - [`probes`] and [`timeline`]: what the test looks at while the tier wakes, and when each
//!   milestone first held, per node;
//! - [`usage`]: what the nodes cost (CPU, memory), per node.

pub mod audit;
pub mod checks;
pub mod etcd_cluster;
pub mod faults;
pub mod invariants;
pub mod namespaces;
mod node_files;
pub mod probes;
mod reset;
pub mod tier;
pub mod timeline;
pub mod usage;
pub mod writes;

/// Why the three-node tier cannot run here (`None`: it can): what the node tier needs
/// ([`super::skip_reason`]), plus `ip`, `nsenter`, `unshare` and the right to make network
/// namespaces.
pub fn skip_reason() -> Option<String> {
    if let Some(reason) = super::skip_reason() {
        return Some(reason);
    }
    for program in ["ip", "nsenter", "unshare", "mount", "cp"] {
        if super::on_path(program).is_none() {
            return Some(format!(
                "no {program} on PATH (the three-node tier makes namespaces: apt-get install -y iproute2 util-linux)"
            ));
        }
    }
    let probe = std::process::Command::new("unshare")
        .args(["--net", "--mount", "true"])
        .output();
    match probe {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "cannot make network and mount namespaces here (`unshare --net --mount true`: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(err) => Some(format!("cannot run unshare: {err}")),
    }
}

/// Returns from the calling test (which passes) after printing `SKIP: <reason>` when the
/// three-node tier cannot run here (see [`skip_reason`]).
#[macro_export]
macro_rules! require_ha {
    () => {
        if let Some(reason) = $crate::node::ha::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}
