//! Facts about a certificate for logs, metrics and decisions.

use std::net::IpAddr;

use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// What a certificate says about itself: enough to log it, alert on it and choose SNI names.
///
/// Built from the DER by the crate; shown in [`ServedCert`](crate::ServedCert) for every served
/// certificate.
///
/// ```
/// use reload_lib::CertInfo;
///
/// let pair = rcgen::generate_simple_self_signed(["API.example".to_owned(), "10.0.0.1".to_owned()])?;
/// let info = CertInfo::from_der(pair.cert.der())?;
/// assert_eq!(info.dns_names, ["api.example"]); // lower-cased
/// assert_eq!(info.ip_addresses, ["10.0.0.1".parse::<std::net::IpAddr>()?]);
/// assert_eq!(info.sha256.len(), 64);
/// assert!(!info.is_ca && !info.is_expired_at(info.not_before));
/// assert!(info.is_expired_at(info.not_after + 1));
/// println!("expires {}", info.not_after_rfc3339());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Security
/// Facts for logs, metrics and name selection, parsed without verifying anything: a `CertInfo`
/// says nothing about whether the certificate is trusted. Chains are verified by rustls.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CertInfo {
    /// Subject distinguished name, RFC 4514 style (`CN=api,O=example`).
    pub subject: String,
    /// Issuer distinguished name.
    pub issuer: String,
    /// DNS subject alternative names, lower-cased, as written (wildcards kept).
    pub dns_names: Vec<String>,
    /// IP subject alternative names (never used as SNI names).
    pub ip_addresses: Vec<IpAddr>,
    /// Serial number, lowercase hex without separators.
    pub serial: String,
    /// SHA-256 of the DER, lowercase hex.
    pub sha256: String,
    /// notBefore, seconds since the Unix epoch.
    pub not_before: i64,
    /// notAfter, seconds since the Unix epoch.
    pub not_after: i64,
    /// Whether basicConstraints marks it as a CA.
    pub is_ca: bool,
    pub(crate) subject_raw: Vec<u8>,
    pub(crate) issuer_raw: Vec<u8>,
}

impl CertInfo {
    /// Parses the facts out of a DER certificate; the error is the parser's message. Trailing
    /// bytes after the certificate are an error.
    pub fn from_der(der: &[u8]) -> Result<Self, String> {
        let (rest, cert) = X509Certificate::from_der(der).map_err(|err| err.to_string())?;
        if !rest.is_empty() {
            return Err("trailing data after the certificate".to_owned());
        }
        let mut dns_names = Vec::new();
        let mut ip_addresses = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => dns_names.push(dns.to_ascii_lowercase()),
                    GeneralName::IPAddress(bytes) => {
                        if let Ok(v4) = <[u8; 4]>::try_from(*bytes) {
                            ip_addresses.push(IpAddr::from(v4));
                        } else if let Ok(v6) = <[u8; 16]>::try_from(*bytes) {
                            ip_addresses.push(IpAddr::from(v6));
                        }
                    }
                    _ => {}
                }
            }
        }
        let serial = cert.raw_serial();
        let serial = hex(&serial[serial.iter().take_while(|b| **b == 0).count()..]);
        Ok(Self {
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            dns_names,
            ip_addresses,
            serial: if serial.is_empty() {
                "00".to_owned()
            } else {
                serial
            },
            sha256: hex(&Sha256::digest(der)),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            is_ca: cert.is_ca(),
            subject_raw: cert.subject().as_raw().to_vec(),
            issuer_raw: cert.issuer().as_raw().to_vec(),
        })
    }

    /// Whether the certificate has expired at `now` (seconds since the Unix epoch).
    pub fn is_expired_at(&self, now: i64) -> bool {
        now > self.not_after
    }

    /// The common name of the subject, if any (used as an SNI name only when there are no DNS
    /// SANs, as Kubernetes does).
    pub(crate) fn common_name(&self) -> Option<&str> {
        self.subject
            .split(',')
            .find_map(|rdn| rdn.trim().strip_prefix("CN="))
    }

    /// notAfter formatted as RFC 3339 for logs and errors.
    pub fn not_after_rfc3339(&self) -> String {
        rfc3339(self.not_after)
    }
}

pub(crate) fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// Lowercase hex of `bytes` (one allocation; a `format!` per byte made this a third of
/// `CertInfo::from_der`).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}
