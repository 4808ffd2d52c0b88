//! Metrics of the regeneration controller.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `cert_regenerate_regenerations_total` | `kind` (`signer`/`bundle`/`target`), `object`, `reason` | writes made; `reason` is why: `missing`, `unusable`, `not-ca`, `expired`, `lifetime`, `refresh`, `hostnames`, `identity`, `chain`, `not-yet-valid`, `annotation` (the manual trigger), `signer-rotated`; for bundles `missing`, `ca-added`, `ca-removed`, `ca-replaced`, `unparsable` |
//! | `cert_regenerate_failures_total` | | failed items, summed over passes |
//! | `cert_regenerate_conflicts_total` | | writes refused with 409 (a stale read: read again, decided again) |
//! | `cert_regenerate_certificate_not_after_timestamp_seconds` | `kind`, `object` | notAfter of every managed certificate (bundles: the earliest CA) |
//! | `cert_regenerate_last_pass_timestamp_seconds` | | end of the last pass |
//! | `cert_regenerate_broken_config_items` | | config items skipped as invalid |
//! | `cert_regenerate_writes_held_total` | `kind`, `object` | writes the per-object write budget withheld (a write loop: see `brake`) |
//! | `cert_regenerate_held_objects` | | objects the last pass did not write because their write budget was spent |
//! | `cert_regenerate_writes_waiting_total` | `kind`, `object` | writes deferred because a bundle that must trust their CA does not hold it yet (its own write held by the brake, failed, or not made: see `trust`) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::report::Report;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: &'static str,
    pub object: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub kind: &'static str,
    pub object: String,
}

/// Handles to the metric families.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub regenerations: Family<WriteLabels, Counter>,
    pub failures: Counter,
    pub conflicts: Counter,
    pub not_after: Family<CertLabels, Gauge>,
    pub last_pass: Gauge,
    pub broken: Gauge,
    pub held: Family<CertLabels, Counter>,
    pub held_objects: Gauge,
    pub waiting: Family<CertLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let metrics = Metrics::default();
        registry.register(
            "cert_regenerate_regenerations",
            "Objects written by the regeneration controller",
            metrics.regenerations.clone(),
        );
        registry.register(
            "cert_regenerate_failures",
            "Items that failed in a pass",
            metrics.failures.clone(),
        );
        registry.register(
            "cert_regenerate_conflicts",
            "Writes refused with 409 Conflict (read again and decided again)",
            metrics.conflicts.clone(),
        );
        registry.register(
            "cert_regenerate_certificate_not_after_timestamp_seconds",
            "notAfter of every managed certificate (bundles: the earliest CA)",
            metrics.not_after.clone(),
        );
        registry.register(
            "cert_regenerate_last_pass_timestamp_seconds",
            "End of the last pass",
            metrics.last_pass.clone(),
        );
        registry.register(
            "cert_regenerate_broken_config_items",
            "Config items skipped as invalid",
            metrics.broken.clone(),
        );
        registry.register(
            "cert_regenerate_writes_held",
            "Writes withheld because the object was written too often within the window (a write loop)",
            metrics.held.clone(),
        );
        registry.register(
            "cert_regenerate_held_objects",
            "Objects the last pass did not write because their write budget was spent",
            metrics.held_objects.clone(),
        );
        registry.register(
            "cert_regenerate_writes_waiting",
            "Writes deferred because a bundle that must trust their CA does not hold it yet",
            metrics.waiting.clone(),
        );
        metrics
    }

    /// Folds one pass into the metrics.
    pub fn record(&self, report: &Report) {
        for written in &report.written {
            self.regenerations
                .get_or_create(&WriteLabels {
                    kind: written.kind,
                    object: written.object.to_string(),
                    reason: written.reason_label,
                })
                .inc();
        }
        let labels = |held: &super::report::Held| CertLabels {
            kind: held.kind,
            object: held.object.to_string(),
        };
        for held in report.braked() {
            self.held.get_or_create(&labels(held)).inc();
        }
        for waiting in report.waiting() {
            self.waiting.get_or_create(&labels(waiting)).inc();
        }
        self.held_objects.set(report.braked().count() as i64);
        self.failures.inc_by(report.failures.len() as u64);
        self.conflicts.inc_by(report.conflicts);
        let mut earliest: std::collections::BTreeMap<(&'static str, String), i64> =
            std::collections::BTreeMap::new();
        for (kind, object, not_after) in &report.not_after {
            let entry = earliest
                .entry((kind, object.to_string()))
                .or_insert(*not_after);
            *entry = (*entry).min(*not_after);
        }
        for ((kind, object), not_after) in earliest {
            self.not_after
                .get_or_create(&CertLabels { kind, object })
                .set(not_after);
        }
        self.last_pass.set(crate::base::time::unix_now());
    }
}
