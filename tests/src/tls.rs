//! Client-side TLS helpers: handshakes that report the served certificate, and plain HTTPS
//! requests without a client library.

use std::net::SocketAddr;
use std::sync::Arc;

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
