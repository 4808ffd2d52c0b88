//! `manifests/` checked as data and run: the objects, the static pod's flags against upstream,
//! the access lists against the RBAC shipped, and the alert rules (as data, and in a real
//! Prometheus).

mod access;
mod alerts;
mod as_data;
mod monitoring;
mod static_pod_flags;
