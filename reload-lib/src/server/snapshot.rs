//! One immutable view of what a set serves: configuration, certificates by name, client-CA
//! verifier and session storage. Published by the engine, read by the acceptor at each handshake.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::StoresServerSessions;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;

use super::identity::ClientIdentity;
use super::resolver::{PairEntry, SniResolver};
use crate::material::{CertInfo, normalize_name};
use crate::status::Served;

/// One published state of a [`ServingSet`](crate::ServingSet): immutable, shared by every handshake that starts
/// while it is current.
///
/// Snapshots share structure: a pair whose files did not change between two snapshots is the
/// same parsed entry (the same `Arc`) in both, and the SNI maps of a new snapshot copy only the
/// map nodes leading to the names of the pairs that changed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// # let (rcrt, rkey) = (dir.path().join("recovery.crt"), dir.path().join("recovery.key"));
/// # let recovery = rcgen::generate_simple_self_signed(["localhost-recovery".to_owned()])?;
/// # std::fs::write(&rcrt, recovery.cert.pem())?;
/// # std::fs::write(&rkey, recovery.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, ServingSet, fs::write_file_atomic};
/// use std::sync::Arc;
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
///     .sni("localhost-recovery", CertKeyPaths::new(&rcrt, &rkey))
///     .start()
///     .await?;
/// let before = set.current();
/// assert_eq!(before.pair_count(), 2);
/// // Names are matched case-insensitively, a trailing dot ignored; unknown names get the default.
/// assert_eq!(before.certificate_for(Some("LOCALHOST-RECOVERY.")).dns_names, ["localhost-recovery"]);
/// assert_eq!(before.certificate_for(Some("unknown.example")).dns_names, ["api.example"]);
///
/// // Rotate the recovery pair only: the default pair's entry is shared.
/// let next = rcgen::generate_simple_self_signed(["localhost-recovery".to_owned()])?;
/// write_file_atomic(&rkey, next.signing_key.serialize_pem().as_bytes(), 0o600)?;
/// write_file_atomic(&rcrt, next.cert.pem().as_bytes(), 0o644)?;
/// set.reload().await?;
/// let after = set.current();
/// assert!(Arc::ptr_eq(before.certified_key_for(None), after.certified_key_for(None)));
/// let recovery = Some("localhost-recovery");
/// assert!(!Arc::ptr_eq(before.certified_key_for(recovery), after.certified_key_for(recovery)));
/// # Ok(()) }
/// ```
///
/// # Security
/// [`certified_key_for`](Self::certified_key_for) hands out the signing key (as rustls does);
/// its `Debug` output names the algorithm only. Do not export it beyond the process.
pub struct ServingSnapshot {
    /// Increases by one with every swap.
    pub generation: u64,
    pub(super) config: Arc<ServerConfig>,
    pub(super) resolver: Arc<SniResolver>,
    pub(super) served: Served,
    pub(super) session_storage: Arc<dyn StoresServerSessions>,
    /// The client-CA verification of this snapshot, for [`ClientIdentity`].
    pub(super) client_verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl std::fmt::Debug for ServingSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingSnapshot")
            .field("generation", &self.generation)
            .field("pairs", &self.pair_count())
            .field("sni_names", &self.resolver.name_count())
            .finish_non_exhaustive()
    }
}

impl ServingSnapshot {
    /// The certificate served to a client asking for `server_name` (`None`: no SNI).
    pub fn certificate_for(&self, server_name: Option<&str>) -> &CertInfo {
        &self.entry_for(server_name).served.info
    }

    /// The chain and key served to a client asking for `server_name` (`None`: no SNI): what
    /// rustls hands out. A pair whose files did not change is the same `Arc` in every snapshot,
    /// so `Arc::ptr_eq` across two snapshots tells whether a swap touched it.
    pub fn certified_key_for(&self, server_name: Option<&str>) -> &Arc<CertifiedKey> {
        &self.entry_for(server_name).certified
    }

    /// How many certificate/key pairs the snapshot holds: the default pair and every SNI pair.
    pub fn pair_count(&self) -> usize {
        self.served.pair_count()
    }

    /// The `ServerConfig` of this snapshot.
    pub fn server_config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// What `chain` (a client's certificates, leaf first; `None`: none presented) proves under
    /// this snapshot's client-CA bundle. See [`Acceptor::accept_with_identity`](crate::Acceptor::accept_with_identity).
    pub fn client_identity(&self, chain: Option<&[CertificateDer<'_>]>) -> ClientIdentity {
        match &self.client_verifier {
            Some(verifier) => ClientIdentity::check(verifier.as_ref(), chain),
            None => ClientIdentity::Anonymous,
        }
    }

    pub(super) fn entry_for(&self, server_name: Option<&str>) -> &Arc<PairEntry> {
        match server_name {
            Some(name) => self.resolver.select(Some(&normalize_name(name))),
            None => self.resolver.select(None),
        }
    }
}
