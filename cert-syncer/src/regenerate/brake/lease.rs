//! Where the brake's record is kept with `--leader-elect`: an annotation of the controller's
//! own Lease (the one it leads with), read once it holds the Lease and written after every
//! pass that changed the record.
//!
//! Why the Lease: it is ours and already written by the leader (the RBAC the pod has: get and
//! update of that one Lease), every replica that may take over reads it first, and no
//! controller that fights over a certificate has a reason to touch it — a record kept on the
//! fought object itself would be deleted with it. Leader election never drops it: a renewal
//! changes the Lease's spec only, and after our update its stale copy is refused (409) and
//! read again.
//!
//! To forget every fight (after fixing whatever fought), remove the annotation:
//! `kubectl annotate lease -n NS NAME cert-reload.io/regenerate-brake-`.

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;

use super::Brake;
use crate::base::error::{chain, is_conflict};

/// The annotation holding the record (JSON: per `kind/namespace/name`, the last writes, the
/// level and the end of the hold, Unix seconds).
pub const ANNOTATION: &str = "cert-reload.io/regenerate-brake";

/// Tries per save when the Lease changes under us (its renewals).
const ATTEMPTS: usize = 3;

/// The Lease holding the record, and who we are in it.
pub struct LeaseRecord {
    api: Api<Lease>,
    name: String,
    identity: String,
}

impl LeaseRecord {
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> LeaseRecord {
        LeaseRecord {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
        }
    }

    /// Takes over the record kept on the Lease, if any (logged either way).
    pub async fn load_into(&self, brake: &Brake) {
        let lease = match self.api.get_opt(&self.name).await {
            Ok(lease) => lease,
            Err(err) => {
                tracing::warn!(lease = %self.name, error = %chain(&err), "cannot read the brake's record on the lease; starting without it");
                return;
            }
        };
        let Some(saved) = lease
            .as_ref()
            .and_then(|l| l.metadata.annotations.as_ref())
            .and_then(|a| a.get(ANNOTATION))
        else {
            return;
        };
        match brake.restore(saved) {
            Ok(objects) => {
                tracing::info!(lease = %self.name, objects, "the brake's record taken over from the lease")
            }
            Err(reason) => {
                tracing::warn!(lease = %self.name, %reason, "the brake's record on the lease is ignored")
            }
        }
    }

    /// Writes the brake's record when it changed, while we hold the Lease.
    pub async fn save(&self, brake: &Brake) {
        let Some(record) = brake.to_save() else {
            return;
        };
        for _ in 0..ATTEMPTS {
            match self.try_save(&record).await {
                Ok(()) => return,
                Err(err) if is_conflict(&err) => continue,
                Err(err) => {
                    tracing::warn!(lease = %self.name, error = %chain(&err), "cannot keep the brake's record on the lease");
                    brake.mark_unsaved();
                    return;
                }
            }
        }
        tracing::warn!(lease = %self.name, "the lease kept changing; the brake's record is kept after the next pass");
        brake.mark_unsaved();
    }

    async fn try_save(&self, record: &str) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(self.identity.as_str()) {
            // Not ours any more: the new holder keeps its own record.
            return Ok(());
        }
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        if annotations.get(ANNOTATION).map(String::as_str) == Some(record) {
            return Ok(());
        }
        annotations.insert(ANNOTATION.to_owned(), record.to_owned());
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}
