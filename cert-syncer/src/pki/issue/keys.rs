//! Key types for new signers and leaves.
//!
//! RSA-2048 with SHA-256 is the default because it is what OpenShift's library-go makes on
//! every release without the `ConfigurablePKI` feature gate. Under that gate library-go's
//! default PKI profile (`pkg/pki/profile.go` `DefaultPKIProfile`) makes ECDSA P-384 signers and
//! ECDSA P-256 leaves, and lets Go pick the signature from the CA's key
//! (`pkg/crypto/cert_config.go`: `SignatureAlgorithm = 0`): `key-type: ecdsa-p384` is that
//! pairing. `ecdsa-p256` makes every key P-256 (`docs/openshift.md`, "Key types").

use rcgen::KeyPair;
use serde::Deserialize;

/// The algorithm of a newly generated key (existing keys are used as they are).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyType {
    /// RSA 2048-bit, certificates signed with SHA-256 (library-go's choice).
    #[default]
    #[serde(rename = "rsa-2048")]
    Rsa2048,
    /// ECDSA on P-256, certificates signed with SHA-256.
    #[serde(rename = "ecdsa-p256")]
    EcdsaP256,
    /// ECDSA P-384 signers and intermediates (signing with SHA-384), ECDSA P-256 leaves:
    /// library-go's default under the `ConfigurablePKI` feature gate.
    #[serde(rename = "ecdsa-p384")]
    EcdsaP384,
}

impl KeyType {
    /// A new random key of this type for a CA (signer or intermediate).
    pub fn generate(self) -> Result<KeyPair, String> {
        let algorithm = match self {
            KeyType::Rsa2048 => &rcgen::PKCS_RSA_SHA256,
            KeyType::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyType::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
        };
        KeyPair::generate_for(algorithm).map_err(|err| format!("cannot generate a key: {err}"))
    }

    /// A new random key of this type for a leaf (P-256 under `ecdsa-p384`, as library-go pairs
    /// them).
    pub fn generate_leaf(self) -> Result<KeyPair, String> {
        match self {
            KeyType::EcdsaP384 => KeyType::EcdsaP256.generate(),
            other => other.generate(),
        }
    }

    /// The name used in the config and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Rsa2048 => "rsa-2048",
            KeyType::EcdsaP256 => "ecdsa-p256",
            KeyType::EcdsaP384 => "ecdsa-p384",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsa_keys_are_2048_bit_and_sign_with_sha256() {
        let key = KeyType::Rsa2048.generate().unwrap();
        assert!(std::ptr::eq(key.algorithm(), &rcgen::PKCS_RSA_SHA256));
        // PKCS#8 of a 2048-bit RSA key is about 1,190-1,220 bytes.
        let der = key.serialize_der();
        assert!((1100..1300).contains(&der.len()), "{} bytes", der.len());
        let ec = KeyType::EcdsaP256.generate().unwrap();
        assert!(std::ptr::eq(ec.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256));
    }

    #[test]
    fn ecdsa_p384_pairs_p384_cas_with_p256_leaves_and_they_verify() {
        let ca = KeyType::EcdsaP384.generate().unwrap();
        assert!(std::ptr::eq(ca.algorithm(), &rcgen::PKCS_ECDSA_P384_SHA384));
        let leaf = KeyType::EcdsaP384.generate_leaf().unwrap();
        assert!(std::ptr::eq(
            leaf.algorithm(),
            &rcgen::PKCS_ECDSA_P256_SHA256
        ));
        // A whole signer and leaf: the leaf is P-256, signed by the P-384 CA (SHA-384).
        let now = 1_700_000_000;
        let day = std::time::Duration::from_secs(86_400);
        let signer =
            crate::pki::new_signer_of(KeyType::EcdsaP384, "ns_s@1", now, day, 10 * day).unwrap();
        let identity = crate::pki::Identity::Client {
            user: "u".into(),
            groups: vec![],
        };
        let pair =
            crate::pki::new_leaf_of(KeyType::EcdsaP384, &signer, &identity, now, day, day).unwrap();
        assert!(crate::pki::issued_by(pair.cert(), signer.cert()));
        let (_, leaf) = x509_parser::parse_x509_certificate(&pair.cert().der).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&signer.cert().der).unwrap();
        assert_eq!(
            leaf.signature_algorithm.algorithm,
            x509_parser::oid_registry::OID_SIG_ECDSA_WITH_SHA384
        );
        fn curve(cert: &x509_parser::certificate::X509Certificate<'_>) -> String {
            cert.public_key()
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .unwrap()
                .to_id_string()
        }
        assert_eq!(curve(&ca), "1.3.132.0.34"); // secp384r1
        assert_eq!(curve(&leaf), "1.2.840.10045.3.1.7"); // prime256v1
    }
}
