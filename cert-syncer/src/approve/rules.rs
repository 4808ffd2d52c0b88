//! The decisions: for every CSR of the kubelet client signer, approve it or leave it alone and
//! say why. Pure (the CSRs, this node's policy, what the kubelet's certificate file says, the
//! time), so every rule has its own unit test. The threat model is in SECURITY.md, "The kubelet
//! CSR approver".
//!
//! A CSR is approved only when ALL hold:
//! 1. it has no `Approved`, `Denied` or `Failed` condition and no certificate;
//! 2. signer `kubernetes.io/kube-apiserver-client-kubelet`;
//! 3. its request is this node's kubelet request as Go reads it ([`super::request`]: one PEM
//!    block and nothing Go could read otherwise, strict DER, signature verified, subject exactly
//!    `CN=system:node:<this node>`, `O=system:nodes`, no extension, no other attribute);
//! 4. usages exactly the kubelet's: `digital signature`, `key encipherment`, `client auth`
//!    (kubelet 1.20 and upstream `sarapprove.go`'s `kubeletClientUsages`), or, for a non-RSA key
//!    only, `digital signature`, `client auth` (newer kubelets' ECDSA shape;
//!    `kubeletClientRequiredUsagesNoRSA`);
//! 5. requested by the bootstrap identity with its groups, or by this node with its groups:
//!    `system:bootstrap:<token-id>` in `system:bootstrappers` (a bootstrap token: no group but
//!    `system:bootstrappers`, `system:bootstrappers:*` and `system:authenticated`), a
//!    `--bootstrap-user` in exactly its groups (a service account's are fixed, as OpenShift's
//!    cluster-machine-approver checks the node-bootstrapper's), or `system:node:<this node>` in
//!    exactly `system:nodes` and `system:authenticated`;
//! 6. the kubelet's client certificate on this node's disk is expired, or absent from a
//!    directory that exists (unreadable, garbage, no directory: fail closed);
//! 7. created after that certificate's notAfter (or the directory's last change, while it is
//!    absent) minus the clock-skew margin ([`Policy::clock_skew`], [`CLOCK_SKEW`] by default),
//!    and at most [`MAX_AGE`] (plus the margin) ago: a request
//!    made before the certificate expired is not this recovery's, and one the kubelet gave up on
//!    helps only whoever else holds its key;
//! 8. no approval of ours yet for this on-disk certificate (or this absence): one per
//!    certificate, until the kubelet's file changes, read from the CSRs we approved (their
//!    condition names the certificate) and from memory;
//! 9. at most [`MAX_PENDING`] requests passing 1–7 are pending (more is a flood: a human
//!    decides), and of those it is the newest (the live kubelet's; an older one's kubelet exited
//!    or gave up).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

use super::disk::KubeletCert;
use super::request::{KubeletRequest, NODES, Part, kubelet_request};

/// The kubelet client signer.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The `Approved` condition's reason.
pub const REASON: &str = "AutoApprovedExpiredNodeClientCert";
/// The default clock margin between the kubelet's clock (it decides its certificate expired),
/// the apiserver's (creation times) and ours, in seconds: 5 minutes, as `regenerate`'s
/// backdate.
pub const CLOCK_SKEW: i64 = 5 * 60;
/// Oldest request approved, in seconds: the kubelet waits 15 minutes for a CSR
/// (client-go's certificate manager, `certificateWaitTimeout`), then makes a new one with a new
/// key.
pub const MAX_AGE: i64 = 15 * 60;
/// Most pending requests for this node approved from; more is a flood, left to a human.
pub const MAX_PENDING: usize = 5;
/// The bootstrap tokens' group.
const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// Every authenticated user's group (kube-apiserver adds it).
pub const AUTHENTICATED: &str = "system:authenticated";

/// Who this approver serves.
#[derive(Debug, Clone)]
pub struct Policy {
    /// This node's name (`--node-name`).
    pub node_name: String,
    /// More identities accepted as the bootstrap identity (`--bootstrap-user`), each with the
    /// exact groups its CSRs must carry.
    pub bootstrap_users: Vec<BootstrapUser>,
    /// The clock margin of rule 7, in seconds (`--clock-skew-margin`).
    pub clock_skew: i64,
}

/// A `--bootstrap-user` and the groups kube-apiserver gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapUser {
    pub username: String,
    /// Exactly these groups, `system:authenticated` included.
    pub groups: BTreeSet<String>,
}

impl BootstrapUser {
    /// `username` with `groups` (and `system:authenticated`); a service account's groups are
    /// fixed (`system:serviceaccounts`, `system:serviceaccounts:<namespace>`), so `groups` must
    /// then be empty. `None` for a user that is not a service account and has no groups named.
    pub fn new(username: &str, groups: &[String]) -> Option<BootstrapUser> {
        let mut all: BTreeSet<String> = groups.iter().cloned().collect();
        if let Some(account) = username.strip_prefix("system:serviceaccount:") {
            let (namespace, _) = account.split_once(':')?;
            if !groups.is_empty() || namespace.is_empty() {
                return None;
            }
            all.insert("system:serviceaccounts".to_owned());
            all.insert(format!("system:serviceaccounts:{namespace}"));
        } else if groups.is_empty() {
            return None;
        }
        all.insert(AUTHENTICATED.to_owned());
        Some(BootstrapUser {
            username: username.to_owned(),
            groups: all,
        })
    }
}

impl Policy {
    fn node_user(&self) -> String {
        format!("system:node:{}", self.node_name)
    }
}

/// What to do with one CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Approve it; the text is the condition's message (the request as read).
    Approve(String),
    /// Leave it alone (never deny: a human or another approver may still act).
    Leave(Refusal),
}

/// Why a CSR is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The kind, for the metric's `reason` label.
    pub kind: Kind,
    /// The reason, for the log line (never the request's bytes).
    pub text: String,
}

/// The kinds of refusal (the `reason` label of `cert_syncer_kubelet_csr_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Already approved, denied, failed or issued.
    Decided,
    /// Another signer.
    Signer,
    /// The request's PEM, DER or signature.
    Request,
    /// The request's subject (another node among others).
    Subject,
    /// The request's attributes (extensions, SANs).
    Attributes,
    /// The usages.
    Usages,
    /// The requester or its groups.
    Requester,
    /// The kubelet's certificate on disk is valid.
    NotARecovery,
    /// The kubelet's certificate on disk cannot be judged.
    CannotTell,
    /// Created before the certificate expired, or too long ago.
    Window,
    /// Another request was approved for this certificate.
    OnePerCertificate,
    /// Too many pending requests for this node.
    TooManyPending,
}

impl Kind {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Decided => "decided",
            Kind::Signer => "signer",
            Kind::Request => "request",
            Kind::Subject => "subject",
            Kind::Attributes => "attributes",
            Kind::Usages => "usages",
            Kind::Requester => "requester",
            Kind::NotARecovery => "not-a-recovery",
            Kind::CannotTell => "cannot-tell",
            Kind::Window => "window",
            Kind::OnePerCertificate => "one-per-certificate",
            Kind::TooManyPending => "too-many-pending",
        }
    }
}

fn refuse(kind: Kind, text: impl Into<String>) -> Refusal {
    Refusal {
        kind,
        text: text.into(),
    }
}

/// A pending request that passed the checks of its own (1–5).
#[derive(Debug, Clone)]
struct Candidate {
    created: i64,
    request: KubeletRequest,
    usages: String,
    requester: String,
}

/// Decides about every CSR of `csrs` (by name) at `now`, with the kubelet's certificate file read
/// as `disk`; `remembered`: the CSR this process approved for `disk`'s certificate, if any (the
/// record outlives a CSR that kube-controller-manager's cleaner removed).
pub fn decide(
    csrs: &BTreeMap<String, CertificateSigningRequest>,
    policy: &Policy,
    disk: &KubeletCert,
    remembered: Option<&str>,
    now: i64,
) -> BTreeMap<String, Decision> {
    let key = disk.approval_key();
    let mut decisions = BTreeMap::new();
    let mut candidates = BTreeMap::new();
    let mut approved_before = remembered.map(str::to_owned);
    for (name, csr) in csrs {
        match assess(csr, policy) {
            Ok(candidate) => {
                candidates.insert(name.clone(), candidate);
            }
            Err(refusal) => {
                if key
                    .as_deref()
                    .is_some_and(|key| approved_by_us(csr, policy, key))
                {
                    approved_before.get_or_insert_with(|| name.clone());
                }
                decisions.insert(name.clone(), Decision::Leave(refusal));
            }
        }
    }
    let (eligible, refusals) = gate(&candidates, disk, approved_before.as_deref(), policy, now);
    decisions.extend(refusals.into_iter().map(|(n, r)| (n, Decision::Leave(r))));
    let Some(newest) = eligible
        .iter()
        .max_by_key(|name| (candidates[*name].created, (*name).clone()))
        .cloned()
    else {
        return decisions;
    };
    for name in &eligible {
        let decision = if *name == newest {
            Decision::Approve(message(&candidates[name], policy, disk))
        } else {
            Decision::Leave(one_per_certificate(&newest, disk))
        };
        decisions.insert(name.clone(), decision);
    }
    decisions
}

/// Refusals by CSR name.
type Refusals = Vec<(String, Refusal)>;

/// Rules 6–9 over the candidates: the names still eligible and the refusals (all of them when
/// the disk says no).
fn gate(
    candidates: &BTreeMap<String, Candidate>,
    disk: &KubeletCert,
    approved_before: Option<&str>,
    policy: &Policy,
    now: i64,
) -> (Vec<String>, Refusals) {
    let skew = policy.clock_skew;
    let all = |refusal: Refusal| {
        candidates
            .keys()
            .map(|name| (name.clone(), refusal.clone()))
            .collect::<Vec<_>>()
    };
    let since = match disk {
        KubeletCert::Valid { not_after } => {
            return (
                Vec::new(),
                all(refuse(
                    Kind::NotARecovery,
                    format!(
                        "the kubelet's client certificate on disk is valid until {}: not a recovery",
                        crate::base::time::rfc3339(*not_after)
                    ),
                )),
            );
        }
        KubeletCert::Unknown(why) => {
            return (
                Vec::new(),
                all(refuse(
                    Kind::CannotTell,
                    format!("cannot tell whether the kubelet's client certificate expired: {why}"),
                )),
            );
        }
        KubeletCert::Expired { not_after, .. } => *not_after,
        KubeletCert::Absent { since } => *since,
    };
    let earliest = since - skew;
    let oldest = now - MAX_AGE - skew;
    let mut eligible = Vec::new();
    let mut refusals = Vec::new();
    for (name, candidate) in candidates {
        let created = candidate.created;
        let at = crate::base::time::rfc3339(created);
        if created < earliest {
            refusals.push((
                name.clone(),
                refuse(
                    Kind::Window,
                    format!(
                        "created at {at}, before the kubelet's certificate on disk {} (less {skew} s): not this recovery's",
                        since_text(disk)
                    ),
                ),
            ));
        } else if created < oldest {
            refusals.push((
                name.clone(),
                refuse(
                    Kind::Window,
                    format!(
                        "created at {at}, more than {} s ago: the kubelet has given up on it",
                        MAX_AGE + skew
                    ),
                ),
            ));
        } else if let Some(approved) = approved_before {
            refusals.push((name.clone(), one_per_certificate(approved, disk)));
        } else {
            eligible.push(name.clone());
        }
    }
    if eligible.len() > MAX_PENDING {
        let flood = refuse(
            Kind::TooManyPending,
            format!(
                "more than {MAX_PENDING} requests for this node are pending within {} s: a flood, left to a human",
                MAX_AGE + skew
            ),
        );
        refusals.extend(eligible.drain(..).map(|name| (name, flood.clone())));
    }
    (eligible, refusals)
}

fn since_text(disk: &KubeletCert) -> String {
    match disk {
        KubeletCert::Expired { not_after, .. } => {
            format!("expired at {}", crate::base::time::rfc3339(*not_after))
        }
        KubeletCert::Absent { since } => format!(
            "went absent (its directory changed at {})",
            crate::base::time::rfc3339(*since)
        ),
        KubeletCert::Valid { .. } | KubeletCert::Unknown(_) => String::new(),
    }
}

fn one_per_certificate(approved: &str, disk: &KubeletCert) -> Refusal {
    refuse(
        Kind::OnePerCertificate,
        format!(
            "one approval per kubelet certificate on disk: {approved} is the one for {}",
            disk.approval_key().unwrap_or_default()
        ),
    )
}

/// The condition's message: the request as read, the requester, and the on-disk fact (whose
/// [`KubeletCert::approval_key`] it names, for rule 8 to find).
fn message(candidate: &Candidate, policy: &Policy, disk: &KubeletCert) -> String {
    let disk_text = match disk {
        KubeletCert::Expired {
            not_after,
            fingerprint,
        } => format!(
            "(sha256:{fingerprint}) is expired at {}",
            crate::base::time::rfc3339(*not_after)
        ),
        KubeletCert::Absent { since } => {
            format!("is absent since {}", crate::base::time::rfc3339(*since))
        }
        KubeletCert::Valid { .. } | KubeletCert::Unknown(_) => String::new(),
    };
    format!(
        "approved by cert-syncer approve-kubelet-csr on node {}: request read as subject {}, {} key, no extensions; usages {}; requested by {} at {}; the kubelet's client certificate on disk {disk_text}; one approval per certificate",
        policy.node_name,
        candidate.request.subject,
        candidate.request.key,
        candidate.usages,
        candidate.requester,
        crate::base::time::rfc3339(candidate.created),
    )
}

/// Whether `csr` is one we approved for this node's certificate `key` (rule 8).
fn approved_by_us(csr: &CertificateSigningRequest, policy: &Policy, key: &str) -> bool {
    let ours = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "Approved"
                && c.reason.as_deref() == Some(REASON)
                && c.message.as_deref().is_some_and(|m| m.contains(key))
        });
    ours && kubelet_request(&csr.spec.request.0, &policy.node_name).is_ok()
}

/// Rules 1–5, for one CSR.
fn assess(csr: &CertificateSigningRequest, policy: &Policy) -> Result<Candidate, Refusal> {
    let status = csr.status.as_ref();
    if let Some(condition) = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
    {
        return Err(refuse(
            Kind::Decided,
            format!("already {}", condition.type_.to_lowercase()),
        ));
    }
    if status.and_then(|s| s.certificate.as_ref()).is_some() {
        return Err(refuse(Kind::Decided, "already issued"));
    }
    let spec = &csr.spec;
    if spec.signer_name != SIGNER {
        return Err(refuse(
            Kind::Signer,
            format!(
                "signer {} is not {SIGNER}",
                crate::base::error::quoted(&spec.signer_name, 80)
            ),
        ));
    }
    let request = kubelet_request(&spec.request.0, &policy.node_name).map_err(|refused| {
        let kind = match refused.part {
            Part::Request => Kind::Request,
            Part::Subject => Kind::Subject,
            Part::Attributes => Kind::Attributes,
        };
        refuse(kind, refused.reason)
    })?;
    let usages = check_usages(spec.usages.as_deref().unwrap_or_default(), request.rsa)?;
    let requester = check_requester(
        spec.username.as_deref().unwrap_or_default(),
        spec.groups.as_deref().unwrap_or_default(),
        policy,
    )?;
    let created = csr
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .ok_or_else(|| refuse(Kind::Window, "no creation time"))?;
    Ok(Candidate {
        created,
        request,
        usages,
        requester,
    })
}

/// The usages as the message names them.
fn check_usages(usages: &[String], rsa: bool) -> Result<String, Refusal> {
    let mut got: Vec<&str> = usages.iter().map(String::as_str).collect();
    got.sort_unstable();
    let with_encipherment = ["client auth", "digital signature", "key encipherment"];
    let without = ["client auth", "digital signature"];
    if got == with_encipherment || (!rsa && got == without) {
        return Ok(usages.join(", "));
    }
    let shown: Vec<String> = usages
        .iter()
        .map(|u| crate::base::error::quoted(u, 40))
        .collect();
    Err(refuse(
        Kind::Usages,
        format!(
            "usages [{}] are not the kubelet's (digital signature, key encipherment, client auth{})",
            shown.join(", "),
            if rsa {
                ""
            } else {
                "; or without key encipherment for this non-RSA key"
            }
        ),
    ))
}

/// The requester, as the condition's message names it.
fn check_requester(username: &str, groups: &[String], policy: &Policy) -> Result<String, Refusal> {
    let set: BTreeSet<&str> = groups.iter().map(String::as_str).collect();
    let shown = || {
        let quoted: Vec<String> = groups
            .iter()
            .map(|g| crate::base::error::quoted(g, 80))
            .collect();
        format!(
            "{} (groups {})",
            crate::base::error::quoted(username, 120),
            quoted.join(", ")
        )
    };
    if let Some(token_id) = username.strip_prefix("system:bootstrap:") {
        let token_id_ok = token_id.len() == 6
            && token_id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        // A bootstrap token's groups: system:bootstrappers, its auth-extra-groups (which
        // kube-apiserver requires to start with system:bootstrappers:), system:authenticated.
        let groups_ok = set.contains(BOOTSTRAPPERS)
            && set.iter().all(|g| {
                *g == BOOTSTRAPPERS || *g == AUTHENTICATED || g.starts_with("system:bootstrappers:")
            });
        if token_id_ok && groups_ok {
            return Ok(format!("the bootstrap token {}", shown()));
        }
    }
    for user in &policy.bootstrap_users {
        if user.username == username {
            let want: BTreeSet<&str> = user.groups.iter().map(String::as_str).collect();
            if set == want && set.len() == groups.len() {
                return Ok(format!("the bootstrap user {}", shown()));
            }
            return Err(refuse(
                Kind::Requester,
                format!(
                    "requested by {}: the bootstrap user's groups must be exactly {:?}",
                    shown(),
                    user.groups
                ),
            ));
        }
    }
    let node_groups: BTreeSet<&str> = [NODES, AUTHENTICATED].into();
    if username == policy.node_user() && set == node_groups && groups.len() == 2 {
        return Ok(format!("the node itself {}", shown()));
    }
    Err(refuse(
        Kind::Requester,
        format!(
            "requested by {}: neither the bootstrap identity nor this node in their groups",
            shown()
        ),
    ))
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
