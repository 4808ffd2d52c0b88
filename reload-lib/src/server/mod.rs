//! Serving: a default certificate, SNI certificates and an optional client-CA bundle, reloaded
//! from files and published together as one immutable snapshot.

mod acceptor;
mod identity;
mod resolver;
mod sessions;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ServerSessionMemoryCache, StoresServerSessions, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use crate::error::{Error, InvalidMaterial, Result};
use crate::material::{CertInfo, ParsedBundle, ParsedPair, covers, normalize_name};
use crate::policy;
use crate::reload::{self, Handle, Material, Pass, Served, ServedCert, Status, Timing};
use crate::source::{CertKeyPaths, PassReader};
use crate::watch::{Dirty, Interest, WatchMode, watch_path};

pub use acceptor::Acceptor;
pub use identity::ClientIdentity;
use resolver::{PairEntry, Rank, SniResolver};

/// Whether and how clients present certificates. Used with [`ServingSetBuilder::client_ca`].
///
/// A client without a certificate is refused by a [`Required`](Self::Required) set (a real
/// handshake on 127.0.0.1):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// # let ca = dir.path().join("client-ca.crt");
/// # std::fs::write(&ca, pair.cert.pem())?;
/// use reload_lib::{CertKeyPaths, ClientAuth, ClientTls, ServingSet};
/// use rustls_pki_types::ServerName;
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
///     .client_ca(&ca, ClientAuth::Required)
///     .start()
///     .await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// // A client that trusts the server but has no certificate of its own.
/// let client = ClientTls::builder(&crt).start().await?;
/// let name = ServerName::try_from("api.example")?;
/// tokio::spawn(async move {
///     let tcp = tokio::net::TcpStream::connect(addr).await?;
///     tokio_rustls::TlsConnector::from(client.config()).connect(name, tcp).await
/// });
/// let (tcp, _) = listener.accept().await?;
/// assert!(set.acceptor().accept(tcp).await.is_err());
/// # Ok(()) }
/// ```
///
/// # Security
/// Client certificates are verified by rustls' WebPKI client verifier built from the current CA
/// bundle (chain to a CA in the bundle, validity, client-auth usage, CRLs when configured).
/// Verification cannot be turned off; `Optional` only lets clients present no certificate at
/// all, never an invalid one. `Request` completes the handshake with an invalid certificate too,
/// and hands the verdict to the application ([`Acceptor::accept_with_identity`]); with
/// `Request`, a connection's `peer_certificates()` are unverified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientAuth {
    /// Every client must present a certificate that chains to the bundle.
    Required,
    /// Clients may present a certificate; if they do, it must chain to the bundle. The
    /// application decides what an anonymous client may do.
    Optional,
    /// Ask for a certificate and complete the handshake whatever the client presents (none,
    /// expired, unknown issuer, revoked), as kube-apiserver does: the application gets the
    /// verified or rejected identity from [`Acceptor::accept_with_identity`] and decides (e.g.
    /// authenticate by bearer token instead, or answer 401). The client must still prove it
    /// holds the key of a certificate it presents.
    Request,
}

/// How a set of SNI names is chosen for a pair.
#[derive(Debug, Clone)]
enum SniNames {
    /// Configured names; each must be covered by the certificate's SANs.
    Explicit(Vec<String>),
    /// The certificate's DNS SANs (or its CN when it has none), re-read on every reload.
    FromCertificate,
}

#[derive(Debug, Clone)]
struct SniEntry {
    names: SniNames,
    paths: CertKeyPaths,
}

#[derive(Debug, Clone)]
struct ClientCaConfig {
    path: PathBuf,
    crls: Vec<PathBuf>,
    auth: ClientAuth,
}

type Configure = Arc<dyn Fn(&mut ServerConfig) + Send + Sync>;

/// Configures and starts a [`ServingSet`]. Made by [`ServingSet::builder`].
///
/// A set may hold thousands of SNI pairs (call [`sni`](Self::sni) or
/// [`sni_from_certificate`](Self::sni_from_certificate) once per pair): lookups are O(1) in the
/// number of pairs and a change to one pair re-reads only that pair (see [`ServingSet`]).
///
/// Defaults: no SNI pairs, no client certificates, ALPN `h2` then `http/1.1`, TLS 1.2 and 1.3
/// with the aws-lc-rs provider, resync every 60 s, polling every 1 s when inotify is unavailable.
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
/// // tls.crt/tls.key: a pair for api.example; recovery.crt/recovery.key: for localhost-recovery.
/// use reload_lib::{CertKeyPaths, ServingSet};
/// use std::time::Duration;
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
///     .name("kube-apiserver")
///     .sni("localhost-recovery", CertKeyPaths::new(&rcrt, &rkey))
///     .alpn(vec![b"h2".to_vec()])
///     .configure(|config| config.ignore_client_order = true)
///     .resync_interval(Some(Duration::from_secs(300)))
///     .start()
///     .await?;
/// let served = set.current();
/// assert_eq!(served.certificate_for(Some("localhost-recovery")).dns_names, ["localhost-recovery"]);
/// assert_eq!(served.certificate_for(None).dns_names, ["api.example"]);
/// # Ok(()) }
/// ```
///
/// # Security
/// Nothing is served until [`start`](Self::start) has read and validated every file. The
/// builder takes paths from your configuration and only ever reads them.
#[must_use]
pub struct ServingSetBuilder {
    name: String,
    default: CertKeyPaths,
    sni: Vec<SniEntry>,
    client_ca: Option<ClientCaConfig>,
    provider: Option<Arc<CryptoProvider>>,
    alpn: Vec<Vec<u8>>,
    configure: Option<Configure>,
    timing: Timing,
    session_cache_size: usize,
    max_file_size: u64,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::ReloadMetrics>,
}

impl std::fmt::Debug for ServingSetBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingSetBuilder")
            .field("name", &self.name)
            .field("default", &self.default)
            .field("sni", &self.sni)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

impl ServingSetBuilder {
    /// A name for logs and metrics (default `default`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Serves `paths` to clients asking for `name` (exact, or `*.` wildcard covering one label).
    /// The certificate must cover the name; configured names win over names taken from
    /// certificates, and earlier entries win over later ones.
    ///
    /// # Security
    /// Coverage is checked at start-up and on every reload: a rotated certificate that no longer
    /// covers the name is rejected and the last good pair keeps serving that name. This guards
    /// against misconfiguration, not against a hostile writer of the files.
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
    ///
    /// // tls.crt covers api.example only.
    /// let err = ServingSet::builder(CertKeyPaths::new(&crt, &key))
    ///     .sni("other.example", CertKeyPaths::new(&crt, &key))
    ///     .start()
    ///     .await
    ///     .unwrap_err();
    /// let reason = InvalidMaterial::NameNotCovered("other.example".into());
    /// assert_eq!(err.invalid_material(), Some(&reason));
    /// # Ok(()) }
    /// ```
    pub fn sni(self, name: impl Into<String>, paths: CertKeyPaths) -> Self {
        self.sni_names([name.into()], paths)
    }

    /// Like [`sni`](Self::sni) for several names served by one pair.
    pub fn sni_names(
        mut self,
        names: impl IntoIterator<Item = String>,
        paths: CertKeyPaths,
    ) -> Self {
        self.sni.push(SniEntry {
            names: SniNames::Explicit(names.into_iter().map(|n| normalize_name(&n)).collect()),
            paths,
        });
        self
    }

    /// Serves `paths` for every DNS name in its certificate (its CN when it has no DNS SANs).
    /// IP addresses are never SNI names. The names follow the certificate across reloads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
    /// # std::fs::write(&crt, pair.cert.pem())?;
    /// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
    /// # let (apps_crt, apps_key) = (dir.path().join("apps.crt"), dir.path().join("apps.key"));
    /// # let apps = rcgen::generate_simple_self_signed(["*.apps.example".to_owned(), "apps.example".to_owned()])?;
    /// # std::fs::write(&apps_crt, apps.cert.pem())?;
    /// # std::fs::write(&apps_key, apps.signing_key.serialize_pem())?;
    /// use reload_lib::{CertKeyPaths, ServingSet};
    ///
    /// // apps.crt has the SANs *.apps.example and apps.example.
    /// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
    ///     .sni_from_certificate(CertKeyPaths::new(&apps_crt, &apps_key))
    ///     .start()
    ///     .await?;
    /// let served = set.current();
    /// assert_eq!(served.certificate_for(Some("shop.apps.example")).dns_names[0], "*.apps.example");
    /// assert_eq!(served.certificate_for(Some("apps.example")).dns_names[0], "*.apps.example");
    /// // A wildcard covers exactly one label: this falls back to the default pair.
    /// assert_eq!(served.certificate_for(Some("a.b.apps.example")).dns_names, ["api.example"]);
    /// # Ok(()) }
    /// ```
    pub fn sni_from_certificate(mut self, paths: CertKeyPaths) -> Self {
        self.sni.push(SniEntry {
            names: SniNames::FromCertificate,
            paths,
        });
        self
    }

    /// Verifies client certificates against the CA bundle at `path` (reloaded like the rest).
    /// See [`ClientAuth`] for a handshake that is refused.
    ///
    /// # Security
    /// The bundle must hold at least one certificate and every `CERTIFICATE` block must parse, or
    /// it is rejected. When a reload removes a CA (or changes the CRLs), the TLS session cache is
    /// replaced, so sessions authenticated under the old trust cannot resume; adding a CA keeps
    /// the cache.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
    /// # std::fs::write(&crt, pair.cert.pem())?;
    /// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
    /// # let ca = dir.path().join("client-ca.crt");
    /// # std::fs::write(&ca, pair.cert.pem())?;
    /// use reload_lib::{CertKeyPaths, ClientAuth, ServingSet};
    ///
    /// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
    ///     .client_ca(&ca, ClientAuth::Optional)
    ///     .start()
    ///     .await?;
    /// // Served certificates: the default pair, then the CA bundle's certificates.
    /// assert_eq!(set.status().served[1].source, "client-ca");
    /// # Ok(()) }
    /// ```
    pub fn client_ca(mut self, path: impl Into<PathBuf>, auth: ClientAuth) -> Self {
        self.client_ca = Some(ClientCaConfig {
            path: path.into(),
            crls: Vec::new(),
            auth,
        });
        self
    }

    /// Adds a file of CRLs (PEM `X509 CRL` blocks, or one DER CRL) checked with the client CA
    /// bundle. Ignored without [`client_ca`](Self::client_ca).
    ///
    /// # Security
    /// Fails closed: the file must hold at least one CRL (an empty file, an HTML error page or a
    /// certificate is rejected, at start-up too), every CRL must parse and be issued and signed
    /// by a CA of the bundle (put an intermediate in the bundle to use its CRL), and a CRL past
    /// its nextUpdate never replaces fresh ones. Otherwise the bundle and its CRLs are rejected
    /// together and the last good ones stay in force. A client whose certificate is revoked is
    /// refused; a change of CRLs replaces the session cache and invalidates tickets (see
    /// [`client_ca`](Self::client_ca)).
    pub fn client_crl(mut self, path: impl Into<PathBuf>) -> Self {
        if let Some(ca) = &mut self.client_ca {
            ca.crls.push(path.into());
        }
        self
    }

    /// The crypto provider (default: aws-lc-rs). No process-wide default is needed or installed.
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// ALPN protocols, most preferred first (default `h2`, `http/1.1`).
    pub fn alpn(mut self, protocols: Vec<Vec<u8>>) -> Self {
        self.alpn = protocols;
        self
    }

    /// Adjusts every [`ServerConfig`] the set builds (after ALPN and the session cache are set),
    /// e.g. to set `max_early_data_size`. Called again for every snapshot, so it should be cheap
    /// and deterministic. See the [type-level example](ServingSetBuilder).
    ///
    /// # Security
    /// Do not replace `cert_resolver` (reloads would stop reaching handshakes). A `ticketer` or
    /// `session_storage` set here is bound to the set's client-trust epoch: its tickets and
    /// sessions stop resuming when the client-CA bundle loses a CA or its CRLs change, as the
    /// set's own cache does. The client certificate verifier is fixed by the builder and cannot
    /// be changed here.
    pub fn configure(mut self, f: impl Fn(&mut ServerConfig) + Send + Sync + 'static) -> Self {
        self.configure = Some(Arc::new(f));
        self
    }

    /// Periodic re-read of every file, comparing content, as a safety net for missed events
    /// (default 60 s; `None` turns it off).
    pub fn resync_interval(mut self, interval: Option<Duration>) -> Self {
        self.timing.resync = interval;
        self
    }

    /// How often files are read when inotify is unavailable (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.timing.poll = interval;
        self
    }

    /// Never use inotify: read the files every [`poll_interval`](Self::poll_interval). For
    /// filesystems that deliver no events (some network and FUSE filesystems); the periodic
    /// resync is replaced by the poll.
    pub fn poll_only(mut self, poll: bool) -> Self {
        self.timing.force_poll = poll;
        self
    }

    /// How long a rejection may persist before it is logged at warn level (default 1 s): writers
    /// that replace certificate and key one after the other pass through torn states.
    pub fn warn_after(mut self, grace: Duration) -> Self {
        self.timing.warn_after = grace;
        self
    }

    /// The largest file the set reads, in bytes (default 4 MiB). A larger file at a watched path
    /// is refused unread (the last good material keeps serving), so a huge or endless file
    /// cannot grow memory. Only regular files are read: a FIFO, a device (`/dev/zero`), a socket
    /// or a directory is refused without blocking.
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// How long one pass of reading and checking the files may take (default 30 s). Reads run
    /// on the crate's own thread, never on an async worker; a pass that takes longer (a hung
    /// network filesystem) is reported in [`Status::last_error`] as [`Error::ReadTimeout`], and
    /// the set keeps serving its last good material until the pass ends. At start-up,
    /// [`start`](Self::start) fails with that error instead.
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.timing.read_timeout = timeout;
        self
    }

    /// Entries of the TLS session cache shared across reloads (default 1024).
    pub fn session_cache_size(mut self, size: usize) -> Self {
        self.session_cache_size = size;
        self
    }

    /// Registers the set's metrics (see [`metrics`](crate::metrics)) in `registry`.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, registry: &mut prometheus_client::registry::Registry) -> Self {
        self.metrics = Some(crate::metrics::ReloadMetrics::register(registry));
        self
    }

    /// Reads and checks every file, arms the watches and spawns the reload task on the current
    /// tokio runtime (it must be called inside one).
    ///
    /// # Errors
    /// Fails closed: any unreadable or invalid file at start-up is an error naming the file.
    /// Expired certificates are accepted at start-up (with a warning), since nothing better
    /// exists.
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
    /// std::fs::write(&key, "not a key")?;
    /// let err = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await.unwrap_err();
    /// assert!(err.to_string().starts_with(&format!("invalid material in {}", key.display())));
    /// # Ok(()) }
    /// ```
    pub async fn start(self) -> Result<ServingSet> {
        let provider = self
            .provider
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let material = ServingMaterial::new(
            self.default,
            self.sni,
            self.client_ca,
            Settings {
                provider,
                alpn: self.alpn,
                configure: self.configure,
                session_cache_size: self.session_cache_size,
                max_file_size: self.max_file_size,
            },
        );
        let handle = reload::start(material, self.timing, self.name.clone()).await?;
        #[cfg(feature = "metrics")]
        if let Some(metrics) = self.metrics {
            metrics.follow(self.name.clone(), handle.status.clone());
        }
        Ok(ServingSet {
            handle: Arc::new(handle),
        })
    }
}

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
/// // Rotate by rename; the torn state in between (new key, old certificate), if seen, is
/// // rejected and retried.
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
    handle: Arc<Handle<ServingSnapshot>>,
}

impl ServingSet {
    /// Starts configuring a set whose default pair is `default` (served to clients without SNI
    /// and to names no SNI entry matches). See [`ServingSetBuilder`] for an example.
    pub fn builder(default: CertKeyPaths) -> ServingSetBuilder {
        ServingSetBuilder {
            name: "default".to_owned(),
            default,
            sni: Vec::new(),
            client_ca: None,
            provider: None,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            configure: None,
            timing: Timing::default(),
            session_cache_size: 1024,
            max_file_size: crate::read::DEFAULT_MAX_FILE_SIZE,
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

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

/// One published state of a [`ServingSet`]: immutable, shared by every handshake that starts
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
    config: Arc<ServerConfig>,
    resolver: Arc<SniResolver>,
    served: Served,
    session_storage: Arc<dyn StoresServerSessions>,
    /// The client-CA verification of this snapshot, for [`ClientIdentity`].
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
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
    /// this snapshot's client-CA bundle. See [`Acceptor::accept_with_identity`].
    pub fn client_identity(&self, chain: Option<&[CertificateDer<'_>]>) -> ClientIdentity {
        match &self.client_verifier {
            Some(verifier) => ClientIdentity::check(verifier.as_ref(), chain),
            None => ClientIdentity::Anonymous,
        }
    }

    fn entry_for(&self, server_name: Option<&str>) -> &Arc<PairEntry> {
        match server_name {
            Some(name) => self.resolver.select(Some(&normalize_name(name))),
            None => self.resolver.select(None),
        }
    }
}

/// How a pair's names are chosen, which sets its precedence.
#[derive(Debug, Clone)]
enum Role {
    /// The default pair: served without SNI and for unmatched names; its own certificate names
    /// come after every SNI pair's.
    Default,
    /// Configured names; each must be covered by the certificate's SANs.
    Explicit(Vec<String>),
    /// The certificate's DNS SANs (or its CN when it has none), re-read on every reload.
    FromCertificate,
}

/// SHA-256 of the bytes a source was built from.
type Digest = [u8; 32];

/// One certificate/key pair of the set, and what was last accepted from it.
struct PairSource {
    paths: CertKeyPaths,
    role: Role,
    /// For logs, status and metrics: `default`, `sni:<names>` or `sni:from-certificate`.
    label: String,
    rank: Rank,
    /// Digest of the bytes `entry` was built from.
    digest: Option<Digest>,
    /// What is served from this source; `None` only before start-up.
    entry: Option<Arc<PairEntry>>,
    /// Digest of bytes refused once as a shortened chain: seen again, they are a settled write.
    shortened_seen: Option<Digest>,
}

impl PairSource {
    /// The names this source claims when serving a certificate with `info`.
    fn names(&self, info: &CertInfo) -> BTreeSet<String> {
        match &self.role {
            Role::Explicit(names) => names.iter().cloned().collect(),
            Role::Default | Role::FromCertificate => certificate_names(info)
                .iter()
                .map(|name| normalize_name(name))
                .collect(),
        }
    }
}

/// The client-CA bundle (with its CRLs), and what was last accepted from it.
struct CaSource {
    config: ClientCaConfig,
    digest: Option<Digest>,
    current: Option<Arc<AcceptedCa>>,
}

/// A parsed client-CA bundle and the verifier built from it.
struct AcceptedCa {
    bundle: ParsedBundle,
    /// What the handshake uses.
    verifier: Arc<dyn ClientCertVerifier>,
    /// The full verification, for [`ClientIdentity`] after the handshake.
    strict: Arc<dyn ClientCertVerifier>,
    served: Arc<[Arc<ServedCert>]>,
}

/// What every snapshot's `ServerConfig` is built with.
struct Settings {
    provider: Arc<CryptoProvider>,
    alpn: Vec<Vec<u8>>,
    configure: Option<Configure>,
    session_cache_size: usize,
    /// Files larger than this are refused unread.
    max_file_size: u64,
}

/// Everything the reloader reads for a serving set, per source, and what it accepted last.
///
/// Sources are numbered: the pairs `0..pairs.len()` (0 is the default pair, then SNI pairs in
/// configuration order), then the client-CA bundle.
struct ServingMaterial {
    pairs: Vec<PairSource>,
    client_ca: Option<CaSource>,
    settings: Settings,
    /// File (in [`watch_path`] form) → the sources that read it.
    by_file: HashMap<PathBuf, Vec<usize>>,
    /// Directory → the sources that read a file in it (for `..data` swaps).
    by_dir: HashMap<PathBuf, Vec<usize>>,
    /// Sources the last pass rejected: every pass re-reads them until they are accepted.
    failing: BTreeSet<usize>,
    /// The client-trust epoch sessions are bound to (see `sessions`).
    trust_epoch: sessions::Epoch,
}

/// What one pass accepted from a pair.
struct AcceptedPair {
    id: usize,
    digest: Digest,
    entry: Arc<PairEntry>,
}

impl ServingMaterial {
    fn new(
        default: CertKeyPaths,
        sni: Vec<SniEntry>,
        client_ca: Option<ClientCaConfig>,
        settings: Settings,
    ) -> Self {
        // Precedence: configured names in configuration order, then names from certificates in
        // configuration order, then the default pair's own names.
        const FROM_CERTIFICATE: Rank = 1 << 32;
        const DEFAULT: Rank = 2 << 32;
        let mut pairs = vec![PairSource {
            paths: default,
            role: Role::Default,
            label: "default".to_owned(),
            rank: DEFAULT,
            digest: None,
            entry: None,
            shortened_seen: None,
        }];
        for (index, entry) in sni.into_iter().enumerate() {
            let (role, label, rank) = match entry.names {
                SniNames::Explicit(names) => {
                    let label = format!("sni:{}", names.join(","));
                    (Role::Explicit(names), label, index as Rank)
                }
                SniNames::FromCertificate => (
                    Role::FromCertificate,
                    "sni:from-certificate".to_owned(),
                    FROM_CERTIFICATE + index as Rank,
                ),
            };
            pairs.push(PairSource {
                paths: entry.paths,
                role,
                label,
                rank,
                digest: None,
                entry: None,
                shortened_seen: None,
            });
        }
        let mut material = Self {
            pairs,
            client_ca: client_ca.map(|config| CaSource {
                config,
                digest: None,
                current: None,
            }),
            settings,
            by_file: HashMap::new(),
            by_dir: HashMap::new(),
            failing: BTreeSet::new(),
            trust_epoch: [0; 8],
        };
        let mut files: Vec<(usize, PathBuf)> = Vec::new();
        for (id, pair) in material.pairs.iter().enumerate() {
            files.push((id, pair.paths.cert().to_owned()));
            files.push((id, pair.paths.key().to_owned()));
        }
        if let Some(ca) = &material.client_ca {
            let id = material.ca_id();
            files.push((id, ca.config.path.clone()));
            files.extend(ca.config.crls.iter().map(|crl| (id, crl.clone())));
        }
        for (id, file) in files {
            let file = watch_path(&file);
            if let Some(dir) = file.parent() {
                push_unique(material.by_dir.entry(dir.to_owned()).or_default(), id);
            }
            push_unique(material.by_file.entry(file).or_default(), id);
        }
        material
    }

    /// The source number of the client-CA bundle.
    fn ca_id(&self) -> usize {
        self.pairs.len()
    }

    fn source_count(&self) -> usize {
        self.pairs.len() + usize::from(self.client_ca.is_some())
    }

    /// The sources a pass reads: every one at start-up and for unattributed changes; otherwise
    /// those whose files or directories were marked, and those still being retried.
    fn sources_to_read(&self, dirty: &Dirty, start: bool) -> BTreeSet<usize> {
        if start || dirty.all {
            return (0..self.source_count()).collect();
        }
        let mut todo = self.failing.clone();
        for file in &dirty.files {
            todo.extend(self.by_file.get(file).into_iter().flatten());
        }
        for dir in &dirty.dirs {
            todo.extend(self.by_dir.get(dir).into_iter().flatten());
        }
        todo
    }

    /// Reads pair `id`; `Ok(None)` when its bytes are what is served. Parses and checks
    /// otherwise (counted in `parsed`).
    fn pass_pair(
        &mut self,
        id: usize,
        reader: &mut PassReader,
        now: i64,
        parsed: &mut usize,
    ) -> Result<Option<AcceptedPair>> {
        let source = &self.pairs[id];
        let paths = &source.paths.clone();
        let cert = reader.read(paths.cert())?;
        let key = if paths.key() == paths.cert() {
            None
        } else {
            Some(reader.read(paths.key())?)
        };
        let digest = digest([&cert[..], key.as_deref().unwrap_or_default()]);
        if source.digest == Some(digest) {
            return Ok(None);
        }
        *parsed += 1;
        let key = key.as_deref().unwrap_or(&cert);
        let pair = ParsedPair::parse(
            paths.cert(),
            &cert,
            paths.key(),
            key,
            &self.settings.provider,
        )?;
        // Never trade a valid chain for an expired or not yet valid one, nor a full chain for
        // one caught mid-write.
        let current = source.entry.as_ref();
        policy::may_replace_chain(
            paths.cert(),
            pair.validity,
            current.map(|entry| entry.validity),
            now,
        )?;
        let shortened = current.map_or(Ok(()), |current| {
            policy::may_shorten_chain(
                paths.cert(),
                &pair.certified.cert,
                &current.certified.cert,
                source.shortened_seen == Some(digest),
            )
        });
        if let Err(err) = shortened {
            self.pairs[id].shortened_seen = Some(digest);
            return Err(err);
        }
        let source = &self.pairs[id];
        if let Role::Explicit(names) = &source.role {
            for name in names {
                if !pair.info.dns_names.iter().any(|dns| covers(dns, name)) {
                    return Err(Error::invalid(
                        paths.cert(),
                        InvalidMaterial::NameNotCovered(name.clone()),
                    ));
                }
            }
        }
        Ok(Some(AcceptedPair {
            id,
            digest,
            entry: Arc::new(PairEntry {
                validity: pair.validity,
                certified: pair.certified,
                served: Arc::new(ServedCert {
                    source: source.label.clone(),
                    path: paths.cert().to_owned(),
                    info: pair.info,
                }),
            }),
        }))
    }

    /// Reads the client-CA bundle and its CRLs; `Ok(None)` when unchanged. Otherwise parses
    /// them and builds the verifier (counted in `parsed`).
    fn pass_ca(
        &self,
        reader: &mut PassReader,
        now: i64,
        parsed: &mut usize,
    ) -> Result<Option<(Digest, AcceptedCa)>> {
        let Some(source) = &self.client_ca else {
            return Ok(None);
        };
        let config = &source.config;
        let bundle_pem = reader.read(&config.path)?;
        let crl_pems = config
            .crls
            .iter()
            .map(|path| reader.read(path))
            .collect::<Result<Vec<_>>>()?;
        let digest =
            digest(std::iter::once(&bundle_pem[..]).chain(crl_pems.iter().map(|c| &c[..])));
        if source.digest == Some(digest) {
            return Ok(None);
        }
        *parsed += 1;
        let mut bundle = ParsedBundle::parse(&config.path, &bundle_pem)?;
        for (path, pem) in config.crls.iter().zip(&crl_pems) {
            bundle.add_crls(path, pem)?;
        }
        policy::crls_issued_by_bundle(&bundle)?;
        policy::may_replace_crls(&bundle, source.current.as_ref().map(|ca| &ca.bundle), now)?;
        let roots = Arc::new(bundle.root_store(&config.path)?);
        let mut verifier =
            WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&self.settings.provider))
                .with_crls(bundle.crls.iter().cloned());
        if config.auth != ClientAuth::Required {
            verifier = verifier.allow_unauthenticated();
        }
        let strict = verifier.build().map_err(|source| Error::BuildVerifier {
            path: config.path.clone(),
            source,
        })?;
        let verifier = match config.auth {
            ClientAuth::Request => Arc::new(identity::RequestVerifier {
                strict: Arc::clone(&strict),
            }) as Arc<dyn ClientCertVerifier>,
            ClientAuth::Required | ClientAuth::Optional => Arc::clone(&strict),
        };
        let served = bundle
            .infos
            .iter()
            .map(|info| {
                Arc::new(ServedCert {
                    source: "client-ca".to_owned(),
                    path: config.path.clone(),
                    info: info.clone(),
                })
            })
            .collect();
        Ok(Some((
            digest,
            AcceptedCa {
                bundle,
                verifier,
                strict,
                served,
            },
        )))
    }

    /// Builds the snapshot that serves `accepted` and `new_ca` on top of `current`, sharing
    /// everything else, and commits them as the material's accepted state.
    fn publish(
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

fn push_unique(ids: &mut Vec<usize>, id: usize) {
    if !ids.contains(&id) {
        ids.push(id);
    }
}

/// SHA-256 over `parts`, each prefixed with its length (so moving bytes between parts changes
/// the digest).
fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// DNS SANs, or the CN when there are none and it looks like a DNS name (as Kubernetes does).
fn certificate_names(info: &CertInfo) -> Vec<String> {
    if !info.dns_names.is_empty() {
        return info.dns_names.clone();
    }
    info.common_name()
        .filter(|cn| {
            !cn.is_empty()
                && cn.parse::<std::net::IpAddr>().is_err()
                && cn
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '*'))
        })
        .map(|cn| vec![cn.to_ascii_lowercase()])
        .unwrap_or_default()
}

impl Material for ServingMaterial {
    type Snapshot = ServingSnapshot;

    fn interest(&self) -> Interest {
        let mut interest = Interest::default();
        for file in self.by_file.keys() {
            interest.add_file(file);
        }
        interest
    }

    /// Reads the marked sources (all at start-up), parses only those whose bytes changed, and
    /// publishes a snapshot that replaces just their entries. A rejected source keeps its last
    /// good entry and is retried; the others' changes are published regardless.
    fn load(
        &mut self,
        current: Option<&ServingSnapshot>,
        dirty: Dirty,
        now: i64,
    ) -> Pass<ServingSnapshot> {
        let todo = self.sources_to_read(&dirty, current.is_none());
        let mut reader = PassReader::new(self.settings.max_file_size);
        let mut pass = Pass {
            snapshot: None,
            newly_served: Vec::new(),
            rejected: None,
            sources_read: todo.len(),
            sources_parsed: 0,
        };
        let mut accepted = Vec::new();
        let mut new_ca = None;
        let mut failing = BTreeSet::new();
        for id in todo {
            let outcome = if id == self.ca_id() {
                self.pass_ca(&mut reader, now, &mut pass.sources_parsed)
                    .map(|ca| new_ca = ca)
            } else {
                self.pass_pair(id, &mut reader, now, &mut pass.sources_parsed)
                    .map(|pair| accepted.extend(pair))
            };
            if let Err(err) = outcome {
                if pass.rejected.is_some() {
                    tracing::debug!(
                        error = &err as &dyn std::error::Error,
                        "another source rejected in the same pass"
                    );
                }
                failing.insert(id);
                pass.rejected.get_or_insert(err);
            }
        }
        self.failing = failing;
        if (current.is_none() && pass.rejected.is_some())
            || (accepted.is_empty() && new_ca.is_none())
        {
            return pass;
        }
        let attempted: Vec<usize> = accepted
            .iter()
            .map(|pair| pair.id)
            .chain(new_ca.as_ref().map(|_| self.ca_id()))
            .collect();
        match self.publish(current, accepted, new_ca, &mut pass.newly_served) {
            Ok(snapshot) => pass.snapshot = Some(snapshot),
            Err(err) => {
                // Nothing was committed: retry every source of the pass, not just the rejected.
                self.failing.extend(attempted);
                pass.newly_served.clear();
                pass.rejected = Some(err);
            }
        }
        pass
    }

    fn served(snapshot: &ServingSnapshot) -> Served {
        snapshot.served.clone()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<ServingSet>();
    check::<Acceptor>();
    let _ = Path::new("");
}
