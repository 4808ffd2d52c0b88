//! A `mini-apiserver` process with its PKI and token file, and kube clients that connect to it
//! the way cert-syncer does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::process::{ChildProcess, bin_path};
use testkit::files::rename_into;
use testkit::pki::{Ca, CertSpec, write_pair};

pub use crate::tokens::{ADMIN_TOKEN, VIEWER_TOKEN};

/// A `mini-apiserver` process and its files in `dir`:
///
/// | file | content |
/// |---|---|
/// | `serving.crt`, `serving.key` | default certificate (`localhost`, `127.0.0.1`), CA `serving-ca.crt` |
/// | `recovery/tls.crt`, `recovery/tls.key` | SNI `localhost-recovery` certificate, CA `recovery-ca.crt` |
/// | `tokens.csv` | static tokens: [`ADMIN_TOKEN`] (`admin`), [`VIEWER_TOKEN`] (`viewer`, read-only) |
/// | `token` | [`ADMIN_TOKEN`], for clients that read a token file |
pub struct ApiServer {
    /// The process.
    pub server: ChildProcess,
    /// Where its files live.
    pub dir: PathBuf,
    /// CA of the default serving certificate (PEM).
    pub serving_ca: String,
    /// CA of the `localhost-recovery` certificate (PEM).
    pub recovery_ca: String,
    /// The admin bearer token.
    pub token: String,
    /// Extra flags it was started with (kept for restarts).
    pub extra: Vec<String>,
    serving: Ca,
    recovery: Ca,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("server", &self.server)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The serving PKI every apiserver of the harness has, written into `dir`: `serving.crt` and
/// `serving.key` (`localhost`, `127.0.0.1`) from the CA in `serving-ca.crt`, and
/// `recovery/tls.crt` and `recovery/tls.key` (`localhost-recovery`) from the CA in
/// `recovery-ca.crt`. Returns the two CAs (serving, recovery).
pub fn write_serving_pki(dir: &Path) -> (Ca, Ca) {
    let serving = Ca::default();
    let recovery = Ca::default();
    write_pair(
        &dir.join("serving.crt"),
        &dir.join("serving.key"),
        &serving.issue(&CertSpec::server(&["localhost", "127.0.0.1"])),
    );
    write_pair(
        &dir.join("recovery/tls.crt"),
        &dir.join("recovery/tls.key"),
        &recovery.issue(&CertSpec::server(&["localhost-recovery"])),
    );
    rename_into(&dir.join("serving-ca.crt"), serving.cert_pem.as_bytes());
    rename_into(&dir.join("recovery-ca.crt"), recovery.cert_pem.as_bytes());
    (serving, recovery)
}

impl ApiServer {
    /// Writes the PKI and token files into `dir` and starts the server on `127.0.0.1:0`.
    ///
    /// # Panics
    /// When the server does not start (the message has its stderr).
    pub fn start(dir: &Path, extra: &[&str]) -> ApiServer {
        ApiServer::start_with_tokens(dir, extra, &[])
    }

    /// [`ApiServer::start`] with more users in the token file: `(token, user)` pairs (for
    /// requests that must be told apart in `--audit-log`, e.g. service accounts named as
    /// kube-apiserver names them).
    ///
    /// # Panics
    /// When the server does not start.
    pub fn start_with_tokens(dir: &Path, extra: &[&str], users: &[(&str, &str)]) -> ApiServer {
        let (serving, recovery) = write_serving_pki(dir);
        let mut tokens = format!(
            "{ADMIN_TOKEN},admin,1,\"system:masters\"\n{VIEWER_TOKEN},viewer,2\n\
             syncer-token,cert-syncer,3,\"syncers\"\n"
        );
        for (uid, (token, user)) in users.iter().enumerate() {
            tokens.push_str(&format!("{token},{user},{}\n", 100 + uid));
        }
        rename_into(&dir.join("tokens.csv"), tokens.as_bytes());
        rename_into(&dir.join("token"), ADMIN_TOKEN.as_bytes());
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let server = ChildProcess::start(Self::command(dir, "127.0.0.1:0", &extra));
        ApiServer {
            server,
            dir: dir.to_owned(),
            serving_ca: serving.cert_pem.clone(),
            recovery_ca: recovery.cert_pem.clone(),
            token: ADMIN_TOKEN.to_owned(),
            extra,
            serving,
            recovery,
        }
    }

    fn command(dir: &Path, listen: &str, extra: &[String]) -> Command {
        let mut command = Command::new(bin_path("mini-apiserver"));
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
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            );
        command
    }

    /// Kills the process (SIGKILL, like a crash) and starts it again on the same address with
    /// the same flags.
    ///
    /// # Panics
    /// When it does not come back within about 5 s.
    pub fn restart(&mut self) {
        let addr = self.server.addr.to_string();
        self.server.kill();
        let mut last = String::new();
        // The port is free once the old process is gone; retry briefly if it is not yet.
        for _ in 0..50 {
            match ChildProcess::try_start(Self::command(&self.dir, &addr, &self.extra)) {
                Ok(server) => {
                    self.server = server;
                    return;
                }
                Err(err) => last = err,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("mini-apiserver did not restart on {addr}: {last}");
    }

    /// Replaces the `localhost-recovery` certificate files with a new certificate from the
    /// same CA (key and certificate each renamed into place); returns its serial.
    pub fn rotate_recovery(&mut self) -> String {
        let issued = self
            .recovery
            .issue(&CertSpec::server(&["localhost-recovery"]));
        write_pair(
            &self.dir.join("recovery/tls.crt"),
            &self.dir.join("recovery/tls.key"),
            &issued,
        );
        issued.serial
    }

    /// Replaces the default certificate files with a new certificate from the same CA; returns
    /// its serial.
    pub fn rotate_serving(&mut self) -> String {
        let issued = self
            .serving
            .issue(&CertSpec::server(&["localhost", "127.0.0.1"]));
        write_pair(
            &self.dir.join("serving.crt"),
            &self.dir.join("serving.key"),
            &issued,
        );
        issued.serial
    }

    /// The base URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.server.addr)
    }

    /// A kube config that connects like cert-syncer: `https://127.0.0.1:PORT`, SNI
    /// `localhost-recovery`, the recovery CA, no credentials yet.
    pub fn recovery_config(&self) -> kube::Config {
        recovery_config(&self.url(), &self.recovery_ca)
    }

    /// A kube client that connects like cert-syncer: SNI `localhost-recovery`, the recovery
    /// CA, the bearer token file `dir/token` (re-read by kube when it changes).
    pub fn recovery_client(&self) -> kube::Client {
        let mut config = self.recovery_config();
        config.auth_info.token_file = Some(self.dir.join("token").display().to_string());
        kube::Client::try_from(config).expect("a kube client")
    }

    /// `GET /metrics` as the admin: open watches and requests by verb (see
    /// `mini_apiserver::metrics`).
    ///
    /// # Panics
    /// When the request fails.
    pub async fn metrics(&self) -> String {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("a valid request");
        self.recovery_client()
            .request_text(request)
            .await
            .expect("GET /metrics")
    }

    /// Like [`ApiServer::recovery_client`], with `token` as the bearer token.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        let mut config = self.recovery_config();
        config.auth_info.token = Some(token.to_owned().into());
        kube::Client::try_from(config).expect("a kube client")
    }
}

/// A kube config that connects like cert-syncer to the apiserver at `url`: SNI
/// `localhost-recovery`, trusting `recovery_ca` (PEM), no credentials yet. Both backends use it.
pub fn recovery_config(url: &str, recovery_ca: &str) -> kube::Config {
    let mut config = kube::Config::new(url.parse().expect("a valid URL"));
    config.root_cert = Some(vec![
        CertificateDer::from_pem_slice(recovery_ca.as_bytes())
            .expect("the recovery CA is PEM")
            .to_vec(),
    ]);
    config.tls_server_name = Some("localhost-recovery".to_owned());
    config
}
