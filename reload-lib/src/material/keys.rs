//! The key provider of sets built on the default aws-lc-rs provider: the same parsers and the
//! same checks as rustls's own, each run once.
//!
//! rustls's aws-lc-rs `KeyProvider` tries the key types in turn: RSA, then ECDSA P-256, P-384 and
//! P-521, then Ed25519. Each attempt on a PKCS#8 key hands it whole to aws-lc, which parses it
//! *and checks it* (for an EC key, the public point is recomputed from the private scalar)
//! before it looks at the algorithm. An ECDSA P-256 key (`BEGIN PRIVATE KEY`, what `openssl
//! genpkey`, rcgen and most tools write) was thus parsed and checked twice, first as a would-be
//! RSA key (measured with callgrind: the key load was 265k of a pass's 456k instructions, 123k
//! of them the RSA attempt; see BENCHMARKS.md, "Rotations"). This provider reads the algorithm
//! from the PKCS#8 header and calls the matching rustls parser directly. Nothing is skipped:
//! aws-lc still parses and checks the key, and the key is still matched against the
//! certificate.

use std::sync::Arc;

use rustls::crypto::KeyProvider;
use rustls::crypto::aws_lc_rs::sign;
use rustls::sign::SigningKey;
use rustls_pki_types::PrivateKeyDer;
use x509_parser::asn1_rs::{FromDer, Integer, Sequence};
use x509_parser::oid_registry::{OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519};
use x509_parser::x509::AlgorithmIdentifier;
use zeroize::Zeroizing;

/// rustls's aws-lc-rs provider with [`ByAlgorithm`] as its key provider.
pub(crate) fn default_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::CryptoProvider {
        key_provider: &ByAlgorithm,
        ..rustls::crypto::aws_lc_rs::default_provider()
    }
}

/// aws-lc-rs key loading that goes straight to the parser for the key's algorithm.
#[derive(Debug)]
pub(crate) struct ByAlgorithm;

impl KeyProvider for ByAlgorithm {
    fn load_private_key(
        &self,
        key_der: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, rustls::Error> {
        // As rustls's own: the decoded key is wiped when dropped.
        let key = Zeroizing::new(key_der);
        match (&*key, pkcs8_algorithm(&key)) {
            (_, Some(Algorithm::Ec)) => sign::any_ecdsa_type(&key),
            (PrivateKeyDer::Pkcs8(pkcs8), Some(Algorithm::Ed25519)) => sign::any_eddsa_type(pkcs8),
            // PKCS#1 and SEC1 name their type in the PEM label, which rustls dispatches on
            // without parsing; RSA PKCS#8 is rustls's first attempt anyway.
            _ => sign::any_supported_type(&key),
        }
    }

    fn fips(&self) -> bool {
        rustls::crypto::aws_lc_rs::default_provider()
            .key_provider
            .fips()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Algorithm {
    Ec,
    Ed25519,
}

/// The algorithm named in a PKCS#8 key's header (`PrivateKeyInfo`: version, then the
/// algorithm identifier); `None` for other encodings, other algorithms and anything unparsable,
/// which then takes rustls's own path (and gets its errors).
fn pkcs8_algorithm(key: &PrivateKeyDer<'_>) -> Option<Algorithm> {
    let PrivateKeyDer::Pkcs8(pkcs8) = key else {
        return None;
    };
    let (_, info) = Sequence::from_der(pkcs8.secret_pkcs8_der()).ok()?;
    let (rest, _version) = Integer::from_der(&info.content).ok()?;
    let (_, algorithm) = AlgorithmIdentifier::from_der(rest).ok()?;
    if algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        Some(Algorithm::Ec)
    } else if algorithm.algorithm == OID_SIG_ED25519 {
        Some(Algorithm::Ed25519)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkcs8(alg: &'static rcgen::SignatureAlgorithm) -> PrivateKeyDer<'static> {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        PrivateKeyDer::try_from(key.serialize_der()).unwrap()
    }

    #[test]
    fn each_key_type_loads_as_with_rustls_own_provider() {
        let rustls_own = rustls::crypto::aws_lc_rs::default_provider().key_provider;
        for (alg, expected) in [
            (&rcgen::PKCS_ECDSA_P256_SHA256, Some(Algorithm::Ec)),
            (&rcgen::PKCS_ECDSA_P384_SHA384, Some(Algorithm::Ec)),
            (&rcgen::PKCS_ED25519, Some(Algorithm::Ed25519)),
            (&rcgen::PKCS_RSA_SHA256, None),
        ] {
            let key = pkcs8(alg);
            assert_eq!(pkcs8_algorithm(&key), expected, "{alg:?}");
            let ours = ByAlgorithm.load_private_key(key.clone_key()).unwrap();
            let theirs = rustls_own.load_private_key(key).unwrap();
            assert_eq!(ours.algorithm(), theirs.algorithm(), "{alg:?}");
            assert_eq!(ours.public_key(), theirs.public_key(), "{alg:?}");
        }
    }

    #[test]
    fn a_corrupt_key_is_refused_whatever_its_header_says() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut der = key.serialize_der();
        // One byte of the private scalar (after `04 20`, its OCTET STRING header) changed: it no
        // longer matches the public point stored with it, and aws-lc's key check must say so.
        let scalar = der.windows(2).position(|w| w == [0x04, 0x20]).unwrap() + 2;
        der[scalar + 5] ^= 0x55;
        let corrupt = PrivateKeyDer::try_from(der).unwrap();
        assert_eq!(pkcs8_algorithm(&corrupt), Some(Algorithm::Ec));
        assert!(ByAlgorithm.load_private_key(corrupt).is_err());
        // Not DER at all.
        let garbage = PrivateKeyDer::Pkcs8(vec![0x30, 0x03, 0x02, 0x01].into());
        assert!(ByAlgorithm.load_private_key(garbage).is_err());
    }
}
