//! The host file's content: every source's PEM checked block by block, the certificates
//! concatenated in source order, identical certificates (same DER) kept once, at their first
//! place. The output is re-encoded PEM (64-column base64, `\n` line ends), so the same
//! certificates always give the same bytes whatever the sources' formatting.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

use crate::pki::pem;

/// One certificate: its DER and the facts the metrics need.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate {
    pub der: Vec<u8>,
    pub not_after: i64,
    /// basicConstraints cA: true.
    pub is_ca: bool,
}

impl std::fmt::Debug for Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("sha256", &fingerprint(&self.der))
            .field("not_after", &self.not_after)
            .field("is_ca", &self.is_ca)
            .finish()
    }
}

/// Why a source's content was refused. Never quotes the content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The key is not in the object.
    #[error("the key is missing")]
    MissingKey,
    /// No PEM block at all.
    #[error("no PEM certificate found")]
    Empty,
    /// A block that does not decode (bad base64, unterminated).
    #[error("PEM block {index} is malformed: {reason}")]
    Malformed { index: usize, reason: String },
    /// A block of another type (a private key in a CA file would be world-readable).
    #[error("PEM block {index} is a {label}, not a CERTIFICATE")]
    NotACertificate { index: usize, label: String },
    /// A CERTIFICATE block whose DER is not an X.509 certificate.
    #[error("certificate {index} does not parse: {reason}")]
    Unparsable { index: usize, reason: String },
}

/// Every PEM block of `bytes` must be a parsable certificate, and there must be at least one.
/// Text outside the blocks (comments, blank lines) is ignored, as Go's `pem.Decode` does.
pub fn parse_certificates(bytes: &[u8]) -> Result<Vec<Certificate>, Invalid> {
    let blocks = pem::blocks(bytes).map_err(|err| Invalid::Malformed {
        index: err.index,
        reason: err.reason,
    })?;
    if blocks.is_empty() {
        return Err(Invalid::Empty);
    }
    blocks
        .into_iter()
        .enumerate()
        .map(|(index, block)| {
            if block.label != "CERTIFICATE" {
                return Err(Invalid::NotACertificate {
                    index,
                    label: block.label,
                });
            }
            let info = reload_lib::CertInfo::from_der(&block.der)
                .map_err(|reason| Invalid::Unparsable { index, reason })?;
            Ok(Certificate {
                der: block.der,
                not_after: info.not_after,
                is_ca: info.is_ca,
            })
        })
        .collect()
}

/// The assembled file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub certificates: Vec<Certificate>,
    /// The file's bytes.
    pub pem: Vec<u8>,
    /// Certificates left out because an earlier source (or an earlier place) had them.
    pub duplicates: usize,
}

impl Bundle {
    /// The earliest notAfter, seconds since the epoch.
    pub fn earliest_not_after(&self) -> Option<i64> {
        self.certificates.iter().map(|c| c.not_after).min()
    }
}

/// Concatenates `parts` in order, keeping the first of identical certificates.
pub fn assemble<'a>(parts: impl IntoIterator<Item = &'a [Certificate]>) -> Bundle {
    let mut seen = HashSet::new();
    let mut certificates = Vec::new();
    let mut duplicates = 0;
    for part in parts {
        for certificate in part {
            if seen.insert(certificate.der.clone()) {
                certificates.push(certificate.clone());
            } else {
                duplicates += 1;
            }
        }
    }
    let pem = encode(&certificates);
    Bundle {
        certificates,
        pem,
        duplicates,
    }
}

/// PEM for `certificates`, `\n` line ends.
pub fn encode(certificates: &[Certificate]) -> Vec<u8> {
    let blocks: Vec<::pem::Pem> = certificates
        .iter()
        .map(|c| ::pem::Pem::new("CERTIFICATE", c.der.clone()))
        .collect();
    ::pem::encode_many_config(
        &blocks,
        ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
    )
    .into_bytes()
}

/// The certificates of a file's content, in order, when every block is one; `None` otherwise.
/// Used to compare a file with what we would write by certificates, not bytes: the same
/// certificates formatted differently (another writer's line ends) are the same file.
pub fn certificate_ders(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    parse_certificates(bytes)
        .ok()
        .map(|certs| certs.into_iter().map(|c| c.der).collect())
}

/// Every certificate a file's content holds, as a lenient PEM reader (Go's) sees it: the
/// `CERTIFICATE` blocks that parse, whatever else is there. What the file's consumer trusts
/// now, for the guard against a bundle that would take all of it away.
pub fn held_certificates(bytes: &[u8]) -> Vec<Certificate> {
    let Ok(blocks) = pem::blocks_skipping_torn(bytes) else {
        return Vec::new();
    };
    blocks
        .into_iter()
        .filter(|block| block.label == "CERTIFICATE")
        .filter_map(|block| {
            let info = reload_lib::CertInfo::from_der(&block.der).ok()?;
            Some(Certificate {
                der: block.der,
                not_after: info.not_after,
                is_ca: info.is_ca,
            })
        })
        .collect()
}

/// SHA-256 of `bytes`, lowercase hex: how Events and metrics name content without quoting it.
pub fn fingerprint(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn sources_are_concatenated_in_order_and_duplicates_kept_once() {
        let (a, b, c) = (ca("a"), ca("b"), ca("c"));
        let first = parse_certificates(format!("{a}{b}").as_bytes()).unwrap();
        let second = parse_certificates(format!("# comment\n{b}\n{c}{a}").as_bytes()).unwrap();
        let bundle = assemble([first.as_slice(), second.as_slice()]);
        assert_eq!(bundle.certificates.len(), 3);
        assert_eq!(bundle.duplicates, 2);
        let expected: Vec<Vec<u8>> = [&a, &b, &c]
            .iter()
            .map(|pem| parse_certificates(pem.as_bytes()).unwrap()[0].der.clone())
            .collect();
        assert_eq!(certificate_ders(&bundle.pem), Some(expected));
        // The same certificates always give the same bytes.
        let again = assemble([parse_certificates(&bundle.pem).unwrap().as_slice()]);
        assert_eq!(again.pem, bundle.pem);
    }

    #[test]
    fn every_block_must_be_a_certificate() {
        let good = ca("a");
        assert_eq!(parse_certificates(b"garbage"), Err(Invalid::Empty));
        assert_eq!(parse_certificates(b""), Err(Invalid::Empty));
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert!(matches!(
            parse_certificates(format!("{good}{key}").as_bytes()),
            Err(Invalid::NotACertificate { index: 1, .. })
        ));
        let torn = &good[..good.len() - 30];
        assert!(matches!(
            parse_certificates(format!("{good}{torn}").as_bytes()),
            Err(Invalid::Malformed { .. })
        ));
        let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            parse_certificates(format!("{good}{not_der}").as_bytes()),
            Err(Invalid::Unparsable { index: 1, .. })
        ));
    }

    #[test]
    fn errors_never_quote_the_content() {
        let secret = "-----BEGIN PRIVATE KEY-----\nU0VDUkVU\n-----END PRIVATE KEY-----\n";
        let err = parse_certificates(secret.as_bytes()).unwrap_err();
        assert!(!err.to_string().contains("U0VDUkVU"));
        assert!(!format!("{err:?}").contains("U0VDUkVU"));
    }

    #[test]
    fn fingerprints_are_sha256_hex() {
        assert_eq!(
            fingerprint(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
