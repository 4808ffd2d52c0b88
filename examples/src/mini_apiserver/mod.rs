//! A small Kubernetes-API-compatible server: core/v1 Secrets, ConfigMaps and Events, and
//! coordination.k8s.io/v1 Leases, with list, watch (resourceVersion, bounded history, 410 Gone,
//! bookmarks), get, create, update (409 on a stale resourceVersion), patch (merge, JSON patch,
//! a simplified apply) and delete; static-token or client-certificate authentication; TLS through
//! reload-lib with SNI certificates, so it can play the kube-apiserver of the recovery flow.
//!
//! What it is not: a kube-apiserver. No admission, no RBAC beyond read-only users, no other
//! resources, no field managers, no `generation`, no finalizers.

pub mod auth;
pub mod resource;
pub mod routes;
pub mod select;
pub mod status;
pub mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use reload_lib::{CertKeyPaths, ClientAuth, ServingSet};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::serve;

/// Flags of `mini-apiserver`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "mini-apiserver",
    version,
    about = "A small Kubernetes-API-compatible server for Secrets, ConfigMaps, Events and Leases"
)]
pub struct Flags {
    /// Address to listen on (port 0 picks a free port; the address is printed as `listening on ADDR`).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Default serving certificate chain (PEM).
    #[arg(long)]
    pub cert: PathBuf,
    /// Private key of the default certificate.
    #[arg(long)]
    pub key: PathBuf,
    /// Certificate for one SNI name: NAME=CERT,KEY (repeatable), e.g. localhost-recovery=...
    #[arg(long, value_name = "NAME=CERT,KEY")]
    pub sni: Vec<String>,
    /// Static token file: lines of `token,user,uid,"group1,group2"`.
    #[arg(long)]
    pub token_auth_file: PathBuf,
    /// Users (from the token file or client certificates) that may only get, list and watch.
    #[arg(long, value_delimiter = ',')]
    pub read_only_user: Vec<String>,
    /// CA bundle for client certificates: a verified certificate authenticates its CN as user.
    #[arg(long)]
    pub client_ca: Option<PathBuf>,
    /// Save the objects here after every change and load them at start (atomic writes, 0600).
    #[arg(long)]
    pub state_file: Option<PathBuf>,
    /// Load YAML or JSON manifests (`*.yaml`, `*.yml`, `*.json`; `---` separated documents) at
    /// start; objects that already exist are left as they are.
    #[arg(long)]
    pub seed_dir: Option<PathBuf>,
    /// Watch history length; watches from older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = store::DEFAULT_HISTORY)]
    pub history: usize,
}

/// Runs the server until SIGTERM/SIGINT.
pub async fn run(flags: Flags) -> anyhow::Result<()> {
    let store = Arc::new(store::Store::open(flags.state_file.clone(), flags.history)?);
    if let Some(dir) = &flags.seed_dir {
        seed(&store, dir)?;
    }
    let tokens = auth::Tokens::load(&flags.token_auth_file, &flags.read_only_user)?;
    let mut builder =
        ServingSet::builder(CertKeyPaths::new(&flags.cert, &flags.key)).name("mini-apiserver");
    for entry in &flags.sni {
        let (name, pair) = entry
            .split_once('=')
            .with_context(|| format!("--sni {entry}: expected NAME=CERT,KEY"))?;
        let (cert, key) = pair
            .split_once(',')
            .with_context(|| format!("--sni {entry}: expected NAME=CERT,KEY"))?;
        builder = builder.sni(name, CertKeyPaths::new(cert, key));
    }
    if let Some(ca) = &flags.client_ca {
        builder = builder.client_ca(ca, ClientAuth::Optional);
    }
    let set = builder.start().await?;
    set.reload_on_sighup()?;
    let api = Arc::new(routes::Api {
        store,
        tokens,
        client_cert_auth: flags.client_ca.is_some(),
    });
    let listener = TcpListener::bind(flags.listen)
        .await
        .with_context(|| format!("cannot listen on {}", flags.listen))?;
    println!("listening on {}", listener.local_addr()?);
    let shutdown = CancellationToken::new();
    tokio::spawn(serve::cancel_on_signal(shutdown.clone()));
    serve::serve_https(
        listener,
        set.acceptor(),
        move |conn, request| routes::handle(Arc::clone(&api), conn, request),
        shutdown,
    )
    .await?;
    Ok(())
}

/// Creates every object of every manifest in `dir` that does not exist yet.
fn seed(store: &store::Store, dir: &std::path::Path) -> anyhow::Result<()> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read seed dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let documents: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
            vec![
                serde_json::from_str(&text)
                    .with_context(|| format!("malformed JSON in {}", path.display()))?,
            ]
        } else {
            let mut documents = Vec::new();
            for document in serde_norway::Deserializer::from_str(&text) {
                let value = <Value as serde::Deserialize>::deserialize(document)
                    .with_context(|| format!("malformed YAML in {}", path.display()))?;
                if !value.is_null() {
                    documents.push(value);
                }
            }
            documents
        };
        for document in documents {
            let kind = document["kind"].as_str().unwrap_or_default();
            let resource = resource::Resource::from_kind(kind)
                .with_context(|| format!("{}: unsupported kind {kind:?}", path.display()))?;
            let namespace = document["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned();
            match store.create(resource, &namespace, document) {
                Ok(object) => {
                    tracing::info!(path = %path.display(), name = %store::meta_str(&object, "name"), "seeded")
                }
                Err(err) if err.reason == "AlreadyExists" => {}
                Err(err) => anyhow::bail!("{}: {}", path.display(), err.message),
            }
        }
    }
    Ok(())
}
