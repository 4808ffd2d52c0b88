//! What every way of following shares ([`Follower`]): the client, the applier, the
//! `--write-parallelism` permits, the live GET, and what to do when the apiserver refuses our
//! credentials or its certificate.

use std::sync::Mutex;
use std::time::Duration;

use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::apply::{Applier, Desired};
use super::settings::ObjectSpec;
use crate::kube::decode::Raw;
use crate::kube::fetched::ToFetched;

/// Shared by every object's task.
pub(crate) struct Follower {
    pub client: kube::Client,
    /// Keeps the reloading CA alive; explains TLS failures.
    pub connection: crate::kube::connection::Connection,
    pub applier: Applier,
    /// Since when the apiserver has refused our credentials.
    auth_failing_since: Mutex<Option<Instant>>,
    auth_failure_exit_after: Duration,
    /// Set (and `shutdown` cancelled) when the process must exit non-zero.
    fatal: Mutex<Option<String>>,
    pub shutdown: CancellationToken,
    /// Bounds how many objects are reconciled (GET, write, remove, resync) at once.
    write_permits: tokio::sync::Semaphore,
    /// How often the disk is checked against the last seen state; `None`: never.
    pub resync_interval: Option<Duration>,
}

impl Follower {
    pub fn new(
        client: kube::Client,
        connection: crate::kube::connection::Connection,
        applier: Applier,
        shutdown: CancellationToken,
    ) -> Follower {
        let settings = &applier.settings;
        Follower {
            auth_failing_since: Mutex::new(None),
            auth_failure_exit_after: settings.auth_failure_exit_after,
            fatal: Mutex::new(None),
            write_permits: tokio::sync::Semaphore::new(settings.write_parallelism),
            resync_interval: Some(settings.resync_interval).filter(|d| !d.is_zero()),
            client,
            connection,
            applier,
            shutdown,
        }
    }

    /// Why the process must exit non-zero, if it must.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// A watcher error (the watcher retries with backoff): credentials refused, TLS not
    /// trusted, or anything else, logged about `what` (an object, or a kind in the namespace).
    pub fn watch_failed(&self, what: &str, err: &watcher::Error) {
        let status = crate::kube::watch::error_status(err);
        if matches!(status, Some(401 | 403)) {
            self.auth_failed(what, &crate::base::error::chain(err).to_string());
        } else if let Some(reason) = self.connection.target.explain(err) {
            self.applier
                .readiness
                .block("tls", "the apiserver's certificate is not trusted");
            tracing::error!(object = %what, "{reason}; retrying with backoff");
        } else {
            tracing::warn!(object = %what, error = %crate::base::error::chain(err), "watch failed; retrying with backoff");
        }
    }

    /// One of the `--write-parallelism` permits, held while an object is reconciled.
    pub async fn write_permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.write_permits
            .acquire()
            .await
            // The semaphore lives as long as the follower and is never closed.
            .expect("the write semaphore is never closed")
    }

    /// The object as the apiserver has it now (a live GET), or `None` when it did not answer
    /// (logged, counted as an `error` sync; refused credentials are reported).
    pub async fn get<K>(&self, object: &ObjectSpec, api: &Api<Raw<K>>) -> Option<Desired>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned + ToFetched,
    {
        match api.get_opt(&object.name).await {
            Ok(live) => Some(Desired::of(live.as_ref())),
            Err(err) => {
                if matches!(&err, kube::Error::Api(status) if matches!(status.code, 401 | 403)) {
                    self.auth_failed(
                        &object.label(),
                        &crate::base::error::chain(&err).to_string(),
                    );
                }
                tracing::warn!(object = %object.label(), error = %crate::base::error::chain(&err), "cannot confirm the object with a live GET; disk unchanged");
                self.applier.count(object, "error");
                None
            }
        }
    }

    pub fn auth_ok(&self) {
        let mut since = self
            .auth_failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if since.take().is_some() {
            tracing::info!("the apiserver accepts our credentials again");
            self.applier.readiness.clear("auth");
        }
    }

    fn auth_failed(&self, what: &str, error: &str) {
        let mut since = self
            .auth_failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let started = *since.get_or_insert_with(Instant::now);
        self.applier
            .readiness
            .block("auth", "the apiserver refuses our credentials");
        tracing::error!(object = %what, %error, failing_for = ?started.elapsed(), "the apiserver refuses our credentials (check the token file and RBAC)");
        if started.elapsed() >= self.auth_failure_exit_after {
            *self.fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
                "the apiserver has refused our credentials for {:?}; exiting so the kubelet restarts us",
                started.elapsed()
            ));
            self.shutdown.cancel();
        }
    }
}
