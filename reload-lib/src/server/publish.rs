//! Building a snapshot from what a pass accepted: the SNI resolver and served list shared with
//! the previous snapshot except for the changed sources, the session cache kept unless client
//! trust shrank, and the `ServerConfig`. Nothing is committed to the material unless the whole
//! snapshot could be built.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};

use crate::error::{Error, Result};
use crate::status::{Served, ServedCert};

use super::material::{AcceptedCa, AcceptedPair, Digest, ServingMaterial};
use super::resolver::SniResolver;
use super::sessions;
use super::snapshot::ServingSnapshot;

impl ServingMaterial {
    /// Builds the snapshot that serves `accepted` and `new_ca` on top of `current`, sharing
    /// everything else, and commits them as the material's accepted state.
    pub(super) fn publish(
        &mut self,
        current: Option<&ServingSnapshot>,
        accepted: Vec<AcceptedPair>,
        new_ca: Option<(Digest, AcceptedCa)>,
        newly_served: &mut Vec<Arc<ServedCert>>,
    ) -> Result<ServingSnapshot> {
        let (mut resolver, mut served_pairs) = match current {
            Some(current) => ((*current.resolver).clone(), current.served.pairs().clone()),
            None => {
                // At start-up every pair is accepted, in order: the first is the default.
                let default = &accepted
                    .first()
                    .expect("a start-up pass accepts every pair or is rejected")
                    .entry;
                (SniResolver::new(Arc::clone(default)), imbl::Vector::new())
            }
        };
        for accepted in &accepted {
            let source = &self.pairs[accepted.id];
            let new_names = source.names(&accepted.entry.served.info);
            if let Some(old) = &source.entry {
                for name in source.names(&old.served.info).difference(&new_names) {
                    resolver.release(name, source.rank);
                }
            }
            for name in &new_names {
                resolver.claim(name, source.rank, &accepted.entry);
            }
            if accepted.id == 0 {
                resolver.default = Arc::clone(&accepted.entry);
            }
            let served = Arc::clone(&accepted.entry.served);
            if source
                .entry
                .as_ref()
                .is_none_or(|old| old.served.info.sha256 != served.info.sha256)
            {
                newly_served.push(Arc::clone(&served));
            }
            if current.is_some() {
                served_pairs.set(accepted.id, served);
            } else {
                served_pairs.push_back(served);
            }
        }

        let old_ca = self.client_ca.as_ref().and_then(|ca| ca.current.clone());
        let (ca, keep_sessions) = match &new_ca {
            Some((_, new)) => {
                for cert in new.served.iter() {
                    let known = old_ca.as_ref().is_some_and(|old| {
                        old.served.iter().any(|o| o.info.sha256 == cert.info.sha256)
                    });
                    if !known {
                        newly_served.push(Arc::clone(cert));
                    }
                }
                // Keep the session cache unless trust shrank: resumption then survives
                // serving-cert rotations, while sessions authenticated under a removed CA
                // cannot resume.
                let keep = old_ca
                    .as_ref()
                    .is_some_and(|old| old.bundle.is_subset_of(&new.bundle));
                (Some(new), keep)
            }
            None => (old_ca.as_deref(), true),
        };
        let session_storage = match current {
            Some(current) if keep_sessions => Arc::clone(&current.session_storage),
            _ => ServerSessionMemoryCache::new(self.settings.session_cache_size)
                as Arc<dyn StoresServerSessions>,
        };
        // A new epoch whenever the cache is replaced because trust shrank (or at start-up):
        // named after the trust it starts with, so processes reading the same files agree.
        let epoch = match &new_ca {
            Some((digest, _)) if !keep_sessions => {
                let mut epoch = [0; 8];
                epoch.copy_from_slice(&digest[..8]);
                epoch
            }
            _ => self.trust_epoch,
        };

        let resolver = Arc::new(resolver);
        let builder = ServerConfig::builder_with_provider(Arc::clone(&self.settings.provider))
            .with_protocol_versions(rustls::ALL_VERSIONS)
            .map_err(|source| Error::BuildConfig {
                what: "protocol versions".to_owned(),
                source,
            })?;
        let builder = match ca {
            Some(ca) => builder.with_client_cert_verifier(Arc::clone(&ca.verifier)),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(
            Arc::clone(&resolver) as Arc<dyn rustls::server::ResolvesServerCert>
        );
        config.alpn_protocols = self.settings.alpn.clone();
        config.session_storage = Arc::clone(&session_storage);
        if let Some(configure) = &self.settings.configure {
            configure(&mut config);
            if ca.is_some() {
                bind_sessions_to_epoch(&mut config, &session_storage, epoch);
            }
        }
        let ca_served = ca.map_or_else(|| Arc::from([]), |ca| Arc::clone(&ca.served));
        let client_verifier = ca.map(|ca| Arc::clone(&ca.strict));

        // Nothing can fail from here on: commit.
        for accepted in accepted {
            let source = &mut self.pairs[accepted.id];
            source.digest = Some(accepted.digest);
            source.entry = Some(accepted.entry);
        }
        if let (Some(source), Some((digest, new))) = (&mut self.client_ca, new_ca) {
            source.digest = Some(digest);
            source.crl_history.record(&new.bundle);
            source.current = Some(Arc::new(new));
        }
        self.trust_epoch = epoch;
        Ok(ServingSnapshot {
            generation: current.map_or(1, |c| c.generation + 1),
            config: Arc::new(config),
            resolver,
            served: Served::new(served_pairs, ca_served),
            session_storage,
            client_verifier,
        })
    }
}

/// Whatever `configure` installed for resumption is bound to the trust epoch: a ticketer's
/// tickets and a replaced session store's entries from an earlier epoch no longer resume, so the
/// trust-shrink rule holds however the caller configures resumption.
fn bind_sessions_to_epoch(
    config: &mut ServerConfig,
    ours: &Arc<dyn StoresServerSessions>,
    epoch: sessions::Epoch,
) {
    if config.ticketer.enabled() {
        config.ticketer = Arc::new(sessions::EpochTicketer {
            inner: Arc::clone(&config.ticketer),
            epoch,
        });
    }
    if !Arc::ptr_eq(&config.session_storage, ours) {
        config.session_storage = Arc::new(sessions::EpochStore {
            inner: Arc::clone(&config.session_storage),
            epoch,
        });
    }
}
