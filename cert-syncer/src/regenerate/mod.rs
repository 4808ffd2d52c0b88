//! `cert-syncer regenerate`: the regeneration controller (library-go `certrotation` with
//! "refresh only when expired" by default).
//!
//! - [`config`]: the YAML file of signers, bundles and targets, validated item by item;
//! - `profile`: built-in configs (`--profile openshift-kube-apiserver`) with the hostnames
//!   filled in; `cluster`: the cluster's values for them, read once at start (waiting for a
//!   kube-apiserver that cannot answer yet);
//! - `annotations`: OpenShift's labels and annotations, and the manual rotation trigger;
//! - `decide`: pure decisions from parsed certificates and the time;
//! - `crate::pki` (shared with `inspect`): parsing and generation (rcgen);
//! - `pass`: one pass: everything read once (`phases::read`, with the clock check), then one
//!   step per declared object (`phases`: signers, bundles, targets, intermediates, unions,
//!   copies; one file each, none calling another), run concurrently in the order of `graph`
//!   (what each step waits for; the needed chains first), with new keys made ahead on every CPU
//!   (`keys`); a step that issues from or publishes a CA waits until every bundle built from it
//!   holds it as stored (`trust`: a held or failed bundle write does not count as written);
//!   `ctx`: what every step works with (the inputs, the reads, the graph, the keys, the one
//!   `decide::Stored` state of a Secret); `write`: the one write (create or replace, conflict
//!   and re-read, owned Secret types, the trust wait, the brake and the Lease, Events off the
//!   write path) every object kind goes through; `objects`: how a managed Secret and a CA
//!   bundle look; `report`: what a pass did, failures typed (kind, object, reason);
//! - `intermediate`: the rules of intermediate CAs (the kube-controller-manager's
//!   `csr-signer`), the bundles built from them and their delayed publication (their steps are
//!   `phases::intermediates`); `phases::unions`, `phases::copies`: unions of bundles and plain
//!   copies of objects (resource-sync);
//! - `clock`: the apiserver's clock;
//! - `cache`: the declared objects as one list+watch per namespace and kind saw them (passes
//!   read there, not with a GET per object);
//! - `wait`: the start's wait for kube-apiserver: close for what heals by itself, said once for
//!   what does not (a CA file that does not trust it, a name that does not resolve);
//! - this module: the loop. A pass runs once every watched namespace has been listed, whenever
//!   a declared object changes, and when the next expiry (or rotation point) is reached: a timer
//!   aligned to the data, not a polling period. Failed passes are retried with backoff;
//! - `leadership`: with `--leader-elect`, the Lease taken, held and released, and where the
//!   brake's record is kept;
//! - `brake`: each object's write budget, escalating while a fight goes on and kept on the
//!   Lease (`brake::lease`), so a rule that does not settle or another controller that
//!   disagrees cannot make an endless write loop (Event `RegenerationLoop`, a metric,
//!   `/readyz`); `settle_tests` checks the rules settle over generated configs and states.
//!
//! Clock skew: each pass also reads the apiserver's clock (the `Date` of a `GET /version`) and decides at
//! `min(local, apiserver)` (`clocks`), so a local clock that jumped ahead expires, prunes and
//! replaces nothing still valid at the apiserver's time. A persistence rule (act on an expiry only
//! once it has been seen for N seconds) was not chosen: a jump persists as well, and `--once`
//! or a restart forget what was seen. A local clock behind the apiserver's is refused by
//! `decide::clock_check`; certificates in the future by both clocks were written while a clock
//! was ahead and are regenerated (`decide::not_yet_valid`) rather than blocking every pass.

mod annotations;
mod brake;
mod cache;
mod clock;
mod cluster;
pub mod config;
mod ctx;
mod decide;
mod graph;
mod intermediate;
#[cfg(test)]
mod intermediate_pass_tests;
mod keys;
mod leadership;
#[cfg(test)]
mod loop_tests;
mod metrics;
mod objects;
mod pass;
#[cfg(test)]
mod pass_tests;
mod phases;
mod profile;
pub mod release;
mod report;
mod settings;
#[cfg(test)]
mod settle_tests;
mod timer;
mod trust;
#[cfg(test)]
mod trust_pass_tests;
mod wait;
mod write;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub(crate) use cache::watch_plan;
pub use decide::Mode;
pub use profile::Profile;
pub(crate) use settings::Settings;

use crate::base::error::ConfigError;
use crate::base::readiness::Readiness;
use crate::base::time::unix_now;
use crate::kube::connection::Connection;
use crate::kube::events::EventRecorder;
use crate::kube::sidecar::Sidecar;
use brake::lease::LeaseRecord;
use cache::Cache;
use clock::clocks;
use cluster::Unavailable;
use leadership::Leadership;
use metrics::Metrics;
use pass::{Pass, Reads};
use report::Held;
use timer::PassTimer;
use wait::Waiting;

/// The controller's metrics, and readiness blocked until its first pass (with
/// `--leader-elect`, until the Lease is read: a standby is Ready while it can read the Lease;
/// it acts the moment it takes over, and a NotReady sidecar would make the static pod NotReady
/// on every master but one).
pub(crate) fn register(
    args: &Settings,
    registry: &mut Registry,
    readiness: &Readiness,
) -> Result<Metrics, ConfigError> {
    if args.leader_elect {
        readiness.block("lease", "the lease has not been read yet");
    } else {
        readiness.block("pass", "no pass completed yet");
    }
    Ok(Metrics::register(registry))
}

/// `--once`: one pass, on the app shell's connection and Events (no signals: the default
/// SIGTERM ends it; no health server).
pub(crate) async fn run_once(
    args: Settings,
    connection: Connection,
    events: EventRecorder,
) -> anyhow::Result<()> {
    let client = connection.client.clone();
    let Some(rotation) = load_rotation(&args, &connection, Unavailable::Fail).await? else {
        unreachable!("`Unavailable::Fail` never waits, so never sees a shutdown")
    };
    let metrics = Metrics::register(&mut Registry::default());
    metrics.broken.set(rotation.broken.len() as i64);
    let now = args.now.unwrap_or_else(unix_now);
    once(&client, &rotation, &args, &Arc::new(events), &metrics, now).await
}

/// Runs the controller until SIGTERM/SIGINT (`Ok`) or until the Lease is lost (`Err`).
pub(crate) async fn run(args: Settings, sidecar: Sidecar, metrics: Metrics) -> anyhow::Result<()> {
    let Sidecar {
        connection,
        shutdown,
        readiness,
        events,
    } = sidecar;
    let fixed_now = args.now;
    let client = connection.client.clone();
    // Nothing can be read or decided before kube-apiserver answers (`wait`).
    if !wait::until_answers(&connection, &shutdown, &readiness).await {
        return Ok(());
    }
    let wait = Unavailable::Wait(Waiting::new(
        &connection,
        &shutdown,
        &readiness,
        "apiserver",
    ));
    let Some(rotation) = load_rotation(&args, &connection, wait).await? else {
        // SIGTERM while the apiserver could not answer yet.
        return Ok(());
    };
    let events = Arc::new(events);
    metrics.broken.set(rotation.broken.len() as i64);
    let now = || fixed_now.unwrap_or_else(unix_now);
    if !rotation.broken.is_empty() {
        readiness.block(
            "config",
            format!("{} config item(s) broken", rotation.broken.len()),
        );
    }

    let Some(leadership) = Leadership::take(&args, &client, &shutdown, &readiness).await else {
        // SIGTERM while waiting for the Lease.
        return Ok(());
    };
    control(
        &client,
        &rotation,
        &args,
        &events,
        &metrics,
        &readiness,
        &shutdown,
        leadership,
        connection.watch_timeout_seconds,
        now,
    )
    .await?;
    drop(connection);
    Ok(())
}

/// The controller's loop: the watches' cache, then a pass whenever a declared object changes
/// or a deadline comes, until shutdown (`Ok`) or the Lease is lost (`Err`).
#[allow(clippy::too_many_arguments)]
async fn control(
    client: &kube::Client,
    rotation: &config::Rotation,
    args: &Settings,
    events: &Arc<EventRecorder>,
    metrics: &Metrics,
    readiness: &Readiness,
    shutdown: &CancellationToken,
    leadership: Leadership,
    watch_timeout_seconds: u32,
    now: impl Fn() -> i64,
) -> anyhow::Result<()> {
    // One list+watch per declared object, or per namespace and kind above
    // --namespace-watch-threshold; any change of a declared object wakes the loop.
    let cache = Arc::new(Cache::new(rotation, args.namespace_watch_threshold));
    let watches = Watches(cache.spawn_watches(client, watch_timeout_seconds));
    tracing::info!(mode = ?args.mode, signers = rotation.signers.len(), bundles = rotation.bundles.len(), targets = rotation.targets.len(), watches = ?cache.watched().map(ToString::to_string).collect::<Vec<_>>(), "regeneration controller started");
    let lost = leadership.lost.clone();
    // The first pass waits for every namespace's list: a pass on a partial cache would take
    // objects not listed yet for failures.
    tokio::select! {
        () = cache.ready() => tracing::debug!("every watch listed"),
        () = shutdown.cancelled() => {
            drop(watches);
            leadership.release().await;
            return Ok(());
        }
        () = lost.cancelled() => return Err(leadership.lost_error("")),
    }
    let mut changes = cache.subscribe();

    let mut timer = PassTimer::default();
    let brake = brake::Brake::default();
    if let Some(record) = &leadership.record {
        // A restart, or another replica that led before, does not reset a fight.
        record.load_into(&brake).await;
    }
    let mut sleep_for = Duration::ZERO;
    loop {
        tokio::select! {
            () = tokio::time::sleep(sleep_for) => {}
            // The sender lives as long as the cache.
            _ = changes.changed() => {}
            () = shutdown.cancelled() => break,
            () = lost.cancelled() => return Err(leadership.lost_error("")),
        }
        // Changes from here on wake the next pass; this one reads everything up to now.
        changes.borrow_and_update();
        let (pass_now, apiserver_now) = clocks(client, rotation, now()).await;
        let report = Pass {
            client,
            reads: Reads::Cached(&cache),
            rotation,
            mode: args.mode,
            now: pass_now,
            apiserver_now,
            events,
            brake: Some(&brake),
            lease_lost: Some(&lost),
        }
        .run()
        .await;
        account(&report, &brake, leadership.record.as_ref(), metrics).await;
        if lost.is_cancelled() {
            // The pass stopped writing when the Lease was lost.
            return Err(leadership.lost_error(" during a pass"));
        }
        record_failures(events, &report).await;
        report_readiness(readiness, &report);
        sleep_for = timer.after_pass(&report, pass_now);
        tracing::debug!(next = ?sleep_for, "pass complete");
    }
    drop(watches);
    leadership.release().await;
    Ok(())
}

/// The cache's watch tasks, aborted when the loop ends, however it ends.
struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for watch in &self.0 {
            watch.abort();
        }
    }
}

/// `--once`: one pass reading by GET, its failures (and the broken config items) the exit
/// status.
async fn once(
    client: &kube::Client,
    rotation: &config::Rotation,
    args: &Settings,
    events: &Arc<EventRecorder>,
    metrics: &Metrics,
    local_now: i64,
) -> anyhow::Result<()> {
    let (now, apiserver_now) = clocks(client, rotation, local_now).await;
    let report = Pass {
        client,
        reads: Reads::Live,
        rotation,
        mode: args.mode,
        now,
        apiserver_now,
        events,
        brake: None,
        lease_lost: None,
    }
    .run()
    .await;
    metrics.record(&report);
    log_report(&report);
    record_failures(events, &report).await;
    let mut failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
    failures.extend(
        rotation
            .broken
            .iter()
            .map(|b| format!("config {}: {}", b.item, b.reason)),
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "{} item(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

/// The objects a built-in profile declares, without a cluster (hostnames are placeholders: for
/// RBAC and the manifests' checks, not for use): what `app::access` grants for `--profile`, and
/// what the e2e tests compare the shipped manifests with.
///
/// # Errors
/// Never for the built-in profiles (their tests parse them).
pub fn profile_objects(chosen: Profile) -> Result<config::Rotation, ConfigError> {
    let placeholders = profile::Flags {
        service_network_ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
        api_hostname: Some("api.invalid".into()),
        api_int_hostname: Some("api-int.invalid".into()),
    };
    profile::build(
        chosen,
        release::find(release::DEFAULT)?,
        &cluster::ClusterValues::default(),
        &placeholders,
    )
}

/// The config file, or the built-in profile with the cluster's hostnames; `--key-type` applied.
/// `None` on shutdown while waiting for the apiserver ([`Unavailable::Wait`]).
async fn load_rotation(
    args: &Settings,
    connection: &Connection,
    unavailable: Unavailable<'_>,
) -> anyhow::Result<Option<config::Rotation>> {
    let mut rotation = match (&args.config, args.profile) {
        (Some(path), _) => {
            let rotation = config::load(path)?;
            for broken in &rotation.broken {
                tracing::error!(config = %path.display(), item = %broken.item, reason = %broken.reason, "config item skipped; the other items still run");
            }
            rotation
        }
        (None, Some(chosen)) => {
            let flags = profile::Flags {
                service_network_ips: args.service_network_ip.clone(),
                api_hostname: args.api_hostname.clone(),
                api_int_hostname: args.api_int_hostname.clone(),
            };
            let release = release::find(&args.openshift_version)?;
            tracing::info!(openshift_version = %release.version, kube_apiserver = %release.kube_apiserver, "the release the profile models");
            let build =
                |cluster: &cluster::ClusterValues| profile::build(chosen, release, cluster, &flags);
            if chosen.needs_cluster_values() {
                match cluster::read(connection, unavailable, build).await? {
                    Some(rotation) => rotation,
                    None => return Ok(None),
                }
            } else {
                build(&cluster::ClusterValues::default())?
            }
        }
        (None, None) => return Err(ConfigError("--config or --profile is required".into()).into()),
    };
    if let Some(key_type) = args.key_type {
        rotation.key_type = key_type;
    }
    tracing::info!(key_type = rotation.key_type.name(), "new keys");
    Ok(Some(rotation))
}

/// What a pass leaves behind: its writes in the brake (and the brake's record on the Lease),
/// the metrics, the log.
async fn account(
    report: &report::Report,
    brake: &brake::Brake,
    record: Option<&LeaseRecord>,
    metrics: &Metrics,
) {
    for write in &report.written {
        brake.record(write.kind, &write.object);
    }
    if let Some(record) = record {
        record.save(brake).await;
    }
    metrics.record(report);
    log_report(report);
}

/// What `/readyz` says after a pass: its failures (`pass`), the writes the brake held (`loop`)
/// and those that wait for a bundle to hold their CA (`trust`); each cleared by a pass that
/// has none.
fn report_readiness(readiness: &Readiness, report: &report::Report) {
    if report.failures.is_empty() {
        readiness.clear("pass");
    } else {
        let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
        readiness.block("pass", failures.join("; "));
    }
    let braked: Vec<&Held> = report.braked().collect();
    if braked.is_empty() {
        readiness.clear("loop");
    } else {
        readiness.block("loop", held_summary(&braked));
    }
    let waiting: Vec<&Held> = report.waiting().collect();
    if waiting.is_empty() {
        readiness.clear("trust");
    } else {
        readiness.block("trust", waiting_summary(&waiting));
    }
}

/// What `/readyz` says while the brake holds writes.
fn held_summary(held: &[&Held]) -> String {
    let objects: Vec<String> = held
        .iter()
        .map(|h| {
            let level = match &h.by {
                report::HeldBy::Brake { level, .. } => *level,
                report::HeldBy::Trust { .. } => 0,
            };
            format!(
                "{} {} (fight {level} in a row; until {}s from the pass)",
                h.kind,
                h.object,
                h.release_in.unwrap_or_default().as_secs()
            )
        })
        .collect();
    format!(
        "write loop: {} object(s) written {} times within {}s and held, each fight in a row \
         twice as long up to {}h (Event RegenerationLoop): {}",
        held.len(),
        brake::BUDGET,
        brake::WINDOW.as_secs(),
        brake::MAX_HOLD.as_secs() / 3600,
        objects.join(", ")
    )
}

/// What `/readyz` says while writes wait for a bundle to hold their CA.
fn waiting_summary(waiting: &[&Held]) -> String {
    let objects: Vec<String> = waiting
        .iter()
        .map(|h| match &h.by {
            report::HeldBy::Trust { waits_for } => {
                format!("{} {} waits for {waits_for}", h.kind, h.object)
            }
            report::HeldBy::Brake { .. } => format!("{} {}", h.kind, h.object),
        })
        .collect();
    format!(
        "{} write(s) would issue from or publish a CA not every bundle holds yet (Event \
         WaitingForTrust): {}",
        waiting.len(),
        objects.join("; ")
    )
}

/// One Warning Event per failed item (rate-limited per item by the recorder).
async fn record_failures(events: &EventRecorder, report: &report::Report) {
    for failure in &report.failures {
        events
            .record(
                "CertificateRegenerationFailed",
                &failure.subject(),
                failure.to_string(),
                true,
            )
            .await;
    }
}

fn log_report(report: &report::Report) {
    for failure in &report.failures {
        tracing::error!(%failure, "regeneration failed for an item");
    }
    for written in &report.written {
        tracing::info!(kind = written.kind, object = %written.object, reason = %written.reason, "written");
    }
    if report.conflicts > 0 {
        tracing::info!(
            conflicts = report.conflicts,
            "writes refused as stale (409) were read again and decided again"
        );
    }
}
