//! The app shell: the flags, the access each subcommand needs, and what every sidecar does
//! before its job starts (connect, signals, metrics, readiness, the health server, the Events
//! target). The only layer that knows every job.
//!
//! - [`cli`]: the flags (clap), turned into each job's plain `Settings`;
//! - [`access`]: the API access each subcommand needs for given flags;
//! - `health`: `/healthz`, `/readyz`, `/metrics`;
//! - `shutdown`: SIGTERM/SIGINT to a cancellation token.

pub mod access;
pub mod cli;
pub(crate) mod health;
pub(crate) mod shutdown;
