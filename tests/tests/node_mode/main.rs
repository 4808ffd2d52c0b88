//! `cert-syncer node`: host CA bundles kept from the API, at scale, and its DaemonSet with RBAC
//! as shipped.

mod daemonset;
mod host_bundles;
mod scale;
