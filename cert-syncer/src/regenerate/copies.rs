//! Copies of an object's data into another object of the same kind (library-go's
//! resource-sync, as the kube-controller-manager's cert-recovery-controller runs it): written
//! only when the data (and a Secret's type) differ, with the source's labels and annotations
//! merged on a write. A missing source leaves the copy as it is: library-go's resource-sync
//! would delete it, and removing the last good material is never ours to do.
//!
//! Nor is replacing it with worse: a source is copied only when it holds usable material (a
//! Secret: `tls.crt` and `tls.key` that parse and fit; a ConfigMap: a `ca-bundle.crt` that
//! parses whole, with at least one certificate) that is not worse than what the copy holds
//! (see [`Quality`]). An emptied, truncated, expired or garbage source leaves the copy as it
//! is, fails the item and records a `CopyRefused` Event naming both objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::cache::Cached;
use super::config::{ObjectCopy, ObjectRef};
use super::intermediate_pass::{MAX_ATTEMPTS, refuse_foreign_type};
use super::pass::{Pass, Report, Written};
use crate::base::error::{chain, is_conflict};
use crate::base::kind::Kind as ObjectKind;
use crate::base::time::rfc3339;
use crate::pki::{self, KeyPairPem};

impl Pass<'_> {
    /// Copies the source's data (and, for a Secret, its type) onto the copy when they differ;
    /// the source's labels and annotations go along on a write, as library-go's resource-sync
    /// copies them.
    pub(super) async fn ensure_copy(
        &self,
        copy: &ObjectCopy,
        report: &mut Report,
    ) -> Result<(), String> {
        for _ in 0..MAX_ATTEMPTS {
            let outcome = match copy.kind {
                ObjectKind::Secret => self.copy_secret(copy, report).await?,
                ObjectKind::ConfigMap => self.copy_config_map(copy, report).await?,
            };
            match outcome {
                CopyOutcome::Done(reason_label) => {
                    tracing::info!(from = %copy.from, to = %copy.to, reason = reason_label, "copied");
                    report.written.push(Written {
                        kind: "copy",
                        object: copy.to.clone(),
                        reason: format!("copy of {} ({reason_label})", copy.from),
                        reason_label,
                    });
                    return Ok(());
                }
                CopyOutcome::Nothing => return Ok(()),
                CopyOutcome::Conflict => {
                    report.conflicts += 1;
                    tracing::info!(object = %copy.to, "changed since read (conflict); reading again");
                }
            }
        }
        Err(format!("still conflicting after {MAX_ATTEMPTS} attempts"))
    }

    async fn copy_secret(
        &self,
        copy: &ObjectCopy,
        report: &mut Report,
    ) -> Result<CopyOutcome, String> {
        let to: Api<Secret> = Api::namespaced(self.client.clone(), &copy.to.namespace);
        let Some(source) = self.read_object::<Secret>(&copy.from).await? else {
            tracing::debug!(source = %copy.from, copy = %copy.to, "source missing; the copy is left as it is");
            return Ok(CopyOutcome::Nothing);
        };
        let existing = self.read_object::<Secret>(&copy.to).await?;
        refuse_foreign_type(&copy.to, existing.as_ref())?;
        let same = existing.as_ref().is_some_and(|e| {
            e.data.clone().unwrap_or_default() == source.data.clone().unwrap_or_default()
                && e.type_ == source.type_
        });
        if same {
            return Ok(CopyOutcome::Nothing);
        }
        if let Some(e) = &existing
            && e.type_ != source.type_
        {
            return Err(format!(
                "has type {}, the source {} has type {}: a Secret's type cannot change; delete the copy to let it be recreated",
                e.type_.as_deref().unwrap_or("Opaque"),
                copy.from,
                source.type_.as_deref().unwrap_or("Opaque")
            ));
        }
        let quality = |secret: &Secret| pair_quality(secret.data.as_ref(), self.now);
        self.refuse_worse(copy, quality(&source), existing.as_ref().map(quality))
            .await?;
        let mut secret = existing.clone().unwrap_or_else(|| Secret {
            metadata: object_meta(&copy.to),
            type_: source.type_.clone(),
            ..Secret::default()
        });
        secret.data = source.data.clone();
        merge_metadata(&mut secret.metadata, &source.metadata);
        if self.copy_held(copy, existing.is_none(), report).await {
            return Ok(CopyOutcome::Nothing);
        }
        self.may_write(&copy.to)?;
        let result = match &existing {
            None => to.create(&PostParams::default(), &secret).await,
            Some(_) => {
                to.replace(&copy.to.name, &PostParams::default(), &secret)
                    .await
            }
        };
        self.outcome(&copy.to, existing.as_ref(), result).await
    }

    async fn copy_config_map(
        &self,
        copy: &ObjectCopy,
        report: &mut Report,
    ) -> Result<CopyOutcome, String> {
        let to: Api<ConfigMap> = Api::namespaced(self.client.clone(), &copy.to.namespace);
        let Some(source) = self.read_object::<ConfigMap>(&copy.from).await? else {
            tracing::debug!(source = %copy.from, copy = %copy.to, "source missing; the copy is left as it is");
            return Ok(CopyOutcome::Nothing);
        };
        let existing = self.read_object::<ConfigMap>(&copy.to).await?;
        if existing.as_ref().is_some_and(|e| {
            e.data.clone().unwrap_or_default() == source.data.clone().unwrap_or_default()
        }) {
            return Ok(CopyOutcome::Nothing);
        }
        let quality = |map: &ConfigMap| bundle_quality(map.data.as_ref(), self.now);
        self.refuse_worse(copy, quality(&source), existing.as_ref().map(quality))
            .await?;
        let mut map = existing.clone().unwrap_or_else(|| ConfigMap {
            metadata: object_meta(&copy.to),
            ..ConfigMap::default()
        });
        map.data = source.data.clone();
        merge_metadata(&mut map.metadata, &source.metadata);
        if self.copy_held(copy, existing.is_none(), report).await {
            return Ok(CopyOutcome::Nothing);
        }
        self.may_write(&copy.to)?;
        let result = match &existing {
            None => to.create(&PostParams::default(), &map).await,
            Some(_) => {
                to.replace(&copy.to.name, &PostParams::default(), &map)
                    .await
            }
        };
        self.outcome(&copy.to, existing.as_ref(), result).await
    }

    /// Whether the write budget withholds this write of the copy (see `brake`).
    async fn copy_held(&self, copy: &ObjectCopy, missing: bool, report: &mut Report) -> bool {
        let resource = match copy.kind {
            ObjectKind::Secret => "secret",
            ObjectKind::ConfigMap => "configmap",
        };
        let label = if missing { "missing" } else { "source-changed" };
        let reason = format!("copy of {}", copy.from);
        self.held("copy", resource, &copy.to, label, &reason, report)
            .await
    }

    /// Refuses a copy whose source is unusable, or worse than the copy (`None`: absent): the
    /// copy is kept, a `CopyRefused` Event names both objects, and the item fails.
    async fn refuse_worse(
        &self,
        copy: &ObjectCopy,
        source: Quality,
        existing: Option<Quality>,
    ) -> Result<(), String> {
        let why = match (&source, &existing) {
            (Quality::Unusable(problem), _) => {
                format!("the source {} is unusable: {problem}", copy.from)
            }
            (_, Some(current)) if source < *current => format!(
                "the source {} ({source}) is worse than the copy ({current})",
                copy.from
            ),
            _ => return Ok(()),
        };
        let kept = if existing.is_some() {
            "kept as it is"
        } else {
            "not created"
        };
        let message = format!("copy {} {kept}: {why}", copy.to);
        tracing::warn!(from = %copy.from, to = %copy.to, "{message}");
        self.events
            .record(
                "CopyRefused",
                &format!("{}/{}", copy.kind.label(), copy.to),
                message.clone(),
                true,
            )
            .await;
        Err(format!("not copied from {}: {why}", copy.from))
    }

    /// The object as the pass reads it (the cache in the loop, a GET with `--once`).
    async fn read_object<K: Cached>(&self, object: &ObjectRef) -> Result<Option<K>, String> {
        self.read::<K>(object)
            .await
            .map_err(|err| format!("cannot read {object}: {err}"))
    }

    /// What a write of the copy `object`, decided on `read`, came to: a success goes into the
    /// cache; a conflict waits until the watch brings the version that won (the caller reads
    /// again).
    async fn outcome<K: Cached>(
        &self,
        object: &ObjectRef,
        read: Option<&K>,
        result: Result<K, kube::Error>,
    ) -> Result<CopyOutcome, String> {
        match result {
            Ok(written) => {
                self.remember(object, read, &written);
                Ok(CopyOutcome::Done(if read.is_none() {
                    "missing"
                } else {
                    "changed"
                }))
            }
            Err(err) if is_conflict(&err) => {
                self.read_again(object, read)
                    .await
                    .map_err(|err| format!("after a conflict: {err}"))?;
                Ok(CopyOutcome::Conflict)
            }
            Err(err) => Err(format!("cannot write: {}", chain(&err))),
        }
    }
}

enum CopyOutcome {
    Done(&'static str),
    Nothing,
    Conflict,
}

fn object_meta(object: &ObjectRef) -> ObjectMeta {
    ObjectMeta {
        name: Some(object.name.clone()),
        namespace: Some(object.namespace.clone()),
        ..ObjectMeta::default()
    }
}

/// The source's labels and annotations over the copy's own.
fn merge_metadata(copy: &mut ObjectMeta, source: &ObjectMeta) {
    if let Some(labels) = &source.labels {
        copy.labels
            .get_or_insert_with(BTreeMap::new)
            .extend(labels.clone());
    }
    if let Some(annotations) = &source.annotations {
        copy.annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations.clone());
    }
}

/// How good the material of a copy or its source is; a source is copied only when it is
/// usable and not worse than the copy. Ordered worst first: unusable, expired (later expiry
/// better), valid. Two valid ones are equal: a renewed source may expire earlier than the
/// copy it replaces (a new signer), and is copied.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Quality {
    /// Empty, truncated, not PEM, a key that does not fit: never copied.
    Unusable(String),
    /// Parses, but expired (the latest notAfter of its certificates).
    Expired(i64),
    /// Parses and holds an unexpired certificate.
    Valid,
}

impl std::fmt::Display for Quality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Quality::Unusable(problem) => write!(f, "unusable: {problem}"),
            Quality::Expired(not_after) => write!(f, "expired at {}", rfc3339(*not_after)),
            Quality::Valid => f.write_str("valid"),
        }
    }
}

/// A Secret's `tls.crt` and `tls.key` as a pair.
fn pair_quality(data: Option<&BTreeMap<String, k8s_openapi::ByteString>>, now: i64) -> Quality {
    let field = |key: &str| data.and_then(|d| d.get(key)).map(|b| b.0.as_slice());
    let (Some(cert), Some(key)) = (field("tls.crt"), field("tls.key")) else {
        return Quality::Unusable("no tls.crt and tls.key".to_owned());
    };
    match KeyPairPem::parse(cert, key) {
        Err(problem) => Quality::Unusable(problem),
        Ok(pair) if pair.cert().is_expired_at(now) => Quality::Expired(pair.cert().not_after),
        Ok(_) => Quality::Valid,
    }
}

/// A ConfigMap's `ca-bundle.crt` as a bundle: every block a certificate, at least one.
fn bundle_quality(data: Option<&BTreeMap<String, String>>, now: i64) -> Quality {
    let Some(pem) = data.and_then(|d| d.get("ca-bundle.crt")) else {
        return Quality::Unusable("no ca-bundle.crt".to_owned());
    };
    let (certs, problems) = pki::parse_bundle(pem.as_bytes());
    if let Some(problem) = problems.first() {
        return Quality::Unusable(format!("ca-bundle.crt: {problem}"));
    }
    if certs.is_empty() {
        return Quality::Unusable("ca-bundle.crt holds no certificate".to_owned());
    }
    if certs.iter().any(|c| !c.is_expired_at(now)) {
        Quality::Valid
    } else {
        Quality::Expired(certs.iter().map(|c| c.not_after).max().unwrap_or_default())
    }
}
