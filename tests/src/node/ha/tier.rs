//! [`Tier`]: N control-plane nodes on this machine, each as production runs one, after a sleep.
//!
//! [`Tier::prepare`], in order:
//! 1. leftovers of an earlier killed run removed ([`super::namespaces::remove_leftovers`]);
//!    the bridge and each node's network and mount namespaces ([`Network`]);
//! 2. the etcd cluster, one member per node ([`super::etcd_cluster`]);
//! 3. the slept control plane of the single-node tier, prepared once through member 0
//!    ([`ControlPlane::prepare_pod_on`], [`KcmPlane::prepare`]: the objects in etcd, the files
//!    of the three pods' resource and cert dirs, the kubelet's expired identity) under a
//!    template root, plus the audit policy;
//! 4. per node: the template copied to the node's own root (`cp -a`), the kubelet's expired
//!    identity re-issued for this node's name (from the slept `csr-signer` on disk), and the
//!    node's mount namespace given its root at the template's path (every path the harness
//!    wrote resolves to the node's copy there), `/etc/kubernetes`, `/var/lib/kubelet` and
//!    `/var/log`;
//! 5. per node: containerd in the node's namespaces with the images (node 0 runs
//!    `scripts/build-images`; the others import node 0's export), and the three static pods of
//!    `manifests/` exactly as `kubectl kustomize` renders them (`/etc/kubernetes/...` host
//!    paths, the node's own address), the kube-apiserver's with its audit log
//!    ([`super::audit::instrument`]).
//!
//! Only the kubelets are left: [`Tier::wake`] starts them. Dropped, the tier stops every
//! kubelet, container, containerd and etcd member, then tears the namespaces down (every
//! process left in them killed), also when the test failed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::audit;
use super::etcd_cluster;
use super::namespaces::{self, NODE_PATHS, Network, PREFIX};
use super::node_files::{
    KUBELET_CERT_DIR, bind_node_paths, copy_template, mount_tmpfs_keeping, slept_csr_signer,
};
use crate::node::cluster::ControlPlane;
use crate::node::env::NodeEnv;
use crate::node::etcd::Etcd;
use crate::node::kcm_plane::{self, KcmPlane};
use crate::node::pod::{STATIC_POD_DIR, render_pod_from};
use crate::node::scheduler::render_scheduler_pod;
use crate::node::{KubeletOptions, Node, images};

/// How the tier is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierOptions {
    /// How many nodes (3 for production's shape; 1 where one node is enough).
    pub nodes: usize,
    /// Each node's kube-apiserver cert dir on a tmpfs of this many bytes (the disk-full fault
    /// fills it); `None`: on the test's disk.
    pub cert_dir_tmpfs: Option<u64>,
}

impl TierOptions {
    /// `nodes` nodes, cert dirs on the test's disk.
    pub fn nodes(nodes: usize) -> TierOptions {
        TierOptions {
            nodes,
            cert_dir_tmpfs: None,
        }
    }
}

/// The nodes' names, as OpenShift names its control-plane nodes.
pub fn node_name(index: usize) -> String {
    format!("master-{index}")
}

/// One node of the tier.
pub struct TierNode {
    /// Its index (0, 1, 2).
    pub index: usize,
    /// Its directory on the machine (`root/`, `node/`, `etcd/`, `pristine/`).
    pub dir: PathBuf,
    /// Its name, namespaces and address.
    pub env: NodeEnv,
    /// Its own root on the machine: its `/etc/kubernetes` is `root/etc/kubernetes`, and so on.
    pub root: PathBuf,
    /// Its containerd and (once woken) kubelet.
    pub node: Node,
    /// Its etcd member (node 0's is the plane's, [`ControlPlane::etcd`]).
    pub etcd: Option<Etcd>,
    /// When its kubelet was last started ([`Tier::wake`]).
    pub started: Option<Instant>,
}

impl std::fmt::Debug for TierNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierNode")
            .field("name", &self.env.name)
            .field("address", &self.env.address)
            .finish_non_exhaustive()
    }
}

/// The tier (see the module docs).
pub struct Tier {
    /// The nodes, by index.
    pub nodes: Vec<TierNode>,
    /// The slept control plane's template (node 0's name in its kubelet identity) and etcd
    /// member 0.
    pub plane: ControlPlane,
    /// The kube-controller-manager's and kube-scheduler's halves of the template.
    pub kcm: KcmPlane,
    /// The kubelets' options (the same paths on every node; the address is added per node).
    pub kubelet: KubeletOptions,
    /// The template root: every node's own root is bound here in its mount namespace.
    pub template: PathBuf,
    network: Network,
    /// The test's directory (`crha-PID-…` in the temporary directory).
    pub tmp: tempfile::TempDir,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Tier {
    /// Prepares `count` nodes as the sleep left them (see the module docs); no kubelet runs.
    /// Blocking parts run in `block_in_place`: call it on a multi-thread runtime.
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare(count: usize) -> Tier {
        Tier::prepare_with(TierOptions::nodes(count)).await
    }

    /// [`Tier::prepare`] with `options`.
    ///
    /// # Panics
    /// When any step fails, naming it.
    pub async fn prepare_with(options: TierOptions) -> Tier {
        let count = options.nodes;
        let began = Instant::now();
        for removed in namespaces::remove_leftovers() {
            eprintln!("removed a leftover of an earlier run: {removed}");
        }
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir()
            .expect("a temp dir");
        namespaces::share_with_nodes(tmp.path()).unwrap_or_else(|err| panic!("{err}"));
        let network = Network::create(count).unwrap_or_else(|err| panic!("{err}"));
        let node_dir = |index: usize| tmp.path().join(format!("nodes/{index}"));
        let envs: Vec<NodeEnv> = (0..count)
            .map(|i| network.env(i, &node_name(i), &node_dir(i).join("root")))
            .collect();
        let (_, mut members) = tokio::task::block_in_place(|| {
            etcd_cluster::start(&envs, |index| node_dir(index).join("etcd"))
        });
        eprintln!(
            "tier: {count} nodes' namespaces and etcd members in {} ms",
            began.elapsed().as_millis()
        );

        let template = tmp.path().join("root");
        let first = members.remove(0);
        let plane =
            ControlPlane::prepare_pod_on(&template, &envs[0].name, STATIC_POD_DIR, first).await;
        let kcm = KcmPlane::prepare(&plane, &envs[0].name).await;
        testkit::rename::rename_into_with_mode(
            &plane.resources.join(audit::POLICY_FILE),
            audit::POLICY.as_bytes(),
            0o644,
        );
        eprintln!(
            "tier: slept control plane prepared in {} ms",
            began.elapsed().as_millis()
        );

        let signer = slept_csr_signer(&kcm);
        let mut nodes = Vec::new();
        let mut members = members.into_iter();
        for (index, env) in envs.into_iter().enumerate() {
            let root = node_dir(index).join("root");
            tokio::task::block_in_place(|| {
                copy_template(&template, &root, &signer, &env.name);
                if let Some(size) = options.cert_dir_tmpfs {
                    let certs = root.join(
                        plane
                            .certs
                            .strip_prefix(&template)
                            .expect("under the template"),
                    );
                    mount_tmpfs_keeping(&certs, size);
                }
                bind_node_paths(&network, index, &template, &root);
            });
            nodes.push((index, env, root));
        }
        let nodes = tokio::task::block_in_place(|| start_runtimes(nodes, &node_dir, &mut members));
        let kubelet = KubeletOptions {
            kubeconfig: Some(kcm.kubelet_kubeconfig.clone()),
            extra_args: node_kubelet_args(&kcm),
            ..KubeletOptions::default()
        };
        let tier = Tier {
            nodes,
            plane,
            kcm,
            kubelet,
            template,
            network,
            tmp,
        };
        for node in &tier.nodes {
            for (file, pod) in static_pods() {
                node.node.place_manifest(
                    file,
                    &serde_json::to_string_pretty(&pod).expect("the pod serialises"),
                );
            }
        }
        eprintln!(
            "tier: {count} nodes prepared (containerd, images, static pods) in {} ms",
            began.elapsed().as_millis()
        );
        tier
    }

    /// Starts the kubelets of `which` at once (one thread each), as nodes powered on together;
    /// each node's `started` is set.
    ///
    /// # Panics
    /// When a kubelet does not become healthy (with its log).
    pub fn wake(&mut self, which: &[usize]) {
        let options = &self.kubelet;
        tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                for node in self.nodes.iter_mut().filter(|n| which.contains(&n.index)) {
                    scope.spawn(move || {
                        let mut options = options.clone();
                        options.node_ip = Some(node.env.address);
                        node.started = Some(node.node.start_kubelet(&options).started);
                    });
                }
            });
        });
    }

    /// Restarts the kubelet of node `index` if it exited, as systemd's `Restart=always` does
    /// ([`Node::keep_kubelet_running`]); whether it did. A node not woken is left alone.
    pub fn keep_kubelet(&mut self, index: usize) -> bool {
        let node = &mut self.nodes[index].node;
        if node.kubelet().is_none() {
            return false;
        }
        tokio::task::block_in_place(|| node.keep_kubelet_running())
    }

    /// Node `index`'s kube-apiserver, as the test reaches it (`https://ADDRESS:6443`).
    pub fn apiserver(&self, index: usize) -> SocketAddr {
        SocketAddr::new(
            self.nodes[index].env.address,
            crate::node::ports::APISERVER_PORT,
        )
    }

    /// An admin client of node `index`'s kube-apiserver through `localhost-recovery`.
    pub fn admin(&self, index: usize) -> kube::Client {
        let url = format!("https://{}", self.apiserver(index));
        let mut config = crate::apiserver::recovery_config(&url, &self.plane.recovery_ca);
        config.auth_info.token = Some(self.plane.admin_token.clone().into());
        config.read_timeout = Some(Duration::from_secs(10));
        config.connect_timeout = Some(Duration::from_secs(5));
        kube::Client::try_from(config).expect("a kube client")
    }

    /// A kubeconfig for kubectl as the admin through node `index`'s kube-apiserver
    /// (`https://ADDRESS:6443`, SNI `localhost-recovery`), written under the test's directory.
    pub fn admin_kubeconfig(&self, index: usize) -> PathBuf {
        let dir = self.tmp.path();
        let ca = dir.join("recovery-ca.crt");
        std::fs::write(&ca, &self.plane.recovery_ca).expect("the recovery CA");
        let path = dir.join(format!("{}.kubeconfig", self.nodes[index].env.name));
        let text = crate::node::kubeconfig::kubeconfig(
            &format!("https://{}", self.apiserver(index)),
            Some("localhost-recovery"),
            &ca,
            &std::collections::BTreeMap::from([("token", self.plane.admin_token.clone())]),
        );
        testkit::rename::rename_into_with_mode(&path, text.as_bytes(), 0o600);
        path
    }

    /// How to enter node `index` by hand (a shell in its namespaces).
    pub fn enter_command(&self, index: usize) -> String {
        let namespaces = self.network.namespaces(index);
        format!(
            "nsenter --net={} --mount={} bash",
            namespaces.net.display(),
            namespaces.mount.display()
        )
    }

    /// Where node `index`'s file `path` (as the node sees it: under `/etc/kubernetes`,
    /// `/var/lib/kubelet`, `/var/log` or the template root) is on the machine.
    pub fn host_path(&self, index: usize, path: &Path) -> PathBuf {
        let root = &self.nodes[index].root;
        if let Ok(rest) = path.strip_prefix(&self.template) {
            return root.join(rest);
        }
        for bound in NODE_PATHS {
            if path.starts_with(bound) {
                return root.join(path.strip_prefix("/").expect("an absolute path"));
            }
        }
        path.to_owned()
    }

    /// Reads node `index`'s file `path` as the node sees it: symbolic links followed the way
    /// the node resolves them (the kubelet's `kubelet-client-current.pem` names a path under
    /// the template root).
    ///
    /// # Errors
    /// When the file cannot be read.
    pub fn read(&self, index: usize, path: &Path) -> std::io::Result<String> {
        let mut at = self.host_path(index, path);
        for _ in 0..8 {
            match std::fs::read_link(&at) {
                Ok(target) => {
                    let target = if target.is_absolute() {
                        target
                    } else {
                        at.parent().expect("a parent").join(target)
                    };
                    at = self.host_path(index, &target);
                }
                Err(_) => return std::fs::read_to_string(&at),
            }
        }
        Err(std::io::Error::other(format!(
            "{}: too many links",
            path.display()
        )))
    }

    /// Node `index`'s audit log on the machine.
    pub fn audit_log(&self, index: usize) -> PathBuf {
        self.host_path(index, &Path::new(audit::LOG_DIR).join("audit.log"))
    }

    /// Every write in every node's audit log.
    pub fn writes(&self) -> Vec<audit::Write> {
        (0..self.nodes.len())
            .flat_map(|index| audit::writes(&self.audit_log(index), index))
            .collect()
    }

    /// Node `index`'s etcd member.
    pub fn etcd(&mut self, index: usize) -> &mut Etcd {
        if index == 0 {
            &mut self.plane.etcd
        } else {
            self.nodes[index]
                .etcd
                .as_mut()
                .expect("the node's etcd member")
        }
    }

    /// Every node's network namespace (bound file), by index.
    pub fn network_namespaces(&self) -> Vec<PathBuf> {
        (0..self.nodes.len())
            .map(|i| self.network.namespaces(i).net.clone())
            .collect()
    }

    /// The nodes' names, by index.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.env.name.clone()).collect()
    }

    /// The processes in node `index`'s network namespace.
    pub fn pids(&self, index: usize) -> Vec<u32> {
        self.network.pids(index)
    }

    /// Node `index` loses power: every process in its namespaces (kubelet, containerd, shims,
    /// containers, etcd member) SIGKILLed at once; the handles are reaped.
    pub fn power_off(&mut self, index: usize) {
        self.network.power_off(index);
        let node = &mut self.nodes[index];
        if let Some(kubelet) = node.node.kubelet() {
            kubelet.kill();
        }
        node.node.containerd.kill();
        self.etcd(index).kill();
    }

    /// Stops every node's processes in order (kubelets, containers, containerd, etcd members),
    /// then tears the namespaces down. Runs on drop; calling it earlier is harmless.
    pub fn tear_down(&mut self) {
        for node in &mut self.nodes {
            node.node.clean_up();
            if let Some(etcd) = node.etcd.as_mut() {
                etcd.kill();
            }
        }
        self.plane.etcd.kill();
        self.network.tear_down();
        // The cert dirs' tmpfs mounts and the tier directory's shared bind (the machine's own).
        let left = crate::node::cleanup::unmount_under(self.tmp.path());
        if !left.is_empty() {
            eprintln!("still mounted after the tier's teardown: {left:?}");
        }
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.tear_down();
    }
}

/// The kubelet's flags after the sleep ([`KcmPlane::kubelet_args`]) with its certificate
/// directory where a node keeps it, `--cert-dir=/var/lib/kubelet/pki` (the node's own, in its
/// mount namespace): the kube-controller-manager pod's approver container mounts that
/// directory at the same path, so the links the kubelet writes there (absolute, under its
/// `--cert-dir`) resolve in the container too.
fn node_kubelet_args(kcm: &KcmPlane) -> Vec<String> {
    kcm.kubelet_args()
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--cert-dir=") {
                format!("--cert-dir={KUBELET_CERT_DIR}")
            } else {
                arg
            }
        })
        .collect()
}

/// The three static pods, as `kubectl kustomize` renders them; the kube-apiserver's with its
/// audit log.
pub fn static_pods() -> [(&'static str, Pod); 3] {
    [
        (
            "kube-apiserver-pod.yaml",
            audit::instrument(render_pod_from(STATIC_POD_DIR)),
        ),
        (
            "kube-controller-manager-pod.yaml",
            kcm_plane::render("static-pod-kcm"),
        ),
        ("kube-scheduler-pod.yaml", render_scheduler_pod()),
    ]
}

/// Starts each node's containerd in its namespaces with the images: node 0 builds and imports
/// them (`scripts/build-images`), the others import node 0's export.
fn start_runtimes(
    nodes: Vec<(usize, NodeEnv, PathBuf)>,
    node_dir: &impl Fn(usize) -> PathBuf,
    members: &mut impl Iterator<Item = Etcd>,
) -> Vec<TierNode> {
    let mut archive: Option<PathBuf> = None;
    let mut started = Vec::new();
    for (index, env, root) in nodes {
        let dir = node_dir(index).join("node");
        let imports: Vec<PathBuf> = archive.iter().cloned().collect();
        let began = Instant::now();
        let node = Node::start_in(&dir, &imports, env.clone());
        if archive.is_none() {
            images::build_and_import(&node.containerd);
            let path = node_dir(index).join("images.tar");
            let mut args = vec![
                "images".to_owned(),
                "export".to_owned(),
                path.display().to_string(),
            ];
            args.extend(images::IMAGES.iter().map(|i| (*i).to_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = node.containerd.ctr(&args);
            assert!(
                out.status.success(),
                "ctr images export: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            archive = Some(path);
        }
        eprintln!(
            "tier: {}'s containerd with the images in {} ms",
            env.name,
            began.elapsed().as_millis()
        );
        started.push(TierNode {
            index,
            dir: node_dir(index),
            etcd: if index == 0 { None } else { members.next() },
            env,
            root,
            node,
            started: None,
        });
    }
    started
}
