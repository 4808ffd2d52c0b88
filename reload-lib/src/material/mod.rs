//! Parsed TLS material. Parse, don't validate: a [`ParsedPair`] only exists for a certificate
//! chain and key that belong together, a [`ParsedBundle`] only for a non-empty, fully parsable
//! CA bundle.

#[doc(hidden)]
pub mod fuzz;
mod info;
mod names;

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use crate::error::{Error, InvalidMaterial, Result};

pub use info::CertInfo;
pub(crate) use info::rfc3339;
pub(crate) use names::{covers, normalize_name};

/// A certificate chain and the private key of its leaf, checked to belong together.
#[derive(Clone)]
pub(crate) struct ParsedPair {
    pub(crate) certified: Arc<CertifiedKey>,
    pub(crate) info: CertInfo,
}

impl std::fmt::Debug for ParsedPair {
    // The key never reaches Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedPair")
            .field("info", &self.info)
            .field("chain_len", &self.certified.cert.len())
            .finish_non_exhaustive()
    }
}

impl ParsedPair {
    /// Parses a chain (leaf first) and a private key. `cert_path` and `key_path` may be the same
    /// file (a bundle holding both), in which case `cert_pem` and `key_pem` are the same bytes.
    pub(crate) fn parse(
        cert_path: &Path,
        cert_pem: &[u8],
        key_path: &Path,
        key_pem: &[u8],
        provider: &CryptoProvider,
    ) -> Result<Self> {
        let chain = parse_certificates(cert_path, cert_pem)?;
        let infos = chain
            .iter()
            .enumerate()
            .map(|(index, der)| {
                CertInfo::from_der(der).map_err(|detail| {
                    Error::invalid(cert_path, InvalidMaterial::BadCertificate { index, detail })
                })
            })
            .collect::<Result<Vec<_>>>()?;
        check_chain_order(cert_path, &infos)?;

        if key_pem.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::invalid(key_path, InvalidMaterial::Empty));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|err| {
            let reason = match err {
                rustls_pki_types::pem::Error::NoItemsFound => InvalidMaterial::NoPrivateKey,
                other => InvalidMaterial::Pem(other.to_string()),
            };
            Error::invalid(key_path, reason)
        })?;
        let signing_key = provider
            .key_provider
            .load_private_key(key)
            .map_err(|err| Error::invalid(key_path, InvalidMaterial::BadKey(err.to_string())))?;
        let certified = CertifiedKey::new(chain, signing_key);
        // `CertifiedKey::from_der` lets a key that cannot report its public key through; we do not.
        if let Err(err) = certified.keys_match() {
            let reason = match err {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    InvalidMaterial::KeyMismatch
                }
                other => InvalidMaterial::BadKey(other.to_string()),
            };
            return Err(Error::invalid(cert_path, reason));
        }
        let info = infos
            .into_iter()
            .next()
            .expect("parse_certificates never returns an empty chain");
        Ok(Self {
            certified: Arc::new(certified),
            info,
        })
    }
}

/// A CA bundle (trust anchors) and optional CRLs.
#[derive(Debug, Clone)]
pub(crate) struct ParsedBundle {
    pub(crate) certs: Vec<CertificateDer<'static>>,
    pub(crate) infos: Vec<CertInfo>,
    pub(crate) crls: Vec<CertificateRevocationListDer<'static>>,
}

impl ParsedBundle {
    /// Parses a bundle: every `CERTIFICATE` block must parse and there must be at least one.
    /// Blocks of other types are skipped. All or nothing.
    pub(crate) fn parse(path: &Path, pem: &[u8]) -> Result<Self> {
        let certs = parse_certificates(path, pem)?;
        let infos = certs
            .iter()
            .enumerate()
            .map(|(index, der)| {
                CertInfo::from_der(der).map_err(|detail| {
                    Error::invalid(path, InvalidMaterial::BadCertificate { index, detail })
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            certs,
            infos,
            crls: Vec::new(),
        })
    }

    /// Adds the CRLs found in `pem` (a file of `X509 CRL` blocks).
    pub(crate) fn add_crls(&mut self, path: &Path, pem: &[u8]) -> Result<()> {
        for (index, crl) in CertificateRevocationListDer::pem_slice_iter(pem).enumerate() {
            let crl = crl.map_err(|_| Error::invalid(path, InvalidMaterial::BadCrl { index }))?;
            if x509_parser::parse_x509_crl(&crl).is_err() {
                return Err(Error::invalid(path, InvalidMaterial::BadCrl { index }));
            }
            self.crls.push(crl);
        }
        Ok(())
    }

    /// A root store holding every certificate of the bundle.
    pub(crate) fn root_store(&self, path: &Path) -> Result<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        for (index, cert) in self.certs.iter().enumerate() {
            roots.add(cert.clone()).map_err(|err| {
                Error::invalid(
                    path,
                    InvalidMaterial::BadCertificate {
                        index,
                        detail: err.to_string(),
                    },
                )
            })?;
        }
        Ok(roots)
    }

    /// True when every CA of `self` is also in `other` and the CRLs are the same, i.e. moving
    /// from `self` to `other` does not take trust away.
    pub(crate) fn is_subset_of(&self, other: &ParsedBundle) -> bool {
        self.crls == other.crls && self.certs.iter().all(|c| other.certs.contains(c))
    }
}

/// All `CERTIFICATE` blocks of a PEM file, at least one, each well-formed PEM.
fn parse_certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::invalid(path, InvalidMaterial::Empty));
    }
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|err| Error::invalid(path, InvalidMaterial::Pem(err.to_string())))?;
    if certs.is_empty() {
        return Err(Error::invalid(path, InvalidMaterial::NoCertificate));
    }
    Ok(certs)
}

/// Each certificate after the leaf must have issued the one before it: a misordered chain makes
/// clients fail verification, so it is rejected rather than served.
fn check_chain_order(path: &Path, infos: &[CertInfo]) -> Result<()> {
    for (index, pair) in infos.windows(2).enumerate() {
        if pair[0].issuer_raw != pair[1].subject_raw {
            return Err(Error::invalid(
                path,
                InvalidMaterial::BadCertificate {
                    index: index + 1,
                    detail: format!(
                        "certificate {} is not the issuer of certificate {index} (chain out of order)",
                        index + 1
                    ),
                },
            ));
        }
    }
    Ok(())
}
