//! etcd as a host process, as on a control-plane node: TLS on 127.0.0.1:2379, client
//! certificates required, one client certificate for kube-apiserver (OpenShift's `etcd-client`
//! Secret, with the `etcd-serving-ca` bundle beside it in the resource dir). etcd's own PKI is
//! the etcd operator's, not the kube-apiserver's: it stays valid while that one expires.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use testkit::pki::{Ca, CertSpec, Issued};

use super::ports::{ETCD_PEER_PORT, ETCD_PORT};
use crate::process::ChildProcess;

/// A running etcd with TLS (killed on drop).
pub struct Etcd {
    process: ChildProcess,
    /// Its directory (`data/`, `pki/`, `etcd.log`).
    pub dir: PathBuf,
    /// The CA of its serving certificate (the `etcd-serving-ca` bundle), PEM.
    pub serving_ca: String,
    /// The client certificate kube-apiserver presents (`etcd-client`).
    pub client: Issued,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Etcd {
    /// Starts etcd from the envtest assets on [`ETCD_PORT`] with a fresh PKI in `dir/pki` and
    /// waits until it answers a TLS client.
    ///
    /// # Panics
    /// When it does not answer within 60 s (the message has its log).
    pub fn start(dir: &Path) -> Etcd {
        let assets = crate::envtest::assets().unwrap_or_else(|reason| panic!("{reason}"));
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).expect("etcd's pki directory");
        let signer = Ca::new("etcd-signer");
        let serving = signer.issue(&CertSpec::server(&["localhost", "127.0.0.1"]).days(365));
        let client = signer.issue(
            &CertSpec::client("system:etcd-client")
                .organization("system:etcd-clients")
                .days(365),
        );
        let write = |name: &str, text: &str| {
            std::fs::write(pki.join(name), text).expect("etcd's pki");
        };
        write("ca.crt", &signer.cert_pem);
        write("server.crt", &serving.cert_pem);
        write("server.key", &serving.key_pem);
        let path = |name: &str| pki.join(name).display().to_string();
        let client_url = format!("https://127.0.0.1:{ETCD_PORT}");
        let peer_url = format!("http://127.0.0.1:{ETCD_PEER_PORT}");
        let mut command = Command::new(assets.join("etcd"));
        command
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .args(["--cert-file", &path("server.crt")])
            .args(["--key-file", &path("server.key")])
            .args(["--trusted-ca-file", &path("ca.crt")])
            .arg("--client-cert-auth");
        let mut process = ChildProcess::spawn_logged(
            command,
            &dir.join("etcd.log"),
            SocketAddr::from(([127, 0, 0, 1], ETCD_PORT)),
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let config = crate::tls::client_config_with_cert(
            &signer.cert_pem,
            &client.cert_pem,
            &client.key_pem,
        );
        let answered = testkit::wait::poll_until(Duration::from_secs(60), || {
            if process.has_exited().is_some() {
                return Some(false);
            }
            let got = crate::envtest::blocking_get(
                SocketAddr::from(([127, 0, 0, 1], ETCD_PORT)),
                "localhost",
                config.clone(),
                "/health",
                "",
            );
            matches!(got, Ok((200, _))).then_some(true)
        });
        assert!(
            answered == Some(true),
            "etcd did not answer on 127.0.0.1:{ETCD_PORT} within 60 s:\n{}",
            crate::envtest::log_tail(dir, "etcd.log")
        );
        Etcd {
            process,
            dir: dir.to_owned(),
            serving_ca: signer.cert_pem.clone(),
            client,
        }
    }

    /// The client URL (`https://127.0.0.1:2379`).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{ETCD_PORT}")
    }

    /// Writes `ca.crt`, `client.crt`, `client.key` (0600) for a host process into `dir`;
    /// returns (ca, cert, key).
    pub fn write_client_files(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        std::fs::create_dir_all(dir).expect("the etcd client directory");
        let ca = dir.join("etcd-ca.crt");
        std::fs::write(&ca, &self.serving_ca).expect("etcd ca");
        let (cert, key) = (dir.join("etcd-client.crt"), dir.join("etcd-client.key"));
        testkit::pki::write_pair(&cert, &key, &self.client);
        (ca, cert, key)
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.has_exited().is_none()
    }
}
