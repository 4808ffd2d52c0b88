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

static NEXT_CA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
        let number = NEXT_CA.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("e2e ca {number}"));
        params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(30);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
            // Distinct serial ranges per CA, so serials identify certificates across CAs.
            serial: 0x7000_0000
                + NEXT_CA.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 0x1000,
        }
    }

    /// (cert PEM, key PEM, serial hex) for `localhost`.
    pub fn leaf(&mut self) -> (String, String, String) {
        self.serial += 1;
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
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

/// A `mini-apiserver` process with its PKI: a default certificate (`localhost`, `127.0.0.1`) from
/// one CA and a `localhost-recovery` certificate from another, and a token file.
pub struct ApiServer {
    /// The process.
    pub server: Server,
    /// Where its files live.
    pub dir: PathBuf,
    /// CA of the default serving certificate.
    pub serving_ca: String,
    /// CA of the `localhost-recovery` certificate.
    pub recovery_ca: String,
    /// The valid bearer token.
    pub token: String,
    /// Extra flags it was started with (for restarts).
    pub extra: Vec<String>,
}

impl ApiServer {
    /// Writes the PKI and token file into `dir` and starts the server on a free port.
    pub fn start(dir: &std::path::Path, extra: &[&str]) -> ApiServer {
        let mut serving = Ca::new();
        let mut recovery = Ca::new();
        let (cert, key, _) = serving.leaf();
        std::fs::write(dir.join("serving.crt"), cert).unwrap();
        std::fs::write(dir.join("serving.key"), key).unwrap();
        let (cert, key, _) = recovery.leaf_for(&["localhost-recovery"]);
        std::fs::create_dir_all(dir.join("recovery")).unwrap();
        std::fs::write(dir.join("recovery/tls.crt"), cert).unwrap();
        std::fs::write(dir.join("recovery/tls.key"), key).unwrap();
        let token = "e2e-token-0123456789".to_owned();
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{token},admin,1,\"system:masters\"\nread-only-token,viewer,2\n"),
        )
        .unwrap();
        std::fs::write(dir.join("token"), &token).unwrap();
        let mut api = ApiServer {
            server: Self::spawn(dir, "127.0.0.1:0", extra),
            dir: dir.to_owned(),
            serving_ca: serving.pem.clone(),
            recovery_ca: recovery.pem.clone(),
            token,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        std::fs::write(dir.join("serving-ca.crt"), &api.serving_ca).unwrap();
        std::fs::write(dir.join("recovery-ca.crt"), &api.recovery_ca).unwrap();
        api.extra.shrink_to_fit();
        api
    }

    fn spawn(dir: &std::path::Path, listen: &str, extra: &[&str]) -> Server {
        let mut command = Command::new(bin("mini-apiserver"));
        command
            .args(["--listen", listen, "--cert"])
            .arg(dir.join("serving.crt"))
            .arg("--key")
            .arg(dir.join("serving.key"))
            .arg("--sni")
            .arg(format!(
                "localhost-recovery={},{}",
                dir.join("recovery/tls.crt").display(),
                dir.join("recovery/tls.key").display()
            ))
            .arg("--token-auth-file")
            .arg(dir.join("tokens.csv"))
            .args(["--read-only-user", "viewer"])
            .args(extra);
        Server::start(command)
    }

    /// Stops the process and starts it again on the same address.
    pub fn restart(&mut self) {
        let addr = self.server.addr.to_string();
        let _ = self.server.child.kill();
        let _ = self.server.child.wait();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        // The port is free again once the old process is gone; retry briefly if it is not yet.
        for attempt in 0..50 {
            match std::panic::catch_unwind(|| Self::spawn(&self.dir, &addr, &extra)) {
                Ok(server) => {
                    self.server = server;
                    return;
                }
                Err(_) if attempt < 49 => std::thread::sleep(Duration::from_millis(100)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }

    /// A kube client that connects like cert-syncer: `https://127.0.0.1:PORT`, SNI
    /// `localhost-recovery`, the recovery CA, a bearer token file.
    pub fn recovery_client(&self) -> kube::Client {
        let mut config =
            kube::Config::new(format!("https://{}", self.server.addr).parse().unwrap());
        config.root_cert = Some(vec![
            CertificateDer::from_pem_slice(self.recovery_ca.as_bytes())
                .unwrap()
                .to_vec(),
        ]);
        config.tls_server_name = Some("localhost-recovery".to_owned());
        config.auth_info.token_file = Some(self.dir.join("token").display().to_string());
        kube::Client::try_from(config).unwrap()
    }
}

impl Ca {
    /// (cert PEM, key PEM, serial hex) for the given DNS names.
    pub fn leaf_for(&mut self, names: &[&str]) -> (String, String, String) {
        self.serial += 1;
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
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
}

/// Installs the process-wide rustls provider kube-client needs (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
