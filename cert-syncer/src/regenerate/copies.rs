//! Copies of an object's data into another object of the same kind (library-go's
//! resource-sync, as the kube-controller-manager's cert-recovery-controller runs it): written
//! only when the data (and a Secret's type) differ, with the source's labels and annotations
//! merged on a write. A missing source leaves the copy as it is: library-go's resource-sync
//! would delete it, and removing the last good material is never ours to do.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::cache::Cached;
use super::config::{ObjectCopy, ObjectRef};
use super::intermediate_pass::{MAX_ATTEMPTS, refuse_foreign_type};
use super::pass::{Pass, Report, Written};
use crate::error::{chain, is_conflict};
use crate::kind::Kind as ObjectKind;

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
        let mut map = existing.clone().unwrap_or_else(|| ConfigMap {
            metadata: object_meta(&copy.to),
            ..ConfigMap::default()
        });
        map.data = source.data.clone();
        merge_metadata(&mut map.metadata, &source.metadata);
        if self.copy_held(copy, existing.is_none(), report).await {
            return Ok(CopyOutcome::Nothing);
        }
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
