//! The decision: approve one CertificateSigningRequest, or leave it alone and say why. Pure
//! (the CSR, this node's policy and what the kubelet's certificate file says), so every rule
//! has its own unit test.
//!
//! Approve only when ALL hold (the threat model is in SECURITY.md, "The kubelet CSR approver"):
//! 1. the CSR has no `Approved`, `Denied` or `Failed` condition and no certificate;
//! 2. signer `kubernetes.io/kube-apiserver-client-kubelet`;
//! 3. the PKCS#10 request parses, its signature verifies (the requester holds the key), its
//!    subject is exactly `CN=system:node:<this node>` and `O=system:nodes` (no other attribute,
//!    each once), and it requests no extension (no SANs of any kind);
//! 4. usages are exactly the kubelet's: `digital signature`, `key encipherment`, `client auth`
//!    (kubelet 1.20 and upstream `sarapprove.go`'s `kubeletClientUsages`), or, for a non-RSA key
//!    only, `digital signature`, `client auth` (what newer kubelets send for ECDSA keys; newer
//!    upstream releases accept it for any key, `kubeletClientRequiredUsagesNoRSA`; key
//!    encipherment means nothing for an ECDSA key);
//! 5. requested by the bootstrap identity (username `system:bootstrap:<token-id>` in group
//!    `system:bootstrappers`, or a configured bootstrap user) or by this node
//!    (`system:node:<this node>` in `system:nodes`): `spec.username`/`spec.groups` are set by
//!    kube-apiserver from the authenticated creator, never by the creator's body;
//! 6. the kubelet's client certificate on this node's disk is expired or absent (unreadable or
//!    garbage: fail closed).

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use x509_parser::prelude::*;

use super::disk::KubeletCert;

/// The kubelet client signer.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The `Approved` condition's reason.
pub const REASON: &str = "AutoApprovedExpiredNodeClientCert";
/// The nodes' group.
const NODES: &str = "system:nodes";
/// The bootstrap tokens' group.
const BOOTSTRAPPERS: &str = "system:bootstrappers";

/// Who this approver serves.
#[derive(Debug, Clone)]
pub struct Policy {
    /// This node's name (`--node-name`).
    pub node_name: String,
    /// More usernames accepted as the bootstrap identity (`--bootstrap-user`).
    pub bootstrap_users: Vec<String>,
}

impl Policy {
    fn node_user(&self) -> String {
        format!("system:node:{}", self.node_name)
    }
}

/// What to do with one CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Approve it; the text is the condition's message (the checks that held).
    Approve(String),
    /// Leave it alone (never deny: a human or another approver may still act), for this reason.
    Leave(String),
}

/// Decides about `csr` for `policy`, with the kubelet's certificate file read as `disk`.
pub fn decide(csr: &CertificateSigningRequest, policy: &Policy, disk: &KubeletCert) -> Decision {
    match check(csr, policy, disk) {
        Ok(message) => Decision::Approve(message),
        Err(reason) => Decision::Leave(reason),
    }
}

fn check(
    csr: &CertificateSigningRequest,
    policy: &Policy,
    disk: &KubeletCert,
) -> Result<String, String> {
    let status = csr.status.as_ref();
    if let Some(condition) = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
    {
        return Err(format!("already {}", condition.type_.to_lowercase()));
    }
    if status.and_then(|s| s.certificate.as_ref()).is_some() {
        return Err("already issued".to_owned());
    }
    let spec = &csr.spec;
    if spec.signer_name != SIGNER {
        return Err(format!("signer {:?} is not {SIGNER}", spec.signer_name));
    }
    let rsa = check_request(&spec.request.0, policy)?;
    check_usages(spec.usages.as_deref().unwrap_or_default(), rsa)?;
    let requester = check_requester(
        spec.username.as_deref().unwrap_or_default(),
        spec.groups.as_deref().unwrap_or_default(),
        policy,
    )?;
    let disk = match disk {
        KubeletCert::Absent => "absent".to_owned(),
        KubeletCert::Expired { not_after } => {
            format!("expired at {}", crate::base::time::rfc3339(*not_after))
        }
        KubeletCert::Valid { not_after } => {
            return Err(format!(
                "the kubelet's client certificate on disk is valid until {}: not a recovery",
                crate::base::time::rfc3339(*not_after)
            ));
        }
        KubeletCert::Unknown(why) => {
            return Err(format!(
                "cannot tell whether the kubelet's client certificate expired: {why}"
            ));
        }
    };
    Ok(format!(
        "signer {SIGNER}; subject CN={},O={NODES} with no SANs; kubelet client usages; requested by {requester}; the node's kubelet client certificate is {disk}",
        policy.node_user()
    ))
}

/// Parses and checks the PKCS#10 request; returns whether its key is RSA.
fn check_request(pem_bytes: &[u8], policy: &Policy) -> Result<bool, String> {
    let block = crate::pki::pem::blocks_skipping_torn(pem_bytes)
        .map_err(|err| format!("request is not PEM: {err}"))?
        .into_iter()
        .next()
        .ok_or_else(|| "request is not PEM: no PEM block".to_owned())?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err(format!(
            "request is a {:?} block, not CERTIFICATE REQUEST",
            block.label
        ));
    }
    let (rest, request) = X509CertificationRequest::from_der(&block.der)
        .map_err(|err| format!("request does not parse: {err}"))?;
    if !rest.is_empty() {
        return Err("request has trailing bytes".to_owned());
    }
    request
        .verify_signature()
        .map_err(|err| format!("request signature does not verify: {err}"))?;
    let info = &request.certification_request_info;
    let (mut common_names, mut organizations, mut others) = (Vec::new(), Vec::new(), Vec::new());
    for attribute in info.subject.iter_attributes() {
        let value = attribute.as_str().map_err(|_| {
            format!(
                "subject attribute {} is not a string",
                attribute.attr_type()
            )
        })?;
        if *attribute.attr_type() == x509_parser::oid_registry::OID_X509_COMMON_NAME {
            common_names.push(value);
        } else if *attribute.attr_type() == x509_parser::oid_registry::OID_X509_ORGANIZATION_NAME {
            organizations.push(value);
        } else {
            others.push(attribute.attr_type().to_id_string());
        }
    }
    let node_user = policy.node_user();
    if !others.is_empty() {
        return Err(format!(
            "subject has attributes other than CN and O: {others:?}"
        ));
    }
    if common_names != [node_user.as_str()] {
        return Err(format!(
            "subject CN {common_names:?} is not [{node_user:?}] (another node?)"
        ));
    }
    if organizations != [NODES] {
        return Err(format!("subject O {organizations:?} is not [\"{NODES}\"]"));
    }
    if let Some(extension) = request.requested_extensions().and_then(|mut e| e.next()) {
        return Err(match extension {
            ParsedExtension::SubjectAlternativeName(_) => {
                "request asks for subject alternative names".to_owned()
            }
            _ => "request asks for extensions (the kubelet asks for none)".to_owned(),
        });
    }
    Ok(info.subject_pki.algorithm.algorithm == x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION)
}

fn check_usages(usages: &[String], rsa: bool) -> Result<(), String> {
    let mut got: Vec<&str> = usages.iter().map(String::as_str).collect();
    got.sort_unstable();
    let with_encipherment = ["client auth", "digital signature", "key encipherment"];
    let without = ["client auth", "digital signature"];
    if got == with_encipherment || (!rsa && got == without) {
        return Ok(());
    }
    Err(format!(
        "usages {usages:?} are not the kubelet's (digital signature, key encipherment, client auth{})",
        if rsa {
            ""
        } else {
            "; or without key encipherment for this non-RSA key"
        }
    ))
}

/// The requester, as the condition's message names it.
fn check_requester(username: &str, groups: &[String], policy: &Policy) -> Result<String, String> {
    let in_group = |group: &str| groups.iter().any(|g| g == group);
    if let Some(token_id) = username.strip_prefix("system:bootstrap:") {
        let token_id_ok = token_id.len() == 6
            && token_id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if token_id_ok && in_group(BOOTSTRAPPERS) {
            return Ok(format!("bootstrap identity {username}"));
        }
    }
    if policy.bootstrap_users.iter().any(|u| u == username) {
        return Ok(format!("configured bootstrap user {username}"));
    }
    if username == policy.node_user() && in_group(NODES) {
        return Ok(format!("the node itself ({username})"));
    }
    Err(format!(
        "requested by {username:?} (groups {groups:?}): neither the bootstrap identity nor this node"
    ))
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
