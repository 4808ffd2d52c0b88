//! The host file's content: every source's PEM checked block by block, the certificates
//! concatenated in source order, identical certificates (same DER) kept once, at their first
//! place. The output is re-encoded PEM (64-column base64, `\n` line ends), so the same
//! certificates always give the same bytes whatever the sources' formatting.

use std::collections::HashSet;

use crate::pki::pem;
// The rule for the content of a trusted host file is the crate's one rule (`sync --file` uses it
// too): every block a certificate.
pub use crate::pki::trusted_bundle::{
    Certificate, Invalid, fingerprint, parse as parse_certificates,
};

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
}
