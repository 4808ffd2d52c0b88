//! etcd as a host process, as on a control-plane node: TLS on 127.0.0.1:2379, client
//! certificates required, one client certificate for kube-apiserver (OpenShift's `etcd-client`
//! Secret, with the `etcd-serving-ca` bundle beside it in the resource dir). etcd's own PKI is
//! the etcd operator's, not the kube-apiserver's: it stays valid while that one expires.
//!
//! [`Etcd::start`] is the single node's one member; [`Etcd::spawn_member`] one member of a
//! cluster of several (the three-node tier, [`super::ha::etcd_cluster`]): in its node's
//! namespaces, serving clients on the node's loopback and address, and its peers over TLS with
//! peer certificates.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use testkit::pki::{Ca, CertSpec, Issued};

use super::env::NodeEnv;
use super::ports::{ETCD_PEER_PORT, ETCD_PORT};
use crate::process::ChildProcess;

/// The etcd PKI of a cluster: its signer (the `etcd-serving-ca` bundle) and the client
/// certificate kube-apiserver presents (`etcd-client`).
pub struct EtcdPki {
    /// The CA of every serving and peer certificate, and of the client certificate.
    pub signer: Ca,
    /// The client certificate kube-apiserver presents (`etcd-client`).
    pub client: Issued,
}

impl std::fmt::Debug for EtcdPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPki").finish_non_exhaustive()
    }
}

impl EtcdPki {
    /// A fresh signer and `etcd-client` (OpenShift's subject), valid for a year.
    pub fn new() -> EtcdPki {
        let signer = Ca::new("etcd-signer");
        let client = signer.issue(
            &CertSpec::client("system:etcd-client")
                .organization("system:etcd-clients")
                .days(365),
        );
        EtcdPki { signer, client }
    }
}

impl Default for EtcdPki {
    fn default() -> Self {
        EtcdPki::new()
    }
}

/// One member of a cluster: its name, its node's address (peers and the test reach it there)
/// and namespaces, and the whole cluster's `--initial-cluster`.
#[derive(Debug, Clone)]
pub struct Member {
    /// `--name`.
    pub name: String,
    /// The node's address; `127.0.0.1` for the single node.
    pub ip: IpAddr,
    /// `--initial-cluster` (`NAME=PEER-URL,...`).
    pub initial_cluster: String,
    /// Where it runs.
    pub env: NodeEnv,
}

impl Member {
    /// The peer URL: plain HTTP on the loopback for the single node, TLS on the node's
    /// address otherwise.
    pub fn peer_url(&self) -> String {
        if self.ip.is_loopback() {
            format!("http://127.0.0.1:{ETCD_PEER_PORT}")
        } else {
            format!("https://{}:{ETCD_PEER_PORT}", self.ip)
        }
    }

    /// The client URL the test (and a seed kube-apiserver on the machine) uses.
    pub fn client_url(&self) -> String {
        format!("https://{}:{ETCD_PORT}", self.ip)
    }
}

/// A running etcd with TLS (killed on drop).
pub struct Etcd {
    process: Option<ChildProcess>,
    command: Option<Command>,
    /// Its directory (`data/`, `pki/`, `etcd.log`).
    pub dir: PathBuf,
    /// The CA of its serving certificate (the `etcd-serving-ca` bundle), PEM.
    pub serving_ca: String,
    /// The client certificate kube-apiserver presents (`etcd-client`).
    pub client: Issued,
    url: String,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("dir", &self.dir)
            .field("url", &self.url)
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
        let member = Member {
            name: "default".to_owned(),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            initial_cluster: format!("default=http://127.0.0.1:{ETCD_PEER_PORT}"),
            env: NodeEnv::host(),
        };
        let mut etcd = Etcd::spawn_member(dir, &EtcdPki::new(), &member);
        etcd.wait_healthy(Duration::from_secs(60));
        etcd
    }

    /// Starts one member (serving, peer certificates for `member.ip` from `pki`, written to
    /// `dir/pki`) and returns at once: a member of several answers `/health` only once a
    /// quorum runs ([`Etcd::wait_healthy`]).
    ///
    /// # Panics
    /// When it cannot start.
    pub fn spawn_member(dir: &Path, pki: &EtcdPki, member: &Member) -> Etcd {
        let assets = crate::envtest::assets().unwrap_or_else(|reason| panic!("{reason}"));
        let dir_pki = dir.join("pki");
        std::fs::create_dir_all(&dir_pki).expect("etcd's pki directory");
        let ip = member.ip.to_string();
        let mut names = vec!["localhost", "127.0.0.1"];
        if !member.ip.is_loopback() {
            names.push(&ip);
        }
        // Server and client auth: etcd's gRPC gateway (`/v3/...` over HTTPS) dials the member's
        // own gRPC server presenting the serving certificate, which `--client-cert-auth`
        // checks as a client certificate.
        let serving = pki.signer.issue(&CertSpec::peer(&names).days(365));
        let write = |name: &str, text: &str| {
            std::fs::write(dir_pki.join(name), text).expect("etcd's pki");
        };
        write("ca.crt", &pki.signer.cert_pem);
        write("server.crt", &serving.cert_pem);
        write("server.key", &serving.key_pem);
        let path = |name: &str| dir_pki.join(name).display().to_string();
        let listen_clients = if member.ip.is_loopback() {
            member.client_url()
        } else {
            format!("https://127.0.0.1:{ETCD_PORT},{}", member.client_url())
        };
        let peer_url = member.peer_url();
        let mut command = Command::new(assets.join("etcd"));
        command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &listen_clients])
            .args(["--advertise-client-urls", &member.client_url()])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &member.initial_cluster])
            .args(["--cert-file", &path("server.crt")])
            .args(["--key-file", &path("server.key")])
            .args(["--trusted-ca-file", &path("ca.crt")])
            .arg("--client-cert-auth");
        if !member.ip.is_loopback() {
            // Peers over TLS, each presenting its peer certificate (server and client auth).
            let peer = pki.signer.issue(&CertSpec::peer(&[&ip]).days(365));
            write("peer.crt", &peer.cert_pem);
            write("peer.key", &peer.key_pem);
            command
                .args(["--initial-cluster-token", "cert-reload-ha"])
                .args(["--initial-cluster-state", "new"])
                .args(["--peer-cert-file", &path("peer.crt")])
                .args(["--peer-key-file", &path("peer.key")])
                .args(["--peer-trusted-ca-file", &path("ca.crt")])
                .arg("--peer-client-cert-auth");
        }
        let command = member.env.enter(command);
        let mut etcd = Etcd {
            process: None,
            command: Some(command),
            dir: dir.to_owned(),
            serving_ca: pki.signer.cert_pem.clone(),
            client: pki.client.clone(),
            url: member.client_url(),
        };
        etcd.restart();
        etcd
    }

    /// Starts it again with the same command and data (after [`Etcd::kill`]); returns at once.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn restart(&mut self) {
        let command = self.command.take().expect("etcd's command");
        let mut again = Command::new(command.get_program());
        again.args(command.get_args());
        for (key, value) in command.get_envs() {
            if let Some(value) = value {
                again.env(key, value);
            }
        }
        self.command = Some(command);
        let addr = self
            .url
            .trim_start_matches("https://")
            .parse::<SocketAddr>()
            .expect("etcd's client address");
        self.process = Some(
            ChildProcess::spawn_logged(again, &self.dir.join("etcd.log"), addr)
                .unwrap_or_else(|err| panic!("{err}")),
        );
    }

    /// Waits until it answers `/health` (200: it has a leader) to a TLS client.
    ///
    /// # Panics
    /// When it exits or does not answer within `timeout` (the message has its log).
    pub fn wait_healthy(&mut self, timeout: Duration) {
        let config = crate::tls::client_config_with_cert(
            &self.serving_ca,
            &self.client.cert_pem,
            &self.client.key_pem,
        );
        let addr = self.process.as_ref().expect("etcd runs").addr;
        let answered = testkit::wait::poll_until(timeout, || {
            if !self.is_running() {
                return Some(false);
            }
            let got =
                crate::envtest::blocking_get(addr, "localhost", config.clone(), "/health", "");
            matches!(got, Ok((200, _))).then_some(true)
        });
        assert!(
            answered == Some(true),
            "etcd did not answer on {addr} within {timeout:?}:\n{}",
            crate::envtest::log_tail(&self.dir, "etcd.log")
        );
    }

    /// The client URL (`https://127.0.0.1:2379` for the single node, the node's address for a
    /// member of several).
    pub fn url(&self) -> String {
        self.url.clone()
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
        self.process
            .as_mut()
            .is_some_and(|p| p.has_exited().is_none())
    }

    /// SIGKILL (a node losing power); [`Etcd::restart`] starts it again on the same data.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}
