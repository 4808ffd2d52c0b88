//! SNI selection, fixed for one snapshot: exact name, then a single-label wildcard, then the
//! default pair.
//!
//! The name maps are persistent hash maps (`imbl`, a HAMT): a snapshot that changes one pair
//! copies only the few map nodes on the paths to that pair's names and shares everything else
//! with the snapshot before it. A lookup is a hash and a walk of about `log32(N)` nodes, no
//! allocation and no lock.

use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::status::ServedCert;

/// One parsed pair as served: shared (same `Arc`) by every snapshot until its files change.
pub(crate) struct PairEntry {
    pub(crate) certified: Arc<CertifiedKey>,
    pub(crate) served: Arc<ServedCert>,
    /// When the whole chain is valid (for the may-replace rules).
    pub(crate) validity: crate::material::Validity,
    /// SHA-256 of the private key's DER, so a renewal for the same key reuses `certified.key`.
    pub(crate) key_digest: crate::material::KeyDigest,
}

impl std::fmt::Debug for PairEntry {
    // The key never reaches Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairEntry")
            .field("served", &self.served)
            .finish_non_exhaustive()
    }
}

/// Precedence of a claim on a name: lower wins. Configured names (in configuration order), then
/// names taken from certificates (in configuration order), then the default pair's own names.
pub(crate) type Rank = u64;

/// The pairs claiming one name, lowest rank first; never empty.
#[derive(Debug, Clone)]
struct Claims(Arc<[(Rank, Arc<PairEntry>)]>);

type NameMap = imbl::HashMap<Arc<str>, Claims>;

/// The certificate map of one snapshot. Updated per changed pair (see [`claim`](Self::claim) and
/// [`release`](Self::release)) on a copy that shares all untouched structure; the handshake path
/// only reads it (two hash lookups at most, no allocation, no lock).
#[derive(Debug, Clone)]
pub(crate) struct SniResolver {
    pub(crate) default: Arc<PairEntry>,
    /// Normalised name → claims.
    exact: NameMap,
    /// `*.a.com` is stored as `a.com`.
    wildcard: NameMap,
}

impl SniResolver {
    pub(crate) fn new(default: Arc<PairEntry>) -> Self {
        Self {
            default,
            exact: NameMap::default(),
            wildcard: NameMap::default(),
        }
    }

    /// The entry served for `server_name` (`None`: the client sent no SNI). `server_name` must be
    /// lower-case (rustls lower-cases the SNI it receives).
    pub(crate) fn select(&self, server_name: Option<&str>) -> &Arc<PairEntry> {
        let Some(name) = server_name else {
            return &self.default;
        };
        // A trailing dot is legal in DNS and means the same name.
        let name = name.strip_suffix('.').unwrap_or(name);
        if let Some(claims) = self.exact.get(name) {
            return claims.winner();
        }
        if let Some((_, parent)) = name.split_once('.')
            && let Some(claims) = self.wildcard.get(parent)
        {
            return claims.winner();
        }
        &self.default
    }

    /// Records that `entry` (of rank `rank`) serves `name` (normalised; `*.` for a wildcard),
    /// replacing an earlier claim of the same rank.
    pub(crate) fn claim(&mut self, name: &str, rank: Rank, entry: &Arc<PairEntry>) {
        let (map, key) = self.map_for(name);
        let claims = match map.get(key) {
            Some(claims) => {
                let mut list: Vec<_> = claims
                    .0
                    .iter()
                    .filter(|(r, _)| *r != rank)
                    .cloned()
                    .collect();
                let at = list.partition_point(|(r, _)| *r < rank);
                list.insert(at, (rank, Arc::clone(entry)));
                Claims(list.into())
            }
            None => Claims(Arc::new([(rank, Arc::clone(entry))])),
        };
        map.insert(Arc::from(key), claims);
    }

    /// Withdraws the claim of rank `rank` on `name`.
    pub(crate) fn release(&mut self, name: &str, rank: Rank) {
        let (map, key) = self.map_for(name);
        let Some(claims) = map.get(key) else {
            return;
        };
        let rest: Vec<_> = claims
            .0
            .iter()
            .filter(|(r, _)| *r != rank)
            .cloned()
            .collect();
        if rest.is_empty() {
            map.remove(key);
        } else if rest.len() != claims.0.len() {
            map.insert(Arc::from(key), Claims(rest.into()));
        }
    }

    /// How many distinct names (exact and wildcard) are claimed.
    pub(crate) fn name_count(&self) -> usize {
        self.exact.len() + self.wildcard.len()
    }

    fn map_for<'n>(&mut self, name: &'n str) -> (&mut NameMap, &'n str) {
        match name.strip_prefix("*.") {
            Some(parent) => (&mut self.wildcard, parent),
            None => (&mut self.exact, name),
        }
    }
}

impl Claims {
    fn winner(&self) -> &Arc<PairEntry> {
        // Never empty: `release` removes the name with its last claim.
        &self.0[0].1
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.select(client_hello.server_name()).certified,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(label: &str) -> Arc<PairEntry> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let signing = rustls::crypto::aws_lc_rs::default_provider()
            .key_provider
            .load_private_key(der)
            .unwrap();
        Arc::new(PairEntry {
            key_digest: [0; 32],
            validity: crate::material::Validity {
                not_before: 0,
                not_after: i64::MAX,
            },
            certified: Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing)),
            served: Arc::new(ServedCert {
                source: label.to_owned(),
                path: label.into(),
                info: crate::material::CertInfo::from_der(cert.der()).unwrap(),
            }),
        })
    }

    fn selected(resolver: &SniResolver, name: &str) -> String {
        resolver.select(Some(name)).served.source.clone()
    }

    #[test]
    fn the_lowest_rank_wins_whatever_the_order_of_claims() {
        let (default, a, b) = (entry("default"), entry("a"), entry("b"));
        let mut resolver = SniResolver::new(default);
        resolver.claim("api.test", 5, &b);
        resolver.claim("api.test", 2, &a);
        assert_eq!(selected(&resolver, "api.test"), "a");
        resolver.release("api.test", 2);
        assert_eq!(selected(&resolver, "api.test"), "b");
        resolver.release("api.test", 5);
        assert_eq!(selected(&resolver, "api.test"), "default");
        assert_eq!(resolver.name_count(), 0);
    }

    #[test]
    fn a_wildcard_covers_one_label_and_an_exact_name_beats_it() {
        let (default, wild, exact) = (entry("default"), entry("wild"), entry("exact"));
        let mut resolver = SniResolver::new(default);
        resolver.claim("*.apps.test", 1, &wild);
        resolver.claim("x.apps.test", 2, &exact);
        assert_eq!(selected(&resolver, "y.apps.test"), "wild");
        assert_eq!(selected(&resolver, "x.apps.test"), "exact");
        assert_eq!(selected(&resolver, "x.apps.test."), "exact");
        assert_eq!(selected(&resolver, "a.b.apps.test"), "default");
        assert_eq!(selected(&resolver, "apps.test"), "default");
        assert_eq!(resolver.select(None).served.source, "default");
    }

    #[test]
    fn a_copy_changed_by_one_claim_leaves_the_original_alone() {
        let (default, a, b) = (entry("default"), entry("a"), entry("b"));
        let mut before = SniResolver::new(default);
        for i in 0..1000 {
            before.claim(&format!("n{i}.test"), i, &a);
        }
        let mut after = before.clone();
        after.claim("n7.test", 7, &b);
        assert_eq!(selected(&before, "n7.test"), "a");
        assert_eq!(selected(&after, "n7.test"), "b");
        assert!(Arc::ptr_eq(
            before.select(Some("n8.test")),
            after.select(Some("n8.test"))
        ));
    }
}
