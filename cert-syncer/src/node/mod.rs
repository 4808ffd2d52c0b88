//! `cert-syncer node`: keeps one host file (the kubelet's `kubelet-ca.crt`, say) in step with
//! one or more keys of one or more ConfigMaps and Secrets, across namespaces, without
//! MachineConfigs, reboots or drains. Run as a DaemonSet on every node.
//!
//! - Sources ([`sources`]): one kube-runtime watcher per source object (field selector
//!   `metadata.name`: RBAC by `resourceNames`, one watch event per change and node); no GET
//!   per change.
//! - Content ([`bundle`]): every PEM block of every source must be a certificate; sources are
//!   concatenated in the order given, identical certificates (same DER) kept once. A source
//!   whose new version is refused keeps its last good certificates in the file; an Event on
//!   the Node and `cert_syncer_node_source_errors_total` name the object and key.
//! - The guard ([`guard`]): a bundle with no unexpired CA, or one that would remove every
//!   unexpired certificate the file holds, is refused before any write (every node runs this at
//!   once); the file keeps its content, and a log line, an Event, a metric and `/readyz` say so.
//! - The file ([`target`]): read with the crate's non-blocking reader, written with reload-lib's atomic writer (temporary file, fsync,
//!   rename, directory fsync), mode and owner kept or as configured, never rewritten when it
//!   already holds the same certificates. Another writer's content is replaced only after it
//!   has stayed unchanged for the grace period, with an Event and a metric naming its SHA-256.
//! - After each write, the optional post-write action ([`action`]).
//! - What each outcome shows (metrics, log lines, Events on the Node, `/readyz`): [`report`].
//!
//! The file is assembled only once every source has been seen with good content: a partial
//! trust bundle is never written.

mod action;
mod bundle;
mod guard;
mod metrics;
mod report;
mod settings;
mod sources;
mod target;

pub use settings::{ObjectRef, PostWrite, Preset, Settings, SignalTarget, Source};

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::base::error::ConfigError;
use crate::base::kind::Kind;
use crate::base::readiness::Readiness;
use crate::kube::events::EventRecorder;
use crate::kube::sidecar::Sidecar;
use bundle::Certificate;
use metrics::{Metrics, PathLabels, SourceLabels};
use sources::Seen;
use target::{Outcome, Target};

/// Without inotify (from the start, or once the watches are lost) the file is polled this often.
const POLL_WITHOUT_INOTIFY: Duration = Duration::from_secs(2);
/// A failed write is retried after this long.
const WRITE_RETRY: Duration = Duration::from_secs(5);

/// Node mode's metrics, with every source invalid and the file and sources blocking readiness
/// until seen.
///
/// # Errors
/// The file's directory does not exist (the host directory is not mounted).
pub(crate) fn register(
    settings: &Settings,
    registry: &mut Registry,
    readiness: &Readiness,
) -> Result<Metrics, ConfigError> {
    let dir = settings.file.parent().unwrap_or(std::path::Path::new("/"));
    if !dir.is_dir() {
        return Err(ConfigError(format!(
            "--file {}: its directory does not exist (mount the host directory)",
            settings.file.display()
        )));
    }
    readiness.block("file", "not written yet");
    for source in &settings.sources {
        readiness.block(&source.to_string(), "not seen yet");
    }
    let file = settings.file.display().to_string();
    Ok(Metrics::register_for(registry, &file, &settings.sources))
}

/// Runs until SIGTERM/SIGINT.
pub(crate) async fn run(
    settings: Settings,
    sidecar: Sidecar,
    metrics: Metrics,
) -> anyhow::Result<()> {
    let Sidecar {
        connection,
        shutdown,
        readiness,
        events,
    } = sidecar;
    let client = connection.client.clone();
    let path_label = settings.file.display().to_string();
    let objects = settings.objects();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Seen)>();
    let mut tasks = Vec::new();
    for (index, object) in objects.iter().enumerate() {
        let (client, object, tx) = (client.clone(), object.clone(), tx.clone());
        let timeout = connection.watch_timeout_seconds;
        tasks.push(tokio::spawn(async move {
            match object.kind {
                Kind::ConfigMap => {
                    sources::follow::<ConfigMap>(client, &object, timeout, index, tx).await
                }
                Kind::Secret => {
                    sources::follow::<Secret>(client, &object, timeout, index, tx).await
                }
            }
        }));
    }
    drop(tx);
    // reload-lib's watcher (its directory: a rename over the file is seen); it polls the file
    // when inotify cannot be used, from the start or once the watches are lost mid-run.
    let file_watch =
        reload_lib::watch::FileWatch::new([&settings.file]).poll_interval(POLL_WITHOUT_INOTIFY);
    if let reload_lib::WatchMode::Polling(reason) = file_watch.mode() {
        tracing::warn!(%reason, file = %settings.file.display(), interval = ?POLL_WITHOUT_INOTIFY, "cannot watch the file's directory; polling it");
    }
    tracing::info!(
        file = %settings.file.display(),
        sources = ?settings.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
        grace_period = ?settings.grace_period,
        node = settings.node_name.as_deref().unwrap_or(""),
        "starting node mode"
    );
    let mut node = Node {
        events,
        target: Target::new(
            settings.file.clone(),
            settings.mode,
            settings.owner,
            settings.grace_period,
        ),
        sources: settings
            .sources
            .iter()
            .map(|source| SourceState {
                source: source.clone(),
                object: objects
                    .iter()
                    .position(|o| *o == source.object())
                    .expect("every source's object is followed"),
                last_good: None,
                resource_version: None,
                valid: false,
            })
            .collect(),
        seen_versions: vec![None; objects.len()],
        objects,
        path_label,
        metrics,
        readiness,
        foreign: None,
        refused: None,
        settings,
    };
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut resync = tokio::time::interval(node.settings.resync_interval);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            update = rx.recv() => match update {
                Some((index, seen)) => node.seen(index, seen).await,
                None => break,
            },
            () = file_watch.changed() => {}
            () = sleep_until(deadline) => {}
            _ = resync.tick() => {}
            () = shutdown.cancelled() => break,
        }
        deadline = node.reconcile().await.map(tokio::time::Instant::from_std);
    }
    for task in tasks {
        task.abort();
    }
    Ok(())
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

struct SourceState {
    source: Source,
    /// Index of its object.
    object: usize,
    /// The certificates of its last good version.
    last_good: Option<Vec<Certificate>>,
    /// The resourceVersion of that version (names it in a refusal).
    resource_version: Option<String>,
    /// Whether its current version is good.
    valid: bool,
}

/// The loop's state.
struct Node {
    settings: Settings,
    objects: Vec<ObjectRef>,
    /// The resourceVersion last handled per object (a relist re-delivers it).
    seen_versions: Vec<Option<String>>,
    sources: Vec<SourceState>,
    target: Target,
    path_label: String,
    metrics: Metrics,
    readiness: Readiness,
    events: EventRecorder,
    /// The fingerprint of another writer's content in the file, while it is there.
    foreign: Option<String>,
    /// The message of the guard's refusal in force (logged and recorded once per bundle).
    refused: Option<String>,
}

impl Node {
    async fn seen(&mut self, index: usize, seen: Seen) {
        let object = self.objects[index].clone();
        match seen {
            Seen::WatchError(error) => {
                tracing::warn!(%object, %error, "watch failed; retrying with backoff");
                self.readiness
                    .block("api", format!("watching {object}: {error}"));
            }
            Seen::Object(fetched) => {
                self.readiness.clear("api");
                if self.seen_versions[index].as_ref() == Some(&fetched.resource_version) {
                    return;
                }
                self.seen_versions[index] = Some(fetched.resource_version.clone());
                for position in self.sources_of(index) {
                    let source = self.sources[position].source.clone();
                    let result = match fetched.data.get(&source.key) {
                        Some(bytes) => bundle::parse_certificates(bytes),
                        None => Err(bundle::Invalid::MissingKey),
                    };
                    match result {
                        Ok(certificates) => {
                            tracing::info!(%source, resource_version = %fetched.resource_version, certificates = certificates.len(), "source read");
                            self.sources[position].last_good = Some(certificates);
                            self.sources[position].resource_version =
                                Some(fetched.resource_version.clone());
                            self.source_valid(position, true);
                        }
                        Err(reason) => {
                            let message = format!(
                                "{source} (resourceVersion {}): {reason}",
                                fetched.resource_version
                            );
                            self.source_refused(position, &message).await;
                        }
                    }
                }
            }
            Seen::Undecodable(reason) => {
                self.readiness.clear("api");
                self.seen_versions[index] = None;
                for position in self.sources_of(index) {
                    let message = format!(
                        "{} cannot be decoded: {reason}",
                        self.sources[position].source
                    );
                    self.source_refused(position, &message).await;
                }
            }
            Seen::Absent => {
                self.readiness.clear("api");
                self.seen_versions[index] = None;
                tracing::error!(%object, "source object is absent; the file keeps its last good certificates");
                for position in self.sources_of(index) {
                    let source = self.sources[position].source.clone();
                    self.source_valid(position, false);
                    self.readiness
                        .block(&source.to_string(), "the object is absent");
                }
                self.events
                    .record(
                        "SourceAbsent",
                        &object.to_string(),
                        format!(
                            "{object} is absent; {} keeps its last good certificates",
                            self.target.path().display()
                        ),
                        true,
                    )
                    .await;
            }
        }
    }

    fn sources_of(&self, object: usize) -> Vec<usize> {
        (0..self.sources.len())
            .filter(|i| self.sources[*i].object == object)
            .collect()
    }

    fn source_valid(&mut self, position: usize, valid: bool) {
        let state = &mut self.sources[position];
        state.valid = valid;
        self.metrics
            .source_valid
            .get_or_create(&SourceLabels::new(&self.path_label, &state.source))
            .set(i64::from(valid));
        if valid {
            self.readiness.clear(&state.source.to_string());
        }
    }

    /// A source version refused: its last good certificates stay in the file.
    async fn source_refused(&mut self, position: usize, message: &str) {
        self.source_valid(position, false);
        let source = self.sources[position].source.clone();
        self.metrics
            .source_errors
            .get_or_create(&SourceLabels::new(&self.path_label, &source))
            .inc();
        let kept = if self.sources[position].last_good.is_some() {
            "its last good certificates stay in the file"
        } else {
            "the file is not written until it is good"
        };
        tracing::error!(%source, error = %message, "source refused; {kept}");
        self.readiness
            .block(&source.to_string(), message.to_owned());
        self.events
            .record(
                "SourceInvalid",
                &source.to_string(),
                format!("{message}; {kept} ({})", self.target.path().display()),
                true,
            )
            .await;
    }

    /// Brings the file in line with the sources; returns when to look again (the end of a
    /// grace period, a retry), if anything is pending. Three phases: assemble the sources'
    /// bundle (nothing before every source was seen good), compare it with the file and write
    /// it or not (`Target::reconcile`, off the async workers), then report what happened.
    async fn reconcile(&mut self) -> Option<Instant> {
        let bundle = self.assemble()?;
        let outcome = tokio::task::block_in_place(|| {
            self.target
                .reconcile(&bundle, Instant::now(), crate::base::time::unix_now())
        });
        match outcome {
            Ok(Outcome::InSync) => {
                self.foreign_gone();
                self.refusal_gone();
                self.readiness.clear("file");
                None
            }
            Ok(Outcome::Written { replaced }) => {
                self.written(&bundle, replaced.as_deref()).await;
                None
            }
            Ok(Outcome::Waiting {
                fingerprint,
                until,
                first,
            }) => {
                self.foreign_waiting(&fingerprint, first).await;
                Some(until)
            }
            Ok(Outcome::Refused { refusal, held }) => {
                // Not waiting for another writer while refusing: the refusal names the file's
                // content instead.
                self.foreign_gone();
                self.refused(&bundle, &refusal, held.as_deref()).await;
                None
            }
            Err(err) => {
                self.write_failed(&err).await;
                Some(Instant::now() + WRITE_RETRY)
            }
        }
    }

    /// The bundle of every source's last good certificates, with its gauges set; `None` (and
    /// the file not ready) until every source has been seen good once.
    fn assemble(&self) -> Option<bundle::Bundle> {
        let parts: Option<Vec<&[Certificate]>> = self
            .sources
            .iter()
            .map(|s| s.last_good.as_deref())
            .collect();
        let Some(parts) = parts else {
            self.readiness
                .block("file", "waiting for every source's first good version");
            return None;
        };
        let bundle = bundle::assemble(parts);
        let labels = self.labels();
        self.metrics
            .bundle_bytes
            .get_or_create(&labels)
            .set(bundle.pem.len() as i64);
        self.metrics
            .bundle_certificates
            .get_or_create(&labels)
            .set(bundle.certificates.len() as i64);
        if let Some(not_after) = bundle.earliest_not_after() {
            self.metrics
                .earliest_not_after
                .get_or_create(&labels)
                .set(not_after);
        }
        Some(bundle)
    }

    fn labels(&self) -> PathLabels {
        PathLabels {
            path: self.path_label.clone(),
        }
    }
}
