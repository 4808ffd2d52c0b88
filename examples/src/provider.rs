//! rustls' aws-lc-rs `CryptoProvider` with one change: the TLS 1.3 key schedule's HKDF keys each
//! HMAC once per secret instead of once per label.
//!
//! A TLS 1.3 handshake derives some 20 values from a handful of secrets (traffic secrets, their
//! key and IV, finished keys, the next stage's salt), each one HKDF-Expand-Label = one HMAC keyed
//! with the secret. rustls' aws-lc-rs HKDF hands every expansion to aws-lc's `HKDF_expand`, which
//! keys a fresh HMAC each time: two extra hash compressions (the padded key's inner and outer
//! block) per label. rustls' own [`HkdfUsingHmac`] keys the HMAC once per secret (an aws-lc
//! `HMAC_CTX` with both pads absorbed) and copies that state for every label. Same algorithm, same
//! suites, same outputs (RFC 5869 and RFC 8446 §7.1, checked against the stock provider in the
//! tests below); about a third fewer SHA-384 compressions per full handshake.
//!
//! Everything else — key exchange, signatures, AEADs, the transcript hash, TLS 1.2, the
//! FIPS status — is the stock provider's.

use std::sync::OnceLock;

use rustls::crypto::tls13::HkdfUsingHmac;
use rustls::crypto::{CipherSuiteCommon, CryptoProvider, hmac};
use rustls::{SupportedCipherSuite, Tls13CipherSuite};

/// [`rustls::crypto::aws_lc_rs::default_provider`] with the TLS 1.3 suites' HKDF replaced by
/// [`HkdfUsingHmac`] over aws-lc's HMAC (see the module documentation).
pub fn aws_lc_rs_keyed_once() -> CryptoProvider {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    for suite in &mut provider.cipher_suites {
        if let SupportedCipherSuite::Tls13(stock) = suite {
            if let Some(mine) = tls13_suites()
                .iter()
                .find(|mine| mine.common.suite == stock.common.suite)
            {
                *suite = SupportedCipherSuite::Tls13(mine);
            }
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
                let hkdf: &'static HkdfUsingHmac<'static> =
                    match stock.common.hash_provider.algorithm() {
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

static HKDF_SHA256: HkdfUsingHmac<'static> = HkdfUsingHmac(&HMAC_SHA256);
static HKDF_SHA384: HkdfUsingHmac<'static> = HkdfUsingHmac(&HMAC_SHA384);
static HMAC_SHA256: AwsLcHmac = AwsLcHmac(aws_lc_rs::hmac::HMAC_SHA256);
static HMAC_SHA384: AwsLcHmac = AwsLcHmac(aws_lc_rs::hmac::HMAC_SHA384);

/// aws-lc's HMAC as a rustls [`hmac::Hmac`] (what rustls' aws-lc-rs provider has inside but does
/// not export).
struct AwsLcHmac(aws_lc_rs::hmac::Algorithm);

impl hmac::Hmac for AwsLcHmac {
    fn with_key(&self, key: &[u8]) -> Box<dyn hmac::Key> {
        // `hmac::Key::new` absorbs the padded key into the inner and outer hash states once;
        // every `sign_concat` below starts from a copy of them.
        Box::new(AwsLcHmacKey(aws_lc_rs::hmac::Key::new(self.0, key)))
    }

    fn hash_output_len(&self) -> usize {
        self.0.digest_algorithm().output_len()
    }

    fn fips(&self) -> bool {
        // As rustls' aws-lc-rs provider answers for its own HMAC.
        aws_lc_rs::try_fips_mode().is_ok()
    }
}

struct AwsLcHmacKey(aws_lc_rs::hmac::Key);

impl hmac::Key for AwsLcHmacKey {
    fn sign_concat(&self, first: &[u8], middle: &[&[u8]], last: &[u8]) -> hmac::Tag {
        let mut context = aws_lc_rs::hmac::Context::with_key(&self.0);
        context.update(first);
        for part in middle {
            context.update(part);
        }
        context.update(last);
        hmac::Tag::new(context.sign().as_ref())
    }

    fn tag_len(&self) -> usize {
        self.0.algorithm().digest_algorithm().output_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::tls13::{Hkdf, OkmBlock};

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
                !std::ptr::eq(stock, *mine),
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
            assert_eq!(a.fips(), b.fips());
            compared += 1;
        }
        assert_eq!(compared, 3, "the three TLS 1.3 suites of aws-lc-rs");
    }
}
