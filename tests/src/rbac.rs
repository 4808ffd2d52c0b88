//! RBAC objects on a real kube-apiserver, which enforces them: the Roles and RoleBindings of
//! `manifests/` applied as they are, or an access list (`cert_syncer::access::required_access`)
//! granted to one user as Roles, so a run shows the grants suffice.

use std::collections::BTreeMap;

use cert_syncer::access::Access;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, PostParams};

/// Creates every Role and RoleBinding of `manifests/` (and their namespaces), and every
/// ClusterRole and ClusterRoleBinding, with `admin`.
///
/// # Panics
/// When the API refuses one.
pub async fn apply_manifest_rbac(admin: &kube::Client) -> usize {
    let roles: Vec<Role> = crate::manifests::of_kind("Role");
    let bindings: Vec<RoleBinding> = crate::manifests::of_kind("RoleBinding");
    let mut count = 0;
    for mut role in roles {
        let namespace = role.metadata.namespace.clone().expect("a namespaced Role");
        crate::envtest::create_namespace(admin, &namespace).await;
        role.metadata.resource_version = None;
        Api::<Role>::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &role)
            .await
            .unwrap_or_else(|err| panic!("Role {namespace}/{:?}: {err}", role.metadata.name));
        count += 1;
    }
    for mut binding in bindings {
        let namespace = binding
            .metadata
            .namespace
            .clone()
            .expect("a namespaced RoleBinding");
        crate::envtest::create_namespace(admin, &namespace).await;
        binding.metadata.resource_version = None;
        Api::<RoleBinding>::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|err| {
                panic!("RoleBinding {namespace}/{:?}: {err}", binding.metadata.name)
            });
        count += 1;
    }
    for mut role in crate::manifests::of_kind::<ClusterRole>("ClusterRole") {
        role.metadata.resource_version = None;
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &role)
            .await
            .unwrap_or_else(|err| panic!("ClusterRole {:?}: {err}", role.metadata.name));
        count += 1;
    }
    for mut binding in crate::manifests::of_kind::<ClusterRoleBinding>("ClusterRoleBinding") {
        binding.metadata.resource_version = None;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|err| panic!("ClusterRoleBinding {:?}: {err}", binding.metadata.name));
        count += 1;
    }
    count
}

/// Grants `user` exactly `list`: one Role `name` per namespace with a rule per entry, bound to
/// the user (namespaces created as needed).
///
/// # Panics
/// When the API refuses one.
pub async fn grant(admin: &kube::Client, user: &str, name: &str, list: &[Access]) {
    let mut by_namespace: BTreeMap<&str, Vec<PolicyRule>> = BTreeMap::new();
    for access in list {
        by_namespace
            .entry(access.namespace.as_str())
            .or_default()
            .push(PolicyRule {
                api_groups: Some(vec![access.api_group.to_owned()]),
                resources: Some(vec![access.resource.to_owned()]),
                verbs: access.verbs.iter().map(|v| (*v).to_owned()).collect(),
                resource_names: access.resource_names.clone(),
                ..PolicyRule::default()
            });
    }
    for (namespace, rules) in by_namespace {
        if namespace == cert_syncer::access::CLUSTER {
            grant_cluster_scoped(admin, user, name, rules).await;
            continue;
        }
        crate::envtest::create_namespace(admin, namespace).await;
        let meta = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        };
        let role = Role {
            metadata: meta.clone(),
            rules: Some(rules),
        };
        Api::<Role>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &role)
            .await
            .unwrap_or_else(|err| panic!("Role {namespace}/{name}: {err}"));
        let binding = RoleBinding {
            metadata: meta,
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".to_owned(),
                kind: "Role".to_owned(),
                name: name.to_owned(),
            },
            subjects: Some(vec![Subject {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "User".to_owned(),
                name: user.to_owned(),
                namespace: None,
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|err| panic!("RoleBinding {namespace}/{name}: {err}"));
    }
}

/// The cluster-scoped part of [`grant`]: one ClusterRole `name` and its ClusterRoleBinding.
async fn grant_cluster_scoped(
    admin: &kube::Client,
    user: &str,
    name: &str,
    rules: Vec<PolicyRule>,
) {
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap_or_else(|err| panic!("ClusterRole {name}: {err}"));
    bind_cluster_role(admin, name, name, vec![subject("User", user, None)]).await;
}

/// A subject of a binding: a `User` or `Group` (`namespace` `None`), or a `ServiceAccount` of
/// `namespace`.
pub fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
    Subject {
        // The core group for service accounts, RBAC's for users and groups.
        api_group: (kind != "ServiceAccount").then(|| "rbac.authorization.k8s.io".to_owned()),
        kind: kind.to_owned(),
        name: name.to_owned(),
        namespace: namespace.map(str::to_owned),
    }
}

/// Binds `subjects` to ClusterRole `role` with the ClusterRoleBinding `name`.
///
/// # Panics
/// When the API refuses it.
pub async fn bind_cluster_role(
    admin: &kube::Client,
    name: &str,
    role: &str,
    subjects: Vec<Subject>,
) {
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: role.to_owned(),
        },
        subjects: Some(subjects),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap_or_else(|err| panic!("ClusterRoleBinding {name}: {err}"));
}
