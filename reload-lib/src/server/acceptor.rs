//! Accepting connections with the snapshot current at each ClientHello.

use std::io;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

use super::ServingSnapshot;

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
}
