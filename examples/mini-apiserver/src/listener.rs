//! The accept loop of mini-apiserver: TLS through reload-lib, HTTP/1.1 and HTTP/2, with the
//! limits that keep slow or hostile clients from starving everyone else (issue #18, item 8):
//!
//! - a cap on open connections below the file-descriptor limit, so that certificate reloads,
//!   the state file and the audit log always find a descriptor: at the cap the loop stops
//!   accepting (new clients wait in the kernel's backlog) instead of failing with `EMFILE`;
//! - a cap on connections that have not yet made an authenticated request: when it is reached,
//!   the oldest such connection is closed to make room, so a burst of half-open connections
//!   cannot lock out a legitimate client, which authenticates within milliseconds;
//! - a deadline for that first authenticated request ([`AUTH_DEADLINE`], TLS handshake
//!   included): silent, half-sent or never-authenticating connections are closed;
//! - a header read timeout ([`HEADER_TIMEOUT`]) for every HTTP/1 request;
//! - a per-connection abort token, which handlers use to close the connection of a watcher that
//!   stopped reading (see [`crate::watch`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use examples::serve::{Body, ConnInfo};

/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send the headers of one HTTP/1 request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may stay open without an authenticated request.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(15);
/// How long open connections may take to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest connection cap, whatever the descriptor limit.
const MAX_CONNECTIONS: usize = 8192;
/// Descriptors kept free for everything that is not a client connection (certificate and key
/// files, inotify, the state file, the audit log, the runtime).
const RESERVED_FDS: usize = 64;

/// Connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most.
    pub connections: usize,
    /// Connections without an authenticated request at most (the oldest is closed beyond).
    pub unauthenticated: usize,
}

impl Limits {
    /// Limits derived from this process's descriptor limit (`RLIMIT_NOFILE`, read from
    /// `/proc/self/limits`; 1024 assumed when it cannot be read).
    pub fn from_fd_limit() -> Limits {
        Limits::for_fds(soft_fd_limit().unwrap_or(1024))
    }

    /// Limits for `fds` available descriptors.
    pub fn for_fds(fds: usize) -> Limits {
        let connections = fds.saturating_sub(RESERVED_FDS).clamp(2, MAX_CONNECTIONS);
        Limits {
            connections,
            unauthenticated: (connections / 2).max(1),
        }
    }
}

fn soft_fd_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    match soft {
        "unlimited" => Some(MAX_CONNECTIONS + RESERVED_FDS),
        n => n.parse().ok(),
    }
}

/// One connection as handlers see it.
#[derive(Debug)]
pub struct Conn {
    /// Address, SNI name and client certificates.
    pub info: ConnInfo,
    /// What the client certificate proved (checked against the client CA in force for this
    /// handshake); only `Verified` authenticates.
    pub client_identity: reload_lib::ClientIdentity,
    /// Cancel to close the connection at once (a watcher that stopped reading).
    pub abort: CancellationToken,
    id: u64,
    pending: Arc<Pending>,
}

impl Conn {
    /// Marks the connection as authenticated: it no longer counts against the unauthenticated
    /// cap and no longer has a deadline.
    pub fn authenticated(&self) {
        self.pending.remove(self.id);
    }
}

/// The connections without an authenticated request yet, oldest first.
#[derive(Debug, Default)]
struct Pending {
    conns: Mutex<BTreeMap<u64, CancellationToken>>,
}

impl Pending {
    /// Registers a new connection; closes the oldest when more than `cap` are pending.
    fn add(&self, id: u64, abort: CancellationToken, cap: usize) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        while conns.len() >= cap {
            let Some((_, oldest)) = conns.pop_first() else {
                break;
            };
            oldest.cancel();
        }
        conns.insert(id, abort);
    }

    fn remove(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    fn contains(&self, id: u64) -> bool {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&id)
    }
}

/// Accepts connections on `listener` until `shutdown` is cancelled, then drains open
/// connections (up to 10 s).
///
/// # Errors
/// None at present; the signature leaves room for fatal listener errors.
pub async fn serve<H, Fut>(
    listener: TcpListener,
    tls: reload_lib::Acceptor,
    limits: Limits,
    handler: H,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    H: Fn(Arc<Conn>, http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<Body>> + Send + 'static,
{
    tracing::info!(
        connections = limits.connections,
        unauthenticated = limits.unauthenticated,
        "Connection limits"
    );
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.connections));
    let pending = Arc::new(Pending::default());
    let mut next_id = 0u64;
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
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
        let _ = tcp.set_nodelay(true);
        next_id += 1;
        let id = next_id;
        let abort = CancellationToken::new();
        pending.add(id, abort.clone(), limits.unauthenticated);
        let tls = tls.clone();
        let handler = handler.clone();
        let watcher = graceful.watcher();
        let pending = Arc::clone(&pending);
        tokio::spawn(async move {
            let _slot = slot;
            let deadline = tokio::time::Instant::now() + AUTH_DEADLINE;
            let accepted = tokio::select! {
                accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept_with_identity(tcp)) => accepted,
                () = abort.cancelled() => {
                    tracing::debug!(%remote, "connection closed during the handshake to make room");
                    pending.remove(id);
                    return;
                }
            };
            let (tls_stream, client_identity) = match accepted {
                Ok(Ok(accepted)) => accepted,
                Ok(Err(err)) => {
                    tracing::debug!(%remote, error = %err, "TLS handshake failed");
                    pending.remove(id);
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "TLS handshake timed out");
                    pending.remove(id);
                    return;
                }
            };
            let (_, session) = tls_stream.get_ref();
            let conn = Arc::new(Conn {
                info: ConnInfo {
                    remote,
                    server_name: session.server_name().map(str::to_owned),
                    peer_certs: session
                        .peer_certificates()
                        .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect())
                        .unwrap_or_default(),
                },
                client_identity,
                abort: abort.clone(),
                id,
                pending: Arc::clone(&pending),
            });
            let service = {
                let conn = Arc::clone(&conn);
                hyper::service::service_fn(move |request| {
                    let response = handler(Arc::clone(&conn), request);
                    async move { Ok::<_, Infallible>(response.await) }
                })
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            builder.http2().timer(TokioTimer::new());
            let connection =
                builder.serve_connection_with_upgrades(TokioIo::new(tls_stream), service);
            let connection = watcher.watch(connection.into_owned());
            tokio::pin!(connection);
            let unauthenticated_for_too_long = async {
                tokio::time::sleep_until(deadline).await;
                if pending.contains(id) {
                    return;
                }
                std::future::pending::<()>().await;
            };
            tokio::select! {
                result = &mut connection => {
                    if let Err(err) = result {
                        tracing::debug!(%remote, error = %err, "connection ended with an error");
                    }
                }
                () = abort.cancelled() => {
                    tracing::debug!(%remote, "connection closed (to make room, or a stalled watch)");
                }
                () = unauthenticated_for_too_long => {
                    tracing::debug!(%remote, "connection closed: no authenticated request in time");
                }
            }
            pending.remove(id);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_leave_descriptors_free_and_half_for_unauthenticated_clients() {
        assert_eq!(
            Limits::for_fds(256),
            Limits {
                connections: 192,
                unauthenticated: 96
            }
        );
        assert_eq!(Limits::for_fds(10).connections, 2);
        assert_eq!(Limits::for_fds(1 << 20).connections, MAX_CONNECTIONS);
    }

    #[test]
    fn the_oldest_pending_connection_makes_room() {
        let pending = Pending::default();
        let tokens: Vec<CancellationToken> = (0..3).map(|_| CancellationToken::new()).collect();
        for (id, token) in tokens.iter().enumerate() {
            pending.add(id as u64, token.clone(), 2);
        }
        assert!(tokens[0].is_cancelled());
        assert!(!tokens[1].is_cancelled() && !tokens[2].is_cancelled());
        pending.remove(1);
        assert!(!pending.contains(1) && pending.contains(2));
    }
}
