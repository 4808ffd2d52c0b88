//! Entry points for the fuzz targets in `fuzz/` (see `fuzz/README.md`): the parsing that reload
//! applies to the bytes of certificate, key, CA-bundle and CRL files, and the SNI name matcher,
//! without files, watches or a runtime. Not part of the API: hidden from the docs, may change or go
//! away in any release.

use std::path::Path;

use crate::error::Result;

use super::{CertInfo, ParsedBundle, ParsedPair};

/// The file name errors report (the fuzz targets have no files).
const INPUT: &str = "<fuzz input>";

/// What reload does with a certificate chain and a key: PEM, X.509 facts of every certificate,
/// chain order, the key loaded by aws-lc-rs, key matches leaf. `cert_pem` and `key_pem` may be the
/// same bytes (a bundle file). Returns the leaf's facts.
///
/// # Errors
/// Whatever reload would report for these bytes.
pub fn parse_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertInfo> {
    let provider = super::keys::default_provider();
    let path = Path::new(INPUT);
    ParsedPair::parse(path, cert_pem, path, key_pem, &provider).map(|pair| pair.info)
}

/// What reload does with a CA bundle and an optional CRL file: PEM, X.509 facts of every
/// certificate, CRL parsing, the root store. Returns how many certificates and CRLs it holds.
///
/// # Errors
/// Whatever reload would report for these bytes.
pub fn parse_bundle(ca_pem: &[u8], crl_pem: Option<&[u8]>) -> Result<(usize, usize)> {
    let path = Path::new(INPUT);
    let mut bundle = ParsedBundle::parse(path, ca_pem)?;
    if let Some(crl_pem) = crl_pem {
        bundle.add_crls(path, crl_pem)?;
    }
    bundle.root_store(path)?;
    Ok((bundle.certs.len(), bundle.crls.len()))
}

/// The SNI matcher: whether certificate name `cert_name` (`api.a.com`, `*.a.com`) covers `name`.
pub fn covers(cert_name: &str, name: &str) -> bool {
    super::covers(cert_name, name)
}

/// How SNI and certificate names are compared: lower-cased, one trailing dot stripped.
pub fn normalize_name(name: &str) -> String {
    super::normalize_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_pair(b"", b"").is_err());
        assert!(parse_bundle(b"-----BEGIN CERTIFICATE-----\n!!\n", None).is_err());
        assert!(covers("*.a.com", "X.A.COM."));
        assert_eq!(normalize_name("A.b."), "a.b");
    }
}
