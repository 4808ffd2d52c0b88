//! `mini-apiserver`, the Kubernetes-API-compatible server the other tests use, driven by real
//! clients (kube-rs, `kubectl`, the Python client), compared with the real kube-apiserver, and
//! under load and hostile clients.

mod diff;
mod hardening;
mod kube_client;
mod kubectl;
mod limits;
mod load;
mod python;
mod seed;
