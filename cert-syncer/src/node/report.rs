//! What node mode shows of each outcome of a reconcile: metrics, log lines, Events on the Node,
//! readiness, and the post-write action after a write. The loop (`mod.rs`) decides; this reports.

use super::metrics::{ForeignLabels, RefusalLabels, ResultLabels};
use super::{Node, action, bundle, guard, target};

impl Node {
    /// The file was written (`replaced`: the fingerprint of another writer's content it
    /// replaced after the grace period): counted, logged, an Event, then the post-write action.
    pub(super) async fn written(&mut self, bundle: &bundle::Bundle, replaced: Option<&str>) {
        let labels = self.labels();
        let path = self.target.path().display().to_string();
        self.metrics.writes.get_or_create(&labels).inc();
        self.metrics
            .last_write
            .get_or_create(&labels)
            .set(crate::base::time::unix_now());
        let fingerprint = bundle::fingerprint(&bundle.pem);
        tracing::info!(file = %path, certificates = bundle.certificates.len(), duplicates = bundle.duplicates, sha256 = %fingerprint, "host file written");
        if let Some(theirs) = replaced {
            self.metrics.takeovers.get_or_create(&labels).inc();
            tracing::warn!(file = %path, replaced_sha256 = %theirs, grace_period = ?self.settings.grace_period, "replaced another writer's content after the grace period");
            self.events
                .record(
                    "ForeignContentReplaced",
                    &path,
                    format!(
                        "{path}: replaced content sha256:{theirs} written by someone else, unchanged for {:?}, with the sources' bundle sha256:{fingerprint}",
                        self.settings.grace_period
                    ),
                    true,
                )
                .await;
        }
        self.foreign_gone();
        self.refusal_gone();
        self.events
            .record(
                "HostFileWritten",
                &path,
                format!(
                    "{path}: wrote {} certificates (sha256:{fingerprint})",
                    bundle.certificates.len()
                ),
                false,
            )
            .await;
        self.readiness.clear("file");
        self.post_write().await;
    }

    /// Another writer's content (`fingerprint`) is in the file, inside its grace period;
    /// `first`: the first time this content (or write) is seen.
    pub(super) async fn foreign_waiting(&mut self, fingerprint: &str, first: bool) {
        let path = self.target.path().display().to_string();
        if first {
            self.metrics
                .foreign_writes
                .get_or_create(&self.labels())
                .inc();
            if self.foreign.as_deref() != Some(fingerprint) {
                // Logged and published once per episode (a busy writer would flood the log);
                // the gauge always names the content there now.
                let episode = self.foreign.is_none();
                self.foreign_gone();
                self.metrics
                    .foreign_content
                    .get_or_create(&ForeignLabels {
                        path: self.path_label.clone(),
                        sha256: fingerprint.to_owned(),
                    })
                    .set(1);
                self.foreign = Some(fingerprint.to_owned());
                if !episode {
                    tracing::debug!(file = %path, sha256 = %fingerprint, "another writer rewrote the file");
                } else {
                    tracing::warn!(file = %path, sha256 = %fingerprint, grace_period = ?self.settings.grace_period, "the file holds content written by someone else; it is replaced once unchanged for the grace period");
                    self.events
                        .record(
                            "ForeignContent",
                            &path,
                            format!(
                                "{path} holds content sha256:{fingerprint} not written by node mode; it is replaced once unchanged for {:?}",
                                self.settings.grace_period
                            ),
                            true,
                        )
                        .await;
                }
            }
        }
        self.readiness.block(
            "file",
            format!("another writer's content (sha256:{fingerprint}) in the grace period"),
        );
    }

    /// Reading or writing the file failed: counted, logged, an Event; retried after
    /// [`WRITE_RETRY`](super::WRITE_RETRY).
    pub(super) async fn write_failed(&mut self, err: &target::WriteError) {
        let path = self.target.path().display().to_string();
        self.metrics
            .write_errors
            .get_or_create(&self.labels())
            .inc();
        tracing::error!(error = %err, "cannot write the host file; retrying");
        self.readiness.block("file", err.to_string());
        self.events
            .record("HostFileWriteFailed", &path, err.to_string(), true)
            .await;
    }

    /// The file no longer holds that other content: its series goes (a series per fingerprint
    /// left behind would grow without end with every foreign write).
    pub(super) fn foreign_gone(&mut self) {
        if let Some(fingerprint) = self.foreign.take() {
            self.metrics.foreign_content.remove(&ForeignLabels {
                path: self.path_label.clone(),
                sha256: fingerprint,
            });
        }
    }

    /// The guard refused `bundle`: the file keeps `held` (its fingerprint; `None`: no file).
    /// Logged and recorded once per refused bundle; the gauge and `/readyz` hold while it lasts.
    pub(super) async fn refused(
        &mut self,
        bundle: &bundle::Bundle,
        refusal: &guard::Refusal,
        held: Option<&str>,
    ) {
        let path = self.target.path().display().to_string();
        let sources = self
            .sources
            .iter()
            .map(|s| {
                format!(
                    "{} at resourceVersion {}",
                    s.source,
                    s.resource_version.as_deref().unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let kept = match held {
            Some(sha) => format!("the file keeps its content (sha256:{sha})"),
            None => "the file is not written".to_owned(),
        };
        let fingerprint = bundle::fingerprint(&bundle.pem);
        let message = format!(
            "refusing the bundle (sha256:{fingerprint}) of {sources} for {path}: {refusal}; {kept}"
        );
        let labels = self.labels();
        // Everything the process itself shows is in place before the Event's API call.
        self.metrics.bundle_refused.get_or_create(&labels).set(1);
        self.readiness.block("file", message.clone());
        if self.refused.as_ref() != Some(&message) {
            self.refused = Some(message.clone());
            self.metrics
                .bundle_refusals
                .get_or_create(&RefusalLabels {
                    path: self.path_label.clone(),
                    reason: refusal.reason(),
                })
                .inc();
            tracing::error!(file = %path, %sources, reason = %refusal, sha256 = %fingerprint, held_sha256 = held.unwrap_or("none"), "refusing to write the host file; {kept}");
            // Rate-limited per reason of refusal, not per file: each kind gets its Event.
            self.events
                .record(
                    "BundleRefused",
                    &format!("{path} {}", refusal.reason()),
                    message,
                    true,
                )
                .await;
        }
    }

    pub(super) fn refusal_gone(&mut self) {
        if self.refused.take().is_some() {
            tracing::info!(file = %self.target.path().display(), "the sources' bundle is accepted again");
            self.metrics
                .bundle_refused
                .get_or_create(&self.labels())
                .set(0);
        }
    }

    async fn post_write(&self) {
        let Some(action) = &self.settings.post_write else {
            return;
        };
        let result = action::run(action, self.settings.post_write_timeout).await;
        let labels = |result| ResultLabels {
            path: self.path_label.clone(),
            result,
        };
        match result {
            Ok(summary) => {
                tracing::info!(%summary, "post-write action done");
                self.metrics
                    .post_write_actions
                    .get_or_create(&labels("ok"))
                    .inc();
            }
            Err(error) => {
                tracing::error!(%error, "post-write action failed");
                self.metrics
                    .post_write_actions
                    .get_or_create(&labels("error"))
                    .inc();
                let path = self.target.path().display().to_string();
                self.events
                    .record(
                        "PostWriteActionFailed",
                        &path,
                        format!("{path}: {error}"),
                        true,
                    )
                    .await;
            }
        }
    }
}
