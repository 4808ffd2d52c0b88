//! The reload loop shared by server and client sets: wake on change → read → parse and check →
//! publish, keeping the last good material on any failure.
//!
//! Discipline: one task per set, so at most one reload is in flight and results publish in order;
//! wake-ups that arrive during a reload are coalesced into one more pass (the `Notify` permit is
//! the dirty flag). A failed pass is retried shortly after (torn in-place writes converge without
//! waiting for the resync), with exponential backoff.
//!
//! A pass re-reads what the watcher marked (a file, or a directory for `..data` swaps), not the
//! whole set; explicit reloads, resyncs, polls and queue overflows mark everything. The material
//! compares content per source, so only sources whose bytes changed are parsed again.
//!
//! A certificate and key kept in two files are usually replaced one after the other (two
//! renames). When an event names only one of them, the pass waits for the other's event, at
//! most `Timing::pair_wait` (10 ms): a rotation then costs one pass, where it used to cost a
//! pass that read the new certificate with the old key, parsed both, rejected the pair and
//! counted a failed reload (0.88–0.98 such passes per rotation, BENCHMARKS.md "Rotations"). A
//! pass that still catches a pair half way (the writer was slower than the wait; a poll) is
//! retried and reported only if the pair still does not match after `Timing::torn_grace`; a
//! key that does not match is never published either way.
//!
//! Where a pass runs: inline on the crate's own runtime thread (see `runtime`), never on the
//! caller's async workers, and never on tokio's blocking pool. The files are opened
//! non-blocking and only regular files within the size cap are read (see `read`), so a FIFO, a
//! device or a huge file is refused without blocking; the remaining risk, a hung filesystem, is
//! covered by a watchdog that reports the stuck pass after the read timeout. Measured (see
//! BENCHMARKS.md, "Reload pass after the hardening"): sending each pass to the blocking pool and
//! back under `tokio::time::timeout` cost two thread hand-offs per pass, which made a pass and a
//! `reload()` round trip markedly slower than reading inline; the watchdog costs an uncontended
//! lock per pass. Only the start-up pass, which runs before the set has a task, goes to the
//! blocking pool under the timeout, so `start()` fails with `ReadTimeout` instead of hanging.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::status::{Served, ServedCert, Status};
use crate::watch::{Changes, Dirty, Interest, Subscription, WatchMode, subscribe};

/// Something the reloader can (re)build from files.
pub(crate) trait Material: Send + 'static {
    /// What gets published.
    type Snapshot: Send + Sync + 'static;

    /// The files to watch.
    fn interest(&self) -> Interest;

    /// One pass: reads what `dirty` marks (plus whatever the material itself is retrying), checks
    /// it and builds a new snapshot when something changed. Without `current` (start-up) `dirty`
    /// marks everything and any rejection fails the start. `now` is seconds since the Unix epoch.
    fn load(
        &mut self,
        current: Option<&Self::Snapshot>,
        dirty: Dirty,
        now: i64,
    ) -> Pass<Self::Snapshot>;

    /// What a snapshot serves, for logs, status and metrics.
    fn served(snapshot: &Self::Snapshot) -> Served;

    /// Whether `dirty` names one file of a certificate/key pair kept in two files and not the
    /// other: a writer that renames the two one after the other is then half way, and a pass
    /// now would read the new certificate with the old key (or the reverse), parse both and
    /// reject them. The task waits for the partner's event, at most [`Timing::pair_wait`].
    fn awaits_partner(&self, _dirty: &Dirty) -> bool {
        false
    }

    /// Whether every rejection of the last pass was a pair caught between its two writes: the
    /// key does not match the certificate and only one of the two files changed since the pair
    /// was last accepted. Reported only if it persists for [`Timing::torn_grace`].
    fn rejected_mid_write(&self) -> bool {
        false
    }
}

/// The outcome of one [`Material::load`] pass.
pub(crate) struct Pass<S> {
    /// The snapshot to publish, when something changed and passed the checks.
    pub(crate) snapshot: Option<S>,
    /// What `snapshot` serves that was not served before (for the log).
    pub(crate) newly_served: Vec<Arc<ServedCert>>,
    /// The first rejection of the pass. Other sources' changes may still be in `snapshot`: one
    /// bad source keeps its last good material without holding the others back.
    pub(crate) rejected: Option<Error>,
    /// Sources whose files were read.
    pub(crate) sources_read: usize,
    /// Sources whose content differed from what is served, so were parsed and checked again.
    pub(crate) sources_parsed: usize,
    /// Files read through a symlink to a file elsewhere ([`PassReader::into_symlinks`]).
    ///
    /// [`PassReader::into_symlinks`]: crate::source::PassReader::into_symlinks
    pub(crate) symlinks: Vec<std::path::PathBuf>,
}

impl<S> Pass<S> {
    /// A pass that failed as a whole.
    pub(crate) fn failed(err: Error, sources_read: usize) -> Self {
        Self {
            snapshot: None,
            newly_served: Vec::new(),
            rejected: Some(err),
            sources_read,
            sources_parsed: sources_read,
            symlinks: Vec::new(),
        }
    }
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
    /// How long one pass (reading and checking) may take before it is reported as hung.
    pub(crate) read_timeout: Duration,
    /// How long a pass is put off for the partner of a pair file that changed alone (see
    /// [`Material::awaits_partner`]); a certificate renewed alone is published this much later.
    pub(crate) pair_wait: Duration,
    /// How long a pair caught between its two writes is retried before it is reported as a
    /// failed reload (see [`Material::rejected_mid_write`]).
    pub(crate) torn_grace: Duration,
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
            read_timeout: Duration::from_secs(30),
            pair_wait: Duration::from_millis(10),
            torn_grace: Duration::from_millis(250),
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
    changes: Arc<Changes>,
    commands: mpsc::Sender<oneshot::Sender<Result<bool>>>,
    /// Dropped with the handle: helpers that live as long as the set (the SIGHUP task) watch it.
    alive: tokio::sync::watch::Sender<()>,
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

    /// Schedules a pass that re-reads everything, without waiting (coalesced with any pending
    /// one).
    pub(crate) fn trigger(&self) {
        self.changes.mark_all();
    }

    /// Resolves when the handle (so the set) is dropped.
    pub(crate) fn dropped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut alive = self.alive.subscribe();
        async move { while alive.changed().await.is_ok() {} }
    }
}

/// Arms the watches, loads once (the result is the start-up error, if any), then spawns the
/// reload task on the crate's runtime (see `runtime`), so the set keeps reloading whatever
/// happens to the caller's runtime.
pub(crate) async fn start<M: Material>(
    material: M,
    timing: Timing,
    name: String,
) -> Result<Handle<M::Snapshot>>
where
    M::Snapshot: 'static,
{
    let changes = Arc::new(Changes::default());
    // Watches first, then the first read: a change between the two is then never missed.
    let (subscription, mode) = if timing.force_poll {
        (
            None,
            WatchMode::Polling("polling was configured".to_owned()),
        )
    } else {
        subscribe(&material.interest(), Arc::clone(&changes))
    };
    if let WatchMode::Polling(reason) = &mode {
        tracing::warn!(set = %name, %reason, poll_interval = ?timing.poll, "watching by polling");
    }
    let now = unix_now();
    let started = std::time::Instant::now();
    // Anything marked before this read is in it.
    changes.take();
    let limit = timing.read_timeout;
    let first_pass = crate::runtime::get().spawn(async move {
        let pass = tokio::task::spawn_blocking(move || {
            let mut material = material;
            let pass = material.load(None, Dirty::all(), now);
            (material, pass)
        });
        tokio::time::timeout(limit, pass).await
    });
    let (material, pass) = match first_pass.await {
        Ok(Ok(Ok(done))) => done,
        Ok(Ok(Err(panicked))) | Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
        // The pass goes on in the background and is dropped when it ends.
        Ok(Err(_elapsed)) => {
            return Err(Error::ReadTimeout {
                set: name,
                timeout: limit,
            });
        }
    };
    if let Some(err) = pass.rejected {
        return Err(err);
    }
    if let Some(subscription) = &subscription {
        subscription.follow(&pass.symlinks);
    }
    let first = pass
        .snapshot
        .expect("a pass without a current snapshot builds one or is rejected");
    log_served(&name, &pass.newly_served, now);
    let status = Status {
        generation: 1,
        served: M::served(&first),
        reloads_ok: 1,
        reloads_failed: 0,
        last_error: None,
        passes: 1,
        last_success_unix: now,
        last_reload_duration: started.elapsed(),
        last_reload_sources_read: pass.sources_read,
        last_reload_sources_parsed: pass.sources_parsed,
    };
    let (status_tx, status_rx) = tokio::sync::watch::channel(status);
    let current = Arc::new(ArcSwap::from_pointee(first));
    let (commands, command_rx) = mpsc::channel(8);
    let (alive, _) = tokio::sync::watch::channel(());
    let on_stuck = stuck_reporter(status_tx.clone(), name.clone(), timing.read_timeout);
    let task = Task {
        material,
        on_stuck,
        current: Arc::clone(&current),
        status: status_tx,
        changes: Arc::clone(&changes),
        commands: command_rx,
        timing,
        polling: matches!(mode, WatchMode::Polling(_)),
        name,
        subscription,
        failing_since: None,
        warned: None,
        retry_delay: None,
        partner_deadline: None,
        torn_since: None,
    };
    crate::runtime::get().spawn(task.run());
    Ok(Handle {
        current,
        status: status_rx,
        mode,
        changes,
        commands,
        alive,
    })
}

struct Task<M: Material> {
    material: M,
    /// Reports a pass of this set that outlives the read timeout (see `runtime::watchdog`).
    on_stuck: crate::runtime::OnStuck,
    current: Arc<ArcSwap<M::Snapshot>>,
    status: tokio::sync::watch::Sender<Status>,
    changes: Arc<Changes>,
    commands: mpsc::Receiver<oneshot::Sender<Result<bool>>>,
    timing: Timing,
    polling: bool,
    name: String,
    subscription: Option<Subscription>,
    /// Start of the current run of failed attempts.
    failing_since: Option<Instant>,
    /// The message last logged at warn level, so a persisting failure is logged once.
    warned: Option<String>,
    /// Delay before the next retry, while failing.
    retry_delay: Option<Duration>,
    /// While a pass waits for the partner of a pair file that changed alone: when it runs
    /// anyway.
    partner_deadline: Option<Instant>,
    /// Since when passes have caught a pair between its two writes, not yet reported.
    torn_since: Option<Instant>,
}

impl<M: Material> Task<M> {
    async fn run(mut self) {
        let mut next_resync = self.resync_interval().map(|d| Instant::now() + d);
        loop {
            if !self.polling && self.changes.is_degraded() {
                tracing::warn!(set = %self.name, poll_interval = ?self.timing.poll, "directories can no longer be watched; polling");
                self.polling = true;
                next_resync = self.resync_interval().map(|d| Instant::now() + d);
            }
            let retry_at = self.retry_delay.map(|d| Instant::now() + d);
            tokio::select! {
                command = self.commands.recv() => match command {
                    // Every handle is gone: nobody can use what we would publish.
                    None => return,
                    Some(reply) => {
                        // An explicit reload also repairs the watches, as the resync does.
                        if let Some(subscription) = &self.subscription {
                            subscription.repair();
                        }
                        let outcome = self.attempt(Dirty::all());
                        let _ = reply.send(outcome);
                    }
                },
                () = self.changes.notified() => {
                    // A fresh event restarts the retry schedule.
                    self.retry_delay = None;
                    if !self.waits_for_partner() {
                        let _ = self.attempt(Dirty::default());
                    }
                }
                () = sleep_until(self.partner_deadline), if self.partner_deadline.is_some() => {
                    // The partner did not come: read what is there.
                    let _ = self.attempt(Dirty::default());
                }
                () = sleep_until(retry_at), if retry_at.is_some() => {
                    // The material re-reads the sources it rejected.
                    let _ = self.attempt(Dirty::default());
                }
                () = sleep_until(next_resync), if next_resync.is_some() => {
                    tracing::trace!(set = %self.name, "periodic resync");
                    // Watches first: whatever inotify could not report is watched again before
                    // the files are compared.
                    if let Some(subscription) = &self.subscription {
                        subscription.repair();
                    }
                    let _ = self.attempt(Dirty::all());
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

    /// After a wake-up: whether the pass waits for the partner of a pair file that changed
    /// alone (see [`Material::awaits_partner`]), until the partner's event or
    /// [`Timing::pair_wait`] after the first file's, whichever comes first. A certificate and
    /// key renamed one after the other then cost one pass, not a rejected one and a good one.
    fn waits_for_partner(&mut self) -> bool {
        let material = &self.material;
        if !self.changes.inspect(|dirty| material.awaits_partner(dirty)) {
            return false;
        }
        let now = Instant::now();
        let deadline = *self
            .partner_deadline
            .get_or_insert(now + self.timing.pair_wait);
        now < deadline
    }

    /// One reload pass over what `dirty` and the watcher marked. Publishes what changed and
    /// passed the checks; on a rejection keeps the rejected source's last good material and
    /// schedules a retry.
    fn attempt(&mut self, mut dirty: Dirty) -> Result<bool> {
        self.partner_deadline = None;
        let span = tracing::debug_span!("reload", set = %self.name);
        let _entered = span.enter();
        // Take the marks before reading: a change after this point wakes another pass.
        dirty.merge(self.changes.take());
        let now = unix_now();
        let started = std::time::Instant::now();
        let current = self.current.load_full();
        // Inline on the crate's runtime thread, watched for a hung filesystem (module docs).
        let watch =
            crate::runtime::watchdog::watch(self.timing.read_timeout, Arc::clone(&self.on_stuck));
        let pass = self.material.load(Some(&current), dirty, now);
        if watch.finish() {
            // Reported as stuck: what it read may be long outdated.
            self.changes.mark_all();
        }
        if let Some(subscription) = &self.subscription {
            subscription.follow(&pass.symlinks);
        }
        // Counted silently: a pass that changes nothing must not wake subscribers.
        self.status.send_if_modified(|status| {
            status.passes += 1;
            false
        });
        self.finish(pass, now, started)
    }

    /// Publishes what a pass built and records its outcome.
    fn finish(
        &mut self,
        pass: Pass<M::Snapshot>,
        now: i64,
        started: std::time::Instant,
    ) -> Result<bool> {
        let published = pass.snapshot.is_some();
        if let Some(snapshot) = pass.snapshot {
            let served = M::served(&snapshot);
            let took = started.elapsed();
            let clean = pass.rejected.is_none();
            let current = &self.current;
            self.status.send_modify(|status| {
                // The swap happens under the status lock: whoever is served the new material
                // (a handshake) and then reads the status sees this pass recorded, and whoever
                // reads this pass in the status is served its material. Handshakes never take
                // this lock; only status readers wait, for the few stores below.
                current.store(Arc::new(snapshot));
                status.generation += 1;
                status.served = served;
                status.reloads_ok += 1;
                if clean {
                    status.last_error = None;
                }
                status.last_success_unix = now;
                status.last_reload_duration = took;
                status.last_reload_sources_read = pass.sources_read;
                status.last_reload_sources_parsed = pass.sources_parsed;
            });
            log_served(&self.name, &pass.newly_served, now);
        }
        match pass.rejected {
            None if published => {
                self.recovered();
                Ok(true)
            }
            None => {
                if self.failing_since.is_some() {
                    tracing::info!(set = %self.name, "files again hold the served material");
                    self.status.send_modify(|status| status.last_error = None);
                }
                self.recovered();
                Ok(false)
            }
            Some(err) => self.rejected(err),
        }
    }

    /// Records a rejected pass (the last good material stays) and schedules a retry. A pair
    /// caught between its two writes is only retried, and reported once it persists for
    /// [`Timing::torn_grace`] (the other file's event usually ends it within a millisecond).
    fn rejected(&mut self, err: Error) -> Result<bool> {
        self.retry_delay = Some(match self.retry_delay {
            None => self.timing.retry_min,
            Some(delay) => (delay * 2).min(self.timing.retry_max),
        });
        if self.material.rejected_mid_write() {
            let torn_since = *self.torn_since.get_or_insert_with(Instant::now);
            if torn_since.elapsed() < self.timing.torn_grace {
                tracing::debug!(set = %self.name, error = %err, "pair caught between its two writes; retrying");
                return Err(err);
            }
        } else {
            self.torn_since = None;
        }
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
        Err(Arc::try_unwrap(err).unwrap_or_else(Error::Retained))
    }

    fn recovered(&mut self) {
        self.torn_since = None;
        self.failing_since = None;
        self.warned = None;
        self.retry_delay = None;
    }
}

/// What the watchdog does when a pass outlives the read timeout: the same as a rejection (the
/// last good material keeps serving, the error is in `Status`), from the watchdog's thread. The
/// pass publishes its outcome normally if it ever ends.
fn stuck_reporter(
    status: tokio::sync::watch::Sender<Status>,
    set: String,
    timeout: Duration,
) -> crate::runtime::OnStuck {
    Arc::new(move || {
        let err = Error::ReadTimeout {
            set: set.clone(),
            timeout,
        };
        tracing::warn!(set = %set, error = &err as &dyn std::error::Error, "reload pass stuck; keeping the last good material");
        let err = Arc::new(err);
        status.send_modify(|status| {
            status.reloads_failed += 1;
            status.last_error = Some(err);
        });
    })
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// One info line per certificate that is new in this snapshot.
fn log_served(set: &str, newly_served: &[Arc<ServedCert>], now: i64) {
    for cert in newly_served {
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
