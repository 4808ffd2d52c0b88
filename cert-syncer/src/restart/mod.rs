//! `cert-syncer restart-on-change`: restarts a container of its own pod whose server reads a
//! client certificate only when it starts (or on a long timer: kube-controller-manager and
//! kube-scheduler 1.20 re-read their kubeconfig's client certificate every 5 minutes), when
//! that certificate changes on disk to a pair it may run with. The kubelet starts the container
//! again, as it does for any container that exits; the new process reads the new pair.
//!
//! - Opt-in, per container and per file: only the containers of `--container` and the pairs of
//!   `--pair` are looked at; `kube-apiserver` (which reloads its files) is refused as a target.
//! - The process is found in the pod's shared PID namespace (`shareProcessNamespace: true`) by
//!   its executable ([`process`]); SIGTERM only, through a pidfd: the server's own shutdown,
//!   never a kill (the kubelet's grace period is the only clock on it).
//! - The rule ([`decide`]): a restart only for bytes that changed, were written after the
//!   running process started, and make fit pairs (parse, the key fits, valid now); otherwise
//!   nothing is restarted and an Event says why; at most `--max-restarts` per
//!   `--restart-window` per container ([`brake`]).
//! - Each restart is an Event `RestartingContainer` and
//!   `cert_syncer_container_restarts_total{container}`; each held one an Event
//!   (`RestartHeldInvalidPair`, `RestartHeldBrake`, `RestartHeldNoProcess`) and
//!   `cert_syncer_container_restarts_held_total{container,reason}`, once per content and reason.
//! - The files are watched with reload-lib's watcher ([`reload_lib::watch::FileWatch`]), whoever
//!   writes them (`sync`, an admin), and looked at again every `--recheck-interval`.
//!
//! Why a signal from a sidecar and not a liveness probe the sidecar serves: a probe couples the
//! server's life to the sidecar's (the sidecar down, the probe refused, the server killed), it
//! replaces the server's own health probe, and the kubelet kills after the grace period where
//! a signal lets the server shut down its own way. The design: docs/restart-on-change.md.

mod brake;
mod decide;
mod pair;
mod process;

pub use pair::Pair;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use reload_lib::WatchMode;
use reload_lib::watch::FileWatch;
use tokio::time::Instant;

use crate::base::error::ConfigError;
use crate::base::readiness::Readiness;
use crate::kube::events::EventRecorder;
use crate::kube::sidecar::Sidecar;
use brake::Brake;
use decide::{Decision, Facts, HeldReason};
use pair::{Digest, Seen};
use process::{Lookup, Refused};

/// Without inotify, the files are looked at this often.
const POLL_WITHOUT_INOTIFY: Duration = Duration::from_secs(2);

/// What `restart-on-change` is asked to do (from the app shell's flags).
#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: crate::kube::connection::Settings,
    pub targets: Vec<Target>,
    /// Restarts of one container allowed within `restart_window`.
    pub max_restarts: usize,
    pub restart_window: Duration,
    /// The files and processes are looked at this often, besides inotify's wake-ups.
    pub recheck_interval: Duration,
    /// How often the servers re-read their pairs themselves (`None`: only at start).
    pub reload_period: Option<Duration>,
    pub metrics_listen: Option<SocketAddr>,
    /// This pod, for the Events.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

/// One container to restart and the pairs it reads only at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The container's name (Events, metrics, logs).
    pub container: String,
    /// What its process runs (`argv[0]`, the container's `command`).
    pub executable: PathBuf,
    pub pairs: Vec<Pair>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLabels {
    container: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HeldLabels {
    container: String,
    reason: &'static str,
}

/// The job's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    restarts: Family<ContainerLabels, Counter>,
    held: Family<HeldLabels, Counter>,
}

/// Registers the metrics (every container and reason at 0, so rates exist from the start) and
/// blocks readiness until each container's process has been seen once.
pub(crate) fn register(
    settings: &Settings,
    registry: &mut Registry,
    readiness: &Readiness,
) -> Result<Metrics, ConfigError> {
    let metrics = Metrics::default();
    registry.register(
        "cert_syncer_container_restarts",
        "Containers of this pod restarted (SIGTERM) because a pair they read only at start changed",
        metrics.restarts.clone(),
    );
    registry.register(
        "cert_syncer_container_restarts_held",
        "Restarts withheld, once per content and reason: invalid_pair (the new pair is unfit), \
         brake (too many restarts in the window), no_process (no single process to signal)",
        metrics.held.clone(),
    );
    for target in &settings.targets {
        let container = target.container.clone();
        let _ = metrics.restarts.get_or_create(&ContainerLabels {
            container: container.clone(),
        });
        for reason in HeldReason::ALL {
            let _ = metrics.held.get_or_create(&HeldLabels {
                container: container.clone(),
                reason: reason.label(),
            });
        }
        readiness.block(
            &readiness_key(target),
            format!(
                "no process of {} seen yet (shareProcessNamespace: true?)",
                target.executable.display()
            ),
        );
    }
    Ok(metrics)
}

fn readiness_key(target: &Target) -> String {
    format!("container/{}", target.container)
}

/// Runs until SIGTERM/SIGINT.
pub(crate) async fn run(
    settings: Settings,
    sidecar: Sidecar,
    metrics: Metrics,
) -> anyhow::Result<()> {
    let watch = FileWatch::new(
        settings
            .targets
            .iter()
            .flat_map(|t| &t.pairs)
            .flat_map(|p| [&p.cert, &p.key]),
    );
    let poll = match watch.mode() {
        WatchMode::Inotify => settings.recheck_interval,
        WatchMode::Polling(reason) => {
            tracing::warn!(%reason, "cannot watch the pairs' directories; polling them");
            settings.recheck_interval.min(POLL_WITHOUT_INOTIFY)
        }
    };
    let mut containers = Vec::new();
    for target in &settings.targets {
        let container = Container::start(target.clone(), &settings).await;
        tracing::info!(
            container = %target.container,
            executable = %target.executable.display(),
            pairs = ?target.pairs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "restarting the container when its pairs change to valid ones"
        );
        containers.push(container);
    }
    let job = Job {
        events: sidecar.events,
        readiness: sidecar.readiness,
        metrics,
    };
    loop {
        let mut next = poll;
        for container in &mut containers {
            if let Some(again) = container.evaluate(&job).await {
                next = next.min(again);
            }
        }
        tokio::select! {
            () = watch.changed() => {}
            () = tokio::time::sleep(next) => {}
            () = sidecar.shutdown.cancelled() => break,
        }
    }
    Ok(())
}

/// What every container's evaluation reports to.
struct Job {
    events: EventRecorder,
    readiness: Readiness,
    metrics: Metrics,
}

/// One container's state between evaluations.
struct Container {
    target: Target,
    reload_period: Option<Duration>,
    brake: Brake,
    /// The pairs' bytes when this sidecar started.
    baseline: Digest,
    /// The bytes of the last decision.
    decided: Option<Digest>,
    /// The process last found, the bytes it is known to have read and until when they are
    /// usable (`None`: unusable).
    process_has: Option<(process::Process, Digest, Option<SystemTime>)>,
    /// The bytes last left to the server's own re-read (logged once).
    left: Option<Digest>,
    /// Whether a single process has been found since this sidecar started.
    process_seen: bool,
    /// The bytes last seen, and since when.
    current: (Digest, Instant),
    /// The last withheld restart reported (once per bytes and reason).
    reported: Option<(Digest, HeldReason)>,
}

impl Container {
    async fn start(target: Target, settings: &Settings) -> Container {
        let seen = match look(&target).await {
            Some((seen, _)) => seen,
            None => pair::read(&target.pairs, crate::base::time::unix_now()),
        };
        Container {
            reload_period: settings.reload_period,
            brake: Brake::new(settings.max_restarts, settings.restart_window),
            baseline: seen.digest,
            decided: None,
            process_has: None,
            left: None,
            process_seen: false,
            current: (seen.digest, Instant::now()),
            reported: None,
            target,
        }
    }

    /// Looks at the pairs and the process and acts; `Some(after)` to be looked at again then.
    async fn evaluate(&mut self, job: &Job) -> Option<Duration> {
        let Some((seen, process)) = look(&self.target).await else {
            return Some(Duration::from_secs(1));
        };
        if seen.digest != self.current.0 {
            self.current = (seen.digest, Instant::now());
        }
        if matches!(process, Lookup::Found(_)) && !self.process_seen {
            self.process_seen = true;
            job.readiness.clear(&readiness_key(&self.target));
        }
        let brake = self.brake.holds();
        let (process_has, held_usable_until) = match (&process, &self.process_has) {
            (Lookup::Found(found), Some((known, digest, usable))) if found.is(known) => {
                (Some(digest), *usable)
            }
            _ => (None, None),
        };
        let decision = decide::decide(&Facts {
            seen: &seen,
            unchanged_for: self.current.1.elapsed(),
            process_has,
            decided: self.decided.as_ref(),
            baseline: &self.baseline,
            process: &process,
            process_seen_before: self.process_seen,
            held_usable_until,
            reload: self.reload_period.map(|period| (period, SystemTime::now())),
            brake,
        });
        match decision {
            Decision::Nothing => None,
            Decision::AlreadyRead => {
                tracing::debug!(container = %self.target.container, "the running process read the pairs at its start");
                if let Lookup::Found(found) = process {
                    self.process_has = Some((found, seen.digest, usable_until(&seen)));
                }
                self.decided = Some(seen.digest);
                None
            }
            Decision::Wait(after) => Some(after),
            Decision::LeftToServer(due) => {
                if self.left != Some(seen.digest) {
                    self.left = Some(seen.digest);
                    tracing::info!(
                        container = %self.target.container,
                        due_in_seconds = due.as_secs(),
                        "new pairs left to the server's own re-read: what it runs with stays valid until after it"
                    );
                }
                Some(due)
            }
            Decision::Restart(process) => self.restart(job, &seen, &process).await,
            Decision::Hold { reason, detail } => {
                self.hold(job, &seen, reason, &detail).await;
                match reason {
                    HeldReason::InvalidPair => {
                        self.decided = Some(seen.digest);
                        None
                    }
                    HeldReason::Brake => brake,
                    HeldReason::NoProcess => None,
                }
            }
        }
    }

    async fn restart(
        &mut self,
        job: &Job,
        seen: &Seen,
        process: &process::Process,
    ) -> Option<Duration> {
        let target = &self.target;
        match process::terminate(process) {
            Ok(()) => {
                self.brake.record();
                self.decided = Some(seen.digest);
                job.metrics
                    .restarts
                    .get_or_create(&ContainerLabels {
                        container: target.container.clone(),
                    })
                    .inc();
                let leaves = match &seen.verdict {
                    Ok(leaves) => leaves
                        .iter()
                        .map(|l| {
                            format!(
                                "serial {} valid until {}",
                                l.serial,
                                crate::base::time::rfc3339(l.not_after)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                    Err(_) => String::new(),
                };
                let message = format!(
                    "SIGTERM to container {} (pid {}, {}): {} changed after it started to a \
                     valid pair ({leaves}); the kubelet starts it again",
                    target.container,
                    process.pid,
                    target.executable.display(),
                    pairs_text(target),
                );
                tracing::info!(container = %target.container, pid = process.pid, %message, "restarting container");
                job.events
                    .record(
                        "RestartingContainer",
                        &format!("container/{}/pid/{}", target.container, process.pid),
                        message,
                        false,
                    )
                    .await;
                None
            }
            // Gone between the look and the signal: a container between lives; look again soon.
            Err(Refused::Gone) => Some(Duration::from_secs(1)),
            Err(Refused::NotPermitted(why)) => {
                let detail = format!(
                    "the kernel refused SIGTERM to pid {}: {why} (does the sidecar run as the \
                     container's user?)",
                    process.pid
                );
                self.hold(job, seen, HeldReason::NoProcess, &detail).await;
                None
            }
        }
    }

    /// Reports a withheld restart once per bytes and reason.
    async fn hold(&mut self, job: &Job, seen: &Seen, reason: HeldReason, detail: &str) {
        if self.reported == Some((seen.digest, reason)) {
            return;
        }
        self.reported = Some((seen.digest, reason));
        let target = &self.target;
        job.metrics
            .held
            .get_or_create(&HeldLabels {
                container: target.container.clone(),
                reason: reason.label(),
            })
            .inc();
        let message = format!(
            "not restarting container {} for {}: {detail}",
            target.container,
            pairs_text(target)
        );
        tracing::warn!(container = %target.container, reason = reason.label(), %message, "restart held");
        let digest: String = seen.digest[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        job.events
            .record(
                reason.event_reason(),
                &format!("container/{}/{digest}", target.container),
                message,
                true,
            )
            .await;
    }
}

/// Until when fit pairs are usable (the earliest notAfter); `None` for unfit ones.
fn usable_until(seen: &Seen) -> Option<SystemTime> {
    let leaves = seen.verdict.as_ref().ok()?;
    let earliest = leaves.iter().map(|leaf| leaf.not_after).min()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(earliest).ok()?))
}

fn pairs_text(target: &Target) -> String {
    target
        .pairs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The pairs and the process, read off the runtime's workers (files and `/proc`); `None` when
/// the blocking pool is gone (only at shutdown).
async fn look(target: &Target) -> Option<(Seen, Lookup)> {
    let (pairs, executable) = (target.pairs.clone(), target.executable.clone());
    let work = tokio::task::spawn_blocking(move || {
        let seen = pair::read(&pairs, crate::base::time::unix_now());
        (seen, process::find(&executable))
    });
    work.await.ok()
}
