//! May-replace rules: whether newly read material may replace what is in use. One module for
//! both sides, so a [`ServingSet`](crate::ServingSet) and a [`ClientTls`](crate::ClientTls)
//! apply the same rules to a certificate chain, and the server applies them to its CA bundle's
//! CRLs.
//!
//! The rules only ever refuse; they never weaken what the parser already checked. At start-up
//! (nothing in use) they accept whatever parses, since nothing better exists; the caller logs a
//! warning for material that is not valid now.

use std::path::Path;

use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{Error, InvalidMaterial, Result};
use crate::material::{CertInfo, CrlInfo, ParsedBundle, Validity, rfc3339};

/// A chain valid over `new` may replace one valid over `current` unless the current one is
/// valid now and the new one is not (expired, or not valid yet: clients would fail with
/// `CertificateExpired` / `NotValidYet`). Validity is the chain's: the leaf's and every
/// intermediate's.
pub(crate) fn may_replace_chain(
    path: &Path,
    new: Validity,
    current: Option<Validity>,
    now: i64,
) -> Result<()> {
    let Some(current) = current else {
        return Ok(());
    };
    if !current.is_valid_at(now) {
        return Ok(());
    }
    if new.is_expired_at(now) {
        return Err(Error::invalid(
            path,
            InvalidMaterial::Expired {
                not_after: rfc3339(new.not_after),
            },
        ));
    }
    if new.is_not_yet_valid_at(now) {
        return Err(Error::invalid(
            path,
            InvalidMaterial::NotYetValid {
                not_before: rfc3339(new.not_before),
            },
        ));
    }
    Ok(())
}

/// A chain that is shorter than the one in use, and lacks the certificate that issued its last
/// certificate while the one in use has it, is what a reader sees in the middle of an in-place
/// write (leaf written, intermediate not yet). It is refused the first time; the caller accepts
/// the same bytes when a later pass reads them again (`stable`), so a deliberately shorter chain
/// still goes through.
pub(crate) fn may_shorten_chain(
    path: &Path,
    new: &[CertificateDer<'_>],
    current: &[CertificateDer<'_>],
    stable: bool,
) -> Result<()> {
    if stable || new.len() >= current.len() {
        return Ok(());
    }
    let Some(Ok(last)) = new.last().map(|der| CertInfo::from_der(der)) else {
        return Ok(());
    };
    if last.issuer_raw == last.subject_raw {
        return Ok(());
    }
    let missing = current
        .iter()
        .filter_map(|der| CertInfo::from_der(der).ok())
        .find(|info| info.subject_raw == last.issuer_raw);
    match missing {
        Some(issuer) => Err(Error::invalid(
            path,
            InvalidMaterial::ChainShortened {
                missing_issuer: issuer.subject,
            },
        )),
        None => Ok(()),
    }
}

/// Every CRL must be issued by a CA of the bundle (its issuer name is the CA's subject and the
/// CA's key verifies its signature): rustls refuses every client of an issuer whose CRL it cannot
/// use, so a CRL from an unrelated CA would lock clients out, and a forged one would too. A CRL
/// of an intermediate CA therefore needs that intermediate in the bundle. Records in each
/// [`CrlInfo`] the key of the CA that verified it (which CA's series the CRL belongs to).
pub(crate) fn crls_issued_by_bundle(bundle: &mut ParsedBundle) -> Result<()> {
    let ParsedBundle {
        certs,
        crls,
        crl_infos,
        ..
    } = bundle;
    let cas: Vec<X509Certificate<'_>> = certs
        .iter()
        .filter_map(|der| X509Certificate::from_der(der).ok().map(|(_, cert)| cert))
        .collect();
    for (crl, info) in crls.iter().zip(crl_infos.iter_mut()) {
        let parsed = x509_parser::parse_x509_crl(crl).map(|(_, crl)| crl);
        let signer = parsed.ok().and_then(|crl| {
            cas.iter().find(|ca| {
                ca.subject().as_raw() == info.issuer_raw
                    && crl.verify_signature(ca.public_key()).is_ok()
            })
        });
        match signer {
            Some(ca) => info.signer_spki = Some(ca.public_key().raw.to_vec()),
            None => {
                return Err(Error::invalid(
                    &info.path,
                    InvalidMaterial::CrlIssuerUnknown {
                        index: info.index,
                        issuer: info.issuer.clone(),
                    },
                ));
            }
        }
    }
    Ok(())
}

/// Whether the CRLs of a reload may replace the CRLs in force. Revocation must never be undone
/// by a reload (fail closed):
///
/// - A stale CRL (past its nextUpdate) may not replace CRLs that are all fresh. Stale CRLs are
///   accepted at start-up and in place of stale ones (nothing better exists); rustls does not
///   enforce nextUpdate at the handshake, so an outdated CRL keeps revoking what it lists.
/// - A CA's CRL may not be replaced by an older one of the same CA: a lower cRLNumber, or, when
///   either lacks the number, an earlier thisUpdate. An old but unexpired CRL replayed over a
///   newer one would un-revoke every certificate revoked in between.
/// - A CA's CRL may not disappear while that CA (same name and key) stays in the bundle. To stop
///   checking a CA's revocations, remove the CA, or restart the process.
///
/// Only the CRL rustls uses for an issuer is compared: the first one of the bundle with that
/// issuer name (webpki takes the first authoritative CRL). A CA re-keyed under the same name
/// starts a new series, whose numbers are not compared with the old key's.
pub(crate) fn may_replace_crls(
    new: &ParsedBundle,
    current: Option<&ParsedBundle>,
    now: i64,
) -> Result<()> {
    let Some(current) = current else {
        return Ok(());
    };
    no_stale_over_fresh(new, current, now)?;
    for served in in_force(current) {
        match in_force(new).find(|crl| crl.issuer_raw == served.issuer_raw) {
            Some(crl) if crl.signer_spki == served.signer_spki && is_older(crl, served) => {
                return Err(Error::invalid(
                    &crl.path,
                    InvalidMaterial::CrlOlder {
                        index: crl.index,
                        issuer: crl.issuer.clone(),
                        position: crl.position(),
                        served: served.position(),
                    },
                ));
            }
            // Not older, or another key under the same name (a new series).
            Some(_) => {}
            None if still_trusted(new, served) => {
                return Err(Error::invalid(
                    &served.path,
                    InvalidMaterial::CrlDropped {
                        issuer: served.issuer.clone(),
                        served: served.position(),
                    },
                ));
            }
            // The CA left the bundle: nothing of it is trusted any more.
            None => {}
        }
    }
    Ok(())
}

fn no_stale_over_fresh(new: &ParsedBundle, current: &ParsedBundle, now: i64) -> Result<()> {
    let stale = |next_update: Option<i64>| next_update.is_some_and(|t| t < now);
    if current.crl_infos.iter().any(|info| stale(info.next_update)) {
        return Ok(());
    }
    match new.crl_infos.iter().find(|info| stale(info.next_update)) {
        Some(info) => Err(Error::invalid(
            &info.path,
            InvalidMaterial::CrlStale {
                index: info.index,
                next_update: rfc3339(info.next_update.unwrap_or_default()),
            },
        )),
        None => Ok(()),
    }
}

/// The CRL rustls checks each issuer's certificates with: the first of the bundle with that
/// issuer name.
fn in_force(bundle: &ParsedBundle) -> impl Iterator<Item = &CrlInfo> {
    bundle.crl_infos.iter().enumerate().filter_map(|(i, info)| {
        let first = !bundle.crl_infos[..i]
            .iter()
            .any(|earlier| earlier.issuer_raw == info.issuer_raw);
        first.then_some(info)
    })
}

/// `new` comes before `served` in their CA's series: a lower cRLNumber when both have one, else
/// an earlier thisUpdate.
fn is_older(new: &CrlInfo, served: &CrlInfo) -> bool {
    match (&new.number, &served.number) {
        (Some(new), Some(served)) => new < served,
        _ => new.this_update < served.this_update,
    }
}

/// The CA that issued `served` (same name, same key) is in `bundle`.
fn still_trusted(bundle: &ParsedBundle, served: &CrlInfo) -> bool {
    bundle.certs.iter().any(|der| {
        X509Certificate::from_der(der).is_ok_and(|(_, ca)| {
            ca.subject().as_raw() == served.issuer_raw
                && served
                    .signer_spki
                    .as_deref()
                    .is_none_or(|spki| spki == ca.public_key().raw)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::num_bigint::BigUint;

    fn crl(number: Option<u32>, this_update: i64, signer: &[u8]) -> CrlInfo {
        CrlInfo {
            path: "client-ca.crl".into(),
            index: 0,
            issuer: "CN=client-ca".to_owned(),
            issuer_raw: b"client-ca".to_vec(),
            this_update,
            next_update: None,
            number: number.map(BigUint::from),
            signer_spki: Some(signer.to_vec()),
        }
    }

    fn bundle(crl_infos: Vec<CrlInfo>) -> ParsedBundle {
        ParsedBundle {
            certs: Vec::new(),
            infos: Vec::new(),
            crls: Vec::new(),
            crl_infos,
        }
    }

    fn replaces(new: CrlInfo, served: CrlInfo) -> Result<()> {
        may_replace_crls(&bundle(vec![new]), Some(&bundle(vec![served])), 0)
    }

    // CRLs made without a cRLNumber (rcgen always writes one, so the API tests cannot).
    #[test]
    fn without_numbers_an_earlier_this_update_is_older() {
        let err = replaces(crl(None, 100, b"k"), crl(None, 200, b"k")).unwrap_err();
        assert!(
            matches!(err.invalid_material(), Some(InvalidMaterial::CrlOlder { position, served, .. })
                if position.starts_with("thisUpdate") && served.starts_with("thisUpdate")),
            "{err}"
        );
        replaces(crl(None, 200, b"k"), crl(None, 200, b"k")).unwrap();
        replaces(crl(None, 300, b"k"), crl(None, 200, b"k")).unwrap();
        // One side numbered, the other not: thisUpdate decides.
        assert!(replaces(crl(Some(9), 100, b"k"), crl(None, 200, b"k")).is_err());
        replaces(crl(None, 300, b"k"), crl(Some(9), 200, b"k")).unwrap();
    }

    #[test]
    fn numbers_decide_over_this_update_and_a_re_keyed_ca_starts_a_new_series() {
        // A lower number is older even with a later thisUpdate (the issuer's clock).
        assert!(replaces(crl(Some(4), 300, b"k"), crl(Some(5), 200, b"k")).is_err());
        replaces(crl(Some(6), 100, b"k"), crl(Some(5), 200, b"k")).unwrap();
        // The same name under another key: its numbers are its own.
        replaces(crl(Some(1), 100, b"new key"), crl(Some(5), 200, b"k")).unwrap();
    }
}
