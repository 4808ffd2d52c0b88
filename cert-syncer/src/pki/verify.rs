//! Whether certificates chain: to a set of CAs ([`chains_to`], [`issued_by`]) and, for a target,
//! for its [`Identity`] ([`verify_chain`]). The chain check of a target (`verify_chain`) and the names it is checked for: what decides
//! `ChainBroken`, and what must never (a bundle CA webpki cannot parse, a wildcard, an error of
//! the verifier itself).

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::parse::{Cert, KeyPairPem};

/// What a leaf certificate is for: serving some hostnames, or a client's user and groups. The
/// identity a leaf is issued for (`pki::issue`) and verified for (`verify_chain`); each
/// target of the rotation config has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A serving certificate for these names (DNS names and IP addresses), sorted, deduplicated.
    Serving { hostnames: Vec<String> },
    /// A client certificate: subject CN = user, O = groups (sorted, deduplicated).
    Client { user: String, groups: Vec<String> },
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

/// Whether `leaf` chains to one of `roots` and is valid at `now`, for its identity's usage.
///
/// `Err` means the certificate's own chain is wrong: no path to a CA of the bundle, a bad
/// signature, an expired or not-yet-valid link, a usage the CA does not allow. Nothing else is:
///
/// - a bundle CA webpki cannot take as a trust anchor (an issuerUniqueID or subjectUniqueID, a
///   certificate over 64 KiB: legal, and accepted by OpenSSL and Go) is skipped and logged
///   once; a leaf whose issuer is such a CA is judged by the issuer's signature and validity
///   alone (a new leaf from the same signer would be no better);
/// - a serving identity is verified for a concrete name it covers ([`reference_name`]), never
///   for a wildcard (which `ServerName` refuses);
/// - an error of the verifier itself (not of the certificate) is logged and decides nothing:
///   regenerating cannot fix it, and judging by it would rewrite the target on every pass.
pub fn verify_chain(
    leaf: &KeyPairPem,
    roots: &[Cert],
    identity: &Identity,
    now: i64,
) -> Result<(), String> {
    let mut store = RootCertStore::empty();
    let mut unusable: Vec<&Cert> = Vec::new();
    for root in roots {
        if let Err(err) = store.add(root.der.clone()) {
            log_unusable_anchor(root, &err.to_string());
            unusable.push(root);
        }
    }
    if store.is_empty() {
        return issued_by_unusable(leaf, &unusable, now)
            .ok_or_else(|| "no usable CA of the bundle issued it".to_owned())?;
    }
    let store = Arc::new(store);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let end_entity = &leaf.chain[0].der;
    let intermediates = &leaf.chain[1..]
        .iter()
        .map(|c| c.der.clone())
        .collect::<Vec<_>>();
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.max(0) as u64));
    let result = match identity {
        Identity::Serving { hostnames } => {
            let name = match reference_name(hostnames) {
                Ok(name) => name,
                Err(err) => return verifier_error(&err),
            };
            match WebPkiServerVerifier::builder_with_provider(store, provider).build() {
                Ok(verifier) => verifier
                    .verify_server_cert(end_entity, intermediates, &name, &[], at)
                    .map(|_| ()),
                Err(err) => return verifier_error(&err.to_string()),
            }
        }
        Identity::Client { .. } => {
            match WebPkiClientVerifier::builder_with_provider(store, provider).build() {
                Ok(verifier) => verifier
                    .verify_client_cert(end_entity, intermediates, at)
                    .map(|_| ()),
                Err(err) => return verifier_error(&err.to_string()),
            }
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err(err @ rustls::Error::InvalidCertificate(_)) => {
            issued_by_unusable(leaf, &unusable, now).unwrap_or(Err(err.to_string()))
        }
        Err(other) => verifier_error(&other.to_string()),
    }
}

/// The verdict for a chain that leads to a bundle CA webpki cannot parse (`None`: it leads
/// to none of them): each link's signature and validity, and the CA's.
fn issued_by_unusable(
    leaf: &KeyPairPem,
    unusable: &[&Cert],
    now: i64,
) -> Option<Result<(), String>> {
    let valid = |c: &Cert| c.not_before <= now && now < c.not_after;
    leaf.chain.iter().enumerate().find_map(|(i, cert)| {
        let ca = unusable.iter().find(|ca| issued_by(cert, ca))?;
        let links = leaf.chain[..=i]
            .windows(2)
            .all(|pair| issued_by(&pair[0], &pair[1]));
        Some(if !links {
            Err("a certificate of the chain is not signed by the next".to_owned())
        } else if !(leaf.chain[..=i].iter().all(valid) && valid(ca)) {
            Err(format!(
                "a certificate of the chain or its CA {} is not valid now",
                ca.common_name.as_deref().unwrap_or("(no CN)")
            ))
        } else {
            Ok(())
        })
    })
}

/// An error of the verifier, not of the certificate: logged, and no reason to regenerate.
fn verifier_error(err: &str) -> Result<(), String> {
    tracing::warn!(error = %err, "the chain check itself failed; the certificate is kept");
    Ok(())
}

/// Logs a bundle CA that cannot be a trust anchor, once per certificate per process.
fn log_unusable_anchor(ca: &Cert, why: &str) {
    static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let fingerprint = ca.info.sha256.clone();
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.contains(&fingerprint) {
        logged.push(fingerprint);
        tracing::warn!(ca = ca.common_name.as_deref().unwrap_or("(no CN)"), serial = %ca.serial, error = %why, "a bundle CA cannot be a trust anchor for webpki; skipped in chain checks");
    }
}

/// A concrete name a serving certificate for `hostnames` must be valid for: the first name
/// that is not a wildcard, else the first wildcard with its `*` label replaced by a label it
/// covers. `ServerName` (rightly) refuses a wildcard as a reference name.
pub fn reference_name(hostnames: &[String]) -> Result<ServerName<'static>, String> {
    let chosen = hostnames
        .iter()
        .find(|h| !h.contains('*'))
        .cloned()
        .or_else(|| {
            hostnames
                .first()
                .and_then(|h| h.strip_prefix("*."))
                .map(|rest| format!("wildcard-check.{rest}"))
        })
        .ok_or_else(|| "no hostname to verify a serving certificate for".to_owned())?;
    ServerName::try_from(chosen.clone()).map_err(|err| format!("{chosen}: {err}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    use super::*;
    use crate::pki::{self, KeyType, check_serving_names, parse_certs};

    const DAY: u64 = 86_400;

    fn now() -> i64 {
        crate::base::time::unix_now()
    }

    fn cert_of(pem: &str) -> Cert {
        Cert::from_der(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()).unwrap()
    }

    fn serving(names: &[&str]) -> Identity {
        Identity::Serving {
            hostnames: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    fn signer() -> KeyPairPem {
        pki::new_signer(
            "ns_signer@1",
            now(),
            Duration::from_secs(60),
            Duration::from_secs(100 * DAY),
        )
        .unwrap()
    }

    fn leaf(signer: &KeyPairPem, identity: &Identity) -> KeyPairPem {
        pki::new_leaf(
            signer,
            identity,
            now(),
            Duration::from_secs(60),
            Duration::from_secs(30 * DAY),
        )
        .unwrap()
    }

    #[test]
    fn bundle_cas_webpki_cannot_take_as_anchors_are_skipped_not_a_broken_chain() {
        let unique_id =
            cert_of(&testkit::pki::Ca::with_subject_unique_id("foreign uid ca").cert_pem);
        let oversized = cert_of(&testkit::pki::Ca::oversized("foreign big ca").cert_pem);
        assert!(unique_id.is_ca && oversized.is_ca);
        assert!(oversized.der.len() > 65_536);
        for odd in [&unique_id, &oversized] {
            assert!(
                RootCertStore::empty().add(odd.der.clone()).is_err(),
                "webpki refuses it"
            );
        }
        let signer = signer();
        for identity in [
            serving(&["localhost"]),
            Identity::Client {
                user: "u".into(),
                groups: vec![],
            },
        ] {
            let leaf = leaf(&signer, &identity);
            let roots = [unique_id.clone(), signer.cert().clone(), oversized.clone()];
            assert_eq!(verify_chain(&leaf, &roots, &identity, now()), Ok(()));
            // Only odd CAs and not ours: no path, a broken chain.
            let strangers = [unique_id.clone(), oversized.clone()];
            assert!(verify_chain(&leaf, &strangers, &identity, now()).is_err());
        }
    }

    #[test]
    fn a_leaf_of_a_signer_webpki_cannot_parse_is_judged_by_signature_and_validity() {
        let ca = testkit::pki::Ca::with_subject_unique_id("uid signer");
        // (`KeyPairPem::parse` refuses it: rustls checks the key against the certificate with
        // webpki. A leaf it issued can still be in a target, from someone else.)
        let signer = KeyPairPem {
            chain: vec![cert_of(&ca.cert_pem)],
            key_pem: ca.key_pem(),
        };
        let identity = serving(&["localhost"]);
        let mut leaf = leaf(&signer, &identity);
        leaf.chain.push(signer.cert().clone());
        assert_eq!(
            verify_chain(&leaf, &[signer.cert().clone()], &identity, now()),
            Ok(())
        );
        // Past the leaf's notAfter: broken.
        assert!(
            verify_chain(
                &leaf,
                &[signer.cert().clone()],
                &identity,
                now() + 40 * DAY as i64
            )
            .is_err()
        );
        // Another CA with the same name does not vouch for it.
        let twin = testkit::pki::Ca::with_subject_unique_id("uid signer");
        assert!(verify_chain(&leaf, &[cert_of(&twin.cert_pem)], &identity, now()).is_err());
    }

    #[test]
    fn wildcard_serving_certificates_are_verified_for_a_name_they_cover() {
        let signer = signer();
        for names in [
            &["*.apps.example.com", "apps.example.com"][..],
            &["*.apps.example.com"],
            &["*.apps.example.com", "2001:db8::1"],
        ] {
            let identity = serving(names);
            let leaf = leaf(&signer, &identity);
            assert_eq!(
                verify_chain(&leaf, &[signer.cert().clone()], &identity, now()),
                Ok(()),
                "{names:?}"
            );
        }
        assert_eq!(
            reference_name(&["*.apps.example.com".into()])
                .unwrap()
                .to_str(),
            "wildcard-check.apps.example.com"
        );
        assert_eq!(
            reference_name(&["*.a.example".into(), "b.example".into()])
                .unwrap()
                .to_str(),
            "b.example"
        );
    }

    #[test]
    fn serving_names_are_checked_the_way_certificates_carry_them() {
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        for good in [
            &["localhost", "127.0.0.1"][..],
            &["*.apps.example.com", "apps.example.com"],
            &["2001:db8::1"],
            &["::ffff:10.0.0.1"],
            &["kubernetes.default.svc.cluster.local"],
        ] {
            let mut sorted = names(good);
            sorted.sort();
            assert_eq!(check_serving_names(&sorted), Ok(()), "{good:?}");
        }
        // Not as the certificate reads back (a non-canonical IP), or refused by a verifier.
        for bad in [
            &["2001:0db8::1"][..],
            &["a*.example.com"],
            &["api.*.example.com"],
            &["*"],
        ] {
            assert!(check_serving_names(&names(bad)).is_err(), "{bad:?}");
        }
    }

    /// rcgen keeps one value per attribute type; Kubernetes reads one group per O.
    #[test]
    fn a_client_certificate_carries_every_group_and_still_chains() {
        let signer = signer();
        for key_type in [KeyType::EcdsaP256, KeyType::Rsa2048] {
            let rsa_signer = pki::new_signer_of(
                key_type,
                "ns_signer@1",
                now(),
                Duration::from_secs(60),
                Duration::from_secs(100 * DAY),
            )
            .unwrap();
            for issuer in [&signer, &rsa_signer] {
                let identity = Identity::Client {
                    user: "system:admin".into(),
                    groups: vec!["a".into(), "system:masters".into(), "z".into()],
                };
                let leaf = pki::new_leaf_of(
                    key_type,
                    issuer,
                    &identity,
                    now(),
                    Duration::from_secs(60),
                    Duration::from_secs(DAY),
                )
                .unwrap();
                assert_eq!(leaf.cert().organizations, ["a", "system:masters", "z"]);
                assert_eq!(leaf.cert().common_name.as_deref(), Some("system:admin"));
                assert_eq!(
                    verify_chain(&leaf, &[issuer.cert().clone()], &identity, now()),
                    Ok(())
                );
                assert!(issued_by(leaf.cert(), issuer.cert()));
            }
        }
    }

    /// OpenSSL's `ecparam -genkey` writes `EC PARAMETERS` before the key: the key the check
    /// selects is the one that signs.
    #[test]
    fn a_signer_key_after_an_ec_parameters_block_signs() {
        let signer = signer();
        let key_pem = format!(
            "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}",
            signer.key_pem
        );
        let parsed = KeyPairPem::parse(signer.cert_pem().as_bytes(), key_pem.as_bytes()).unwrap();
        let leaf = leaf(&parsed, &serving(&["localhost"]));
        assert!(issued_by(leaf.cert(), signer.cert()));
        assert_eq!(parse_certs(leaf.cert_pem().as_bytes()).unwrap().len(), 1);
    }
}
