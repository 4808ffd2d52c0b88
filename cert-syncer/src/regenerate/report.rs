//! What a pass did: its writes, its failures (typed: the kind of object, which one, what is
//! wrong), the expiries it saw and the writes the brake withheld. Read by the loop, the
//! metrics and the Events.

use std::fmt;

use super::brake::Held;
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
    /// Writes the brake withheld (see `brake`).
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
