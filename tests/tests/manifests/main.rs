//! `manifests/` checked as data and run: the objects, the static pod's flags against upstream,
//! and the access lists against the RBAC shipped.

mod access;
mod as_data;
mod static_pod_flags;
