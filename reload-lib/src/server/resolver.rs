//! SNI selection, fixed for one snapshot: exact name, then a single-label wildcard, then the
//! default pair.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The certificate map of one snapshot. Built once per reload; the handshake path only reads it
/// (two hash lookups at most, no allocation, no lock).
#[derive(Debug, Clone)]
pub(crate) struct SniResolver {
    pub(crate) default: usize,
    /// Normalised name → index into `pairs`.
    pub(crate) exact: HashMap<String, usize>,
    /// `*.a.com` is stored as `a.com`.
    pub(crate) wildcard: HashMap<String, usize>,
    pub(crate) pairs: Vec<Arc<CertifiedKey>>,
}

impl SniResolver {
    /// The index of the pair served for `server_name` (`None`: the client sent no SNI).
    pub(crate) fn select(&self, server_name: Option<&str>) -> usize {
        let Some(name) = server_name else {
            return self.default;
        };
        // rustls lower-cases the SNI; a trailing dot is legal in DNS and means the same name.
        let name = name.strip_suffix('.').unwrap_or(name);
        if let Some(index) = self.exact.get(name) {
            return *index;
        }
        if let Some((_, parent)) = name.split_once('.')
            && let Some(index) = self.wildcard.get(parent)
        {
            return *index;
        }
        self.default
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.pairs[self.select(client_hello.server_name())],
        ))
    }
}
