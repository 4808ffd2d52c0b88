//! The connection flags every subcommand that talks to the apiserver flattens in.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::base::time::parse_duration;
use crate::kube::connection;

/// How to reach the apiserver (kubeconfig, or explicit flags).
#[derive(Debug, Args, Clone)]
pub struct ConnectionArgs {
    /// kubeconfig file (its current context). Without it, --server or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Apiserver URL, e.g. https://127.0.0.1:6443 (instead of a kubeconfig).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub server: Option<String>,
    /// CA bundle that the apiserver's certificate must chain to (with --server; with
    /// --kubeconfig it replaces the kubeconfig's CA, and a client certificate of the kubeconfig
    /// is still presented). Without any CA the connection is refused: the platform's trust
    /// store is never used for an apiserver.
    #[arg(long, requires = "server")]
    pub ca_file: Option<PathBuf>,
    /// File holding the bearer token (with --server); re-read when it changes.
    #[arg(long, requires = "server")]
    pub token_file: Option<PathBuf>,
    /// TLS server name (SNI and verification) to use instead of the URL's host, e.g.
    /// `localhost-recovery`.
    #[arg(long)]
    pub tls_server_name_override: Option<String>,
    /// INSECURE: allow an `http://` server (no TLS: anyone on the path reads and forges every
    /// object). Without it a non-`https` server is refused. Even with it no credential is ever
    /// sent in clear text: a token file, a kubeconfig token or client certificate, or a CA file
    /// together with an `http://` server is refused.
    #[arg(long)]
    pub insecure_plain_http: bool,
    /// Give up on a connection attempt (TCP connect and TLS handshake) after this long.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
    /// Give up on a request when the server sends nothing for this long (headers or body).
    /// Watches ask the server to end them after two thirds of it, so an idle watch is never
    /// cut by this timeout.
    #[arg(long, value_parser = parse_duration, default_value = "90s")]
    pub read_idle_timeout: Duration,
}

impl ConnectionArgs {
    /// The connection settings these flags give (every job that talks to the apiserver).
    pub(crate) fn settings(&self) -> connection::Settings {
        connection::Settings {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            server: self.server.clone(),
            ca_file: self.ca_file.clone(),
            token_file: self.token_file.clone(),
            tls_server_name_override: self.tls_server_name_override.clone(),
            insecure_plain_http: self.insecure_plain_http,
            connect_timeout: self.connect_timeout,
            read_idle_timeout: self.read_idle_timeout,
        }
    }
}
