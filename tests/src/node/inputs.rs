//! What the node tier needs from this machine, and whether it has it: root, the host programs,
//! the kubelet's assets, OpenShift's cluster objects, a routable address.

use std::path::PathBuf;
use std::sync::OnceLock;

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
    if let Err(reason) = assets().and_then(|_| openshift_dir()) {
        return Some(reason);
    }
    crate::envtest::skip_reason()
}

/// OpenShift's CRDs and cluster objects (`crds.yaml`, `cluster-objects.sh`):
/// `E2E_OPENSHIFT_DIR`, else `<repo root>/../shared/openshift`.
///
/// # Errors
/// When neither holds them (the node tier then skips).
pub fn openshift_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("E2E_OPENSHIFT_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(
            || crate::envtest::repo_root().join("../shared/openshift"),
            PathBuf::from,
        );
    for file in ["crds.yaml", "cluster-objects.sh"] {
        if !dir.join(file).is_file() {
            return Err(format!(
                "no OpenShift cluster objects: {} has no {file} (set E2E_OPENSHIFT_DIR)",
                dir.display()
            ));
        }
    }
    Ok(dir)
}
