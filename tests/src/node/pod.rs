//! The real static pod as the node tier runs it: rendered from `manifests/static-pod` as a user
//! renders it, its host paths moved under a test's root, its flags read back.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Pod;

use crate::manifests;

/// The kustomization of the real pod, relative to `manifests/`.
pub const STATIC_POD_DIR: &str = "static-pod";

/// The peer: the same pod with OpenShift's own sidecars, relative to `manifests/`.
pub const OPENSHIFT_PEER_DIR: &str = "static-pod-openshift-peer";

/// `kubectl kustomize manifests/static-pod`: the real pod as a user renders it.
///
/// # Panics
/// When kubectl fails or the output is not one Pod.
pub fn render_pod() -> Pod {
    render_pod_from(STATIC_POD_DIR)
}

/// `kubectl kustomize manifests/DIR` (a kustomization rendering one Pod, e.g.
/// [`OPENSHIFT_PEER_DIR`]).
///
/// # Panics
/// When kubectl fails or the output is not one Pod.
pub fn render_pod_from(dir: &str) -> Pod {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(manifests::dir().join(dir))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("manifests/{dir} renders to one Pod: {err}"))
}

/// The pod with every `hostPath` moved under `root` (`/etc/kubernetes/x` → `ROOT/etc/kubernetes/x`),
/// the directories created; the containers' paths stay.
pub fn rewrite_host_paths(mut pod: Pod, root: &Path) -> Pod {
    for volume in pod
        .spec
        .as_mut()
        .and_then(|s| s.volumes.as_mut())
        .into_iter()
        .flatten()
    {
        if let Some(host) = volume.host_path.as_mut() {
            let moved = root.join(host.path.trim_start_matches('/'));
            std::fs::create_dir_all(&moved).expect("a hostPath directory");
            host.path = moved.display().to_string();
        }
    }
    pod
}

/// The pod with every `status.hostIP` environment variable given the node's address,
/// 127.0.0.1, as a literal: the 1.20 kubelet refuses a loopback node IP in its status ("nodeIP
/// can't be loopback address"), so with `--node-ip 127.0.0.1` it knows no host IP and would not
/// create the container (`CreateContainerConfigError: host IP unknown`). On a node with a
/// routable address the manifest's `fieldRef` works as written; the control plane is prepared
/// before the node's address is chosen, so the pod is pinned for every node (kube-apiserver then
/// advertises 127.0.0.1, which it only warns about).
pub fn pin_host_ip(mut pod: Pod) -> Pod {
    for container in pod
        .spec
        .as_mut()
        .map(|s| s.containers.iter_mut())
        .into_iter()
        .flatten()
    {
        for var in container.env.iter_mut().flatten() {
            let is_host_ip = var
                .value_from
                .as_ref()
                .and_then(|f| f.field_ref.as_ref())
                .is_some_and(|f| f.field_path == "status.hostIP");
            if is_host_ip {
                var.value_from = None;
                var.value = Some("127.0.0.1".to_owned());
            }
        }
    }
    pod
}

/// The pod with its kube-apiserver listening on 127.0.0.1 only (`--bind-address`; the manifest
/// says `0.0.0.0`, as a control-plane node needs): servers in tests listen
/// on the loopback. Its clients here (the kubelet, the sidecars, the tests) all use localhost.
pub fn bind_apiserver_to_loopback(mut pod: Pod) -> Pod {
    for container in pod
        .spec
        .as_mut()
        .map(|s| s.containers.iter_mut())
        .into_iter()
        .flatten()
        .filter(|c| c.name == "kube-apiserver")
    {
        let args = container.args.get_or_insert_with(Vec::new);
        args.retain(|arg| !arg.starts_with("--bind-address"));
        args.push("--bind-address=127.0.0.1".to_owned());
    }
    pod
}

/// The host directory of the pod's volume `name`.
///
/// # Panics
/// When the pod has no such hostPath volume.
pub fn host_path(pod: &Pod, name: &str) -> PathBuf {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.iter().find(|v| v.name == name))
        .and_then(|v| v.host_path.as_ref())
        .map(|h| PathBuf::from(&h.path))
        .unwrap_or_else(|| panic!("the pod has no hostPath volume {name}"))
}

/// `command` + `args` of the container `name`, unexpanded (`$(VAR)` stays: the flags read
/// here name none).
pub fn raw_argv(pod: &Pod, name: &str) -> Vec<String> {
    let container = manifests::container(pod, name);
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .cloned()
        .collect()
}

/// The pod without its `restart-on-change` sidecars (containers running `cert-syncer
/// restart-on-change`) and without the shared PID namespace they need: the servers then take a
/// new client certificate only at client-go's 5-minute re-read (the benchmark's baseline,
/// `E2E_NODE_RESTART=off`).
pub fn without_restarters(mut pod: Pod) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.retain(|c| {
            !c.command
                .iter()
                .flatten()
                .any(|arg| arg == "restart-on-change")
        });
        spec.share_process_namespace = None;
    }
    pod
}

/// The pod with the hostPath volume `volume` mounted at its host path in every container that
/// mounts it, and those containers' flags that named a file under the old mount path pointed at
/// the same file under the new one. For a directory that holds absolute symlinks, such as the
/// kubelet's `--cert-dir` (`kubelet-client-current.pem` → the dated file, by its absolute path):
/// the manifest mounts the node's `/var/lib/kubelet/pki` at that same path, and so does a test
/// whose node keeps it elsewhere ([`rewrite_host_paths`]).
pub fn mount_at_host_path(mut pod: Pod, volume: &str) -> Pod {
    let host = host_path(&pod, volume).display().to_string();
    for container in pod
        .spec
        .as_mut()
        .map(|s| s.containers.iter_mut())
        .into_iter()
        .flatten()
    {
        let mut moved: Vec<String> = Vec::new();
        for mount in container
            .volume_mounts
            .iter_mut()
            .flatten()
            .filter(|m| m.name == volume)
        {
            moved.push(std::mem::replace(&mut mount.mount_path, host.clone()));
        }
        for arg in container.args.iter_mut().flatten() {
            for old in &moved {
                if let Some((flag, path)) = arg.split_once('=')
                    && let Some(rest) = path.strip_prefix(old.as_str())
                {
                    *arg = format!("{flag}={host}{rest}");
                }
            }
        }
    }
    pod
}

/// A host-network pod (no CNI on the nodes) running pause, tolerating every taint, for the
/// scheduler to bind: to `node` when given (`nodeSelector` on its hostname label), else to any.
pub fn workload(name: &str, node: Option<&str>) -> Pod {
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "pause",
                "image": super::containerd::PAUSE_IMAGE,
                "imagePullPolicy": "Never",
            }],
        },
    });
    if let Some(node) = node {
        pod["spec"]["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node});
    }
    serde_json::from_value(pod).expect("a pod")
}
