//! The localhost recovery end to end: `recovery-demo`, the real kube-apiserver healed from the
//! files `sync` wrote, and what a recovery may need besides: the kubelet CSR approver (and its
//! reading of CSRs against Go's), and `restart-on-change` for servers that read their client
//! certificate only at start.

mod csr_reading_vs_go;
mod demo;
mod kubelet_csr_approver;
mod real_apiserver;
mod restart_on_change;
