//! Servers and tools built on `reload-lib`: the shared HTTPS accept loop, the
//! Kubernetes-API-compatible `mini-apiserver`, and helpers used by the binaries in `src/bin/`.

pub mod demo;
pub mod load;
pub mod mini_apiserver;
pub mod recovery;
pub mod serve;
