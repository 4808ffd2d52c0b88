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
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
//! # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
//! # std::fs::write(&crt, pair.cert.pem())?;
//! # std::fs::write(&key, pair.signing_key.serialize_pem())?;
//! use prometheus_client::{encoding::text::encode, registry::Registry};
//! use reload_lib::{CertKeyPaths, ServingSet};
//!
//! let mut registry = Registry::default();
//! let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
//!     .name("api")
//!     .metrics(&mut registry)
//!     .start()
//!     .await?;
//! // Serve `registry` on your /metrics endpoint; the start-up state is already recorded.
//! let mut text = String::new();
//! encode(&mut text, &registry)?;
//! assert!(text.contains(r#"reload_generation{set="api"} 1"#));
//! assert!(text.contains(r#"reload_reloads_total{set="api",result="ok"} 1"#));
//! let not_after = set.status().served[0].info.not_after;
//! let expiry = format!(r#"reload_certificate_not_after_timestamp_seconds{{set="api",source="default"}} {not_after}"#);
//! assert!(text.contains(&expiry));
//! # Ok(()) }
//! ```
//!
//! Labels hold set names and source roles, never file contents.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::status::{ServedCert, Status};

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
        let mut expiry = Expiry::default();
        // The start-up state is recorded before `start()` returns, so a scrape right after
        // start-up already sees it.
        let first = status.borrow_and_update().clone();
        self.record(&set, &first, &mut seen_ok, &mut seen_failed, &mut expiry);
        // On the crate's runtime, with the reload task it follows.
        crate::runtime::get().spawn(async move {
            while status.changed().await.is_ok() {
                let current = status.borrow_and_update().clone();
                self.record(&set, &current, &mut seen_ok, &mut seen_failed, &mut expiry);
            }
        });
    }

    fn record(
        &self,
        set: &str,
        status: &Status,
        seen_ok: &mut u64,
        seen_failed: &mut u64,
        expiry: &mut Expiry,
    ) {
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
        for source in expiry.update(status.served.iter_shared()) {
            let labels = SourceLabels {
                set: set.to_owned(),
                source,
            };
            match expiry.earliest(&labels.source) {
                Some(not_after) => {
                    self.not_after.get_or_create(&labels).set(not_after);
                }
                None => {
                    self.not_after.remove(&labels);
                }
            }
        }
    }
}

/// The notAfter of every served certificate by source label, updated by comparing entries
/// with the last status seen: entries shared with it (the same `Arc`) are skipped, so a change
/// to one pair of a large set touches one label.
#[derive(Debug, Default)]
struct Expiry {
    /// The entry recorded at each position of [`Status::served`].
    seen: Vec<Arc<ServedCert>>,
    /// Per source label: (notAfter, position) of the certificates recorded under it.
    by_source: HashMap<String, BTreeSet<(i64, usize)>>,
}

impl Expiry {
    /// Records `served`; returns the labels whose earliest notAfter may have changed.
    fn update<'a>(
        &mut self,
        served: impl Iterator<Item = &'a Arc<ServedCert>>,
    ) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        let mut len = 0;
        for (index, cert) in served.enumerate() {
            len = index + 1;
            match self.seen.get(index) {
                Some(old) if Arc::ptr_eq(old, cert) => continue,
                Some(old) => {
                    let old = Arc::clone(old);
                    self.forget(index, &old, &mut touched);
                    self.seen[index] = Arc::clone(cert);
                }
                None => self.seen.push(Arc::clone(cert)),
            }
            self.by_source
                .entry(cert.source.clone())
                .or_default()
                .insert((cert.info.not_after, index));
            touched.insert(cert.source.clone());
        }
        for index in (len..self.seen.len()).rev() {
            let old = self.seen.remove(index);
            self.forget(index, &old, &mut touched);
        }
        touched
    }

    fn forget(&mut self, index: usize, old: &ServedCert, touched: &mut BTreeSet<String>) {
        if let Some(entries) = self.by_source.get_mut(&old.source) {
            entries.remove(&(old.info.not_after, index));
            if entries.is_empty() {
                self.by_source.remove(&old.source);
            }
        }
        touched.insert(old.source.clone());
    }

    fn earliest(&self, source: &str) -> Option<i64> {
        self.by_source
            .get(source)
            .and_then(|entries| entries.first())
            .map(|(not_after, _)| *not_after)
    }
}
