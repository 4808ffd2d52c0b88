//! The node tier's own check (tests/src/node): a private containerd and a real kubelet run a
//! static pod from the kubelet's `staticPodPath`; dropping the [`Node`] leaves no container,
//! mount, process or pod log directory behind. And the harness survives what a node survives:
//! a kubelet that exits (SIGTERM, its own shutdown; SIGKILL, a crash) is started again by
//! [`Node::keep_kubelet_running`], as systemd's `Restart=always` does, while the pod's container
//! runs on untouched, and the node is torn down without a failure. Skips (passing, with
//! `SKIP: <reason>`) without root, containerd/runc/podman/ctr/kubectl, or `../shared/node` and
//! `../shared/envtest`.

use std::time::Duration;

use e2e::node::{KubeletOptions, Node, cleanup, images};

const POD: &str = "smoke";

fn smoke_pod() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {POD}, namespace: default}}\nspec:\n  \
         hostNetwork: true\n  containers:\n  - name: pause\n    image: {}\n    \
         imagePullPolicy: Never\n",
        e2e::node::containerd::PAUSE_IMAGE
    )
}

#[test]
fn a_static_pod_runs_under_the_kubelet_and_nothing_is_left_after_the_node() {
    e2e::require_node!();
    let tmp = tempfile::tempdir().unwrap();
    let archive = images::pause_archive(&tmp.path().join("images"));
    let dir = tmp.path().join("node");
    let mut node = Node::start(&dir, &[archive]);
    let name = node.name.clone();
    node.place_manifest("smoke.yaml", &smoke_pod());
    let started = node.start_kubelet(&KubeletOptions::default()).started;
    node.wait_running(POD, &["pause"], Duration::from_secs(60));
    eprintln!(
        "static pod running {} ms after the kubelet started",
        started.elapsed().as_millis()
    );
    let id = node.running_container(POD, "pause").unwrap();
    let pid = node
        .containerd
        .task_pid(&id)
        .expect("the container's process");
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pause runs as pid {pid} on the host"
    );
    assert!(
        !cleanup::mounts_under(&dir).is_empty(),
        "the kubelet and containerd mounted under the node's directory"
    );
    let logs = || {
        std::fs::read_dir("/var/log/pods")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .contains(&format!("-{name}_"))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(logs(), 1, "the pod's log directory");

    drop(node);
    assert_eq!(cleanup::mounts_under(&dir), Vec::<String>::new());
    assert_eq!(logs(), 0, "the pod's log directory removed");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains(") Z ")),
        "the container's process is gone"
    );
    std::fs::remove_dir_all(&dir).expect("the node's directory can be removed");
}

#[test]
fn a_kubelet_that_exits_is_started_again_and_its_pod_runs_on() {
    e2e::require_node!();
    let tmp = tempfile::tempdir().unwrap();
    let archive = images::pause_archive(&tmp.path().join("images"));
    let mut node = Node::start(&tmp.path().join("node"), &[archive]);
    node.place_manifest("smoke.yaml", &smoke_pod());
    node.start_kubelet(&KubeletOptions::default());
    node.wait_running(POD, &["pause"], Duration::from_secs(60));
    let container = node.running_container(POD, "pause").unwrap();
    assert!(
        !node.keep_kubelet_running(),
        "a running kubelet is left alone"
    );

    for (round, signal) in [(1, "-TERM"), (2, "-KILL")] {
        let pid = node
            .kubelet()
            .and_then(|k| k.pid())
            .expect("the kubelet's pid");
        // From outside the harness, as a crash or an operator would.
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let restarted = testkit::wait::poll_until(Duration::from_secs(30), || {
            node.keep_kubelet_running().then_some(())
        });
        assert!(
            restarted.is_some(),
            "kill {signal}: the kubelet started again"
        );
        assert_eq!(node.kubelet_restarts(), round);
        assert_ne!(node.kubelet().and_then(|k| k.pid()), Some(pid));
        // The new kubelet adopts the running pod: the same container, never restarted.
        std::thread::sleep(Duration::from_secs(5));
        assert_eq!(
            node.running_container(POD, "pause").as_deref(),
            Some(container.as_str()),
            "kill {signal}: the pod's container runs on"
        );
        assert_eq!(node.container_ids(POD, "pause").len(), 1);
    }
    // Stopping a kubelet the harness restarted, and tearing the node down, fail nothing.
    drop(node);
}
