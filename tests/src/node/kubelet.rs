//! The kubelet (v1.20.2) with its `staticPodPath` in the test's directory, over a private
//! [`Containerd`], and [`Node`]: both, cleaned up on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::containerd::Containerd;
use super::env::NodeEnv;
use super::ports::{KUBELET_HEALTHZ_PORT, KUBELET_PORT};
use crate::process::ChildProcess;

/// How the kubelet is started.
#[derive(Debug, Clone, Default)]
pub struct KubeletOptions {
    /// `--kubeconfig`: register with that apiserver (without it the kubelet runs standalone,
    /// static pods only).
    pub kubeconfig: Option<PathBuf>,
    /// `authentication.x509.clientCAFile`: the CA bundle its API (`:10250`) authenticates
    /// client certificates with (kube-apiserver's `kubelet-client`, for `kubectl logs`).
    pub client_ca_file: Option<PathBuf>,
    /// The node's address ([`super::inputs::loopback_node_ip`]): `--node-ip` and the address
    /// the kubelet's API (`:10250`) listens on, so kube-apiserver reaches it by the Node's
    /// `InternalIP` (`--kubelet-preferred-address-types`) for `kubectl logs`. `None`: 127.0.0.1,
    /// which the 1.20 kubelet refuses in its status ("nodeIP can't be loopback address"), so the
    /// Node has no address at all and kube-apiserver cannot reach the kubelet ("no preferred
    /// addresses found; known addresses: []"); enough for static pods and the mirror pods.
    pub node_ip: Option<std::net::IpAddr>,
    /// Further flags (e.g. `--bootstrap-kubeconfig`, `--rotate-certificates`, `--cert-dir`).
    pub extra_args: Vec<String>,
}

/// A running kubelet (SIGTERM then SIGKILL on drop).
pub struct Kubelet {
    process: Option<ChildProcess>,
    /// When it was started.
    pub started: Instant,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

impl Kubelet {
    /// Stops it (SIGTERM, SIGKILL after 10 s). Its containers keep running, as on a node.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take()
            && process.terminate(Duration::from_secs(10)).is_none()
        {
            process.kill();
        }
    }

    /// Its process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.id())
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.process
            .as_mut()
            .is_some_and(|p| p.has_exited().is_none())
    }

    /// SIGKILL (a crash, or the node losing power); harmless when it already exited.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

pub use super::env::node_name;

/// A node: containerd with the images imported, and (once started) a kubelet. Everything it
/// started or mounted is gone after drop, also when the test panicked.
pub struct Node {
    /// The node's name (`--hostname-override`), unique per test process: the mirror pods are
    /// `POD-NAME`, the log directories `/var/log/pods/NS_POD-NAME_UID`.
    pub name: String,
    /// Its directory: `containerd/`, `kubelet/` (root dir), `manifests/`, `kubelet.yaml`,
    /// `kubelet.log`.
    pub dir: PathBuf,
    /// The kubelet's `staticPodPath`.
    pub manifests: PathBuf,
    /// Its containerd.
    pub containerd: Containerd,
    kubelet: Option<Kubelet>,
    /// Where its processes run and the test reaches them (the machine's own namespaces
    /// unless started with [`Node::start_in`]).
    pub env: NodeEnv,
    /// What the kubelet was last started with (to start it again, as systemd does).
    kubelet_options: Option<KubeletOptions>,
    /// How often [`Node::keep_kubelet_running`] started it again.
    kubelet_restarts: u32,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts containerd in `dir/containerd` and imports `images` (archives).
    ///
    /// # Panics
    /// When containerd does not start or an import fails.
    pub fn start(dir: &Path, images: &[PathBuf]) -> Node {
        Node::start_in(dir, images, NodeEnv::host())
    }

    /// [`Node::start`] in `env` (its namespaces, name and address; the three-node tier).
    ///
    /// # Panics
    /// When containerd does not start or an import fails.
    pub fn start_in(dir: &Path, images: &[PathBuf], env: NodeEnv) -> Node {
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests).expect("the static pod directory");
        let containerd = Containerd::start_in(&dir.join("containerd"), &env);
        for archive in images {
            containerd.import(archive);
        }
        Node {
            name: env.name.clone(),
            dir: dir.to_owned(),
            manifests,
            containerd,
            kubelet: None,
            env,
            kubelet_options: None,
            kubelet_restarts: 0,
        }
    }

    /// Writes the kubelet's config and starts it.
    ///
    /// # Panics
    /// When it cannot start or its healthz does not answer within 60 s.
    pub fn start_kubelet(&mut self, options: &KubeletOptions) -> &mut Kubelet {
        let assets = super::inputs::assets().unwrap_or_else(|reason| panic!("{reason}"));
        let x509 = options
            .client_ca_file
            .as_ref()
            .map(|ca| format!(", x509: {{clientCAFile: {}}}", ca.display()))
            .unwrap_or_default();
        let node_ip = options
            .node_ip
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n\
             kind: KubeletConfiguration\n\
             staticPodPath: {manifests}\n\
             address: {node_ip}\n\
             port: {KUBELET_PORT}\n\
             healthzBindAddress: {health}\n\
             healthzPort: {KUBELET_HEALTHZ_PORT}\n\
             readOnlyPort: 0\n\
             failSwapOn: false\n\
             cgroupDriver: cgroupfs\n\
             cgroupsPerQOS: false\n\
             enforceNodeAllocatable: []\n\
             fileCheckFrequency: 1s\n\
             syncFrequency: 10s\n\
             nodeStatusUpdateFrequency: 2s\n\
             # A shared CI disk fills up: no eviction and no image garbage collection (the images\n\
             # are imported, never pulled back).\n\
             evictionHard: {{memory.available: \"0%\", nodefs.available: \"0%\", nodefs.inodesFree: \"0%\", imagefs.available: \"0%\"}}\n\
             imageGCHighThresholdPercent: 100\n\
             imageGCLowThresholdPercent: 99\n\
             authentication: {{anonymous: {{enabled: false}}, webhook: {{enabled: false}}{x509}}}\n\
             authorization: {{mode: AlwaysAllow}}\n",
            manifests = self.manifests.display(),
            health = self.env.address,
        );
        self.kubelet_options = Some(options.clone());
        let path = self.dir.join("kubelet.yaml");
        std::fs::write(&path, config).expect("the kubelet's config");
        let mut command = Command::new(assets.join("kubelet"));
        command
            .arg("--config")
            .arg(&path)
            .arg("--container-runtime=remote")
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                self.containerd.socket().display()
            ))
            .arg("--root-dir")
            .arg(
                self.env
                    .kubelet_root_dir
                    .clone()
                    .unwrap_or_else(|| self.dir.join("kubelet")),
            )
            .args(["--hostname-override", &self.name])
            .args(["--node-ip", &node_ip.to_string()])
            .args(["--v", "2"]);
        if let Some(kubeconfig) = &options.kubeconfig {
            command.arg("--kubeconfig").arg(kubeconfig);
        }
        command.args(&options.extra_args);
        let started = Instant::now();
        let process = ChildProcess::spawn_logged(
            self.env.enter(command),
            &self.dir.join("kubelet.log"),
            SocketAddr::from((node_ip, KUBELET_PORT)),
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let mut kubelet = Kubelet {
            process: Some(process),
            started,
        };
        let healthy = testkit::wait::poll_until(Duration::from_secs(60), || {
            if !kubelet.is_running() {
                return Some(false);
            }
            let got = std::net::TcpStream::connect((self.env.address, KUBELET_HEALTHZ_PORT))
                .and_then(|mut tcp| {
                    use std::io::{Read, Write};
                    tcp.set_read_timeout(Some(Duration::from_secs(2)))?;
                    tcp.write_all(b"GET /healthz HTTP/1.0\r\n\r\n")?;
                    let mut text = String::new();
                    tcp.read_to_string(&mut text)?;
                    Ok(text)
                });
            matches!(got, Ok(text) if text.ends_with("ok")).then_some(true)
        });
        assert!(
            healthy == Some(true),
            "the kubelet did not become healthy within 60 s:\n{}",
            self.kubelet_log_tail()
        );
        self.kubelet.insert(kubelet)
    }

    /// The kubelet, once started.
    pub fn kubelet(&mut self) -> Option<&mut Kubelet> {
        self.kubelet.as_mut()
    }

    /// Starts the kubelet again, with the options it last started with, if it exited: what
    /// systemd's `Restart=always` does for `kubelet.service` on a node (the 1.20 kubelet exits,
    /// for one, after 5 minutes without a valid client certificate while the apiserver
    /// answers). The pods' containers run on meanwhile. Returns whether it was started again
    /// (printed, with the end of its log); call it wherever a test waits on the node.
    ///
    /// # Panics
    /// When the kubelet was never started, or does not become healthy again (see
    /// [`Node::start_kubelet`]).
    pub fn keep_kubelet_running(&mut self) -> bool {
        let kubelet = self.kubelet.as_mut().expect("the kubelet was started");
        if kubelet.is_running() {
            return false;
        }
        let ran_for = kubelet.started.elapsed();
        eprintln!(
            "node {}: the kubelet exited after {} ms; started again, as systemd's \
             Restart=always does:\n{}",
            self.name,
            ran_for.as_millis(),
            self.kubelet_log_tail()
        );
        self.kubelet_restarts += 1;
        let options = self
            .kubelet_options
            .clone()
            .expect("the options of the last start");
        self.start_kubelet(&options);
        true
    }

    /// How often [`Node::keep_kubelet_running`] started the kubelet again.
    pub fn kubelet_restarts(&self) -> u32 {
        self.kubelet_restarts
    }

    /// The last 40 lines of the kubelet's log.
    pub fn kubelet_log_tail(&self) -> String {
        crate::envtest::log_tail(&self.dir, "kubelet.log")
    }

    /// The last 15 lines of the kubelet's log that name `word` and report a failure.
    pub fn kubelet_errors_about(&self, word: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains(word)
                    && !l.contains("cert-")
                    && !l.contains("node \"")
                    && (l.starts_with('E') || l.contains("rror") || l.contains("ailed"))
            })
            .collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Places a static pod manifest (written aside, then renamed in: the kubelet never reads
    /// half a file).
    pub fn place_manifest(&self, file: &str, yaml: &str) {
        testkit::files::rename_into(&self.manifests.join(file), yaml.as_bytes());
    }

    /// The ids of the containers of `pod` (the pod's name without the node suffix, as in the
    /// manifest) named `container`, from the CRI labels, newest last.
    pub fn container_ids(&self, pod: &str, container: &str) -> Vec<String> {
        let mirror = format!("{pod}-{}", self.name);
        let mut found: Vec<(String, String)> = Vec::new();
        for id in self.containerd.containers() {
            let out = self.containerd.ctr(&["containers", "info", &id]);
            let Ok(info) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                continue;
            };
            let label = |name: &str| info["Labels"][name].as_str().map(str::to_owned);
            if label("io.kubernetes.pod.name").as_deref() == Some(mirror.as_str())
                && label("io.kubernetes.container.name").as_deref() == Some(container)
            {
                let created = info["CreatedAt"].as_str().unwrap_or_default().to_owned();
                found.push((created, id));
            }
        }
        found.sort();
        found.into_iter().map(|(_, id)| id).collect()
    }

    /// The id of the running container `container` of `pod`, if one runs.
    pub fn running_container(&self, pod: &str, container: &str) -> Option<String> {
        let running = self.containerd.running_tasks();
        self.container_ids(pod, container)
            .into_iter()
            .rev()
            .find(|id| running.contains(id))
    }

    /// Waits until every container of `containers` of `pod` runs.
    ///
    /// # Panics
    /// After `timeout`, with the kubelet's log.
    pub fn wait_running(&self, pod: &str, containers: &[&str], timeout: Duration) {
        let done = testkit::wait::poll_until(timeout, || {
            containers
                .iter()
                .all(|c| self.running_container(pod, c).is_some())
                .then_some(())
        });
        assert!(
            done.is_some(),
            "{pod}: containers {containers:?} not all running within {timeout:?}:\n{}",
            self.kubelet_log_tail()
        );
    }

    /// The log of the newest container `container` of `pod`, from `/var/log/pods` (what
    /// `kubectl logs` would show; for failure messages).
    pub fn container_log(&self, pod: &str, container: &str) -> String {
        self.container_log_back(pod, container, 0)
    }

    /// The log of the container `container` of `pod` that ran before the newest (what `kubectl
    /// logs --previous` would show: why a restarted container ended).
    pub fn previous_container_log(&self, pod: &str, container: &str) -> String {
        self.container_log_back(pod, container, 1)
    }

    /// The last 30 lines of the log of the container `back` lives before the newest.
    fn container_log_back(&self, pod: &str, container: &str, back: usize) -> String {
        let marker = format!("_{pod}-{}_", self.name);
        let Ok(entries) = std::fs::read_dir(&self.env.pod_logs) else {
            return String::new();
        };
        let mut text = String::new();
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().contains(&marker) {
                let dir = entry.path().join(container);
                let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
                    .unwrap_or_default();
                // `0.log`, `1.log`, ...: one per life (restart count), numerically.
                logs.sort_by_key(|log| {
                    log.file_stem()
                        .and_then(|stem| stem.to_str()?.parse::<u32>().ok())
                        .unwrap_or(0)
                });
                if let Some(log) = logs.iter().rev().nth(back) {
                    text = std::fs::read_to_string(log).unwrap_or_default();
                }
            }
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Stops the kubelet, kills and deletes every container, stops containerd, unmounts what
    /// they mounted under the node's directory and removes the pods' log directories. Runs on
    /// drop; calling it earlier is harmless.
    pub fn clean_up(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        self.containerd.remove_all_containers();
        self.containerd.stop();
        let left = super::cleanup::unmount_under(&self.dir);
        if !left.is_empty() {
            eprintln!("node {}: still mounted after clean-up: {left:?}", self.name);
        }
        super::cleanup::remove_pod_logs(&self.name);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.clean_up();
    }
}
