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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context;
use http::HeaderValue;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use reload_lib::ClientTls;

use crate::cli::{ConfigError, ConnectionArgs};

/// A client and what keeps its reloadable parts alive.
pub struct Connection {
    /// The client for every API call.
    pub client: kube::Client,
    /// Where and how we connect, for error messages (no secrets).
    pub target: Target,
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
pub async fn connect(args: &ConnectionArgs) -> anyhow::Result<Connection> {
    let (mut config, kubeconfig_ca) = if let Some(path) = &args.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|err| {
            ConfigError(format!("cannot read kubeconfig {}: {err}", path.display()))
        })?;
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
    tracing::info!(server = %target.server, tls_server_name = ?target.tls_server_name, ca_file = ?target.ca_file, token_file = ?token_file, "connecting to the apiserver");

    let has_identity = config.auth_info.client_certificate.is_some()
        || config.auth_info.client_certificate_data.is_some();
    let (tls_config, tls) = match &ca_file {
        // A client certificate from a kubeconfig stays with kube's own TLS set-up.
        Some(path) if !has_identity => {
            let tls = ClientTls::builder(path)
                .name("apiserver-ca")
                .start()
                .await
                .map_err(|err| ConfigError(format!("CA file: {err}")))?;
            ((*tls.config()).clone(), Some(tls))
        }
        _ => (
            config
                .rustls_client_config()
                .context("cannot build the TLS configuration")?,
            None,
        ),
    };
    let token = match token_file {
        Some(path) => Some(Arc::new(TokenFile::open(path)?)),
        None => None,
    };

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone())
            .map_err(|err| ConfigError(format!("invalid TLS server name {name:?}: {err}")))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().wrap_connector(http);
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https);
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
        _tls: tls,
    })
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
        let text = std::fs::read_to_string(&self.path)
            .map_err(|err| format!("cannot read token file {path}: {err}"))?;
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
