//! Whether and how the server asks clients for a certificate. A leaf of `server`.

#[cfg(doc)]
use super::Acceptor;

/// Whether and how clients present certificates. Used with [`ServingSetBuilder::client_ca`](crate::ServingSetBuilder::client_ca).
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
