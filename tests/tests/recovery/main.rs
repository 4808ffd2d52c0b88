//! The localhost recovery end to end: `recovery-demo`, the real kube-apiserver healed from the
//! files `sync` wrote, and the kubelet CSR approver a recovery may need (and its reading of CSRs
//! against Go's).

mod csr_reading_vs_go;
mod demo;
mod kubelet_csr_approver;
mod real_apiserver;
