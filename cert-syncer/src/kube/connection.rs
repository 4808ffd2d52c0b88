//! The apiserver connection: a kubeconfig, or explicit flags (URL, CA file, token file), with an
//! optional TLS server name override for the `localhost-recovery` SNI certificate.
//!
//! kube-client re-reads a CA file and a token file only every 60 s. A sidecar whose token or
//! recovery CA was just rotated would fail for up to a minute, so the client is assembled here
//! from kube's layers with two replacements:
//! - TLS: the CA file is a reload-lib [`ClientTls`] (inotify), so the next handshake verifies
//!   with the new bundle;
//! - auth: the token file is checked (one `stat`) before every request and re-read when its
//!   identity, size or modification time changed, so the next request carries the new token.
//!
//! Trust is never implicit: the apiserver's certificate is verified against `--ca-file`, else
//! the kubeconfig's `certificate-authority` (file or data), else the in-cluster CA; with none
//! of them the connection is refused (exit 2) rather than verified against the platform's
//! trust store (any public CA could then impersonate the apiserver). A kubeconfig with
//! `insecure-skip-tls-verify: true` is refused (the token would go to any peer). A client
//! certificate from the kubeconfig is presented whatever the CA's source: `--ca-file` is
//! honoured with it, never silently dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use reload_lib::ClientTls;

use crate::base::error::{ConfigError, redact_parse_error};
pub use target::{NoAnswer, Target};
pub use token::TokenFile;
use trust::{check_verification, client_identity, no_ca_error};

mod target;
mod token;
mod transport;
mod trust;

/// How to reach the apiserver: a kubeconfig, or an explicit URL with a CA file and a token
/// file (the connection flags, see `cli::ConnectionArgs` for each one's meaning).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub server: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub tls_server_name_override: Option<String>,
    pub insecure_plain_http: bool,
    pub connect_timeout: std::time::Duration,
    pub read_idle_timeout: std::time::Duration,
}

impl Settings {
    /// `timeoutSeconds` for watches: two thirds of the read idle timeout (at least 1 s), so a
    /// quiet watch ends cleanly (and is resumed) before the idle timeout would cut it.
    pub fn watch_timeout_seconds(&self) -> u32 {
        let seconds = self.read_idle_timeout.as_secs() * 2 / 3;
        seconds.clamp(1, 3600) as u32
    }
}

/// A client and what keeps its reloadable parts alive.
pub struct Connection {
    /// The client for every API call.
    pub client: kube::Client,
    /// Where and how we connect, for error messages (no secrets).
    pub target: Target,
    /// `timeoutSeconds` for every watch (below the read idle timeout).
    pub watch_timeout_seconds: u32,
    /// Follows the CA file; dropping it would freeze the trust bundle.
    tls: Option<ClientTls>,
}

impl Connection {
    /// Changes of the CA file (each reload of reload-lib's `ClientTls`): a connection refused
    /// as untrusted may succeed after one. `None` without a CA file.
    pub fn trust_changes(&self) -> Option<tokio::sync::watch::Receiver<reload_lib::Status>> {
        self.tls.as_ref().map(ClientTls::subscribe)
    }
}

/// Builds the client from a kubeconfig, from `--server` and friends, or from the in-cluster
/// config, in four phases: where to connect and with which credentials ([`load_config`]),
/// what is refused before any connection (verification off, a token that cannot be sent,
/// plain HTTP with credentials), the trust to verify the apiserver with ([`tls_config`]), and
/// the client's layers (`transport`).
pub(crate) async fn connect(args: &Settings) -> anyhow::Result<Connection> {
    let (mut config, kubeconfig_ca) = load_config(args).await?;
    check_verification(&config, args.kubeconfig.as_deref())?;
    check_inline_token(&config)?;
    if let Some(name) = &args.tls_server_name_override {
        config.tls_server_name = Some(name.clone());
    }
    let ca_file = args
        .ca_file
        .clone()
        .or(kubeconfig_ca)
        .or_else(|| config.root_cert_file.clone());
    let target = Target {
        server: config.cluster_url.to_string(),
        tls_server_name: config.tls_server_name.clone(),
        ca_file: ca_file.clone(),
    };
    let token_file = config.auth_info.token_file.take().map(PathBuf::from);
    let plain_http = check_transport(
        &config,
        ca_file.as_deref(),
        token_file.as_deref(),
        args.insecure_plain_http,
    )?;
    tracing::info!(server = %target.server, tls_server_name = ?target.tls_server_name, ca_file = ?target.ca_file, token_file = ?token_file, "connecting to the apiserver");

    let (tls_config, tls) = tls_config(&config, &target, plain_http, args).await?;
    let token = token_file.map(TokenFile::open).transpose()?.map(Arc::new);
    let timeouts = transport::Timeouts {
        connect: args.connect_timeout,
        idle: args.read_idle_timeout,
    };
    let client = transport::client(&config, tls_config, plain_http, token, &timeouts)?;
    Ok(Connection {
        client,
        target,
        watch_timeout_seconds: args.watch_timeout_seconds(),
        tls,
    })
}

/// Where to connect and with which credentials: the kubeconfig (and the CA file it names, so
/// that file can be followed), else `--server` with `--token-file`, else the in-cluster config.
async fn load_config(args: &Settings) -> anyhow::Result<(kube::Config, Option<PathBuf>)> {
    if let Some(path) = &args.kubeconfig {
        let kubeconfig = read_kubeconfig(path)?;
        let ca = kubeconfig_ca_file(&kubeconfig, args.context.as_deref());
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|err| ConfigError(format!("invalid kubeconfig {}: {err}", path.display())))?;
        return Ok((config, ca));
    }
    if let Some(server) = &args.server {
        let url = server
            .parse()
            .map_err(|err| ConfigError(format!("invalid --server {server}: {err}")))?;
        let mut config = kube::Config::new(url);
        if let Some(token) = &args.token_file {
            config.auth_info.token_file = Some(token.display().to_string());
        }
        return Ok((config, None));
    }
    let config = kube::Config::infer().await.map_err(|err| {
        ConfigError(format!(
            "no --kubeconfig or --server, and no in-cluster config: {err}"
        ))
    })?;
    Ok((config, None))
}

/// The TLS client configuration the apiserver is verified with: the CA file, followed by
/// reload-lib (with the kubeconfig's client certificate, if any), else the kubeconfig's
/// `certificate-authority-data`; none for plain HTTP; never the platform's store.
async fn tls_config(
    config: &kube::Config,
    target: &Target,
    plain_http: bool,
    args: &Settings,
) -> anyhow::Result<(rustls::ClientConfig, Option<ClientTls>)> {
    if let Some(path) = &target.ca_file {
        // A FIFO or device here would hang the start-up (reload-lib then keeps following it).
        crate::base::input_file::check_path(
            "CA file",
            path,
            crate::base::input_file::MAX_CONFIG_FILE,
        )
        .map_err(ConfigError)?;
        let tls = ClientTls::builder(path)
            .name("apiserver-ca")
            .start()
            .await
            .map_err(|err| ConfigError(format!("CA file: {err}")))?;
        let mut tls_config = (*tls.config()).clone();
        // The kubeconfig's client certificate (file, data or exec), if any, with this CA.
        tls_config.client_auth_cert_resolver = client_identity(config)?;
        return Ok((tls_config, Some(tls)));
    }
    if config.root_cert.is_some() {
        // The kubeconfig's certificate-authority-data.
        let tls_config = config
            .rustls_client_config()
            .context("cannot build the TLS configuration")?;
        return Ok((tls_config, None));
    }
    if plain_http {
        // No TLS at all (checked: no credential either); the connector still wants one.
        let tls_config = rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        return Ok((tls_config, None));
    }
    Err(no_ca_error(&target.server, args.kubeconfig.as_deref()).into())
}

/// Reads and parses a kubeconfig. It holds credentials, so a parse error never quotes it: the
/// YAML parser's message shows the neighbouring lines (a token among them); only its first
/// line is kept, with every quoted part removed.
fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, ConfigError> {
    let (bytes, _) =
        crate::base::input_file::read("kubeconfig", path, crate::base::input_file::MAX_CONFIG_FILE)
            .map_err(ConfigError)?;
    let text = String::from_utf8(bytes).map_err(|err| {
        ConfigError(format!(
            "kubeconfig {} is not UTF-8 (byte {})",
            path.display(),
            err.utf8_error().valid_up_to()
        ))
    })?;
    if let Err(err) = Kubeconfig::from_yaml(&text) {
        return Err(ConfigError(format!(
            "cannot parse kubeconfig {}: {}",
            path.display(),
            redact_parse_error(&err.to_string())
        )));
    }
    // Parsed again by kube, which also makes its relative file paths absolute.
    Kubeconfig::read_from(path).map_err(|err| {
        ConfigError(format!(
            "cannot read kubeconfig {}: {}",
            path.display(),
            redact_parse_error(&err.to_string())
        ))
    })
}

/// An inline kubeconfig token must fit in a header: tower-http would panic on a newline.
fn check_inline_token(config: &kube::Config) -> Result<(), ConfigError> {
    if let Some(token) = &config.auth_info.token {
        use secrecy::ExposeSecret;
        let text = token.expose_secret();
        if text.trim().is_empty() || text.trim().bytes().any(|b| b.is_ascii_control()) {
            return Err(ConfigError(
                "the kubeconfig user's token is empty or holds a newline or another control \
                 character"
                    .to_owned(),
            ));
        }
    }
    Ok(())
}

/// Refuses a server that is not `https://` (exit 2) unless `allow_plain_http`
/// (`--insecure-plain-http`); even then refuses any credential or CA, which would either go out
/// in clear text or be silently ignored. Returns whether the connection is plain HTTP.
fn check_transport(
    config: &kube::Config,
    ca_file: Option<&Path>,
    token_file: Option<&Path>,
    allow_plain_http: bool,
) -> Result<bool, ConfigError> {
    let url = &config.cluster_url;
    match url.scheme_str() {
        Some("https") => return Ok(false),
        Some("http") if allow_plain_http => {}
        Some("http") => {
            return Err(ConfigError(format!(
                "refusing server {url}: plain HTTP has no TLS, so the CA file would be ignored \
                 and the bearer token sent in clear text; use an https:// URL (or, for a test \
                 server without credentials only, --insecure-plain-http)"
            )));
        }
        other => {
            return Err(ConfigError(format!(
                "refusing server {url}: the scheme must be https, not {}",
                other.map_or("missing".to_owned(), |s| format!("{s:?}"))
            )));
        }
    }
    let auth = &config.auth_info;
    let mut refused = Vec::new();
    if token_file.is_some() || auth.token.is_some() {
        refused.push("a bearer token");
    }
    if auth.username.is_some() || auth.password.is_some() {
        refused.push("a user name and password");
    }
    if auth.client_certificate.is_some()
        || auth.client_certificate_data.is_some()
        || auth.client_key.is_some()
        || auth.client_key_data.is_some()
    {
        refused.push("a client certificate");
    }
    if auth.exec.is_some() || auth.auth_provider.is_some() {
        refused.push("an exec or auth-provider credential");
    }
    if ca_file.is_some() || config.root_cert.is_some() {
        refused.push("a CA (there is no TLS to verify)");
    }
    if !refused.is_empty() {
        return Err(ConfigError(format!(
            "--insecure-plain-http: refusing {} with the plain-HTTP server {url}: credentials are \
             never sent in clear text",
            refused.join(", ")
        )));
    }
    tracing::warn!(server = %url, "INSECURE: plain HTTP, no TLS and no credentials (--insecure-plain-http)");
    Ok(true)
}

/// The CA file named by the kubeconfig's cluster for `context` (or the current context).
fn kubeconfig_ca_file(kubeconfig: &Kubeconfig, context: Option<&str>) -> Option<PathBuf> {
    let context_name = context.or(kubeconfig.current_context.as_deref())?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)?
        .context
        .as_ref()?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)?
        .cluster
        .as_ref()?;
    cluster.certificate_authority.as_ref().map(PathBuf::from)
}
