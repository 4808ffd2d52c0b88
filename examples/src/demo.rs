//! The self-contained demo behind `https-server --demo`: a throwaway PKI, rotations by rename,
//! and a TLS client that checks each rotation is served.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use time::OffsetDateTime;

/// A CA and a serving certificate for `localhost` in a fresh temporary directory (removed on
/// drop).
pub struct DemoPki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    next_serial: u64,
}

impl DemoPki {
    /// Creates the directory, the CA and the first certificate.
    pub fn create() -> anyhow::Result<DemoPki> {
        let dir = std::env::temp_dir().join(format!("reload-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "reload-lib demo CA");
        params.not_before = OffsetDateTime::now_utc() - time::Duration::minutes(5);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::days(1);
        let ca = params.self_signed(&key)?;
        let mut pki = DemoPki {
            dir,
            ca_pem: ca.pem(),
            issuer: Issuer::new(params, key),
            next_serial: 1,
        };
        std::fs::write(pki.dir.join("ca.crt"), &pki.ca_pem)?;
        pki.issue()?;
        Ok(pki)
    }

    /// The serving certificate file.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    /// The serving key file.
    pub fn key_path(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    /// Issues the next certificate and renames it into place, key first then certificate (the
    /// server rejects the torn state in between and keeps serving the previous pair). Returns
    /// its serial in lowercase hex.
    fn issue(&mut self) -> anyhow::Result<String> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let serial = 0x5e_0000 + self.next_serial;
        self.next_serial += 1;
        params.serial_number = Some(serial.into());
        params.not_before = OffsetDateTime::now_utc() - time::Duration::minutes(5);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::hours(1);
        let cert = params.signed_by(&key, &self.issuer)?;
        replace(&self.key_path(), key.serialize_pem().as_bytes())?;
        replace(&self.cert_path(), cert.pem().as_bytes())?;
        Ok(format!("{serial:x}"))
    }

    /// Rotates `rotations` times, waiting after each for a handshake to show the new serial.
    pub async fn rotate_and_verify(
        mut self,
        addr: SocketAddr,
        rotations: u32,
    ) -> anyhow::Result<()> {
        let client = self.client()?;
        println!("demo: files in {}", self.dir.display());
        println!(
            "demo: serving {} (serial {})",
            self.cert_path().display(),
            served_serial(addr, &client).await?
        );
        for round in 1..=rotations {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let serial = self.issue()?;
            let written = Instant::now();
            loop {
                if served_serial(addr, &client).await? == serial {
                    break;
                }
                if written.elapsed() > Duration::from_secs(5) {
                    bail!("rotation {round}: serial {serial} was not served within 5 s");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            println!(
                "demo: rotation {round}/{rotations}: wrote serial {serial}, served after {:.1} ms",
                written.elapsed().as_secs_f64() * 1000.0
            );
        }
        println!("demo: all {rotations} rotations served without a restart");
        Ok(())
    }

    fn client(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes())?)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(config))
    }
}

impl Drop for DemoPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} into place", tmp.display()))?;
    Ok(())
}

async fn served_serial(
    addr: SocketAddr,
    client: &Arc<rustls::ClientConfig>,
) -> anyhow::Result<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(client));
    let tls = connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await
        .context("TLS handshake with the demo server failed")?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .context("the server sent no certificate")?;
    let info = reload_lib::CertInfo::from_der(leaf).map_err(anyhow::Error::msg)?;
    Ok(info.serial)
}
