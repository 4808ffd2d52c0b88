//! A small Kubernetes-API-compatible server: core/v1 Secrets, ConfigMaps and Events, and
//! coordination.k8s.io/v1 Leases, with list, watch (resourceVersion, bounded history, 410 Gone,
//! bookmarks), get, create, update (409 on a stale resourceVersion), patch (merge, strategic
//! merge with `ObjectMeta`'s list strategies and directives, see [`smp`]; JSON patch; a
//! simplified apply), delete and deletecollection, `dryRun=All` on every write, the legacy
//! `/watch/` paths; OpenAPI v2 (JSON) and v3 documents generated from the types' schemas (so
//! kubectl's default validation, `apply`, `diff` and `explain` work, see [`openapi`]);
//! SelfSubjectAccessReview and SelfSubjectRulesReview from the same rules that authorize
//! requests (`kubectl auth can-i [--list]`); `fieldValidation=Strict` refuses fields the
//! kind's schema does not declare (400, kube-apiserver's wording); label- and field-selector
//! watches send ADDED when an object starts matching and DELETED when it stops; finalizers (a
//! delete sets `deletionTimestamp`, the object stays until its finalizers are removed);
//! static-token or client-certificate authentication (a client certificate that does not
//! verify falls back to the token, else 401, as in kube-apiserver; `/version` needs no
//! credentials); TLS through reload-lib with SNI certificates, so it can play the
//! kube-apiserver of the recovery flow.
//!
//! What it is not: a kube-apiserver. No admission plugins or webhooks, no RBAC (a small rule
//! file instead, see [`auth`]), no other resources, no Namespace objects, no field managers
//! (server-side apply is a merge: no `managedFields`, no conflicts), no `generation`, protobuf
//! only in requests (Secrets, ConfigMaps, Leases; answers are JSON), no Table output (kubectl
//! prints lists itself).
//!
//! # Measured against kube-apiserver
//!
//! `tests/tests/mini_apiserver/diff.rs` replays a corpus of 456 requests (every verb on every
//! served kind, good and bad input, selectors, paging, dry runs, legacy watch paths,
//! deletecollection, SelfSubjectAccessReviews, Secret/ConfigMap validation: TLS keys, type
//! and `immutable` changes, the 1 MiB data limit, finalizers, strategic merge patches) against
//! this server and kube-apiserver v1.20.2 and prints the agreement of status codes and
//! normalized bodies (445/456 = 97.6 % at the last run, asserted ≥ 95 %; the test prints
//! every difference). Differences kept on purpose:
//!
//! - discovery lists only the served kinds and groups (kube-apiserver lists all of its own), and
//!   unknown paths get a `Status` 404 instead of the list of root paths;
//! - a malformed `resourceVersion` is 400 BadRequest (kube-apiserver: 500), and a DELETE body
//!   that is not a `DeleteOptions` object is 400 (kube-apiserver: 500);
//! - Event bodies are not validated beyond their metadata (kube-apiserver 1.20 accepts the
//!   corpus's Events too);
//! - a client without any credentials gets 401 outside `/version` and the health paths
//!   (kube-apiserver authenticates it as `system:anonymous` and answers 403);
//! - no Namespace objects: objects may be created in any namespace;
//! - not in the corpus: `/openapi/v3` (kube-apiserver 1.20 does not serve it) and `/openapi/v2`
//!   (kube-apiserver's document describes all of its kinds; the protobuf form is not served
//!   here, 406).
//!
//! Modules: [`config`] (flags → settings), [`routes`] (URL → verb and resource, handlers,
//! discovery), [`admission`] (what an object must be to be stored: defaults, names, keys),
//! [`store`] (objects, resourceVersion, bounded history), [`change`] (one history entry and its
//! watch line), [`meta`] (object metadata), [`watch`] (fan-out),
//! [`listener`] (accept loop, connection limits and timeouts), [`auth`] (token file, client
//! certificates, rules), [`audit`] (`--audit-log`, the requests
//! as the authorizer sees them), [`status`] (`Status` errors),
//! [`persist`] (the state file), [`seed`] (the seed directory), [`proto`] (protobuf request bodies), [`select`] (label and field selectors), [`smp`] (strategic merge patch), [`resource`]
//! (the served types), [`openapi`] (the OpenAPI v2 and v3 documents), [`metrics`] (open watches and requests at `/metrics`), `fuzz` (entry points of the fuzz target
//! `mini_apiserver_requests`).

pub mod admission;
pub mod audit;
pub mod auth;
pub mod change;
pub mod config;
#[doc(hidden)]
pub mod fuzz;
pub mod listener;
pub mod meta;
pub mod metrics;
pub mod openapi;
pub mod persist;
pub mod proto;
pub mod resource;
pub mod routes;
pub mod seed;
pub mod select;
pub mod smp;
pub mod status;
pub mod store;
pub mod watch;

pub use config::{Flags, Settings};

use std::sync::Arc;

use anyhow::Context;
use reload_lib::{CertKeyPaths, ClientAuth, ServingSet};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use examples::serve;

/// Runs the server until SIGTERM/SIGINT: loads the state and seeds, starts the serving set
/// (fails if the initial certificates are invalid), prints `listening on ADDR` on stdout, and
/// serves. On SIGTERM/SIGINT open watches end (clients re-watch elsewhere or later) and
/// requests in flight finish (up to 10 s).
///
/// # Errors
/// Unreadable or invalid state, seeds, token or rule files, certificates, or listen address;
/// each error names its file or flag.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let store = Arc::new(store::Store::open(
        settings.state_file.clone(),
        settings.history,
    )?);
    if let Some(dir) = &settings.seed_dir {
        let created = seed::seed(&store, dir)?;
        tracing::info!(seed.dir = %dir.display(), created, "Seed manifests loaded");
    }
    let tokens = auth::Tokens::load(&settings.token_auth_file)?;
    let authorizer = auth::Authorizer::load(
        settings.authorization_file.as_deref(),
        &settings.read_only_users,
    )?;
    let mut builder = ServingSet::builder(CertKeyPaths::new(&settings.cert, &settings.key))
        .name("mini-apiserver");
    for pair in &settings.sni {
        builder = builder.sni(&pair.name, CertKeyPaths::new(&pair.cert, &pair.key));
    }
    if let Some(ca) = &settings.client_ca {
        // `Request`, not `Optional`: a certificate that does not verify must leave the request
        // to its token (or a 401), never kill the handshake (kube-apiserver's behaviour).
        builder = builder.client_ca(ca, ClientAuth::Request);
    }
    let set = builder.start().await?;
    set.reload_on_sighup()?;
    let shutdown = CancellationToken::new();
    let api = Arc::new(routes::Api {
        store,
        tokens,
        authorizer,
        client_cert_auth: settings.client_ca.is_some(),
        bookmark_interval: settings.bookmark_interval,
        shutdown: shutdown.clone(),
        metrics: metrics::Metrics::default(),
        audit: settings
            .audit_log
            .as_deref()
            .map(audit::AuditLog::open)
            .transpose()?,
    });
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    println!("listening on {}", listener.local_addr()?);
    tokio::spawn(serve::cancel_on_signal(shutdown.clone()));
    listener::serve(
        listener,
        set.acceptor(),
        listener::Limits::from_fd_limit(),
        move |conn, request| routes::handle(Arc::clone(&api), conn, request),
        shutdown,
    )
    .await?;
    Ok(())
}
