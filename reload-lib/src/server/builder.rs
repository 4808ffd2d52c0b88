//! [`ServingSetBuilder`]: what a serving set is configured with, and its start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;

use crate::error::Result;
use crate::material::normalize_name;
use crate::reload::{self, Timing};
use crate::source::CertKeyPaths;

use super::auth::ClientAuth;
use super::config::{ClientCaConfig, Configure, SniEntry, SniNames};
use super::material::{ServingMaterial, Settings};
use super::set::ServingSet;

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
    /// See [`ServingSet::builder`].
    pub(super) fn new(default: CertKeyPaths) -> Self {
        Self {
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
    /// its nextUpdate never replaces fresh ones. A reload never undoes a revocation, compared
    /// with every CRL *series* accepted since start-up (one issuer name and key, one
    /// issuingDistributionPoint scope: partitioned CRLs are series of their own):
    /// - no series goes back: a CRL older than the newest of its series accepted so far (a lower
    ///   cRLNumber, or without numbers an earlier thisUpdate) is refused, also when it is not
    ///   its issuer's first CRL, and also after its CA left the bundle and came back;
    /// - no series disappears while its CA is in the bundle, and a CA whose CRLs were checked
    ///   cannot come back without them (restart to stop checking a CA);
    /// - the CRL that came first for an issuer stays first while it is in the bundle: rustls
    ///   checks a certificate without a CRL distribution point against its issuer's first CRL,
    ///   so a new CRL put before it could hide its revocations (list new CRLs after it).
    ///
    /// The history holds every series in force and at most 1,024 others (about 250 bytes each;
    /// the least recently seen go first). Not checked: the order of an issuer's later CRLs,
    /// which matters only for partitions whose distribution points share a URI.
    ///
    /// Otherwise the bundle and its CRLs are rejected together, the rejection is reported
    /// (naming the file) and counted like any failed reload, and the last good ones stay in force. A client whose certificate is revoked is
    /// refused; a change of CRLs replaces the session cache and invalidates tickets (see
    /// [`client_ca`](Self::client_ca)).
    pub fn client_crl(mut self, path: impl Into<PathBuf>) -> Self {
        if let Some(ca) = &mut self.client_ca {
            ca.crls.push(path.into());
        }
        self
    }

    /// The crypto provider (default: aws-lc-rs, loading keys through a key provider that goes
    /// straight to the parser for the key's algorithm, with the same checks). No process-wide
    /// default is needed or installed.
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
    /// network filesystem) is reported in [`Status::last_error`](crate::Status::last_error) as
    /// [`Error::ReadTimeout`](crate::Error::ReadTimeout), and the set keeps serving its last
    /// good material until the pass ends. At start-up,
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
            .unwrap_or_else(|| Arc::new(crate::material::keys::default_provider()));
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

impl ServingSet {
    /// Starts configuring a set whose default pair is `default` (served to clients without SNI
    /// and to names no SNI entry matches). See [`ServingSetBuilder`] for an example.
    pub fn builder(default: CertKeyPaths) -> ServingSetBuilder {
        ServingSetBuilder::new(default)
    }
}
