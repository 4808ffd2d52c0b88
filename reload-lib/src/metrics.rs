//! Prometheus metrics (feature `metrics`, on by default), registered in a registry the caller
//! passes to [`ServingSetBuilder::metrics`](crate::ServingSetBuilder::metrics) or
//! [`ClientTlsBuilder::metrics`](crate::ClientTlsBuilder::metrics).
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `reload_reloads_total` | `set`, `result` (`ok`/`error`) | reload attempts that published / were rejected |
//! | `reload_last_success_timestamp_seconds` | `set` | when the last snapshot was published |
//! | `reload_generation` | `set` | the snapshot generation served |
//! | `reload_certificate_not_after_timestamp_seconds` | `set`, `source` | notAfter of each served certificate (for a CA bundle: the earliest) |
//!
//! Seconds to expiry is `reload_certificate_not_after_timestamp_seconds - time()` in PromQL.

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::reload::Status;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SetLabels {
    set: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    set: String,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    set: String,
    source: String,
}

/// The metric families; cheap to clone (they are shared handles).
#[derive(Debug, Clone)]
pub(crate) struct ReloadMetrics {
    reloads: Family<ResultLabels, Counter>,
    last_success: Family<SetLabels, Gauge>,
    generation: Family<SetLabels, Gauge>,
    not_after: Family<SourceLabels, Gauge>,
}

impl ReloadMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reloads: Family::default(),
            last_success: Family::default(),
            generation: Family::default(),
            not_after: Family::default(),
        };
        registry.register(
            "reload_reloads",
            "Reload attempts by result (ok: a new snapshot was published; error: rejected, last good kept)",
            metrics.reloads.clone(),
        );
        registry.register(
            "reload_last_success_timestamp_seconds",
            "When the last snapshot was published",
            metrics.last_success.clone(),
        );
        registry.register(
            "reload_generation",
            "Generation of the snapshot served",
            metrics.generation.clone(),
        );
        registry.register(
            "reload_certificate_not_after_timestamp_seconds",
            "notAfter of each served certificate",
            metrics.not_after.clone(),
        );
        metrics
    }

    /// Follows a set's status for as long as the set lives.
    pub(crate) fn follow(self, set: String, mut status: watch::Receiver<Status>) {
        let mut seen_ok = 0;
        let mut seen_failed = 0;
        // The start-up state is recorded before `start()` returns, so a scrape right after
        // start-up already sees it.
        let first = status.borrow_and_update().clone();
        self.record(&set, &first, &mut seen_ok, &mut seen_failed);
        tokio::spawn(async move {
            while status.changed().await.is_ok() {
                let current = status.borrow_and_update().clone();
                self.record(&set, &current, &mut seen_ok, &mut seen_failed);
            }
        });
    }

    fn record(&self, set: &str, status: &Status, seen_ok: &mut u64, seen_failed: &mut u64) {
        let ok = ResultLabels {
            set: set.to_owned(),
            result: "ok",
        };
        let error = ResultLabels {
            set: set.to_owned(),
            result: "error",
        };
        self.reloads
            .get_or_create(&ok)
            .inc_by(status.reloads_ok - *seen_ok);
        self.reloads
            .get_or_create(&error)
            .inc_by(status.reloads_failed - *seen_failed);
        *seen_ok = status.reloads_ok;
        *seen_failed = status.reloads_failed;
        let labels = SetLabels {
            set: set.to_owned(),
        };
        self.last_success
            .get_or_create(&labels)
            .set(status.last_success_unix);
        self.generation
            .get_or_create(&labels)
            .set(status.generation as i64);
        let mut earliest: BTreeMap<&str, i64> = BTreeMap::new();
        for cert in status.served.iter() {
            earliest
                .entry(cert.source.as_str())
                .and_modify(|t| *t = (*t).min(cert.info.not_after))
                .or_insert(cert.info.not_after);
        }
        for (source, not_after) in earliest {
            let labels = SourceLabels {
                set: set.to_owned(),
                source: source.to_owned(),
            };
            self.not_after.get_or_create(&labels).set(not_after);
        }
    }
}
