//! [`ServingSet`], the handle of a running set, and [`ServingSnapshot`], one published state.

use std::sync::Arc;

use rustls::ServerConfig;
use tokio::sync::watch;

use crate::error::Result;
use crate::reload::Handle;
use crate::status::Status;
use crate::watch::WatchMode;

use super::acceptor::Acceptor;
use super::snapshot::ServingSnapshot;

/// A reloading set of serving material: the default certificate, SNI certificates and the
/// optional client-CA bundle, watched on disk and swapped in as one snapshot.
///
/// Start it, hand [`acceptor`](Self::acceptor) to your accept loop (see [`Acceptor`] for a
/// handshake), and rotate by writing files; [`subscribe`](Self::subscribe) tells you when a
/// rotation is served:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// // tls.crt and tls.key in `dir` hold a valid pair for api.example.
/// use reload_lib::{CertKeyPaths, ServingSet, fs::write_file_atomic};
/// use std::time::Duration;
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
/// let mut updates = set.subscribe();
///
/// // Rotate by rename, key then certificate: the set waits for the second file (at most
/// // 10 ms) rather than parse the torn state in between (new key, old certificate).
/// let next = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// write_file_atomic(&key, next.signing_key.serialize_pem().as_bytes(), 0o600)?;
/// write_file_atomic(&crt, next.cert.pem().as_bytes(), 0o644)?;
///
/// let rotated = updates.wait_for(|status| status.generation == 2);
/// tokio::time::timeout(Duration::from_secs(10), rotated).await??;
/// assert_eq!(set.current().certified_key_for(None).cert[0], *next.cert.der());
/// # Ok(()) }
/// ```
/// # Recovery
/// Changes are picked up from inotify directory watches (kubelet `..data` swaps, rename into
/// place, in-place writes, directories deleted and recreated, queue overflow), from a periodic
/// resync, from [`reload`](Self::reload) and from SIGHUP (see
/// [`reload_on_sighup`](Self::reload_on_sighup)). Rejected material leaves the last good snapshot
/// in place; the reload is retried shortly after, and again on the next event.
///
/// A certificate and key in two files are usually replaced one after the other. When only one
/// of them changed, the set waits up to 10 ms for the other before it reads them, so a rotation
/// costs one pass; a certificate renewed alone is published that much later. A pair that still
/// does not match (the writer was slower, or the new file belongs to another key) is not served;
/// it is retried, and reported in [`Status`] if it persists beyond a quarter of a second.
///
/// Each pair (and the client-CA bundle with its CRLs) is a source of its own. An event re-reads
/// only the sources whose files it names (a kubelet `..data` swap: the sources in that
/// directory); a resync, an explicit reload, SIGHUP or a queue overflow re-reads all of them.
/// Only sources whose bytes changed are parsed and checked again, and the new snapshot shares
/// every other entry with the previous one, so the cost of changing one pair does not grow with
/// the size of the set ([`Status::last_reload_sources_read`] and
/// [`Status::last_reload_sources_parsed`] show what a pass did). A rejected source keeps its last
/// good entry and is retried without holding back changes to the others.
///
/// # Security
/// Before a swap: every PEM block parses, the key matches the leaf, the chain is in order,
/// configured SNI names are covered by the certificate, the CA bundle is non-empty. An expired
/// certificate never replaces a valid one. When the client CA bundle loses a CA (or its CRLs
/// change), the session cache is replaced, so sessions authenticated under the old trust cannot
/// resume; serving-certificate rotations keep the cache, so resumption keeps working.
#[derive(Debug, Clone)]
pub struct ServingSet {
    pub(super) handle: Arc<Handle<ServingSnapshot>>,
}

impl ServingSet {
    /// An acceptor for incoming connections: cheap to clone, one per accept loop or per
    /// connection. See [`Acceptor`] for a handshake.
    pub fn acceptor(&self) -> Acceptor {
        Acceptor {
            current: Arc::clone(&self.handle.current),
            _keepalive: Arc::clone(&self.handle) as Arc<dyn Send + Sync>,
        }
    }

    /// The snapshot served now (new handshakes use it; the next swap does not change it).
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
    /// let snapshot = set.current();
    /// assert_eq!(snapshot.generation, 1);
    /// assert_eq!(snapshot.certificate_for(None).dns_names, ["api.example"]);
    /// # Ok(()) }
    /// ```
    pub fn current(&self) -> Arc<ServingSnapshot> {
        self.handle.current.load_full()
    }

    /// The `ServerConfig` served now, for callers with their own accept loop: take it once per
    /// connection (a config kept longer keeps serving the material it was built with).
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
    /// // Per connection:
    /// let acceptor = tokio_rustls::TlsAcceptor::from(set.server_config());
    /// assert_eq!(set.server_config().alpn_protocols, [&b"h2"[..], b"http/1.1"]);
    /// # drop(acceptor);
    /// # Ok(()) }
    /// ```
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.handle.current.load().config)
    }

    /// Status updates: a new value after every published snapshot and every rejection. See the
    /// [type-level example](ServingSet) for waiting on a rotation, and [`Status`] for a rejection.
    ///
    /// Do not hold the borrowed value across an `.await` (it blocks the reload task): clone it.
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
    /// let mut updates = set.subscribe();
    /// tokio::spawn(async move {
    ///     while updates.changed().await.is_ok() {
    ///         let status = updates.borrow_and_update().clone();
    ///         match &status.last_error {
    ///             None => eprintln!("serving generation {}", status.generation),
    ///             Some(err) => eprintln!("rejected, still serving the last good material: {err}"),
    ///         }
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.handle.status.clone()
    }

    /// The latest status (see [`Status`] for a rejected write).
    ///
    /// It never lags what is served: once a handshake was served a certificate, this reports
    /// the generation that published it or a later one.
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
    /// let status = set.status();
    /// assert_eq!((status.generation, status.reloads_ok, status.reloads_failed), (1, 1, 0));
    /// assert!(status.last_error.is_none());
    /// # Ok(()) }
    /// ```
    pub fn status(&self) -> Status {
        self.handle.status.borrow().clone()
    }

    /// Whether changes are seen through inotify or by polling. See [`WatchMode`] for an example.
    pub fn watch_mode(&self) -> &WatchMode {
        &self.handle.mode
    }

    /// Re-reads every file now and waits for the outcome: `Ok(true)` when a new snapshot was
    /// published, `Ok(false)` when the files hold what is served. Only sources whose bytes
    /// changed are parsed again.
    ///
    /// # Errors
    /// Why the files were rejected (the last good material of the rejected source keeps
    /// serving; changes to other sources found by the same pass are published regardless).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
    /// # std::fs::write(&crt, pair.cert.pem())?;
    /// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
    /// use reload_lib::{CertKeyPaths, InvalidMaterial, ServingSet, fs::write_file_atomic};
    ///
    /// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
    /// let before = set.current().certificate_for(None).sha256.clone();
    ///
    /// write_file_atomic(&crt, b"garbage", 0o644)?;
    /// let err = set.reload().await.unwrap_err();
    /// assert_eq!(err.invalid_material(), Some(&InvalidMaterial::NoCertificate));
    /// assert_eq!(set.current().certificate_for(None).sha256, before); // still served
    ///
    /// write_file_atomic(&crt, pair.cert.pem().as_bytes(), 0o644)?;
    /// set.reload().await?; // the files hold what is served again
    /// assert!(set.status().last_error.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn reload(&self) -> Result<bool> {
        self.handle.reload().await
    }

    /// Schedules a reload without waiting for it.
    pub fn trigger_reload(&self) {
        self.handle.trigger();
    }

    /// Spawns a task (on the caller's runtime) that triggers a reload on every SIGHUP, for as
    /// long as the set lives: it ends when the set is dropped (`kill -HUP <pid>` after replacing
    /// files on a filesystem without inotify events).
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
    /// set.reload_on_sighup()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// When the signal handler cannot be installed.
    pub fn reload_on_sighup(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        let set = Arc::downgrade(&self.handle);
        let dropped = self.handle.dropped();
        tokio::spawn(async move {
            tokio::pin!(dropped);
            loop {
                tokio::select! {
                    () = &mut dropped => return,
                    hangup = hangups.recv() => {
                        let (Some(()), Some(handle)) = (hangup, set.upgrade()) else { return };
                        tracing::info!("SIGHUP: reloading");
                        handle.trigger();
                    }
                }
            }
        });
        Ok(())
    }
}
