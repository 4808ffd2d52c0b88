//! The controller's wait for kube-apiserver at start: on a woken node it starts with
//! kube-apiserver, before that answers. What heals by itself is waited for, quietly and
//! closely; what does not is said once, in the log and on `/readyz`, in the words `sync` and
//! `inspect` use (issue 35 item 7: before, a certificate our CA file does not trust and a name
//! that does not resolve were waited for as "not up yet", silently, for ever).
//!
//! - **Nothing answers yet** (refused, reset, timed out: `kube::connection::NoAnswer::NotUp`):
//!   polled every [`POLL`], since a refused connection on the node costs nothing and the whole
//!   recovery waits on this moment (issue 37 item 2);
//! - **It answers, but not yet** (5xx, 429; while it starts its authorizer refuses, 403, and its
//!   CRDs are not served, 404: `cluster`): 0.25 s doubling to 2 s;
//! - **It cannot answer us** (a certificate not trusted by the CA file, another TLS failure, a
//!   host name that does not resolve): an error, logged once per reason, `/readyz` says it;
//!   tried again when the CA file changes (reload-lib re-reads it) or every [`BROKEN_RETRY`]
//!   (a certificate or a resolver fixed on the other side).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::base::backoff::doubling;
use crate::base::readiness::Readiness;
use crate::kube::connection::{Connection, NoAnswer};

/// The poll while nothing answers at the address.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// First retry of an apiserver that answers but cannot serve yet, doubling up to
/// [`NOT_READY_MAX`].
const NOT_READY_FIRST: Duration = Duration::from_millis(250);
const NOT_READY_MAX: Duration = Duration::from_secs(2);

/// How often a failure that does not heal by itself is tried again (and at once when the CA
/// file changes).
pub(super) const BROKEN_RETRY: Duration = Duration::from_secs(10);

/// Why the controller cannot go on yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Blocked {
    /// No answer at all ([`NoAnswer`]).
    NoAnswer(NoAnswer),
    /// An answer that says "not yet" (a status, with what was asked).
    NotReady(String),
}

impl Blocked {
    /// From a failed request: its classification, or (the server answered) "not ready".
    pub(super) fn of(connection: &Connection, what: &str, err: &kube::Error) -> Blocked {
        match connection.target.classify(err) {
            Some(no_answer) => Blocked::NoAnswer(no_answer),
            None => Blocked::NotReady(format!("{what}: {}", crate::base::error::chain(err))),
        }
    }

    fn heals_by_itself(&self) -> bool {
        match self {
            Blocked::NoAnswer(no_answer) => no_answer.heals_by_itself(),
            Blocked::NotReady(_) => true,
        }
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::NoAnswer(no_answer) => no_answer.fmt(f),
            Blocked::NotReady(why) => f.write_str(why),
        }
    }
}

/// One wait: its schedule, what it said last, and where it reports.
pub(super) struct Waiting<'a> {
    connection: &'a Connection,
    shutdown: &'a CancellationToken,
    readiness: &'a Readiness,
    /// The `/readyz` blocker it sets (`apiserver`).
    blocker: &'static str,
    not_ready: Option<backon::ExponentialBackoff>,
    said: Option<String>,
    blocked: bool,
}

impl<'a> Waiting<'a> {
    pub(super) fn new(
        connection: &'a Connection,
        shutdown: &'a CancellationToken,
        readiness: &'a Readiness,
        blocker: &'static str,
    ) -> Waiting<'a> {
        Waiting {
            connection,
            shutdown,
            readiness,
            blocker,
            not_ready: None,
            said: None,
            blocked: false,
        }
    }

    /// Reports `blocked` (once per reason in the log, always on `/readyz`) and waits before
    /// the next try; `false` on shutdown. `waiting` is the log line of a wait that heals by
    /// itself; one that does not is an error saying how it is retried.
    pub(super) async fn retry(&mut self, blocked: &Blocked, waiting: &str) -> bool {
        let reason = blocked.to_string();
        self.readiness.block(self.blocker, reason.clone());
        self.blocked = true;
        if self.said.as_deref() != Some(reason.as_str()) {
            if blocked.heals_by_itself() {
                tracing::info!(%reason, "{waiting}");
            } else {
                tracing::error!(%reason, "kube-apiserver cannot be reached as configured; retrying when the CA file changes, or every {}s", BROKEN_RETRY.as_secs());
            }
            self.said = Some(reason);
        } else {
            tracing::debug!(%reason, "still waiting");
        }
        let delay = match blocked {
            Blocked::NoAnswer(NoAnswer::NotUp(_)) => POLL,
            Blocked::NotReady(_) => self
                .not_ready
                .get_or_insert_with(|| doubling(NOT_READY_FIRST, NOT_READY_MAX))
                .next()
                .unwrap_or(NOT_READY_MAX),
            Blocked::NoAnswer(_) => BROKEN_RETRY,
        };
        let mut trust = self.connection.trust_changes();
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
            // Only for a failure that does not heal by itself: a fixed CA file is tried at once.
            () = async { match trust.as_mut() {
                Some(changes) if !blocked.heals_by_itself() => { let _ = changes.changed().await; }
                _ => std::future::pending().await,
            } } => true,
        }
    }

    /// The wait is over: clears `/readyz` and says so when it had said anything.
    pub(super) fn done(&mut self, what: &str) {
        if self.blocked {
            self.readiness.clear(self.blocker);
            tracing::info!("{what}");
        }
        self.blocked = false;
        self.said = None;
        self.not_ready = None;
    }
}

/// Waits until kube-apiserver answers (`GET /version`: any identity may ask); `false` on
/// shutdown.
pub(super) async fn until_answers(
    connection: &Connection,
    shutdown: &CancellationToken,
    readiness: &Readiness,
) -> bool {
    let mut waiting = Waiting::new(connection, shutdown, readiness, "apiserver");
    loop {
        let err = match connection.client.apiserver_version().await {
            Ok(_) => {
                waiting.done("kube-apiserver answers");
                return true;
            }
            Err(err) => err,
        };
        let blocked = match Blocked::of(connection, "GET /version", &err) {
            // A server that answers /version with an error is up: the passes deal with it.
            Blocked::NotReady(_) if !matches!(&err, kube::Error::Api(s) if s.code >= 500 || s.code == 429) =>
            {
                waiting.done("kube-apiserver answers");
                return true;
            }
            blocked => blocked,
        };
        if !waiting
            .retry(
                &blocked,
                "kube-apiserver does not answer yet; the first pass waits for it",
            )
            .await
        {
            return false;
        }
    }
}
