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
use kube::api::ObjectMeta;

use crate::base::kind::Kind as ObjectKind;
use crate::base::time::rfc3339;
use crate::pki::{self, KeyPairPem};
use crate::regenerate::config::{ObjectCopy, ObjectRef};
use crate::regenerate::ctx::{Ctx, Outcome};
use crate::regenerate::phases::bundles::as_stored;
use crate::regenerate::report::Report;
use crate::regenerate::trust::{BundleState, NotWritten};
use crate::regenerate::write::{Built, Change, Plan, Writable};

/// Runs the step of one declared copy. A ConfigMap copy is a CA bundle others may be built
/// from (kube-apiserver folds `openshift-config-managed/csr-controller-ca` into `client-ca`):
/// its outcome is the copy as stored.
pub(crate) async fn step(ctx: &Ctx<'_>, copy: &ObjectCopy, report: &mut Report) -> Outcome {
    let outcome = match copy.kind {
        ObjectKind::Secret => one::<Secret>(ctx, copy, report).await,
        ObjectKind::ConfigMap => one::<ConfigMap>(ctx, copy, report).await,
    };
    let failed = outcome.as_ref().err().cloned();
    if let Err(err) = outcome {
        report.fail(copy.kind.into(), &copy.to, err);
    }
    if copy.kind == ObjectKind::Secret {
        return Outcome::Done;
    }
    let stored = ctx.read_bundle(&copy.to).await.map(|(_, certs)| certs);
    Outcome::Bundle(match (stored, failed) {
        (Ok(certs), None) => as_stored(&copy.to, certs, report),
        (stored, failed) => BundleState {
            object: copy.to.clone(),
            stored,
            not_written: failed.map(NotWritten::Failed),
        },
    })
}

/// A kind of object a copy is made of.
trait Copied: Writable {
    /// Whether the copy already holds what the source holds.
    fn same(&self, source: &Self) -> bool;
    /// Why the copy cannot take the source's content as it is.
    fn mismatch(&self, _source: &Self, _from: &ObjectRef) -> Option<String> {
        None
    }
    fn quality(&self, now: i64) -> Quality;
    /// A new object named `object`, of the source's type.
    fn new_like(source: &Self, object: &ObjectRef) -> Self;
    /// Takes the source's content.
    fn take_data(&mut self, source: &Self);
}

impl Copied for Secret {
    fn same(&self, source: &Secret) -> bool {
        self.data.clone().unwrap_or_default() == source.data.clone().unwrap_or_default()
            && self.type_ == source.type_
    }
    fn mismatch(&self, source: &Secret, from: &ObjectRef) -> Option<String> {
        (self.type_ != source.type_).then(|| {
            format!(
                "has type {}, the source {from} has type {}: a Secret's type cannot change; delete the copy to let it be recreated",
                self.type_.as_deref().unwrap_or("Opaque"),
                source.type_.as_deref().unwrap_or("Opaque")
            )
        })
    }
    fn quality(&self, now: i64) -> Quality {
        pair_quality(self.data.as_ref(), now)
    }
    fn new_like(source: &Secret, object: &ObjectRef) -> Secret {
        Secret {
            metadata: object_meta(object),
            type_: source.type_.clone(),
            ..Secret::default()
        }
    }
    fn take_data(&mut self, source: &Secret) {
        self.data = source.data.clone();
    }
}

impl Copied for ConfigMap {
    fn same(&self, source: &ConfigMap) -> bool {
        self.data.clone().unwrap_or_default() == source.data.clone().unwrap_or_default()
    }
    fn quality(&self, now: i64) -> Quality {
        bundle_quality(self.data.as_ref(), now)
    }
    fn new_like(_: &ConfigMap, object: &ObjectRef) -> ConfigMap {
        ConfigMap {
            metadata: object_meta(object),
            ..ConfigMap::default()
        }
    }
    fn take_data(&mut self, source: &ConfigMap) {
        self.data = source.data.clone();
    }
}

/// Copies the source's data (and, for a Secret, its type) onto the copy when they differ; the
/// source's labels and annotations go along on a write, as library-go's resource-sync copies
/// them.
async fn one<K: Copied>(
    ctx: &Ctx<'_>,
    copy: &ObjectCopy,
    report: &mut Report,
) -> Result<(), String> {
    let read = |object: &ObjectRef| {
        let object = object.clone();
        async move {
            ctx.read::<K>(&object)
                .await
                .map_err(|err| format!("cannot read {object}: {err}"))
        }
    };
    let Some(source) = read(&copy.from).await? else {
        tracing::debug!(source = %copy.from, copy = %copy.to, "source missing; the copy is left as it is");
        return Ok(());
    };
    let existing = read(&copy.to).await?;
    let source = &source;
    ctx.write(
        "copy",
        &copy.to,
        existing,
        report,
        |existing: Option<&K>| {
            if existing.is_some_and(|e| e.same(source)) {
                return Ok(Plan::Keep(()));
            }
            if let Some(problem) = existing.and_then(|e| e.mismatch(source, &copy.from)) {
                return Err(problem);
            }
            refuse_worse(
                ctx,
                copy,
                source.quality(ctx.now),
                existing.map(|e| e.quality(ctx.now)),
            )?;
            let label = if existing.is_none() {
                "missing"
            } else {
                "changed"
            };
            let mut object = existing
                .cloned()
                .unwrap_or_else(|| K::new_like(source, &copy.to));
            Ok(Plan::Write(Change {
                label,
                reason: format!("copy of {} ({label})", copy.from),
                if_held: Ok(()),
                key: None,
                build: Box::new(move |_| {
                    object.take_data(source);
                    merge_metadata(object.meta_mut(), source.meta());
                    Ok(Built {
                        object,
                        then: (),
                        log: format!("copied from {}", copy.from),
                        event: None,
                    })
                }),
            }))
        },
    )
    .await
}

/// Refuses a copy whose source is unusable, or worse than the copy (`None`: absent): the copy
/// is kept, a `CopyRefused` Event names both objects, and the item fails.
fn refuse_worse(
    ctx: &Ctx<'_>,
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
    ctx.announce(
        "CopyRefused",
        format!("{}/{}", copy.kind.label(), copy.to),
        message,
        true,
    );
    Err(format!("not copied from {}: {why}", copy.from))
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
