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
use crate::material::{CertInfo, ParsedBundle, Validity, rfc3339};

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
/// of an intermediate CA therefore needs that intermediate in the bundle.
pub(crate) fn crls_issued_by_bundle(bundle: &ParsedBundle) -> Result<()> {
    let cas: Vec<X509Certificate<'_>> = bundle
        .certs
        .iter()
        .filter_map(|der| X509Certificate::from_der(der).ok().map(|(_, cert)| cert))
        .collect();
    for (crl, info) in bundle.crls.iter().zip(&bundle.crl_infos) {
        let parsed = x509_parser::parse_x509_crl(crl).map(|(_, crl)| crl);
        let issued = parsed.is_ok_and(|crl| {
            cas.iter().any(|ca| {
                ca.subject().as_raw() == info.issuer_raw
                    && crl.verify_signature(ca.public_key()).is_ok()
            })
        });
        if !issued {
            return Err(Error::invalid(
                &info.path,
                InvalidMaterial::CrlIssuerUnknown {
                    index: info.index,
                    issuer: info.issuer.clone(),
                },
            ));
        }
    }
    Ok(())
}

/// A stale CRL (past its nextUpdate) may not replace CRLs that are all fresh: an old CRL
/// replayed over a newer one would un-revoke certificates. Stale CRLs are accepted at start-up
/// and in place of stale ones (nothing better exists); rustls does not enforce nextUpdate at the
/// handshake, so an outdated CRL keeps revoking what it lists.
pub(crate) fn may_replace_crls(
    new: &ParsedBundle,
    current: Option<&ParsedBundle>,
    now: i64,
) -> Result<()> {
    let Some(current) = current else {
        return Ok(());
    };
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
