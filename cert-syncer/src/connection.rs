//! The apiserver connection: a kubeconfig, or explicit flags (URL, CA file, token file), with an
//! optional TLS server name override for the `localhost-recovery` SNI certificate.

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cli::{ConfigError, ConnectionArgs};

/// Builds the client. The CA file and the token file are re-read by kube-client when they
/// change (it refreshes them periodically), so rotating either needs no restart.
pub async fn client(args: &ConnectionArgs) -> anyhow::Result<kube::Client> {
    let mut config = if let Some(path) = &args.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|err| {
            ConfigError(format!("cannot read kubeconfig {}: {err}", path.display()))
        })?;
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|err| ConfigError(format!("invalid kubeconfig {}: {err}", path.display())))?
    } else if let Some(server) = &args.server {
        let url = server
            .parse()
            .map_err(|err| ConfigError(format!("invalid --server {server}: {err}")))?;
        let mut config = kube::Config::new(url);
        if let Some(ca) = &args.ca_file {
            std::fs::metadata(ca).map_err(|err| {
                ConfigError(format!("cannot read --ca-file {}: {err}", ca.display()))
            })?;
            config.root_cert_file = Some(ca.clone());
        }
        if let Some(token) = &args.token_file {
            std::fs::metadata(token).map_err(|err| {
                ConfigError(format!(
                    "cannot read --token-file {}: {err}",
                    token.display()
                ))
            })?;
            config.auth_info.token_file = Some(token.display().to_string());
        }
        config
    } else {
        kube::Config::infer().await.map_err(|err| {
            ConfigError(format!(
                "no --kubeconfig or --server, and no in-cluster config: {err}"
            ))
        })?
    };
    if let Some(name) = &args.tls_server_name_override {
        config.tls_server_name = Some(name.clone());
    }
    tracing::info!(server = %config.cluster_url, tls_server_name = ?config.tls_server_name, "connecting to the apiserver");
    kube::Client::try_from(config).context("cannot build the apiserver client")
}
