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
