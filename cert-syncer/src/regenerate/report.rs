//! What a pass did: its writes, its failures (typed: the kind of object, which one, what is
//! wrong), the expiries it saw and the writes the brake withheld. Read by the loop, the
//! metrics and the Events.

use std::fmt;
use std::time::Duration;

use super::config::ObjectRef;
use crate::base::kind::Kind as ObjectKind;

/// What a pass did.
#[derive(Debug, Default)]
pub struct Report {
    /// One per write.
    pub written: Vec<Written>,
    /// One per failed item.
    pub failures: Vec<Failure>,
    /// notAfter of every managed certificate read or written (for metrics).
    pub not_after: Vec<(&'static str, ObjectRef, i64)>,
    /// Times at which a decision can change by time alone (expiries; rotation points in
    /// rotate mode).
    pub deadlines: Vec<i64>,
    /// The nearest of `deadlines` after now.
    pub next_deadline: Option<i64>,
    /// Writes refused with 409 (read again and decided again).
    pub conflicts: u64,
    /// Writes withheld: by the brake (a write loop, see `brake`), or until the bundles their
    /// CA must be in hold it (see `trust`).
    pub held: Vec<Held>,
}

impl Report {
    /// Records a failed item.
    pub(super) fn fail(
        &mut self,
        kind: FailureKind,
        object: &ObjectRef,
        reason: impl Into<String>,
    ) {
        self.failures.push(Failure {
            kind,
            object: Some(object.clone()),
            reason: reason.into(),
        });
    }

    /// Adds what one step of the pass did (steps run concurrently, each with its own report;
    /// the pass adds them up in the graph's order).
    pub(super) fn add(&mut self, step: Report) {
        self.written.extend(step.written);
        self.failures.extend(step.failures);
        self.not_after.extend(step.not_after);
        self.deadlines.extend(step.deadlines);
        self.conflicts += step.conflicts;
        self.held.extend(step.held);
    }

    /// The writes the brake withheld (a write loop).
    pub fn braked(&self) -> impl Iterator<Item = &Held> {
        self.held
            .iter()
            .filter(|h| matches!(h.by, HeldBy::Brake { .. }))
    }

    /// The writes that wait for a bundle to hold their CA.
    pub fn waiting(&self) -> impl Iterator<Item = &Held> {
        self.held
            .iter()
            .filter(|h| matches!(h.by, HeldBy::Trust { .. }))
    }

    /// The expiry metric and deadline of each CA a bundle holds.
    pub(super) fn note_bundle(&mut self, object: &ObjectRef, certs: &[crate::pki::Cert]) {
        for cert in certs {
            self.not_after
                .push(("bundle", object.clone(), cert.not_after));
            self.deadlines.push(cert.not_after);
        }
    }
}

/// One write.
#[derive(Debug, Clone)]
pub struct Written {
    /// `signer`, `target`, `bundle`, `published` or `copy`.
    pub kind: &'static str,
    pub object: ObjectRef,
    pub reason: String,
    pub reason_label: &'static str,
}

/// A write the pass wanted and did not make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `signer`, `target`, `bundle`, `published` or `copy`.
    pub kind: &'static str,
    pub object: ObjectRef,
    /// Why the pass wanted to write it.
    pub reason: String,
    /// When it may be written (from the check), if known.
    pub release_in: Option<Duration>,
    pub by: HeldBy,
}

/// What withheld a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldBy {
    /// The object's write budget (`brake`): the level of the fight (1: the first) and the
    /// hold's length.
    Brake { level: u32, length: Duration },
    /// A bundle that must trust the CA the write issues from (or publishes) does not hold it
    /// yet (`trust`): which, and why.
    Trust { waits_for: String },
}

/// What a failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    Secret,
    ConfigMap,
    /// The local clock (the whole pass, or its intermediate step, was refused).
    Clock,
}

impl From<ObjectKind> for FailureKind {
    fn from(kind: ObjectKind) -> FailureKind {
        match kind {
            ObjectKind::Secret => FailureKind::Secret,
            ObjectKind::ConfigMap => FailureKind::ConfigMap,
        }
    }
}

/// Why one item of a pass failed: shown as `secret ns/name: reason` (`clock: reason`). Reasons
/// name what is wrong; none carries key or token bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    /// The object (`None` for the clock).
    pub object: Option<ObjectRef>,
    pub reason: String,
}

impl Failure {
    pub(super) fn clock(reason: impl Into<String>) -> Failure {
        Failure {
            kind: FailureKind::Clock,
            object: None,
            reason: reason.into(),
        }
    }

    /// What the failure is about, as its Event names it: `secret ns/name`, `clock`.
    pub fn subject(&self) -> String {
        let kind = match self.kind {
            FailureKind::Secret => "secret",
            FailureKind::ConfigMap => "configmap",
            FailureKind::Clock => "clock",
        };
        match &self.object {
            Some(object) => format!("{kind} {object}"),
            None => kind.to_owned(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject(), self.reason)
    }
}
