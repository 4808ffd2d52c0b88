//! Run with: `cargo run -p examples --bin tls-load -- --connect 127.0.0.1:8443 --server-name localhost --ca ca.crt`
//!
//! A TLS handshake load generator. Each of `--concurrency` workers loops: TCP connect, TLS
//! handshake (SNI `--server-name`, verified against the `--ca` bundle, optional mTLS identity),
//! one `GET / HTTP/1.1` with `Connection: close`, the whole response read and its status checked,
//! close. It stops after `--duration` seconds or `--requests` attempts, whichever comes first, and
//! reports handshakes (and how many were resumed), failures grouped by reason, handshakes per
//! second, latency percentiles, and how many full handshakes saw each leaf certificate serial:
//! that last figure is how rotation tests see which certificate was served. `--json` prints the
//! same figures as one JSON object. Exit status: 0 when every attempt succeeded, 1 when any
//! failed, 2 on bad flags or unreadable files. The engine lives in `examples::load`.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use examples::load::{self, Settings};
use rustls::client::Resumption;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// TLS handshake load generator: connect, handshake, GET /, close, repeat.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// Address to connect to.
    #[arg(long, value_name = "ADDR")]
    connect: SocketAddr,
    /// Server name: sent as SNI, checked against the server certificate, used as the Host header.
    #[arg(long, value_name = "NAME")]
    server_name: String,
    /// CA bundle (PEM, one or more certificates) the server certificate must chain to.
    #[arg(long, value_name = "FILE")]
    ca: PathBuf,
    /// Client certificate chain (PEM, leaf first) presented for mTLS; needs --key.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Workers, each running one connection at a time.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// Stop starting connections after this many seconds (fractions allowed); those in flight
    /// finish.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    duration: Duration,
    /// Stop after this many attempts in total (successes and failures), if reached before
    /// --duration.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,
    /// Disable session resumption: every handshake is a full one.
    #[arg(long)]
    no_resume: bool,
    /// Time limit of one attempt (connect, handshake and request) in milliseconds; an attempt
    /// over it is a "timeout" failure.
    #[arg(long, value_name = "MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout_ms: u64,
    /// Print one JSON object on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

/// Parses `--duration`. Bounded so that `start + duration` cannot overflow an `Instant`.
fn parse_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text.parse().map_err(|_| format!("not a number: {text}"))?;
    if !(secs > 0.0 && secs <= 31_536_000.0) {
        return Err(format!(
            "must be more than 0 and at most a year, got {text}"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Reads the files and builds the settings before the first connection, so a bad file is one
/// configuration error (exit 2) rather than one failure per attempt.
fn settings(flags: &Flags) -> anyhow::Result<Settings> {
    let settings = Settings::new(
        flags.connect,
        &flags.server_name,
        client_config(flags)?,
        flags.concurrency,
        flags.duration,
    )?;
    Ok(settings
        .requests(flags.requests)
        .timeout(Duration::from_millis(flags.timeout_ms)))
}

/// The client config: the CA bundle as the only roots, an optional client identity, and
/// rustls' default in-memory session store unless `--no-resume`.
fn client_config(flags: &Flags) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let what = "CA bundle";
    for cert in read_certs(&flags.ca, what)? {
        roots
            .add(cert)
            .with_context(|| format!("bad certificate in {what} {}", flags.ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match (&flags.cert, &flags.key) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "client certificate")?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(pem_error)
                .with_context(|| format!("failed to read client key {}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .with_context(|| {
                    let (cert, key) = (cert.display(), key.display());
                    format!("client certificate {cert} and key {key} are not a usable pair")
                })?
        }
        // clap's `requires` makes the two flags come together.
        _ => builder.with_no_client_auth(),
    };
    if flags.no_resume {
        config.resumption = Resumption::disabled();
    }
    Ok(Arc::new(config))
}

/// Every certificate of a PEM file; an empty file is an error, since it can only be a mistake.
fn read_certs(path: &Path, what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(pem_error)
        .with_context(|| format!("failed to read {what} {}", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "no certificate in {what} {}",
        path.display()
    );
    Ok(certs)
}

/// Unwraps I/O errors so the message reads "…: No such file or directory" rather than
/// "…: I/O error: No such file or directory".
fn pem_error(err: pem::Error) -> anyhow::Error {
    match err {
        pem::Error::Io(err) => err.into(),
        pem::Error::NoItemsFound => anyhow::anyhow!("no PEM item of the expected kind"),
        err => err.into(),
    }
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let settings = match settings(&flags) {
        Ok(settings) => Arc::new(settings),
        Err(err) => {
            eprintln!("tls-load: {err:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tls-load: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let summary = match runtime.block_on(load::run(settings)) {
        Ok(summary) => summary,
        Err(err) => {
            eprintln!("tls-load: {err:#}");
            return ExitCode::from(1);
        }
    };
    let mut out = io::stdout().lock();
    let printed = if flags.json {
        summary.write_json(&mut out)
    } else {
        writeln!(
            out,
            "target:     {} (server name {}), {} workers, resumption {}",
            flags.connect,
            flags.server_name,
            flags.concurrency,
            if flags.no_resume { "off" } else { "on" },
        )
        .and_then(|()| summary.write_text(&mut out))
    };
    // A closed pipe (`| head`) is the reader's choice, not an error.
    if let Err(err) = printed.and_then(|()| out.flush())
        && err.kind() != io::ErrorKind::BrokenPipe
    {
        eprintln!("tls-load: cannot write the report: {err}");
        return ExitCode::from(1);
    }
    if summary.failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        Flags::command().debug_assert();
    }

    #[test]
    fn duration_must_be_positive_and_finite() {
        assert_eq!(parse_secs("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["0", "-1", "nan", "inf", "1e30", "x"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
    }
}
