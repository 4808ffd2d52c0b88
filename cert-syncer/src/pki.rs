//! Certificates as the decisions see them (parsed from PEM, never from annotations), and the
//! generation of new signers and leaves. `inspect` reads certificates through the same functions.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use reload_lib::{CertInfo, InvalidMaterial};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use time::OffsetDateTime;

/// What a leaf certificate is for (a target of the rotation config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A serving certificate for these names (DNS names and IP addresses), sorted, deduplicated.
    Serving { hostnames: Vec<String> },
    /// A client certificate: subject CN = user, O = groups (sorted, deduplicated).
    Client { user: String, groups: Vec<String> },
}

use crate::regenerate::KeyType;

pub mod pem;
mod subject;
pub mod verify;

/// A parsed certificate with the facts the decisions use.
#[derive(Clone)]
pub struct Cert {
    pub der: CertificateDer<'static>,
    pub not_before: i64,
    pub not_after: i64,
    pub is_ca: bool,
    /// DNS names (lowercase) and IP addresses as text, sorted.
    pub hostnames: Vec<String>,
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
    pub issuer_common_name: Option<String>,
    pub serial: String,
    /// reload-lib's facts (full subject and issuer, SANs, fingerprint), for `inspect`.
    pub info: CertInfo,
}

impl std::fmt::Debug for Cert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cert")
            .field("common_name", &self.common_name)
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Cert {
    /// Parses one DER certificate.
    pub fn from_der(der: CertificateDer<'static>) -> Result<Cert, String> {
        let info = CertInfo::from_der(&der)?;
        let (_, parsed) =
            x509_parser::parse_x509_certificate(&der).map_err(|err| err.to_string())?;
        let common_name = parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let issuer_common_name = parsed
            .issuer()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let mut organizations: Vec<String> = parsed
            .subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        organizations.sort();
        let mut hostnames: Vec<String> = info
            .dns_names
            .iter()
            .cloned()
            .chain(info.ip_addresses.iter().map(ToString::to_string))
            .collect();
        hostnames.sort();
        hostnames.dedup();
        Ok(Cert {
            der,
            not_before: info.not_before,
            not_after: info.not_after,
            is_ca: info.is_ca,
            hostnames,
            common_name,
            organizations,
            issuer_common_name,
            serial: info.serial.clone(),
            info,
        })
    }

    /// PEM text.
    pub fn pem(&self) -> String {
        ::pem::encode_config(
            &::pem::Pem::new("CERTIFICATE", self.der.to_vec()),
            ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
        )
    }

    pub fn is_expired_at(&self, now: i64) -> bool {
        now >= self.not_after
    }
}

/// A certificate (with its chain, leaf first) and the matching private key.
pub struct KeyPairPem {
    pub chain: Vec<Cert>,
    /// The key, PEM. Never logged; `Debug` omits it.
    pub key_pem: String,
}

impl std::fmt::Debug for KeyPairPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPairPem")
            .field("chain", &self.chain)
            .finish_non_exhaustive()
    }
}

impl KeyPairPem {
    /// The leaf.
    pub fn cert(&self) -> &Cert {
        &self.chain[0]
    }

    /// Parses `tls.crt` and `tls.key`: PEM, at least one certificate, a private key that
    /// matches the first certificate.
    pub fn parse(cert_pem: &[u8], key_pem: &[u8]) -> Result<KeyPairPem, String> {
        let chain = parse_certs(cert_pem).map_err(|err| format!("tls.crt: {err}"))?;
        match key_fits(&chain[0], key_pem) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "tls.key does not fit tls.crt: {}",
                    InvalidMaterial::KeyMismatch
                ));
            }
            Err(err) => return Err(format!("tls.key: {err}")),
        }
        let key_pem =
            String::from_utf8(key_pem.to_vec()).map_err(|_| "tls.key is not text".to_owned())?;
        Ok(KeyPairPem { chain, key_pem })
    }

    /// `tls.crt` text: the chain, leaf first.
    pub fn cert_pem(&self) -> String {
        self.chain.iter().map(Cert::pem).collect()
    }
}

/// Parses every `CERTIFICATE` block of a PEM text (leaf first, for a chain), all or nothing: an
/// empty text, no certificate, malformed PEM or a block that is not X.509 is an error, worded as
/// reload-lib words it.
pub fn parse_certs(text: &[u8]) -> Result<Vec<Cert>, InvalidMaterial> {
    if text.iter().all(u8::is_ascii_whitespace) {
        return Err(InvalidMaterial::Empty);
    }
    let ders = pem::certificates(text).map_err(|err| InvalidMaterial::Pem(err.to_string()))?;
    if ders.is_empty() {
        return Err(InvalidMaterial::NoCertificate);
    }
    ders.into_iter()
        .enumerate()
        .map(|(index, der)| {
            Cert::from_der(CertificateDer::from(der))
                .map_err(|detail| InvalidMaterial::BadCertificate { index, detail })
        })
        .collect()
}

/// Whether the private key in `key_pem` belongs to `leaf`: `Ok(false)` for a well-formed key of
/// another certificate, an error when there is no usable key (the same checks reload-lib makes
/// before serving a pair).
pub fn key_fits(leaf: &Cert, key_pem: &[u8]) -> Result<bool, InvalidMaterial> {
    let key = parse_key(key_pem)?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|err| InvalidMaterial::BadKey(err.to_string()))?;
    match rustls::sign::CertifiedKey::new(vec![leaf.der.clone()], signing_key).keys_match() {
        Ok(()) => Ok(true),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => Ok(false),
        Err(other) => Err(InvalidMaterial::BadKey(other.to_string())),
    }
}

/// The first private key block of a PEM text (PKCS#8, PKCS#1 or SEC1).
pub fn parse_key(key_pem: &[u8]) -> Result<PrivateKeyDer<'static>, InvalidMaterial> {
    if key_pem.iter().all(u8::is_ascii_whitespace) {
        return Err(InvalidMaterial::Empty);
    }
    PrivateKeyDer::from_pem_slice(key_pem).map_err(|err| match err {
        rustls_pki_types::pem::Error::NoItemsFound => InvalidMaterial::NoPrivateKey,
        other => InvalidMaterial::Pem(other.to_string()),
    })
}

/// Why a certificate does not chain to a set of CAs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// No CA of the set has the certificate's issuer name (nor does the certificate's own chain
    /// lead to one): the set is not the certificate's trust, as opposed to a broken chain.
    UnknownIssuer,
    /// A path exists by name but fails: bad signature, an expired CA, a CA that may not sign,
    /// a usage the CA does not allow. The text is the verifier's.
    Invalid(String),
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChainError::UnknownIssuer => f.write_str("no CA of the bundle issued it"),
            ChainError::Invalid(why) => f.write_str(why),
        }
    }
}

/// Whether `chain` (leaf first, then the intermediates it was served with) leads to one of
/// `anchors`, checked by webpki at `at` (seconds since the Unix epoch) for any TLS usage
/// (server auth, else client auth).
///
/// A CA certificate (a signer's own `tls.crt`) is not an end entity for webpki: it chains when
/// it is one of `anchors`, or when an anchor with its issuer's name verifies its signature.
pub fn chains_to(chain: &[Cert], anchors: &[Cert], at: i64) -> Result<(), ChainError> {
    let Some(leaf) = chain.first() else {
        return Err(ChainError::Invalid("no certificate".to_owned()));
    };
    if leaf.is_ca {
        return ca_chains_to(leaf, anchors);
    }
    let trust: Vec<_> = anchors
        .iter()
        .filter_map(|ca| webpki::anchor_from_trusted_cert(&ca.der).ok())
        .collect();
    let end_entity = webpki::EndEntityCert::try_from(&leaf.der).map_err(|err| {
        ChainError::Invalid(format!("not a usable end-entity certificate: {err}"))
    })?;
    let intermediates: Vec<CertificateDer<'_>> = chain[1..].iter().map(|c| c.der.clone()).collect();
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let algorithms = provider.signature_verification_algorithms.all;
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(at.max(0) as u64));
    let verify = |usage: webpki::KeyUsage| {
        end_entity
            .verify_for_usage(algorithms, &trust, &intermediates, time, usage, None, None)
            .map(|_| ())
    };
    #[allow(deprecated)] // RequiredEkuNotFound: older webpki releases still return it
    let result = match verify(webpki::KeyUsage::server_auth()) {
        Err(webpki::Error::RequiredEkuNotFound | webpki::Error::RequiredEkuNotFoundContext(_)) => {
            verify(webpki::KeyUsage::client_auth())
        }
        other => other,
    };
    result.map_err(|err| match err {
        webpki::Error::UnknownIssuer => ChainError::UnknownIssuer,
        other => ChainError::Invalid(format!("{other}")),
    })
}

fn ca_chains_to(ca: &Cert, anchors: &[Cert]) -> Result<(), ChainError> {
    if anchors.iter().any(|anchor| anchor.der == ca.der) {
        return Ok(());
    }
    let (_, parsed) = x509_parser::parse_x509_certificate(&ca.der)
        .map_err(|err| ChainError::Invalid(err.to_string()))?;
    let mut issuers = anchors
        .iter()
        .filter(|anchor| anchor.info.subject == ca.info.issuer)
        .peekable();
    if issuers.peek().is_none() {
        return Err(ChainError::UnknownIssuer);
    }
    let mut last = String::new();
    for issuer in issuers {
        let Ok((_, issuer)) = x509_parser::parse_x509_certificate(&issuer.der) else {
            continue;
        };
        match parsed.verify_signature(Some(issuer.public_key())) {
            Ok(()) => return Ok(()),
            Err(err) => {
                last = format!(
                    "the signature does not verify with the CA {}: {err}",
                    issuer.subject()
                )
            }
        }
    }
    Err(ChainError::Invalid(last))
}

/// Whether `cert` was issued by `ca`: the issuer name is the CA's subject and the signature
/// verifies with the CA's key (names alone are not proof).
pub fn issued_by(cert: &Cert, ca: &Cert) -> bool {
    if cert.info.issuer != ca.info.subject {
        return false;
    }
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(&cert.der),
        x509_parser::parse_x509_certificate(&ca.der),
    ) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// Parses a CA bundle; blocks that are not certificates are reported and skipped.
pub fn parse_bundle(text: &[u8]) -> (Vec<Cert>, Vec<String>) {
    let ders = match pem::certificates(text) {
        Ok(ders) => ders,
        Err(err) => return (Vec::new(), vec![err.to_string()]),
    };
    let mut certs = Vec::new();
    let mut problems = Vec::new();
    for (i, der) in ders.into_iter().enumerate() {
        match Cert::from_der(CertificateDer::from(der)) {
            Ok(cert) => certs.push(cert),
            Err(err) => problems.push(format!("block {i}: {err}")),
        }
    }
    (certs, problems)
}

/// The bundle text: certificates in the given order.
pub fn bundle_pem(certs: &[Cert]) -> String {
    certs.iter().map(Cert::pem).collect()
}

/// [`new_signer_of`] with an ECDSA P-256 key (cheap: tests and `inspect`'s fixtures).
#[cfg(test)]
pub fn new_signer(
    common_name: &str,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    new_signer_of(KeyType::EcdsaP256, common_name, now, backdate, validity)
}

/// The parameters of a CA certificate as library-go issues them (CA without a path length;
/// keyCertSign, cRLSign, digitalSignature) named `common_name`, valid from `not_before` to
/// `not_after` (unix seconds): for self-signed signers and intermediate CAs alike.
pub fn ca_params(
    common_name: &str,
    not_before: i64,
    not_after: i64,
) -> Result<CertificateParams, String> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_before = at(not_before)?;
    params.not_after = at(not_after)?;
    Ok(params)
}

/// A new self-signed CA with a `key_type` key, valid from `now - backdate` for `validity`; CN
/// as library-go names it: `<namespace>_<name>@<unix seconds>`.
pub fn new_signer_of(
    key_type: KeyType,
    common_name: &str,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    let key = key_type.generate()?;
    let params = ca_params(
        common_name,
        now - backdate.as_secs() as i64,
        now + validity.as_secs() as i64,
    )?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let cert = Cert::from_der(cert.der().clone())?;
    Ok(KeyPairPem {
        chain: vec![cert],
        key_pem: key.serialize_pem(),
    })
}

/// [`new_leaf_of`] with an ECDSA P-256 key (cheap: tests and `inspect`'s fixtures).
#[cfg(test)]
pub fn new_leaf(
    signer: &KeyPairPem,
    identity: &Identity,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    new_leaf_of(
        KeyType::EcdsaP256,
        signer,
        identity,
        now,
        backdate,
        validity,
    )
}

/// A new leaf for `identity` with a `key_type` key, signed by `signer` (with the signer key's
/// algorithm: SHA-256 with RSA for an RSA signer), valid from `now - backdate` for `validity`
/// but never past the signer's own notAfter.
pub fn new_leaf_of(
    key_type: KeyType,
    signer: &KeyPairPem,
    identity: &Identity,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    let ca_key = signing_key(&signer.key_pem)?;
    let issuer = Issuer::from_ca_cert_der(&signer.cert().der, ca_key)
        .map_err(|e| format!("signer certificate: {e}"))?;
    let key = key_type.generate_leaf()?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    match identity {
        Identity::Serving { hostnames } => {
            for name in hostnames {
                params
                    .subject_alt_names
                    .push(match name.parse::<std::net::IpAddr>() {
                        Ok(ip) => SanType::IpAddress(ip),
                        Err(_) => SanType::DnsName(
                            name.clone()
                                .try_into()
                                .map_err(|e| format!("{name}: {e}"))?,
                        ),
                    });
            }
            params
                .distinguished_name
                .push(DnType::CommonName, hostnames[0].as_str());
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        Identity::Client { user, groups } => {
            params
                .distinguished_name
                .push(DnType::CommonName, user.as_str());
            for group in groups {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, group.as_str());
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = at(now - backdate.as_secs() as i64)?;
    let not_after = (now + validity.as_secs() as i64).min(signer.cert().not_after);
    params.not_after = at(not_after)?;
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    let der = match identity {
        // rcgen keeps one O: the subject with every group is written by `subject`.
        Identity::Client { user, groups } if groups.len() > 1 => CertificateDer::from(
            subject::with_groups(cert.der(), user, groups, &signing_key(&signer.key_pem)?)?,
        ),
        _ => cert.der().clone(),
    };
    Ok(KeyPairPem {
        chain: vec![Cert::from_der(der)?],
        key_pem: key.serialize_pem(),
    })
}

/// The signer's key as rcgen signs with it: the key block [`key_fits`] checked (the first
/// private key of the PEM, whatever precedes it, such as OpenSSL's `EC PARAMETERS`), not the
/// first PEM block.
pub fn signing_key(key_pem: &str) -> Result<KeyPair, String> {
    let key = parse_key(key_pem.as_bytes()).map_err(|e| format!("signer key: {e}"))?;
    KeyPair::try_from(&key).map_err(|e| format!("signer key: {e}"))
}

fn at(unix: i64) -> Result<OffsetDateTime, String> {
    OffsetDateTime::from_unix_timestamp(unix).map_err(|e| e.to_string())
}
