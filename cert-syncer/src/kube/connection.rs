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
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context;
use http::HeaderValue;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use reload_lib::ClientTls;

use crate::base::error::{ConfigError, redact_parse_error};
use trust::{check_verification, client_identity, no_ca_error};

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
    _tls: Option<ClientTls>,
}

/// Where and how we connect. Printed in errors, so it holds no secret.
#[derive(Debug, Clone)]
pub struct Target {
    /// The apiserver URL.
    pub server: String,
    /// SNI and verification name, when it differs from the URL's host.
    pub tls_server_name: Option<String>,
    /// The CA bundle file, when there is one.
    pub ca_file: Option<PathBuf>,
}

impl Target {
    /// One sentence for a failed TLS handshake or a refused token: what was tried, with which
    /// files, and what to check.
    pub fn explain(&self, err: &(dyn std::error::Error + 'static)) -> Option<String> {
        let tls = find_rustls_error(err)?;
        let name = self.tls_server_name.as_deref().unwrap_or("the URL's host");
        let ca = self
            .ca_file
            .as_ref()
            .map_or("the configured CA data".to_owned(), |p| {
                p.display().to_string()
            });
        Some(match tls {
            rustls::Error::InvalidCertificate(reason) => format!(
                "TLS to {} refused: the certificate served for server name {name} is not \
                 trusted by {ca} ({reason:?}); check that the CA file matches the server \
                 name's certificate",
                self.server
            ),
            other => format!("TLS to {} failed: {other}", self.server),
        })
    }
}

fn find_rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // hyper-rustls reports a failed handshake as an io::Error wrapping tokio-rustls'
        // io::Error wrapping the rustls error; io::Error::source skips the wrapped error, so
        // descend through `get_ref` instead.
        let mut io = err.downcast_ref::<std::io::Error>();
        while let Some(inner) = io.and_then(std::io::Error::get_ref) {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            io = inner.downcast_ref::<std::io::Error>();
        }
        current = err.source();
    }
    None
}

/// Builds the client from a kubeconfig, from `--server` and friends, or from the in-cluster
/// config.
pub(crate) async fn connect(args: &Settings) -> anyhow::Result<Connection> {
    let (mut config, kubeconfig_ca) = if let Some(path) = &args.kubeconfig {
        let kubeconfig = read_kubeconfig(path)?;
        let ca = kubeconfig_ca_file(&kubeconfig, args.context.as_deref());
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|err| ConfigError(format!("invalid kubeconfig {}: {err}", path.display())))?;
        (config, ca)
    } else if let Some(server) = &args.server {
        let url = server
            .parse()
            .map_err(|err| ConfigError(format!("invalid --server {server}: {err}")))?;
        let mut config = kube::Config::new(url);
        if let Some(token) = &args.token_file {
            config.auth_info.token_file = Some(token.display().to_string());
        }
        (config, None)
    } else {
        let config = kube::Config::infer().await.map_err(|err| {
            ConfigError(format!(
                "no --kubeconfig or --server, and no in-cluster config: {err}"
            ))
        })?;
        (config, None)
    };
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

    if let Some(path) = &ca_file {
        // A FIFO or device here would hang the start-up (reload-lib then keeps following it).
        crate::base::input_file::check_path(
            "CA file",
            path,
            crate::base::input_file::MAX_CONFIG_FILE,
        )
        .map_err(ConfigError)?;
    }
    let (tls_config, tls) = match &ca_file {
        Some(path) => {
            let tls = ClientTls::builder(path)
                .name("apiserver-ca")
                .start()
                .await
                .map_err(|err| ConfigError(format!("CA file: {err}")))?;
            let mut tls_config = (*tls.config()).clone();
            // The kubeconfig's client certificate (file, data or exec), if any, with this CA.
            tls_config.client_auth_cert_resolver = client_identity(&config)?;
            (tls_config, Some(tls))
        }
        // The kubeconfig's certificate-authority-data.
        None if config.root_cert.is_some() => (
            config
                .rustls_client_config()
                .context("cannot build the TLS configuration")?,
            None,
        ),
        // No TLS at all (checked above: no credential either); the connector still wants one.
        None if plain_http => (
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            None,
        ),
        None => return Err(no_ca_error(&target.server, args.kubeconfig.as_deref()).into()),
    };
    let token = match token_file {
        Some(path) => Some(Arc::new(TokenFile::open(path)?)),
        None => None,
    };

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(args.connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls_config);
    // `https_only` also refuses a plain-HTTP URI that some layer might produce later.
    let mut https = if plain_http {
        https.https_or_http()
    } else {
        https.https_only()
    };
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone())
            .map_err(|err| ConfigError(format!("invalid TLS server name {name:?}: {err}")))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().wrap_connector(http);
    // Without these a server that accepts the connection and then says nothing (no handshake,
    // no headers, a body that stops) holds a request, and the process, forever. The connect
    // timeout covers the TCP connect and the TLS handshake; the read timeout is an idle timeout
    // (reset by every byte), so a long watch that keeps receiving events is not cut.
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(Some(args.connect_timeout));
    timed.set_read_timeout(Some(args.read_idle_timeout));
    timed.set_write_timeout(Some(args.read_idle_timeout));
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(timed);
    let kube_auth = config
        .auth_layer()
        .context("cannot set up authentication")?;
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(kube_auth)
        .option_layer(token.map(|token| {
            tower::util::MapRequestLayer::new(move |mut request: http::Request<_>| {
                if let Some(value) = token.header() {
                    request
                        .headers_mut()
                        .insert(http::header::AUTHORIZATION, value);
                }
                request
            })
        }))
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(Connection {
        client: kube::Client::new(service, config.default_namespace),
        target,
        watch_timeout_seconds: args.watch_timeout_seconds(),
        _tls: tls,
    })
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

/// A bearer token file, re-read when it changes.
///
/// # Security
/// The token is kept only as a sensitive `HeaderValue` and never logged; errors name the file.
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<TokenState>,
}

struct TokenState {
    stamp: Option<FileStamp>,
    header: Option<HeaderValue>,
    /// The last read failed (logged once until it succeeds again).
    failing: bool,
}

/// What changes when a file is replaced or rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// Reads the token now: a missing or empty file at start-up is a configuration error.
    pub fn open(path: PathBuf) -> Result<TokenFile, ConfigError> {
        let token = TokenFile {
            path,
            state: Mutex::new(TokenState {
                stamp: None,
                header: None,
                failing: false,
            }),
        };
        let mut state = token.state.lock().unwrap_or_else(|p| p.into_inner());
        token.refresh(&mut state).map_err(ConfigError)?;
        drop(state);
        Ok(token)
    }

    /// The `Authorization` value to send now: re-read if the file changed; the last good
    /// token when the file is unreadable or empty (logged).
    pub fn header(&self) -> Option<HeaderValue> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match self.refresh(&mut state) {
            Ok(()) => {
                if state.failing {
                    tracing::info!(path = %self.path.display(), "token file readable again");
                    state.failing = false;
                }
            }
            Err(reason) => {
                if !state.failing {
                    tracing::error!(%reason, "keeping the last good token");
                    state.failing = true;
                }
                // Try again on the next request even if the stamp did not change.
                state.stamp = None;
            }
        }
        state.header.clone()
    }

    fn refresh(&self, state: &mut TokenState) -> Result<(), String> {
        let path = self.path.display();
        let stamp = FileStamp::of(&self.path)
            .map_err(|err| format!("cannot read token file {path}: {err}"))?;
        if state.stamp.as_ref() == Some(&stamp) {
            return Ok(());
        }
        let (bytes, meta) = crate::base::input_file::read(
            "token file",
            &self.path,
            crate::base::input_file::MAX_TOKEN_FILE,
        )?;
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path, mode = %format_args!("{mode:o}"), "the token file is readable by group or others; it should be 0600 (or 0400)");
            }
        }
        let text =
            String::from_utf8(bytes).map_err(|_| format!("token file {path} is not UTF-8"))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(format!("token file {path} is empty"));
        }
        let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| format!("token file {path} holds characters not allowed in a header"))?;
        header.set_sensitive(true);
        if state.header.is_some() && state.header.as_ref() != Some(&header) {
            tracing::info!(path = %path, "token file changed; using the new token");
        }
        state.header = Some(header);
        state.stamp = Some(stamp);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_follows_the_file_and_survives_a_bad_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = TokenFile::open(path.clone()).unwrap();
        assert_eq!(token.header().unwrap(), "Bearer first");
        assert!(token.header().unwrap().is_sensitive());
        // Replaced by rename (a new inode), as kubelet and installers do.
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(token.header().unwrap(), "Bearer second");
        // Emptied: keep the last good token.
        std::fs::write(&path, "").unwrap();
        assert_eq!(token.header().unwrap(), "Bearer second");
        // Removed: still the last good token.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(token.header().unwrap(), "Bearer second");
        std::fs::write(&path, "third").unwrap();
        assert_eq!(token.header().unwrap(), "Bearer third");
        assert!(!format!("{token:?}").contains("third"));
    }

    #[test]
    fn a_refused_certificate_is_explained_through_nested_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        // As hyper-rustls reports it: io::Error::other(tokio-rustls' io::Error(rustls::Error)).
        let nested =
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
        let target = Target {
            server: "https://127.0.0.1:6443/".to_owned(),
            tls_server_name: Some("localhost-recovery".to_owned()),
            ca_file: Some(PathBuf::from("/etc/ca.crt")),
        };
        let text = target.explain(&nested).expect("explained");
        assert!(
            text.contains("localhost-recovery is not trusted by /etc/ca.crt")
                && text.contains("UnknownIssuer"),
            "{text}"
        );
        let other = std::io::Error::other("connection refused");
        assert!(target.explain(&other).is_none());
    }

    #[test]
    fn a_missing_or_empty_token_file_is_a_config_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let err = TokenFile::open(path.clone()).unwrap_err();
        assert!(err.0.contains(&path.display().to_string()), "{err}");
        std::fs::write(&path, "  \n").unwrap();
        let err = TokenFile::open(path).unwrap_err();
        assert!(err.0.contains("empty"), "{err}");
    }
}
