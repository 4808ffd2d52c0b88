//! Service accounts for the node files (the sidecars', the approver's, the bootstrap
//! kubeconfig's): created and bound to a ClusterRole, and their tokens, asked of the pod's
//! kube-apiserver.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// Creates service account `namespace/account` and binds it to ClusterRole `role` with the
/// ClusterRoleBinding `binding`.
///
/// # Panics
/// When the API refuses either.
pub async fn bound_service_account(
    admin: &kube::Client,
    (namespace, account): (&str, &str),
    binding: &str,
    role: &str,
) {
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(
            &pp,
            &ServiceAccount {
                metadata: ObjectMeta {
                    namespace: Some(namespace.to_owned()),
                    name: Some(account.to_owned()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .unwrap_or_else(|err| panic!("service account {namespace}/{account}: {err}"));
    let subject = crate::rbac::subject("ServiceAccount", account, Some(namespace));
    crate::rbac::bind_cluster_role(admin, binding, role, vec![subject]).await;
}

/// A year-long token of `namespace/account` (TokenRequest: the pod's kube-apiserver signs it).
pub async fn token_of(admin: &kube::Client, namespace: &str, account: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(365 * 86_400),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    api.create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|err| panic!("a token for {namespace}/{account}: {err}"))
        .status
        .expect("the token")
        .token
}

/// Writes, into the pod's resource dir `resources` on the host, the token of every container
/// of `pod` that has a `--kubeconfig`: the account its kubeconfig's `tokenFile` belongs to (the
/// token Secret of `manifests/` names it), at that file's place (0600). `rendered` is the pod
/// as `manifests/` renders it (its hostPaths find the kubeconfig in the repository's node
/// files).
///
/// # Panics
/// When a kubeconfig is on no hostPath, names no token file outside the resource dir, or the
/// API refuses a token.
pub async fn write_container_tokens(
    admin: &kube::Client,
    pod: &k8s_openapi::api::core::v1::Pod,
    rendered: &k8s_openapi::api::core::v1::Pod,
    resources: &std::path::Path,
) {
    use crate::manifests;
    for container in &pod.spec.as_ref().expect("a pod spec").containers {
        let argv = super::pod::raw_argv(pod, &container.name);
        let Some(config) = manifests::flag(&argv, "kubeconfig") else {
            continue;
        };
        let (_, repo_file) = manifests::node_file(rendered, container, config)
            .unwrap_or_else(|| panic!("{}: {config} is on no hostPath", container.name));
        let parsed: serde_json::Value =
            serde_norway::from_str(&std::fs::read_to_string(&repo_file).unwrap()).unwrap();
        let Some(token_file) = parsed["users"][0]["user"]["tokenFile"].as_str() else {
            // A client certificate's kubeconfig (the server's own): no token.
            continue;
        };
        let (namespace, account) = manifests::service_account_of_token_file(token_file);
        let token = token_of(admin, &namespace, &account).await;
        let host = resources.join(
            token_file
                .strip_prefix("/etc/kubernetes/static-pod-resources/")
                .expect("the token file is in the resource dir"),
        );
        std::fs::create_dir_all(host.parent().expect("a parent")).unwrap();
        testkit::rename::rename_into_with_mode(&host, token.as_bytes(), 0o600);
    }
}
