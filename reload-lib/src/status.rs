//! What a set publishes about itself: [`Status`] (generation, counters, the last error, what
//! the last pass did) and [`Served`], the certificates in use ([`ServedCert`]), shared between
//! statuses so that publishing a change to one pair of a large set copies nothing else.

use std::ops::Index;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::material::CertInfo;

/// One certificate in use, and where it came from. Listed in [`Served`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, ServingSet};
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
/// let default = &set.status().served[0];
/// assert_eq!(default.source, "default");
/// assert_eq!(default.path, crt);
/// assert_eq!(default.info.dns_names, ["api.example"]);
/// # Ok(()) }
/// ```
///
/// # Security
/// Public facts only: the private key is never part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServedCert {
    /// Its role: `default`, `sni:<name>`, `client-ca`, `identity` or `roots`.
    pub source: String,
    /// The file it was read from.
    pub path: std::path::PathBuf,
    /// Subject, SANs, serial, fingerprint and validity.
    pub info: CertInfo,
}

/// Every certificate a set serves, in source order: the default pair, then SNI pairs in
/// configuration order, then CA certificates (client-CA bundle, or the client's roots).
///
/// Cheap to clone: statuses share the entries of sources that did not change, so publishing a
/// change to one pair of a large set does not copy the others.
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
/// use reload_lib::{CertKeyPaths, ServingSet};
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
///     .sni("localhost-recovery", CertKeyPaths::new(&rcrt, &rkey))
///     .start()
///     .await?;
/// let served = set.status().served;
/// assert_eq!(served.len(), 2);
/// assert_eq!(served[1].source, "sni:localhost-recovery");
/// for cert in served.iter() {
///     println!("{}: {} until {}", cert.source, cert.info.subject, cert.info.not_after_rfc3339());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Served {
    pairs: imbl::Vector<Arc<ServedCert>>,
    extra: Arc<[Arc<ServedCert>]>,
}

impl Served {
    pub(crate) fn new(pairs: imbl::Vector<Arc<ServedCert>>, extra: Arc<[Arc<ServedCert>]>) -> Self {
        Self { pairs, extra }
    }

    /// How many certificates are listed.
    pub fn len(&self) -> usize {
        self.pairs.len() + self.extra.len()
    }

    /// Whether nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The certificate at `index`, if any.
    pub fn get(&self, index: usize) -> Option<&ServedCert> {
        self.shared(index).map(|cert| &**cert)
    }

    /// Every certificate, in order.
    pub fn iter(&self) -> impl Iterator<Item = &ServedCert> + '_ {
        self.iter_shared().map(|cert| &**cert)
    }

    /// The shared entry at `index` (pointer-equal across statuses while unchanged).
    pub(crate) fn shared(&self, index: usize) -> Option<&Arc<ServedCert>> {
        match index.checked_sub(self.pairs.len()) {
            None => self.pairs.get(index),
            Some(extra) => self.extra.get(extra),
        }
    }

    /// The entries of the pairs (the part before the CA certificates).
    pub(crate) fn pairs(&self) -> &imbl::Vector<Arc<ServedCert>> {
        &self.pairs
    }

    /// How many entries are pairs (the rest are CA certificates).
    pub(crate) fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    pub(crate) fn iter_shared(&self) -> impl Iterator<Item = &Arc<ServedCert>> + '_ {
        self.pairs.iter().chain(self.extra.iter())
    }
}

impl Index<usize> for Served {
    type Output = ServedCert;

    /// # Panics
    /// When `index` is out of range.
    fn index(&self, index: usize) -> &ServedCert {
        match self.get(index) {
            Some(cert) => cert,
            None => panic!(
                "served certificate {index} out of range (len {})",
                self.len()
            ),
        }
    }
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<ServedCert> for Served {
    fn from_iter<I: IntoIterator<Item = ServedCert>>(iter: I) -> Self {
        Self {
            pairs: iter.into_iter().map(Arc::new).collect(),
            extra: Arc::new([]),
        }
    }
}

/// The state of a reloadable set, published to subscribers on every reload attempt that changes
/// something (a new generation, or a new failure).
///
/// A garbage write is rejected and the last good certificate keeps serving:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, InvalidMaterial, ServingSet};
/// use std::time::Duration;
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
/// let mut updates = set.subscribe();
/// std::fs::write(&crt, "garbage")?; // in place: truncate, then write
///
/// let failed = updates.wait_for(|status| status.last_error.is_some());
/// let status = tokio::time::timeout(Duration::from_secs(10), failed).await??.clone();
/// let reason = status.last_error.as_ref().and_then(|err| err.invalid_material());
/// // Empty if the reader caught the write between truncate and write.
/// assert!(matches!(reason, Some(InvalidMaterial::NoCertificate | InvalidMaterial::Empty)));
/// assert_eq!(status.generation, 1);
/// assert_eq!(set.current().certificate_for(None).dns_names, ["api.example"]);
/// # Ok(()) }
/// ```
///
/// # Security
/// `last_error` names the file and what is wrong with it; it never holds key material, so it is
/// safe to log or expose on a health endpoint.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Status {
    /// Increases by one with every published snapshot; 1 after start-up.
    pub generation: u64,
    /// What is served now.
    pub served: Served,
    /// Successful reloads that published a new snapshot (start-up included).
    pub reloads_ok: u64,
    /// Reload attempts that were rejected (bad, torn or unreadable material). A pass that
    /// publishes the changes of some sources while rejecting another counts here and in
    /// `reloads_ok`.
    pub reloads_failed: u64,
    /// The most recent failure, cleared when the files again hold what is served or something
    /// newer is published without any source being rejected.
    pub last_error: Option<Arc<Error>>,
    /// Reload passes run (start-up included), whether they published, were rejected or found
    /// the files unchanged: watch events, retries, resyncs, polls and explicit reloads. Updated
    /// without waking subscribers; with `reloads_ok` it shows how many passes a rotation cost.
    pub passes: u64,
    /// When the last snapshot was published, seconds since the Unix epoch.
    pub last_success_unix: i64,
    /// How long the pass that built the current snapshot took: reading, parsing, checking,
    /// building the configuration and publishing it.
    pub last_reload_duration: Duration,
    /// How many sources (a certificate/key pair, a CA bundle with its CRLs, the client's roots)
    /// the pass that built the current snapshot read. A watch event re-reads only the sources
    /// whose files it names; explicit reloads, resyncs, polls and queue overflows read all.
    pub last_reload_sources_read: usize,
    /// How many of those had changed content, so were parsed and checked again (the others keep
    /// their parsed entry, shared with the previous snapshot).
    pub last_reload_sources_parsed: usize,
}
