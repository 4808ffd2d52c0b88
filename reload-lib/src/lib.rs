//! Hot reload of TLS material for rustls servers and clients: serving certificates, SNI
//! certificates and client-CA bundles are files; changes are seen through inotify and swapped in
//! with `arc-swap`. A new handshake sees new material within milliseconds, open connections keep
//! what they negotiated, and bad material (torn writes, a key that does not match, garbage PEM, an
//! expired certificate replacing a valid one) never replaces good material.
//!
//! What it does not do: it does not fetch or issue certificates (see `cert-syncer`), does not
//! do network I/O of its own, and watches only on Linux (elsewhere, and wherever inotify is
//! unavailable, it polls).
//!
//! # Quick start
//!
//! ```no_run
//! // no_run: it waits for a client on a fixed port. Runnable versions of every step follow
//! // (`Acceptor` runs a real handshake on 127.0.0.1).
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use reload_lib::{CertKeyPaths, ClientAuth, ServingSet};
//!
//! let set = ServingSet::builder(CertKeyPaths::new("tls.crt", "tls.key"))
//!     .sni("localhost-recovery", CertKeyPaths::new("recovery/tls.crt", "recovery/tls.key"))
//!     .client_ca("client-ca.crt", ClientAuth::Optional)
//!     .start()
//!     .await?;
//! let acceptor = set.acceptor();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await?;
//! let (tcp, _) = listener.accept().await?;
//! let tls = acceptor.accept(tcp).await?; // hand `tls` to hyper
//! # Ok(()) }
//! ```
//!
//! A complete hyper server is `reload-lib/examples/minimal.rs`
//! (`cargo run -p reload-lib --example minimal`).
//!
//! # Where to look
//! - Serving: [`ServingSet`] (start, rotate, wait for the swap), [`ServingSetBuilder`] (SNI,
//!   client certificates, tuning), [`Acceptor`] (a real handshake), [`ServingSnapshot`] (what
//!   is served to which name).
//! - Observing: [`Status`] (a rejected write keeps the old certificate), [`Served`],
//!   [`CertInfo`], [`metrics`], [`WatchMode`].
//! - Clients: [`ClientTls`] (reloading roots and client identity behind one `ClientConfig`).
//! - Writing: [`fs::AtomicDirWriter`] (the Kubernetes `..data` layout this crate reads) and
//!   [`fs::write_file_atomic`].
//! - Errors: [`Error`], [`InvalidMaterial`].
//!
//! # Security
//! - Fails closed at start-up: every file must read and validate, or [`ServingSetBuilder::start`]
//!   returns an error naming the file.
//! - After start-up, new material replaces served material only when every PEM block parses,
//!   the private key matches the leaf, the chain is in issuing order, configured SNI names are
//!   covered, a CA bundle is non-empty, and the new certificate is not expired while the served
//!   one is still valid. Anything else is rejected, reported in [`Status`], logs and metrics,
//!   and retried; the last good material keeps serving.
//! - Files are only read, never written or chmod-ed, by the reloaders; their paths come from
//!   your configuration. The [`fs`] writers create files with the mode you give (`0o600` for
//!   keys), never wider, and never write outside their directory.
//! - Private keys never appear in errors, logs or `Debug` output; no error quotes file content.
//! - Only regular files are read, at most [`ServingSetBuilder::max_file_size`] bytes, off the
//!   async workers and under [`ServingSetBuilder::read_timeout`]: a FIFO, a device or a huge
//!   file at a watched path is refused and cannot hang or bloat the process.
//! - A configured CRL file must yield at least one CRL issued by a CA of the bundle; a reload
//!   never undoes a revocation: every CRL series (issuer, key, issuingDistributionPoint scope)
//!   accepted since start-up is remembered (all those in force and up to 1,024 others), and no
//!   series goes back to an older CRL (lower cRLNumber, or earlier thisUpdate), not even after
//!   its CA left the bundle and came back; no series disappears while its CA is trusted; a new
//!   CRL never comes before the one that led its issuer (see
//!   [`ServingSetBuilder::client_crl`]); sessions and tickets (including a ticketer installed
//!   through `configure`) never resume across a shrink of client trust.
//! - Certificate validation of peers is rustls' WebPKI verification; it cannot be turned off
//!   through this crate.
//!
//! # Features
//! - `metrics` (default): Prometheus metrics through `prometheus-client` ([`metrics`]).
//!
//! # On-disk layouts understood
//! Plain files replaced by rename, files rewritten in place (torn intermediate states are
//! rejected and retried), and Kubernetes Secret/ConfigMap volumes (`..data` symlink swaps; a
//! certificate and its key are read from one generation). See [`fs`] for the writer side.

#![deny(missing_docs)]

mod client;
mod error;
pub mod fs;
mod layout;
mod material;
#[cfg(feature = "metrics")]
pub mod metrics;
mod policy;
mod read;
mod reload;
mod runtime;
mod server;
mod source;
mod status;
pub mod watch;

// The public interface is:
pub use client::{ClientTls, ClientTlsBuilder};
pub use error::{Error, InvalidMaterial, Result};
pub use material::CertInfo;
pub use server::{
    Acceptor, ClientAuth, ClientIdentity, ServingSet, ServingSetBuilder, ServingSnapshot,
};
pub use source::CertKeyPaths;
pub use status::{Served, ServedCert, Status};
pub use watch::WatchMode;

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub use material::fuzz as __fuzz;
