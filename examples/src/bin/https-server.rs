//! Run with: `cargo run -p examples --bin https-server -- --listen 127.0.0.1:8443 --cert tls.crt --key tls.key`
//!
//! A hot-reloading HTTPS server on reload-lib: rotate `tls.crt`/`tls.key` on disk (rename,
//! in-place write or a Kubernetes `..data` swap) and new handshakes get the new certificate while
//! open connections carry on. `GET /` answers 200 with the serial served on this connection;
//! with `--client-ca`, `GET /whoami` returns the client certificate's subject. `--static` serves
//! the same files through a plain, never-reloading rustls `ServerConfig`: the baseline for
//! measuring reload-lib's overhead.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use examples::serve::{self, Body, ConnInfo, Tls, full};
use reload_lib::{CertKeyPaths, ClientAuth, ServingSet};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

// About 135 allocations per connection (rustls messages and buffers, hyper, the task): mimalloc's
// thread-local free lists serve them in fewer instructions than glibc's arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A hot-reloading HTTPS server built on reload-lib.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// Default certificate chain (PEM, leaf first).
    #[arg(long, required_unless_present = "demo")]
    cert: Option<PathBuf>,
    /// Private key of the default certificate (PEM).
    #[arg(long, required_unless_present = "demo")]
    key: Option<PathBuf>,
    /// Self-contained demo: generate a CA and a certificate in a temporary directory, serve it,
    /// rotate it by rename every second while checking over TLS that each new certificate is
    /// served, print a timeline, and exit 0 when all rotations were seen.
    #[arg(long, conflicts_with_all = ["cert", "key", "static_config"])]
    demo: bool,
    /// Rotations performed by --demo.
    #[arg(long, default_value_t = 5, requires = "demo")]
    demo_rotations: u32,
    /// Extra certificate for one SNI name: NAME=CERT,KEY (repeatable; `*.` wildcards allowed).
    #[arg(long, value_name = "NAME=CERT,KEY")]
    sni: Vec<String>,
    /// Extra certificate served for the DNS names in it: CERT,KEY (repeatable).
    #[arg(long, value_name = "CERT,KEY")]
    sni_from_cert: Vec<String>,
    /// CA bundle that client certificates must chain to (enables mTLS).
    #[arg(long)]
    client_ca: Option<PathBuf>,
    /// Whether clients must present a certificate when --client-ca is set.
    #[arg(long, value_enum, default_value_t = ClientAuthFlag::Required)]
    client_auth: ClientAuthFlag,
    /// Serve Prometheus metrics on this address (plain HTTP, /metrics).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Periodic content resync in seconds (0 turns it off).
    #[arg(long, default_value_t = 60)]
    resync_secs: u64,
    /// Serve through a plain, never-reloading rustls ServerConfig (benchmark baseline; SNI
    /// entries are not supported in this mode).
    #[arg(long = "static")]
    static_config: bool,
    /// TLS 1.3 session tickets sent after each full handshake (rustls' `send_tls13_tickets`;
    /// default rustls' 2). They are stateful (the session cache holds the session), so 0 means
    /// no TLS 1.3 resumption and no cache insert per handshake: a benchmark setting, to match a
    /// peer configured without tickets.
    #[arg(long, value_name = "N")]
    tls13_tickets: Option<usize>,
    /// Threads serving connections, each with its own listener (`SO_REUSEPORT` when more than
    /// one) and single-threaded runtime (default: the CPUs this process may run on).
    /// Certificate reloading, signals and metrics run on one more thread.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    workers: Option<u16>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ClientAuthFlag {
    Required,
    Optional,
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    serve::init_tracing();
    // The control runtime: reloading, signals, metrics, the demo. Connections are served on
    // `--workers` threads of their own (`serve::serve_https_per_thread`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("https-server: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("https-server: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(mut flags: Flags) -> anyhow::Result<()> {
    let demo = if flags.demo {
        let demo =
            examples::demo::DemoPki::create().context("cannot create the demo certificates")?;
        flags.cert = Some(demo.cert_path());
        flags.key = Some(demo.key_path());
        flags.listen = "127.0.0.1:0".parse().expect("a valid address");
        Some(demo)
    } else {
        None
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let tls: Tls = if flags.static_config {
        Tls::Static(static_acceptor(&flags)?)
    } else {
        let set = serving_set(&flags, &mut registry).await?;
        set.reload_on_sighup()
            .context("cannot install the SIGHUP handler")?;
        // The set lives as long as its acceptor.
        set.acceptor().into()
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(serve::cancel_on_signal(shutdown.clone()));

    if let Some(addr) = flags.metrics_listen {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for metrics"))?;
        println!("metrics on {}", listener.local_addr()?);
        tokio::spawn(serve::serve_metrics(
            listener,
            Arc::new(registry),
            shutdown.clone(),
        ));
    }

    let workers = flags.workers.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        usize::from,
    );
    let listeners = serve::reuseport_listeners(flags.listen, workers)
        .with_context(|| format!("cannot listen on {}", flags.listen))?;
    let addr = listeners[0].local_addr()?;
    println!("listening on {addr}");
    let server = serve::serve_https_per_thread(listeners, tls, handle, shutdown.clone());
    if let Some(demo) = demo {
        let server = tokio::spawn(server);
        let outcome = demo.rotate_and_verify(addr, flags.demo_rotations).await;
        shutdown.cancel();
        server.await??;
        return outcome;
    }
    server.await?;
    Ok(())
}

async fn serving_set(
    flags: &Flags,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<ServingSet> {
    let (cert, key) = cert_and_key(flags)?;
    let mut builder = ServingSet::builder(CertKeyPaths::new(cert, key))
        .name("https-server")
        .crypto_provider(Arc::new(examples::provider::aws_lc_rs_keyed_once()))
        .resync_interval(
            (flags.resync_secs > 0).then(|| std::time::Duration::from_secs(flags.resync_secs)),
        )
        .metrics(registry);
    if let Some(tickets) = flags.tls13_tickets {
        builder = builder.configure(move |config| config.send_tls13_tickets = tickets);
    }
    for entry in &flags.sni {
        let (name, pair) = entry
            .split_once('=')
            .with_context(|| format!("--sni {entry}: expected NAME=CERT,KEY"))?;
        builder = builder.sni(
            name,
            pair_paths(pair).with_context(|| format!("--sni {entry}"))?,
        );
    }
    for pair in &flags.sni_from_cert {
        builder = builder.sni_from_certificate(
            pair_paths(pair).with_context(|| format!("--sni-from-cert {pair}"))?,
        );
    }
    if let Some(ca) = &flags.client_ca {
        let auth = match flags.client_auth {
            ClientAuthFlag::Required => ClientAuth::Required,
            ClientAuthFlag::Optional => ClientAuth::Optional,
        };
        builder = builder.client_ca(ca, auth);
    }
    Ok(builder.start().await?)
}

fn pair_paths(pair: &str) -> anyhow::Result<CertKeyPaths> {
    match pair.split_once(',') {
        Some((cert, key)) if !cert.is_empty() && !key.is_empty() => {
            Ok(CertKeyPaths::new(cert, key))
        }
        _ => bail!("expected CERT,KEY"),
    }
}

fn cert_and_key(flags: &Flags) -> anyhow::Result<(&PathBuf, &PathBuf)> {
    match (&flags.cert, &flags.key) {
        (Some(cert), Some(key)) => Ok((cert, key)),
        _ => bail!("--cert and --key are required"),
    }
}

/// The baseline: one `ServerConfig`, built once, never reloaded.
fn static_acceptor(flags: &Flags) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let (cert_path, key_path) = cert_and_key(flags)?;
    if !flags.sni.is_empty() || !flags.sni_from_cert.is_empty() {
        bail!("--static does not support --sni or --sni-from-cert");
    }
    let chain = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read certificates from {}", cert_path.display()))?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .with_context(|| format!("cannot read the private key from {}", key_path.display()))?;
    let provider = Arc::new(examples::provider::aws_lc_rs_keyed_once());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(rustls::ALL_VERSIONS)?;
    let builder = match &flags.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("cannot read {}", ca.display()))?
            {
                roots.add(cert.with_context(|| format!("bad certificate in {}", ca.display()))?)?;
            }
            let mut verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            if matches!(flags.client_auth, ClientAuthFlag::Optional) {
                verifier = verifier.allow_unauthenticated();
            }
            builder.with_client_cert_verifier(verifier.build()?)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).with_context(|| {
        format!(
            "{} and {} do not form a usable pair",
            cert_path.display(),
            key_path.display()
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(1024);
    if let Some(tickets) = flags.tls13_tickets {
        config.send_tls13_tickets = tickets;
    }
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn handle(
    conn: Arc<ConnInfo>,
    request: http::Request<hyper::body::Incoming>,
) -> http::Response<Body> {
    let response = match request.uri().path() {
        "/" => http::Response::builder()
            .header("content-type", "text/plain")
            .body(full("ok\n")),
        "/whoami" => match conn
            .peer_certs
            .first()
            .map(|leaf| reload_lib::CertInfo::from_der(leaf))
        {
            Some(Ok(info)) => http::Response::builder()
                .header("content-type", "text/plain")
                .body(full(format!("{}\n", info.subject))),
            Some(Err(_)) => http::Response::builder()
                .status(400)
                .body(full("unparsable client certificate\n")),
            None => http::Response::builder()
                .status(401)
                .body(full("no client certificate\n")),
        },
        _ => http::Response::builder()
            .status(404)
            .body(full("not found\n")),
    };
    response.expect("static response parts are valid")
}
