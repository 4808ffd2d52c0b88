//! `manifests/` checked as data: every object parses as its k8s-openapi type without losing a
//! field; the kustomizations list every object file (and render, where kubectl is installed);
//! the static pod's mounts, probes, environment, resources and security settings; every flag
//! the pod passes parses with the subcommand that receives it; the kubeconfig templates parse
//! with kube's `Kubeconfig` and describe the localhost-recovery connection; the example
//! regeneration config parses and covers the kube-apiserver's set; and the RBAC grants each
//! sidecar exactly `cert_syncer::access::required_access` for the pod's flags — nothing missing,
//! nothing more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cert_syncer::access::{Access, Request, required_access};
use cert_syncer::cli::{Cli, Command};
use cert_syncer::regenerate::config::Identity;
use clap::Parser;
use e2e::manifests::{
    self, POD, REGENERATE_CONTAINER, SERVER_CONTAINER, SYNC_CONTAINER, argv, container, flag,
    node_file,
};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::config::Kubeconfig;

/// A static pod of `manifests/` and the names of its containers.
struct StaticPod {
    /// Relative to `manifests/`.
    file: &'static str,
    server: &'static str,
    sync: &'static str,
    regenerate: &'static str,
    /// The `restart-on-change` sidecar, in the pods whose server cannot reload its client
    /// certificate (never kube-apiserver's).
    restarter: Option<&'static str>,
}

/// The kube-apiserver pod (`e2e::manifests::pod`).
const KAS: StaticPod = StaticPod {
    file: POD,
    server: SERVER_CONTAINER,
    sync: SYNC_CONTAINER,
    regenerate: REGENERATE_CONTAINER,
    restarter: None,
};
/// The kube-controller-manager pod (its half of the recovery).
const KCM: StaticPod = StaticPod {
    file: "static-pod-kcm/kube-controller-manager-pod.yaml",
    server: "kube-controller-manager",
    sync: "kube-controller-manager-cert-syncer",
    regenerate: "kube-controller-manager-recovery-controller",
    restarter: Some("kube-controller-manager-cert-restarter"),
};
/// The kube-scheduler pod (issue 27, item 1).
const KS: StaticPod = StaticPod {
    file: "static-pod-ks/kube-scheduler-pod.yaml",
    server: "kube-scheduler",
    sync: "kube-scheduler-cert-syncer",
    regenerate: "kube-scheduler-recovery-controller",
    restarter: Some("kube-scheduler-cert-restarter"),
};
const PODS: [StaticPod; 3] = [KAS, KCM, KS];

impl StaticPod {
    fn load(&self) -> Pod {
        let path = manifests::dir().join(self.file);
        let docs = manifests::documents(&path);
        assert_eq!(docs.len(), 1, "{} holds one object", path.display());
        manifests::typed(&docs[0], self.file)
    }

    fn sidecars(&self) -> Vec<&'static str> {
        [self.sync, self.regenerate]
            .into_iter()
            .chain(self.restarter)
            .collect()
    }

    /// The hostPath of the pod's volume `name`.
    fn host_path(&self, pod: &Pod, name: &str) -> String {
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.as_ref())
            .unwrap_or_else(|| panic!("{}: a hostPath volume {name}", self.file))
            .path
            .clone()
    }
}

#[test]
fn every_object_parses_as_its_kubernetes_type_without_losing_a_field() {
    let files = manifests::object_files();
    assert!(files.len() >= 5, "object files: {files:?}");
    let mut kinds = BTreeMap::<String, usize>::new();
    for file in &files {
        for (index, doc) in manifests::documents(&manifests::dir().join(file))
            .iter()
            .enumerate()
        {
            let what = format!("{} document {index}", file.display());
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            match kind.as_str() {
                "Pod" => drop(manifests::typed::<Pod>(doc, &what)),
                "Namespace" => drop(manifests::typed::<Namespace>(doc, &what)),
                "ServiceAccount" => drop(manifests::typed::<ServiceAccount>(doc, &what)),
                "Secret" => drop(manifests::typed::<Secret>(doc, &what)),
                "Role" => drop(manifests::typed::<Role>(doc, &what)),
                "RoleBinding" => drop(manifests::typed::<RoleBinding>(doc, &what)),
                "ClusterRole" => drop(manifests::typed::<ClusterRole>(doc, &what)),
                "ClusterRoleBinding" => drop(manifests::typed::<ClusterRoleBinding>(doc, &what)),
                other => panic!("{what}: unexpected kind {other:?}"),
            }
            *kinds.entry(kind).or_default() += 1;
        }
    }
    assert_eq!(kinds.get("Pod"), Some(&3), "{kinds:?}");
    // Ours (9: two of them the restarters') and the OpenShift peer's
    // localhost-recovery-client.
    assert_eq!(kinds.get("ServiceAccount"), Some(&10), "{kinds:?}");
    assert!(kinds.get("Role").is_some_and(|n| *n >= 2), "{kinds:?}");
}

#[test]
fn a_misspelled_field_is_caught_by_the_round_trip() {
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "securityContext": {"readOnlyRootFileSystem": true}}]}
    });
    let outcome = std::panic::catch_unwind(|| manifests::typed::<Pod>(&doc, "typo"));
    let message = *outcome
        .expect_err("an unknown field must fail")
        .downcast::<String>()
        .expect("a formatted panic message");
    assert!(message.contains("readOnlyRootFileSystem"), "{message}");
}

/// `resources` of a kustomization, as paths relative to `manifests/`.
fn kustomization_resources(dir: &Path) -> (serde_json::Value, Vec<PathBuf>) {
    let path = dir.join("kustomization.yaml");
    let docs = manifests::documents(&path);
    assert_eq!(docs.len(), 1, "{}", path.display());
    let doc = docs.into_iter().next().expect("one document");
    assert_eq!(doc["kind"], "Kustomization", "{}", path.display());
    let resources = doc["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{} has no resources", path.display()))
        .iter()
        .map(|r| {
            let rel = dir.join(r.as_str().expect("a resource path"));
            // A file, or another kustomization (an overlay's base).
            assert!(
                rel.is_file() || rel.join("kustomization.yaml").is_file(),
                "{} lists missing {}",
                path.display(),
                rel.display()
            );
            let full = rel.canonicalize().expect("an existing resource");
            let root = manifests::dir().canonicalize().expect("manifests/");
            full.strip_prefix(&root)
                .expect("inside manifests/")
                .to_owned()
        })
        .collect();
    (doc, resources)
}

/// The objects `kubectl kustomize DIR` prints, if kubectl is installed.
fn kubectl_kustomize(dir: &Path) -> Option<Vec<serde_json::Value>> {
    let output = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
    {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("kubectl is not installed: {} not rendered", dir.display());
            return None;
        }
        Err(err) => panic!("cannot run kubectl: {err}"),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("rendered.yaml");
    std::fs::write(&file, output.stdout).unwrap();
    Some(manifests::documents(&file))
}

/// The demo variant (`manifests/static-pod-mini`) as `kubectl kustomize` renders it; `None`
/// (with a printed reason) where kubectl is not installed.
fn mini_pod() -> Option<Pod> {
    let rendered = kubectl_kustomize(&manifests::dir().join(manifests::MINI_POD_DIR))?;
    assert_eq!(rendered.len(), 1, "the demo variant renders one object");
    Some(manifests::typed(&rendered[0], manifests::MINI_POD_DIR))
}

/// Objects keyed by kind/namespace/name.
fn by_identity(
    objects: impl IntoIterator<Item = serde_json::Value>,
) -> BTreeMap<String, serde_json::Value> {
    objects
        .into_iter()
        .map(|o| {
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, o)
        })
        .collect()
}

#[test]
fn the_kustomizations_cover_every_object_file_and_render_them() {
    let root = manifests::dir();
    let (_, cluster) = kustomization_resources(&root);
    let mut listed: BTreeSet<PathBuf> = cluster.iter().cloned().collect();
    for pod_kind in &PODS {
        let dir = Path::new(pod_kind.file).parent().unwrap();
        let (static_pod, pod_files) = kustomization_resources(&root.join(dir));
        assert_eq!(pod_files, [PathBuf::from(pod_kind.file)]);
        listed.extend(pod_files);

        // Image overrides name images the pod uses.
        let pod = pod_kind.load();
        let images: BTreeSet<String> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .filter_map(|c| c.image.as_deref())
            .map(|i| i.rsplit_once(':').map_or(i, |(name, _)| name).to_owned())
            .collect();
        for entry in static_pod["images"].as_array().into_iter().flatten() {
            let name = entry["name"].as_str().expect("an image name");
            assert!(
                images.contains(name),
                "images: {name} is not used by {} ({images:?})",
                pod_kind.file
            );
        }
        if let Some(rendered) = kubectl_kustomize(&root.join(dir)) {
            let expected = by_identity(manifests::documents(&root.join(pod_kind.file)));
            assert_eq!(by_identity(rendered), expected);
        }
    }
    // The demo variant is an overlay of the real pod: only its server container and the
    // stand-in's state volume differ; the sidecars are the same containers.
    let (overlay, overlay_files) = kustomization_resources(&root.join(manifests::MINI_POD_DIR));
    assert_eq!(overlay_files, [PathBuf::from("static-pod")], "{overlay}");
    if let Some(mini) = mini_pod() {
        let real = KAS.load();
        for name in KAS.sidecars() {
            assert_eq!(container(&mini, name), container(&real, name), "{name}");
        }
        assert_eq!(
            container(&mini, KAS.server).image.as_deref(),
            Some("localhost/cert-reload/mini-apiserver:latest")
        );
        let volumes = |pod: &Pod| -> BTreeSet<String> {
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .map(|v| v.name.clone())
                .collect()
        };
        let extra: Vec<String> = volumes(&mini)
            .difference(&volumes(&real))
            .cloned()
            .collect();
        assert_eq!(extra, ["state-dir"]);
    }
    // The OpenShift peer (static-pod-openshift-peer): an overlay of the real pod in which only
    // the two sidecars differ, and its own cluster objects (never in the cluster
    // kustomization).
    let peer_dir = root.join("static-pod-openshift-peer");
    let (peer, peer_files) = kustomization_resources(&peer_dir);
    assert_eq!(peer_files, [PathBuf::from("static-pod")], "{peer}");
    let (_, peer_cluster) = kustomization_resources(&peer_dir.join("cluster"));
    assert_eq!(
        peer_cluster,
        [PathBuf::from(
            "static-pod-openshift-peer/cluster/localhost-recovery-client.yaml"
        )]
    );
    listed.extend(peer_cluster);
    if let Some(rendered) = kubectl_kustomize(&peer_dir) {
        assert_eq!(rendered.len(), 1, "the peer renders one object");
        let peer_pod: Pod = manifests::typed(&rendered[0], "static-pod-openshift-peer");
        let real = KAS.load();
        assert_eq!(
            container(&peer_pod, KAS.server),
            container(&real, KAS.server)
        );
        for name in KAS.sidecars() {
            let c = container(&peer_pod, name);
            assert_eq!(
                c.image.as_deref(),
                Some("localhost/cert-reload/openshift-sidecars:c813e820bb94"),
                "{name}"
            );
            assert!(
                c.readiness_probe.is_none() && c.liveness_probe.is_none(),
                "{name}"
            );
        }
    }
    let all: BTreeSet<PathBuf> = manifests::object_files().into_iter().collect();
    assert_eq!(
        listed, all,
        "every object file is in exactly one kustomization"
    );
    assert!(
        cluster.iter().all(|p| !p.starts_with("static-pod")),
        "the cluster kustomization must not apply a static pod through the API"
    );

    // Rendered by kustomize itself where it is installed: the same objects, unchanged.
    if let Some(rendered) = kubectl_kustomize(&root) {
        let expected = by_identity(
            cluster
                .iter()
                .flat_map(|p| manifests::documents(&root.join(p))),
        );
        assert_eq!(by_identity(rendered), expected);
    }
}

#[test]
fn every_volume_mount_names_a_volume_and_every_volume_is_used() {
    for p in &PODS {
        volumes_of(p);
    }
}

fn volumes_of(p: &StaticPod) {
    let pod = p.load();
    let spec = pod.spec.as_ref().expect("a pod spec");
    let volumes: BTreeSet<&str> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    let mut used = BTreeSet::new();
    for c in &spec.containers {
        let mut paths = BTreeSet::new();
        for mount in c.volume_mounts.iter().flatten() {
            assert!(
                volumes.contains(mount.name.as_str()),
                "{}: mount {} names no volume ({volumes:?})",
                c.name,
                mount.name
            );
            assert!(
                paths.insert(&mount.mount_path),
                "{}: {} mounted twice",
                c.name,
                mount.mount_path
            );
            used.insert(mount.name.as_str());
        }
    }
    assert_eq!(used, volumes, "every volume is mounted somewhere");
    for volume in spec.volumes.iter().flatten() {
        // The kube-scheduler's scratch dir for its self-signed serving certificate (upstream's
        // `var-run-kubernetes`) is an emptyDir, mounted by the server alone; every other
        // volume is a node directory.
        if volume.empty_dir.is_some() {
            assert_eq!(volume.name, "var-run-kubernetes", "{}", p.file);
            for c in &spec.containers {
                let mounts = c.volume_mounts.iter().flatten();
                assert!(
                    c.name == p.server || mounts.clone().all(|m| m.name != volume.name),
                    "{}: only {} mounts {}",
                    p.file,
                    p.server,
                    volume.name
                );
            }
            continue;
        }
        let host = volume
            .host_path
            .as_ref()
            .unwrap_or_else(|| panic!("{} is a hostPath", volume.name));
        assert!(host.path.starts_with('/'), "{}: {}", volume.name, host.path);
    }
    // Only the syncer writes the cert dir; the regeneration controller does not mount it.
    for c in &spec.containers {
        for mount in c.volume_mounts.iter().flatten() {
            let writable = mount.read_only != Some(true);
            if mount.name == "cert-dir" {
                assert_eq!(writable, c.name == p.sync, "{}: cert-dir writable", c.name);
            }
            if mount.name == "resource-dir" {
                assert!(!writable, "{}: the resource dir is read-only", c.name);
            }
        }
    }
    let regenerate = container(&pod, p.regenerate);
    assert!(
        regenerate
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.name != "cert-dir"),
        "the regeneration controller only talks to the API"
    );
}

/// The cert-syncer command line of a sidecar, parsed by cert-syncer's own flags.
fn parse_sidecar(pod: &Pod, name: &str) -> (Vec<String>, Cli) {
    let c = container(pod, name);
    let argv = argv(pod, c);
    assert!(
        argv[0].ends_with("/cert-syncer"),
        "{name} runs cert-syncer: {argv:?}"
    );
    let cli = manifests::parse_cert_syncer(&argv, &manifests::environment(pod, c))
        .unwrap_or_else(|err| panic!("{name}: cert-syncer refuses its flags {argv:?}:\n{err}"));
    (argv, cli)
}

#[test]
fn every_flag_the_pod_passes_exists_in_its_subcommand() {
    let pod = manifests::pod();
    let (_, sync) = parse_sidecar(&pod, SYNC_CONTAINER);
    let Command::Sync(sync) = sync.command else {
        panic!("{SYNC_CONTAINER} must run `sync`")
    };
    assert_eq!(
        sync.namespace, "openshift-kube-apiserver",
        "$(POD_NAMESPACE) expanded"
    );
    assert_eq!(
        sync.pod_name.as_deref(),
        Some("kube-apiserver-control-plane-0")
    );
    let (_, regenerate) = parse_sidecar(&pod, REGENERATE_CONTAINER);
    let Command::Regenerate(regenerate) = regenerate.command else {
        panic!("{REGENERATE_CONTAINER} must run `regenerate`")
    };
    assert!(regenerate.leader_elect);
    assert_eq!(
        regenerate.pod_namespace.as_deref(),
        Some("openshift-kube-apiserver")
    );

    // The server: the real kube-apiserver, configured from the cert dir the way OpenShift's
    // pod is (tests/tests/manifests/static_pod_flags.rs checks each path and, with envtest, that
    // kube-apiserver accepts every flag).
    let server = argv(&pod, container(&pod, SERVER_CONTAINER));
    assert!(server[0].ends_with("/kube-apiserver"), "{server:?}");
    assert_eq!(flag(&server, "secure-port"), Some("6443"));
    assert_eq!(flag(&server, "authorization-mode"), Some("Node,RBAC"));
    assert!(
        server
            .iter()
            .any(|a| a.starts_with("--tls-sni-cert-key=") && a.contains("localhost-recovery")),
        "{server:?}"
    );

    // The demo variant's stand-in server, with mini-apiserver's own parser and checks.
    if let Some(mini) = mini_pod() {
        let server = argv(&mini, container(&mini, SERVER_CONTAINER));
        assert!(server[0].ends_with("/mini-apiserver"), "{server:?}");
        let flags = mini_apiserver::Flags::try_parse_from(&server)
            .unwrap_or_else(|err| panic!("mini-apiserver refuses {server:?}:\n{err}"));
        let settings = flags.settings().expect("valid mini-apiserver settings");
        assert!(settings.sni.iter().any(|s| s.name == "localhost-recovery"));
        assert_eq!(settings.listen.port(), 6443);
    }

    // A flag of the other subcommand is refused: the check above means something.
    let mut wrong = argv(&pod, container(&pod, SYNC_CONTAINER));
    wrong.push("--leader-elect".to_owned());
    assert!(manifests::parse_cert_syncer(&wrong, &BTreeMap::new()).is_err());

    // The kube-controller-manager pod: OpenShift's KCM cert-syncer list, the KCM profile
    // under OpenShift's Lease name.
    let pod = KCM.load();
    let (_, sync) = parse_sidecar(&pod, KCM.sync);
    let Command::Sync(sync) = sync.command else {
        panic!("{} must run `sync`", KCM.sync)
    };
    assert_eq!(sync.namespace, "openshift-kube-controller-manager");
    assert_eq!(
        sync.secrets,
        ["kube-controller-manager-client-cert-key", "csr-signer"]
    );
    assert_eq!(sync.configmaps, ["aggregator-client-ca", "client-ca"]);
    assert_eq!(sync.optional_configmaps, ["trusted-ca-bundle"]);
    let (_, regenerate) = parse_sidecar(&pod, KCM.regenerate);
    let Command::Regenerate(regenerate) = regenerate.command else {
        panic!("{} must run `regenerate`", KCM.regenerate)
    };
    assert_eq!(
        regenerate.profile,
        Some(cert_syncer::cli::RegenerateProfile::OpenshiftKubeControllerManager)
    );
    assert!(regenerate.leader_elect);
    assert_eq!(
        regenerate.leader_elect_lease_name,
        "cert-recovery-controller-lock"
    );
    let server = argv(&pod, container(&pod, KCM.server));
    assert_eq!(server[0], "/usr/local/bin/kube-controller-manager");
    for wanted in [
        "cluster-signing-cert-file",
        "cluster-signing-key-file",
        "client-ca-file",
        "requestheader-client-ca-file",
        "kubeconfig",
    ] {
        assert!(flag(&server, wanted).is_some(), "--{wanted}");
    }
    // The kube-scheduler pod: upstream's scheduler list (one Secret, no ConfigMap), the
    // scheduler profile under OpenShift's Lease name, the scheduler configured by `--config`.
    let pod = KS.load();
    let (_, sync) = parse_sidecar(&pod, KS.sync);
    let Command::Sync(sync) = sync.command else {
        panic!("{} must run `sync`", KS.sync)
    };
    assert_eq!(sync.namespace, "openshift-kube-scheduler");
    assert_eq!(sync.secrets, ["kube-scheduler-client-cert-key"]);
    assert!(
        sync.configmaps.is_empty()
            && sync.optional_configmaps.is_empty()
            && sync.optional_secrets.is_empty()
    );
    let (_, regenerate) = parse_sidecar(&pod, KS.regenerate);
    let Command::Regenerate(regenerate) = regenerate.command else {
        panic!("{} must run `regenerate`", KS.regenerate)
    };
    assert_eq!(
        regenerate.profile,
        Some(cert_syncer::cli::RegenerateProfile::OpenshiftKubeScheduler)
    );
    assert!(regenerate.leader_elect);
    assert_eq!(
        regenerate.leader_elect_lease_name,
        "cert-recovery-controller-lock"
    );
    let server = argv(&pod, container(&pod, KS.server));
    assert_eq!(server[0], "/usr/local/bin/kube-scheduler");
    for wanted in [
        "config",
        "authentication-kubeconfig",
        "authorization-kubeconfig",
    ] {
        assert!(flag(&server, wanted).is_some(), "--{wanted}");
    }
}

#[test]
fn each_restarter_restarts_its_server_for_the_client_certificate_of_its_kubeconfig() {
    for p in &PODS {
        let pod = p.load();
        let spec = pod.spec.as_ref().expect("a pod spec");
        let Some(restarter) = p.restarter else {
            // kube-apiserver reloads its files: never restarted, its processes not shared.
            assert_eq!(spec.share_process_namespace, None, "{}", p.file);
            assert!(
                spec.containers
                    .iter()
                    .all(|c| !argv(&pod, c).iter().any(|a| a == "restart-on-change")),
                "{}: no restart-on-change",
                p.file
            );
            continue;
        };
        assert_eq!(spec.share_process_namespace, Some(true), "{}", p.file);
        let (_, cli) = parse_sidecar(&pod, restarter);
        let Command::RestartOnChange(args) = &cli.command else {
            panic!("{restarter} must run `restart-on-change`")
        };
        assert_eq!(
            args.pod_namespace.as_deref(),
            pod.metadata.namespace.as_deref()
        );
        // One target: the server, by the executable of its command.
        let server = argv(&pod, container(&pod, p.server));
        assert_eq!(
            args.containers,
            [format!("{}={}", p.server, server[0])],
            "{restarter}"
        );
        // Its pair: the client certificate and key of the server's kubeconfig, at the same
        // place in the restarter's mounts as in the server's (the same hostPath).
        let kubeconfig_path = flag(&server, "kubeconfig")
            .or_else(|| flag(&server, "authentication-kubeconfig"))
            .expect("the server's kubeconfig");
        let (_, repo) = node_file(&pod, container(&pod, p.server), kubeconfig_path)
            .expect("the server's kubeconfig is a node file");
        let kubeconfig = Kubeconfig::read_from(&repo).expect("a kubeconfig");
        let user = kubeconfig.auth_infos[0].auth_info.as_ref().expect("a user");
        let (cert, key) = (
            user.client_certificate
                .as_deref()
                .expect("a client certificate"),
            user.client_key.as_deref().expect("a client key"),
        );
        assert_eq!(
            args.pairs,
            [format!("{}={cert},{key}", p.server)],
            "{restarter}"
        );
        for file in [cert, key] {
            let in_server = node_file(&pod, container(&pod, p.server), file).map(|f| f.0);
            let in_restarter = node_file(&pod, container(&pod, restarter), file).map(|f| f.0);
            assert!(in_server.is_some(), "{file} on a mount of {}", p.server);
            assert_eq!(in_server, in_restarter, "{file}");
        }
        // Signalling needs the server's uid (the kernel's rule without CAP_KILL), and
        // nothing more: every capability dropped.
        let uid = |name: &str| {
            container(&pod, name)
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
        };
        assert_eq!(
            uid(restarter),
            uid(p.server),
            "{restarter} runs as {}",
            p.server
        );
        assert!(uid(restarter).is_some());
    }
}

#[test]
fn sidecars_are_small_critical_probed_read_only_and_know_their_pod() {
    for p in &PODS {
        sidecars_of(p);
    }
}

fn sidecars_of(p: &StaticPod) {
    let pod = p.load();
    let spec = pod.spec.as_ref().expect("a pod spec");
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(spec.host_network, Some(true));
    for name in p.sidecars() {
        let c = container(&pod, name);
        let argv = argv(&pod, c);

        // POD_NAME and POD_NAMESPACE from the downward API.
        let env = c.env.iter().flatten();
        let fields: BTreeMap<&str, &str> = env
            .filter_map(|v| {
                let path = v
                    .value_from
                    .as_ref()?
                    .field_ref
                    .as_ref()?
                    .field_path
                    .as_str();
                Some((v.name.as_str(), path))
            })
            .collect();
        assert_eq!(fields.get("POD_NAME"), Some(&"metadata.name"), "{name}");
        assert_eq!(
            fields.get("POD_NAMESPACE"),
            Some(&"metadata.namespace"),
            "{name}"
        );

        // Probes on the health listener the flags configure.
        let listen: std::net::SocketAddr = flag(&argv, "metrics-listen")
            .unwrap_or_else(|| panic!("{name} has --metrics-listen"))
            .parse()
            .expect("an address");
        assert!(
            listen.ip().is_loopback(),
            "{name}: /metrics and /readyz listen on the loopback only, not {listen}"
        );
        for (probe, path) in [
            (&c.readiness_probe, "/readyz"),
            (&c.liveness_probe, "/healthz"),
        ] {
            let get = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .unwrap_or_else(|| panic!("{name}: {path} probe"));
            assert_eq!(get.path.as_deref(), Some(path), "{name}");
            assert_eq!(
                get.port,
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                    listen.port().into()
                ),
                "{name}: {path} probe port"
            );
            // With the host network, the kubelet must probe where the listener is.
            assert_eq!(
                get.host.as_deref(),
                Some(listen.ip().to_string().as_str()),
                "{name}"
            );
            assert_ne!(
                get.scheme.as_deref(),
                Some("HTTPS"),
                "{name}: the health listener is plain HTTP"
            );
        }

        // Small requests, no limits that could kill a sidecar during a recovery.
        let resources = c
            .resources
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: resources"));
        let requests = resources
            .requests
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: requests"));
        let cpu = &requests
            .get("cpu")
            .unwrap_or_else(|| panic!("{name}: cpu request"))
            .0;
        let memory = &requests
            .get("memory")
            .unwrap_or_else(|| panic!("{name}: memory request"))
            .0;
        let millicores: u32 = cpu
            .strip_suffix('m')
            .and_then(|m| m.parse().ok())
            .expect("cpu in millicores");
        let mebibytes: u32 = memory
            .strip_suffix("Mi")
            .and_then(|m| m.parse().ok())
            .expect("memory in Mi");
        assert!(
            millicores <= 50 && mebibytes <= 128,
            "{name}: {cpu} {memory}"
        );

        let security = c
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: securityContext"));
        assert_eq!(security.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(security.allow_privilege_escalation, Some(false), "{name}");
        assert_eq!(
            security.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_owned()]),
            "{name}"
        );
        assert_ne!(security.privileged, Some(true), "{name}");
    }
}

/// The kubeconfig a sidecar uses, from the repo (its `--kubeconfig` through the mounts).
fn sidecar_kubeconfig(pod: &Pod, name: &str) -> (PathBuf, Kubeconfig) {
    let c = container(pod, name);
    let argv = argv(pod, c);
    let path = flag(&argv, "kubeconfig").unwrap_or_else(|| panic!("{name}: --kubeconfig"));
    let (_, repo) =
        node_file(pod, c, path).unwrap_or_else(|| panic!("{name}: {path} is on no hostPath"));
    let kubeconfig = Kubeconfig::read_from(&repo)
        .unwrap_or_else(|err| panic!("{}: not a kubeconfig: {err}", repo.display()));
    (repo, kubeconfig)
}

#[test]
fn kubeconfig_templates_parse_and_describe_the_localhost_recovery_connection() {
    for p in &PODS {
        kubeconfigs_of(p);
    }
}

fn kubeconfigs_of(p: &StaticPod) {
    let pod = p.load();
    let resource_dir = p.host_path(&pod, "resource-dir");
    let mut accounts = BTreeSet::new();
    for name in p.sidecars() {
        let (path, kubeconfig) = sidecar_kubeconfig(&pod, name);
        let what = path.display();
        let current = kubeconfig
            .current_context
            .as_deref()
            .unwrap_or_else(|| panic!("{what}: current-context"));
        let context = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == current)
            .and_then(|c| c.context.as_ref())
            .unwrap_or_else(|| panic!("{what}: context {current}"));
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .unwrap_or_else(|| panic!("{what}: cluster {}", context.cluster));
        assert_eq!(
            cluster.server.as_deref(),
            Some("https://localhost:6443"),
            "{what}"
        );
        assert_eq!(
            cluster.tls_server_name.as_deref(),
            Some("localhost-recovery"),
            "{what}"
        );
        assert_ne!(cluster.insecure_skip_tls_verify, Some(true), "{what}");
        let user = kubeconfig
            .auth_infos
            .iter()
            .find(|a| Some(&a.name) == context.user.as_ref())
            .and_then(|a| a.auth_info.as_ref())
            .unwrap_or_else(|| panic!("{what}: user {:?}", context.user));
        let token_file = user
            .token_file
            .as_deref()
            .unwrap_or_else(|| panic!("{what}: tokenFile"));
        assert!(
            user.token.is_none() && user.client_certificate.is_none(),
            "{what}: a token file only"
        );

        // The CA and the token are files on the read-only resource dir of this container.
        let c = container(&pod, name);
        for file in [
            cluster
                .certificate_authority
                .as_deref()
                .expect("certificate-authority"),
            token_file,
        ] {
            let (host, _) = node_file(&pod, c, file)
                .unwrap_or_else(|| panic!("{what}: {file} is on no mount of {name}"));
            assert!(
                host.starts_with(&format!("{resource_dir}/")),
                "{host} is not on the resource dir {resource_dir}"
            );
        }

        // The token belongs to a service account of its own.
        let (namespace, account) = manifests::service_account_of_token_file(token_file);
        assert!(
            accounts.insert(account.clone()),
            "{name} shares service account {account}"
        );
        let sas: Vec<ServiceAccount> = manifests::of_kind("ServiceAccount");
        assert!(
            sas.iter()
                .any(|sa| sa.metadata.name.as_deref() == Some(account.as_str())
                    && sa.metadata.namespace.as_deref() == Some(namespace.as_str()))
        );
    }
}

#[test]
fn the_example_regeneration_config_parses_and_covers_the_kube_apiserver_set() {
    // The pod runs the built-in profile; this file is the example for other control planes.
    let repo = manifests::dir().join(
        "node/etc/kubernetes/static-pod-resources/kube-apiserver-pod-1/configmaps/\
         cert-regeneration-controller-config/config.yaml",
    );
    let text =
        std::fs::read_to_string(&repo).unwrap_or_else(|err| panic!("{}: {err}", repo.display()));
    let rotation = cert_syncer::regenerate::config::parse(&text)
        .unwrap_or_else(|err| panic!("{}: {err}", repo.display()));
    assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);

    let serving = |wanted: &str| {
        rotation.targets.iter().find(|t| matches!(&t.identity, Identity::Serving { hostnames } if hostnames.iter().any(|h| h == wanted)))
    };
    let client = |user: &str| {
        rotation
            .targets
            .iter()
            .find(|t| matches!(&t.identity, Identity::Client { user: u, .. } if u == user))
    };
    let covered = [
        ("localhost serving", serving("localhost")),
        ("service-network serving", serving("kubernetes.default.svc")),
        (
            "external load-balancer serving",
            serving("api.cluster.example.com"),
        ),
        (
            "internal load-balancer serving",
            serving("api-int.cluster.example.com"),
        ),
        ("localhost-recovery serving", serving("localhost-recovery")),
        ("kubelet client", client("system:kube-apiserver")),
        ("aggregator client", client("system:openshift-aggregator")),
    ];
    let mut distinct = std::collections::BTreeSet::new();
    for (what, target) in covered {
        let target = target.unwrap_or_else(|| panic!("{} has no {what} target", repo.display()));
        distinct.insert(target.object.to_string());
        // Every target's signer is in a bundle (the parser insists), and a leaf never
        // outlives what the operator would give it.
        assert!(
            target.validity <= rotation.signers[target.signer].validity,
            "{what}"
        );
    }
    // Nothing else: every target of the file is one of the set above, each a different one.
    assert_eq!(rotation.targets.len(), distinct.len(), "{distinct:?}");
}

/// RBAC atoms: (namespace, group, resource, verb, name) with `None` = any name.
type Atom = (String, String, String, String, Option<String>);

fn atoms_of_access(list: &[Access]) -> BTreeSet<Atom> {
    let mut out = BTreeSet::new();
    for access in list {
        for verb in &access.verbs {
            let names: Vec<Option<String>> = match &access.resource_names {
                None => vec![None],
                Some(names) => names.iter().cloned().map(Some).collect(),
            };
            for name in names {
                out.insert((
                    access.namespace.clone(),
                    access.api_group.to_owned(),
                    access.resource.to_owned(),
                    (*verb).to_owned(),
                    name,
                ));
            }
        }
    }
    out
}

fn atoms_of_rules(rules: &[(String, PolicyRule)]) -> BTreeSet<Atom> {
    let mut out = BTreeSet::new();
    for (ns, rule) in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    let names: Vec<Option<String>> = match &rule.resource_names {
                        Some(names) if !names.is_empty() => {
                            names.iter().cloned().map(Some).collect()
                        }
                        _ => vec![None],
                    };
                    for name in names {
                        out.insert((
                            ns.clone(),
                            group.clone(),
                            resource.clone(),
                            verb.clone(),
                            name,
                        ));
                    }
                }
            }
        }
    }
    out
}

/// `required_access` for a sidecar, its `--config` read from the repo's node files.
fn required_for(pod: &Pod, name: &str) -> Vec<Access> {
    let (_, mut cli) = parse_sidecar(pod, name);
    if let Command::Regenerate(args) = &mut cli.command
        && let Some(config) = &args.config
    {
        let (_, repo) = node_file(pod, container(pod, name), &config.display().to_string())
            .expect("--config on a hostPath");
        args.config = Some(repo);
    }
    required_access(&cli.command).unwrap_or_else(|err| panic!("{name}: {err}"))
}

#[test]
fn rbac_grants_each_sidecar_exactly_what_its_flags_need() {
    for p in &PODS {
        rbac_of(p);
    }
}

fn rbac_of(p: &StaticPod) {
    let pod = p.load();
    for name in p.sidecars() {
        let required = required_for(&pod, name);
        assert!(!required.is_empty());
        let (_, kubeconfig) = sidecar_kubeconfig(&pod, name);
        let token_file = kubeconfig
            .auth_infos
            .iter()
            .find_map(|a| a.auth_info.as_ref()?.token_file.clone())
            .expect("a token file");
        let (namespace, account) = manifests::service_account_of_token_file(&token_file);
        let granted = manifests::granted_rules(&namespace, &account);

        // Everything needed is granted (by RBAC's matching, not by equality of YAML).
        for (ns, group, resource, verb, object) in atoms_of_access(&required) {
            assert!(
                manifests::rbac_allows(&granted, &verb, &group, &resource, &ns, object.as_deref()),
                "{name} ({namespace}/{account}) needs {verb} {group}/{resource} {ns}/{object:?}, which its Roles do not grant"
            );
        }
        // Nothing is granted that is not needed (least privilege).
        for (ns, group, resource, verb, object) in atoms_of_rules(&granted) {
            let request = Request::new(&verb, &group, &resource, &ns, object.as_deref());
            assert!(
                required.iter().any(|a| a.allows(&request)),
                "{name} ({namespace}/{account}) is granted {verb} {group}/{resource} {ns}/{object:?}, which it never needs"
            );
        }
    }
}

#[test]
fn the_csr_approver_cluster_role_grants_exactly_what_the_subcommand_needs() {
    // `approve-kubelet-csr` is not a sidecar of the static pods: its access is fixed (no flag
    // changes it), so one command line stands for every node. Cluster-scoped rules have the
    // namespace `""` (cert_syncer::access::CLUSTER) on both sides.
    let cli = Cli::try_parse_from([
        "cert-syncer",
        "approve-kubelet-csr",
        "--server",
        "https://127.0.0.1:6443",
        "--node-name",
        "master-0",
    ])
    .unwrap();
    let required = required_access(&cli.command).unwrap();
    let roles: Vec<ClusterRole> = manifests::of_kind("ClusterRole");
    let bindings: Vec<ClusterRoleBinding> = manifests::of_kind("ClusterRoleBinding");
    let binding = bindings
        .iter()
        .find(|b| {
            b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == "kubelet-csr-approver"
                    && s.namespace.as_deref() == Some("openshift-kube-apiserver")
            })
        })
        .expect("a ClusterRoleBinding of the kubelet-csr-approver service account");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    let role = roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str()))
        .expect("the bound ClusterRole");
    let granted: Vec<(String, PolicyRule)> = role
        .rules
        .iter()
        .flatten()
        .map(|rule| (String::new(), rule.clone()))
        .collect();
    let needed = atoms_of_access(&required);
    assert!(needed.len() >= 4, "{needed:?}");
    for (ns, group, resource, verb, object) in needed {
        assert!(
            manifests::rbac_allows(&granted, &verb, &group, &resource, &ns, object.as_deref()),
            "kubelet-csr-approver needs {verb} {group}/{resource} {object:?}, which its ClusterRole does not grant"
        );
    }
    for (ns, group, resource, verb, object) in atoms_of_rules(&granted) {
        let request = Request::new(&verb, &group, &resource, &ns, object.as_deref());
        assert!(
            required.iter().any(|a| a.allows(&request)),
            "kubelet-csr-approver is granted {verb} {group}/{resource} {object:?}, which it never needs"
        );
    }
}

#[test]
fn the_csr_approver_runs_in_the_kcm_pod_on_its_node_s_kubelet_certificate() {
    // Next to the CSR signer it feeds (the enhancement's step 14, then 15), as the sidecars
    // run: its own account (the ClusterRole checked above), this node's name from the
    // downward API, the kubelet's certificate directory read-only at the node's own path (the
    // kubelet's `kubelet-client-current.pem` is an absolute symlink there).
    let pod = KCM.load();
    let name = "kube-controller-manager-csr-approver";
    let c = container(&pod, name);
    let argv = argv(&pod, c);
    let env = manifests::environment(&pod, c);
    let cli = manifests::parse_cert_syncer(&argv, &env)
        .unwrap_or_else(|err| panic!("{name}: cert-syncer refuses its flags {argv:?}:\n{err}"));
    let Command::ApproveKubeletCsr(args) = &cli.command else {
        panic!("{name} must run `approve-kubelet-csr`")
    };
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|v| v.name == "NODE_NAME")
        .and_then(|v| v.value_from.as_ref()?.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(node_name, Some("spec.nodeName"));
    assert_eq!(
        args.bootstrap_user,
        ["system:serviceaccount:openshift-machine-config-operator:node-bootstrapper"]
    );
    let cert = args.kubelet_client_cert.display().to_string();
    let (host, _) = node_file(&pod, c, &cert).expect("the kubelet's certificate on a hostPath");
    assert_eq!(host, cert, "mounted at the node's own path");
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| cert.starts_with(&format!("{}/", m.mount_path)))
        .expect("a mount");
    assert_eq!(
        mount.read_only,
        Some(true),
        "the kubelet's keys are only read"
    );
    // Its token is the approver's account's, whose ClusterRole is checked above.
    let (_, kubeconfig) = sidecar_kubeconfig(&pod, name);
    let token_file = kubeconfig.auth_infos[0]
        .auth_info
        .as_ref()
        .and_then(|a| a.token_file.clone())
        .expect("a token file");
    assert_eq!(
        manifests::service_account_of_token_file(&token_file),
        (
            "openshift-kube-apiserver".to_owned(),
            "kubelet-csr-approver".to_owned()
        )
    );
    let security = c.security_context.as_ref().expect("securityContext");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(
        security.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    let listen = flag(&argv, "metrics-listen").expect("--metrics-listen");
    assert!(listen.starts_with("127.0.0.1:"), "{listen}");
    for probe in [&c.readiness_probe, &c.liveness_probe] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("a probe");
        assert_eq!(
            format!(
                "{}:{}",
                get.host.as_deref().unwrap_or_default(),
                match &get.port {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) =>
                        p.to_string(),
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(p) =>
                        p.clone(),
                }
            ),
            listen
        );
    }
}

#[test]
fn no_regenerate_token_can_list_or_watch_a_namespace_s_secrets() {
    // The regeneration controllers read their declared objects by name (a token that lists a namespace's Secrets reads etcd's client keys too): the
    // namespaces they write hold other components' keys (etcd's client keys among them).
    for p in &PODS {
        let pod = p.load();
        let (_, kubeconfig) = sidecar_kubeconfig(&pod, p.regenerate);
        let token_file = kubeconfig
            .auth_infos
            .iter()
            .find_map(|a| a.auth_info.as_ref()?.token_file.clone())
            .expect("a token file");
        let (namespace, account) = manifests::service_account_of_token_file(&token_file);
        let granted = manifests::granted_rules(&namespace, &account);
        let mut named = 0;
        for (ns, rule) in &granted {
            for verb in ["list", "watch"] {
                for resource in ["secrets", "configmaps"] {
                    let everything = manifests::rbac_allows(&granted, verb, "", resource, ns, None);
                    assert!(
                        !everything,
                        "{} ({namespace}/{account}) may {verb} every {resource} of {ns}",
                        p.regenerate
                    );
                }
            }
            if rule.verbs.iter().any(|v| v == "list") {
                named += rule.resource_names.as_ref().map_or(0, Vec::len);
            }
        }
        // The scheduler's controller lists two: its copy and the copy's source.
        assert!(
            named >= 2,
            "{}: {named} objects listed by name",
            p.regenerate
        );
    }
}

#[test]
fn the_rbac_check_fails_when_a_grant_is_missing() {
    // The comparison above is only worth something if a gap shows: drop one verb and look.
    let pod = manifests::pod();
    let required = required_for(&pod, SYNC_CONTAINER);
    let mut granted = manifests::granted_rules("openshift-kube-apiserver", "cert-syncer");
    for (_, rule) in &mut granted {
        rule.verbs.retain(|v| v != "watch");
    }
    let missing: Vec<Atom> = atoms_of_access(&required)
        .into_iter()
        .filter(|(ns, group, resource, verb, object)| {
            !manifests::rbac_allows(&granted, verb, group, resource, ns, object.as_deref())
        })
        .collect();
    assert!(
        !missing.is_empty() && missing.iter().all(|a| a.3 == "watch"),
        "{missing:?}"
    );
}

#[test]
fn what_regenerate_writes_for_the_server_reaches_it() {
    // Each target or bundle the regeneration controller writes into the pod's namespace is
    // either mirrored by the syncer or read from the revisioned resource dir by the server,
    // and every synced path the server reads is one the syncer writes.
    let pod = manifests::pod();
    let (_, sync) = parse_sidecar(&pod, SYNC_CONTAINER);
    let Command::Sync(sync) = sync.command else {
        unreachable!()
    };
    let synced_secrets: BTreeSet<&str> = sync
        .secrets
        .iter()
        .chain(&sync.optional_secrets)
        .map(String::as_str)
        .collect();
    let synced_maps: BTreeSet<&str> = sync
        .configmaps
        .iter()
        .chain(&sync.optional_configmaps)
        .map(String::as_str)
        .collect();
    let server = argv(&pod, container(&pod, SERVER_CONTAINER)).join(" ");
    let (_, regen) = parse_sidecar(&pod, REGENERATE_CONTAINER);
    let Command::Regenerate(regen) = regen.command else {
        unreachable!()
    };
    let rotation =
        cert_syncer::regenerate::profile_objects(regen.profile.expect("--profile").into()).unwrap();
    // Every target in the pod's namespace, including the client certificates of the pod's
    // other consumers (check-endpoints, the control-plane node's kubeconfig), which upstream's
    // list syncs too.
    for target in rotation
        .targets
        .iter()
        .filter(|t| t.object.namespace == sync.namespace)
    {
        let name = target.object.name.as_str();
        let revisioned = server.contains(&format!(
            "/etc/kubernetes/static-pod-resources/secrets/{name}/"
        ));
        assert!(
            synced_secrets.contains(name) || revisioned,
            "target {name} is regenerated but never reaches the server"
        );
    }
    for bundle in rotation
        .bundles
        .iter()
        .filter(|b| b.object.namespace == sync.namespace)
    {
        assert!(
            synced_maps.contains(bundle.object.name.as_str()),
            "bundle {}",
            bundle.object.name
        );
    }
    for word in server.split([' ', '=', ',']) {
        if let Some(rest) = word.strip_prefix("/etc/kubernetes/static-pod-certs/secrets/") {
            let name = rest.split('/').next().unwrap();
            assert!(
                sync.secrets.iter().any(|s| s == name),
                "the server reads {word}, which is not a required synced Secret"
            );
        }
    }
}

#[test]
fn what_the_kcm_recovery_controller_writes_reaches_kube_controller_manager() {
    // Every object the kube-controller-manager profile writes into the pod's namespace (the
    // published CA, the copied client certificate) is mirrored by the syncer, and every synced
    // path kube-controller-manager reads is an object the syncer writes.
    let pod = KCM.load();
    let (_, sync) = parse_sidecar(&pod, KCM.sync);
    let Command::Sync(sync) = sync.command else {
        unreachable!()
    };
    let (_, regen) = parse_sidecar(&pod, KCM.regenerate);
    let Command::Regenerate(regen) = regen.command else {
        unreachable!()
    };
    let rotation =
        cert_syncer::regenerate::profile_objects(regen.profile.expect("--profile").into()).unwrap();
    let mut in_namespace = 0;
    for (kind, object) in rotation.written() {
        if object.namespace != sync.namespace {
            continue;
        }
        in_namespace += 1;
        let synced = match kind {
            cert_syncer::kind::Kind::Secret => &sync.secrets,
            cert_syncer::kind::Kind::ConfigMap => &sync.configmaps,
        };
        assert!(
            synced.contains(&object.name),
            "{} {object} is written but not synced",
            kind.plural()
        );
    }
    assert_eq!(
        in_namespace, 2,
        "csr-signer and kube-controller-manager-client-cert-key"
    );
    let server = argv(&pod, container(&pod, KCM.server)).join(" ");
    let mut read = 0;
    for word in server.split([' ', '=', ',']) {
        for (prefix, synced) in [
            ("/etc/kubernetes/static-pod-certs/secrets/", &sync.secrets),
            (
                "/etc/kubernetes/static-pod-certs/configmaps/",
                &sync.configmaps,
            ),
        ] {
            if let Some(rest) = word.strip_prefix(prefix) {
                let name = rest.split('/').next().unwrap();
                assert!(
                    synced.iter().any(|s| s == name),
                    "the server reads {word}, not synced"
                );
                read += 1;
            }
        }
    }
    assert!(
        read >= 4,
        "{read} synced files read by kube-controller-manager"
    );
}

#[test]
fn what_the_scheduler_recovery_controller_writes_reaches_kube_scheduler() {
    // The scheduler profile writes exactly the copy of its client certificate into the pod's
    // namespace, from the kube-apiserver's in `openshift-config-managed` (read, never
    // written); the syncer mirrors it; and the scheduler's kubeconfig (through `--config`,
    // and the delegated authn/authz kubeconfigs) names that synced pair.
    let pod = KS.load();
    let (_, sync) = parse_sidecar(&pod, KS.sync);
    let Command::Sync(sync) = sync.command else {
        unreachable!()
    };
    let (_, regen) = parse_sidecar(&pod, KS.regenerate);
    let Command::Regenerate(regen) = regen.command else {
        unreachable!()
    };
    let rotation =
        cert_syncer::regenerate::profile_objects(regen.profile.expect("--profile").into()).unwrap();
    let written: Vec<String> = rotation
        .written()
        .map(|(kind, object)| format!("{} {object}", kind.plural()))
        .collect();
    assert_eq!(
        written,
        ["secrets openshift-kube-scheduler/kube-scheduler-client-cert-key"]
    );
    let read_only: Vec<String> = rotation
        .read_only()
        .map(|(_, object)| object.to_string())
        .collect();
    assert_eq!(
        read_only,
        ["openshift-config-managed/kube-scheduler-client-cert-key"]
    );
    assert_eq!(sync.secrets, ["kube-scheduler-client-cert-key"]);

    let server = container(&pod, KS.server);
    let server_argv = argv(&pod, server);
    let node = |path: &str| {
        node_file(&pod, server, path)
            .unwrap_or_else(|| panic!("{path} is on no hostPath of {}", KS.server))
            .1
    };
    let config_file = node(flag(&server_argv, "config").expect("--config"));
    let config: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&config_file).unwrap())
            .unwrap_or_else(|err| panic!("{}: {err}", config_file.display()));
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");
    assert_eq!(
        config["apiVersion"], "kubescheduler.config.k8s.io/v1beta1",
        "the API version kube-scheduler v1.20 reads"
    );
    assert_eq!(
        config["leaderElection"]["resourceNamespace"],
        "openshift-kube-scheduler"
    );
    let kubeconfig_path = config["clientConnection"]["kubeconfig"]
        .as_str()
        .expect("clientConnection.kubeconfig");
    for delegated in ["authentication-kubeconfig", "authorization-kubeconfig"] {
        assert_eq!(
            flag(&server_argv, delegated),
            Some(kubeconfig_path),
            "--{delegated}"
        );
    }
    let kubeconfig_file = node(kubeconfig_path);
    let kubeconfig = Kubeconfig::read_from(&kubeconfig_file)
        .unwrap_or_else(|err| panic!("{}: {err}", kubeconfig_file.display()));
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://localhost:6443"));
    assert_eq!(
        cluster.tls_server_name.as_deref(),
        Some("localhost-recovery")
    );
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert!(user.token.is_none() && user.token_file.is_none());
    for (file, key) in [
        (user.client_certificate.as_deref(), "tls.crt"),
        (user.client_key.as_deref(), "tls.key"),
    ] {
        let file =
            file.unwrap_or_else(|| panic!("{}: the client {key}", kubeconfig_file.display()));
        assert_eq!(
            file,
            format!(
                "/etc/kubernetes/static-pod-certs/secrets/{}/{key}",
                sync.secrets[0]
            ),
            "the scheduler's client certificate is the synced one"
        );
        let (host, _) = node_file(&pod, server, file).expect("on a mount");
        assert!(
            host.starts_with(&format!("{}/", KS.host_path(&pod, "cert-dir"))),
            "{host}"
        );
    }
}

#[test]
fn every_node_file_the_pod_reads_is_shipped_or_documented() {
    for p in &PODS {
        node_files_of(p);
    }
}

fn node_files_of(p: &StaticPod) {
    let pod = p.load();
    let cert_dir = p.host_path(&pod, "cert-dir");
    let readme =
        std::fs::read_to_string(manifests::dir().join("README.md")).expect("manifests/README.md");
    let mut checked = 0;
    let spec = pod.spec.as_ref().unwrap();
    for c in &spec.containers {
        let mut paths: Vec<String> = argv(&pod, c)
            .iter()
            .flat_map(|a| a.split(['=', ',']).map(str::to_owned).collect::<Vec<_>>())
            .filter(|w| w.starts_with('/') && !w.starts_with("/usr/local/bin/"))
            .collect();
        if p.sidecars().contains(&c.name.as_str()) {
            let (_, kubeconfig) = sidecar_kubeconfig(&pod, &c.name);
            for cluster in kubeconfig
                .clusters
                .iter()
                .filter_map(|c| c.cluster.as_ref())
            {
                paths.extend(cluster.certificate_authority.clone());
            }
            for user in kubeconfig
                .auth_infos
                .iter()
                .filter_map(|a| a.auth_info.as_ref())
            {
                paths.extend(user.token_file.clone());
            }
        }
        for path in paths {
            // The kube-scheduler's `--cert-dir`: its scratch emptyDir, where it writes its
            // self-signed serving certificate; no node file.
            if flag(&argv(&pod, c), "cert-dir") == Some(path.as_str())
                && on_empty_dir(&pod, c, &path)
            {
                continue;
            }
            let Some((host, repo)) = node_file(&pod, c, &path) else {
                panic!("{}: {path} is on no hostPath mount", c.name)
            };
            // Directories the containers write into need no file.
            if ["--destination-dir", "--state-file"]
                .iter()
                .any(|f| flag(&argv(&pod, c), &f[2..]).is_some_and(|v| v == path))
            {
                continue;
            }
            // Synced at run time by the syncer itself.
            if host.starts_with(&format!("{cert_dir}/")) {
                continue;
            }
            assert!(
                repo.is_file() || readme.contains(&host),
                "{}: {path} (node file {host}) is neither in manifests/node nor documented in manifests/README.md",
                c.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 6, "{}: {checked} node files checked", p.file);
}

/// Whether `path` is on an emptyDir mount of `c`.
fn on_empty_dir(pod: &Pod, c: &k8s_openapi::api::core::v1::Container, path: &str) -> bool {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    c.volume_mounts.iter().flatten().any(|m| {
        path.starts_with(&m.mount_path)
            && volumes
                .clone()
                .any(|v| v.name == m.name && v.empty_dir.is_some())
    })
}

#[test]
fn the_image_builds_make_every_image_the_pods_run() {
    let root = manifests::dir().parent().unwrap().to_owned();
    let read = |name: &str| {
        std::fs::read_to_string(root.join(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
    };
    let (containerfile, prebuilt, script) = (
        read("Containerfile"),
        read("Containerfile.prebuilt"),
        read("scripts/build-images"),
    );
    // `FROM <base> AS <stage>` of the no-pull build.
    let prebuilt_stages: BTreeMap<&str, &str> = prebuilt
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("FROM ")?;
            let (base, stage) = rest.split_once(" AS ")?;
            Some((stage.trim(), base.trim()))
        })
        .collect();
    let mut pods: Vec<(String, Pod)> = PODS.iter().map(|p| (p.file.to_owned(), p.load())).collect();
    pods.extend(mini_pod().map(|p| (manifests::MINI_POD_DIR.to_owned(), p)));
    let mut images = BTreeSet::new();
    for (file, pod) in &pods {
        for c in &pod.spec.as_ref().unwrap().containers {
            let image = c
                .image
                .as_deref()
                .unwrap_or_else(|| panic!("{file}: {} has no image", c.name));
            assert!(
                image.starts_with("localhost/"),
                "{file}: {} runs {image}, which scripts/build-images does not build",
                c.name
            );
            // Never pulled: the node has them from scripts/build-images.
            assert_eq!(
                c.image_pull_policy.as_deref(),
                Some("IfNotPresent"),
                "{file}: {}",
                c.name
            );
            images.insert(image.to_owned());
            // scripts/build-images builds it, from a stage of Containerfile.prebuilt named
            // after the image that installs the binary the container runs.
            assert!(
                script.contains(image),
                "scripts/build-images does not build {image}"
            );
            let stage = image.rsplit('/').next().unwrap().split(':').next().unwrap();
            let base = prebuilt_stages
                .get(stage)
                .unwrap_or_else(|| panic!("Containerfile.prebuilt has no stage {stage} ({image})"));
            let program = argv(pod, c)[0].clone();
            assert!(
                prebuilt.contains(&format!(
                    "COPY bin/{} {program}",
                    program.rsplit('/').next().unwrap()
                )),
                "Containerfile.prebuilt does not install {program}"
            );
            // Our own binaries (on the distroless-like base, not FROM scratch) are also built
            // by the Containerfile for users who can pull distroless.
            if *base != "scratch" {
                containerfile_builds(&containerfile, pod, c);
            }
        }
    }
    let mut expected = BTreeSet::from([
        "localhost/cert-reload/cert-syncer:latest".to_owned(),
        "localhost/cert-reload/kube-apiserver:v1.20.2".to_owned(),
        "localhost/cert-reload/kube-controller-manager:v1.20.2".to_owned(),
        "localhost/cert-reload/kube-scheduler:v1.20.2".to_owned(),
    ]);
    if pods.len() > PODS.len() {
        expected.insert("localhost/cert-reload/mini-apiserver:latest".to_owned());
    }
    assert_eq!(images, expected);
    // The build uses the lock file and the packages exist.
    assert!(containerfile.contains("--locked") && script.contains("--locked"));
    let (cert_syncer, examples) = (
        root.join("cert-syncer/Cargo.toml"),
        root.join("examples/Cargo.toml"),
    );
    assert!(cert_syncer.is_file() && examples.is_file());
}

fn containerfile_builds(containerfile: &str, pod: &Pod, c: &k8s_openapi::api::core::v1::Container) {
    {
        let program = argv(pod, c)[0].clone();
        let binary = program.rsplit('/').next().unwrap();
        assert!(
            containerfile.contains(&format!("--bin {binary}")),
            "the Containerfile does not build {binary}"
        );
        assert!(
            containerfile.contains(&format!("/usr/local/bin/{binary}")),
            "the Containerfile does not install {program}"
        );
        // Each image named in the pod has a stage of the Containerfile.
        let image = c.image.as_deref().unwrap();
        let stage = image.rsplit('/').next().unwrap().split(':').next().unwrap();
        assert!(
            containerfile
                .lines()
                .any(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {stage}"))),
            "no `FROM … AS {stage}` stage for image {image}"
        );
    }
}
