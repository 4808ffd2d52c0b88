//! `cert-syncer sync`: Secrets and ConfigMaps mirrored to disk, on `mini-apiserver` and the real
//! kube-apiserver, under faults, above the namespace-wide watch threshold, and read by the real
//! kube-apiserver as its own certificate files.

mod faults;
mod mirror;
mod namespace_wide;
mod real_consumer;
