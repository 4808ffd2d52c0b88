//! One worker per named object, fed by whichever way the object is followed (its own watcher in
//! `follow.rs`, or the namespace-wide dispatcher in `namespace.rs`) through a [`Slot`] holding at
//! most one pending state: a newer state replaces an older one not yet written (bursts
//! coalesce, writes land in order). A failed write is retried with backoff ([`Retry`]) until it
//! settles or a newer state arrives; every resync period the settled state is re-applied to the
//! disk from memory ([`Resync`]). Each attempt holds one of the `--write-parallelism` permits.
//!
//! # When a watched state is confirmed with a live GET ([`needs_live_get`])
//! Only before files are removed. Every state in hand comes from a quorum list (kube's
//! `ListSemantic::MostRecent`, also for a watcher with a `metadata.name` selector) or from the
//! watch that follows it in resourceVersion order, so a GET would return the same object (or a
//! newer one whose event is already on its way) at the price of one request per object: at
//! start-up, the GET storm namespace-wide following exists to avoid. Removal is the one
//! destructive step: an optional object that is deleted (or missing from a relist) while it has
//! files is confirmed absent with a live GET first, as library-go's certsyncpod does; if the GET
//! finds it, the live object is written instead.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::ExponentialBackoff;
use kube::Api;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use super::apply::{Applier, Desired};
use super::settings::ObjectSpec;
use super::shared::Follower;
use crate::base::backoff::doubling;
use crate::kube::decode::Raw;
use crate::kube::fetched::ToFetched;

/// Hands a state from a watcher to one object's worker: the newest state replaces one the
/// worker has not taken yet.
#[derive(Debug, Default)]
pub(super) struct Slot {
    desired: Mutex<Option<Desired>>,
    notify: Notify,
}

impl Slot {
    pub(super) fn put(&self, desired: Desired) {
        *self.desired.lock().unwrap_or_else(|p| p.into_inner()) = Some(desired);
        // Stores a permit when the worker is busy, so the state is picked up after the write.
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Desired> {
        self.desired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// Starts the worker of `object`: the slot to feed it, and its task (ends at shutdown).
pub(super) fn spawn<K>(
    context: &Arc<Follower>,
    api: &Api<Raw<K>>,
    object: &ObjectSpec,
) -> (Arc<Slot>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + ToFetched + Send + Sync + 'static,
{
    let slot = Arc::new(Slot::default());
    let task = tokio::spawn(work(
        Arc::clone(context),
        api.clone(),
        object.clone(),
        Arc::clone(&slot),
    ));
    (slot, task)
}

/// Applies each state handed over, retries a failed one with backoff until it settles or a
/// newer state replaces it, and re-applies the settled state to the disk every resync period.
async fn work<K>(context: Arc<Follower>, api: Api<Raw<K>>, object: ObjectSpec, slot: Arc<Slot>)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + ToFetched,
{
    let mut pending: Option<Desired> = None;
    let mut settled_state: Option<Desired> = None;
    let mut retry = Retry::default();
    let mut resync = Resync::new(context.resync_interval);
    loop {
        tokio::select! {
            () = slot.notify.notified() => {
                let Some(desired) = slot.take() else { continue };
                pending = Some(desired);
                retry.reset();
            }
            () = retry.wait() => {}
            () = resync.tick() => {
                // A pending retry re-applies everything anyway; a failed repair is logged and
                // tried again at the next tick (never a request).
                if let (None, Some(desired)) = (&pending, &settled_state) {
                    let _permit = context.write_permit().await;
                    context.applier.resync(&object, desired).await;
                }
                continue;
            }
            () = context.shutdown.cancelled() => return,
        }
        let Some(desired) = pending.take() else {
            continue;
        };
        let (settled, applied) = {
            let _permit = context.write_permit().await;
            let span = tracing::info_span!("sync", object = %object.label(), secret.namespace = %context.applier.settings.namespace, retry = ?retry.delay());
            apply(&context, &object, &api, desired)
                .instrument(span)
                .await
        };
        if settled {
            settled_state = Some(applied);
        } else {
            pending = Some(applied);
        }
        retry.after(settled);
    }
}

/// The GET-after-watch policy, the one place it is decided (see the module doc): a watched
/// state is confirmed with a live GET only when it would remove files.
fn needs_live_get(applier: &Applier, object: &ObjectSpec, desired: &Desired) -> bool {
    matches!(desired, Desired::Absent) && object.may_get_live() && applier.holds_files(object)
}

/// Writes or removes; returns whether it settled (`false`: worth retrying) and the state it
/// applied: `desired`, or what the live GET found instead.
async fn apply<K>(
    context: &Follower,
    object: &ObjectSpec,
    api: &Api<Raw<K>>,
    desired: Desired,
) -> (bool, Desired)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + ToFetched,
{
    if !needs_live_get(&context.applier, object, &desired) {
        return (context.applier.apply(object, &desired).await, desired);
    }
    match context.get(object, api).await {
        Some(live) => (context.applier.apply(object, &live).await, live),
        // Without a confirmation the disk stays as it is; retried with backoff.
        None => (false, desired),
    }
}

/// First retry of a failed write, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The backoff of one object's failed writes (backon's exponential backoff, without jitter:
/// one object retries alone): none while settled; 0.5 s after the first failure, doubling up to
/// 60 s while they keep failing.
#[derive(Debug, Default)]
pub(super) struct Retry {
    delays: Option<ExponentialBackoff>,
    delay: Option<Duration>,
    /// When the retry is due (tokio's clock, so tests can pause it).
    due: Option<Instant>,
}

impl Retry {
    /// Records an attempt's outcome: settled clears the backoff, a failure schedules the next
    /// retry after the next delay.
    pub fn after(&mut self, settled: bool) {
        if settled {
            *self = Retry::default();
            return;
        }
        let delay = self
            .delays
            .get_or_insert_with(|| doubling(RETRY_FIRST, RETRY_MAX))
            .next()
            .unwrap_or(RETRY_MAX);
        self.delay = Some(delay);
        self.due = Some(Instant::now() + delay);
    }

    /// Forgets the backoff (a new state arrived: it is tried at once).
    pub fn reset(&mut self) {
        *self = Retry::default();
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
pub(super) struct Resync(Option<tokio::time::Interval>);

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
    async fn failed_writes_back_off_doubling_to_a_minute_and_a_success_clears_it() {
        let mut retry = Retry::default();
        assert!(retry.due.is_none());
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
        assert!(retry.due.is_none());
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

    #[tokio::test]
    async fn a_newer_state_replaces_one_not_taken_yet() {
        let slot = Slot::default();
        slot.put(Desired::Absent);
        slot.put(Desired::Present(crate::kube::fetched::Fetched {
            resource_version: "2".to_owned(),
            data: Default::default(),
        }));
        slot.notify.notified().await;
        assert!(matches!(slot.take(), Some(Desired::Present(f)) if f.resource_version == "2"));
        assert!(slot.take().is_none());
    }

    #[tokio::test]
    async fn only_an_absence_that_would_remove_files_is_confirmed_with_a_get() {
        let dir = tempfile::tempdir().unwrap();
        let applier = crate::sync::apply::tests::applier(dir.path(), Vec::new());
        let optional = ObjectSpec {
            kind: crate::base::kind::Kind::Secret,
            name: "a".to_owned(),
            required: false,
            mirror: true,
        };
        let required = ObjectSpec {
            required: true,
            ..optional.clone()
        };
        let present = Desired::Present(crate::kube::fetched::Fetched {
            resource_version: "1".to_owned(),
            data: Default::default(),
        });
        // Nothing on disk yet: nothing to remove, nothing to confirm.
        assert!(!needs_live_get(&applier, &optional, &Desired::Absent));
        std::fs::create_dir_all(dir.path().join("secrets/a")).unwrap();
        assert!(needs_live_get(&applier, &optional, &Desired::Absent));
        // A required object keeps its files; a present state is written as watched.
        assert!(!needs_live_get(&applier, &required, &Desired::Absent));
        assert!(!needs_live_get(&applier, &optional, &present));
    }
}
