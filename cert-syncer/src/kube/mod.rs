//! The Kubernetes plumbing: how the jobs talk to the apiserver, on the base layer and nothing
//! else of this crate.
//!
//! - [`connection`]: the client (reloading CA, re-read token, timeouts, never the platform
//!   trust store);
//! - [`watch`]: list+watch settings and the namespace-wide watch of named objects;
//! - [`leader`]: leader election on a Lease;
//! - [`events`]: rate-limited Events;
//! - [`decode`]: objects that may not decode, never logged;
//! - [`fetched`]: a Secret or ConfigMap reduced to its keys and bytes;
//! - [`sidecar`]: what the app shell's start-up hands a long-running job;
//! - `fake_api` (tests only): an in-memory apiserver for tests on tokio's paused clock.

pub(crate) mod connection;
pub(crate) mod decode;
pub(crate) mod events;
#[cfg(test)]
pub(crate) mod fake_api;
pub(crate) mod fetched;
pub(crate) mod leader;
pub(crate) mod sidecar;
pub(crate) mod watch;
