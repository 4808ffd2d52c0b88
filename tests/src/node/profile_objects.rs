//! The namespaces and objects of the slept control plane: the `openshift-kube-apiserver`
//! profile's signers, bundles and targets, the pod's name and address, the tests' admin.

/// The kube-apiserver's namespace.
pub const KS: &str = "openshift-kube-apiserver";
/// The operator's namespace (the signers).
pub const OP: &str = "openshift-kube-apiserver-operator";
/// `openshift-config-managed`.
pub const CM: &str = "openshift-config-managed";
/// The static pod's name (the mirror pod is `kube-apiserver-NODE`).
pub const POD: &str = "kube-apiserver";
/// Where the pod's kube-apiserver listens.
pub const URL: &str = "https://127.0.0.1:6443";
/// The admin service account the tests use (cluster-admin), in [`KS`].
pub const ADMIN_ACCOUNT: &str = "e2e-admin";

/// The profile's signers (all in [`OP`]).
pub const SIGNERS: [&str; 8] = [
    "aggregator-client-signer",
    "kube-apiserver-to-kubelet-signer",
    "kube-control-plane-signer",
    "node-system-admin-signer",
    "localhost-serving-signer",
    "service-network-serving-signer",
    "loadbalancer-serving-signer",
    "localhost-recovery-serving-signer",
];
/// The profile's CA bundles.
pub const BUNDLES: [(&str, &str); 10] = [
    (CM, "kube-apiserver-aggregator-client-ca"),
    (OP, "kube-apiserver-to-kubelet-client-ca"),
    (OP, "kube-control-plane-signer-ca"),
    (OP, "node-system-admin-ca"),
    (OP, "localhost-serving-ca"),
    (OP, "service-network-serving-ca"),
    (OP, "loadbalancer-serving-ca"),
    (OP, "localhost-recovery-serving-ca"),
    (KS, "client-ca"),
    (KS, "aggregator-client-ca"),
];
/// The profile's targets.
pub const TARGETS: [(&str, &str); 12] = [
    (KS, "aggregator-client"),
    (KS, "kubelet-client"),
    (KS, "check-endpoints-client-cert-key"),
    (KS, "control-plane-node-admin-client-cert-key"),
    (CM, "kube-controller-manager-client-cert-key"),
    (CM, "kube-scheduler-client-cert-key"),
    (OP, "node-system-admin-client"),
    (KS, "localhost-serving-cert-certkey"),
    (KS, "service-network-serving-certkey"),
    (KS, "external-loadbalancer-serving-certkey"),
    (KS, "internal-loadbalancer-serving-certkey"),
    (KS, "localhost-recovery-serving-certkey"),
];

/// Every certificate Secret of the profile (signers and targets), (namespace, name).
pub fn profile_secrets() -> Vec<(&'static str, &'static str)> {
    SIGNERS
        .iter()
        .map(|name| (OP, *name))
        .chain(TARGETS.iter().copied())
        .collect()
}
