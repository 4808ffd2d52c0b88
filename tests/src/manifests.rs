//! Reading `manifests/`: its Kubernetes objects as k8s-openapi types, the static pod's
//! containers as command lines, container paths as the node files they come from, and the
//! RBAC a service account is bound to. Used by `tests/manifests.rs` (static checks) and
//! `tests/access.rs` (the sidecars' real requests against the RBAC).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};

/// The static pod's file, relative to `manifests/`.
pub const POD: &str = "static-pod/kube-apiserver-pod.yaml";
/// The container that runs `cert-syncer sync`.
pub const SYNC_CONTAINER: &str = "kube-apiserver-cert-syncer";
/// The container that runs `cert-syncer regenerate`.
pub const REGENERATE_CONTAINER: &str = "kube-apiserver-cert-regeneration-controller";
/// The server container (kube-apiserver; `mini-apiserver` in the demo variant).
pub const SERVER_CONTAINER: &str = "kube-apiserver";
/// The node name used for the mirror pod's name (`<pod>-<node>`), as the kubelet names it.
pub const NODE: &str = "control-plane-0";
/// The node's address as the kubelet reports it for host-network pods (`--node-ip 127.0.0.1`,
/// as the node tier runs it).
pub const NODE_IP: &str = "127.0.0.1";
/// The demo variant of the static pod: a kustomize overlay of `static-pod/` with the
/// `mini-apiserver` stand-in in the server container (render with `kubectl kustomize`).
pub const MINI_POD_DIR: &str = "static-pod-mini";

/// `<workspace>/manifests`.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e package lives in the workspace")
        .join("manifests")
}

/// The YAML documents of `path` (`---` separated), as JSON values; empty documents skipped.
///
/// # Panics
/// When the file cannot be read or a document is not YAML, naming the file.
pub fn documents(path: &Path) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| {
            serde_json::Value::deserialize(doc)
                .unwrap_or_else(|err| panic!("{} is not YAML: {err}", path.display()))
        })
        .filter(|value| !value.is_null())
        .collect()
}

/// Every file under `manifests/` (sorted), relative to it.
pub fn files() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a readable manifests dir") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).expect("under root").to_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir(), &dir(), &mut out);
    out.sort();
    out
}

/// The Kubernetes object files: every `*.yaml` outside `node/` that is not a kustomization.
/// `monitoring/` holds rule files and a PrometheusRule (a custom resource, no k8s-openapi type),
/// checked by `tests/manifests/monitoring.rs`.
pub fn object_files() -> Vec<PathBuf> {
    files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.starts_with("node") && !p.starts_with("monitoring"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect()
}

/// Parses `value` as `T`, and checks that serializing it back gives the same JSON: a field
/// k8s-openapi does not know (a typo, a wrong level) would be dropped and show up here.
///
/// # Panics
/// When it does not parse or does not round-trip, naming `what`.
pub fn typed<T>(value: &serde_json::Value, what: &str) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|err| panic!("{what}: not a valid {}: {err}", std::any::type_name::<T>()));
    let back = serde_json::to_value(&typed).expect("k8s-openapi types serialize");
    if back != *value {
        panic!(
            "{what}: fields lost when parsed as {} (unknown or misplaced fields?)\n{}",
            std::any::type_name::<T>(),
            diff(value, &back, "")
        );
    }
    typed
}

/// Paths where two JSON values differ, one per line.
fn diff(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> String {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .map(|k| {
                    diff(
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        &format!("{at}.{k}"),
                    )
                })
                .collect()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .map(|(i, (x, y))| diff(x, y, &format!("{at}[{i}]")))
            .collect(),
        _ if a == b => String::new(),
        _ => format!("  {at}: {a} became {b}\n"),
    }
}

/// The static pod.
pub fn pod() -> Pod {
    let path = dir().join(POD);
    let docs = documents(&path);
    assert_eq!(docs.len(), 1, "{} holds one object", path.display());
    typed(&docs[0], POD)
}

/// The container `name` of `pod`.
///
/// # Panics
/// When there is none.
pub fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("the static pod has no container {name}"))
}

/// The environment the kubelet gives `container`: literal values, and downward-API fields
/// (`metadata.name` is the mirror pod's name `<pod>-<node>`, as the kubelet names it;
/// `status.hostIP` is [`NODE_IP`]).
///
/// # Panics
/// On a `valueFrom` other than `metadata.name` / `metadata.namespace` / `status.hostIP`.
pub fn environment(pod: &Pod, container: &Container) -> BTreeMap<String, String> {
    let meta = &pod.metadata;
    let mut env = BTreeMap::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), None) => value.clone(),
            (None, Some(from)) => {
                let field = from.field_ref.as_ref().unwrap_or_else(|| {
                    panic!("{}: env {} is not a fieldRef", container.name, var.name)
                });
                match field.field_path.as_str() {
                    "metadata.name" => format!("{}-{NODE}", meta.name.as_deref().unwrap_or("")),
                    "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
                    "status.hostIP" => NODE_IP.to_owned(),
                    // The kubelet sets a static pod's node to its own.
                    "spec.nodeName" => NODE.to_owned(),
                    other => panic!(
                        "{}: env {} from unexpected field {other}",
                        container.name, var.name
                    ),
                }
            }
            _ => panic!("{}: env {} has no value", container.name, var.name),
        };
        env.insert(var.name.clone(), value);
    }
    env
}

/// `command` + `args` with `$(VAR)` expanded from the container's environment, as the kubelet
/// does.
///
/// # Panics
/// On a `$(VAR)` the container does not define (the kubelet would pass it through verbatim,
/// which is never what was meant).
pub fn argv(pod: &Pod, container: &Container) -> Vec<String> {
    let env = environment(pod, container);
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .map(|arg| {
            let mut out = String::new();
            let mut rest = arg.as_str();
            while let Some(start) = rest.find("$(") {
                out.push_str(&rest[..start]);
                let end = rest[start..]
                    .find(')')
                    .unwrap_or_else(|| panic!("{}: unclosed $( in {arg}", container.name));
                let name = &rest[start + 2..start + end];
                let value = env.get(name).unwrap_or_else(|| {
                    panic!(
                        "{}: {arg} refers to $({name}), which is not in its env",
                        container.name
                    )
                });
                out.push_str(value);
                rest = &rest[start + end + 1..];
            }
            out.push_str(rest);
            out
        })
        .collect()
}

/// `argv` (from [`argv`]) parsed by cert-syncer's flags as the process would parse it in
/// the container: flags that clap reads from an environment variable (`POD_NAME`,
/// `POD_NAMESPACE`, ...) take the container's value unless given on the command line. The
/// test process's own environment plays no part.
///
/// # Errors
/// clap's error for flags cert-syncer refuses.
pub fn parse_cert_syncer(
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> Result<cert_syncer::cli::Cli, clap::Error> {
    use clap::{CommandFactory, Parser};
    let command = cert_syncer::cli::Cli::command();
    let subcommand = argv
        .get(1)
        .and_then(|name| command.find_subcommand(name))
        .ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidSubcommand,
                format!("no subcommand in {argv:?}\n"),
            )
        })?;
    let mut full = argv.to_vec();
    for arg in subcommand.get_arguments().chain(command.get_arguments()) {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let Some(value) = var.to_str().and_then(|var| env.get(var)) else {
            continue;
        };
        let given = argv
            .iter()
            .any(|a| *a == format!("--{long}") || a.starts_with(&format!("--{long}=")));
        if !given {
            full.push(format!("--{long}={value}"));
        }
    }
    cert_syncer::cli::Cli::try_parse_from(full)
}

/// The node file behind `path` as `container` sees it: through its volume mounts to the
/// hostPath volume, then under `manifests/node/` (which mirrors the node's file system).
/// `None` when the path is on no hostPath mount.
pub fn node_file(pod: &Pod, container: &Container, path: &str) -> Option<(String, PathBuf)> {
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|mount| {
            let rest = path.strip_prefix(mount.mount_path.as_str())?;
            let rest = rest.strip_prefix('/').unwrap_or(rest);
            let volume = volumes.iter().find(|v| v.name == mount.name)?;
            let host = volume.host_path.as_ref()?.path.trim_end_matches('/');
            let host_path = if rest.is_empty() {
                host.to_owned()
            } else {
                format!("{host}/{rest}")
            };
            Some((mount.mount_path.len(), host_path))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, host_path)| {
            let repo = dir().join("node").join(host_path.trim_start_matches('/'));
            (host_path, repo)
        })
}

/// The value of `--flag=VALUE` or `--flag VALUE` in `argv`.
pub fn flag<'a>(argv: &'a [String], name: &str) -> Option<&'a str> {
    let long = format!("--{name}");
    argv.iter().enumerate().find_map(|(i, arg)| {
        if let Some(value) = arg.strip_prefix(&format!("{long}=")) {
            Some(value)
        } else if *arg == long {
            argv.get(i + 1).map(String::as_str)
        } else {
            None
        }
    })
}

/// The cluster-side objects: every document of every object file outside the static pods'
/// directories (`static-pod*/`: the pods, and the peer's own cluster objects,
/// `static-pod-openshift-peer/cluster/`, never applied with `manifests/`).
pub fn cluster_objects() -> Vec<(PathBuf, serde_json::Value)> {
    object_files()
        .into_iter()
        .filter(|p| !p.to_string_lossy().starts_with("static-pod"))
        .flat_map(|p| {
            documents(&dir().join(&p))
                .into_iter()
                .map(move |doc| (p.clone(), doc))
        })
        .collect()
}

/// The objects of `kind` among [`cluster_objects`].
pub fn of_kind<T>(kind: &str) -> Vec<T>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    cluster_objects()
        .into_iter()
        .filter(|(_, doc)| doc["kind"] == kind)
        .map(|(path, doc)| typed(&doc, &path.display().to_string()))
        .collect()
}

/// The service account a token file path names: `…/secrets/<secret>/token` is the mounted
/// token Secret `<secret>`, whose `kubernetes.io/service-account.name` annotation names the
/// account (in the Secret's namespace). Returns (namespace, name).
///
/// # Panics
/// When the path does not have that shape or the Secret is not in the manifests.
pub fn service_account_of_token_file(token_file: &str) -> (String, String) {
    let mut parts = token_file.rsplit('/');
    let (file, secret, kind) = (parts.next(), parts.next(), parts.next());
    assert_eq!(
        (file, kind),
        (Some("token"), Some("secrets")),
        "token file {token_file} is not …/secrets/<secret>/token"
    );
    let secret = secret.expect("a secret name");
    // Any object file: the peer pod's token Secret is in static-pod-openshift-peer/cluster/.
    let found: Vec<Secret> = object_files()
        .into_iter()
        .flat_map(|p| {
            documents(&dir().join(&p))
                .into_iter()
                .map(move |doc| (p.clone(), doc))
        })
        .filter(|(_, doc)| doc["kind"] == "Secret")
        .map(|(path, doc)| typed::<Secret>(&doc, &path.display().to_string()))
        .filter(|s| s.metadata.name.as_deref() == Some(secret))
        .collect();
    assert_eq!(found.len(), 1, "one Secret {secret} in the manifests");
    let secret = &found[0];
    assert_eq!(
        secret.type_.as_deref(),
        Some("kubernetes.io/service-account-token"),
        "Secret {:?} is a service-account token",
        secret.metadata.name
    );
    let account = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubernetes.io/service-account.name"))
        .expect("the token Secret names its service account")
        .clone();
    (
        secret
            .metadata
            .namespace
            .clone()
            .expect("a namespaced Secret"),
        account,
    )
}

/// The rules a service account is granted, by namespace: every Role bound to it by a
/// RoleBinding of the Role's namespace, and every ClusterRole bound to it by a
/// ClusterRoleBinding, under namespace `""` (cluster-scoped resources:
/// `cert_syncer::access::CLUSTER`; no ClusterRole here grants namespaced resources).
pub fn granted_rules(namespace: &str, account: &str) -> Vec<(String, PolicyRule)> {
    let roles: Vec<Role> = of_kind("Role");
    let bindings: Vec<RoleBinding> = of_kind("RoleBinding");
    let mut out = Vec::new();
    for binding in bindings {
        let binds_account = binding.subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == account
                && s.namespace.as_deref() == Some(namespace)
        });
        if !binds_account {
            continue;
        }
        assert_eq!(binding.role_ref.kind, "Role", "bindings refer to Roles");
        let ns = binding
            .metadata
            .namespace
            .clone()
            .expect("a namespaced RoleBinding");
        let role = roles
            .iter()
            .find(|r| {
                r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                    && r.metadata.namespace.as_deref() == Some(ns.as_str())
            })
            .unwrap_or_else(|| {
                panic!(
                    "RoleBinding {ns}/{:?} refers to a missing Role",
                    binding.metadata.name
                )
            });
        for rule in role.rules.iter().flatten() {
            out.push((ns.clone(), rule.clone()));
        }
    }
    let cluster_roles: Vec<ClusterRole> = of_kind("ClusterRole");
    for binding in of_kind::<ClusterRoleBinding>("ClusterRoleBinding") {
        let binds_account = binding.subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == account
                && s.namespace.as_deref() == Some(namespace)
        });
        if !binds_account {
            continue;
        }
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        let role = cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str()))
            .unwrap_or_else(|| {
                panic!(
                    "ClusterRoleBinding {:?} refers to a missing ClusterRole",
                    binding.metadata.name
                )
            });
        for rule in role.rules.iter().flatten() {
            out.push((String::new(), rule.clone()));
        }
    }
    out
}

/// Whether RBAC `rules` (by namespace) allow a request: RBAC's matching, with `resourceNames`
/// matching only requests that name an object.
pub fn rbac_allows(
    rules: &[(String, PolicyRule)],
    verb: &str,
    api_group: &str,
    resource: &str,
    namespace: &str,
    name: Option<&str>,
) -> bool {
    let has = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|v| v == value || v == "*")
    };
    rules.iter().any(|(ns, rule)| {
        ns == namespace
            && rule.verbs.iter().any(|v| v == verb || v == "*")
            && has(&rule.api_groups, api_group)
            && has(&rule.resources, resource)
            && match (&rule.resource_names, name) {
                (None, _) => true,
                (Some(names), _) if names.is_empty() => true,
                (Some(names), Some(name)) => names.iter().any(|n| n == name),
                (Some(_), None) => false,
            }
    })
}
