//! `cert-syncer sync`: mirrors named objects with kube-runtime watchers (list + watch, resume by
//! resourceVersion, relist on 410, backoff on errors) and writes each with the atomic directory
//! writer (`..data` swap), so a reader never sees a half-written object.
//!
//! Two ways to follow a kind, chosen by how many objects of it are named
//! (`--namespace-watch-threshold`), both feeding the same per-object worker ([`worker`]):
//! - few: one watcher per object (a `metadata.name` field selector: the least data on the wire
//!   and RBAC by resourceNames) ([`follow`]);
//! - many: one namespace-wide watcher for the kind, filtered here ([`namespace`]): one
//!   connection, one list at start-up, and work only for objects whose resourceVersion changed.
//!
//! The worker holds the newest state, retries failed writes with backoff, confirms with a live
//! GET only before removing files (the one place that policy is decided), and every
//! `--resync-interval` checks the disk against the last state seen and repairs it from memory.
//! It writes through one [`apply::Applier`] (metrics, readiness, Events after the files) to the
//! object's [`sink`]s (its directory with `..data` swaps, its `--file` host files), at most
//! `--write-parallelism` objects at once.
//!
//! - [`settings`]: what a run is given, validated;
//! - [`follow`]: per-object watch;
//! - [`shared`]: what following shares (client, auth, TLS, permits, the live GET);
//! - [`namespace`]: the namespace-wide watcher and its dispatcher;
//! - [`worker`]: one object's worker: pending state, GET policy, retry, resync;
//! - [`apply`]: a state onto the object's sinks;
//! - [`sink`]: where an object goes on disk, chosen per object;
//! - [`files`]: `--file` mappings (an object's keys and bytes: `crate::kube::fetched`).

mod apply;
mod files;
mod follow;
mod metrics;
mod namespace;
mod settings;
mod shared;
mod sink;
mod worker;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use prometheus_client::registry::Registry;

pub(crate) use settings::{Named, Settings};

use crate::base::error::ConfigError;
use crate::base::kind::Kind;
use crate::base::readiness::Readiness;
use crate::kube::sidecar::Sidecar;
use crate::sync::metrics::Metrics;
use apply::Applier;
use settings::ObjectSpec;
use shared::Follower;

/// Sync's metrics, and every required object blocking readiness until synced.
pub(crate) fn register(
    settings: &Settings,
    registry: &mut Registry,
    readiness: &Readiness,
) -> Result<Metrics, ConfigError> {
    for object in settings.objects.iter().filter(|o| o.required) {
        readiness.block(&object.label(), "not synced yet");
    }
    Ok(Metrics::register(registry))
}

/// Runs until SIGTERM/SIGINT (exit 0) or until authentication has failed for too long (error).
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
    let events = Arc::new(events);
    let settings = Arc::new(settings);
    let applier = Applier {
        settings: Arc::clone(&settings),
        metrics,
        readiness,
        events,
    };
    let follower = Arc::new(Follower::new(client, connection, applier, shutdown.clone()));
    tracing::info!(
        namespace = %settings.namespace,
        destination = %settings.destination.display(),
        objects = ?settings.objects.iter().map(ObjectSpec::label).collect::<Vec<_>>(),
        resync_interval = ?follower.resync_interval,
        "starting sync"
    );
    let mut tasks = Vec::new();
    for kind in Kind::ALL {
        let objects = settings.objects_of(kind);
        if settings.namespace_wide(kind) {
            tracing::info!(
                kind = kind.label(),
                objects = objects.len(),
                threshold = settings.namespace_watch_threshold,
                "one namespace-wide watch for this kind"
            );
            let follower = Arc::clone(&follower);
            tasks.push(tokio::spawn(async move {
                match kind {
                    Kind::Secret => namespace::follow::<Secret>(follower, objects).await,
                    Kind::ConfigMap => namespace::follow::<ConfigMap>(follower, objects).await,
                }
            }));
            continue;
        }
        for object in objects {
            let follower = Arc::clone(&follower);
            tasks.push(tokio::spawn(follow::object(follower, object)));
        }
    }
    shutdown.cancelled().await;
    // A write in progress runs to completion inside spawn_blocking; the tasks stop at their next
    // await point.
    for task in tasks {
        let _ = task.await;
    }
    match follower.fatal() {
        Some(reason) => Err(anyhow::anyhow!(reason)),
        None => Ok(()),
    }
}
