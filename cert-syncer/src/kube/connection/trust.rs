//! Where the apiserver connection's trust comes from, and what is refused: a kubeconfig that
//! turns verification off, a TLS connection with no CA (the platform's trust store is never
//! used for an apiserver), and the kubeconfig's client certificate carried over to a
//! `--ca-file` trust set-up instead of being dropped.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use kube::client::ConfigExt;

use crate::base::error::ConfigError;

/// Refuses a kubeconfig whose cluster turns certificate verification off: the token or client
/// certificate would then be presented to any server that answers at that address.
pub(super) fn check_verification(
    config: &kube::Config,
    kubeconfig: Option<&Path>,
) -> Result<(), ConfigError> {
    if !config.accept_invalid_certs {
        return Ok(());
    }
    let which = kubeconfig.map_or_else(
        || "the kubeconfig found in the environment (~/.kube/config)".to_owned(),
        |p| format!("kubeconfig {}", p.display()),
    );
    Err(ConfigError(format!(
        "refusing {which}: its cluster sets insecure-skip-tls-verify: true, so any server could \
         pose as the apiserver and receive the credentials; remove it and give the cluster's \
         certificate-authority (or certificate-authority-data), or --ca-file"
    )))
}

/// The error for a TLS connection with no CA to verify the apiserver with.
pub(super) fn no_ca_error(server: &str, kubeconfig: Option<&Path>) -> ConfigError {
    let hint = match kubeconfig {
        Some(path) => format!(
            "the kubeconfig {} names no certificate-authority or certificate-authority-data for \
             its cluster",
            path.display()
        ),
        None => "no --ca-file was given".to_owned(),
    };
    ConfigError(format!(
        "refusing server {}: {hint}, and the platform's trust store is never used for an \
         apiserver (any public CA could pose as it); give the cluster's CA with --ca-file or in \
         the kubeconfig",
        server
    ))
}

/// The client certificate kube would present for `config` (a kubeconfig's
/// `client-certificate`/`-data`, an exec plugin's), as a resolver for our own TLS set-up; one
/// that presents nothing when there is none. Built by kube's own code with an empty trust
/// store: only its certificate resolver is kept.
pub(super) fn client_identity(
    config: &kube::Config,
) -> anyhow::Result<Arc<dyn rustls::client::ResolvesClientCert>> {
    let mut identity_only = config.clone();
    identity_only.root_cert = Some(Vec::new());
    identity_only.root_cert_file = None;
    identity_only.accept_invalid_certs = false;
    let kube_tls = identity_only
        .rustls_client_config()
        .context("cannot load the kubeconfig's client certificate")?;
    Ok(kube_tls.client_auth_cert_resolver)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use kube::config::KubeConfigOptions;

    use super::super::{Settings, connect, read_kubeconfig};
    use super::*;

    fn settings(kubeconfig: Option<PathBuf>) -> Settings {
        Settings {
            kubeconfig,
            context: None,
            server: None,
            ca_file: None,
            token_file: None,
            tls_server_name_override: None,
            insecure_plain_http: false,
            connect_timeout: std::time::Duration::from_secs(1),
            read_idle_timeout: std::time::Duration::from_secs(3),
        }
    }

    /// A kubeconfig for `https://127.0.0.1:1` whose cluster has `cluster_extra` lines and whose
    /// user has `user_lines`.
    fn kubeconfig(dir: &Path, cluster_extra: &str, user_lines: &str) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://127.0.0.1:1\n\
                 {cluster_extra}  name: c\nusers:\n- name: u\n  user:\n{user_lines}contexts:\n\
                 - context: {{cluster: c, user: u}}\n  name: x\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        path
    }

    fn install_provider() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }

    #[tokio::test]
    async fn a_kubeconfig_that_skips_tls_verification_is_refused_naming_it() {
        install_provider();
        let dir = tempfile::tempdir().unwrap();
        let path = kubeconfig(
            dir.path(),
            "    insecure-skip-tls-verify: true\n",
            "    token: abcdef0123456789\n",
        );
        let Err(err) = connect(&settings(Some(path.clone()))).await else {
            panic!("an insecure kubeconfig must be refused");
        };
        let config = err
            .downcast_ref::<ConfigError>()
            .expect("a configuration error (exit 2)");
        assert!(
            config.0.contains("insecure-skip-tls-verify")
                && config.0.contains(&path.display().to_string()),
            "{config}"
        );
        assert!(!config.0.contains("abcdef0123456789"), "{config}");
    }

    #[tokio::test]
    async fn no_ca_is_refused_rather_than_verified_against_the_platform_store() {
        install_provider();
        let dir = tempfile::tempdir().unwrap();
        // A kubeconfig with a token and no certificate-authority.
        let path = kubeconfig(dir.path(), "", "    token: abcdef0123456789\n");
        let Err(err) = connect(&settings(Some(path.clone()))).await else {
            panic!("no CA must be refused");
        };
        let text = err.downcast_ref::<ConfigError>().expect("exit 2").0.clone();
        assert!(
            text.contains("platform's trust store") && text.contains(&path.display().to_string()),
            "{text}"
        );
        // --server and a token file, no --ca-file.
        let token = dir.path().join("token");
        std::fs::write(&token, "abcdef0123456789").unwrap();
        let mut flags = settings(None);
        flags.server = Some("https://127.0.0.1:1".to_owned());
        flags.token_file = Some(token);
        let Err(err) = connect(&flags).await else {
            panic!("no CA must be refused");
        };
        let text = err.downcast_ref::<ConfigError>().expect("exit 2").0.clone();
        assert!(text.contains("no --ca-file"), "{text}");
    }

    #[tokio::test]
    async fn the_kubeconfig_client_certificate_is_kept_with_the_ca_file() {
        install_provider();
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:admin");
        let cert = params.self_signed(&key).unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let (cert_file, key_file) = (dir.path().join("client.crt"), dir.path().join("client.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let path = kubeconfig(
            dir.path(),
            "",
            &format!(
                "    client-certificate: {}\n    client-key: {}\n",
                cert_file.display(),
                key_file.display()
            ),
        );
        let mut flags = settings(Some(path));
        flags.ca_file = Some(ca_file);
        // Builds (the CA file is honoured, not refused for want of a kubeconfig CA) ...
        let connection = connect(&flags)
            .await
            .expect("--ca-file with a client certificate");
        assert_eq!(
            connection.target.ca_file.as_deref(),
            flags.ca_file.as_deref()
        );
        // ... and the identity is the kubeconfig's.
        let config = kube::Config::from_custom_kubeconfig(
            read_kubeconfig(flags.kubeconfig.as_deref().unwrap()).unwrap(),
            &KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        assert!(client_identity(&config).unwrap().has_certs());
        let mut anonymous = config.clone();
        anonymous.auth_info = kube::config::AuthInfo::default();
        assert!(!client_identity(&anonymous).unwrap().has_certs());
    }
}
