//! `manifests/node/node-mode/`: the node-mode DaemonSet and its RBAC. Statically: every object
//! parses as its Kubernetes type without losing a field, the DaemonSet runs on every node with
//! requests, probes on the node's loopback, and one hostPath (the file's directory, its static
//! pod manifests and static-pod-resources masked), its flags parse, and its Roles
//! grant exactly what `cert_syncer::access::node_access` says those flags need. On the real
//! kube-apiserver: the Roles as shipped suffice for node mode to run (sources read, Events on the
//! Node) and deny the namespace's other ConfigMaps.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cert_syncer::cli::{Cli, Command as CliCommand};
use clap::Parser;
use e2e::envtest::{RealApiServer, RealOptions, User};
use e2e::manifests::{documents, typed};
use e2e::syncer::bundle_config_map;
use e2e::{
    Ca, ChildProcess, bin_path, install_crypto_provider, plain_http_get, require_real_apiserver,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};

fn dir() -> PathBuf {
    e2e::manifests::dir().join("node/node-mode")
}

struct Objects {
    daemon_set: DaemonSet,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
}

/// Every object of the kustomization, typed (a field k8s-openapi does not know fails).
fn objects() -> Objects {
    let kustomization = documents(&dir().join("kustomization.yaml"));
    let resources: Vec<String> = kustomization[0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let mut listed: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    listed.sort();
    let mut sorted = resources.clone();
    sorted.sort();
    assert_eq!(sorted, listed, "the kustomization lists every object file");
    let (mut daemon_sets, mut roles, mut bindings) = (Vec::new(), Vec::new(), Vec::new());
    for file in &resources {
        for doc in documents(&dir().join(file)) {
            let what = format!("{file}: {}", doc["metadata"]["name"]);
            match doc["kind"].as_str().unwrap() {
                "DaemonSet" => daemon_sets.push(typed::<DaemonSet>(&doc, &what)),
                "Role" => roles.push(typed::<Role>(&doc, &what)),
                "RoleBinding" => bindings.push(typed::<RoleBinding>(&doc, &what)),
                "Namespace" => drop(typed::<Namespace>(&doc, &what)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(&doc, &what)),
                other => panic!("{what}: unexpected kind {other}"),
            }
        }
    }
    assert_eq!(daemon_sets.len(), 1);
    Objects {
        daemon_set: daemon_sets.remove(0),
        roles,
        bindings,
    }
}

/// The container's flags as `cert-syncer` parses them (NODE_NAME as the downward API sets it).
fn node_args(daemon_set: &DaemonSet) -> cert_syncer::cli::NodeArgs {
    let spec = daemon_set
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let container = &spec.containers[0];
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    argv[0] = "cert-syncer".to_owned();
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|err| panic!("{argv:?}: {err}"));
    let CliCommand::Node(mut args) = cli.command else {
        panic!("the DaemonSet runs `cert-syncer node`");
    };
    args.node_name = Some("node-0".to_owned());
    args
}

type Atom = (String, String, String, Option<String>);

#[test]
fn the_daemon_set_runs_on_every_node_with_requests_probes_and_only_the_files_directory() {
    let Objects { daemon_set, .. } = objects();
    let spec = daemon_set
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let tolerations = spec.tolerations.as_ref().expect("tolerations");
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "tolerates every taint"
    );
    assert_eq!(spec.containers.len(), 1);
    let container = &spec.containers[0];
    let requests = container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("resource requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    // /metrics and /readyz on the node's loopback only (the host network), probed there.
    let args = node_args(&daemon_set);
    let listen = args.metrics_listen.expect("--metrics-listen");
    assert!(
        listen.ip().is_loopback(),
        "--metrics-listen {listen} must be a loopback address"
    );
    assert_eq!(
        spec.host_network,
        Some(true),
        "the probes reach the node's loopback"
    );
    assert!(container.ports.is_none(), "no port is exposed");
    let port = |probe: &Option<k8s_openapi::api::core::v1::Probe>, path: &str| {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.host.as_deref(), Some(listen.ip().to_string().as_str()));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(listen.port().into())
        );
    };
    port(&container.liveness_probe, "/healthz");
    port(&container.readiness_probe, "/readyz");
    let env = container.env.as_ref().expect("env");
    assert!(env.iter().any(|e| {
        e.name == "NODE_NAME"
            && e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str())
                == Some("spec.nodeName")
    }));
    // One hostPath, the directory of the file the flags name, mounted at the same path (the
    // rename into place needs it writable); its sensitive subdirectories masked.
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| PathBuf::from("/etc/kubernetes/kubelet-ca.crt"));
    let host_paths: Vec<_> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (v.name.clone(), h.path.clone()))
        })
        .collect();
    let parent = file.parent().unwrap().display().to_string();
    assert_eq!(host_paths.len(), 1, "{host_paths:?}");
    assert_eq!(host_paths[0].1, parent);
    let mounts = container.volume_mounts.as_ref().unwrap();
    let host_mounts: Vec<_> = mounts
        .iter()
        .filter(|m| m.name == host_paths[0].0)
        .collect();
    assert_eq!(host_mounts.len(), 1);
    assert_eq!(host_mounts[0].mount_path, parent);
    assert_ne!(host_mounts[0].read_only, Some(true), "the rename needs it");
    assert!(host_mounts[0].sub_path.is_none());
    // Every other mount masks a subdirectory of it with an empty, read-only volume.
    let mut masked = BTreeSet::new();
    for mount in mounts.iter().filter(|m| m.name != host_paths[0].0) {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("a volume per mount");
        assert!(volume.empty_dir.is_some(), "{}: an emptyDir", mount.name);
        assert_eq!(mount.read_only, Some(true), "{}", mount.name);
        let relative = Path::new(&mount.mount_path)
            .strip_prefix(&parent)
            .unwrap_or_else(|_| panic!("{} is under {parent}", mount.mount_path));
        masked.insert(relative.display().to_string());
    }
    for sensitive in ["manifests", "static-pod-resources"] {
        assert!(
            masked.contains(sensitive),
            "{parent}/{sensitive} is masked: {masked:?}"
        );
    }
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
}

#[test]
fn the_roles_grant_exactly_what_the_flags_need() {
    let Objects {
        daemon_set,
        roles,
        bindings,
    } = objects();
    let required =
        cert_syncer::access::required_access(&CliCommand::Node(node_args(&daemon_set))).unwrap();
    let mut needed: BTreeSet<Atom> = BTreeSet::new();
    for access in &required {
        for verb in &access.verbs {
            for name in access
                .resource_names
                .clone()
                .map_or(vec![None], |n| n.into_iter().map(Some).collect())
            {
                needed.insert((
                    access.namespace.clone(),
                    access.resource.to_owned(),
                    (*verb).to_owned(),
                    name,
                ));
            }
        }
    }
    let account = daemon_set
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .service_account_name
        .clone()
        .unwrap();
    let mut granted: BTreeSet<Atom> = BTreeSet::new();
    for binding in &bindings {
        assert!(
            binding
                .subjects
                .iter()
                .flatten()
                .all(|s| s.kind == "ServiceAccount" && s.name == account)
        );
        let namespace = binding.metadata.namespace.clone().unwrap();
        let role = roles
            .iter()
            .find(|r| {
                r.metadata.name == Some(binding.role_ref.name.clone())
                    && r.metadata.namespace.as_deref() == Some(&namespace)
            })
            .expect("every binding names a Role of its namespace");
        for rule in role.rules.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for name in rule
                        .resource_names
                        .clone()
                        .map_or(vec![None], |n| n.into_iter().map(Some).collect())
                    {
                        granted.insert((namespace.clone(), resource.clone(), verb.clone(), name));
                    }
                }
            }
        }
    }
    assert_eq!(
        granted, needed,
        "least privilege: the Roles grant what node mode needs, nothing more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_suffices_on_the_real_apiserver_and_hides_other_config_maps() {
    require_real_apiserver!();
    install_crypto_provider();
    let Objects {
        daemon_set,
        roles,
        bindings,
    } = objects();
    let token = "node-mode-token-0123456789";
    let options = RealOptions {
        users: vec![User::service_account(
            token,
            "cert-syncer-node",
            "cert-syncer-node",
        )],
        ..RealOptions::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    let api = tokio::task::block_in_place(|| {
        RealApiServer::start_with(&tmp.path().join("apiserver"), &options)
    });
    let admin = api.recovery_client();
    // Every namespace the Roles name, `default` too: kube-apiserver creates `default` a moment
    // after it turns ready, and a Role created before that is refused ("namespaces \"default\"
    // not found"; 2 runs in 5 failed so). A 409 from that race is fine.
    let mut namespaces: Vec<&str> = vec!["cert-syncer-node", "openshift-config-managed"];
    for role in &roles {
        let namespace = role.metadata.namespace.as_deref().unwrap();
        if !namespaces.contains(&namespace) {
            namespaces.push(namespace);
        }
    }
    for namespace in namespaces {
        api.create_namespace(namespace).await;
    }
    for mut role in roles {
        role.metadata.resource_version = None;
        Api::<Role>::namespaced(admin.clone(), role.metadata.namespace.as_deref().unwrap())
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
    }
    for mut binding in bindings {
        binding.metadata.resource_version = None;
        Api::<RoleBinding>::namespaced(
            admin.clone(),
            binding.metadata.namespace.as_deref().unwrap(),
        )
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "openshift-config-managed");
    let ca = Ca::default();
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("kube-apiserver-client-ca", &ca.cert_pem),
        )
        .await
        .unwrap();
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("something-else", &ca.cert_pem),
        )
        .await
        .unwrap();

    // The container's own flags, with the test's connection and file in place of the in-cluster
    // config and /etc/kubernetes.
    let token_file = tmp.path().join("sa-token");
    std::fs::write(&token_file, token).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let host = tmp.path().join("etc-kubernetes");
    std::fs::create_dir_all(&host).unwrap();
    let file = host.join("kubelet-ca.crt");
    let container = &daemon_set
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let args: Vec<String> = container
        .args
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|a| {
            if a.starts_with("--metrics-listen") {
                "--metrics-listen=127.0.0.1:0".to_owned()
            } else {
                a
            }
        })
        .collect();
    let mut command = Command::new(bin_path("cert-syncer"));
    command
        .arg("node")
        .args(&args)
        .args([
            "--server",
            &api.url(),
            "--tls-server-name-override",
            "localhost-recovery",
        ])
        .arg("--ca-file")
        .arg(api.dir.join("recovery-ca.crt"))
        .arg("--token-file")
        .arg(&token_file)
        .arg("--file")
        .arg(&file)
        .env("NODE_NAME", "node-rbac")
        .env("RUST_LOG", "info");
    let node = ChildProcess::start(command);
    wait_for_file(&file).await;
    e2e::wait_until(
        "ready with the shipped RBAC",
        Duration::from_secs(30),
        || async { plain_http_get(&node.addr.to_string(), "/readyz").0 == 200 },
    )
    .await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), "default");
    e2e::wait_until("an Event on the Node", Duration::from_secs(30), || async {
        events
            .list(&kube::api::ListParams::default().fields("involvedObject.name=node-rbac"))
            .await
            .is_ok_and(|l| !l.items.is_empty())
    })
    .await;
    assert!(
        !node.stderr_text().contains("cannot publish event"),
        "{}",
        node.stderr_text()
    );
    // The same identity cannot read the namespace's other ConfigMaps.
    let as_node: Api<ConfigMap> =
        Api::namespaced(api.client_with_token(token), "openshift-config-managed");
    match as_node.get("something-else").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("another ConfigMap must be forbidden: {other:?}"),
    }
    assert!(
        as_node.list(&Default::default()).await.is_err(),
        "listing the namespace is forbidden"
    );
}

async fn wait_for_file(path: &Path) {
    e2e::wait_until(
        &format!("{}", path.display()),
        Duration::from_secs(60),
        || async { path.exists() },
    )
    .await;
}
