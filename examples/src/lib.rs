//! Servers and tools built on `reload-lib`: the shared HTTPS accept loop, the
//! Kubernetes-API-compatible `mini-apiserver`, the engines of the `tls-load` and `sync-load`
//! load tools, and helpers used by the binaries in `src/bin/`.

pub mod child;
pub mod demo;
pub mod load;
pub mod mini_apiserver;
pub mod recovery;
pub mod serve;
pub mod sync_load;
