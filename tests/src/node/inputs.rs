//! What the node tier needs from this machine, and whether it has it: root, the host programs,
//! the kubelet's assets, OpenShift's cluster objects, a node address on the loopback.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The programs the node tier runs from `PATH` (Debian's packages `containerd`, `runc`,
/// `podman`; `ctr` comes with containerd; `kubectl` renders the pod with kustomize).
pub const HOST_PROGRAMS: [&str; 5] = ["containerd", "runc", "ctr", "podman", "kubectl"];

/// An address on the loopback interface for a node that kube-apiserver must reach by its
/// `InternalIP` (the 1.20 kubelet refuses a loopback node IP, "nodeIP can't be loopback
/// address", and then reports no address at all): `198.51.100.7/32` (TEST-NET-2, never routed),
/// added to `lo` for as long as the returned guard lives. Traffic to it never leaves the
/// machine, like 127.0.0.1's; the machine's own network address is never used.
///
/// # Errors
/// When the address cannot be added (not root, no `ip`).
pub fn loopback_node_ip() -> Result<LoopbackAddress, String> {
    let ip = std::net::Ipv4Addr::new(198, 51, 100, 7);
    let cidr = format!("{ip}/32");
    let shown = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", "lo"])
        .output()
        .map_err(|err| format!("cannot run `ip addr show dev lo`: {err}"))?;
    let present = String::from_utf8_lossy(&shown.stdout).contains(&cidr);
    if !present {
        let added = std::process::Command::new("ip")
            .args(["addr", "add", &cidr, "dev", "lo"])
            .output()
            .map_err(|err| format!("cannot run `ip addr add {cidr} dev lo`: {err}"))?;
        if !added.status.success() {
            return Err(format!(
                "`ip addr add {cidr} dev lo` failed: {}",
                String::from_utf8_lossy(&added.stderr).trim()
            ));
        }
    }
    Ok(LoopbackAddress {
        ip: std::net::IpAddr::V4(ip),
        added: !present,
    })
}

/// An address on `lo` from [`loopback_node_ip`], removed on drop if this process added it.
#[derive(Debug)]
pub struct LoopbackAddress {
    /// The address.
    pub ip: std::net::IpAddr,
    added: bool,
}

impl Drop for LoopbackAddress {
    fn drop(&mut self) {
        if self.added {
            let _ = std::process::Command::new("ip")
                .args(["addr", "del", &format!("{}/32", self.ip), "dev", "lo"])
                .output();
        }
    }
}

/// The directory with `kubelet` and `pause`: `E2E_NODE_ASSETS` (relative to the repository
/// root, see [`testkit::env`]), else what `<repo root>/../shared/node/setup` prints (run once
/// per process).
///
/// # Errors
/// Why there is none: `E2E_NODE_ASSETS` unset and no setup script (the node tier skips).
///
/// # Panics
/// When `E2E_NODE_ASSETS` names a path that is not there or lacks a binary, or the setup script
/// fails: a broken command or machine, never a skip.
pub fn assets() -> Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(find_assets).clone()
}

fn find_assets() -> Result<PathBuf, String> {
    const VAR: &str = "E2E_NODE_ASSETS";
    let (dir, from) = match testkit::env::existing(VAR) {
        Some(dir) => (dir, VAR.to_owned()),
        None => {
            let setup = crate::envtest::repo_root().join("../shared/node/setup");
            if !setup.is_file() {
                return Err(format!(
                    "no kubelet: {VAR} is unset and {} does not exist",
                    setup.display()
                ));
            }
            let out = std::process::Command::new(&setup)
                .output()
                .unwrap_or_else(|err| panic!("cannot run {}: {err}", setup.display()));
            assert!(
                out.status.success(),
                "{} failed: {}",
                setup.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            (dir, setup.display().to_string())
        }
    };
    for binary in ["kubelet", "pause"] {
        assert!(
            dir.join(binary).is_file(),
            "{}",
            if from == VAR {
                testkit::env::missing(VAR, &dir, &format!("has no {binary}"))
            } else {
                format!("{from} printed {}, which has no {binary}", dir.display())
            }
        );
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
/// `E2E_OPENSHIFT_DIR` (relative to the repository root, see [`testkit::env`]), else
/// `<repo root>/../shared/openshift`.
///
/// # Errors
/// When `E2E_OPENSHIFT_DIR` is unset and `../shared/openshift` does not exist (the node tier
/// then skips).
///
/// # Panics
/// When `E2E_OPENSHIFT_DIR` names a path that is not there, or either directory lacks a file.
pub fn openshift_dir() -> Result<PathBuf, String> {
    const VAR: &str = "E2E_OPENSHIFT_DIR";
    let named = testkit::env::existing(VAR);
    let dir = match &named {
        Some(dir) => dir.clone(),
        None => {
            let shared = crate::envtest::repo_root().join("../shared/openshift");
            if !shared.exists() {
                return Err(format!(
                    "no OpenShift cluster objects: {VAR} is unset and {} does not exist",
                    shared.display()
                ));
            }
            shared
        }
    };
    for file in ["crds.yaml", "cluster-objects.sh"] {
        if !dir.join(file).is_file() {
            let what = format!("has no {file}");
            panic!(
                "{}",
                match named {
                    Some(_) => testkit::env::missing(VAR, &dir, &what),
                    None => format!("{} {what}", dir.display()),
                }
            );
        }
    }
    Ok(dir)
}
