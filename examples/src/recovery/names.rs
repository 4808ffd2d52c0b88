//! The namespaces of the OpenShift-shaped objects the demo plays with. A leaf of `recovery`.

/// Where the apiserver's own objects live.
pub const NAMESPACE: &str = "openshift-kube-apiserver";
/// Where the signers live (as in OpenShift, the operator's namespace).
pub const OPERATOR_NAMESPACE: &str = "openshift-kube-apiserver-operator";
