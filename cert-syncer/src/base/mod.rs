//! The base layer: small types every other layer uses, depending on nothing of this crate above
//! them (`scripts/check-module-cycles` enforces it).
//!
//! - [`error`]: `ConfigError` (exit code 2) and `chain` for logs;
//! - `backoff`: the one retry schedule (doubling up to a cap);
//! - [`kind`]: Secret or ConfigMap (label, plural, directory, file mode);
//! - [`names`]: DNS names as Kubernetes validates them;
//! - [`time`]: the duration parser, RFC 3339, now;
//! - [`input_file`]: reading a config or host file (regular files only, non-blocking, capped);
//! - [`readiness`]: why the process is not ready (what `/readyz` says).

pub(crate) mod backoff;
pub mod error;
pub(crate) mod input_file;
pub mod kind;
pub(crate) mod names;
pub(crate) mod readiness;
pub(crate) mod time;
