//! Run with: `cargo run -p examples --bin tls-load -- --connect 127.0.0.1:8443 --server-name localhost --ca ca.crt`
//!
//! A handshake load generator: each worker connects, completes a TLS handshake (full, or resumed
//! when the server allows it), sends one `GET /` and reads the response, in a loop, for a duration
//! or a number of handshakes. It reports handshakes, failures grouped by reason, handshakes per
//! second, latency percentiles, and how many handshakes saw each leaf certificate serial, which is
//! how rotation tests see which certificate was served. `--json` prints one JSON object instead.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// TLS handshake load generator.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// Address to connect to.
    #[arg(long)]
    connect: SocketAddr,
    /// TLS server name (SNI and verification).
    #[arg(long)]
    server_name: String,
    /// CA bundle (PEM) the server certificate must chain to.
    #[arg(long)]
    ca: PathBuf,
    /// Client certificate chain (PEM) for mTLS.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Concurrent workers.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many handshakes (across workers), if reached before --duration.
    #[arg(long)]
    requests: Option<u64>,
    /// Disable session resumption: every handshake is a full one.
    #[arg(long)]
    no_resume: bool,
    /// Per-handshake-and-request timeout in milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// Print one JSON object on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

/// What one worker saw. Latencies are kept exactly (4 bytes a sample: a million handshakes cost
/// 4 MB), merged and sorted at the end.
#[derive(Debug, Default)]
struct Tally {
    handshake_us: Vec<u32>,
    request_us: Vec<u32>,
    resumed: u64,
    failures: BTreeMap<String, u64>,
    serials: BTreeMap<String, u64>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.handshake_us.extend(other.handshake_us);
        self.request_us.extend(other.request_us);
        self.resumed += other.resumed;
        for (reason, n) in other.failures {
            *self.failures.entry(reason).or_default() += n;
        }
        for (serial, n) in other.serials {
            *self.serials.entry(serial).or_default() += n;
        }
    }
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tls-load: cannot start the runtime: {err}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(err) => {
            eprintln!("tls-load: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Returns whether every handshake succeeded.
async fn run(flags: Flags) -> anyhow::Result<bool> {
    let config = client_config(&flags)?;
    let server_name = ServerName::try_from(flags.server_name.clone())
        .with_context(|| format!("invalid --server-name {}", flags.server_name))?;
    let deadline = Instant::now() + Duration::from_secs_f64(flags.duration);
    let budget = Arc::new(AtomicU64::new(flags.requests.unwrap_or(u64::MAX)));
    let timeout = Duration::from_millis(flags.timeout_ms);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..flags.concurrency.max(1) {
        let (config, server_name, budget) = (
            Arc::clone(&config),
            server_name.clone(),
            Arc::clone(&budget),
        );
        let (addr, host) = (flags.connect, flags.server_name.clone());
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while Instant::now() < deadline && take(&budget) {
                let outcome =
                    tokio::time::timeout(timeout, one(addr, &host, &server_name, &config)).await;
                match outcome {
                    Ok(Ok(seen)) => {
                        tally.handshake_us.push(seen.handshake_us);
                        tally.request_us.push(seen.request_us);
                        if seen.resumed {
                            tally.resumed += 1;
                        }
                        // A resumed handshake shows no certificate (rustls reports the one of the
                        // original session): only full handshakes count towards serials.
                        if let (Some(serial), false) = (seen.serial, seen.resumed) {
                            *tally.serials.entry(serial).or_default() += 1;
                        }
                    }
                    Ok(Err(reason)) => *tally.failures.entry(reason).or_default() += 1,
                    Err(_) => *tally.failures.entry("timeout".to_owned()).or_default() += 1,
                }
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for worker in workers {
        total.merge(worker.await.context("a worker panicked")?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    report(&flags, total, elapsed)
}

/// Claims one handshake from the shared budget.
fn take(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

struct Seen {
    handshake_us: u32,
    request_us: u32,
    resumed: bool,
    serial: Option<String>,
}

/// One connection: handshake, `GET /`, full response, status 200. Errors are the failure reason.
async fn one(
    addr: SocketAddr,
    host: &str,
    server_name: &ServerName<'static>,
    config: &Arc<rustls::ClientConfig>,
) -> Result<Seen, String> {
    let start = Instant::now();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
    let mut tls = connector
        .connect(server_name.clone(), tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let handshake_us = micros(start.elapsed());
    let (_, conn) = tls.get_ref();
    let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    // A resumed handshake carries no certificate.
    let serial = conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|leaf| x509_parser::parse_x509_certificate(leaf).ok())
        .map(|(_, cert)| normalize_serial(&cert.raw_serial_as_string()));
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("http: write: {e}"))?;
    let mut response = Vec::new();
    // Servers may close without close_notify; what was read is what counts.
    if let Err(err) = tls.read_to_end(&mut response).await
        && response.is_empty()
    {
        return Err(format!("http: read: {err}"));
    }
    let status = response
        .split(|b| *b == b' ')
        .nth(1)
        .map(|code| String::from_utf8_lossy(code).into_owned())
        .unwrap_or_default();
    if status != "200" {
        return Err(format!(
            "http: status {}",
            if status.is_empty() { "none" } else { &status }
        ));
    }
    Ok(Seen {
        handshake_us,
        request_us: micros(start.elapsed()),
        resumed,
        serial,
    })
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// `0a:1b:...` → `a1b...`: lowercase hex without separators or leading zeros, as reload-lib logs
/// serials.
fn normalize_serial(raw: &str) -> String {
    let hex: String = raw
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    let trimmed = hex.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_owned()
    } else {
        trimmed.to_owned()
    }
}

fn client_config(flags: &Flags) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&flags.ca)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("failed to read CA bundle {}", flags.ca.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "no certificate in CA bundle {}",
        flags.ca.display()
    );
    for cert in certs {
        roots
            .add(cert)
            .with_context(|| format!("bad certificate in CA bundle {}", flags.ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match (&flags.cert, &flags.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("failed to read client certificate {}", cert.display()))?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("failed to read client key {}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .with_context(|| {
                    format!(
                        "{} and {} are not a usable pair",
                        cert.display(),
                        key.display()
                    )
                })?
        }
        _ => builder.with_no_client_auth(),
    };
    if flags.no_resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(Arc::new(config))
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Prints the summary; returns whether there were no failures.
fn report(flags: &Flags, mut tally: Tally, elapsed: f64) -> anyhow::Result<bool> {
    tally.handshake_us.sort_unstable();
    tally.request_us.sort_unstable();
    let handshakes = tally.handshake_us.len() as u64;
    let failures: u64 = tally.failures.values().sum();
    let hs_per_sec = handshakes as f64 / elapsed.max(f64::EPSILON);
    let hs = &tally.handshake_us;
    if flags.json {
        let json = serde_json::json!({
            "handshakes": handshakes,
            "resumed": tally.resumed,
            "failures": failures,
            "failure_reasons": tally.failures,
            "hs_per_sec": (hs_per_sec * 10.0).round() / 10.0,
            "p50_us": percentile(hs, 0.50),
            "p90_us": percentile(hs, 0.90),
            "p99_us": percentile(hs, 0.99),
            "max_us": hs.last().copied().unwrap_or(0),
            "request_p50_us": percentile(&tally.request_us, 0.50),
            "request_p99_us": percentile(&tally.request_us, 0.99),
            "serials": tally.serials,
            "duration_secs": (elapsed * 1000.0).round() / 1000.0,
        });
        println!("{json}");
    } else {
        println!(
            "handshakes: {handshakes} ({} resumed) in {elapsed:.2} s: {hs_per_sec:.1}/s",
            tally.resumed
        );
        println!("failures: {failures}");
        for (reason, n) in &tally.failures {
            println!("  {n} × {reason}");
        }
        println!(
            "handshake latency µs: p50 {} p90 {} p99 {} max {}",
            percentile(hs, 0.5),
            percentile(hs, 0.9),
            percentile(hs, 0.99),
            hs.last().copied().unwrap_or(0)
        );
        println!(
            "request latency µs: p50 {} p99 {}",
            percentile(&tally.request_us, 0.5),
            percentile(&tally.request_us, 0.99)
        );
        println!("serials:");
        for (serial, n) in &tally.serials {
            println!("  {serial}: {n}");
        }
    }
    Ok(failures == 0)
}
