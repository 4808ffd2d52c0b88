//! The node tier: the static pod run the way it is deployed, by a real kubelet (v1.20.2, from
//! `../shared/node/setup`) through a private containerd (Debian's `containerd`, `runc`, `ctr`;
//! images built by `podman`), beside an etcd host process with TLS (see
//! `/work/shared/node/README.md`, mirrored in tests/README.md "The node tier").
//!
//! - [`skip_reason`] / [`require_node!`](crate::require_node): what is missing for this tier
//!   (printed as `SKIP: <reason>` by the tests, which then pass);
//! - [`Node`]: a containerd with its own root, state and socket, and a kubelet with a
//!   `staticPodPath` in the test's directory; dropped, it stops the kubelet, kills and deletes
//!   every container, stops containerd, unmounts what they mounted (deepest first) and removes
//!   the pods' `/var/log/pods` directories, also when the test failed;
//! - [`images`]: the images of `scripts/build-images` (the README's command), built once and
//!   imported into each node's containerd;
//! - [`etcd`]: etcd with TLS serving and client certificates (OpenShift's `etcd-client`).
//!
//! The pods use fixed host ports (6443, 2379, the sidecars' metrics ports, kubelet 10250), so the
//! `kubelet_*` tests run one at a time (nextest test group `node`, `.config/nextest.toml`).

pub mod cleanup;
pub mod cluster;
pub mod containerd;
pub mod etcd;
pub mod images;
pub mod kubelet;
pub mod scenario;
pub mod seed;

use std::path::PathBuf;
use std::sync::OnceLock;

pub use containerd::Containerd;
pub use kubelet::{Kubelet, KubeletOptions, Node};

/// The kubelet's API port (fixed: the kube-apiserver in the pod reaches it through the Node's
/// `InternalIP`, see [`KubeletOptions::node_ip`]).
pub const KUBELET_PORT: u16 = 10250;
/// The kubelet's healthz port.
pub const KUBELET_HEALTHZ_PORT: u16 = 10248;
/// etcd's client port (the pod's `--etcd-servers`).
pub const ETCD_PORT: u16 = 2379;
/// etcd's peer port.
pub const ETCD_PEER_PORT: u16 = 2380;
/// kube-apiserver's port in the pod.
pub const APISERVER_PORT: u16 = 6443;

/// The programs the node tier runs from `PATH` (Debian's packages `containerd`, `runc`,
/// `podman`; `ctr` comes with containerd; `kubectl` renders the pod with kustomize).
pub const HOST_PROGRAMS: [&str; 5] = ["containerd", "runc", "ctr", "podman", "kubectl"];

/// This machine's address on its default route (the source address the kernel picks for a
/// datagram to a TEST-NET address; nothing is sent): the node IP of a kubelet that
/// kube-apiserver must reach (the 1.20 kubelet refuses a loopback node IP).
///
/// # Errors
/// When the machine has no route off the loopback, or only a loopback or link-local address.
pub fn routable_host_ip() -> Result<std::net::IpAddr, String> {
    let socket = std::net::UdpSocket::bind(("0.0.0.0", 0))
        .map_err(|err| format!("cannot open a UDP socket: {err}"))?;
    socket
        .connect(("192.0.2.1", 9))
        .map_err(|err| format!("no route off the loopback: {err}"))?;
    let ip = socket
        .local_addr()
        .map_err(|err| format!("no source address: {err}"))?
        .ip();
    match ip {
        std::net::IpAddr::V4(v4)
            if !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified() =>
        {
            Ok(ip)
        }
        other => Err(format!(
            "no routable address (the default route's source is {other})"
        )),
    }
}

/// The directory with `kubelet` and `pause`: `E2E_NODE_ASSETS`, else what
/// `<repo root>/../shared/node/setup` prints (run once per process).
///
/// # Errors
/// Why there is none.
pub fn assets() -> Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(find_assets).clone()
}

fn find_assets() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("E2E_NODE_ASSETS").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let setup = crate::envtest::repo_root().join("../shared/node/setup");
            if !setup.is_file() {
                return Err(format!(
                    "no kubelet: E2E_NODE_ASSETS is unset and {} does not exist",
                    setup.display()
                ));
            }
            let out = std::process::Command::new(&setup)
                .output()
                .map_err(|err| format!("cannot run {}: {err}", setup.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} failed: {}",
                    setup.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    for binary in ["kubelet", "pause"] {
        if !dir.join(binary).is_file() {
            return Err(format!("{} has no {binary}", dir.display()));
        }
    }
    Ok(dir)
}

/// The full path of `program` on `PATH`, if any.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// Why the node tier cannot run here, or `None` when it can: it needs root (containerd mounts),
/// the node and envtest assets, and the host programs of [`HOST_PROGRAMS`].
pub fn skip_reason() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    if uid != Some(0) {
        return Some("the node tier runs containerd and a kubelet: it needs root".to_owned());
    }
    if let Some(missing) = HOST_PROGRAMS.iter().find(|p| on_path(p).is_none()) {
        return Some(format!(
            "no {missing} on PATH (apt-get install -y containerd runc podman kubectl)"
        ));
    }
    if let Err(reason) = assets().and_then(|_| cluster::openshift_dir()) {
        return Some(reason);
    }
    crate::envtest::skip_reason()
}

/// Returns from the calling test (which passes) after printing `SKIP: <reason>` when the node
/// tier cannot run here (see [`skip_reason`]).
#[macro_export]
macro_rules! require_node {
    () => {
        if let Some(reason) = $crate::node::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}
