//! The three-node tier's network and mounts: a bridge on the machine carrying a documentation
//! range (198.51.100.0/24, RFC 5737: never routed), and per node a network namespace joined to
//! it by a veth pair (its own loopback, so `localhost:6443` is its own kube-apiserver) and a
//! mount namespace of its own (`unshare --mount=FILE --propagation slave`, kept alive by that
//! file: the machine's mounts are private here, so nothing propagates either way but what the
//! tier shares itself, [`share_with_nodes`]), where the node's directories are bound onto `/etc/kubernetes`, `/var/lib/kubelet`,
//! `/var/log` and the harness's root path before containerd starts.
//!
//! Everything is named `crha-PID…` (`PID`: the test process): dropped, the [`Network`] kills
//! every process left in a node's network namespace, releases the mount namespace, deletes the
//! network namespaces (their end of each veth pair goes with them) and the bridge, also when
//! the test failed. [`remove_leftovers`] removes what a killed run of an earlier process left,
//! found by that prefix only.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::node::env::{Namespaces, NodeEnv};

/// Every name this tier gives on the machine starts with this (network namespaces, the bridge,
/// veth ends, `/run` and temporary directories).
pub const PREFIX: &str = "crha-";

/// The machine's address on the test's bridge (the test reaches the nodes from it).
pub const HOST_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

/// Makes `dir` (the tier's directory, before the nodes' namespaces are made) a shared mount
/// (bound onto itself), so that what the test mounts below it later on the machine (a cert
/// dir's tmpfs) appears in every node's mount namespace too, at the same path and in the node's
/// binds of it (a node's namespace is a slave: its own mounts, containerd's and the kubelet's,
/// never come back to the machine). Undone by unmounting `dir`.
///
/// # Errors
/// When `mount` fails.
pub fn share_with_nodes(dir: &Path) -> Result<(), String> {
    let dir = dir.display().to_string();
    run("mount", &["--bind", &dir, &dir])?;
    run("mount", &["--make-shared", &dir])
}

/// Node `index`'s address on the bridge: 198.51.100.11, .12, .13.
pub fn node_address(index: usize) -> Ipv4Addr {
    let last = u8::try_from(11 + index).expect("fewer than 245 nodes");
    Ipv4Addr::new(198, 51, 100, last)
}

/// The directories bound in each node's mount namespace, as the node sees them (the sources
/// are the same paths under the node's own root).
pub const NODE_PATHS: [&str; 3] = ["/etc/kubernetes", "/var/lib/kubelet", "/var/log"];

/// Runs `program args`; its stderr on failure.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|err| format!("cannot run {program}: {err}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The bridge, and each node's network and mount namespaces (see the module docs).
#[derive(Debug)]
pub struct Network {
    /// `crha-PID`: the bridge's name, the prefix of the rest.
    tag: String,
    /// `/run/crha-PID`: the mount namespaces' files (a private bind mount of itself).
    run_dir: PathBuf,
    nodes: Vec<Namespaces>,
    /// Mount points this run created on the machine (`/etc/kubernetes`, `/var/lib/kubelet`
    /// when absent), removed again if still empty.
    created: Vec<PathBuf>,
}

impl Network {
    /// Creates the bridge (198.51.100.1/24 on the machine's side) and `count` nodes'
    /// namespaces, each with its veth end `eth0` at [`node_address`] and its loopback up.
    ///
    /// # Errors
    /// The first command that failed (what was made so far is removed on drop).
    pub fn create(count: usize) -> Result<Network, String> {
        Network::create_for(std::process::id(), count)
    }

    /// [`Network::create`] named for process `pid` (`crha-PID`): the sweep's test makes what a
    /// killed run of another process leaves with it (and forgets it, as a killed run does).
    ///
    /// # Errors
    /// The first command that failed (what was made so far is removed on drop).
    pub fn create_for(pid: u32, count: usize) -> Result<Network, String> {
        let tag = format!("{PREFIX}{pid}");
        let mut network = Network {
            run_dir: PathBuf::from("/run").join(&tag),
            tag,
            nodes: Vec::new(),
            created: Vec::new(),
        };
        let bridge = network.tag.clone();
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        run(
            "ip",
            &["addr", "add", &format!("{HOST_ADDRESS}/24"), "dev", &bridge],
        )?;
        run("ip", &["link", "set", &bridge, "up"])?;
        // The namespace files live on a private mount: binding a mount namespace to a file on a
        // shared mount (systemd's /run) would be refused.
        std::fs::create_dir_all(&network.run_dir)
            .map_err(|err| format!("{}: {err}", network.run_dir.display()))?;
        let run_dir = network.run_dir.display().to_string();
        run("mount", &["--bind", &run_dir, &run_dir])?;
        run("mount", &["--make-private", &run_dir])?;
        for index in 0..count {
            network.add_node(index)?;
        }
        for path in NODE_PATHS {
            let path = Path::new(path);
            if !path.exists() {
                std::fs::create_dir_all(path)
                    .map_err(|err| format!("mount point {}: {err}", path.display()))?;
                network.created.push(path.to_owned());
            }
        }
        Ok(network)
    }

    fn add_node(&mut self, index: usize) -> Result<(), String> {
        let netns = format!("{}-{index}", self.tag);
        run("ip", &["netns", "add", &netns])?;
        let mount = self.run_dir.join(format!("mnt-{index}"));
        self.nodes.push(Namespaces {
            net: PathBuf::from("/run/netns").join(&netns),
            mount: mount.clone(),
        });
        let veth = format!("{}-{index}", self.tag);
        run(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
        )?;
        run("ip", &["link", "set", &veth, "master", &self.tag, "up"])?;
        let address = format!("{}/24", node_address(index));
        run(
            "ip",
            &["-n", &netns, "addr", "add", &address, "dev", "eth0"],
        )?;
        run("ip", &["-n", &netns, "link", "set", "eth0", "up"])?;
        run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
        std::fs::write(&mount, "").map_err(|err| format!("{}: {err}", mount.display()))?;
        run(
            "unshare",
            &[
                &format!("--mount={}", mount.display()),
                "--propagation",
                "slave",
                "true",
            ],
        )
    }

    /// Node `index`'s namespaces.
    pub fn namespaces(&self, index: usize) -> &Namespaces {
        &self.nodes[index]
    }

    /// How node `index` (named `name`) runs: its namespaces and address, its kubelet's root
    /// dir `/var/lib/kubelet` and its `/var/log/pods` (`root/var/log/pods` on the machine).
    pub fn env(&self, index: usize, name: &str, root: &Path) -> NodeEnv {
        NodeEnv {
            name: name.to_owned(),
            address: IpAddr::V4(node_address(index)),
            namespaces: Some(self.nodes[index].clone()),
            kubelet_root_dir: Some(PathBuf::from("/var/lib/kubelet")),
            pod_logs: root.join("var/log/pods"),
        }
    }

    /// Binds `source` (recursively: mounts below it come along) onto `target` in node
    /// `index`'s mount namespace only.
    ///
    /// # Errors
    /// When `mount` fails.
    pub fn bind(&self, index: usize, source: &Path, target: &Path) -> Result<(), String> {
        run(
            "nsenter",
            &[
                &format!("--mount={}", self.nodes[index].mount.display()),
                "--",
                "mount",
                "--rbind",
                &source.display().to_string(),
                &target.display().to_string(),
            ],
        )
    }

    /// The processes in node `index`'s network namespace (the node's kubelet, containerd, its
    /// shims and containers, its etcd member, its host processes).
    pub fn pids(&self, index: usize) -> Vec<u32> {
        pids_in(&self.nodes[index].net)
    }

    /// SIGKILLs every process of node `index` at once: the node loses power.
    pub fn power_off(&self, index: usize) {
        kill_all(&self.pids(index));
    }

    /// Tears everything down (idempotent): every process left in a node's namespace killed,
    /// the mount namespaces released, the network namespaces and the bridge deleted, the run
    /// directory and the mount points this run created removed.
    pub fn tear_down(&mut self) {
        for namespaces in self.nodes.drain(..) {
            kill_all(&pids_in(&namespaces.net));
            let _ = run("umount", &[&namespaces.mount.display().to_string()]);
            if let Some(name) = namespaces.net.file_name().and_then(|n| n.to_str()) {
                let _ = run("ip", &["netns", "del", name]);
            }
        }
        let _ = run("ip", &["link", "del", &self.tag]);
        if self.run_dir.exists() {
            let _ = run("umount", &[&self.run_dir.display().to_string()]);
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
        for path in self.created.drain(..) {
            // Only if empty: nothing of anyone else's is ever removed.
            let _ = std::fs::remove_dir(path);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.tear_down();
    }
}

/// The processes whose network namespace is the one bound at `netns` (`/proc/PID/ns/net` is
/// `net:[INODE]`, the inode of the bound file).
pub fn pids_in(netns: &Path) -> Vec<u32> {
    let Ok(inode) = std::fs::metadata(netns).map(|m| m.ino()) else {
        return Vec::new();
    };
    let wanted = format!("net:[{inode}]");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|link| link.to_string_lossy() == wanted)
        })
        .collect()
}

/// SIGKILLs `pids` (those that already exited are ignored).
pub fn kill_all(pids: &[u32]) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for pid in pids {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Whether `crha-PID…` belongs to a test process that still runs (a three-node test binary,
/// `kubelet_ha…`, with that pid): its things are left alone.
fn owner_alive(name: &str) -> bool {
    let Some(pid) = name
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
    else {
        return false;
    };
    if pid == std::process::id() {
        return true;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("kubelet_ha"))
}

/// Removes what an earlier run that was killed left (its owner no longer runs), found by
/// [`PREFIX`] only: processes in its network namespaces, the namespaces, its bridge, its `/run`
/// directory, mounts under its temporary directories and those directories. Returns what was
/// removed, for the log.
pub fn remove_leftovers() -> Vec<String> {
    let mut removed = Vec::new();
    let listed = Command::new("ip").args(["netns", "list"]).output();
    let text = listed
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for name in text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX) && !owner_alive(n))
    {
        kill_all(&pids_in(&Path::new("/run/netns").join(name)));
        let _ = run("ip", &["netns", "del", name]);
        removed.push(format!("network namespace {name}"));
    }
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for name in links
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or_default().to_owned())
        .filter(|n| n.starts_with(PREFIX) && !owner_alive(n))
    {
        let _ = run("ip", &["link", "del", &name]);
        removed.push(format!("link {name}"));
    }
    for dir in [PathBuf::from("/run"), std::env::temp_dir()] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(PREFIX) || owner_alive(&name) {
                continue;
            }
            let path = entry.path();
            let stuck = crate::node::cleanup::unmount_under(&path);
            if stuck.is_empty() {
                let _ = std::fs::remove_dir_all(&path);
                removed.push(path.display().to_string());
            } else {
                eprintln!("leftover {}: still mounted: {stuck:?}", path.display());
            }
        }
    }
    removed
}
