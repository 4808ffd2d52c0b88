//! What a kubelet client CSR asks for, read as the Go side that acts on it reads it
//! (kube-apiserver's CSR validation and kube-controller-manager's signer, 1.20:
//! `pem.Decode`, then `x509.ParseCertificateRequest` of the first block, Go 1.19), and accepted
//! only in the one shape where no reader can disagree: exactly one `CERTIFICATE REQUEST` block
//! with nothing but blank lines around it (`pki::pem::sole_block`), strict DER
//! (`pki::csr`), a verified signature, a subject of exactly one `CN` and one `O`, each
//! its own RDN, as UTF8String or PrintableString, and no attribute but empty extensionRequests.
//!
//! Every way Go's reading and a lax one differ is refused here, not reasoned about: a second
//! block (Go reads the first it can decode), a BEGIN line in the middle of a line (text to Go),
//! CR line ends, headers, blanks or non-canonical base64, several CNs (Go keeps the last) or Os
//! (Go keeps them all), multi-valued RDNs, any other subject attribute, any extension in any
//! extensionRequest attribute (Go reads every such attribute but only its first value; the
//! last subjectAltName wins), a second value or a duplicate attribute, and attributes Go
//! ignores. Public (re-exported as `cert_syncer::kubelet_csr`) so that the differential test
//! against the real kube-apiserver and the fuzz target drive exactly this code.

pub use crate::pki::csr::{CertificateRequest, Extension, RequestAttribute, SubjectAttribute};
use crate::pki::csr::{
    OID_COMMON_NAME, OID_EXTENSION_REQUEST, OID_ORGANIZATION, OID_RSA, OID_SUBJECT_ALT_NAME,
};

/// The `O` of every node.
pub const NODES: &str = "system:nodes";
/// The PEM type Go's `ParseCSR` requires.
pub const LABEL: &str = "CERTIFICATE REQUEST";

const UTF8_STRING: u8 = 0x0c;
const PRINTABLE_STRING: u8 = 0x13;

/// A request this approver may approve for its node: the kubelet's shape, read as Go reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletRequest {
    /// The subject as read, in the request's order (`CN=system:node:n, O=system:nodes`).
    pub subject: String,
    /// The key's algorithm, named (`RSA`, `ECDSA`, `Ed25519`, or the OID).
    pub key: String,
    /// Whether the key is RSA (which usages fit depends on it).
    pub rsa: bool,
}

/// Why a request is not the kubelet's for this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Which part: [`Part::Request`] (PEM, DER, signature), [`Part::Subject`] or
    /// [`Part::Attributes`].
    pub part: Part,
    /// What is wrong, never the request's bytes (subject values quoted, escaped and cut).
    pub reason: String,
}

/// The part of a request a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Its PEM framing, its DER, or its signature.
    Request,
    /// Its subject.
    Subject,
    /// Its attributes (requested extensions among them).
    Attributes,
}

impl Refused {
    fn new(part: Part, reason: impl Into<String>) -> Refused {
        Refused {
            part,
            reason: reason.into(),
        }
    }
}

/// The DER of the one `CERTIFICATE REQUEST` block of `spec.request`, framed as nothing can read
/// otherwise (`pki::pem::sole_block`).
///
/// # Errors
/// Any other text.
pub fn der_of(request_pem: &[u8]) -> Result<Vec<u8>, String> {
    crate::pki::pem::sole_block(request_pem, LABEL).map_err(|err| format!("request PEM: {err}"))
}

/// The first block Go's `pem.Decode` returns from `bytes` (its type and DER), as our PEM reader
/// frames it (`pki::pem::Scanner`): what kube-apiserver and kube-controller-manager
/// read, whatever else the text holds. For the differential test against Go; the approver
/// itself reads only [`der_of`]'s one shape.
pub fn go_first_block(bytes: &[u8]) -> Option<(String, Vec<u8>)> {
    crate::pki::pem::Scanner::new(bytes).find_map(|item| match item {
        crate::pki::pem::Item::Block(block, _) => Some((block.label, block.der)),
        crate::pki::pem::Item::Skipped(_) => None,
    })
}

/// Reads `spec.request` for node `node_name`: this node's kubelet client request, or why not.
///
/// # Errors
/// [`Refused`], naming the part and what is wrong.
pub fn kubelet_request(request_pem: &[u8], node_name: &str) -> Result<KubeletRequest, Refused> {
    let der = der_of(request_pem).map_err(|err| Refused::new(Part::Request, err))?;
    let request = CertificateRequest::parse(&der)
        .map_err(|err| Refused::new(Part::Request, format!("request: {err}")))?;
    check_attributes(&request.attributes).map_err(|err| Refused::new(Part::Attributes, err))?;
    let subject = check_subject(&request.subject, &format!("system:node:{node_name}"))
        .map_err(|err| Refused::new(Part::Subject, err))?;
    let key = match request.key_algorithm.as_str() {
        OID_RSA => "RSA".to_owned(),
        "1.2.840.10045.2.1" => "ECDSA".to_owned(),
        "1.3.101.112" => "Ed25519".to_owned(),
        other => other.to_owned(),
    };
    Ok(KubeletRequest {
        subject,
        rsa: request.key_algorithm == OID_RSA,
        key,
    })
}

/// Exactly one CN (`expected_cn`) and one O (`system:nodes`), each alone in its RDN, as UTF8String
/// or PrintableString (what Go and every kubelet write); returns the subject as read.
fn check_subject(rdns: &[Vec<SubjectAttribute<'_>>], expected_cn: &str) -> Result<String, String> {
    let mut common_names = Vec::new();
    let mut organizations = Vec::new();
    let mut shown = Vec::new();
    for rdn in rdns {
        let [attribute] = rdn.as_slice() else {
            return Err(format!(
                "subject has an RDN of {} attributes (Go reads them as separate ones)",
                rdn.len()
            ));
        };
        if !matches!(attribute.tag, UTF8_STRING | PRINTABLE_STRING) {
            return Err(format!(
                "subject attribute {} is of type {:#04x}, not UTF8String or PrintableString",
                attribute_name(&attribute.oid),
                attribute.tag
            ));
        }
        let value = std::str::from_utf8(attribute.value)
            .map_err(|_| format!("subject {} is not UTF-8", attribute_name(&attribute.oid)))?;
        match attribute.oid.as_str() {
            OID_COMMON_NAME => common_names.push(value),
            OID_ORGANIZATION => organizations.push(value),
            other => {
                return Err(format!(
                    "subject has attributes other than CN and O: {}",
                    attribute_name(other)
                ));
            }
        }
        shown.push(format!("{}={value}", attribute_name(&attribute.oid)));
    }
    let quote_all = |values: &[&str]| {
        values
            .iter()
            .map(|v| crate::base::error::quoted(v, 64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match common_names.as_slice() {
        [cn] if *cn == expected_cn => {}
        [cn] => {
            return Err(format!(
                "subject CN {} is not {expected_cn:?} (another node?)",
                crate::base::error::quoted(cn, 64)
            ));
        }
        [] => return Err("subject has no CN".to_owned()),
        several => {
            return Err(format!(
                "subject has {} CNs ({}; Go keeps the last)",
                several.len(),
                quote_all(several)
            ));
        }
    }
    match organizations.as_slice() {
        [o] if *o == NODES => {}
        [] => return Err(format!("subject O [] is not [{NODES:?}]")),
        other => {
            return Err(format!(
                "subject O [{}] is not [{NODES:?}]",
                quote_all(other)
            ));
        }
    }
    Ok(shown.join(", "))
}

/// No attribute but extensionRequests asking for nothing; every attribute read, each once.
fn check_attributes(attributes: &[RequestAttribute<'_>]) -> Result<(), String> {
    for (index, attribute) in attributes.iter().enumerate() {
        if attributes[..index].iter().any(|a| a.oid == attribute.oid) {
            return Err(format!(
                "request has the attribute {} more than once",
                attribute_name(&attribute.oid)
            ));
        }
        if attribute.oid != OID_EXTENSION_REQUEST {
            return Err(format!(
                "request has the attribute {} (the kubelet sends none)",
                attribute_name(&attribute.oid)
            ));
        }
        let [value] = attribute.values.as_slice() else {
            return Err(format!(
                "request's extensionRequest has {} values (Go reads only the first)",
                attribute.values.len()
            ));
        };
        let extensions = crate::pki::csr::extensions(value)
            .map_err(|err| format!("request's extensionRequest is malformed: {err}"))?;
        if extensions.iter().any(|e| e.oid == OID_SUBJECT_ALT_NAME) {
            return Err("request asks for subject alternative names".to_owned());
        }
        if !extensions.is_empty() {
            let named: Vec<String> = extensions
                .iter()
                .map(|e| {
                    format!(
                        "{}{}",
                        attribute_name(&e.oid),
                        if e.critical { " (critical)" } else { "" }
                    )
                })
                .collect();
            return Err(format!(
                "request asks for extensions ({}; the kubelet asks for none)",
                named.join(", ")
            ));
        }
    }
    Ok(())
}

/// A short name for the OIDs a reason names, the dotted OID otherwise.
fn attribute_name(oid: &str) -> String {
    match oid {
        OID_COMMON_NAME => "CN",
        OID_ORGANIZATION => "O",
        "2.5.4.11" => "OU",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.5" => "serialNumber",
        OID_EXTENSION_REQUEST => "extensionRequest",
        "1.2.840.113549.1.9.7" => "challengePassword",
        OID_SUBJECT_ALT_NAME => "subjectAltName",
        other => other,
    }
    .to_owned()
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
