//! rustls' aws-lc-rs `CryptoProvider` with one change: the TLS 1.3 key schedule's HKDF runs on
//! an HMAC keyed once per secret (RustCrypto's `hmac` + `sha2`) instead of aws-lc's `HKDF_expand`,
//! which keys a fresh HMAC for every label.
//!
//! A TLS 1.3 handshake derives some 20 values from a handful of secrets (traffic secrets, their
//! key and IV, finished keys, the next stage's salt), each one HKDF-Expand-Label = one HMAC keyed
//! with the secret. Keying costs two hash compressions (the padded key's inner and outer block).
//! rustls' own [`HkdfUsingHmac`] keys once per secret and copies that state for every label:
//! about a third fewer SHA-384 compressions per full handshake (callgrind: 125 → 88). The
//! early secret of a handshake without PSK, HKDF-Extract(0, 0), is a constant: computed once.
//!
//! Why RustCrypto's HMAC rather than aws-lc's under `HkdfUsingHmac`: aws-lc (like BoringSSL and
//! ring) enables its AVX SHA-512 code on Intel CPUs only, so on AMD it runs its scalar
//! `sha512_block_data_order_nohw`; `sha2` picks its AVX2 code by CPU feature, any vendor, and
//! copying a RustCrypto HMAC state is a plain struct copy where aws-lc's `HMAC_CTX_copy_ex` goes
//! through `EVP_MD_CTX` glue. On the AMD EPYC of BENCHMARKS.md this cut the server's CPU per
//! full handshake by about 3 % (aws-lc's HMAC with the same keying: the 8 % fewer instructions of
//! the keying alone). Same algorithm, same suites, same outputs (RFC 5869 and RFC 8446 §7.1,
//! checked against the stock provider in the tests below).
//!
//! Everything else — key exchange, signatures, AEADs, the transcript hash, TLS 1.2 — is the
//! stock provider's.

use std::sync::OnceLock;

use ::hmac::Mac;

use rustls::crypto::tls13::{Hkdf, HkdfExpander, HkdfUsingHmac, OkmBlock};
use rustls::crypto::{CipherSuiteCommon, CryptoProvider, hmac};
use rustls::{SupportedCipherSuite, Tls13CipherSuite};

/// [`rustls::crypto::aws_lc_rs::default_provider`] with the TLS 1.3 suites' HKDF replaced by
/// [`HkdfUsingHmac`] over RustCrypto's HMAC (see the module documentation).
pub fn aws_lc_rs_keyed_once() -> CryptoProvider {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    for suite in &mut provider.cipher_suites {
        if let SupportedCipherSuite::Tls13(stock) = suite
            && let Some(mine) = tls13_suites()
                .iter()
                .find(|mine| mine.common.suite == stock.common.suite)
        {
            *suite = SupportedCipherSuite::Tls13(mine);
        }
    }
    provider
}

/// The stock TLS 1.3 suites, each with its HKDF on an HMAC of the suite's hash.
fn tls13_suites() -> &'static [Tls13CipherSuite] {
    static SUITES: OnceLock<Vec<Tls13CipherSuite>> = OnceLock::new();
    SUITES.get_or_init(|| {
        rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES
            .iter()
            .filter_map(|suite| match suite {
                SupportedCipherSuite::Tls13(stock) => Some(*stock),
                SupportedCipherSuite::Tls12(_) => None,
            })
            .filter_map(|stock| {
                let hkdf: &'static EarlySecretOnce = match stock.common.hash_provider.algorithm() {
                    rustls::crypto::hash::HashAlgorithm::SHA256 => &HKDF_SHA256,
                    rustls::crypto::hash::HashAlgorithm::SHA384 => &HKDF_SHA384,
                    // A suite on another hash keeps the stock HKDF (none in rustls today).
                    _ => return None,
                };
                Some(Tls13CipherSuite {
                    common: CipherSuiteCommon {
                        suite: stock.common.suite,
                        hash_provider: stock.common.hash_provider,
                        confidentiality_limit: stock.common.confidentiality_limit,
                    },
                    hkdf_provider: hkdf,
                    aead_alg: stock.aead_alg,
                    quic: stock.quic,
                })
            })
            .collect()
    })
}

static HKDF_SHA256: EarlySecretOnce = EarlySecretOnce {
    hkdf: HkdfUsingHmac(&KeyedOnce::Sha256),
    hmac: &KeyedOnce::Sha256,
    early_secret: OnceLock::new(),
};
static HKDF_SHA384: EarlySecretOnce = EarlySecretOnce {
    hkdf: HkdfUsingHmac(&KeyedOnce::Sha384),
    hmac: &KeyedOnce::Sha384,
    early_secret: OnceLock::new(),
};

/// [`HkdfUsingHmac`], except that the early secret of a handshake without a PSK,
/// HKDF-Extract(salt 0, IKM 0) (RFC 8446 §7.1), a constant of the hash, is computed once per
/// process rather than once per handshake (two HMAC keyings and a tag: four compressions).
struct EarlySecretOnce {
    hkdf: HkdfUsingHmac<'static>,
    hmac: &'static KeyedOnce,
    early_secret: OnceLock<OkmBlock>,
}

impl Hkdf for EarlySecretOnce {
    fn extract_from_zero_ikm(&self, salt: Option<&[u8]>) -> Box<dyn HkdfExpander> {
        if salt.is_some() {
            return self.hkdf.extract_from_zero_ikm(salt);
        }
        let early_secret = self.early_secret.get_or_init(|| {
            let zeroes = [0u8; OkmBlock::MAX_LEN];
            let zeroes = &zeroes[..hmac::Hmac::hash_output_len(self.hmac)];
            OkmBlock::new(
                hmac::Hmac::with_key(self.hmac, zeroes)
                    .sign(&[zeroes])
                    .as_ref(),
            )
        });
        self.hkdf.expander_for_okm(early_secret)
    }

    fn extract_from_secret(&self, salt: Option<&[u8]>, secret: &[u8]) -> Box<dyn HkdfExpander> {
        self.hkdf.extract_from_secret(salt, secret)
    }

    fn expander_for_okm(&self, okm: &OkmBlock) -> Box<dyn HkdfExpander> {
        self.hkdf.expander_for_okm(okm)
    }

    fn hmac_sign(&self, key: &OkmBlock, message: &[u8]) -> hmac::Tag {
        self.hkdf.hmac_sign(key, message)
    }

    fn fips(&self) -> bool {
        self.hkdf.fips()
    }
}

/// RustCrypto's HMAC-SHA-256 or -384 as a rustls [`hmac::Hmac`]: a key holds the inner and
/// outer hash states with the padded key absorbed, and every tag starts from a copy of them.
enum KeyedOnce {
    Sha256,
    Sha384,
}

enum KeyedMac {
    Sha256(::hmac::Hmac<sha2::Sha256>),
    Sha384(::hmac::Hmac<sha2::Sha384>),
}

impl hmac::Hmac for KeyedOnce {
    fn with_key(&self, key: &[u8]) -> Box<dyn hmac::Key> {
        // HMAC takes keys of any length (RFC 2104 hashes long ones): this cannot fail.
        const ANY_LENGTH: &str = "HMAC accepts keys of any length";
        Box::new(match self {
            KeyedOnce::Sha256 => KeyedMac::Sha256(Mac::new_from_slice(key).expect(ANY_LENGTH)),
            KeyedOnce::Sha384 => KeyedMac::Sha384(Mac::new_from_slice(key).expect(ANY_LENGTH)),
        })
    }

    fn hash_output_len(&self) -> usize {
        match self {
            KeyedOnce::Sha256 => 32,
            KeyedOnce::Sha384 => 48,
        }
    }

    fn fips(&self) -> bool {
        // Not a FIPS-validated implementation (nor is the aws-lc build rustls uses here).
        false
    }
}

fn sign<M: Mac + Clone>(keyed: &M, first: &[u8], middle: &[&[u8]], last: &[u8]) -> hmac::Tag {
    let mut mac = keyed.clone();
    mac.update(first);
    for part in middle {
        mac.update(part);
    }
    mac.update(last);
    hmac::Tag::new(&mac.finalize().into_bytes())
}

impl hmac::Key for KeyedMac {
    fn sign_concat(&self, first: &[u8], middle: &[&[u8]], last: &[u8]) -> hmac::Tag {
        match self {
            KeyedMac::Sha256(mac) => sign(mac, first, middle, last),
            KeyedMac::Sha384(mac) => sign(mac, first, middle, last),
        }
    }

    fn tag_len(&self) -> usize {
        match self {
            KeyedMac::Sha256(_) => 32,
            KeyedMac::Sha384(_) => 48,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every TLS 1.3 suite of the stock provider is replaced, and by one that derives exactly
    /// what the stock one derives: extract (with and without salt, from zeroes), expand to a
    /// block and to slices of several lengths (one and two HMAC blocks), expand from an OKM, and
    /// the finished-key HMAC.
    #[test]
    fn same_key_schedule_as_the_stock_provider() {
        let stock = rustls::crypto::aws_lc_rs::default_provider();
        let mine = aws_lc_rs_keyed_once();
        assert_eq!(stock.cipher_suites.len(), mine.cipher_suites.len());
        let mut compared = 0;
        for (stock, mine) in stock.cipher_suites.iter().zip(&mine.cipher_suites) {
            assert_eq!(stock.suite(), mine.suite());
            let (SupportedCipherSuite::Tls13(stock), SupportedCipherSuite::Tls13(mine)) =
                (stock, mine)
            else {
                continue;
            };
            assert!(
                !std::ptr::eq(*stock, *mine),
                "{:?} not replaced",
                stock.common.suite
            );
            let (a, b): (&dyn Hkdf, &dyn Hkdf) = (stock.hkdf_provider, mine.hkdf_provider);
            let salt = b"a salt of some length".as_slice();
            let secret = [7u8; 48];
            let info: [&[u8]; 3] = [b"\x00\x30", b"\x0dtls13 c hs traffic", b"\x20transcript"];
            for (x, y) in [
                (a.extract_from_zero_ikm(None), b.extract_from_zero_ikm(None)),
                (
                    a.extract_from_zero_ikm(Some(salt)),
                    b.extract_from_zero_ikm(Some(salt)),
                ),
                (
                    a.extract_from_secret(None, &secret),
                    b.extract_from_secret(None, &secret),
                ),
                (
                    a.extract_from_secret(Some(salt), &secret),
                    b.extract_from_secret(Some(salt), &secret),
                ),
            ] {
                let (block_x, block_y) = (x.expand_block(&info), y.expand_block(&info));
                assert_eq!(block_x.as_ref(), block_y.as_ref());
                for len in [12, 16, 32, 48, 80, 100] {
                    let (mut out_x, mut out_y) = (vec![0; len], vec![1; len]);
                    x.expand_slice(&info, &mut out_x).unwrap();
                    y.expand_slice(&info, &mut out_y).unwrap();
                    assert_eq!(out_x, out_y, "{len} bytes");
                }
                let okm = OkmBlock::new(block_x.as_ref());
                let (from_x, from_y) = (a.expander_for_okm(&okm), b.expander_for_okm(&okm));
                assert_eq!(
                    from_x.expand_block(&info).as_ref(),
                    from_y.expand_block(&info).as_ref()
                );
                assert_eq!(
                    a.hmac_sign(&okm, b"handshake hash").as_ref(),
                    b.hmac_sign(&okm, b"handshake hash").as_ref()
                );
            }
            // The early secret again: the second time from the cache.
            assert_eq!(
                a.extract_from_zero_ikm(None).expand_block(&info).as_ref(),
                b.extract_from_zero_ikm(None).expand_block(&info).as_ref()
            );
            assert_eq!(a.fips(), b.fips());
            compared += 1;
        }
        assert_eq!(compared, 3, "the three TLS 1.3 suites of aws-lc-rs");
    }
}
