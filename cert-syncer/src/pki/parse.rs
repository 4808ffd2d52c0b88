//! Certificates and keys from PEM, as the decisions and `inspect` see them (parsed from the
//! bytes, never from annotations): [`Cert`], [`KeyPairPem`], bundles.

use reload_lib::{CertInfo, InvalidMaterial};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::pem;

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
