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
    /// Put a timeout around it: a client that never finishes its ClientHello would otherwise hold
    /// the task.
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
