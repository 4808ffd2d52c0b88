//! May-replace rules: whether newly read material may replace what is in use. One module for
//! both sides, so a [`ServingSet`](crate::ServingSet) and a [`ClientTls`](crate::ClientTls)
//! apply the same rules to a certificate chain, and the server applies them to its CA bundle's
//! CRLs ([`crls`], with the history of every CRL series accepted).
//!
//! The rules only ever refuse; they never weaken what the parser already checked. At start-up
//! (nothing in use) they accept whatever parses, since nothing better exists; the caller logs a
//! warning for material that is not valid now.

mod crls;

pub(crate) use crls::{CrlHistory, crls_issued_by_bundle, may_replace_crls};

use std::path::Path;

use rustls_pki_types::CertificateDer;

use crate::error::{Error, InvalidMaterial, Result};
use crate::material::{CertInfo, Validity, rfc3339};

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
