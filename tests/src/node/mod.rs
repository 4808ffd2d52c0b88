//! The node tier: the static pod run the way it is deployed, by a real kubelet (v1.20.2, from
//! `../shared/node/setup`) through a private containerd (Debian's `containerd`, `runc`, `ctr`;
//! images built by `podman`), beside an etcd host process with TLS (see
//! `/work/shared/node/README.md`, mirrored in tests/README.md "The node tier").
//!
//! - [`skip_reason`] / [`require_node!`](crate::require_node): what is missing for this tier
//!   (printed as `SKIP: <reason>` by the tests, which then pass);
//! - [`Node`]: a containerd with its own root, state and socket, and a kubelet with a
//!   `staticPodPath` in the test's directory; dropped, it stops the kubelet, kills and deletes
//!   every container, stops containerd, unmounts what they mounted (deepest first) and removes
//!   the pods' `/var/log/pods` directories, also when the test failed;
//! - [`images`]: the images of `scripts/build-images` (the README's command), built once and
//!   imported into each node's containerd;
//! - [`etcd`]: etcd with TLS serving and client certificates (OpenShift's `etcd-client`);
//! - [`machine`]: a private machine (mount, network and PID namespaces) for commands written
//!   for a whole machine, such as the README's walkthrough;
//! - [`kcm_plane`] and [`ks_plane`]: the kube-controller-manager and kube-scheduler pods as a
//!   sleep left them, and the kubelet's expired identity with a bootstrap kubeconfig, added to
//!   the slept [`cluster::ControlPlane`] for the whole recovery (`kubelet_full_recovery.rs`).
//!
//! The pods use fixed host ports (6443, 2379, the sidecars' metrics ports, kubelet 10250), so the
//! `kubelet_*` tests run one at a time (nextest test group `node`, `.config/nextest.toml`).

pub mod cgroup;
pub mod cleanup;
pub mod cluster;
pub mod containerd;
pub mod env;
pub mod etcd;
pub mod ha;
pub mod images;
pub mod inputs;
pub mod kcm_plane;
pub mod ks_plane;
pub mod kubeconfig;
pub mod kubelet;
pub mod machine;
pub mod plane_clients;
pub mod pod;
pub mod ports;
pub mod profile_objects;
pub mod scenario;
pub mod scheduler;
pub mod seed;
pub mod tokens;

pub use containerd::Containerd;
pub use inputs::{
    HOST_PROGRAMS, LoopbackAddress, assets, loopback_node_ip, on_path, openshift_dir, skip_reason,
};
pub use kubelet::{Kubelet, KubeletOptions, Node};
pub use ports::{APISERVER_PORT, ETCD_PEER_PORT, ETCD_PORT, KUBELET_HEALTHZ_PORT, KUBELET_PORT};

/// Returns from the calling test (which passes) after printing `SKIP: <reason>` when the node
/// tier cannot run here (see [`skip_reason`]).
#[macro_export]
macro_rules! require_node {
    () => {
        if let Some(reason) = $crate::node::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}
