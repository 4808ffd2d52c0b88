//! Service-account tokens for the node files (the sidecars', the approver's, the bootstrap
//! kubeconfig's), asked of the pod's kube-apiserver.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;

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
