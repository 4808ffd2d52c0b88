//! The node tier's fixed ports (the pod's manifest names them, so the `kubelet_*` tests run one
//! at a time).

/// The kubelet's API port (fixed: the kube-apiserver in the pod reaches it through the Node's
/// `InternalIP`, see `KubeletOptions::node_ip`).
pub const KUBELET_PORT: u16 = 10250;
/// The kubelet's healthz port.
pub const KUBELET_HEALTHZ_PORT: u16 = 10248;
/// etcd's client port (the pod's `--etcd-servers`).
pub const ETCD_PORT: u16 = 2379;
/// etcd's peer port.
pub const ETCD_PEER_PORT: u16 = 2380;
/// kube-apiserver's port in the pod.
pub const APISERVER_PORT: u16 = 6443;
