//! Servers and tools built on `reload-lib`: the shared HTTPS accept loop, the engines of the
//! `tls-load` and `sync-load` load tools, the recovery demo, milestone timelines and their plot
//! ([`milestones`]), and helpers used by the binaries in `src/bin/`. The
//! Kubernetes-API-compatible `mini-apiserver` is its own package (`examples/mini-apiserver/`),
//! built on [`serve`].

pub mod coalesce;
pub mod demo;
pub mod load;
pub mod milestones;
pub mod provider;
pub mod recovery;
pub mod serve;
pub mod sync_load;
