//! A small Kubernetes-API-compatible server (core/v1 Secrets, ConfigMaps, Events; coordination.k8s.io/v1 Leases).
