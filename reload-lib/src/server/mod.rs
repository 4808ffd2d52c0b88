//! Serving: a default certificate, SNI certificates and an optional client-CA bundle, reloaded
//! from files and published together as one immutable snapshot.
//!
//! Reading order: `builder` (what a set is configured with) → `set` (the handle and the
//! published snapshot) → `material` (the reload engine: which sources a pass reads, how each is
//! parsed and checked) → `publish` (how a snapshot is built from what a pass accepted) →
//! `resolver` (SNI selection at the handshake) → `acceptor` / `identity` (the handshake and the
//! client's verdict). `sessions` binds resumption to the client-trust epoch.

mod acceptor;
mod auth;
mod builder;
mod config;
mod identity;
mod material;
mod publish;
mod resolver;
mod sessions;
mod set;
mod snapshot;

pub use acceptor::Acceptor;
pub use auth::ClientAuth;
pub use builder::ServingSetBuilder;
pub use identity::ClientIdentity;
pub use set::ServingSet;
pub use snapshot::ServingSnapshot;

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<ServingSet>();
    check::<Acceptor>();
}
