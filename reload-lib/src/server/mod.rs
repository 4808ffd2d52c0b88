//! Serving: a default certificate, SNI certificates and an optional client-CA bundle, reloaded
//! from files and published together as one immutable snapshot.

mod acceptor;
mod resolver;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ServerSessionMemoryCache, StoresServerSessions, WebPkiClientVerifier};
use tokio::sync::watch;

use crate::error::{Error, InvalidMaterial, Result};
use crate::material::{CertInfo, ParsedBundle, ParsedPair, covers, normalize_name};
use crate::reload::{self, Handle, Material, ServedCert, Status, Timing};
use crate::source::{CertKeyPaths, PassReader};
use crate::watch::{Interest, WatchMode};

pub use acceptor::Acceptor;
use resolver::SniResolver;

/// Whether and how clients present certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientAuth {
    /// Every client must present a certificate that chains to the bundle.
    Required,
    /// Clients may present a certificate; if they do, it must chain to the bundle. The
    /// application decides what an anonymous client may do.
    Optional,
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
/// Defaults: no SNI pairs, no client certificates, ALPN `h2` then `http/1.1`, TLS 1.2 and 1.3
/// with the aws-lc-rs provider, resync every 60 s, polling every 1 s when inotify is unavailable.
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
    pub fn sni_from_certificate(mut self, paths: CertKeyPaths) -> Self {
        self.sni.push(SniEntry {
            names: SniNames::FromCertificate,
            paths,
        });
        self
    }

    /// Verifies client certificates against the CA bundle at `path` (reloaded like the rest).
    pub fn client_ca(mut self, path: impl Into<PathBuf>, auth: ClientAuth) -> Self {
        self.client_ca = Some(ClientCaConfig {
            path: path.into(),
            crls: Vec::new(),
            auth,
        });
        self
    }

    /// Adds a file of CRLs (PEM `X509 CRL` blocks) checked with the client CA bundle. Ignored
    /// without [`client_ca`](Self::client_ca).
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
    /// e.g. to set `max_early_data_size`. Do not replace `cert_resolver`.
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
    /// tokio runtime.
    ///
    /// # Errors
    /// Fails closed: any unreadable or invalid file at start-up is an error naming the file.
    /// Expired certificates are accepted at start-up (with a warning), since nothing better
    /// exists.
    pub async fn start(self) -> Result<ServingSet> {
        let provider = self
            .provider
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let material = ServingMaterial {
            default: self.default,
            sni: self.sni,
            client_ca: self.client_ca,
            provider,
            alpn: self.alpn,
            configure: self.configure,
            session_cache_size: self.session_cache_size,
            previous_bytes: Vec::new(),
        };
        let handle = reload::start(material, self.timing, self.name.clone())?;
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
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use reload_lib::{CertKeyPaths, ServingSet};
///
/// let set = ServingSet::builder(CertKeyPaths::new("/etc/tls/tls.crt", "/etc/tls/tls.key"))
///     .sni("localhost-recovery", CertKeyPaths::new("/etc/recovery/tls.crt", "/etc/recovery/tls.key"))
///     .start()
///     .await?;
/// let acceptor = set.acceptor();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await?;
/// loop {
///     let (tcp, _) = listener.accept().await?;
///     let acceptor = acceptor.clone();
///     tokio::spawn(async move {
///         if let Ok(tls) = acceptor.accept(tcp).await {
///             // serve HTTP over `tls`
/// #           drop(tls);
///         }
///     });
/// }
/// # }
/// ```
///
/// # Recovery
/// Changes are picked up from inotify directory watches (kubelet `..data` swaps, rename into
/// place, in-place writes, directories deleted and recreated, queue overflow), from a periodic
/// resync, from [`reload`](Self::reload) and from SIGHUP (see
/// [`reload_on_sighup`](Self::reload_on_sighup)). Rejected material leaves the last good snapshot
/// in place; the reload is retried shortly after, and again on the next event.
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
    /// and to names no SNI entry matches).
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
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    /// An acceptor for incoming connections.
    pub fn acceptor(&self) -> Acceptor {
        Acceptor {
            current: Arc::clone(&self.handle.current),
            _keepalive: Arc::clone(&self.handle) as Arc<dyn Send + Sync>,
        }
    }

    /// The snapshot served now.
    pub fn current(&self) -> Arc<ServingSnapshot> {
        self.handle.current.load_full()
    }

    /// The `ServerConfig` served now, for callers with their own accept loop
    /// (`TlsAcceptor::from(set.server_config())` per connection).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.handle.current.load().config)
    }

    /// Status updates: a new value after every published snapshot and every rejection.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.handle.status.clone()
    }

    /// The latest status.
    pub fn status(&self) -> Status {
        self.handle.status.borrow().clone()
    }

    /// Whether changes are seen through inotify or by polling.
    pub fn watch_mode(&self) -> &WatchMode {
        &self.handle.mode
    }

    /// Re-reads every file now and waits for the outcome: `Ok(true)` when a new snapshot was
    /// published, `Ok(false)` when the files hold what is served.
    ///
    /// # Errors
    /// Why the files were rejected (the last good material keeps serving).
    pub async fn reload(&self) -> Result<bool> {
        self.handle.reload().await
    }

    /// Schedules a reload without waiting for it.
    pub fn trigger_reload(&self) {
        self.handle.trigger();
    }

    /// Spawns a task that triggers a reload on every SIGHUP, for as long as the set lives.
    ///
    /// # Errors
    /// When the signal handler cannot be installed.
    pub fn reload_on_sighup(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        let set = Arc::downgrade(&self.handle);
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let Some(handle) = set.upgrade() else { return };
                tracing::info!("SIGHUP: reloading");
                handle.trigger();
            }
        });
        Ok(())
    }
}

/// One published state of a [`ServingSet`]: immutable, shared by every handshake that starts
/// while it is current.
pub struct ServingSnapshot {
    /// Increases by one with every swap.
    pub generation: u64,
    config: Arc<ServerConfig>,
    resolver: Arc<SniResolver>,
    infos: Vec<CertInfo>,
    sources: Vec<(String, PathBuf)>,
    client_ca: Option<(PathBuf, ParsedBundle)>,
    session_storage: Arc<dyn StoresServerSessions>,
}

impl std::fmt::Debug for ServingSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingSnapshot")
            .field("generation", &self.generation)
            .field("sources", &self.sources)
            .finish_non_exhaustive()
    }
}

impl ServingSnapshot {
    /// The certificate served to a client asking for `server_name` (`None`: no SNI).
    pub fn certificate_for(&self, server_name: Option<&str>) -> &CertInfo {
        let name = server_name.map(normalize_name);
        &self.infos[self.resolver.select(name.as_deref())]
    }

    /// The `ServerConfig` of this snapshot.
    pub fn server_config(&self) -> &Arc<ServerConfig> {
        &self.config
    }
}

/// Everything the reloader reads for a serving set, and what it read last.
struct ServingMaterial {
    default: CertKeyPaths,
    sni: Vec<SniEntry>,
    client_ca: Option<ClientCaConfig>,
    provider: Arc<CryptoProvider>,
    alpn: Vec<Vec<u8>>,
    configure: Option<Configure>,
    session_cache_size: usize,
    /// The bytes of every file the published snapshot was built from, in read order.
    previous_bytes: Vec<Vec<u8>>,
}

/// Files read in one pass, in a fixed order.
struct Read {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    ca: Option<(Vec<u8>, Vec<Vec<u8>>)>,
}

impl Read {
    fn flatten(&self) -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        for (cert, key) in &self.pairs {
            all.push(cert.clone());
            all.push(key.clone());
        }
        if let Some((ca, crls)) = &self.ca {
            all.push(ca.clone());
            all.extend(crls.iter().cloned());
        }
        all
    }
}

impl ServingMaterial {
    fn all_pairs(&self) -> impl Iterator<Item = &CertKeyPaths> {
        std::iter::once(&self.default).chain(self.sni.iter().map(|e| &e.paths))
    }

    fn read(&self) -> Result<Read> {
        let mut pass = PassReader::default();
        let mut pairs = Vec::new();
        for paths in self.all_pairs() {
            let cert = pass.read(paths.cert())?;
            let key = if paths.key() == paths.cert() {
                cert.clone()
            } else {
                pass.read(paths.key())?
            };
            pairs.push((cert, key));
        }
        let ca = match &self.client_ca {
            Some(ca) => {
                let bundle = pass.read(&ca.path)?;
                let crls = ca
                    .crls
                    .iter()
                    .map(|p| pass.read(p))
                    .collect::<Result<_>>()?;
                Some((bundle, crls))
            }
            None => None,
        };
        Ok(Read { pairs, ca })
    }

    fn build(
        &self,
        read: &Read,
        current: Option<&ServingSnapshot>,
        now: i64,
    ) -> Result<ServingSnapshot> {
        let mut parsed = Vec::with_capacity(read.pairs.len());
        for (index, (paths, (cert, key))) in self.all_pairs().zip(&read.pairs).enumerate() {
            let pair = ParsedPair::parse(paths.cert(), cert, paths.key(), key, &self.provider)?;
            // Never trade a valid certificate for an expired one.
            if pair.info.is_expired_at(now)
                && let Some(current) = current
                && !current.infos[index].is_expired_at(now)
            {
                return Err(Error::invalid(
                    paths.cert(),
                    InvalidMaterial::Expired {
                        not_after: pair.info.not_after_rfc3339(),
                    },
                ));
            }
            parsed.push(pair);
        }
        let resolver = self.resolver(&parsed)?;

        let client_ca = match (&self.client_ca, &read.ca) {
            (Some(config), Some((bundle, crls))) => {
                let mut parsed = ParsedBundle::parse(&config.path, bundle)?;
                for (path, pem) in config.crls.iter().zip(crls) {
                    parsed.add_crls(path, pem)?;
                }
                Some((config, parsed))
            }
            _ => None,
        };

        // Keep the session cache unless trust shrank: resumption then survives serving-cert
        // rotations, while sessions authenticated under a removed CA cannot resume.
        let keep_sessions = match (current.and_then(|c| c.client_ca.as_ref()), &client_ca) {
            (Some((_, old)), Some((_, new))) => old.is_subset_of(new),
            (None, None) => true,
            _ => false,
        };
        let session_storage = match current {
            Some(current) if keep_sessions => Arc::clone(&current.session_storage),
            _ => ServerSessionMemoryCache::new(self.session_cache_size)
                as Arc<dyn StoresServerSessions>,
        };

        let builder = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_protocol_versions(rustls::ALL_VERSIONS)
            .map_err(|source| Error::BuildConfig {
                what: "protocol versions".to_owned(),
                source,
            })?;
        let resolver = Arc::new(resolver);
        let mut config = match &client_ca {
            Some((ca, bundle)) => {
                let roots = Arc::new(bundle.root_store(&ca.path)?);
                let mut verifier =
                    WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&self.provider))
                        .with_crls(bundle.crls.iter().cloned());
                if ca.auth == ClientAuth::Optional {
                    verifier = verifier.allow_unauthenticated();
                }
                let verifier = verifier.build().map_err(|source| Error::BuildVerifier {
                    path: ca.path.clone(),
                    source,
                })?;
                builder
                    .with_client_cert_verifier(verifier)
                    .with_cert_resolver(
                        Arc::clone(&resolver) as Arc<dyn rustls::server::ResolvesServerCert>
                    )
            }
            None => builder.with_no_client_auth().with_cert_resolver(
                Arc::clone(&resolver) as Arc<dyn rustls::server::ResolvesServerCert>
            ),
        };
        config.alpn_protocols = self.alpn.clone();
        config.session_storage = Arc::clone(&session_storage);
        if let Some(configure) = &self.configure {
            configure(&mut config);
        }

        let mut sources = vec![("default".to_owned(), self.default.cert().to_owned())];
        for entry in &self.sni {
            let label = match &entry.names {
                SniNames::Explicit(names) => format!("sni:{}", names.join(",")),
                SniNames::FromCertificate => "sni:from-certificate".to_owned(),
            };
            sources.push((label, entry.paths.cert().to_owned()));
        }
        Ok(ServingSnapshot {
            generation: current.map_or(1, |c| c.generation + 1),
            config: Arc::new(config),
            resolver,
            infos: parsed.into_iter().map(|p| p.info).collect(),
            sources,
            client_ca: client_ca.map(|(config, bundle)| (config.path.clone(), bundle)),
            session_storage,
        })
    }

    /// Builds the name map. Precedence: configured names in configuration order, then names from
    /// certificates in configuration order, then the default pair's own names; the first claim of
    /// a name wins.
    fn resolver(&self, parsed: &[ParsedPair]) -> Result<SniResolver> {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        let mut claim = |name: &str, index: usize| {
            let name = normalize_name(name);
            let (map, key) = match name.strip_prefix("*.") {
                Some(parent) => (&mut wildcard, parent.to_owned()),
                None => (&mut exact, name),
            };
            map.entry(key).or_insert(index);
        };
        for (offset, entry) in self.sni.iter().enumerate() {
            if let SniNames::Explicit(names) = &entry.names {
                let pair = &parsed[offset + 1];
                for name in names {
                    if !pair.info.dns_names.iter().any(|dns| covers(dns, name)) {
                        return Err(Error::invalid(
                            entry.paths.cert(),
                            InvalidMaterial::NameNotCovered(name.clone()),
                        ));
                    }
                    claim(name, offset + 1);
                }
            }
        }
        for (offset, entry) in self.sni.iter().enumerate() {
            if let SniNames::FromCertificate = entry.names {
                for name in certificate_names(&parsed[offset + 1].info) {
                    claim(&name, offset + 1);
                }
            }
        }
        for name in certificate_names(&parsed[0].info) {
            claim(&name, 0);
        }
        Ok(SniResolver {
            default: 0,
            exact,
            wildcard,
            pairs: parsed.iter().map(|p| Arc::clone(&p.certified)).collect(),
        })
    }
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
        for paths in self.all_pairs() {
            interest.add_file(paths.cert());
            interest.add_file(paths.key());
        }
        if let Some(ca) = &self.client_ca {
            interest.add_file(&ca.path);
            for crl in &ca.crls {
                interest.add_file(crl);
            }
        }
        interest
    }

    fn load(
        &mut self,
        current: Option<&ServingSnapshot>,
        now: i64,
    ) -> Result<Option<ServingSnapshot>> {
        let read = self.read()?;
        let bytes = read.flatten();
        if current.is_some() && bytes == self.previous_bytes {
            return Ok(None);
        }
        let snapshot = self.build(&read, current, now)?;
        self.previous_bytes = bytes;
        Ok(Some(snapshot))
    }

    fn describe(snapshot: &ServingSnapshot) -> Vec<ServedCert> {
        let mut served: Vec<ServedCert> = snapshot
            .sources
            .iter()
            .zip(&snapshot.infos)
            .map(|((source, path), info)| ServedCert {
                source: source.clone(),
                path: path.clone(),
                info: info.clone(),
            })
            .collect();
        if let Some((path, bundle)) = &snapshot.client_ca {
            served.extend(bundle.infos.iter().map(|info| ServedCert {
                source: "client-ca".to_owned(),
                path: path.clone(),
                info: info.clone(),
            }));
        }
        served
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<ServingSet>();
    check::<Acceptor>();
    let _ = Path::new("");
}
