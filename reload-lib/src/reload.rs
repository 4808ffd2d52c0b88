//! The reload loop shared by server and client sets: wake on change → read → parse and check →
//! publish, keeping the last good material on any failure.
//!
//! Discipline: one task per set, so at most one reload is in flight and results publish in order;
//! wake-ups that arrive during a reload are coalesced into one more pass (the `Notify` permit is
//! the dirty flag). A failed pass is retried shortly after (torn in-place writes converge without
//! waiting for the resync), with exponential backoff.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::material::CertInfo;
use crate::watch::{Interest, Subscription, WatchMode, subscribe};

/// Something the reloader can (re)build from files.
pub(crate) trait Material: Send + 'static {
    /// What gets published.
    type Snapshot: Send + Sync + 'static;

    /// The files to watch.
    fn interest(&self) -> Interest;

    /// Reads and checks everything. `Ok(None)` when the content equals what `current` was built
    /// from. `now` is seconds since the Unix epoch.
    fn load(
        &mut self,
        current: Option<&Self::Snapshot>,
        now: i64,
    ) -> Result<Option<Self::Snapshot>>;

    /// What a snapshot serves, for logs, status and metrics.
    fn describe(snapshot: &Self::Snapshot) -> Vec<ServedCert>;
}

/// One certificate in use, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServedCert {
    /// Its role: `default`, `sni:<name>`, `client-ca`, `identity` or `roots`.
    pub source: String,
    /// The file it was read from.
    pub path: std::path::PathBuf,
    /// Subject, SANs, serial, fingerprint and validity.
    pub info: CertInfo,
}

/// The state of a reloadable set, published to subscribers on every reload attempt that changes
/// something (a new generation, or a new failure).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Status {
    /// Increases by one with every published snapshot; 1 after start-up.
    pub generation: u64,
    /// What is served now.
    pub served: Arc<[ServedCert]>,
    /// Successful reloads that published a new snapshot (start-up included).
    pub reloads_ok: u64,
    /// Reload attempts that were rejected (bad, torn or unreadable material).
    pub reloads_failed: u64,
    /// The most recent failure, cleared when the files again hold what is served or something
    /// newer is published.
    pub last_error: Option<Arc<Error>>,
    /// When the last snapshot was published, seconds since the Unix epoch.
    pub last_success_unix: i64,
    /// How long the pass that built the current snapshot took: reading, parsing, checking,
    /// building the configuration and publishing it.
    pub last_reload_duration: Duration,
}

/// Tuning shared by server and client sets.
#[derive(Debug, Clone)]
pub(crate) struct Timing {
    pub(crate) resync: Option<Duration>,
    pub(crate) poll: Duration,
    pub(crate) retry_min: Duration,
    pub(crate) retry_max: Duration,
    pub(crate) warn_after: Duration,
    pub(crate) force_poll: bool,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            resync: Some(Duration::from_secs(60)),
            poll: Duration::from_secs(1),
            retry_min: Duration::from_millis(20),
            retry_max: Duration::from_secs(5),
            warn_after: Duration::from_secs(1),
            force_poll: false,
        }
    }
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What the handles share with the task.
pub(crate) struct Handle<S> {
    pub(crate) current: Arc<ArcSwap<S>>,
    pub(crate) status: tokio::sync::watch::Receiver<Status>,
    pub(crate) mode: WatchMode,
    wake: Arc<Notify>,
    commands: mpsc::Sender<oneshot::Sender<Result<bool>>>,
}

impl<S> std::fmt::Debug for Handle<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("generation", &self.status.borrow().generation)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<S> Handle<S> {
    /// Asks for a reload pass and waits for its outcome: `Ok(true)` when a new snapshot was
    /// published, `Ok(false)` when the files hold what is already served.
    pub(crate) async fn reload(&self) -> Result<bool> {
        let (reply, outcome) = oneshot::channel();
        self.commands
            .send(reply)
            .await
            .map_err(|_| Error::ReloaderGone)?;
        outcome.await.map_err(|_| Error::ReloaderGone)?
    }

    /// Schedules a reload pass without waiting (coalesced with any pending one).
    pub(crate) fn trigger(&self) {
        self.wake.notify_one();
    }
}

/// Arms the watches, loads once (the result is the start-up error, if any), then spawns the
/// reload task on the current tokio runtime.
pub(crate) fn start<M: Material>(
    mut material: M,
    timing: Timing,
    name: String,
) -> Result<Handle<M::Snapshot>>
where
    M::Snapshot: 'static,
{
    let wake = Arc::new(Notify::new());
    // Watches first, then the first read: a change between the two is then never missed.
    let (subscription, mode) = if timing.force_poll {
        (
            None,
            WatchMode::Polling("polling was configured".to_owned()),
        )
    } else {
        subscribe(&material.interest(), Arc::clone(&wake))
    };
    if let WatchMode::Polling(reason) = &mode {
        tracing::warn!(set = %name, %reason, poll_interval = ?timing.poll, "watching by polling");
    }
    let now = unix_now();
    let started = std::time::Instant::now();
    let first = material
        .load(None, now)?
        .expect("a load without a current snapshot always builds one");
    let served: Arc<[ServedCert]> = M::describe(&first).into();
    log_served(&name, &served, None, now);
    let status = Status {
        generation: 1,
        served,
        reloads_ok: 1,
        reloads_failed: 0,
        last_error: None,
        last_success_unix: now,
        last_reload_duration: started.elapsed(),
    };
    let (status_tx, status_rx) = tokio::sync::watch::channel(status);
    let current = Arc::new(ArcSwap::from_pointee(first));
    let (commands, command_rx) = mpsc::channel(8);
    let task = Task {
        material,
        current: Arc::clone(&current),
        status: status_tx,
        wake: Arc::clone(&wake),
        commands: command_rx,
        timing,
        polling: matches!(mode, WatchMode::Polling(_)),
        name,
        _subscription: subscription,
        failing_since: None,
        warned: None,
        retry_delay: None,
    };
    tokio::spawn(task.run());
    Ok(Handle {
        current,
        status: status_rx,
        mode,
        wake,
        commands,
    })
}

struct Task<M: Material> {
    material: M,
    current: Arc<ArcSwap<M::Snapshot>>,
    status: tokio::sync::watch::Sender<Status>,
    wake: Arc<Notify>,
    commands: mpsc::Receiver<oneshot::Sender<Result<bool>>>,
    timing: Timing,
    polling: bool,
    name: String,
    _subscription: Option<Subscription>,
    /// Start of the current run of failed attempts.
    failing_since: Option<Instant>,
    /// The message last logged at warn level, so a persisting failure is logged once.
    warned: Option<String>,
    /// Delay before the next retry, while failing.
    retry_delay: Option<Duration>,
}

impl<M: Material> Task<M> {
    async fn run(mut self) {
        let mut next_resync = self.resync_interval().map(|d| Instant::now() + d);
        loop {
            let retry_at = self.retry_delay.map(|d| Instant::now() + d);
            tokio::select! {
                command = self.commands.recv() => match command {
                    // Every handle is gone: nobody can use what we would publish.
                    None => return,
                    Some(reply) => {
                        let outcome = self.attempt();
                        let _ = reply.send(outcome);
                    }
                },
                () = self.wake.notified() => {
                    // A fresh event restarts the retry schedule.
                    self.retry_delay = None;
                    let _ = self.attempt();
                }
                () = sleep_until(retry_at), if retry_at.is_some() => {
                    let _ = self.attempt();
                }
                () = sleep_until(next_resync), if next_resync.is_some() => {
                    tracing::trace!(set = %self.name, "periodic resync");
                    let _ = self.attempt();
                    next_resync = self.resync_interval().map(|d| Instant::now() + d);
                }
            }
        }
    }

    fn resync_interval(&self) -> Option<Duration> {
        if self.polling {
            Some(self.timing.poll)
        } else {
            self.timing.resync
        }
    }

    /// One reload pass. Publishes on success; on failure keeps what is served and schedules a
    /// retry.
    fn attempt(&mut self) -> Result<bool> {
        let span = tracing::debug_span!("reload", set = %self.name);
        let _entered = span.enter();
        let now = unix_now();
        let started = std::time::Instant::now();
        let current = self.current.load_full();
        match self.material.load(Some(&current), now) {
            Ok(Some(snapshot)) => {
                let served: Arc<[ServedCert]> = M::describe(&snapshot).into();
                self.current.store(Arc::new(snapshot));
                let took = started.elapsed();
                let previous = self.status.borrow().served.clone();
                log_served(&self.name, &served, Some(&previous), now);
                self.status.send_modify(|status| {
                    status.generation += 1;
                    status.served = served;
                    status.reloads_ok += 1;
                    status.last_error = None;
                    status.last_success_unix = now;
                    status.last_reload_duration = took;
                });
                self.recovered();
                Ok(true)
            }
            Ok(None) => {
                if self.failing_since.is_some() {
                    tracing::info!(set = %self.name, "files again hold the served material");
                    self.status.send_modify(|status| status.last_error = None);
                }
                self.recovered();
                Ok(false)
            }
            Err(err) => {
                let since = *self.failing_since.get_or_insert_with(Instant::now);
                let message = err.to_string();
                // Writers that replace the certificate and the key one after the other (or
                // truncate and write) pass through torn states; warn only if it persists.
                if since.elapsed() >= self.timing.warn_after
                    && self.warned.as_deref() != Some(message.as_str())
                {
                    tracing::warn!(set = %self.name, error = &err as &dyn std::error::Error, "material rejected; keeping the last good material");
                    self.warned = Some(message);
                } else {
                    tracing::debug!(set = %self.name, error = %message, "material rejected; will retry");
                }
                let err = Arc::new(err);
                self.status.send_modify(|status| {
                    status.reloads_failed += 1;
                    status.last_error = Some(Arc::clone(&err));
                });
                self.retry_delay = Some(match self.retry_delay {
                    None => self.timing.retry_min,
                    Some(delay) => (delay * 2).min(self.timing.retry_max),
                });
                Err(Arc::try_unwrap(err).unwrap_or_else(Error::Retained))
            }
        }
    }

    fn recovered(&mut self) {
        self.failing_since = None;
        self.warned = None;
        self.retry_delay = None;
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// One info line per certificate that is new in this snapshot.
fn log_served(set: &str, served: &[ServedCert], previous: Option<&[ServedCert]>, now: i64) {
    for cert in served {
        let unchanged = previous.is_some_and(|previous| {
            previous
                .iter()
                .any(|p| p.source == cert.source && p.info.sha256 == cert.info.sha256)
        });
        if unchanged {
            continue;
        }
        let info = &cert.info;
        if info.is_expired_at(now) {
            tracing::warn!(set, source = %cert.source, cert.path = %cert.path.display(), cert.not_after = %info.not_after_rfc3339(), "serving an expired certificate: nothing better is available");
        }
        tracing::info!(
            set,
            source = %cert.source,
            cert.path = %cert.path.display(),
            cert.subject = %info.subject,
            cert.dns_names = ?info.dns_names,
            cert.ip_addresses = ?info.ip_addresses,
            cert.serial = %info.serial,
            cert.fingerprint = %info.sha256,
            cert.not_after = %info.not_after_rfc3339(),
            "now serving certificate"
        );
    }
}
