//! Key types for new signers and leaves.
//!
//! RSA-2048 with SHA-256 is the default because it is what OpenShift's library-go makes and
//! can use: it issues leaves with `SHA256WithRSA`, which fails with an ECDSA CA key, so after a
//! recovery with ECDSA signers the operator could not issue from any signer we made. ECDSA
//! P-256 stays available (`key-type: ecdsa-p256`, `--key-type ecdsa-p256`) for control planes
//! whose own tooling never signs from these CAs.

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
}

impl KeyType {
    /// A new random key of this type.
    pub fn generate(self) -> Result<KeyPair, String> {
        let algorithm = match self {
            KeyType::Rsa2048 => &rcgen::PKCS_RSA_SHA256,
            KeyType::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        };
        KeyPair::generate_for(algorithm).map_err(|err| format!("cannot generate a key: {err}"))
    }

    /// The name used in the config and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Rsa2048 => "rsa-2048",
            KeyType::EcdsaP256 => "ecdsa-p256",
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
}
