//! A file of certificates that other components trust (a CA bundle on a host): its content must
//! be PEM `CERTIFICATE` blocks and nothing else. The one rule for every such file we write:
//! node mode's assembled bundle (`node/bundle.rs`) and `sync --file` (`sync/sink/host_file.rs`).
//! A private key there would be world-readable (these files are 0644) and served to whoever
//! reads the bundle, so a block of any other type refuses the whole content; so does a block
//! that does not decode, a BEGIN line without its END line (the strict reader,
//! [`pem::blocks`]), or a `CERTIFICATE` block that is not one X.509 certificate.
//!
//! Text outside the blocks (comments, blank lines) is ignored, as Go's `pem.Decode` does.

use sha2::{Digest, Sha256};

use super::pem;

/// One certificate: its DER and the facts node mode's metrics and guard need.
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

/// Why content was refused. Never quotes the content.
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
pub fn parse(bytes: &[u8]) -> Result<Vec<Certificate>, Invalid> {
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
        let day = std::time::Duration::from_secs(86_400);
        crate::pki::new_signer(name, crate::base::time::unix_now(), day, day)
            .unwrap()
            .cert_pem()
    }

    #[test]
    fn every_block_must_be_a_certificate() {
        let good = ca("a");
        assert_eq!(
            parse(format!("# comment\n{good}\n").as_bytes())
                .unwrap()
                .len(),
            1
        );
        assert_eq!(parse(b"garbage"), Err(Invalid::Empty));
        assert_eq!(parse(b""), Err(Invalid::Empty));
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert!(matches!(
            parse(format!("{good}{key}").as_bytes()),
            Err(Invalid::NotACertificate { index: 1, .. })
        ));
        let rsa = "-----BEGIN RSA PRIVATE KEY-----\nU0VDUkVU\n-----END RSA PRIVATE KEY-----\n";
        assert!(matches!(
            parse(format!("{rsa}{good}").as_bytes()),
            Err(Invalid::NotACertificate { index: 0, label }) if label == "RSA PRIVATE KEY"
        ));
        let torn = &good[..good.len() - 30];
        assert!(matches!(
            parse(format!("{good}{torn}").as_bytes()),
            Err(Invalid::Malformed { .. })
        ));
        let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            parse(format!("{good}{not_der}").as_bytes()),
            Err(Invalid::Unparsable { index: 1, .. })
        ));
    }

    #[test]
    fn errors_never_quote_the_content() {
        let secret = "-----BEGIN PRIVATE KEY-----\nU0VDUkVU\n-----END PRIVATE KEY-----\n";
        let err = parse(secret.as_bytes()).unwrap_err();
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
