//! The self-contained demo behind `https-server --demo`: a throwaway PKI, rotations by rename,
//! and a TLS client that checks each rotation is served.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustls_pki_types::ServerName;
use testkit::files::rename_into;
use testkit::pki::{Ca, CertSpec};

/// A CA and a serving certificate for `localhost` in a fresh temporary directory (removed on
/// drop).
pub struct DemoPki {
    dir: PathBuf,
    ca: Ca,
}

impl DemoPki {
    /// Creates the directory, the CA and the first certificate.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn create() -> anyhow::Result<DemoPki> {
        let dir = std::env::temp_dir().join(format!("reload-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let pki = DemoPki {
            dir,
            ca: Ca::new("reload-lib demo CA"),
        };
        rename_into(&pki.dir.join("ca.crt"), pki.ca.cert_pem.as_bytes());
        pki.issue();
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

    /// Issues the next certificate (valid for an hour) and renames it into place, key first
    /// then certificate (the server rejects the torn state in between and keeps serving the
    /// previous pair). Returns its serial in lowercase hex.
    fn issue(&self) -> String {
        let issued = self.ca.issue(
            &CertSpec::server(&["localhost"])
                .between(-time::Duration::minutes(5), time::Duration::hours(1)),
        );
        testkit::pki::write_pair(&self.cert_path(), &self.key_path(), &issued);
        issued.serial
    }

    /// Rotates `rotations` times, waiting after each for a handshake to show the new serial.
    pub async fn rotate_and_verify(self, addr: SocketAddr, rotations: u32) -> anyhow::Result<()> {
        let client = self.ca.client_config();
        println!("demo: files in {}", self.dir.display());
        println!(
            "demo: serving {} (serial {})",
            self.cert_path().display(),
            served_serial(addr, &client).await?
        );
        for round in 1..=rotations {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let serial = self.issue();
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
}

impl Drop for DemoPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
