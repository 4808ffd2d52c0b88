//! The test kit of the workspace, in one place so that every test, bench and demo builds its
//! certificates, writes its files and runs its processes the same way:
//!
//! - [`csr`]: PKCS#10 certificate requests (the kubelet CSR approver's tests).
//! - [`pki`]: throwaway CAs, intermediates, server and client leaves with chosen names, validity
//!   (expired, not yet valid), serials and key types (ECDSA P-256, RSA 2048), CRLs; PEM out,
//!   and [`pki::TempPki`] to write them to files (keys 0600); odd but legal CAs (a
//!   subjectUniqueID, over 64 KiB), built from rcgen's DER in `der`.
//! - [`files`]: the ways a rotation reaches the disk: rename over, in-place write, and the
//!   kubelet's `..data` symlink swap.
//! - [`http`]: raw HTTP/1.1 responses of hand-written requests.
//! - [`tls`]: rustls client configs trusting test CAs, with or without a client identity.
//! - [`process`]: child processes with captured logs, their `listening on ADDR` line awaited,
//!   killed on drop.
//! - [`wait`]: bounded polling for a condition (async and blocking).
//! - [`envtest`]: the real kube-apiserver and etcd: finding them, their command lines.
//! - [`env`](mod@env): paths named by environment variables, read one way (relative to the workspace
//!   root; a path that is not there is an error, never a skip).
//!
//! Everything here panics on failure with a message that names what failed: a failure is a bug
//! in the test or the machine, never input to handle. reload-lib takes this package as a
//! dev-dependency (the kit depends on reload-lib, so reload-lib must never depend on it
//! normally).

pub mod csr;
mod der;
pub mod env;
pub mod envtest;
pub mod files;
pub mod http;
pub mod pki;
pub mod process;
pub mod rename;
pub mod tls;
pub mod wait;
