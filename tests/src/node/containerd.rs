//! A private containerd: its own root, state, socket and config in the test's directory, with
//! the settings this kind of machine needs (`restrict_oom_score_adj`, a pause image that is
//! never pulled), and `ctr` against it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::process::ChildProcess;

/// The CRI namespace the kubelet's containers live in.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// The sandbox (pause) image: built here, never pulled.
pub const PAUSE_IMAGE: &str = "localhost/pause:3.4.1";

/// A running containerd (killed on drop; [`crate::node::Node`] stops it in order).
pub struct Containerd {
    /// Its directory: `config.toml`, `root/`, `state/`, `containerd.sock`, `containerd.log`.
    pub dir: PathBuf,
    process: Option<ChildProcess>,
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Containerd {
    /// Writes the config into `dir` and starts containerd; waits until `ctr version` answers.
    ///
    /// # Panics
    /// When it does not answer within 30 s (the message has its log).
    pub fn start(dir: &Path) -> Containerd {
        Containerd::start_in(dir, &super::env::NodeEnv::host())
    }

    /// [`Containerd::start`] in the namespaces of `env` (its containers inherit them: a
    /// host-network pod gets the node's network namespace, its `hostPath`s the node's mounts).
    /// `ctr` reaches it from anywhere through its socket.
    ///
    /// # Panics
    /// When it does not answer within 30 s (the message has its log).
    pub fn start_in(dir: &Path, env: &super::env::NodeEnv) -> Containerd {
        std::fs::create_dir_all(dir).expect("the containerd directory");
        let config = format!(
            "version = 2\n\
             root = \"{root}\"\n\
             state = \"{state}\"\n\
             [grpc]\n  address = \"{socket}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n\
             \x20 sandbox_image = \"{PAUSE_IMAGE}\"\n\
             \x20 # No CAP_SYS_RESOURCE here: the pause container's oom_score_adj of -998 fails.\n\
             \x20 restrict_oom_score_adj = true\n\
             \x20 [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
             \x20   snapshotter = \"overlayfs\"\n",
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            socket = dir.join("containerd.sock").display(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("containerd's config");
        let mut command = Command::new("containerd");
        command.arg("--config").arg(dir.join("config.toml"));
        let process = ChildProcess::spawn_logged(
            env.enter(command),
            &dir.join("containerd.log"),
            SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let containerd = Containerd {
            dir: dir.to_owned(),
            process: Some(process),
        };
        let up = testkit::wait::poll_until(Duration::from_secs(30), || {
            containerd.ctr(&["version"]).status.success().then_some(())
        });
        assert!(
            up.is_some(),
            "containerd did not answer within 30 s:\n{}",
            crate::envtest::log_tail(dir, "containerd.log")
        );
        containerd
    }

    /// The containerd that another process started with its files in `dir` (`ctr` against
    /// `dir/containerd.sock`; [`Containerd::stop`] does nothing).
    pub fn attach(dir: &Path) -> Containerd {
        Containerd {
            dir: dir.to_owned(),
            process: None,
        }
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// `ctr --address SOCKET -n k8s.io ARGS`, its output.
    ///
    /// # Panics
    /// When `ctr` cannot run.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["-n", CRI_NAMESPACE])
            .args(args)
            .output()
            .expect("ctr runs")
    }

    /// Imports an image archive (OCI or docker format).
    ///
    /// # Panics
    /// When the import fails.
    pub fn import(&self, archive: &Path) {
        let out = self.ctr(&["images", "import", &archive.display().to_string()]);
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The image references it holds.
    pub fn images(&self) -> Vec<String> {
        lines(&self.ctr(&["images", "ls", "-q"]))
    }

    /// The ids of every container (running or not).
    pub fn containers(&self) -> Vec<String> {
        lines(&self.ctr(&["containers", "ls", "-q"]))
    }

    /// The ids of the tasks that run now.
    pub fn running_tasks(&self) -> Vec<String> {
        let out = self.ctr(&["tasks", "ls"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter(|line| line.split_whitespace().nth(2) == Some("RUNNING"))
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .collect()
    }

    /// The pid of a container's task (its process on the host), if it runs.
    pub fn task_pid(&self, id: &str) -> Option<u32> {
        let out = self.ctr(&["tasks", "ls"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|line| line.split_whitespace().next() == Some(id))
            .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
    }

    /// Kills (SIGKILL) and deletes every task and container: what the kubelet left.
    pub fn remove_all_containers(&self) {
        let containers = self.containers();
        for id in &containers {
            let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
        }
        for id in &containers {
            // A killed task needs a moment to exit before it can be deleted.
            let _ = testkit::wait::poll_until(Duration::from_secs(5), || {
                let out = self.ctr(&["tasks", "delete", id]);
                let text = String::from_utf8_lossy(&out.stderr);
                (out.status.success() || text.contains("not found")).then_some(())
            });
            let _ = self.ctr(&["containers", "delete", id]);
        }
    }

    /// SIGKILL (a crash): the shims and containers keep running, as they do on a node; a new
    /// [`Containerd::start_in`] on the same directory takes them over.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Stops containerd (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take()
            && process.terminate(Duration::from_secs(10)).is_none()
        {
            process.kill();
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}
