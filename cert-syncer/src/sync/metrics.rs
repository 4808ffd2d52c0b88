//! The sidecar's Prometheus metrics.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `cert_syncer_syncs_total` | `kind`, `name`, `result` (`written`/`unchanged`/`removed`/`error`) | sync attempts per object, over all its destinations (directory, `--file` host files): `error` when one refused or failed, `written` when one changed |
//! | `cert_syncer_last_sync_timestamp_seconds` | `kind`, `name` | last successful sync of an object |
//! | `cert_syncer_certificate_not_after_timestamp_seconds` | `kind`, `name`, `key` | notAfter of the first certificate of each synced PEM key; the series of a key or an optional object that is gone goes with it |
//! | `cert_syncer_resync_repairs_total` | `kind`, `name`, `reason` (`missing`/`file-removed`/`changed`/`unexpected-directory`) | files the periodic resync found changed or removed behind the syncer's back and rewrote from the last seen object |
//! | `cert_syncer_resyncs_total` | `kind`, `name` | resync passes per object (each compares the disk with the last state seen; repairs are counted above) |
//! | `cert_syncer_namespace_watch_events_total` | `kind`, `result` (`changed`/`unchanged`/`unnamed`) | objects seen by a namespace-wide watch: handed to their object's worker, skipped because that resourceVersion was already handed over (relists, duplicates), or not named at all |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: &'static str,
    pub name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub kind: &'static str,
    pub name: String,
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    pub kind: &'static str,
    pub name: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchEventLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub kind: &'static str,
    pub name: String,
    pub key: String,
}

/// Handles to the metric families.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub syncs: Family<ResultLabels, Counter>,
    pub last_sync: Family<ObjectLabels, Gauge>,
    pub not_after: Family<KeyLabels, Gauge>,
    pub watch_events: Family<WatchEventLabels, Counter>,
    pub resync_repairs: Family<RepairLabels, Counter>,
    pub resyncs: Family<ObjectLabels, Counter>,
    /// The keys of each object that have a notAfter series: a key that no longer holds a
    /// certificate, or an object whose files were removed, loses its series (a notAfter left
    /// behind would keep an expiry alert firing for a certificate nothing serves).
    certificate_keys: Arc<Mutex<HashMap<ObjectLabels, BTreeSet<String>>>>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let metrics = Metrics::default();
        registry.register(
            "cert_syncer_syncs",
            "Sync attempts per object by result",
            metrics.syncs.clone(),
        );
        registry.register(
            "cert_syncer_last_sync_timestamp_seconds",
            "Last successful sync of an object",
            metrics.last_sync.clone(),
        );
        registry.register(
            "cert_syncer_certificate_not_after_timestamp_seconds",
            "notAfter of the first certificate in each synced PEM key",
            metrics.not_after.clone(),
        );
        registry.register(
            "cert_syncer_namespace_watch_events",
            "Objects seen by namespace-wide watches, by what was done with them",
            metrics.watch_events.clone(),
        );
        registry.register(
            "cert_syncer_resync_repairs",
            "Files the resync found changed or removed on disk and rewrote from the last seen object",
            metrics.resync_repairs.clone(),
        );
        registry.register(
            "cert_syncer_resyncs",
            "Resync passes per object (the disk compared with the last state seen)",
            metrics.resyncs.clone(),
        );
        metrics
    }

    /// Sets the notAfter of each certificate key of an object (`not_after`: key → Unix
    /// seconds) and removes the series of its keys that are not there any more.
    pub fn set_not_after(&self, kind: &'static str, name: &str, not_after: &BTreeMap<String, i64>) {
        let object = ObjectLabels {
            kind,
            name: name.to_owned(),
        };
        let mut keys = self
            .certificate_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let before = keys.remove(&object).unwrap_or_default();
        for gone in before.iter().filter(|key| !not_after.contains_key(*key)) {
            self.not_after.remove(&key_labels(kind, name, gone));
        }
        for (key, seconds) in not_after {
            self.not_after
                .get_or_create(&key_labels(kind, name, key))
                .set(*seconds);
        }
        if !not_after.is_empty() {
            keys.insert(object, not_after.keys().cloned().collect());
        }
    }

    /// Removes the series of an object whose files are gone (an optional object deleted):
    /// its certificates' notAfter and its last sync.
    pub fn forget(&self, kind: &'static str, name: &str) {
        self.set_not_after(kind, name, &BTreeMap::new());
        self.last_sync.remove(&ObjectLabels {
            kind,
            name: name.to_owned(),
        });
    }
}

fn key_labels(kind: &'static str, name: &str, key: &str) -> KeyLabels {
    KeyLabels {
        kind,
        name: name.to_owned(),
        key: key.to_owned(),
    }
}
