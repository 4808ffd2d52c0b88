//! The real kube-apiserver and etcd (envtest assets): finding them, and the command lines that
//! start them on 127.0.0.1, shared by the end-to-end harness and the recovery demo.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable naming the assets directory (the controller-runtime envtest convention).
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// The directory holding `kube-apiserver` and `etcd`: `KUBEBUILDER_ASSETS` (relative to the
/// workspace root, see [`crate::env`]), else what `../shared/envtest/setup` prints, looked for
/// beside the current directory and beside the workspace this kit was built from.
///
/// # Errors
/// Why there is none: `KUBEBUILDER_ASSETS` unset and no setup script (printed by tests that
/// skip, and by the demo).
///
/// # Panics
/// When `KUBEBUILDER_ASSETS` names a path that is not there or lacks a binary, or the setup
/// script fails or prints such a directory: a broken command or machine, never a skip.
pub fn find_assets() -> Result<PathBuf, String> {
    let check = |dir: PathBuf, from: &dyn Fn(&Path, &str) -> String| -> PathBuf {
        for binary in ["kube-apiserver", "etcd"] {
            if !dir.join(binary).is_file() {
                panic!("{}", from(&dir, &format!("has no {binary}")));
            }
        }
        dir
    };
    if let Some(dir) = crate::env::existing(ASSETS_ENV) {
        return Ok(check(dir, &|dir, what| {
            crate::env::missing(ASSETS_ENV, dir, what)
        }));
    }
    let workspace_setup = workspace_root().join("../shared/envtest/setup");
    let Some(setup) = [
        PathBuf::from("../shared/envtest/setup"),
        workspace_setup.clone(),
    ]
    .into_iter()
    .find(|p| p.is_file()) else {
        return Err(format!(
            "no real kube-apiserver: {ASSETS_ENV} is unset and {} does not exist",
            workspace_setup.display()
        ));
    };
    let output = Command::new(&setup)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", setup.display()));
    assert!(
        output.status.success(),
        "{} failed ({}): {}",
        setup.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Ok(check(PathBuf::from(dir), &|dir, what| {
        format!(
            "{} printed {}, which {what}",
            setup.display(),
            dir.display()
        )
    }))
}

pub use crate::env::workspace_root;

/// Free 127.0.0.1 ports, bound together and released (the processes bind them just after;
/// another process may take one in between, so callers retry on `address already in use`).
///
/// # Panics
/// When no port can be bound.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("bound").port())
}

/// etcd on 127.0.0.1 with its data in `data_dir`; clients at `client_port`.
pub fn etcd_command(assets: &Path, data_dir: &Path, client_port: u16, peer_port: u16) -> Command {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut command = Command::new(assets.join("etcd"));
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")]);
    command
}

/// The files a kube-apiserver is started with.
#[derive(Debug, Clone)]
pub struct ApiserverFiles {
    /// `--tls-cert-file` and `--tls-private-key-file`.
    pub serving: (PathBuf, PathBuf),
    /// `--tls-sni-cert-key CERT,KEY:NAME`, one per entry.
    pub sni: Vec<(PathBuf, PathBuf, String)>,
    /// `--client-ca-file`.
    pub client_ca: PathBuf,
    /// `--token-auth-file`.
    pub tokens: PathBuf,
    /// The service-account signing key (private, public): kube-apiserver refuses to start
    /// without one (see [`crate::pki::key_pair_pem`]).
    pub service_account: (PathBuf, PathBuf),
}

/// How kube-apiserver reaches etcd.
#[derive(Debug, Clone)]
pub enum EtcdConnection {
    /// `http://127.0.0.1:PORT` ([`etcd_command`]).
    Plain(u16),
    /// An etcd with TLS and client-certificate authentication (a control-plane node's).
    Tls {
        /// `--etcd-servers`.
        url: String,
        /// `--etcd-cafile`.
        ca: PathBuf,
        /// `--etcd-certfile`.
        cert: PathBuf,
        /// `--etcd-keyfile`.
        key: PathBuf,
    },
}

/// kube-apiserver on `127.0.0.1:port` over the etcd at `etcd_port`, RBAC, with `files`.
pub fn kube_apiserver_command(
    assets: &Path,
    files: &ApiserverFiles,
    etcd_port: u16,
    port: u16,
) -> Command {
    kube_apiserver_command_with(assets, files, &EtcdConnection::Plain(etcd_port), port)
}

/// [`kube_apiserver_command`] over any [`EtcdConnection`].
pub fn kube_apiserver_command_with(
    assets: &Path,
    files: &ApiserverFiles,
    etcd: &EtcdConnection,
    port: u16,
) -> Command {
    let path = |p: &Path| p.display().to_string();
    let mut command = Command::new(assets.join("kube-apiserver"));
    match etcd {
        EtcdConnection::Plain(etcd_port) => {
            command.args(["--etcd-servers", &format!("http://127.0.0.1:{etcd_port}")]);
        }
        EtcdConnection::Tls { url, ca, cert, key } => {
            command
                .args(["--etcd-servers", url])
                .args(["--etcd-cafile", &path(ca)])
                .args(["--etcd-certfile", &path(cert)])
                .args(["--etcd-keyfile", &path(key)]);
        }
    }
    command
        .args([
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
        ])
        .args(["--secure-port", &port.to_string()])
        .args(["--tls-cert-file", &path(&files.serving.0)])
        .args(["--tls-private-key-file", &path(&files.serving.1)]);
    for (cert, key, name) in &files.sni {
        command.args([
            "--tls-sni-cert-key",
            &format!("{},{}:{name}", path(cert), path(key)),
        ]);
    }
    command
        .args(["--client-ca-file", &path(&files.client_ca)])
        .args(["--token-auth-file", &path(&files.tokens)])
        .args(["--authorization-mode", "RBAC"])
        .args([
            "--service-account-key-file",
            &path(&files.service_account.1),
        ])
        .args([
            "--service-account-signing-key-file",
            &path(&files.service_account.0),
        ])
        .args(["--service-account-issuer", "https://kubernetes.default.svc"])
        .args(["--service-cluster-ip-range", "10.0.0.0/24"]);
    command
}
