//! The CRL rules of a client-CA bundle: who may issue a CRL, and what a reload may do to the
//! CRLs in force. Revocation must never be undone by a reload (fail closed), whatever the
//! files went through in between: a CA removed and re-added, CRLs reordered, one CRL of a
//! partitioned set replayed. So the rules compare a new bundle with the [`CrlHistory`] of every
//! CRL series this process accepted, not only with the bundle in force.
//!
//! A *series* is what RFC 5280 numbers: the CRLs of one issuer (name and key: a CA re-keyed under
//! the same name starts a new series) and one scope (the issuingDistributionPoint extension, or
//! none: all of the issuer's certificates). rustls (webpki) checks a certificate against the
//! first CRL of its issuer whose scope covers it, so within a bundle the first CRL of each series
//! is the one in force, and the first CRL of an issuer leads: every certificate of that issuer
//! without a CRL distribution point is checked against it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use sha2::{Digest as _, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{Error, InvalidMaterial, Result};
use crate::material::{CrlInfo, ParsedBundle, Position, rfc3339};

/// How many series no longer in the bundle the history remembers (the least recently seen go
/// first). Each takes about 250 bytes (three SHA-256 digests, the cRLNumber of at most 20 octets
/// as the RFC allows, thisUpdate, the CRL file's path, the map's own overhead), so about 250 KiB
/// at most, plus the series in force, which are never forgotten.
pub(crate) const CRL_HISTORY_BOUND: usize = 1024;

/// Every CRL must be issued by a CA of the bundle (its issuer name is the CA's subject and
/// the CA's key verifies its signature): rustls refuses every client of an issuer whose CRL it
/// cannot use, so a CRL from an unrelated CA would lock clients out, and a forged one would too.
/// A CRL of an intermediate CA therefore needs that intermediate in the bundle. Records in each
/// [`CrlInfo`] the key of the CA that verified it (which series the CRL belongs to).
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

/// Whether the CRLs of a reload may replace the CRLs in force (`current`), given every series
/// accepted so far (`history`):
///
/// - A stale CRL (past its nextUpdate) may not replace CRLs that are all fresh. Stale CRLs are
///   accepted at start-up and in place of stale ones (nothing better exists); rustls does not
///   enforce nextUpdate at the handshake, so an outdated CRL keeps revoking what it lists.
/// - No series may go back: the CRL in force of each series (its first in the bundle) may not be
///   older than the newest of that series accepted so far: a lower cRLNumber, or, when either
///   lacks the number, an earlier thisUpdate. Every series is compared, the partitioned CRLs of
///   an issuer as much as its first, and the history outlives the CA's absence from the bundle.
/// - No series may disappear while its CA (same name and key) is in the bundle: neither a CA's
///   CRL nor one of its partitions, nor a CA that had CRLs coming back without them. Once a CA's
///   revocations are checked, they stay checked until the process restarts.
/// - The series that led its issuer (came first) keeps leading while it is in the bundle: a CRL
///   of another series put before it would take over the certificates without a CRL
///   distribution point, and un-revoke those it lists.
///
/// Not checked: the order of an issuer's series after the first. Two partitioned CRLs whose
/// issuing distribution points share a URI would let the earlier one hide the later one's
/// revocations for that URI's certificates; give each partition its own URI.
pub(crate) fn may_replace_crls(
    new: &ParsedBundle,
    current: Option<&ParsedBundle>,
    history: &CrlHistory,
    now: i64,
) -> Result<()> {
    if let Some(current) = current {
        no_stale_over_fresh(new, current, now)?;
    }
    let in_force = in_force(new);
    let mut leading: HashSet<IssuerKey> = HashSet::new();
    for crl in &in_force {
        let key = SeriesKey::of(crl);
        let known = history.series.get(&key);
        if let Some(seen) = known
            && crl.position().is_older_than(&seen.position)
        {
            return Err(Error::invalid(
                &crl.path,
                InvalidMaterial::CrlOlder {
                    index: crl.index,
                    issuer: crl.issuer.clone(),
                    position: crl.position().to_string(),
                    served: seen.position.to_string(),
                },
            ));
        }
        if leading.insert(key.issuer) && !known.is_some_and(|seen| seen.lead) {
            // This CRL leads its issuer now: refused if the series that led is still here.
            let led = in_force.iter().find(|other| {
                let other = SeriesKey::of(other);
                other.issuer == key.issuer
                    && history.series.get(&other).is_some_and(|seen| seen.lead)
            });
            if let Some(led) = led {
                return Err(Error::invalid(
                    &crl.path,
                    InvalidMaterial::CrlReordered {
                        index: crl.index,
                        issuer: crl.issuer.clone(),
                        position: crl.position().to_string(),
                        served: led.position().to_string(),
                    },
                ));
            }
        }
    }
    no_series_dropped(new, &in_force, history)
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

/// Every series the history knows for a CA of `new` is in force in `new`.
fn no_series_dropped(
    new: &ParsedBundle,
    in_force: &[&CrlInfo],
    history: &CrlHistory,
) -> Result<()> {
    let present: HashSet<SeriesKey> = in_force.iter().map(|crl| SeriesKey::of(crl)).collect();
    let cas: HashMap<CaKey, String> = new
        .certs
        .iter()
        .filter_map(|der| X509Certificate::from_der(der).ok())
        .map(|(_, ca)| {
            let key = CaKey::of(ca.subject().as_raw(), ca.public_key().raw);
            (key, ca.subject().to_string())
        })
        .collect();
    let dropped = history
        .series
        .iter()
        .filter(|(key, _)| !present.contains(key))
        .find_map(|(key, seen)| cas.get(&key.ca).map(|issuer| (issuer, seen)));
    match dropped {
        Some((issuer, seen)) => Err(Error::invalid(
            &seen.path,
            InvalidMaterial::CrlDropped {
                issuer: issuer.clone(),
                served: seen.position.to_string(),
            },
        )),
        None => Ok(()),
    }
}

/// The CRL in force of each series of `bundle` (its first), in bundle order.
fn in_force(bundle: &ParsedBundle) -> Vec<&CrlInfo> {
    let mut seen = HashSet::new();
    bundle
        .crl_infos
        .iter()
        .filter(|crl| seen.insert(SeriesKey::of(crl)))
        .collect()
}

/// Every CRL series accepted by one client-CA source since the process started: the newest
/// position of each, and whether it led its issuer. Kept across bundle changes (a CA removed and
/// re-added meets its own history), bounded by [`CRL_HISTORY_BOUND`].
#[derive(Debug, Default)]
pub(crate) struct CrlHistory {
    series: HashMap<SeriesKey, Seen>,
    /// Bundles recorded so far: the clock of [`Seen::last_seen`].
    recorded: u64,
}

#[derive(Debug)]
struct Seen {
    position: Position,
    /// Whether it was its issuer's first CRL in the last bundle that held it.
    lead: bool,
    /// The file of that CRL, for messages.
    path: PathBuf,
    last_seen: u64,
}

impl CrlHistory {
    /// Records the CRLs of `bundle`, just accepted (so none is older than its series' entry).
    pub(crate) fn record(&mut self, bundle: &ParsedBundle) {
        self.recorded += 1;
        let mut issuers = HashSet::new();
        for crl in in_force(bundle) {
            let key = SeriesKey::of(crl);
            let seen = Seen {
                position: crl.position(),
                lead: issuers.insert(key.issuer),
                path: crl.path.clone(),
                last_seen: self.recorded,
            };
            self.series.insert(key, seen);
        }
        self.forget_beyond(CRL_HISTORY_BOUND);
    }

    /// Forgets the least recently seen series not in the last bundle, down to `bound` of them.
    fn forget_beyond(&mut self, bound: usize) {
        let mut absent: Vec<(u64, SeriesKey)> = self
            .series
            .iter()
            .filter(|(_, seen)| seen.last_seen < self.recorded)
            .map(|(key, seen)| (seen.last_seen, *key))
            .collect();
        if absent.len() <= bound {
            return;
        }
        absent.sort_unstable_by_key(|(last_seen, _)| *last_seen);
        for (_, key) in &absent[..absent.len() - bound] {
            self.series.remove(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.series.len()
    }
}

type Digest = [u8; 32];

/// The issuer name of a series, hashed.
type IssuerKey = Digest;

/// A CA: its name and its key (subjectPublicKeyInfo), hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CaKey(Digest);

impl CaKey {
    fn of(name: &[u8], spki: &[u8]) -> CaKey {
        CaKey(digest(&[name, spki]))
    }
}

/// Which series a CRL belongs to: its issuer, the CA key that verified it, its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SeriesKey {
    issuer: IssuerKey,
    ca: CaKey,
    scope: Digest,
}

impl SeriesKey {
    fn of(crl: &CrlInfo) -> SeriesKey {
        let spki = crl.signer_spki.as_deref().unwrap_or_default();
        SeriesKey {
            issuer: digest(&[&crl.issuer_raw]),
            ca: CaKey::of(&crl.issuer_raw, spki),
            scope: digest(&[
                crl.scope.as_deref().unwrap_or_default(),
                &[u8::from(crl.scope.is_some())],
            ]),
        }
    }
}

/// SHA-256 over `parts`, each prefixed with its length.
fn digest(parts: &[&[u8]]) -> Digest {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests;
