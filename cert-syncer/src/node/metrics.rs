//! Node mode's Prometheus metrics, per host file (`path`).
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `cert_syncer_node_bundle_bytes` | `path` | size of the content we write |
//! | `cert_syncer_node_bundle_certificates` | `path` | certificates in it (after deduplication) |
//! | `cert_syncer_node_bundle_earliest_not_after_timestamp_seconds` | `path` | the earliest notAfter among them |
//! | `cert_syncer_node_last_write_timestamp_seconds` | `path` | our last write |
//! | `cert_syncer_node_writes_total` | `path` | our writes (a write of unchanged certificates never happens) |
//! | `cert_syncer_node_write_errors_total` | `path` | failed reads or writes of the file |
//! | `cert_syncer_node_source_errors_total` | `path`, `kind`, `namespace`, `name`, `key` | source versions refused (missing key, bad PEM); the file kept that source's last good certificates |
//! | `cert_syncer_node_source_valid` | `path`, `kind`, `namespace`, `name`, `key` | 1 while the source's current version is good, 0 while refused or absent |
//! | `cert_syncer_node_foreign_content` | `path`, `sha256` | 1 while another writer's content (that fingerprint) is in the file; the series goes when that content does |
//! | `cert_syncer_node_bundle_refused` | `path` | 1 while the sources' bundle is refused by the guard (no unexpired CA, or it would remove every unexpired certificate the file holds) |
//! | `cert_syncer_node_bundle_refusals_total` | `path`, `reason` | bundles refused by the guard (`no-unexpired-ca`, `removes-every-unexpired`), once per refused bundle |
//! | `cert_syncer_node_foreign_writes_total` | `path` | writes by someone else seen (content differing from ours) |
//! | `cert_syncer_node_takeovers_total` | `path` | another writer's content replaced after the grace period |
//! | `cert_syncer_node_post_write_actions_total` | `path`, `result` (`ok`/`error`) | post-write actions run |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::settings::Source;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    pub path: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub path: String,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl SourceLabels {
    pub fn new(path: &str, source: &Source) -> SourceLabels {
        SourceLabels {
            path: path.to_owned(),
            kind: source.kind.label(),
            namespace: source.namespace.clone(),
            name: source.name.clone(),
            key: source.key.clone(),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForeignLabels {
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub path: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub path: String,
    pub result: &'static str,
}

/// Handles to the families.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub bundle_bytes: Family<PathLabels, Gauge>,
    pub bundle_certificates: Family<PathLabels, Gauge>,
    pub earliest_not_after: Family<PathLabels, Gauge>,
    pub last_write: Family<PathLabels, Gauge>,
    pub writes: Family<PathLabels, Counter>,
    pub write_errors: Family<PathLabels, Counter>,
    pub source_errors: Family<SourceLabels, Counter>,
    pub source_valid: Family<SourceLabels, Gauge>,
    pub foreign_content: Family<ForeignLabels, Gauge>,
    pub bundle_refused: Family<PathLabels, Gauge>,
    pub bundle_refusals: Family<RefusalLabels, Counter>,
    pub foreign_writes: Family<PathLabels, Counter>,
    pub takeovers: Family<PathLabels, Counter>,
    pub post_write_actions: Family<ResultLabels, Counter>,
}

impl Metrics {
    /// The families, with every source of `file` not valid (until it is seen).
    pub fn register_for(registry: &mut Registry, file: &str, sources: &[Source]) -> Metrics {
        let metrics = Metrics::register(registry);
        for source in sources {
            let labels = SourceLabels::new(file, source);
            metrics.source_valid.get_or_create(&labels).set(0);
        }
        metrics
    }

    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        let r = registry;
        r.register(
            "cert_syncer_node_bundle_bytes",
            "Size of the assembled host file",
            m.bundle_bytes.clone(),
        );
        r.register(
            "cert_syncer_node_bundle_certificates",
            "Certificates in the assembled host file",
            m.bundle_certificates.clone(),
        );
        r.register(
            "cert_syncer_node_bundle_earliest_not_after_timestamp_seconds",
            "Earliest notAfter in the assembled host file",
            m.earliest_not_after.clone(),
        );
        r.register(
            "cert_syncer_node_last_write_timestamp_seconds",
            "Last write of the host file by node mode",
            m.last_write.clone(),
        );
        r.register(
            "cert_syncer_node_writes",
            "Writes of the host file by node mode",
            m.writes.clone(),
        );
        r.register(
            "cert_syncer_node_write_errors",
            "Failed reads or writes of the host file",
            m.write_errors.clone(),
        );
        r.register(
            "cert_syncer_node_source_errors",
            "Source versions refused (missing key, bad PEM)",
            m.source_errors.clone(),
        );
        r.register(
            "cert_syncer_node_source_valid",
            "1 while the source's current version is good",
            m.source_valid.clone(),
        );
        r.register(
            "cert_syncer_node_foreign_content",
            "1 while another writer's content (by SHA-256) is in the host file",
            m.foreign_content.clone(),
        );
        r.register(
            "cert_syncer_node_bundle_refused",
            "1 while the sources' bundle is refused (no unexpired CA, or it would remove every unexpired certificate the file holds)",
            m.bundle_refused.clone(),
        );
        r.register(
            "cert_syncer_node_bundle_refusals",
            "Bundles refused before writing, by reason",
            m.bundle_refusals.clone(),
        );
        r.register(
            "cert_syncer_node_foreign_writes",
            "Writes of the host file by someone else",
            m.foreign_writes.clone(),
        );
        r.register(
            "cert_syncer_node_takeovers",
            "Another writer's content replaced after the grace period",
            m.takeovers.clone(),
        );
        r.register(
            "cert_syncer_node_post_write_actions",
            "Post-write actions by result",
            m.post_write_actions.clone(),
        );
        m
    }
}
