//! Parsed TLS material. Parse, don't validate: a [`ParsedPair`] only exists for a certificate
//! chain and key that belong together, a [`ParsedBundle`] only for a non-empty, fully parsable
//! CA bundle.

#[doc(hidden)]
pub mod fuzz;
mod info;
pub(crate) mod keys;
mod names;

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::{CertifiedKey, SigningKey};
use rustls_pki_types::pem::{PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use sha2::{Digest as _, Sha256};
use x509_parser::num_bigint::BigUint;
use zeroize::Zeroizing;

use crate::error::{Error, InvalidMaterial, Result};

pub use info::CertInfo;
pub(crate) use info::rfc3339;
pub(crate) use names::{covers, normalize_name};

/// A certificate chain and the private key of its leaf, checked to belong together.
#[derive(Clone)]
pub(crate) struct ParsedPair {
    pub(crate) certified: Arc<CertifiedKey>,
    pub(crate) info: CertInfo,
    /// When the whole chain (leaf and intermediates) is valid.
    pub(crate) validity: Validity,
    /// SHA-256 of the private key's DER (see [`LoadedKey`]).
    pub(crate) key_digest: KeyDigest,
}

/// SHA-256 of a private key's DER.
pub(crate) type KeyDigest = [u8; 32];

/// A private key an earlier pass loaded, parsed and checked: a pair whose key is the same DER
/// (a certificate renewed for the same key) reuses it instead of loading it again.
#[derive(Clone, Copy)]
pub(crate) struct LoadedKey<'a> {
    pub(crate) digest: &'a KeyDigest,
    pub(crate) key: &'a Arc<dyn SigningKey>,
}

/// The window in which every certificate of a chain is valid: the latest notBefore and the
/// earliest notAfter, seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Validity {
    pub(crate) not_before: i64,
    pub(crate) not_after: i64,
}

impl Validity {
    pub(crate) fn of_chain(infos: &[CertInfo]) -> Self {
        Self {
            not_before: infos.iter().map(|i| i.not_before).max().unwrap_or(i64::MIN),
            not_after: infos.iter().map(|i| i.not_after).min().unwrap_or(i64::MAX),
        }
    }

    pub(crate) fn is_expired_at(&self, now: i64) -> bool {
        now > self.not_after
    }

    pub(crate) fn is_not_yet_valid_at(&self, now: i64) -> bool {
        now < self.not_before
    }

    pub(crate) fn is_valid_at(&self, now: i64) -> bool {
        !self.is_expired_at(now) && !self.is_not_yet_valid_at(now)
    }
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
        Self::parse_reusing(cert_path, cert_pem, key_path, key_pem, provider, None)
    }

    /// [`parse`](Self::parse), reusing `loaded` when the key is the same DER: the key is then
    /// not parsed and checked a second time. It is matched against the certificate all the same.
    pub(crate) fn parse_reusing(
        cert_path: &Path,
        cert_pem: &[u8],
        key_path: &Path,
        key_pem: &[u8],
        provider: &CryptoProvider,
        loaded: Option<LoadedKey<'_>>,
    ) -> Result<Self> {
        // A bundle is decoded once for both: each PEM iteration decodes every section it passes,
        // the key's included (in constant time, the slow way).
        let bundle = std::ptr::eq(cert_pem, key_pem);
        let (chain, key_in_bundle) = if bundle {
            parse_bundle(cert_path, cert_pem)?
        } else {
            (parse_certificates(cert_path, cert_pem)?, None)
        };
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

        let key = match key_in_bundle {
            Some(key) => key,
            None if bundle => return Err(Error::invalid(key_path, InvalidMaterial::NoPrivateKey)),
            None => parse_key(key_path, key_pem)?,
        };
        let key_digest: KeyDigest = Sha256::digest(key.secret_der()).into();
        let signing_key = match loaded {
            Some(loaded) if *loaded.digest == key_digest => {
                // Wiped, as the provider wipes what it loads.
                drop(Zeroizing::new(key));
                Arc::clone(loaded.key)
            }
            // The provider's message is fixed text, but a key file's content must never reach
            // an error whatever a future provider says: name the failure only.
            _ => provider.key_provider.load_private_key(key).map_err(|_| {
                Error::invalid(
                    key_path,
                    InvalidMaterial::BadKey(
                        "unsupported algorithm or corrupt key (not RSA, ECDSA or Ed25519)"
                            .to_owned(),
                    ),
                )
            })?,
        };
        let certified = CertifiedKey::new(chain, signing_key);
        // `CertifiedKey::from_der` lets a key that cannot report its public key through; we do not.
        if let Err(err) = certified.keys_match() {
            let reason = match err {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    InvalidMaterial::KeyMismatch
                }
                _ => InvalidMaterial::BadKey("its public key cannot be derived".to_owned()),
            };
            return Err(Error::invalid(cert_path, reason));
        }
        let validity = Validity::of_chain(&infos);
        let info = infos
            .into_iter()
            .next()
            .expect("parse_certificates never returns an empty chain");
        Ok(Self {
            certified: Arc::new(certified),
            info,
            validity,
            key_digest,
        })
    }
}

/// A CA bundle (trust anchors) and optional CRLs.
#[derive(Debug, Clone)]
pub(crate) struct ParsedBundle {
    pub(crate) certs: Vec<CertificateDer<'static>>,
    pub(crate) infos: Vec<CertInfo>,
    pub(crate) crls: Vec<CertificateRevocationListDer<'static>>,
    /// Facts about each CRL of `crls`, same order.
    pub(crate) crl_infos: Vec<CrlInfo>,
}

/// What the policy needs to know about a CRL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CrlInfo {
    /// The file it came from and its position there.
    pub(crate) path: std::path::PathBuf,
    pub(crate) index: usize,
    pub(crate) issuer: String,
    pub(crate) issuer_raw: Vec<u8>,
    /// thisUpdate, seconds since the Unix epoch: when the issuer made it.
    pub(crate) this_update: i64,
    /// nextUpdate, seconds since the Unix epoch (`None`: the CRL has none).
    pub(crate) next_update: Option<i64>,
    /// The cRLNumber extension (RFC 5280 5.2.3: increases with every CRL of an issuer and
    /// scope), if any.
    pub(crate) number: Option<BigUint>,
    /// The issuingDistributionPoint extension's DER (RFC 5280 5.2.5: which certificates the CRL
    /// covers; `None`: all of its issuer's). CRLs of one issuer with different scopes are
    /// different series, numbered and compared apart.
    pub(crate) scope: Option<Vec<u8>>,
    /// The subjectPublicKeyInfo of the bundle CA whose key verified the signature; set by
    /// [`policy::crls_issued_by_bundle`](crate::policy::crls_issued_by_bundle), `None` before.
    /// With the issuer name and the scope it says which series of CRLs this one belongs to (a
    /// CA re-keyed under the same name starts a new series).
    pub(crate) signer_spki: Option<Vec<u8>>,
}

impl CrlInfo {
    /// The CRL's place in its series.
    pub(crate) fn position(&self) -> Position {
        Position {
            number: self.number.clone(),
            this_update: self.this_update,
        }
    }
}

/// A CRL's place in its series (see [`CrlInfo::scope`]): its cRLNumber, and its thisUpdate for
/// CRLs without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) number: Option<BigUint>,
    pub(crate) this_update: i64,
}

impl Position {
    /// Before `other` in their series: a lower cRLNumber when both have one, else an earlier
    /// thisUpdate.
    pub(crate) fn is_older_than(&self, other: &Position) -> bool {
        match (&self.number, &other.number) {
            (Some(mine), Some(theirs)) => mine < theirs,
            _ => self.this_update < other.this_update,
        }
    }
}

impl std::fmt::Display for Position {
    /// `cRLNumber N`, else `thisUpdate <RFC 3339>`: for messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.number {
            Some(number) => write!(f, "cRLNumber {number}"),
            None => write!(f, "thisUpdate {}", rfc3339(self.this_update)),
        }
    }
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
            crl_infos: Vec::new(),
        })
    }

    /// Adds the CRLs of one CRL file: PEM `X509 CRL` blocks, or one DER CRL. A file that holds
    /// neither (empty, an HTML error page, a certificate, garbage) is rejected: a configured CRL
    /// source that yields no CRL would silently turn revocation off.
    pub(crate) fn add_crls(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::invalid(path, InvalidMaterial::Empty));
        }
        let mut found = Vec::new();
        for (index, crl) in CertificateRevocationListDer::pem_slice_iter(bytes).enumerate() {
            let crl = crl.map_err(|_| Error::invalid(path, InvalidMaterial::BadCrl { index }))?;
            found.push(crl);
        }
        if found.is_empty() {
            // DER is what `openssl ca -gencrl -outform DER` and most CA endpoints serve.
            match x509_parser::parse_x509_crl(bytes) {
                Ok(([], _)) => {
                    found.push(CertificateRevocationListDer::from(bytes.to_vec()));
                }
                _ => return Err(Error::invalid(path, InvalidMaterial::NoCrl)),
            }
        }
        for (index, crl) in found.into_iter().enumerate() {
            let info = match x509_parser::parse_x509_crl(&crl) {
                Ok(([], parsed)) => CrlInfo {
                    path: path.to_owned(),
                    index,
                    issuer: parsed.issuer().to_string(),
                    issuer_raw: parsed.issuer().as_raw().to_vec(),
                    this_update: parsed.last_update().timestamp(),
                    next_update: parsed.next_update().map(|t| t.timestamp()),
                    number: parsed.crl_number().cloned(),
                    scope: parsed
                        .extensions()
                        .iter()
                        .find(|ext| {
                            ext.oid
                                == x509_parser::oid_registry::OID_X509_EXT_ISSUER_DISTRIBUTION_POINT
                        })
                        .map(|ext| ext.value.to_vec()),
                    signer_spki: None,
                },
                _ => return Err(Error::invalid(path, InvalidMaterial::BadCrl { index })),
            };
            self.crls.push(crl);
            self.crl_infos.push(info);
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

/// The first private key of a PEM file.
fn parse_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::invalid(path, InvalidMaterial::Empty));
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|err| {
        let reason = match err {
            rustls_pki_types::pem::Error::NoItemsFound => InvalidMaterial::NoPrivateKey,
            other => InvalidMaterial::Pem(pem_error(&other)),
        };
        Error::invalid(path, reason)
    })
}

/// A bundle's `CERTIFICATE` blocks (at least one, as [`parse_certificates`]) and its first
/// private key, in one pass over the file.
fn parse_bundle(
    path: &Path,
    pem: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, Option<PrivateKeyDer<'static>>)> {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::invalid(path, InvalidMaterial::Empty));
    }
    let (mut certs, mut key) = (Vec::new(), None);
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
        let (kind, der) =
            section.map_err(|err| Error::invalid(path, InvalidMaterial::Pem(pem_error(&err))))?;
        match kind {
            SectionKind::Certificate => certs.push(CertificateDer::from(der)),
            _ if key.is_none() => key = PrivateKeyDer::from_pem(kind, der),
            _ => {}
        }
    }
    if certs.is_empty() {
        return Err(Error::invalid(path, InvalidMaterial::NoCertificate));
    }
    Ok((certs, key))
}

/// All `CERTIFICATE` blocks of a PEM file, at least one, each well-formed PEM.
fn parse_certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::invalid(path, InvalidMaterial::Empty));
    }
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|err| Error::invalid(path, InvalidMaterial::Pem(pem_error(&err))))?;
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

/// What went wrong in a PEM file, without any of its content. The PEM parser's own messages
/// quote the offending line (as a byte list); in a key file, or a bundle holding a key, that line
/// is the private key, so it must never reach an error, a log or `Debug`.
pub(crate) fn pem_error(err: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error as Pem;
    match err {
        Pem::MissingSectionEnd { .. } => "a BEGIN line without its END line",
        Pem::IllegalSectionStart { .. } => {
            "a BEGIN line with trailing text (newlines lost?) or an unknown label"
        }
        Pem::Base64Decode(_) => "the body is not valid base64",
        Pem::Io(_) => "the content cannot be read",
        Pem::NoItemsFound => "no PEM section found",
        _ => "malformed PEM",
    }
    .to_owned()
}
