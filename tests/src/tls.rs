//! Client-side TLS helpers: handshakes that report the served certificate, and plain HTTPS
//! requests without a client library.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;

/// A client config trusting every certificate in `ca_pem` (a bundle), with resumption off so
/// every connection makes a full handshake.
///
/// # Panics
/// When `ca_pem` holds no valid certificate.
pub fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    testkit::tls::no_resumption(&testkit::tls::client_config(&[ca_pem], None))
}

/// [`client_config`] that also presents a client certificate (`cert_pem` chain, `key_pem`).
///
/// # Panics
/// When the PEMs do not parse or do not match.
pub fn client_config_with_cert(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Arc<rustls::ClientConfig> {
    testkit::tls::no_resumption(&testkit::tls::client_config_with_pems(
        &[ca_pem],
        cert_pem,
        key_pem,
    ))
}

/// The p50 and p99 of `samples` (nearest rank); `(0, 0)` when empty.
pub fn p50_p99(samples: &[std::time::Duration]) -> (std::time::Duration, std::time::Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = |p: usize| {
        let index = (sorted.len() * p).div_ceil(100).max(1) - 1;
        sorted.get(index).copied().unwrap_or_default()
    };
    (rank(50), rank(99))
}

/// The leaf certificate a server presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// DER.
    pub der: Vec<u8>,
    /// Serial number, lowercase hex without leading zeros.
    pub serial: String,
}

/// Serial of a DER certificate, lowercase hex without leading zeros (the format
/// [`crate::pki::Issued::serial`] uses).
///
/// # Panics
/// When `der` is not a certificate.
pub fn serial_of(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("a DER certificate");
    let serial: String = cert
        .raw_serial()
        .iter()
        .skip_while(|b| **b == 0)
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .trim_start_matches('0')
        .to_owned();
    if serial.is_empty() {
        "0".to_owned()
    } else {
        serial
    }
}

/// Makes one full TLS handshake with `addr` asking for `server_name` (SNI), verifying against
/// `ca_pem`; returns the leaf certificate served.
///
/// # Errors
/// Connection and handshake failures (an untrusted certificate among them).
pub async fn handshake_leaf(
    addr: SocketAddr,
    server_name: &str,
    ca_pem: &str,
) -> std::io::Result<Leaf> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(std::io::Error::other)?;
    let tls = tokio_rustls::TlsConnector::from(client_config(ca_pem))
        .connect(name, tcp)
        .await?;
    let der = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .ok_or_else(|| std::io::Error::other("the server sent no certificate"))?
        .to_vec();
    let serial = serial_of(&der);
    Ok(Leaf { der, serial })
}

/// One HTTP/1.1 GET over a fresh TLS connection; returns (status code, body).
///
/// # Errors
/// Connection and handshake failures.
pub async fn https_get(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(std::io::Error::other)?;
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    Ok(testkit::http::RawResponse::parse(&response).status_and_body())
}

/// One blocking HTTP/1.1 `GET` over a fresh TLS connection (for readiness checks outside an
/// async runtime); an empty `token` sends none. Returns (status, body).
///
/// # Errors
/// Connection and handshake failures.
pub fn blocking_get(
    addr: SocketAddr,
    server_name: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
    path: &str,
    token: &str,
) -> std::io::Result<(u16, String)> {
    blocking_request(addr, server_name, config, ("GET", path, ""), token)
}

/// [`blocking_get`] with a JSON body: `POST path` (etcd's gRPC gateway, `/v3/...`).
///
/// # Errors
/// Connection and handshake failures.
pub fn blocking_post(
    addr: SocketAddr,
    server_name: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    blocking_request(addr, server_name, config, ("POST", path, body), "")
}

fn blocking_request(
    addr: SocketAddr,
    server_name: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
    (method, path, body): (&str, &str, &str),
    token: &str,
) -> std::io::Result<(u16, String)> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(std::io::Error::other)?;
    let connection = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let auth = if token.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {token}\r\n")
    };
    let content = if body.is_empty() {
        String::new()
    } else {
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        )
    };
    tls.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {server_name}\r\n{auth}{content}Connection: close\r\n\r\n{body}"
        )
        .as_bytes(),
    )?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response) {
        Ok(_) => {}
        // Go closes without close_notify at times; what arrived is the response.
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(err) => return Err(err),
    }
    Ok(testkit::http::RawResponse::parse(&response).status_and_body())
}
