//! The client's layers under kube: TCP with a connect timeout, TLS with our configuration
//! (and a fixed server name when it differs from the URL's host), read and write idle
//! timeouts, then kube's base URI, its authentication (a kubeconfig's), the token file
//! re-read when it changes, and extra headers.

use std::sync::Arc;

use anyhow::Context;
use kube::client::ConfigExt;

use super::token::TokenFile;
use crate::base::error::ConfigError;

/// How long a connection may take to set up, and to stay silent.
pub(super) struct Timeouts {
    /// The TCP connect and the TLS handshake.
    pub connect: std::time::Duration,
    /// Reads and writes, reset by every byte.
    pub idle: std::time::Duration,
}

/// The kube client over our TLS configuration, timeouts and token file.
pub(super) fn client(
    config: &kube::Config,
    tls_config: rustls::ClientConfig,
    plain_http: bool,
    token: Option<Arc<TokenFile>>,
    timeouts: &Timeouts,
) -> anyhow::Result<kube::Client> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeouts.connect));
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
    timed.set_connect_timeout(Some(timeouts.connect));
    timed.set_read_timeout(Some(timeouts.idle));
    timed.set_write_timeout(Some(timeouts.idle));
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
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}
