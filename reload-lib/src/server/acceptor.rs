//! Accepting connections with the snapshot current at each ClientHello.

use std::io;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

use super::identity::ClientIdentity;
use super::snapshot::ServingSnapshot;

/// Accepts TLS connections for a [`ServingSet`](super::ServingSet).
///
/// Each connection reads the ClientHello first, then takes the snapshot current at that moment:
/// its certificate map, client-CA verifier and session cache come from the same reload. A reload
/// never touches connections already accepted. Cheap to clone; keeps the set's reload task alive.
///
/// A real handshake on 127.0.0.1, with a [`ClientTls`](crate::ClientTls) client that trusts the
/// server's self-signed certificate:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["localhost".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, ClientTls, ServingSet};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
/// let acceptor = set.acceptor();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// let server = tokio::spawn(async move {
///     let (tcp, _) = listener.accept().await?;
///     let handshake = acceptor.accept(tcp);
///     let mut tls = tokio::time::timeout(std::time::Duration::from_secs(10), handshake).await??;
///     tls.write_all(b"hello").await?;
///     tls.shutdown().await
/// });
///
/// let client = ClientTls::builder(&crt).start().await?;
/// let tcp = tokio::net::TcpStream::connect(addr).await?;
/// let connector = tokio_rustls::TlsConnector::from(client.config());
/// let mut tls = connector.connect("localhost".try_into()?, tcp).await?;
/// let mut reply = String::new();
/// tls.read_to_string(&mut reply).await?;
/// assert_eq!(reply, "hello");
/// # server.await??;
/// # Ok(()) }
/// ```
///
/// # Security
/// The handshake is rustls': the certificate offered is chosen from the snapshot by SNI, client
/// certificates are verified as configured on the set ([`ClientAuth`](crate::ClientAuth)), and
/// the snapshot always holds material that passed the set's checks.
#[derive(Clone)]
pub struct Acceptor {
    pub(crate) current: Arc<ArcSwap<ServingSnapshot>>,
    pub(crate) _keepalive: Arc<dyn Send + Sync>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("generation", &self.current.load().generation)
            .finish_non_exhaustive()
    }
}

impl Acceptor {
    /// Runs the TLS handshake on `io`.
    ///
    /// Put a timeout around it (as the [type-level example](Acceptor) does): a client that never
    /// finishes its ClientHello would otherwise hold the task.
    ///
    /// # Errors
    /// The I/O or TLS error that ended the handshake.
    pub async fn accept<IO>(&self, io: IO) -> io::Result<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
        let config = Arc::clone(&self.current.load().config);
        start.into_stream(config).await
    }

    /// Runs the TLS handshake on `io` and says what the client's certificate proved, checked
    /// against the client-CA bundle of the snapshot that served the handshake. With
    /// [`ClientAuth::Request`](crate::ClientAuth::Request) the handshake completes whatever the
    /// client presents, so the application can fall back to another credential (a bearer token)
    /// or answer 401, as kube-apiserver does, instead of dropping the connection:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let server = rcgen::generate_simple_self_signed(["localhost".to_owned()])?;
    /// # std::fs::write(&crt, server.cert.pem())?;
    /// # std::fs::write(&key, server.signing_key.serialize_pem())?;
    /// # let ca_key = rcgen::KeyPair::generate()?;
    /// # let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    /// # ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    /// # ca_params.distinguished_name.push(rcgen::DnType::CommonName, "client-ca");
    /// # let client_ca = dir.path().join("client-ca.crt");
    /// # std::fs::write(&client_ca, ca_params.self_signed(&ca_key)?.pem())?;
    /// # let issuer = rcgen::Issuer::new(ca_params, ca_key);
    /// # let client_cert = |days_left: i64| -> Result<_, Box<dyn std::error::Error>> {
    /// #     let key = rcgen::KeyPair::generate()?;
    /// #     let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    /// #     params.distinguished_name.push(rcgen::DnType::CommonName, "system:admin");
    /// #     params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    /// #     let now = time::OffsetDateTime::now_utc();
    /// #     params.not_before = now - time::Duration::days(60);
    /// #     params.not_after = now + time::Duration::days(days_left);
    /// #     let cert: CertificateDer<'static> = params.signed_by(&key, &issuer)?.der().clone();
    /// #     let key = PrivateKeyDer::try_from(key.serialize_der())?;
    /// #     let mut roots = rustls::RootCertStore::empty();
    /// #     roots.add(server.cert.der().clone())?;
    /// #     let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    /// #     Ok(rustls::ClientConfig::builder_with_provider(provider)
    /// #         .with_safe_default_protocol_versions()?
    /// #         .with_root_certificates(roots)
    /// #         .with_client_auth_cert(vec![cert], key)?)
    /// # };
    /// use reload_lib::{CertKeyPaths, ClientAuth, ClientIdentity, ServingSet};
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// // client-ca.crt: the CA that issues client certificates (CN=system:admin here).
    /// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
    ///     .client_ca(&client_ca, ClientAuth::Request)
    ///     .start()
    ///     .await?;
    /// let acceptor = set.acceptor();
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    ///
    /// // `client_cert(days)`: a client config presenting a certificate from that CA that expires
    /// // in `days` days (negative: expired).
    /// for days_left in [-1, 30] {
    ///     let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client_cert(days_left)?));
    ///     let client = tokio::spawn(async move {
    ///         let tcp = tokio::net::TcpStream::connect(addr).await?;
    ///         let mut tls = connector.connect("localhost".try_into().unwrap(), tcp).await?;
    ///         let mut reply = Vec::new();
    ///         tls.read_to_end(&mut reply).await?;
    ///         Ok::<_, std::io::Error>(reply)
    ///     });
    ///     let (tcp, _) = listener.accept().await?;
    ///     // The handshake completes even for the expired certificate.
    ///     let (mut tls, identity) = acceptor.accept_with_identity(tcp).await?;
    ///     let answer = match identity {
    ///         ClientIdentity::Verified(leaf) => format!("200 {}", leaf.subject),
    ///         ClientIdentity::Rejected { reason, .. } => format!("401 {reason}"), // or try a token
    ///         ClientIdentity::Anonymous | _ => "401 no credentials".to_owned(),
    ///     };
    ///     tls.write_all(answer.as_bytes()).await?;
    ///     tls.shutdown().await?;
    ///     let reply = String::from_utf8(client.await??)?;
    ///     if days_left < 0 {
    ///         assert!(reply.starts_with("401") && reply.contains("expired"), "{reply}");
    ///     } else {
    ///         assert_eq!(reply, "200 CN=system:admin");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// With [`Required`](crate::ClientAuth::Required) or
    /// [`Optional`](crate::ClientAuth::Optional) an invalid certificate ends the handshake, so
    /// the identity is `Verified` or `Anonymous`; without a client-CA bundle it is `Anonymous`.
    /// The check runs at the end of every handshake, resumed ones included, against the trust in
    /// force for that handshake.
    ///
    /// # Errors
    /// The I/O or TLS error that ended the handshake.
    pub async fn accept_with_identity<IO>(
        &self,
        io: IO,
    ) -> io::Result<(TlsStream<IO>, ClientIdentity)>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
        let snapshot = self.current.load_full();
        let tls = start.into_stream(Arc::clone(&snapshot.config)).await?;
        let identity = snapshot.client_identity(tls.get_ref().1.peer_certificates());
        Ok((tls, identity))
    }
}
