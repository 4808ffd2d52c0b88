//! Harness for the end-to-end tests: finding the workspace binaries, running them as child
//! processes, and a throwaway PKI.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::OffsetDateTime;

/// Binaries of the workspace: `E2E_BIN_DIR`, or the target dir this test runs from.
pub fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("E2E_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} not built: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// A child process killed on drop; `stderr` is collected.
pub struct Server {
    pub child: Child,
    /// The address printed as `listening on ADDR`.
    pub addr: SocketAddr,
    /// Everything the process wrote on stderr so far.
    pub stderr: Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// Spawns `command` and waits (up to 20 s) for its `listening on ADDR` line.
    pub fn start(mut command: Command) -> Server {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                sink.lock().unwrap().push_str(&line);
                sink.lock().unwrap().push('\n');
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.parse::<SocketAddr>().unwrap());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("server did not print `listening on`");
        Server {
            child,
            addr,
            stderr,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A throwaway CA issuing `localhost` leaves with increasing serials.
pub struct Ca {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
    serial: u64,
}

impl Default for Ca {
    fn default() -> Self {
        Self::new()
    }
}

impl Ca {
    /// A fresh CA valid for 30 days.
    pub fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "e2e ca");
        params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(30);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
            serial: 0x7000,
        }
    }

    /// (cert PEM, key PEM, serial hex) for `localhost`.
    pub fn leaf(&mut self) -> (String, String, String) {
        self.serial += 1;
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.serial_number = Some(self.serial.into());
        params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(1);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (
            cert.pem(),
            key.serialize_pem(),
            format!("{:x}", self.serial),
        )
    }

    /// A client config trusting this CA, resumption off.
    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.pem.as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Arc::new(config)
    }
}

/// One HTTP/1.1 GET over a fresh TLS connection; returns (status code, body).
pub async fn https_get(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(std::io::Error::other)?;
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
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

impl Ca {
    /// (cert PEM, key PEM) of a client certificate with subject CN `cn`.
    pub fn client_leaf(&mut self, cn: &str) -> (String, String) {
        self.serial += 1;
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(self.serial.into());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(1);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}
