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
//!
//! For peer comparisons it also reports what every handshake negotiated (protocol version,
//! cipher suite, key exchange group, ALPN, the signature scheme of the server's
//! CertificateVerify) and how many TLS 1.3 session tickets the server sent; `--groups` and
//! `--cipher-suites` restrict what is offered, so servers with different defaults can be made to
//! negotiate the same handshake.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use examples::load::{self, Observer, Settings};
use rustls::SupportedCipherSuite;
use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, Resumption, WebPkiServerVerifier,
};
use rustls::crypto::SupportedKxGroup;
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
    /// Start this many attempts per second in total, evenly spaced (fractions allowed), instead
    /// of each worker starting its next one as soon as the last ends. --concurrency still caps the
    /// attempts in flight; if the server cannot keep up, the reported rate falls short of this.
    #[arg(long, value_name = "PER_SEC", value_parser = parse_rate)]
    rate: Option<f64>,
    /// Disable session resumption: every handshake is a full one.
    #[arg(long)]
    no_resume: bool,
    /// Key exchange groups to offer, most preferred first, comma-separated (rustls names,
    /// case-insensitive: x25519, secp256r1, secp384r1, x25519mlkem768, secp256r1mlkem768,
    /// mlkem768, mlkem1024). Default: the provider's defaults as built here (X25519, secp256r1,
    /// secp384r1, X25519MLKEM768: rustls without `prefer-post-quantum`). A peer comparison
    /// offers only groups every server supports.
    #[arg(long, value_name = "GROUP,...", value_delimiter = ',', value_parser = parse_group)]
    groups: Vec<&'static dyn SupportedKxGroup>,
    /// TLS 1.3 cipher suites to offer, most preferred first, comma-separated (rustls names,
    /// case-insensitive, e.g. tls13_aes_128_gcm_sha256). Default: rustls' defaults; TLS 1.2
    /// suites stay offered either way.
    #[arg(long, value_name = "SUITE,...", value_delimiter = ',', value_parser = parse_suite)]
    cipher_suites: Vec<SupportedCipherSuite>,
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

/// Parses `--rate`: a positive, finite number of attempts per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 && rate <= 10_000_000.0 => Ok(rate),
        _ => Err(format!(
            "must be a number above 0 and at most 10000000, got {text}"
        )),
    }
}

/// One of the aws-lc-rs provider's key exchange groups, by its rustls name.
fn parse_group(text: &str) -> Result<&'static dyn SupportedKxGroup, String> {
    let all = rustls::crypto::aws_lc_rs::ALL_KX_GROUPS;
    all.iter()
        .copied()
        .find(|g| format!("{:?}", g.name()).eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|g| format!("{:?}", g.name())).collect();
            format!("unknown group {text} (known: {})", names.join(", "))
        })
}

/// One of the aws-lc-rs provider's TLS 1.3 cipher suites, by its rustls name.
fn parse_suite(text: &str) -> Result<SupportedCipherSuite, String> {
    let all = rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES;
    let tls13 = || all.iter().filter(|s| s.tls13().is_some());
    tls13()
        .copied()
        .find(|s| format!("{:?}", s.suite()).eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            let names: Vec<String> = tls13().map(|s| format!("{:?}", s.suite())).collect();
            format!(
                "unknown TLS 1.3 cipher suite {text} (known: {})",
                names.join(", ")
            )
        })
}

/// Reads the files and builds the settings before the first connection, so a bad file is one
/// configuration error (exit 2) rather than one failure per attempt.
fn settings(flags: &Flags) -> anyhow::Result<Settings> {
    let observer = Arc::new(Observer::default());
    let settings = Settings::new(
        flags.connect,
        &flags.server_name,
        client_config(flags, &observer)?,
        flags.concurrency,
        flags.duration,
    )?;
    Ok(settings
        .requests(flags.requests)
        .timeout(Duration::from_millis(flags.timeout_ms))
        .rate(flags.rate)
        .observer(observer))
}

/// The client config: the CA bundle as the only roots (checked by rustls' WebPKI verifier, which
/// `observer` wraps to count signature schemes), an optional client identity, the offered groups
/// and suites, and rustls' default in-memory session store unless `--no-resume` (wrapped to count
/// the tickets received either way).
fn client_config(
    flags: &Flags,
    observer: &Arc<Observer>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let what = "CA bundle";
    for cert in read_certs(&flags.ca, what)? {
        roots
            .add(cert)
            .with_context(|| format!("bad certificate in {what} {}", flags.ca.display()))?;
    }
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if !flags.groups.is_empty() {
        provider.kx_groups.clone_from(&flags.groups);
    }
    if !flags.cipher_suites.is_empty() {
        provider.cipher_suites.retain(|s| s.tls13().is_none());
        provider
            .cipher_suites
            .splice(0..0, flags.cipher_suites.iter().copied());
    }
    let provider = Arc::new(provider);
    let webpki =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()
            .context("cannot build the certificate verifier")?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(observer.verifier(webpki));
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
    let inner = (!flags.no_resume)
        .then(|| Arc::new(ClientSessionMemoryCache::new(256)) as Arc<dyn ClientSessionStore>);
    // `Resumption::store` keeps TLS 1.2 resumption on, like the default; with `--no-resume` the
    // store forgets everything, so there is nothing to resume either way.
    config.resumption = Resumption::store(observer.store(inner));
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
            "target:     {} (server name {}), {} workers, resumption {}, groups offered {}",
            flags.connect,
            flags.server_name,
            flags.concurrency,
            if flags.no_resume { "off" } else { "on" },
            if flags.groups.is_empty() {
                "rustls defaults".to_owned()
            } else {
                let names: Vec<String> = flags
                    .groups
                    .iter()
                    .map(|g| format!("{:?}", g.name()))
                    .collect();
                names.join(",")
            },
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

    #[test]
    fn groups_and_suites_are_found_by_rustls_name() {
        assert_eq!(
            format!("{:?}", parse_group("x25519").unwrap().name()),
            "X25519"
        );
        let hybrid = parse_group("X25519MLKEM768").unwrap().name();
        assert_eq!(format!("{hybrid:?}"), "X25519MLKEM768");
        assert!(parse_group("x448").unwrap_err().contains("secp256r1"));
        let suite = parse_suite("tls13_aes_128_gcm_sha256").unwrap().suite();
        assert_eq!(format!("{suite:?}"), "TLS13_AES_128_GCM_SHA256");
        assert!(parse_suite("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256").is_err());
    }
}
