//! reload-lib's test helpers: real TLS handshakes over 127.0.0.1 against a set's acceptor. The
//! PKI, the writers and the client configs are the workspace's test kit (`testkit`), re-exported
//! here so every test file reads `common::Ca`, `common::PairDir`, ...
#![allow(dead_code, unused_imports)]

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub use testkit::files::{PairDir, WRITERS, Writer, kubelet_swap, rename_into};
/// An issued certificate and its key (the kit's `Issued`; the name these tests were written with).
pub use testkit::pki::Issued as Pair;
pub use testkit::pki::{Ca, CertSpec, KeyKind};
pub use testkit::tls::{client_config, client_config_tls12, no_resumption};

/// What one handshake saw.
#[derive(Debug)]
pub struct Seen {
    pub serial: String,
    pub resumed: bool,
    pub stream: tokio_rustls::client::TlsStream<TcpStream>,
}

/// Connects, handshakes with SNI `name`, returns the served leaf's serial. Resumed handshakes
/// carry no certificate; their serial is the empty string.
pub async fn handshake(
    addr: std::net::SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<Seen> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let server_name = ServerName::try_from(name.to_owned()).unwrap();
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), connector.connect(server_name, tcp))
            .await
            .map_err(|_| std::io::Error::other("handshake timed out"))??;
    let (_, conn) = stream.get_ref();
    let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let serial = conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(|leaf| reload_lib::CertInfo::from_der(leaf).unwrap().serial)
        .unwrap_or_default();
    // Drive the connection once so TLS 1.3 tickets and server-side client-auth failures arrive.
    // `write_all` may leave the record in rustls' buffer (tokio-rustls returns `Ok` once rustls
    // took the bytes, even when the socket write was refused, e.g. by tokio's cooperative budget);
    // only `flush` puts it on the wire. Without it the server never sees the ping and both sides
    // wait for each other (stress_hostile counted such a hang).
    stream.write_all(b"ping").await?;
    stream.flush().await?;
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).await?;
    Ok(Seen {
        serial,
        resumed,
        stream,
    })
}

/// An echo server on 127.0.0.1 behind the set's acceptor; returns its address.
pub async fn echo_server(acceptor: reload_lib::Acceptor) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 4];
                while tls.read_exact(&mut buf).await.is_ok() {
                    // Flushed for the same reason as the client's ping in `handshake`.
                    if tls.write_all(&buf).await.is_err() || tls.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Waits (bounded) until a handshake with `name` serves `serial`; returns how long it took.
pub async fn wait_for_serial(
    addr: std::net::SocketAddr,
    name: &str,
    config: &Arc<rustls::ClientConfig>,
    serial: &str,
) -> Duration {
    let start = std::time::Instant::now();
    loop {
        if let Ok(seen) = handshake(addr, name, no_resumption(config)).await
            && seen.serial == serial
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "serial {serial} not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (bounded) until the set's status satisfies `pred`; returns that status.
pub async fn wait_status(
    set: &reload_lib::ServingSet,
    pred: impl Fn(&reload_lib::Status) -> bool,
) -> reload_lib::Status {
    let mut rx = set.subscribe();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| pred(s)))
        .await
        .expect("status condition not reached within 10 s")
        .unwrap()
        .clone()
}

/// Waits (bounded) until the set serves `serial` by default; `what` names the step in the
/// failure message.
pub async fn wait_served(set: &reload_lib::ServingSet, serial: &str, what: &str) {
    let mut rx = set.subscribe();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.served[0].info.serial == serial),
    )
    .await;
    assert!(
        result.is_ok(),
        "{what}: serial {serial} not served within 10 s"
    );
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("reload_lib=debug")),
        )
        .with_test_writer()
        .try_init();
}

/// A server for `localhost` (issued by `server_ca`) requiring client certificates from the
/// bundle at `bundle`, checked against the CRL file `crl` when given.
pub async fn mtls_set(
    tmp: &std::path::Path,
    server_ca: &Ca,
    bundle: &std::path::Path,
    crl: Option<&std::path::Path>,
    configure: Option<fn(&mut rustls::ServerConfig)>,
) -> reload_lib::Result<reload_lib::ServingSet> {
    let dir = PairDir::new(
        &tmp.join("tls"),
        Writer::Rename,
        &server_ca.leaf(&["localhost"], 30),
    );
    let mut builder = reload_lib::ServingSet::builder(dir.paths())
        .client_ca(bundle, reload_lib::ClientAuth::Required)
        .resync_interval(None);
    if let Some(crl) = crl {
        builder = builder.client_crl(crl);
    }
    if let Some(configure) = configure {
        builder = builder.configure(configure);
    }
    builder.start().await
}

/// The reason of the set's last rejection, if any.
pub fn reason(status: &reload_lib::Status) -> Option<reload_lib::InvalidMaterial> {
    status
        .last_error
        .as_ref()
        .and_then(|e| e.invalid_material().cloned())
}
