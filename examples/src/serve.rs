//! The HTTPS accept loop shared by the example servers: TLS through a reload-lib
//! [`Acceptor`](reload_lib::Acceptor), HTTP/1.1 and HTTP/2 through hyper-util, a handshake
//! timeout, and graceful shutdown; and [`serve_https_per_thread`], the same loop on several
//! threads, each with its own listener and single-threaded runtime (the shape of nginx's worker
//! processes).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use rustls_pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::coalesce;

/// The response body type of every handler: boxed, so streaming (watch) and full bodies mix.
pub type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A full body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// What a handler knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The SNI name the client asked for.
    pub server_name: Option<String>,
    /// The client's certificate chain (leaf first), empty when it sent none.
    pub peer_certs: Vec<CertificateDer<'static>>,
}

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may take to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS side of a listener: reloading (the point of this project) or a fixed `ServerConfig`
/// (the baseline our overhead is measured against).
#[derive(Clone)]
pub enum Tls {
    /// A reload-lib acceptor: each connection takes the snapshot current at its ClientHello.
    Reloading(reload_lib::Acceptor),
    /// A plain tokio-rustls acceptor over one never-changing `ServerConfig`.
    Static(tokio_rustls::TlsAcceptor),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tls::Reloading(acceptor) => acceptor.fmt(f),
            Tls::Static(_) => f.write_str("Static"),
        }
    }
}

impl From<reload_lib::Acceptor> for Tls {
    fn from(acceptor: reload_lib::Acceptor) -> Self {
        Tls::Reloading(acceptor)
    }
}

impl Tls {
    async fn accept<IO>(&self, io: IO) -> std::io::Result<tokio_rustls::server::TlsStream<IO>>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        match self {
            Tls::Reloading(acceptor) => acceptor.accept(io).await,
            Tls::Static(acceptor) => acceptor.accept(io).await,
        }
    }
}

/// Accepts connections on `listener` until `shutdown` is cancelled, then drains open connections
/// (up to 10 s). Every connection takes the TLS snapshot current at its ClientHello.
pub async fn serve_https<H, Fut>(
    listener: TcpListener,
    acceptor: impl Into<Tls>,
    handler: H,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    H: Fn(Arc<ConnInfo>, http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<Body>> + Send + 'static,
{
    let acceptor: Tls = acceptor.into();
    let graceful = GracefulShutdown::new();
    // Linux copies TCP_NODELAY from a listening socket to the connections it accepts.
    let inherits_nodelay = socket2::SockRef::from(&listener)
        .tcp_nodelay()
        .unwrap_or(false);
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if !inherits_nodelay {
            let _ = tcp.set_nodelay(true);
        }
        // What TLS and HTTP write during one poll of the task leaves in one send, the last
        // bytes with the FIN (see `coalesce`).
        let (tcp, send) = coalesce::coalesced(tcp);
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        let watcher = graceful.watcher();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let connection = std::pin::pin!(serve_connection(
                tcp, remote, acceptor, handler, watcher, shutdown
            ));
            send.wrap(connection).await
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain timeout; closing them");
    }
    Ok(())
}

/// `count` listeners on one address, bound with `SO_REUSEPORT` so the kernel spreads incoming
/// connections over them (by a hash of the connection's addresses), each to be served by its own
/// thread ([`serve_https_per_thread`]). Port 0 picks a free port for the first and binds the
/// others to the same one. Linux only lets sockets of the same user join the group; note that a
/// second server of that user started on the same port joins it too instead of failing. With
/// `count` 1 there is no group: the bind is exclusive, as `TcpListener::bind`'s.
///
/// Must be called inside a tokio runtime; the listeners come back as std listeners,
/// non-blocking, to be registered with the runtime of the thread that serves each.
pub fn reuseport_listeners(
    addr: SocketAddr,
    count: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut listeners: Vec<std::net::TcpListener> = Vec::with_capacity(count.max(1));
    let mut addr = addr;
    for _ in 0..count.max(1) {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As `TcpListener::bind` does: a restarted server can bind while old connections of
        // the previous one are in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        if count > 1 {
            socket.set_reuseport(true)?;
        }
        // Accepted connections inherit it (Linux): no `setsockopt` per connection.
        socket.set_nodelay(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(1024)?;
        addr = listener.local_addr()?;
        listeners.push(listener.into_std()?);
    }
    Ok(listeners)
}

/// [`serve_https`] on every listener (see [`reuseport_listeners`]), each on a thread of its own
/// with a current-thread runtime: a connection lives on the thread that accepted it, from the
/// `accept` to the `close`, so no connection wakes another thread (no cross-thread task
/// hand-off, no work stealing, no futex wake-up). Background work (certificate reloading,
/// signals, metrics) stays on the caller's runtime.
///
/// Returns when every thread has drained after `shutdown`; when one thread fails (its runtime
/// cannot start) or panics, `shutdown` is cancelled so the others drain too, and the first error
/// is returned.
pub async fn serve_https_per_thread<H, Fut>(
    listeners: Vec<std::net::TcpListener>,
    acceptor: impl Into<Tls>,
    handler: H,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    H: Fn(Arc<ConnInfo>, http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<Body>> + Send + 'static,
{
    let acceptor: Tls = acceptor.into();
    let (report, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let mut threads = Vec::with_capacity(listeners.len());
    for (index, listener) in listeners.into_iter().enumerate() {
        let (acceptor, handler) = (acceptor.clone(), handler.clone());
        let (stop, report_to) = (shutdown.clone(), report.clone());
        let thread = std::thread::Builder::new()
            .name(format!("https-{index}"))
            .spawn(move || {
                let serve = move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async move {
                        let listener = TcpListener::from_std(listener)?;
                        serve_https(listener, acceptor, handler, stop).await
                    })
                };
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(serve))
                    .unwrap_or_else(|_| {
                        Err(std::io::Error::other(format!(
                            "server thread {index} panicked"
                        )))
                    });
                let _ = report_to.send(outcome);
            });
        match thread {
            Ok(thread) => threads.push(thread),
            Err(err) => {
                shutdown.cancel();
                let _ = report.send(Err(err));
            }
        }
    }
    drop(report);
    // Every thread reports once; the first failure stops the others.
    let mut first_error = None;
    while let Some(outcome) = reports.recv().await {
        if let Err(err) = outcome {
            shutdown.cancel();
            first_error.get_or_insert(err);
        }
    }
    for thread in threads {
        // Each has reported: it is returning.
        let _ = thread.join();
    }
    first_error.map_or(Ok(()), Err)
}

/// One connection: the TLS handshake (within [`HANDSHAKE_TIMEOUT`]), then HTTP/1.1 or HTTP/2
/// until the client or a graceful shutdown ends it. A shutdown that begins during the handshake
/// drops the connection (no request has arrived yet, so nothing is cut short), rather than
/// holding the drain for up to the handshake timeout.
async fn serve_connection<H, Fut>(
    tcp: coalesce::CoalescedStream,
    remote: SocketAddr,
    acceptor: Tls,
    handler: H,
    watcher: hyper_util::server::graceful::Watcher,
    shutdown: CancellationToken,
) where
    H: Fn(Arc<ConnInfo>, http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<Body>> + Send + 'static,
{
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
    let tls = tokio::select! {
        handshake = handshake => match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => {
                tracing::debug!(%remote, error = %err, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%remote, "TLS handshake timed out");
                return;
            }
        },
        () = shutdown.cancelled() => {
            tracing::debug!(%remote, "shutting down: connection dropped during its TLS handshake");
            return;
        }
    };
    let (_, conn) = tls.get_ref();
    let info = Arc::new(ConnInfo {
        remote,
        server_name: conn.server_name().map(str::to_owned),
        peer_certs: conn
            .peer_certificates()
            .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    });
    let service = hyper::service::service_fn(move |request| {
        let response = handler(Arc::clone(&info), request);
        async move { Ok::<_, Infallible>(response.await) }
    });
    // The protocol is the one ALPN chose (HTTP/2 over TLS needs ALPN, RFC 9113 §3.2): no
    // sniffing of the first bytes. No protocol upgrades are served.
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let outcome = if h2 {
        let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        watcher.watch(builder.serve_connection(io, service)).await
    } else {
        let builder = hyper::server::conn::http1::Builder::new();
        watcher.watch(builder.serve_connection(io, service)).await
    };
    if let Err(err) = outcome {
        tracing::debug!(%remote, error = %err, "connection ended with an error");
    }
}

/// Resolves when SIGTERM or SIGINT arrives (Kubernetes sends SIGTERM to start a graceful
/// shutdown) and cancels `token`.
pub async fn cancel_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    token.cancel();
}

/// Installs the tracing subscriber used by every example binary: `RUST_LOG` filter (default
/// `info`), logs on stderr so stdout stays for machine-readable lines.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Serves Prometheus text from `registry` on `/metrics` (plain HTTP), plus `/healthz`.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<prometheus_client::registry::Registry>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = shutdown.cancelled() => return Ok(()),
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                let registry = Arc::clone(&registry);
                async move {
                    let response = match request.uri().path() {
                        "/metrics" => {
                            let mut text = String::new();
                            match prometheus_client::encoding::text::encode(&mut text, &registry) {
                                Ok(()) => http::Response::builder()
                                    .header("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
                                    .body(full(text)),
                                Err(_) => http::Response::builder().status(500).body(full("encoding failed")),
                            }
                        }
                        "/healthz" => http::Response::builder().body(full("ok")),
                        _ => http::Response::builder()
                            .status(404)
                            .body(full("not found")),
                    };
                    Ok::<_, Infallible>(response.expect("static response parts are valid"))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
