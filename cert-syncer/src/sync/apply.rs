//! What an object's state means on disk, for both ways of following (per object and
//! namespace-wide): write its directory and its `--file` host files, keep or remove its files
//! when it is absent, keep them when it does not decode; count every outcome, set readiness, and
//! record a Kubernetes Event once the files are written (spawned, never awaited before a write).
//!
//! [`Applier::resync`] re-applies the last state seen to the disk when the resync period comes,
//! repairing what was changed or removed behind the syncer's back, from memory: no API request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use reload_lib::fs::{AtomicDirWriter, WriteOutcome};

use super::files::{self, FileMapping};
use super::settings::{ObjectSpec, Settings};
use crate::base::readiness::Readiness;
use crate::kube::decode::DecodeError;
use crate::kube::events::EventRecorder;
use crate::kube::fetched::Fetched;
use crate::sync::metrics::{KeyLabels, Metrics, ObjectLabels, RepairLabels, ResultLabels};

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

/// Applies states to the disk. One per run, shared by every object's task.
pub(crate) struct Applier {
    pub settings: Arc<Settings>,
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub events: Arc<EventRecorder>,
}

impl Applier {
    /// Writes, keeps or removes; `false` when it failed in a way worth retrying.
    pub async fn apply(&self, object: &ObjectSpec, desired: &Desired) -> bool {
        match desired {
            Desired::Present(fetched) => self.write(object, fetched).await,
            Desired::Undecodable(err) => self.undecodable(object, err),
            Desired::Absent => self.absent(object).await,
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

    async fn write(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        if !object.mirror {
            // write_files blocks readiness again for a key that is missing or not PEM.
            self.readiness.clear(&object.label());
            self.synced(object, fetched);
            return self.write_files(object, fetched).await;
        }
        let dir = self.object_dir(object);
        let writer = self.writer(object);
        let payload = fetched.payload(object.kind);
        let outcome = tokio::task::spawn_blocking(move || writer.write(&payload)).await;
        let label = object.label();
        let written = match outcome {
            Ok(Ok(WriteOutcome::Unchanged)) => {
                tracing::debug!(object = %label, secret.resource_version = %fetched.resource_version, "unchanged on disk");
                self.count(object, "unchanged");
                false
            }
            Ok(Ok(outcome)) => {
                tracing::info!(object = %label, secret.resource_version = %fetched.resource_version, dir = %dir.display(), keys = ?fetched.data.keys().collect::<Vec<_>>(), ?outcome, "written");
                self.count(object, "written");
                true
            }
            Ok(Err(err)) => {
                tracing::error!(object = %label, error = %crate::base::error::chain(&err), "cannot write; previous files kept");
                self.count(object, "error");
                self.event(
                    "CertificateUpdateFailed",
                    &label,
                    format!("Cannot write {label}: {err}"),
                    true,
                );
                // A bad key will not fix itself; a failed write (disk full, I/O) may.
                return matches!(err, reload_lib::fs::Error::InvalidKey { .. });
            }
            Err(err) => {
                tracing::error!(object = %label, error = %crate::base::error::chain(&err), "write task failed; previous files kept");
                self.count(object, "error");
                return false;
            }
        };
        self.readiness.clear(&label);
        self.synced(object, fetched);
        let settled = self.write_files(object, fetched).await;
        if written {
            // After every file of the object is in place: consumers never wait for the
            // apiserver to accept an Event.
            self.event(
                "CertificateUpdated",
                &label,
                format!(
                    "Wrote {label} (resourceVersion {}) to {}",
                    fetched.resource_version,
                    dir.display()
                ),
                false,
            );
        }
        settled
    }

    async fn absent(&self, object: &ObjectSpec) -> bool {
        let label = object.label();
        if object.required {
            if object.mirror {
                tracing::error!(object = %label, "required object is absent; keeping its files");
            } else {
                tracing::error!(object = %label, "the object of a --file mapping is absent; host file kept, not ready");
            }
            self.readiness.block(&label, "absent from the apiserver");
            self.count(object, "error");
            // Its creation arrives as a watch event.
            return true;
        }
        let writer = self.writer(object);
        match tokio::task::spawn_blocking(move || writer.remove_all()).await {
            Ok(Ok(true)) => {
                tracing::info!(object = %label, "optional object deleted; directory removed");
                self.count(object, "removed");
                self.event(
                    "CertificateRemoved",
                    &label,
                    format!("Removed the files of {label}"),
                    false,
                );
            }
            Ok(Ok(false)) => {
                tracing::debug!(object = %label, "optional object absent; nothing on disk")
            }
            Ok(Err(err)) => {
                tracing::error!(object = %label, error = %crate::base::error::chain(&err), "cannot remove the directory");
                return false;
            }
            Err(err) => {
                tracing::error!(object = %label, error = %crate::base::error::chain(&err), "remove task failed");
                return false;
            }
        }
        true
    }

    /// `--file` mappings of this object: certificates only, replaced atomically. `false` when a
    /// write failed (retried); content that is not PEM certificates is refused for good.
    async fn write_files(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        let mut settled = true;
        for (mapping, content) in self.host_files(object, fetched) {
            let bytes = match content {
                Ok(bytes) => bytes,
                Err(why) => {
                    tracing::error!(object = %object.label(), path = %mapping.path.display(), %why, "host file kept");
                    self.readiness.block(&object.label(), why);
                    continue;
                }
            };
            match write_host_file(&mapping.path, bytes).await {
                Ok(_) => tracing::info!(
                    "synced {}/{}/{} key {} from resourceVersion {} to {}",
                    object.kind.label(),
                    self.settings.namespace,
                    object.name,
                    mapping.key,
                    fetched.resource_version,
                    mapping.path.display()
                ),
                Err(error) => {
                    tracing::error!(path = %mapping.path.display(), %error, "cannot write host file");
                    settled = false;
                }
            }
        }
        settled
    }

    /// The `--file` mappings of `object`, each with the bytes it gets or why it gets none (the
    /// key is missing, or it is not PEM certificates).
    fn host_files<'a>(
        &'a self,
        object: &'a ObjectSpec,
        fetched: &'a Fetched,
    ) -> impl Iterator<Item = (&'a FileMapping, Result<&'a [u8], String>)> + 'a {
        self.settings
            .files
            .iter()
            .filter(move |f| f.kind == object.kind && f.name == object.name)
            .map(move |mapping| {
                let key = &mapping.key;
                let content = match fetched.data.get(key) {
                    None => Err(format!("--file key {key} missing from the object")),
                    Some(bytes) => files::check_certificates(bytes)
                        .map(|_| bytes.as_slice())
                        .map_err(|reason| {
                            format!("--file key {key} is not PEM certificates: {reason}")
                        }),
                };
                (mapping, content)
            })
    }

    /// Makes the disk match `desired` again (the resync): rewrites an object's directory or
    /// host file that was changed or removed behind our back, and removes the directory of an
    /// optional object that is absent. Only files are read and written; each repair is logged
    /// and counted with its reason (`cert_syncer_resync_repairs_total`); a failed repair is
    /// logged and tried again at the next resync. `false` when a repair failed.
    pub async fn resync(&self, object: &ObjectSpec, desired: &Desired) -> bool {
        match desired {
            Desired::Present(fetched) => {
                let mut settled = true;
                if object.mirror {
                    settled &= self.resync_dir(object, fetched).await;
                }
                settled & self.resync_files(object, fetched).await
            }
            Desired::Absent if !object.required && object.mirror => {
                let dir = self.object_dir(object);
                if !dir.exists() {
                    return true;
                }
                let writer = self.writer(object);
                match tokio::task::spawn_blocking(move || writer.remove_all()).await {
                    Ok(Ok(removed)) => {
                        if removed {
                            self.repaired(object, &dir, "unexpected-directory");
                        }
                        true
                    }
                    Ok(Err(err)) => {
                        tracing::error!(object = %object.label(), error = %crate::base::error::chain(&err), "resync: cannot remove the directory of an absent object");
                        false
                    }
                    Err(err) => {
                        tracing::error!(object = %object.label(), error = %crate::base::error::chain(&err), "resync: remove task failed");
                        false
                    }
                }
            }
            // Kept on purpose: a required object that is absent, one that does not decode.
            Desired::Absent | Desired::Undecodable(_) => true,
        }
    }

    async fn resync_dir(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        let dir = self.object_dir(object);
        let writer = self.writer(object);
        let payload = fetched.payload(object.kind);
        let keys: Vec<String> = payload.keys().cloned().collect();
        let outcome = tokio::task::spawn_blocking(move || {
            let before = drift(writer.dir(), &keys);
            writer.write(&payload).map(|outcome| (before, outcome))
        })
        .await;
        match outcome {
            Ok(Ok((before, WriteOutcome::Unchanged))) => {
                // The writer re-creates a removed key link without a new generation.
                if let Some(reason) = before {
                    self.repaired(object, &dir, reason);
                }
                true
            }
            Ok(Ok((before, _written))) => {
                self.repaired(object, &dir, before.unwrap_or("changed"));
                true
            }
            Ok(Err(err)) => {
                tracing::error!(object = %object.label(), error = %crate::base::error::chain(&err), "resync: cannot rewrite the directory; retrying at the next resync");
                false
            }
            Err(err) => {
                tracing::error!(object = %object.label(), error = %crate::base::error::chain(&err), "resync: write task failed");
                false
            }
        }
    }

    async fn resync_files(&self, object: &ObjectSpec, fetched: &Fetched) -> bool {
        let mut settled = true;
        for (mapping, content) in self.host_files(object, fetched) {
            // Content refused when it arrived (the process is not ready): the host file is kept.
            let Ok(bytes) = content else {
                continue;
            };
            let existed = mapping.path.exists();
            match write_host_file(&mapping.path, bytes).await {
                Ok(true) => self.repaired(
                    object,
                    &mapping.path,
                    if existed { "changed" } else { "missing" },
                ),
                Ok(false) => {}
                Err(error) => {
                    tracing::error!(path = %mapping.path.display(), %error, "resync: cannot rewrite the host file");
                    settled = false;
                }
            }
        }
        settled
    }

    fn repaired(&self, object: &ObjectSpec, path: &Path, reason: &'static str) {
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

    /// The writer of an object's directory: no symlink below the destination is followed
    /// (`secrets/`, `secrets/<name>`), so writes and deletes stay inside it.
    fn writer(&self, object: &ObjectSpec) -> AtomicDirWriter {
        AtomicDirWriter::new(self.object_dir(object)).with_root(&self.settings.destination)
    }

    pub fn object_dir(&self, object: &ObjectSpec) -> PathBuf {
        // The name was validated as a DNS subdomain: one safe path component.
        self.settings
            .destination
            .join(object.kind.dir())
            .join(&object.name)
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
        for (key, bytes) in &fetched.data {
            use rustls_pki_types::pem::PemObject;
            let Some(Ok(first)) = rustls_pki_types::CertificateDer::pem_slice_iter(bytes).next()
            else {
                continue;
            };
            if let Ok(info) = reload_lib::CertInfo::from_der(&first) {
                self.metrics
                    .not_after
                    .get_or_create(&KeyLabels {
                        kind: object.kind.label(),
                        name: object.name.clone(),
                        key: key.clone(),
                    })
                    .set(info.not_after);
            }
        }
    }
}

/// One host file (certificates, 0644), replaced atomically off the runtime. `Ok(true)` when it
/// was written, `Ok(false)` when it already held exactly these bytes.
async fn write_host_file(path: &Path, bytes: &[u8]) -> Result<bool, String> {
    let (path, bytes) = (path.to_owned(), bytes.to_vec());
    match tokio::task::spawn_blocking(move || {
        reload_lib::fs::write_file_atomic(&path, &bytes, 0o644)
    })
    .await
    {
        Ok(Ok(written)) => Ok(written),
        Ok(Err(err)) => Err(crate::base::error::chain(&err).to_string()),
        Err(err) => Err(format!(
            "host file task failed: {}",
            crate::base::error::chain(&err)
        )),
    }
}

/// What is visibly wrong with an object's directory before a resync rewrites it: no committed
/// generation at all (`missing`), or a key's link gone (`file-removed`). Content that differs
/// is found by the writer itself (it rewrites: `changed`).
fn drift(dir: &Path, keys: &[String]) -> Option<&'static str> {
    if reload_lib::fs::current_generation(dir).is_none() {
        return Some("missing");
    }
    keys.iter()
        .any(|key| std::fs::symlink_metadata(dir.join(key)).is_err())
        .then_some("file-removed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::kind::Kind;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn applier(destination: &Path, files: Vec<FileMapping>) -> Applier {
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

    #[test]
    fn drift_names_a_missing_directory_and_a_removed_key() {
        let dir = tempfile::tempdir().unwrap();
        let object = dir.path().join("secrets/a");
        let keys = vec!["tls.crt".to_owned()];
        assert_eq!(drift(&object, &keys), Some("missing"));
        let writer = AtomicDirWriter::new(&object);
        writer
            .write(&BTreeMap::from([(
                "tls.crt".to_owned(),
                reload_lib::fs::FileContent::new(b"x".to_vec(), 0o600),
            )]))
            .unwrap();
        assert_eq!(drift(&object, &keys), None);
        std::fs::remove_file(object.join("tls.crt")).unwrap();
        assert_eq!(drift(&object, &keys), Some("file-removed"));
    }
}
