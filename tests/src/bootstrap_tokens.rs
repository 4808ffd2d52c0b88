//! Bootstrap tokens on the real kube-apiserver: the kubelet's bootstrap identity as clusters
//! create it (a `bootstrap.kubernetes.io/token` Secret in `kube-system`), for the CSR approver's
//! tests.

use std::time::Duration;

use crate::envtest::RealApiServer;

/// The kube-apiserver flag that turns on bootstrap-token authentication (Secrets
/// `kube-system/bootstrap-token-<id>`), for [`crate::envtest::RealOptions::extra_args`] and
/// [`RealApiServer::bootstrap_token`].
pub const BOOTSTRAP_TOKEN_AUTH: &str = "--enable-bootstrap-token-auth";

impl RealApiServer {
    /// Creates the bootstrap token `<id>.<secret>` as kubeadm and OpenShift's installer do (a
    /// `bootstrap.kubernetes.io/token` Secret `kube-system/bootstrap-token-<id>` usable for
    /// authentication, with `extra_groups` as its `auth-extra-groups`) and waits until
    /// kube-apiserver (started with [`BOOTSTRAP_TOKEN_AUTH`]) authenticates it: as
    /// `system:bootstrap:<id>` in `system:bootstrappers`, the extra groups and
    /// `system:authenticated`. Returns the token.
    ///
    /// # Panics
    /// When the Secret cannot be created or the token is not accepted within 30 s.
    pub async fn bootstrap_token(&self, id: &str, secret: &str, extra_groups: &[&str]) -> String {
        use k8s_openapi::api::core::v1::Secret;
        let mut data = std::collections::BTreeMap::from([
            ("token-id".to_owned(), id.to_owned()),
            ("token-secret".to_owned(), secret.to_owned()),
            (
                "usage-bootstrap-authentication".to_owned(),
                "true".to_owned(),
            ),
        ]);
        if !extra_groups.is_empty() {
            data.insert("auth-extra-groups".to_owned(), extra_groups.join(","));
        }
        let token_secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("bootstrap-token-{id}")),
                namespace: Some("kube-system".to_owned()),
                ..Default::default()
            },
            type_: Some("bootstrap.kubernetes.io/token".to_owned()),
            string_data: Some(data),
            ..Default::default()
        };
        kube::Api::<Secret>::namespaced(self.recovery_client(), "kube-system")
            .create(&kube::api::PostParams::default(), &token_secret)
            .await
            .unwrap_or_else(|err| panic!("creating bootstrap token {id}: {err}"));
        let token = format!("{id}.{secret}");
        // The authenticator reads the Secrets through an informer: a moment until it knows the
        // token. Discovery is allowed to every authenticated user (and to no anonymous one).
        let (addr, ca) = (self.addr(), self.recovery_ca.clone());
        testkit::wait::wait_until(
            &format!("kube-apiserver to accept bootstrap token {id}"),
            Duration::from_secs(30),
            || {
                let (token, ca) = (token.clone(), ca.clone());
                async move {
                    tokio::task::spawn_blocking(move || {
                        let config = crate::tls::client_config(&ca);
                        crate::envtest::blocking_get(
                            addr,
                            "localhost-recovery",
                            config,
                            "/apis",
                            &token,
                        )
                    })
                    .await
                    .is_ok_and(|got| matches!(got, Ok((200, _))))
                }
            },
        )
        .await;
        token
    }
}
