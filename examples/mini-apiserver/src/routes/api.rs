//! What every request handler is given: the server's state ([`Api`]) and its body limit. A leaf
//! of `routes`, so the handlers in `routes/` need not reach back into their parent.

use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditLog;
use crate::auth::{Authorizer, Tokens};
use crate::store::Store;

/// Request bodies above this size are refused (the apiserver's own limit is about 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Api {
    /// The objects.
    pub store: Arc<Store>,
    /// Who is calling.
    pub tokens: Tokens,
    /// What they may do.
    pub authorizer: Authorizer,
    /// Whether TLS client certificates (verified against `--client-ca`) authenticate users.
    pub client_cert_auth: bool,
    /// Time between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Cancelled when the server shuts down: open watches end.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Open watches and requests, served at `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// `--audit-log`: every authenticated request on objects, as the authorizer sees it.
    pub audit: Option<AuditLog>,
}
