//! `cert-syncer`: the sidecars of a control-plane static pod, as a library behind a thin binary.
//!
//! `sync` mirrors named Secrets and ConfigMaps from the apiserver (over localhost, through the
//! `localhost-recovery` SNI name) into a resource directory with atomic directory swaps.
//!
//! `regenerate` is the regeneration controller: it regenerates signers, CA bundles and
//! certificates declared in a config file or a built-in profile, by default only when they are
//! expired or missing.
//!
//! `node` keeps one host file (the kubelet's client-CA bundle, say) assembled from keys of
//! ConfigMaps and Secrets, on every node.
//!
//! `approve-kubelet-csr` (opt-in, one per node) approves this node's kubelet client CSRs
//! while the kubelet's client certificate on disk is expired or absent, and nothing else.
//!
//! `inspect` lists the certificates of directories or of a namespace, with what is wrong
//! with them.
//!
//! `restart-on-change` (opt-in, a sidecar in a pod sharing its PID namespace) restarts a
//! container of its pod whose server reads its client certificate only at start, when that
//! certificate changes on disk to a valid pair.
//!
//! The modules are folders in layers, lowest first: `base` (small types), `pki` (parse, verify,
//! issue), `kube` (the Kubernetes plumbing), the jobs (`sync`, `regenerate`, `node`, `approve`,
//! `inspect`, `restart`: one per subcommand, none using another) and `app` (the flags, the access each
//! subcommand needs, the shared sidecar start-up). A module never uses a layer above its own
//! (`scripts/check-module-cycles`).
//!
//! The public surface is small on purpose: [`cli`] (the flags, as data), [`run`] (one
//! subcommand to completion), [`regenerate::config`] (the rotation config parser, public so
//! that it can be fuzzed and checked by tests), [`access`] (the API access each subcommand
//! needs for given flags: what RBAC must grant), [`kubelet_csr`] (how the CSR approver reads a
//! request, public so that it can be fuzzed and checked against Go's reading), [`error`] and
//! [`kind`]. Everything else is
//! internal.

mod app;
mod base;
mod kube;
mod pki;

mod approve;
mod inspect;
mod node;
pub mod regenerate;
mod restart;
mod sync;

pub use app::{access, cli};
pub use approve::request as kubelet_csr;
pub use base::{error, kind};

/// Runs one subcommand until it finishes or is shut down (SIGTERM/SIGINT).
///
/// Errors that come from bad flags or configuration are [`error::ConfigError`]s (exit code 2 in
/// the binary); anything else is a runtime failure.
pub async fn run(command: cli::Command) -> anyhow::Result<()> {
    app::run(command).await
}
