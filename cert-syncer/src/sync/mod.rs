//! `cert-syncer sync`: mirrors named objects with kube-runtime watchers (list + watch, resume by
//! resourceVersion, relist on 410, backoff on errors) and writes each with the atomic directory
//! writer (`..data` swap), so a reader never sees a half-written object.
//!
//! Two ways to follow a kind, chosen by how many objects of it are named
//! (`--namespace-watch-threshold`):
//! - few: one watcher per object (a `metadata.name` field selector: the least data on the wire
//!   and RBAC by resourceNames); every change is confirmed with a live GET before it is written;
//! - many: one namespace-wide watcher for the kind, filtered here ([`namespace`]): one
//!   connection, one list at start-up, and work only for objects whose resourceVersion changed.
//!
//! Either way at most `--write-parallelism` objects are written (or removed) at once.

mod files;
pub(crate) mod mapping;
mod namespace;
mod settings;

use settings::ObjectSpec;
pub(crate) use settings::{Followed, Named, Settings, followed_objects};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use reload_lib::fs::{AtomicDirWriter, WriteOutcome};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::decode::{DecodeError, Raw};
use crate::events::EventRecorder;
use crate::health::Readiness;
use crate::kind::Kind;
use crate::metrics::{KeyLabels, Metrics, ObjectLabels, ResultLabels};
use mapping::{Fetched, ToFetched};

/// Shared by the per-object tasks.
struct Context {
    client: kube::Client,
    /// Keeps the reloading CA alive; explains TLS failures.
    connection: crate::connection::Connection,
    settings: Settings,
    metrics: Metrics,
    readiness: Readiness,
    events: EventRecorder,
    /// Since when the apiserver has refused our credentials.
    auth_failing_since: Mutex<Option<Instant>>,
    auth_failure_exit_after: Duration,
    /// Cancelled (with the reason stored here) when the process must exit non-zero.
    fatal: Mutex<Option<String>>,
    shutdown: CancellationToken,
    /// Bounds how many objects are reconciled (GET, write, remove) at once
    /// (`--write-parallelism`).
    write_permits: tokio::sync::Semaphore,
}

/// Runs until SIGTERM/SIGINT (exit 0) or until authentication has failed for too long (error).
pub(crate) async fn run(settings: Settings) -> anyhow::Result<()> {
    let connection = crate::connection::connect(&settings.connection).await?;
    let client = connection.client.clone();
    let shutdown = crate::shutdown::on_signal()?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::default();
    for object in settings.objects.iter().filter(|o| o.required) {
        readiness.block(&object.label(), "not synced yet");
    }
    if let Some(addr) = settings.metrics_listen {
        let registry = Arc::new(registry);
        let (readiness, shutdown) = (readiness.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(err) = crate::health::serve(addr, registry, readiness, shutdown).await {
                tracing::error!(error = %err, "metrics server stopped");
            }
        });
    }
    let context = Arc::new(Context {
        events: EventRecorder::new(
            client.clone(),
            &settings.namespace,
            settings.pod_name.as_deref(),
        ),
        client,
        connection,
        metrics,
        readiness,
        auth_failing_since: Mutex::new(None),
        auth_failure_exit_after: settings.auth_failure_exit_after,
        fatal: Mutex::new(None),
        shutdown: shutdown.clone(),
        write_permits: tokio::sync::Semaphore::new(settings.write_parallelism),
        settings,
    });
    tracing::info!(
        namespace = %context.settings.namespace,
        destination = %context.settings.destination.display(),
        objects = ?context.settings.objects.iter().map(ObjectSpec::label).collect::<Vec<_>>(),
        "starting sync"
    );
    let mut tasks = Vec::new();
    for kind in Kind::ALL {
        let objects = context.settings.objects_of(kind);
        if context.settings.namespace_wide(kind) {
            tracing::info!(
                kind = kind.label(),
                objects = objects.len(),
                threshold = context.settings.namespace_watch_threshold,
                "one namespace-wide watch for this kind"
            );
            let context = Arc::clone(&context);
            tasks.push(tokio::spawn(async move {
                match kind {
                    Kind::Secret => namespace::follow::<Secret>(context, objects).await,
                    Kind::ConfigMap => namespace::follow::<ConfigMap>(context, objects).await,
                }
            }));
            continue;
        }
        for object in objects {
            let context = Arc::clone(&context);
            tasks.push(tokio::spawn(async move { context.follow(object).await }));
        }
    }
    shutdown.cancelled().await;
    // A write in progress runs to completion inside spawn_blocking; the tasks stop at their next
    // await point.
    for task in tasks {
        let _ = task.await;
    }
    match context
        .fatal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        Some(reason) => Err(anyhow::anyhow!(reason)),
        None => Ok(()),
    }
}

impl Context {
    async fn follow(self: Arc<Self>, object: ObjectSpec) {
        match object.kind {
            Kind::Secret => {
                let api: Api<Raw<Secret>> =
                    Api::namespaced(self.client.clone(), &self.settings.namespace);
                self.follow_stream(
                    &object,
                    &api,
                    crate::watch::watch_object(
                        api.clone(),
                        &object.name,
                        self.connection.watch_timeout_seconds,
                    ),
                )
                .await
            }
            Kind::ConfigMap => {
                let api: Api<Raw<ConfigMap>> =
                    Api::namespaced(self.client.clone(), &self.settings.namespace);
                self.follow_stream(
                    &object,
                    &api,
                    crate::watch::watch_object(
                        api.clone(),
                        &object.name,
                        self.connection.watch_timeout_seconds,
                    ),
                )
                .await
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
        let mut retry: Option<Duration> = None;
        let mut last_seen = false;
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                () = tokio::time::sleep(retry.unwrap_or(RETRY_MAX)), if retry.is_some() => {
                    let _permit = self.write_permit().await;
                    let span = tracing::info_span!("sync", object = %object.label(), retry = ?retry);
                    let settled = self.reconcile(object, api, last_seen).instrument(span).await;
                    retry = next_retry(retry, settled);
                    continue;
                }
                () = self.shutdown.cancelled() => return,
            };
            match item {
                None => return,
                Some(Ok(seen)) => {
                    let span = tracing::info_span!("sync", object = %object.label(), secret.namespace = %self.settings.namespace);
                    self.auth_ok();
                    self.readiness.clear("tls");
                    last_seen = seen.is_some();
                    let _permit = self.write_permit().await;
                    let settled = self
                        .reconcile(object, api, last_seen)
                        .instrument(span)
                        .await;
                    retry = next_retry(None, settled);
                }
                Some(Err(err)) => self.watch_failed(&object.label(), &err),
            }
        }
    }

    /// A watcher error (the watcher retries with backoff): credentials refused, TLS not
    /// trusted, or anything else, logged about `what` (an object, or a kind in the namespace).
    fn watch_failed(&self, what: &str, err: &watcher::Error) {
        let status = watch_error_status(err);
        if matches!(status, Some(401 | 403)) {
            self.auth_failed(what, &err.to_string());
        } else if let Some(reason) = self.connection.target.explain(err) {
            self.readiness
                .block("tls", "the apiserver's certificate is not trusted");
            tracing::error!(object = %what, "{reason}; retrying with backoff");
        } else {
            tracing::warn!(object = %what, error = err as &dyn std::error::Error, "watch failed; retrying with backoff");
        }
    }

    /// One of the `--write-parallelism` permits, held while an object is reconciled.
    async fn write_permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.write_permits
            .acquire()
            .await
            // The semaphore lives as long as the context and is never closed.
            .expect("the write semaphore is never closed")
    }

    /// Confirms with a live GET, then writes or removes. `false` when it failed in a way worth
    /// retrying.
    async fn reconcile<K>(
        &self,
        object: &ObjectSpec,
        api: &Api<Raw<K>>,
        watched_present: bool,
    ) -> bool
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + ToFetched,
    {
        let live = match api.get_opt(&object.name).await {
            Ok(live) => live,
            Err(err) => {
                if matches!(&err, kube::Error::Api(status) if matches!(status.code, 401 | 403)) {
                    self.auth_failed(&object.label(), &err.to_string());
                }
                // Without a confirmation the disk stays as it is; the watcher's next event (or
                // its relist after reconnecting) tries again.
                tracing::warn!(object = %object.label(), error = &err as &dyn std::error::Error, "cannot confirm the object with a live GET; disk unchanged");
                self.count(object, "error");
                return false;
            }
        };
        if live.is_some() != watched_present {
            tracing::debug!(object = %object.label(), "the watch cache was stale; using the live object");
        }
        match live.map(|live| live.decode()) {
            Some(Ok(live)) => self.write(object, &live.to_fetched()).await,
            Some(Err(err)) => self.undecodable(object, &err).await,
            None => self.absent(object).await,
        }
    }

    /// An object that does not decode: its files are kept (never the response body in a log:
    /// see [`crate::decode`]). Settled: a fix arrives as a watch event.
    async fn undecodable(&self, object: &ObjectSpec, err: &DecodeError) -> bool {
        let label = object.label();
        tracing::error!(object = %label, field = %err.field, reason = %err.reason, "cannot decode the object; previous files kept");
        self.count(object, "error");
        self.readiness.block(&label, "the object cannot be decoded");
        self.events
            .record(
                "CertificateUpdateFailed",
                &label,
                format!("Cannot decode {label}: {err}"),
                true,
            )
            .await;
        true
    }

    async fn write(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        if !object.mirror {
            // write_files blocks readiness again for a key that is missing or not PEM.
            self.readiness.clear(&object.label());
            self.synced(object, fetched);
            return self.write_files(object, fetched).await;
        }
        let dir = self.object_dir(object);
        let writer = self.writer(object);
        let payload = fetched.payload(object.kind);
        let outcome = tokio::task::spawn_blocking(move || writer.write(&payload)).await;
        let label = object.label();
        match outcome {
            Ok(Ok(WriteOutcome::Unchanged)) => {
                tracing::debug!(object = %label, secret.resource_version = %fetched.resource_version, "unchanged on disk");
                self.count(object, "unchanged");
            }
            Ok(Ok(outcome)) => {
                tracing::info!(object = %label, secret.resource_version = %fetched.resource_version, dir = %dir.display(), keys = ?fetched.data.keys().collect::<Vec<_>>(), ?outcome, "written");
                self.count(object, "written");
                self.events
                    .record(
                        "CertificateUpdated",
                        &label,
                        format!(
                            "Wrote {label} (resourceVersion {}) to {}",
                            fetched.resource_version,
                            dir.display()
                        ),
                        false,
                    )
                    .await;
            }
            Ok(Err(err)) => {
                tracing::error!(object = %label, error = &err as &dyn std::error::Error, "cannot write; previous files kept");
                self.count(object, "error");
                self.events
                    .record(
                        "CertificateUpdateFailed",
                        &label,
                        format!("Cannot write {label}: {err}"),
                        true,
                    )
                    .await;
                // A bad key will not fix itself; a failed write (disk full, I/O) may.
                return matches!(err, reload_lib::fs::Error::InvalidKey { .. });
            }
            Err(err) => {
                tracing::error!(object = %label, error = %err, "write task failed; previous files kept");
                self.count(object, "error");
                return false;
            }
        }
        self.readiness.clear(&label);
        self.synced(object, fetched);
        self.write_files(object, fetched).await
    }

    async fn absent(&self, object: &ObjectSpec) -> bool {
        let label = object.label();
        if object.required {
            if object.mirror {
                tracing::error!(object = %label, "required object is absent; keeping its files");
            } else {
                tracing::error!(object = %label, "the object of a --file mapping is absent; host file kept, not ready");
            }
            self.readiness.block(&label, "absent from the apiserver");
            self.count(object, "error");
            // Its creation arrives as a watch event.
            return true;
        }
        let writer = self.writer(object);
        match tokio::task::spawn_blocking(move || writer.remove_all()).await {
            Ok(Ok(true)) => {
                tracing::info!(object = %label, "optional object deleted; directory removed");
                self.count(object, "removed");
                self.events
                    .record(
                        "CertificateRemoved",
                        &label,
                        format!("Removed the files of {label}"),
                        false,
                    )
                    .await;
            }
            Ok(Ok(false)) => {
                tracing::debug!(object = %label, "optional object absent; nothing on disk")
            }
            Ok(Err(err)) => {
                tracing::error!(object = %label, error = &err as &dyn std::error::Error, "cannot remove the directory");
                return false;
            }
            Err(err) => {
                tracing::error!(object = %label, error = %err, "remove task failed");
                return false;
            }
        }
        true
    }

    /// `--file` mappings of this object: certificates only, replaced atomically. `false` when a
    /// write failed (retried); content that is not PEM certificates is refused for good.
    async fn write_files(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        let mut settled = true;
        for mapping in self
            .settings
            .files
            .iter()
            .filter(|f| f.kind == object.kind && f.name == object.name)
        {
            let (kind, ns, name, key) = (
                object.kind.label(),
                &self.settings.namespace,
                &object.name,
                &mapping.key,
            );
            let Some(bytes) = fetched.data.get(key) else {
                tracing::error!(object = %object.label(), key, path = %mapping.path.display(), "key missing from the object; host file kept");
                self.readiness
                    .block(&object.label(), format!("--file key {key} missing"));
                continue;
            };
            if let Err(reason) = files::check_certificates(bytes) {
                tracing::error!(object = %object.label(), key, path = %mapping.path.display(), %reason, "not PEM certificates; host file kept");
                self.readiness.block(
                    &object.label(),
                    format!("--file key {key} is not certificates"),
                );
                continue;
            }
            let (path, bytes) = (mapping.path.clone(), bytes.clone());
            match tokio::task::spawn_blocking(move || {
                reload_lib::fs::write_file_atomic(&path, &bytes, 0o644)
            })
            .await
            {
                Ok(Ok(_)) => tracing::info!(
                    "synced {kind}/{ns}/{name} key {key} from resourceVersion {} to {}",
                    fetched.resource_version,
                    mapping.path.display()
                ),
                Ok(Err(err)) => {
                    tracing::error!(path = %mapping.path.display(), error = &err as &dyn std::error::Error, "cannot write host file");
                    settled = false;
                }
                Err(err) => {
                    tracing::error!(path = %mapping.path.display(), error = %err, "host file task failed");
                    settled = false;
                }
            }
        }
        settled
    }

    /// The writer of an object's directory: no symlink below the destination is followed
    /// (`secrets/`, `secrets/<name>`), so writes and deletes stay inside it.
    fn writer(&self, object: &ObjectSpec) -> AtomicDirWriter {
        AtomicDirWriter::new(self.object_dir(object)).with_root(&self.settings.destination)
    }

    fn object_dir(&self, object: &ObjectSpec) -> PathBuf {
        // The name was validated as a DNS subdomain: one safe path component.
        self.settings
            .destination
            .join(object.kind.dir())
            .join(&object.name)
    }

    fn count(&self, object: &ObjectSpec, result: &'static str) {
        self.metrics
            .syncs
            .get_or_create(&ResultLabels {
                kind: object.kind.label(),
                name: object.name.clone(),
                result,
            })
            .inc();
    }

    fn synced(&self, object: &ObjectSpec, fetched: &Fetched) {
        let now = crate::time::unix_now();
        self.metrics
            .last_sync
            .get_or_create(&ObjectLabels {
                kind: object.kind.label(),
                name: object.name.clone(),
            })
            .set(now);
        for (key, bytes) in &fetched.data {
            use rustls_pki_types::pem::PemObject;
            let Some(Ok(first)) = rustls_pki_types::CertificateDer::pem_slice_iter(bytes).next()
            else {
                continue;
            };
            if let Ok(info) = reload_lib::CertInfo::from_der(&first) {
                self.metrics
                    .not_after
                    .get_or_create(&KeyLabels {
                        kind: object.kind.label(),
                        name: object.name.clone(),
                        key: key.clone(),
                    })
                    .set(info.not_after);
            }
        }
    }

    fn auth_ok(&self) {
        let mut since = self
            .auth_failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if since.take().is_some() {
            tracing::info!("the apiserver accepts our credentials again");
            self.readiness.clear("auth");
        }
    }

    fn auth_failed(&self, what: &str, error: &str) {
        let mut since = self
            .auth_failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let started = *since.get_or_insert_with(Instant::now);
        self.readiness
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

/// The next retry delay: none once settled, else the previous one doubled.
fn next_retry(previous: Option<Duration>, settled: bool) -> Option<Duration> {
    if settled {
        return None;
    }
    Some(previous.map_or(RETRY_FIRST, |d| (d * 2).min(RETRY_MAX)))
}

/// The HTTP status behind a watcher error, if any.
fn watch_error_status(err: &watcher::Error) -> Option<u16> {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        _ => None,
    }
}
