//! What an object's state means on disk, for both ways of following (per object and
//! namespace-wide): every [`Sink`] of the object written, kept or cleared alike; count every
//! outcome, set readiness, and record a Kubernetes Event once the files are written (spawned,
//! never awaited before a write).
//!
//! [`Applier::resync`] re-applies the last state seen to the disk when the resync period comes,
//! repairing what was changed or removed behind the syncer's back, from memory: no API request.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::settings::{ObjectSpec, Settings};
use super::sink::{self, Sink, SinkError, Wrote};
use crate::base::readiness::Readiness;
use crate::kube::decode::DecodeError;
use crate::kube::events::EventRecorder;
use crate::kube::fetched::{Fetched, TryFetched};
use crate::sync::metrics::{Metrics, ObjectLabels, RepairLabels, ResultLabels};

/// What a named object should become on disk.
#[derive(Debug)]
pub(crate) enum Desired {
    /// Written as this.
    Present(Fetched),
    /// Present, but it does not decode: files kept, the reason logged.
    Undecodable(DecodeError),
    /// Deleted from the apiserver (or missing from a list).
    Absent,
}

impl Desired {
    /// What a watch (or a GET) says of an object: `None` when it is absent.
    pub fn of(object: Option<&impl TryFetched>) -> Desired {
        match object.map(TryFetched::try_fetched) {
            Some(Ok(fetched)) => Desired::Present(fetched),
            Some(Err(err)) => Desired::Undecodable(err),
            None => Desired::Absent,
        }
    }
}

/// Applies states to the disk. One per run, shared by every object's task.
pub(crate) struct Applier {
    pub settings: Arc<Settings>,
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub events: Arc<EventRecorder>,
}

/// What each sink of an object answered, with its path.
type Answers<T> = Vec<(PathBuf, Result<T, SinkError>)>;

impl Applier {
    /// Writes, keeps or removes; `false` when it failed in a way worth retrying.
    pub async fn apply(&self, object: &ObjectSpec, desired: &Desired) -> bool {
        match desired {
            Desired::Present(fetched) => self.write(object, fetched).await,
            Desired::Undecodable(err) => self.undecodable(object, err),
            Desired::Absent => self.absent(object).await,
        }
    }

    /// Whether some sink of `object` holds files that its absence would remove.
    pub fn holds_files(&self, object: &ObjectSpec) -> bool {
        sink::for_object(&self.settings, object)
            .iter()
            .any(|sink| sink.holds_files())
    }

    /// Runs `step` on every sink of `object`, in order, off the async workers.
    async fn each_sink<T: Send + 'static>(
        &self,
        object: &ObjectSpec,
        step: impl Fn(&dyn Sink) -> Result<T, SinkError> + Send + 'static,
    ) -> Answers<T> {
        let sinks = sink::for_object(&self.settings, object);
        let paths: Vec<PathBuf> = sinks.iter().map(|s| s.path().to_owned()).collect();
        match tokio::task::spawn_blocking(move || {
            sinks
                .iter()
                .map(|sink| (sink.path().to_owned(), step(sink.as_ref())))
                .collect()
        })
        .await
        {
            Ok(answers) => answers,
            Err(err) => {
                let why = format!("file task failed: {}", crate::base::error::chain(&err));
                paths
                    .into_iter()
                    .map(|path| (path, Err(SinkError::Failed(why.clone()))))
                    .collect()
            }
        }
    }

    /// An object that does not decode: its files are kept (never the response body in a log:
    /// see [`crate::kube::decode`]). Settled: a fix arrives as a watch event.
    fn undecodable(&self, object: &ObjectSpec, err: &DecodeError) -> bool {
        let label = object.label();
        tracing::error!(object = %label, field = %err.field, reason = %err.reason, "cannot decode the object; previous files kept");
        self.count(object, "error");
        self.readiness.block(&label, "the object cannot be decoded");
        self.event(
            "CertificateUpdateFailed",
            &label,
            format!("Cannot decode {label}: {err}"),
            true,
        );
        true
    }

    /// Every sink written. A refusal (content that does not fit a sink) or a failure keeps that
    /// sink's previous files and counts the object as `error`, with a warning Event; only a
    /// failure is worth retrying. Otherwise the object is ready, counted `written` when some sink
    /// changed (with an Event after every file is in place) or `unchanged`.
    async fn write(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        let label = object.label();
        let shared = fetched.clone();
        let answers = self
            .each_sink(object, move |sink| sink.write(&shared))
            .await;
        let mut written = Vec::new();
        let mut refused = None;
        let mut failed = None;
        for (path, answer) in answers {
            match answer {
                Ok(Wrote::Written) => {
                    tracing::info!(object = %label, secret.resource_version = %fetched.resource_version, path = %path.display(), keys = ?fetched.data.keys().collect::<Vec<_>>(), "written");
                    written.push(path);
                }
                Ok(Wrote::Unchanged) => {
                    tracing::debug!(object = %label, secret.resource_version = %fetched.resource_version, path = %path.display(), "unchanged on disk");
                }
                Err(SinkError::Refused(why)) => {
                    tracing::error!(object = %label, path = %path.display(), %why, "refused; previous file kept");
                    refused.get_or_insert(why);
                }
                Err(SinkError::Failed(why)) => {
                    tracing::error!(object = %label, path = %path.display(), error = %why, "cannot write; previous files kept");
                    failed.get_or_insert(why);
                }
            }
        }
        if let Some(why) = refused.as_ref().or(failed.as_ref()) {
            self.count(object, "error");
            self.event(
                "CertificateUpdateFailed",
                &label,
                format!("Cannot write {label}: {why}"),
                true,
            );
            if let Some(why) = refused {
                self.readiness.block(&label, why);
            }
            return failed.is_none();
        }
        self.readiness.clear(&label);
        self.synced(object, fetched);
        if written.is_empty() {
            self.count(object, "unchanged");
            return true;
        }
        self.count(object, "written");
        // After every file of the object is in place: consumers never wait for the apiserver
        // to accept an Event.
        let paths: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        self.event(
            "CertificateUpdated",
            &label,
            format!(
                "Wrote {label} (resourceVersion {}) to {}",
                fetched.resource_version,
                paths.join(", ")
            ),
            false,
        );
        true
    }

    async fn absent(&self, object: &ObjectSpec) -> bool {
        let label = object.label();
        if object.required {
            tracing::error!(object = %label, "required object is absent; keeping its files");
            self.readiness.block(&label, "absent from the apiserver");
            self.count(object, "error");
            // Its creation arrives as a watch event.
            return true;
        }
        let mut settled = true;
        let mut removed = Vec::new();
        for (path, answer) in self.each_sink(object, |sink| sink.remove()).await {
            match answer {
                Ok(true) => removed.push(path.display().to_string()),
                Ok(false) => {}
                Err(err) => {
                    tracing::error!(object = %label, path = %path.display(), error = %err, "cannot remove the files of an absent object");
                    settled = false;
                }
            }
        }
        if settled {
            self.metrics.forget(object.kind.label(), &object.name);
        }
        if removed.is_empty() {
            tracing::debug!(object = %label, "optional object absent; nothing on disk");
        } else {
            tracing::info!(object = %label, paths = ?removed, "optional object deleted; its files removed");
            self.count(object, "removed");
            self.event(
                "CertificateRemoved",
                &label,
                format!("Removed the files of {label}"),
                false,
            );
        }
        settled
    }

    /// Makes the disk match `desired` again (the resync): every sink rewrites what was changed
    /// or removed behind our back, and the files of an optional object that is absent go. Only
    /// files are read and written; each repair is logged and counted with its reason
    /// (`cert_syncer_resync_repairs_total`), every resync counted
    /// (`cert_syncer_resyncs_total`); a failed repair is logged and tried again at the next
    /// resync. `false` when a repair failed.
    pub async fn resync(&self, object: &ObjectSpec, desired: &Desired) -> bool {
        let answers = match desired {
            Desired::Present(fetched) => {
                let shared = fetched.clone();
                self.each_sink(object, move |sink| sink.repair(&shared))
                    .await
            }
            Desired::Absent if !object.required => {
                self.each_sink(object, |sink| sink.repair_absent()).await
            }
            // Kept on purpose: a required object that is absent, one that does not decode.
            Desired::Absent | Desired::Undecodable(_) => Vec::new(),
        };
        let mut settled = true;
        for (path, answer) in answers {
            match answer {
                Ok(Some(reason)) => self.repaired(object, &path, reason),
                Ok(None) => {}
                Err(err) => {
                    tracing::error!(object = %object.label(), path = %path.display(), error = %err, "resync: cannot repair; retrying at the next resync");
                    settled = false;
                }
            }
        }
        self.metrics
            .resyncs
            .get_or_create(&ObjectLabels {
                kind: object.kind.label(),
                name: object.name.clone(),
            })
            .inc();
        settled
    }

    fn repaired(&self, object: &ObjectSpec, path: &std::path::Path, reason: &'static str) {
        let label = object.label();
        tracing::warn!(object = %label, path = %path.display(), reason, "resync: the disk did not match the last seen object; repaired");
        self.metrics
            .resync_repairs
            .get_or_create(&RepairLabels {
                kind: object.kind.label(),
                name: object.name.clone(),
                reason,
            })
            .inc();
        self.event(
            "CertificateDriftRepaired",
            &label,
            format!(
                "{} did not match {label} ({reason}); rewritten from the last seen object",
                path.display()
            ),
            true,
        );
    }

    /// Records an Event without waiting for the apiserver (rate-limited by the recorder).
    fn event(&self, reason: &'static str, object: &str, message: String, warning: bool) {
        let events = Arc::clone(&self.events);
        let object = object.to_owned();
        tokio::spawn(async move { events.record(reason, &object, message, warning).await });
    }

    pub fn count(&self, object: &ObjectSpec, result: &'static str) {
        self.metrics
            .syncs
            .get_or_create(&ResultLabels {
                kind: object.kind.label(),
                name: object.name.clone(),
                result,
            })
            .inc();
    }

    fn synced(&self, object: &ObjectSpec, fetched: &Fetched) {
        self.metrics
            .last_sync
            .get_or_create(&ObjectLabels {
                kind: object.kind.label(),
                name: object.name.clone(),
            })
            .set(crate::base::time::unix_now());
        let not_after: BTreeMap<String, i64> = fetched
            .data
            .iter()
            .filter_map(|(key, bytes)| {
                let first = crate::pki::pem::blocks_skipping_torn(bytes)
                    .ok()?
                    .into_iter()
                    .find(|b| b.label == "CERTIFICATE")?;
                let info = reload_lib::CertInfo::from_der(&first.der).ok()?;
                Some((key.clone(), info.not_after))
            })
            .collect();
        self.metrics
            .set_not_after(object.kind.label(), &object.name, &not_after);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::base::kind::Kind;
    use crate::sync::files::FileMapping;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::Duration;

    pub(in crate::sync) fn applier(destination: &Path, files: Vec<FileMapping>) -> Applier {
        let settings = Settings {
            connection: crate::kube::connection::Settings {
                kubeconfig: None,
                context: None,
                server: None,
                ca_file: None,
                token_file: None,
                tls_server_name_override: None,
                insecure_plain_http: false,
                connect_timeout: Duration::from_secs(1),
                read_idle_timeout: Duration::from_secs(1),
            },
            namespace: "ns".to_owned(),
            destination: destination.to_owned(),
            objects: Vec::new(),
            files,
            namespace_watch_threshold: 50,
            metrics_listen: None,
            pod_name: None,
            auth_failure_exit_after: Duration::from_secs(60),
            write_parallelism: 1,
            resync_interval: Duration::from_secs(600),
        };
        let client = crate::kube::fake_api::FakeApi::new().client();
        Applier {
            settings: Arc::new(settings),
            metrics: Metrics::default(),
            readiness: Readiness::default(),
            events: Arc::new(EventRecorder::new(client, "ns", None)),
        }
    }

    fn repairs(applier: &Applier, name: &str, reason: &'static str) -> u64 {
        applier
            .metrics
            .resync_repairs
            .get_or_create(&RepairLabels {
                kind: "secret",
                name: name.to_owned(),
                reason,
            })
            .get()
    }

    #[tokio::test]
    async fn the_resync_repairs_what_changed_on_disk_once_and_leaves_a_matching_disk_alone() {
        let dir = tempfile::tempdir().unwrap();
        let destination = dir.path().join("resources");
        let host = dir.path().join("ca.crt");
        let ca = crate::pki::new_signer(
            "ca",
            1_900_000_000,
            Duration::ZERO,
            Duration::from_secs(86_400),
        )
        .unwrap();
        let files = vec![FileMapping {
            kind: Kind::Secret,
            name: "a".to_owned(),
            key: "tls.crt".to_owned(),
            path: host.clone(),
        }];
        let applier = applier(&destination, files);
        let object = ObjectSpec {
            kind: Kind::Secret,
            name: "a".to_owned(),
            required: true,
            mirror: true,
        };
        let fetched = Fetched {
            resource_version: "1".to_owned(),
            data: BTreeMap::from([
                ("tls.crt".to_owned(), ca.cert_pem().into_bytes()),
                ("tls.key".to_owned(), ca.key_pem.clone().into_bytes()),
            ]),
        };
        let desired = Desired::Present(fetched);
        assert!(applier.apply(&object, &desired).await);
        let object_dir = destination.join("secrets/a");
        let generation = std::fs::read_link(object_dir.join("..data")).unwrap();

        // In step: only read.
        assert!(applier.resync(&object, &desired).await);
        assert_eq!(
            std::fs::read_link(object_dir.join("..data")).unwrap(),
            generation
        );
        assert_eq!(repairs(&applier, "a", "changed"), 0);

        // A file changed through its link, and the host file removed.
        std::fs::write(object_dir.join("tls.key"), "tampered").unwrap();
        std::fs::remove_file(&host).unwrap();
        assert!(applier.resync(&object, &desired).await);
        assert_eq!(
            std::fs::read_to_string(object_dir.join("tls.key")).unwrap(),
            ca.key_pem
        );
        assert_eq!(std::fs::read_to_string(&host).unwrap(), ca.cert_pem());
        assert_eq!(repairs(&applier, "a", "changed"), 1);
        assert_eq!(repairs(&applier, "a", "missing"), 1, "the host file");

        // A key's link removed; then the whole directory.
        std::fs::remove_file(object_dir.join("tls.crt")).unwrap();
        assert!(applier.resync(&object, &desired).await);
        assert!(object_dir.join("tls.crt").exists());
        assert_eq!(repairs(&applier, "a", "file-removed"), 1);
        std::fs::remove_dir_all(&object_dir).unwrap();
        assert!(applier.resync(&object, &desired).await);
        assert_eq!(
            std::fs::read_to_string(object_dir.join("tls.crt")).unwrap(),
            ca.cert_pem()
        );
        assert_eq!(repairs(&applier, "a", "missing"), 2);

        // Nothing left to repair: the counts stay.
        assert!(applier.resync(&object, &desired).await);
        assert_eq!(
            repairs(&applier, "a", "missing")
                + repairs(&applier, "a", "changed")
                + repairs(&applier, "a", "file-removed"),
            4
        );

        // An optional object seen absent: a directory that reappears is removed.
        let optional = ObjectSpec {
            name: "b".to_owned(),
            required: false,
            ..object.clone()
        };
        std::fs::create_dir_all(destination.join("secrets/b")).unwrap();
        assert!(applier.resync(&optional, &Desired::Absent).await);
        assert!(!destination.join("secrets/b").exists());
        assert_eq!(repairs(&applier, "b", "unexpected-directory"), 1);
    }

    /// The `cert_syncer_certificate_not_after_timestamp_seconds` lines of `applier`'s metrics
    /// (the family's handle shares its series with the applier's).
    fn not_after_lines(applier: &Applier) -> Vec<String> {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("not_after", "", applier.metrics.not_after.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .filter(|l| l.starts_with("not_after{"))
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn the_not_after_of_a_key_or_an_optional_object_that_is_gone_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let applier = applier(&dir.path().join("resources"), Vec::new());
        let (ca, other) = (
            crate::pki::new_signer(
                "ca",
                1_900_000_000,
                Duration::ZERO,
                Duration::from_secs(86_400),
            )
            .unwrap(),
            crate::pki::new_signer(
                "other",
                1_900_000_000,
                Duration::ZERO,
                Duration::from_secs(7_200),
            )
            .unwrap(),
        );
        let object = ObjectSpec {
            kind: Kind::Secret,
            name: "user-serving-cert-003".to_owned(),
            required: false,
            mirror: true,
        };
        let version = |keys: &[(&str, &str)]| {
            Desired::Present(Fetched {
                resource_version: "1".to_owned(),
                data: keys
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                    .collect(),
            })
        };
        let both = version(&[
            ("tls.crt", &ca.cert_pem()),
            ("tls.key", &ca.key_pem),
            ("ca.crt", &other.cert_pem()),
        ]);
        assert!(applier.apply(&object, &both).await);
        let lines = not_after_lines(&applier);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines.iter().any(|l| l.contains(r#"key="ca.crt""#)),
            "{lines:?}"
        );

        // The key `ca.crt` removed from the object: its series goes, the other stays.
        let one = version(&[("tls.crt", &ca.cert_pem()), ("tls.key", &ca.key_pem)]);
        assert!(applier.apply(&object, &one).await);
        let lines = not_after_lines(&applier);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains(r#"key="tls.crt""#), "{lines:?}");

        // The optional object deleted: its files and its series go.
        assert!(applier.apply(&object, &Desired::Absent).await);
        assert_eq!(not_after_lines(&applier), Vec::<String>::new());
    }
}
