//! Following objects: one watcher per named object (a `metadata.name` field selector), every
//! change confirmed with a live GET before it is applied, failed reconciles retried with backoff,
//! and the last confirmed state re-applied to the disk every resync period. Also what every way
//! of following shares ([`Follower`]): the client, the applier, the `--write-parallelism`
//! permits, and what to do when the apiserver refuses our credentials or its certificate.

use std::sync::Mutex;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::apply::{Applier, Desired};
use super::settings::ObjectSpec;
use crate::base::kind::Kind;
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

    /// Follows one object with its own watcher until shutdown.
    pub async fn follow_object(&self, object: ObjectSpec) {
        let namespace = &self.applier.settings.namespace;
        let timeout = self.connection.watch_timeout_seconds;
        match object.kind {
            Kind::Secret => {
                let api: Api<Raw<Secret>> = Api::namespaced(self.client.clone(), namespace);
                let stream = crate::kube::watch::watch_object(api.clone(), &object.name, timeout);
                self.follow_stream(&object, &api, stream).await
            }
            Kind::ConfigMap => {
                let api: Api<Raw<ConfigMap>> = Api::namespaced(self.client.clone(), namespace);
                let stream = crate::kube::watch::watch_object(api.clone(), &object.name, timeout);
                self.follow_stream(&object, &api, stream).await
            }
        }
    }

    async fn follow_stream<K>(
        &self,
        object: &ObjectSpec,
        api: &Api<Raw<K>>,
        stream: impl Stream<Item = Result<Option<Raw<K>>, watcher::Error>> + Send,
    ) where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + ToFetched,
    {
        let stream = stream.default_backoff();
        futures::pin_mut!(stream);
        // A reconcile that failed for a reason that may pass (disk full, apiserver unreachable
        // for the confirming GET) is retried with backoff even if no new event comes.
        let mut retry = Retry::default();
        let mut resync = Resync::new(self.resync_interval);
        // The state last confirmed with the apiserver: what the resync restores.
        let mut last: Option<Desired> = None;
        let mut last_seen = false;
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                () = retry.wait() => {
                    let _permit = self.write_permit().await;
                    let span = tracing::info_span!("sync", object = %object.label(), retry = ?retry.delay());
                    let (settled, confirmed) = self.reconcile(object, api, last_seen).instrument(span).await;
                    last = confirmed.or(last);
                    retry.after(settled);
                    continue;
                }
                () = resync.tick() => {
                    // A pending retry re-applies everything anyway; a failed repair is logged
                    // and tried again at the next tick (never a GET).
                    if let (Some(desired), false) = (&last, retry.pending()) {
                        let _permit = self.write_permit().await;
                        self.applier.resync(object, desired).await;
                    }
                    continue;
                }
                () = self.shutdown.cancelled() => return,
            };
            match item {
                None => return,
                Some(Ok(seen)) => {
                    let span = tracing::info_span!("sync", object = %object.label(), secret.namespace = %self.applier.settings.namespace);
                    self.auth_ok();
                    self.applier.readiness.clear("tls");
                    last_seen = seen.is_some();
                    let _permit = self.write_permit().await;
                    let (settled, confirmed) = self
                        .reconcile(object, api, last_seen)
                        .instrument(span)
                        .await;
                    last = confirmed.or(last);
                    retry.reset();
                    retry.after(settled);
                }
                Some(Err(err)) => self.watch_failed(&object.label(), &err),
            }
        }
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

    /// Confirms with a live GET, then applies. Returns whether it settled (`false`: worth
    /// retrying) and the confirmed state, if the GET answered.
    pub async fn reconcile<K>(
        &self,
        object: &ObjectSpec,
        api: &Api<Raw<K>>,
        watched_present: bool,
    ) -> (bool, Option<Desired>)
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + ToFetched,
    {
        let live = match api.get_opt(&object.name).await {
            Ok(live) => live,
            Err(err) => {
                if matches!(&err, kube::Error::Api(status) if matches!(status.code, 401 | 403)) {
                    self.auth_failed(
                        &object.label(),
                        &crate::base::error::chain(&err).to_string(),
                    );
                }
                // Without a confirmation the disk stays as it is; the watcher's next event (or
                // its relist after reconnecting) tries again.
                tracing::warn!(object = %object.label(), error = %crate::base::error::chain(&err), "cannot confirm the object with a live GET; disk unchanged");
                self.applier.count(object, "error");
                return (false, None);
            }
        };
        if live.is_some() != watched_present {
            tracing::debug!(object = %object.label(), "the watch cache was stale; using the live object");
        }
        let desired = match live.map(|live| live.decode()) {
            Some(Ok(live)) => Desired::Present(live.to_fetched()),
            Some(Err(err)) => Desired::Undecodable(err),
            None => Desired::Absent,
        };
        let settled = self.applier.apply(object, &desired).await;
        (settled, Some(desired))
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

/// First retry of a failed reconcile, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The backoff of one object's failed reconciles: none while settled; 0.5 s after the first
/// failure, doubling up to 60 s while they keep failing.
#[derive(Debug, Default)]
pub(crate) struct Retry {
    delay: Option<Duration>,
    /// When the retry is due (tokio's clock, so tests can pause it).
    due: Option<Instant>,
}

impl Retry {
    /// Records an attempt's outcome: settled clears the backoff, a failure schedules the next
    /// retry, doubling the previous delay.
    pub fn after(&mut self, settled: bool) {
        if settled {
            *self = Retry::default();
            return;
        }
        let delay = self.delay.map_or(RETRY_FIRST, |d| (d * 2).min(RETRY_MAX));
        self.delay = Some(delay);
        self.due = Some(Instant::now() + delay);
    }

    /// Forgets the backoff (a new state arrived: it is tried at once).
    pub fn reset(&mut self) {
        *self = Retry::default();
    }

    /// Whether a retry is scheduled.
    pub fn pending(&self) -> bool {
        self.due.is_some()
    }

    /// The current delay, for logs.
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// Resolves when the scheduled retry is due; never without one.
    pub async fn wait(&self) {
        match self.due {
            Some(due) => tokio::time::sleep_until(due).await,
            None => std::future::pending().await,
        }
    }
}

/// The resync timer of one object: ticks every interval after the first (none without an
/// interval). Missed ticks are not made up: one resync per period at most.
pub(crate) struct Resync(Option<tokio::time::Interval>);

impl Resync {
    pub fn new(interval: Option<Duration>) -> Resync {
        Resync(interval.map(|period| {
            let mut interval = tokio::time::interval_at(Instant::now() + period, period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        }))
    }

    pub async fn tick(&mut self) {
        match &mut self.0 {
            Some(interval) => {
                interval.tick().await;
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failed_reconciles_back_off_doubling_to_a_minute_and_a_success_clears_it() {
        let mut retry = Retry::default();
        assert!(!retry.pending());
        let mut waited = Vec::new();
        for _ in 0..10 {
            retry.after(false);
            let start = Instant::now();
            retry.wait().await;
            waited.push(start.elapsed().as_millis());
        }
        assert_eq!(
            waited,
            [
                500, 1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000
            ]
        );
        retry.after(true);
        assert!(!retry.pending());
        // Without a retry scheduled, wait never resolves.
        let never = tokio::time::timeout(Duration::from_secs(3600), retry.wait()).await;
        assert!(never.is_err());
        // After a reset, the next failure starts again at the first delay.
        retry.after(false);
        retry.reset();
        retry.after(false);
        assert_eq!(retry.delay(), Some(RETRY_FIRST));
    }

    #[tokio::test(start_paused = true)]
    async fn the_resync_ticks_once_per_period_and_never_without_one() {
        let start = Instant::now();
        let mut resync = Resync::new(Some(Duration::from_secs(600)));
        resync.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(600));
        resync.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(1200));
        let mut off = Resync::new(None);
        assert!(
            tokio::time::timeout(Duration::from_secs(86_400), off.tick())
                .await
                .is_err()
        );
    }
}
