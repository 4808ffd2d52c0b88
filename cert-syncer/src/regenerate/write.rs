//! The one write of a pass, for every kind of object it writes (signers, targets, intermediate
//! CAs, bundles, published CAs, copies): [`Ctx::write`] decides on what was read, writes with
//! the resourceVersion it decided on (create when absent, replace when present), and on a
//! conflict (409: another replica or an operator got there first, or the cache had not caught up)
//! reads again and decides again, a bounded number of times. All replicas compute the same
//! decisions from the same data, so after one of them writes, the others find nothing to do.
//!
//! Every write passes here, so none can bypass what guards them: a Secret of a type regenerate
//! does not own is refused, a write whose CA the bundles do not hold yet waits (`trust`), the
//! brake (`brake`) may hold the write, and a replica that lost its Lease writes nothing more.
//! A new key is taken only then (made ahead by `keys`, or now), so none is generated in vain.
//! Events go out off the write path (spawned, as `sync` sends them); the pass waits for them
//! once it is done ([`Ctx::finish`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;

use super::cache::Cached;
use super::config::ObjectRef;
use super::ctx::Ctx;
use super::keys::KeyUse;
use super::report::{Held, HeldBy, Report, Written};
use super::trust::Untrusted;
use crate::base::error::{chain, is_conflict};
use crate::base::kind::Kind as ObjectKind;

/// Attempts per object when writes conflict.
const MAX_ATTEMPTS: usize = 5;

/// Secret types regenerate writes into. Any other type (a pull secret, a service-account
/// token) belongs to someone else: writing a private key into it is refused.
const OWNED_SECRET_TYPES: &[&str] = &["kubernetes.io/tls", "Opaque"];

/// What to do with one object, decided on what was read.
pub(super) enum Plan<'b, K, T> {
    /// Nothing to write: the pass goes on with `T`.
    Keep(T),
    /// A write.
    Write(Change<'b, K, T>),
    /// A write that must wait until the bundles that must trust its CA hold it (`trust`):
    /// nothing is written; the pass goes on with `then`.
    Wait(Wait<T>),
}

/// A write a plan defers (see [`Plan::Wait`]).
pub(super) struct Wait<T> {
    /// Why the write is wanted, in words.
    pub reason: String,
    pub untrusted: Untrusted,
    pub then: Result<T, String>,
}

/// A write a plan asks for.
pub(super) struct Change<'b, K, T> {
    /// Why, for metrics and the brake (`missing`, `expired`, `ca-added`, ...).
    pub label: &'static str,
    /// Why, in words (logs, the report, Events).
    pub reason: String,
    /// What the pass goes on with when the brake holds the write.
    pub if_held: Result<T, String>,
    /// The new key the object needs, if any: taken only once the write is allowed.
    pub key: Option<KeyUse>,
    /// Builds the object to write (with the key, when `key` asks for one) and what the pass
    /// goes on with once it is written; called only once the brake and the Lease allow the
    /// write.
    pub build: Build<'b, K, T>,
}

/// What builds a write's object (see [`Change::build`]).
pub(super) type Build<'b, K, T> =
    Box<dyn FnOnce(Option<rcgen::KeyPair>) -> Result<Built<K, T>, String> + Send + 'b>;

/// An object ready to write.
pub(super) struct Built<K, T> {
    pub object: K,
    pub then: T,
    /// The log line of a successful write (`regenerated`, `CA bundle updated`).
    pub log: String,
    /// The Event of a successful write: its reason and message.
    pub event: Option<(&'static str, String)>,
}

/// A kind of object [`Ctx::write`] writes.
pub(super) trait Writable: Cached {
    /// The type of an object that is someone else's to write (only Secrets have types).
    fn foreign_type(&self) -> Option<&str> {
        None
    }
}

impl Writable for Secret {
    fn foreign_type(&self) -> Option<&str> {
        self.type_
            .as_deref()
            .filter(|type_| !OWNED_SECRET_TYPES.contains(type_))
    }
}

impl Writable for ConfigMap {}

impl Ctx<'_> {
    /// Brings `object` (as read: `existing`) to what `plan` decides, re-reading and deciding
    /// again after each conflict. `kind` names the write for the report, the brake and the
    /// managed-type label (`signer`, `target`, `bundle`, `published`, `copy`). Returns what
    /// the plan goes on with; an error is the item's failure.
    pub(super) async fn write<'b, K: Writable, T>(
        &self,
        kind: &'static str,
        object: &ObjectRef,
        mut existing: Option<K>,
        report: &mut Report,
        mut plan: impl FnMut(Option<&K>) -> Result<Plan<'b, K, T>, String>,
    ) -> Result<T, String> {
        let resource = K::KIND.label();
        let api: Api<K> = Api::namespaced(self.client.clone(), &object.namespace);
        for _ in 0..MAX_ATTEMPTS {
            if let Some(type_) = existing.as_ref().and_then(Writable::foreign_type) {
                let message = format!(
                    "secret {object} has type {type_}, which regenerate does not manage (only \
                     {}); refusing to write into it",
                    OWNED_SECRET_TYPES.join(" or ")
                );
                self.announce(
                    "CertificateRegenerationRefused",
                    format!("{resource}/{object}"),
                    message.clone(),
                    true,
                );
                return Err(message);
            }
            let change = match plan(existing.as_ref())? {
                Plan::Keep(then) => return Ok(then),
                Plan::Write(change) => change,
                Plan::Wait(wait) => {
                    self.waits(kind, resource, object, &wait, report);
                    return wait.then;
                }
            };
            if self.held(kind, resource, object, &change.reason, report) {
                return change.if_held;
            }
            self.may_write(object)?;
            let key = match change.key {
                Some(used_for) => {
                    let key = self.key(object, used_for).await?;
                    // The Lease may have been lost while the key was made.
                    self.may_write(object)?;
                    Some(key)
                }
                None => None,
            };
            let built = (change.build)(key)?;
            let result = match &existing {
                None => api.create(&PostParams::default(), &built.object).await,
                Some(_) => {
                    api.replace(&object.name, &PostParams::default(), &built.object)
                        .await
                }
            };
            match result {
                Ok(written) => {
                    self.remember(object, existing.as_ref(), &written);
                    // Named by resource (`secret=ns/name`, `configmap=ns/name`), as every log
                    // line of regenerate names its object.
                    match K::KIND {
                        ObjectKind::Secret => {
                            tracing::info!(secret = %object, kind, reason = %change.reason, reason_label = change.label, "{}", built.log);
                        }
                        ObjectKind::ConfigMap => {
                            tracing::info!(configmap = %object, kind, reason = %change.reason, reason_label = change.label, "{}", built.log);
                        }
                    }
                    if let Some((reason, message)) = built.event {
                        self.announce(reason, format!("{resource}/{object}"), message, false);
                    }
                    report.written.push(Written {
                        kind,
                        object: object.clone(),
                        reason: change.reason,
                        reason_label: change.label,
                    });
                    return Ok(built.then);
                }
                Err(err) if is_conflict(&err) => {
                    report.conflicts += 1;
                    tracing::info!(%resource, %object, kind, "changed since read (conflict); reading again");
                    existing = self
                        .read_again(object, existing.as_ref())
                        .await
                        .map_err(|err| format!("after a conflict: {err}"))?;
                }
                Err(err) => return Err(format!("cannot write: {}", chain(&err))),
            }
        }
        Err(format!("still conflicting after {MAX_ATTEMPTS} attempts"))
    }

    /// Records an Event without holding up the pass's writes; [`Ctx::finish`] waits for it.
    pub(super) fn announce(
        &self,
        reason: &'static str,
        object: String,
        message: String,
        warning: bool,
    ) {
        let events = Arc::clone(self.events);
        let event =
            tokio::spawn(async move { events.record(reason, &object, message, warning).await });
        self.pending_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// Whether this replica may still write `object`: not once the Lease is lost.
    fn may_write(&self, object: &ObjectRef) -> Result<(), String> {
        match self.lease_lost {
            Some(lost) if lost.is_cancelled() => Err(format!(
                "not written: this replica lost the leader-election lease during the pass ({object} left as it is)"
            )),
            _ => Ok(()),
        }
    }

    /// Whether the write budget withholds this write of `object` (see `brake`): if so it is
    /// logged, reported and recorded as a `RegenerationLoop` Event, and the object stays as it
    /// is. `resource` names the object's resource for the Event (`secret`).
    fn held(
        &self,
        kind: &'static str,
        resource: &str,
        object: &ObjectRef,
        reason: &str,
        report: &mut Report,
    ) -> bool {
        let Some(brake) = self.brake else {
            return false;
        };
        let Some(hold) = brake.holds(kind, object) else {
            return false;
        };
        let release_in = hold.release_in.as_secs().max(1);
        let message = format!(
            "{resource} {object} was written {} times within {}s and would be written again \
             ({reason}): not before {release_in}s from now (fight {} in a row: held {}s). Its \
             writes do not settle: another controller may disagree about it, delete or replace \
             it, or a rule rejects what it wrote",
            brake.budget(),
            brake.window().as_secs(),
            hold.level,
            hold.length.as_secs(),
        );
        tracing::warn!(kind, %object, %reason, release_in_seconds = release_in, level = hold.level, "write withheld: the object's write budget is spent (RegenerationLoop)");
        self.announce(
            "RegenerationLoop",
            format!("{resource}/{object}"),
            message,
            true,
        );
        report.held.push(Held {
            kind,
            object: object.clone(),
            reason: reason.to_owned(),
            release_in: Some(hold.release_in),
            by: HeldBy::Brake {
                level: hold.level,
                length: hold.length,
            },
        });
        true
    }

    /// A write deferred until the bundles that must trust its CA hold it: logged, reported and
    /// recorded as a `WaitingForTrust` Event; the object stays as it is.
    fn waits<T>(
        &self,
        kind: &'static str,
        resource: &str,
        object: &ObjectRef,
        wait: &Wait<T>,
        report: &mut Report,
    ) {
        let waits_for = &wait.untrusted.waits_for;
        tracing::warn!(kind, %object, reason = %wait.reason, %waits_for, "write deferred: it would issue from or publish a CA that a bundle does not hold yet");
        self.announce(
            "WaitingForTrust",
            format!("{resource}/{object}"),
            format!(
                "{resource} {object} is not written yet ({}): it waits for {waits_for}",
                wait.reason
            ),
            true,
        );
        report.held.push(Held {
            kind,
            object: object.clone(),
            reason: wait.reason.clone(),
            release_in: wait.untrusted.release_in,
            by: HeldBy::Trust {
                waits_for: waits_for.clone(),
            },
        });
    }
}
