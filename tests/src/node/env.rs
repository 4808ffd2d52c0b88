//! Where a node's processes run: the machine's own namespaces (the single-node tier, a node per
//! test), or a network and a mount namespace of the node's own (the three-node tier,
//! [`super::ha`]), entered with `nsenter --net --mount` for every program the node starts
//! (containerd, the kubelet, etcd, host processes such as the approver).
//!
//! `nsenter`, not `ip netns exec`: the latter remounts `/sys` for the namespace and hides
//! `/sys/fs/cgroup`, and the kubelet then dies with "mountpoint for cpu not found"
//! (`../shared/node/README.md`, "Several nodes on one machine").

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;

/// The node's name in this test process (`node-PID`): its mirror pods and log directories are
/// told apart from other runs' by it.
pub fn node_name() -> String {
    format!("node-{}", std::process::id())
}

/// The namespaces a node's processes enter (bind-mounted namespace files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespaces {
    /// The network namespace (`/run/netns/NAME`, made by `ip netns add`).
    pub net: PathBuf,
    /// The mount namespace (a file `unshare --mount=FILE` bound it to).
    pub mount: PathBuf,
}

/// How a node's processes are started and where the test reaches them.
#[derive(Debug, Clone)]
pub struct NodeEnv {
    /// The node's name (`--hostname-override`): its mirror pods are `POD-NAME`.
    pub name: String,
    /// Where the test reaches the node's servers (the kubelet's healthz, kube-apiserver):
    /// 127.0.0.1 on the machine's own network; the node's address on the test's bridge when it
    /// has a network namespace.
    pub address: IpAddr,
    /// The namespaces to enter; `None`: the machine's own.
    pub namespaces: Option<Namespaces>,
    /// The kubelet's `--root-dir`; `None`: `kubelet/` in the node's directory.
    pub kubelet_root_dir: Option<PathBuf>,
    /// The node's `/var/log/pods`, as the test (on the machine's own mounts) reads it.
    pub pod_logs: PathBuf,
}

impl NodeEnv {
    /// The machine's own namespaces: the single-node tier, named [`node_name`].
    pub fn host() -> NodeEnv {
        NodeEnv {
            name: node_name(),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            namespaces: None,
            kubelet_root_dir: None,
            pod_logs: PathBuf::from("/var/log/pods"),
        }
    }

    /// `command` as it runs on this node: unchanged on the machine's own namespaces, else
    /// `nsenter --net=N --mount=M -- PROGRAM ARGS` with the same environment and working
    /// directory. `nsenter` execs the program without forking (no PID namespace is entered), so
    /// the child's pid is the program's and killing it kills the program.
    pub fn enter(&self, command: Command) -> Command {
        let Some(namespaces) = &self.namespaces else {
            return command;
        };
        let mut entered = Command::new("nsenter");
        entered
            .arg(format!("--net={}", namespaces.net.display()))
            .arg(format!("--mount={}", namespaces.mount.display()))
            .arg("--")
            .arg(command.get_program())
            .args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => entered.env(key, value),
                None => entered.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            entered.current_dir(dir);
        }
        entered
    }
}
