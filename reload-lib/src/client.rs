//! The client side: a reloadable trust bundle (for verifying servers) and a reloadable client
//! certificate (for mTLS), behind one `ClientConfig` that never needs rebuilding.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::material::{ParsedBundle, ParsedPair, Validity};
use crate::policy;
use crate::reload::{self, Handle, Material, Pass, Timing};
use crate::source::{CertKeyPaths, PassReader};
use crate::status::{Served, ServedCert, Status};
use crate::watch::{Dirty, Interest};

/// Configures and starts a [`ClientTls`]. Made by [`ClientTls::builder`]; see there for an
/// example.
///
/// Defaults: no client certificate, no ALPN, TLS 1.2 and 1.3 with the aws-lc-rs provider,
/// resync every 60 s.
#[must_use]
#[derive(Debug)]
pub struct ClientTlsBuilder {
    name: String,
    roots: PathBuf,
    identity: Option<CertKeyPaths>,
    provider: Option<Arc<CryptoProvider>>,
    alpn: Vec<Vec<u8>>,
    timing: Timing,
    max_file_size: u64,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::ReloadMetrics>,
}

impl ClientTlsBuilder {
    /// A name for logs and metrics (default `client`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Presents this certificate when a server asks for one (mTLS), reloaded like the roots.
    ///
    /// # Security
    /// The key must match the leaf and the chain must be in order, as for serving pairs; a torn
    /// or invalid pair is rejected and the last good identity keeps being presented.
    pub fn identity(mut self, paths: CertKeyPaths) -> Self {
        self.identity = Some(paths);
        self
    }

    /// The crypto provider (default: aws-lc-rs).
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// ALPN protocols offered, most preferred first (default: none).
    pub fn alpn(mut self, protocols: Vec<Vec<u8>>) -> Self {
        self.alpn = protocols;
        self
    }

    /// Periodic content resync (default 60 s; `None` turns it off).
    pub fn resync_interval(mut self, interval: Option<Duration>) -> Self {
        self.timing.resync = interval;
        self
    }

    /// The largest file read, in bytes (default 4 MiB); see
    /// [`ServingSetBuilder::max_file_size`](crate::ServingSetBuilder::max_file_size).
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// How long one pass of reading and checking may take (default 30 s); see
    /// [`ServingSetBuilder::read_timeout`](crate::ServingSetBuilder::read_timeout).
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.timing.read_timeout = timeout;
        self
    }

    /// Registers the metrics (see [`metrics`](crate::metrics)) in `registry`.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, registry: &mut prometheus_client::registry::Registry) -> Self {
        self.metrics = Some(crate::metrics::ReloadMetrics::register(registry));
        self
    }

    /// Reads and checks the files, arms the watches and spawns the reload task (inside a tokio
    /// runtime).
    ///
    /// # Errors
    /// Any unreadable or invalid file, named in the error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
    /// # std::fs::write(&crt, pair.cert.pem())?;
    /// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
    /// use reload_lib::{ClientTls, InvalidMaterial};
    ///
    /// let empty = dir.path().join("empty-ca.crt");
    /// std::fs::write(&empty, "")?;
    /// let err = ClientTls::builder(&empty).start().await.unwrap_err();
    /// assert_eq!(err.invalid_material(), Some(&InvalidMaterial::Empty));
    /// # Ok(()) }
    /// ```
    pub async fn start(self) -> Result<ClientTls> {
        let provider = self
            .provider
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let material = ClientMaterial {
            roots: self.roots,
            identity: self.identity.clone(),
            provider: Arc::clone(&provider),
            previous_bytes: Vec::new(),
            shortened_seen: None,
            max_file_size: self.max_file_size,
        };
        let handle = Arc::new(reload::start(material, self.timing, self.name.clone()).await?);
        #[cfg(feature = "metrics")]
        if let Some(metrics) = self.metrics {
            metrics.follow(self.name.clone(), handle.status.clone());
        }
        let verifier = Arc::new(ReloadingVerifier {
            current: Arc::clone(&handle.current),
            schemes: provider
                .signature_verification_algorithms
                .supported_schemes(),
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(rustls::ALL_VERSIONS)
            .map_err(|source| Error::BuildConfig {
                what: "client protocol versions".to_owned(),
                source,
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = if self.identity.is_some() {
            builder.with_client_cert_resolver(Arc::new(ReloadingIdentity {
                current: Arc::clone(&handle.current),
            }))
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = self.alpn;
        Ok(ClientTls {
            handle,
            config: Arc::new(config),
        })
    }
}

/// Reloadable TLS material for outbound connections: the CA bundle that server certificates must
/// chain to and, optionally, a client certificate. [`config`](Self::config) returns one
/// `ClientConfig` that always uses the current material, so it can be handed once to
/// tokio-rustls, hyper-rustls or kube.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// # let ca = dir.path().join("ca.crt");
/// # std::fs::write(&ca, pair.cert.pem())?;
/// use reload_lib::{CertKeyPaths, ClientTls};
///
/// // ca.crt: what servers must chain to; tls.crt/tls.key: our certificate for mTLS.
/// let tls = ClientTls::builder(&ca)
///     .identity(CertKeyPaths::new(&crt, &key))
///     .start()
///     .await?;
/// // Build the connector once: its config follows reloads by itself.
/// let connector = tokio_rustls::TlsConnector::from(tls.config());
/// let served = tls.status().served;
/// assert_eq!((served[0].source.as_str(), served[1].source.as_str()), ("identity", "roots"));
/// # drop(connector);
/// # Ok(()) }
/// ```
///
/// [`Acceptor`](crate::Acceptor) shows a full handshake against a [`ServingSet`](crate::ServingSet).
/// # Security
/// Server certificates are verified by rustls' WebPKI verifier built from the current bundle
/// (hostname, chain, validity); verification cannot be turned off through this type. A roots
/// file that is empty or holds an unparsable certificate is rejected and the last good bundle
/// stays in use. Session tickets cached by the config were obtained under older trust and may
/// resume; build a new `ClientConfig` if trust must shrink instantly.
#[derive(Debug, Clone)]
pub struct ClientTls {
    handle: Arc<Handle<ClientSnapshot>>,
    config: Arc<ClientConfig>,
}

impl ClientTls {
    /// Starts configuring with the CA bundle at `roots` (PEM; every `CERTIFICATE` block is a
    /// trust anchor). See the [type-level example](ClientTls).
    pub fn builder(roots: impl Into<PathBuf>) -> ClientTlsBuilder {
        ClientTlsBuilder {
            name: "client".to_owned(),
            roots: roots.into(),
            identity: None,
            provider: None,
            alpn: Vec::new(),
            timing: Timing::default(),
            max_file_size: crate::read::DEFAULT_MAX_FILE_SIZE,
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    /// The client configuration; it follows reloads by itself, so hand it once to tokio-rustls,
    /// hyper-rustls or kube.
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    /// Status updates, as for servers (see [`ServingSet::subscribe`](crate::ServingSet::subscribe)).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.handle.status.clone()
    }

    /// The latest status.
    pub fn status(&self) -> Status {
        self.handle.status.borrow().clone()
    }

    /// Re-reads the files now; `Ok(true)` when new material was published.
    ///
    /// # Errors
    /// Why the files were rejected (the last good material stays in use).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
    /// # std::fs::write(&crt, pair.cert.pem())?;
    /// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
    /// use reload_lib::{ClientTls, InvalidMaterial, fs::write_file_atomic};
    ///
    /// // tls.crt is the roots file here.
    /// let tls = ClientTls::builder(&crt).start().await?;
    /// write_file_atomic(&crt, b"-----BEGIN CERTIFICATE-----\nnot base64\n", 0o644)?;
    /// let err = tls.reload().await.unwrap_err();
    /// assert!(matches!(err.invalid_material(), Some(InvalidMaterial::Pem(_))));
    /// assert_eq!(tls.status().generation, 1); // the old roots still verify servers
    /// # Ok(()) }
    /// ```
    pub async fn reload(&self) -> Result<bool> {
        self.handle.reload().await
    }
}

/// The key inside `identity` never reaches Debug output.
struct ClientSnapshot {
    verifier: Arc<WebPkiServerVerifier>,
    identity: Option<Arc<CertifiedKey>>,
    /// When the identity's whole chain is valid (for the may-replace rules).
    identity_validity: Option<Validity>,
    served: Served,
}

impl std::fmt::Debug for ClientSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSnapshot")
            .field("served", &self.served)
            .finish_non_exhaustive()
    }
}

struct ClientMaterial {
    roots: PathBuf,
    identity: Option<CertKeyPaths>,
    provider: Arc<CryptoProvider>,
    previous_bytes: Vec<Vec<u8>>,
    /// Files refused once as a shortened identity chain: read again unchanged, they are settled.
    shortened_seen: Option<Vec<Vec<u8>>>,
    max_file_size: u64,
}

impl Material for ClientMaterial {
    type Snapshot = ClientSnapshot;

    fn interest(&self) -> Interest {
        let mut interest = Interest::default();
        interest.add_file(&self.roots);
        if let Some(identity) = &self.identity {
            interest.add_file(identity.cert());
            interest.add_file(identity.key());
        }
        interest
    }

    /// The roots and the identity are one unit, re-read together on any change.
    fn load(
        &mut self,
        current: Option<&ClientSnapshot>,
        _dirty: Dirty,
        now: i64,
    ) -> Pass<ClientSnapshot> {
        let sources = 1 + usize::from(self.identity.is_some());
        let mut reader = PassReader::new(self.max_file_size);
        let loaded = self.load_all(&mut reader, current, now);
        let mut pass = match loaded {
            Ok(snapshot) => {
                // A handful of certificates: compare with what was served.
                let was_served = |cert: &ServedCert| {
                    current.is_some_and(|current| {
                        current.served.iter().any(|old| {
                            old.source == cert.source && old.info.sha256 == cert.info.sha256
                        })
                    })
                };
                let newly_served = snapshot
                    .iter()
                    .flat_map(|s| s.served.iter_shared())
                    .filter(|cert| !was_served(cert))
                    .cloned()
                    .collect();
                Pass {
                    snapshot,
                    newly_served,
                    rejected: None,
                    sources_read: sources,
                    sources_parsed: sources,
                    symlinks: Vec::new(),
                }
            }
            Err(err) => Pass::failed(err, sources),
        };
        pass.symlinks = reader.into_symlinks();
        pass
    }

    fn served(snapshot: &ClientSnapshot) -> Served {
        snapshot.served.clone()
    }
}

impl ClientMaterial {
    fn load_all(
        &mut self,
        pass: &mut PassReader,
        current: Option<&ClientSnapshot>,
        now: i64,
    ) -> Result<Option<ClientSnapshot>> {
        let mut bytes = vec![pass.read(&self.roots)?];
        if let Some(identity) = &self.identity {
            bytes.push(pass.read(identity.cert())?);
            bytes.push(if identity.key() == identity.cert() {
                bytes[1].clone()
            } else {
                pass.read(identity.key())?
            });
        }
        if current.is_some() && bytes == self.previous_bytes {
            return Ok(None);
        }
        let bundle = ParsedBundle::parse(&self.roots, &bytes[0])?;
        let roots = Arc::new(bundle.root_store(&self.roots)?);
        let verifier =
            WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&self.provider))
                .build()
                .map_err(|source| Error::BuildServerVerifier {
                    path: self.roots.clone(),
                    source,
                })?;
        let mut served: Vec<ServedCert> = bundle
            .infos
            .iter()
            .map(|info| ServedCert {
                source: "roots".to_owned(),
                path: self.roots.clone(),
                info: info.clone(),
            })
            .collect();
        let mut identity_validity = None;
        let identity = match &self.identity {
            Some(paths) => {
                let pair = ParsedPair::parse(
                    paths.cert(),
                    &bytes[1],
                    paths.key(),
                    &bytes[2],
                    &self.provider,
                )?;
                // The rules a server applies to its serving pairs.
                policy::may_replace_chain(
                    paths.cert(),
                    pair.validity,
                    current.and_then(|c| c.identity_validity),
                    now,
                )?;
                if let Some(served) = current.and_then(|c| c.identity.as_ref()) {
                    let stable = self.shortened_seen.as_ref() == Some(&bytes);
                    if let Err(err) = policy::may_shorten_chain(
                        paths.cert(),
                        &pair.certified.cert,
                        &served.cert,
                        stable,
                    ) {
                        self.shortened_seen = Some(bytes);
                        return Err(err);
                    }
                }
                identity_validity = Some(pair.validity);
                served.insert(
                    0,
                    ServedCert {
                        source: "identity".to_owned(),
                        path: paths.cert().to_owned(),
                        info: pair.info.clone(),
                    },
                );
                Some(pair.certified)
            }
            None => None,
        };
        self.previous_bytes = bytes;
        Ok(Some(ClientSnapshot {
            verifier,
            identity,
            identity_validity,
            served: served.into_iter().collect(),
        }))
    }
}

/// Presents the current client certificate.
#[derive(Debug)]
struct ReloadingIdentity {
    current: Arc<ArcSwap<ClientSnapshot>>,
}

impl ResolvesClientCert for ReloadingIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current.load().identity.clone()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Verifies servers against the current bundle: one `ArcSwap` load per call, no file I/O.
#[derive(Debug)]
struct ReloadingVerifier {
    current: Arc<ArcSwap<ClientSnapshot>>,
    schemes: Vec<SignatureScheme>,
}

impl ServerCertVerifier for ReloadingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.current.load().verifier.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}
