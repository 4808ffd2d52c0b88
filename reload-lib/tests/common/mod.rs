//! Test PKI (rcgen), writers in every style, and real TLS clients over 127.0.0.1.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

static SERIAL: AtomicU64 = AtomicU64::new(0x1000);

/// A CA that issues leaves with unique serials.
pub struct Ca {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// An issued pair in PEM, with its serial as lowercase hex.
#[derive(Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub serial: String,
    pub serial_number: u64,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(365);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A serving leaf for `names`, valid from an hour ago for `days` days (negative: expired).
    pub fn leaf(&self, names: &[&str], days: i64) -> Pair {
        self.issue(
            names,
            days,
            ExtendedKeyUsagePurpose::ServerAuth,
            names.first().copied().unwrap_or("leaf"),
        )
    }

    /// A client leaf with subject CN `cn`.
    pub fn client(&self, cn: &str) -> Pair {
        self.issue(&[], 30, ExtendedKeyUsagePurpose::ClientAuth, cn)
    }

    /// A client leaf valid for `days` more days (negative: expired).
    pub fn client_valid_for(&self, cn: &str, days: i64) -> Pair {
        self.issue(&[], days, ExtendedKeyUsagePurpose::ClientAuth, cn)
    }

    fn issue(&self, names: &[&str], days: i64, usage: ExtendedKeyUsagePurpose, cn: &str) -> Pair {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        params.serial_number = Some(serial.into());
        params.extended_key_usages = vec![usage];
        if days >= 0 {
            params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
            params.not_after = OffsetDateTime::now_utc() + time::Duration::days(days);
        } else {
            params.not_before = OffsetDateTime::now_utc() - time::Duration::days(-days + 30);
            params.not_after = OffsetDateTime::now_utc() + time::Duration::days(days);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial: format!("{serial:x}"),
            serial_number: serial,
        }
    }
}

impl Ca {
    /// A CRL (PEM) revoking `serials`.
    pub fn crl(&self, serials: &[u64]) -> String {
        self.crl_params(serials, time::Duration::days(1))
            .signed_by(&self.issuer)
            .unwrap()
            .pem()
            .unwrap()
    }

    /// The same CRL in DER.
    pub fn crl_der(&self, serials: &[u64]) -> Vec<u8> {
        self.crl_params(serials, time::Duration::days(1))
            .signed_by(&self.issuer)
            .unwrap()
            .der()
            .to_vec()
    }

    /// A CRL (PEM) whose nextUpdate is `next_update` from now (negative: stale).
    pub fn crl_next_update(&self, serials: &[u64], next_update: time::Duration) -> String {
        self.crl_params(serials, next_update)
            .signed_by(&self.issuer)
            .unwrap()
            .pem()
            .unwrap()
    }

    /// A serving leaf valid from `from` to `to` (relative to now).
    pub fn leaf_between(&self, names: &[&str], from: time::Duration, to: time::Duration) -> Pair {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        params.serial_number = Some(serial.into());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = OffsetDateTime::now_utc() + from;
        params.not_after = OffsetDateTime::now_utc() + to;
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial: format!("{serial:x}"),
            serial_number: serial,
        }
    }

    /// An intermediate CA signed by this one, valid until `days` from now.
    pub fn intermediate(&self, name: &str, days: i64) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.not_before = OffsetDateTime::now_utc() - time::Duration::days(400);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(days);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn crl_params(
        &self,
        serials: &[u64],
        next_update: time::Duration,
    ) -> rcgen::CertificateRevocationListParams {
        let now = OffsetDateTime::now_utc();
        let this_update =
            (now - time::Duration::minutes(5)).min(now + next_update - time::Duration::days(1));
        rcgen::CertificateRevocationListParams {
            this_update,
            next_update: now + next_update,
            crl_number: SERIAL.fetch_add(1, Ordering::Relaxed).into(),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|serial| rcgen::RevokedCertParams {
                    serial_number: (*serial).into(),
                    revocation_time: now - time::Duration::minutes(1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
    }
}

impl Pair {
    pub fn chain_with(&self, ca: &Ca) -> String {
        format!("{}{}", self.cert_pem, ca.cert_pem)
    }
}

/// How a rotation is written to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Write a temp file, rename over: certificate, then key.
    Rename,
    /// Truncate and write in place (`cp`): certificate, then key.
    InPlace,
    /// The kubelet's `..data` symlink swap: both files switch at once.
    Kubelet,
}

pub const WRITERS: [Writer; 3] = [Writer::Rename, Writer::InPlace, Writer::Kubelet];

/// A directory holding `tls.crt` and `tls.key`, written in one style.
pub struct PairDir {
    pub dir: PathBuf,
    pub writer: Writer,
    generation: u64,
}

impl PairDir {
    pub fn new(dir: &Path, writer: Writer, pair: &Pair) -> PairDir {
        std::fs::create_dir_all(dir).unwrap();
        let mut this = PairDir {
            dir: dir.to_owned(),
            writer,
            generation: 0,
        };
        this.write(pair);
        this
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    pub fn paths(&self) -> reload_lib::CertKeyPaths {
        reload_lib::CertKeyPaths::new(self.cert(), self.key())
    }

    pub fn write(&mut self, pair: &Pair) {
        self.write_raw(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes());
    }

    pub fn write_raw(&mut self, cert: &[u8], key: &[u8]) {
        self.generation += 1;
        match self.writer {
            Writer::Rename => {
                rename_into(&self.cert(), cert);
                rename_into(&self.key(), key);
            }
            Writer::InPlace => {
                std::fs::write(self.cert(), cert).unwrap();
                std::fs::write(self.key(), key).unwrap();
            }
            Writer::Kubelet => kubelet_swap(
                &self.dir,
                self.generation,
                &[("tls.crt", cert), ("tls.key", key)],
            ),
        }
    }
}

pub fn rename_into(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The kubelet AtomicWriter sequence, with its immediate removal of the old generation.
pub fn kubelet_swap(dir: &Path, generation: u64, files: &[(&str, &[u8])]) {
    let ts = format!("..gen_{generation}_{}", std::process::id());
    let ts_dir = dir.join(&ts);
    std::fs::create_dir(&ts_dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(ts_dir.join(name), bytes).unwrap();
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    let _ = std::fs::remove_file(dir.join("..data_tmp"));
    std::os::unix::fs::symlink(&ts, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

/// A TLS client for tests: verifies against `ca_pems`, optional client identity, resumption on.
pub fn client_config(ca_pems: &[&str], identity: Option<&Pair>) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(pair) => {
            let chain = CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// Like [`client_config`], TLS 1.2 only.
pub fn client_config_tls12(ca_pems: &[&str], identity: Option<&Pair>) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(pair) => {
            let chain = CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

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
    stream.write_all(b"ping").await?;
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
                    if tls.write_all(&buf).await.is_err() {
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

/// The same config with resumption off, so every handshake shows the served certificate.
pub fn no_resumption(config: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (**config).clone();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
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
