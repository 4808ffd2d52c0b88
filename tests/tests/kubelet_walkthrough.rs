//! The README's "Run it on a node", run as a new user runs it: its shell blocks, read from
//! README.md when the test runs (the section's blocks up to its first subsection), pasted in
//! order into one root shell at the workspace root, under `set -euo pipefail`. The shell runs on
//! a private machine (`e2e::node::machine`): the walkthrough's fixed paths
//! (`/etc/kubernetes`, `/var/lib/cert-reload-node`, `/var/log/pods`, ...) and ports are its
//! own, its `eth0` has an address and a default route, and every process it starts dies with
//! it, so the machine's own files and ports are never touched and nothing outlives the test.
//!
//! Beyond the blocks' own waits, the test checks what the section says. The kubelet runs with
//! image garbage collection and disk-pressure eviction off, and kube-apiserver advertises the
//! machine's address (the pod's `status.hostIP`). "It heals": after its block, the deleted
//! Secret is back in the API with a new serial, `sync` wrote that certificate into the cert
//! dir, kube-apiserver serves it for `api.cluster.example.com` (a handshake verified against
//! the load balancers' CA from the API), and its container is the one that ran before. After
//! "Cleaning up": no process but the shell, no mount under the walkthrough's directories, none
//! of its files or log directories.
//!
//! One thing differs from a fresh machine: podman's storage is the node tier's shared one
//! (`CONTAINERS_STORAGE_CONF`), so the image layers earlier tests built are reused. Skips
//! (passing, `SKIP: <reason>`) where the node tier cannot run, or without `openssl`, `curl`,
//! `cargo`, util-linux's `setpriv`/`unshare`/`nsenter`, `ip`, or the `../shared/envtest` and
//! `../shared/node` the README names.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use e2e::node::containerd::Containerd;
use e2e::node::machine::{self, MACHINE_ADDRESS, PrivateMachine, RunError};
use e2e::node::{images, on_path};
use e2e::readme::ShellBlock;

const SECTION: &str = "## Run it on a node";

/// The walkthrough's own files (`N` in the README).
const N: &str = "/var/lib/cert-reload-node";
/// The pod's cert dir (`C`), where `sync` writes.
const CERT_DIR: &str = "/etc/kubernetes/static-pod-resources/kube-apiserver-certs";
/// The kubeconfig step 7 writes: this node's kube-apiserver, as the synced admin certificate.
const ADMIN_KUBECONFIG: &str = "/var/lib/cert-reload-node/admin.kubeconfig";
const NAMESPACE: &str = "openshift-kube-apiserver";
/// The Secret "It heals" deletes, and the name it is served for.
const HEALED: &str = "external-loadbalancer-serving-certkey";
const HEALED_NAME: &str = "api.cluster.example.com";

/// The machine paths the walkthrough writes (its own, the kubelet's, containerd's and podman's
/// runtime directories): absent on the private machine until it does.
const OWNED: [&str; 9] = [
    "/etc/kubernetes",
    N,
    "/var/lib/kubelet",
    "/var/lib/containers",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/containers",
    "/run/libpod",
];

/// What the README's blocks run besides the node tier's programs.
const README_PROGRAMS: [&str; 3] = ["openssl", "curl", "cargo"];

/// The assets the README's first block runs, relative to the workspace root.
const README_ASSETS: [&str; 2] = ["../shared/envtest/setup", "../shared/node/setup"];

/// A block may take this long (the first builds the workspace, the second the images).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The whole walkthrough: less than nextest's limit for this binary (`.config/nextest.toml`), so
/// the test fails with its diagnostics rather than being killed.
const WALKTHROUGH_TIMEOUT: Duration = Duration::from_secs(25 * 60);

fn skip_reason() -> Option<String> {
    if let Some(reason) = e2e::node::skip_reason() {
        return Some(reason);
    }
    let programs = README_PROGRAMS.iter().chain(machine::PROGRAMS.iter());
    if let Some(missing) = programs.into_iter().find(|p| on_path(p).is_none()) {
        return Some(format!(
            "no {missing} on PATH (the README's walkthrough runs it)"
        ));
    }
    let root = e2e::envtest::repo_root();
    README_ASSETS
        .iter()
        .find(|setup| !root.join(setup).is_file())
        .map(|setup| format!("the README's walkthrough runs {setup}, which is not there"))
}

#[test]
fn the_readme_walkthrough_runs_as_written_heals_and_leaves_nothing_behind() {
    if let Some(reason) = skip_reason() {
        eprintln!("SKIP: {reason}");
        return;
    }
    let blocks = e2e::readme::shell_blocks(SECTION);
    let heal = block_titled(&blocks, "It heals");
    let cleaning = block_titled(&blocks, "Cleaning up");
    assert!(
        heal + 1 == cleaning && cleaning + 1 == blocks.len(),
        "README.md {SECTION:?} ends with the \"It heals\" block, then the \"Cleaning up\" one"
    );
    let tmp = tempfile::tempdir().expect("a temporary directory");
    // Held throughout: the README's image command writes the shared storage.
    let (storage, _images_lock) = images::shared_storage();
    let environment = user_environment(&storage_conf(tmp.path(), &storage));
    let machine = PrivateMachine::start(
        &tmp.path().join("machine"),
        &OWNED,
        &e2e::envtest::repo_root(),
        &environment,
    );
    let mut walk = Walkthrough::new(machine, tmp.path());

    for block in &blocks[..heal] {
        walk.run(block);
    }
    walk.check_the_node();
    let before = walk.healed_certificate();
    assert_eq!(
        (&before.served, &before.on_disk),
        (&before.in_api, &before.in_api),
        "before the heal, kube-apiserver serves the {HEALED} of the API, synced"
    );

    walk.run(&blocks[heal]);
    let after = walk.healed_certificate();
    assert_ne!(
        after.in_api, before.in_api,
        "{HEALED} is recreated in the API with a new serial"
    );
    assert_eq!(
        after.on_disk, after.in_api,
        "sync wrote the new {HEALED} into the cert dir"
    );
    assert_eq!(
        after.served, after.in_api,
        "kube-apiserver serves the new {HEALED} for {HEALED_NAME}"
    );
    assert_eq!(
        after.apiserver, before.apiserver,
        "kube-apiserver's container (id, pid) is the one that ran before: no restart"
    );
    eprintln!(
        "healed: {HEALED} serial {} -> {}, synced and served",
        before.in_api, after.in_api
    );

    walk.run(&blocks[cleaning]);
    walk.check_nothing_is_left();
    let status = walk.end();
    assert!(
        status.success(),
        "the walkthrough's shell ended with {status}"
    );
}

/// The index of the block whose leading paragraph starts with `**TITLE`.
fn block_titled(blocks: &[ShellBlock], title: &str) -> usize {
    blocks
        .iter()
        .position(|b| b.title.starts_with(title))
        .unwrap_or_else(|| panic!("README.md {SECTION:?} has no block led by **{title}"))
}

/// A podman `storage.conf` for the node tier's shared storage (what `scripts/build-images
/// --storage DIR` uses: `DIR/root`, `DIR/runroot`).
fn storage_conf(dir: &Path, storage: &Path) -> PathBuf {
    let path = dir.join("storage.conf");
    let text = format!(
        "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
        storage.join("root").display(),
        storage.join("runroot").display()
    );
    std::fs::write(&path, text).expect("storage.conf");
    path
}

/// A root shell's environment as a user has it: what finds programs, cargo and rustup, and
/// nothing of the test's own (no `KUBECONFIG`, no `CARGO_TARGET_DIR`, no `E2E_*`).
fn user_environment(storage_conf: &Path) -> Vec<(&'static str, String)> {
    let kept = [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "TMPDIR",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
    ];
    let mut environment: Vec<(&'static str, String)> = kept
        .into_iter()
        .filter_map(|name| Some((name, std::env::var(name).ok()?)))
        .collect();
    environment.push(("CARGO_TERM_COLOR", "never".to_owned()));
    environment.push((
        "CONTAINERS_STORAGE_CONF",
        storage_conf.display().to_string(),
    ));
    environment
}

/// The walkthrough on its private machine. Dropped before its end (a failure), it deletes the
/// containers through containerd first (so their cgroups go too); the machine then kills the
/// rest.
struct Walkthrough {
    machine: PrivateMachine,
    /// Where each block is written before the shell sources it.
    blocks: PathBuf,
    /// `ctr` against the walkthrough's containerd (its socket, from the host).
    containerd: Containerd,
    /// The load balancers' CA (from the API), for verified handshakes.
    loadbalancer_ca: PathBuf,
    deadline: Instant,
    cleaned: bool,
}

/// The healed certificate's serial where it lives, and kube-apiserver's container.
#[derive(Debug)]
struct HealedCertificate {
    in_api: String,
    on_disk: String,
    served: String,
    /// The running kube-apiserver container: id and pid (containerd's).
    apiserver: (String, u32),
}

impl Walkthrough {
    fn new(machine: PrivateMachine, dir: &Path) -> Walkthrough {
        let containerd = Containerd::attach(&machine.host_path(N));
        Walkthrough {
            machine,
            blocks: dir.join("blocks"),
            containerd,
            loadbalancer_ca: dir.join("loadbalancer-serving-ca.crt"),
            deadline: Instant::now() + WALKTHROUGH_TIMEOUT,
            cleaned: false,
        }
    }

    /// Writes `block` to a file and has the shell source it; panics with what went wrong.
    fn run(&mut self, block: &ShellBlock) {
        std::fs::create_dir_all(&self.blocks).expect("the blocks' directory");
        let script = self.blocks.join(format!("line-{}.sh", block.first_line));
        std::fs::write(&script, &block.text).expect("a block's script");
        let left = self.deadline.saturating_duration_since(Instant::now());
        let started = Instant::now();
        if let Err(err) = self.machine.run_script(&script, BLOCK_TIMEOUT.min(left)) {
            panic!("{}", self.failure(block, &err));
        }
        eprintln!(
            "walkthrough: {} ran in {:.1} s",
            block.describe(),
            started.elapsed().as_secs_f64()
        );
        self.cleaned = block.title.starts_with("Cleaning up");
    }

    /// What a failed block did: where in README.md, the shell's last lines, and the logs of
    /// what the walkthrough started.
    fn failure(&self, block: &ShellBlock, err: &RunError) -> String {
        let place = match err {
            RunError::Failed { line, command, .. } => {
                format!(
                    "README.md:{}: `{command}` failed",
                    block.first_line + line - 1
                )
            }
            other => other.to_string(),
        };
        let n = self.machine.host_path(N);
        let logs: String = [
            "containerd.log",
            "etcd.log",
            "seed.log",
            "sync.log",
            "kubelet.log",
        ]
        .iter()
        .filter(|log| n.join(log).exists())
        .map(|log| format!("\n--- $N/{log}\n{}", tail(&n.join(log))))
        .collect();
        format!(
            "the README's walkthrough stopped in {}: {place}\n--- the shell\n{}{logs}{}",
            block.describe(),
            self.machine.transcript_tail(),
            self.container_logs()
        )
    }

    /// The last lines of each container's newest log (`/var/log/pods`).
    fn container_logs(&self) -> String {
        let pods = self.machine.host_path("/var/log/pods");
        let mut text = String::new();
        for pod in read_dir(&pods) {
            for container in read_dir(&pod) {
                if let Some(log) = read_dir(&container).into_iter().max() {
                    text.push_str(&format!("\n--- {}\n{}", log.display(), tail(&log)));
                }
            }
        }
        text
    }

    /// Step 6's promises: the kubelet's image GC and disk-pressure eviction are off (the
    /// images cannot be pulled again), and kube-apiserver advertises the machine's address,
    /// the pod's `status.hostIP`.
    fn check_the_node(&self) {
        let config = std::fs::read_to_string(self.machine.host_path(&format!("{N}/kubelet.yaml")))
            .expect("step 6 wrote $N/kubelet.yaml");
        let config: serde_json::Value =
            serde_norway::from_str(&config).expect("the kubelet's config is YAML");
        assert_eq!(
            config["imageGCHighThresholdPercent"], 100,
            "image GC off: {config}"
        );
        assert_eq!(
            config["evictionHard"],
            serde_json::json!({}),
            "eviction off: {config}"
        );
        let (id, _) = self.running_apiserver();
        let info = self.containerd.ctr(&["containers", "info", &id]);
        let info: serde_json::Value =
            serde_json::from_slice(&info.stdout).expect("ctr containers info is JSON");
        let advertise = format!("--advertise-address={MACHINE_ADDRESS}");
        let args = &info["Spec"]["process"]["args"];
        assert!(
            args.as_array()
                .is_some_and(|a| a.iter().any(|arg| arg == advertise.as_str())),
            "kube-apiserver runs with {advertise} (its HOST_IP): {args}"
        );
    }

    /// The running kube-apiserver container (containerd's id and pid).
    fn running_apiserver(&self) -> (String, u32) {
        let running = self.containerd.running_tasks();
        let id = running
            .into_iter()
            .find(|id| {
                let info = self.containerd.ctr(&["containers", "info", id]);
                serde_json::from_slice::<serde_json::Value>(&info.stdout).is_ok_and(|info| {
                    info["Labels"]["io.kubernetes.container.name"] == "kube-apiserver"
                })
            })
            .expect("a running kube-apiserver container");
        let pid = self.containerd.task_pid(&id).expect("its task's pid");
        (id, pid)
    }

    /// `kubectl` on the machine as the walkthrough's admin, its output.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = self
            .machine
            .command("kubectl")
            .args(["--kubeconfig", ADMIN_KUBECONFIG])
            .args(args)
            .output()
            .expect("kubectl runs in the machine");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn healed_certificate(&self) -> HealedCertificate {
        let data = self.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "secret",
            HEALED,
            "-o",
            "jsonpath={.data.tls\\.crt}",
        ]);
        let pem = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .expect("tls.crt is base64");
        let in_api = serial(&String::from_utf8_lossy(&pem));
        let file = self
            .machine
            .host_path(&format!("{CERT_DIR}/secrets/{HEALED}/tls.crt"));
        let on_disk = serial(&std::fs::read_to_string(&file).expect("the synced tls.crt"));
        HealedCertificate {
            in_api,
            on_disk,
            served: self.served_serial(),
            apiserver: self.running_apiserver(),
        }
    }

    /// The serial kube-apiserver serves for [`HEALED_NAME`], in a handshake verified against
    /// the load balancers' CA of the API (`openssl s_client` on the machine).
    fn served_serial(&self) -> String {
        let ca = self.kubectl(&[
            "-n",
            "openshift-kube-apiserver-operator",
            "get",
            "configmap",
            "loadbalancer-serving-ca",
            "-o",
            "jsonpath={.data.ca-bundle\\.crt}",
        ]);
        std::fs::write(&self.loadbalancer_ca, ca).expect("the load balancers' CA");
        let out = self
            .machine
            .command("openssl")
            .args(["s_client", "-connect", "127.0.0.1:6443", "-servername"])
            .args([HEALED_NAME, "-verify_hostname", HEALED_NAME])
            .arg("-verify_return_error")
            .arg("-CAfile")
            .arg(&self.loadbalancer_ca)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("openssl runs in the machine");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "a verified handshake for {HEALED_NAME}: {}{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        serial(&text)
    }

    /// The section's closing promise: after "Cleaning up", the walkthrough left no process, no
    /// mount, no file and no log directory on the machine.
    fn check_nothing_is_left(&self) {
        assert_eq!(
            self.machine.processes(),
            Vec::<String>::new(),
            "no process of the walkthrough runs after the cleaning up"
        );
        for path in [N, "/etc/kubernetes"] {
            assert_eq!(
                self.machine.mounts_under(path),
                Vec::<String>::new(),
                "nothing stays mounted under {path}"
            );
        }
        for path in [N, "/etc/kubernetes", "/var/lib/kubelet"] {
            let host = self.machine.host_path(path);
            assert!(!host.exists(), "{path} is removed: {:?}", read_dir(&host));
        }
        for path in ["/var/log/pods", "/var/log/containers"] {
            let left = read_dir(&self.machine.host_path(path));
            assert!(left.is_empty(), "the pod's logs are removed: {left:?}");
        }
    }

    fn end(&mut self) -> std::process::ExitStatus {
        self.machine.end()
    }
}

impl Drop for Walkthrough {
    fn drop(&mut self) {
        if !self.cleaned {
            self.containerd.remove_all_containers();
        }
    }
}

/// The serial of the first certificate in `pem` (text around it is skipped).
fn serial(pem: &str) -> String {
    e2e::serial_of(&e2e::node::scenario::first_der(pem))
}

/// The entries of a directory, sorted (none when it cannot be read).
fn read_dir(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
}

/// The last lines of a file.
fn tail(path: &Path) -> String {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    e2e::envtest::log_tail(path.parent().unwrap_or(path), name)
}
