//! Where and how we connect ([`Target`]), and what a failed request says about it: the one
//! classification of "no answer" every subcommand uses ([`Target::classify`], and
//! [`Target::explain`] for a refused certificate, in the words `sync`, `inspect` and
//! `regenerate` print: "… is not trusted by CA_FILE …").

use std::path::PathBuf;

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

/// Why a request got no answer from the apiserver: the one classification every subcommand
/// uses (`sync`'s watch errors and `inspect` through [`Target::explain`], `regenerate`'s wait
/// at start-up through [`Target::classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAnswer {
    /// Nothing answered at the address (refused, reset, timed out, closed before a response):
    /// a server that is not up yet, or restarting. Heals by itself.
    NotUp(String),
    /// The server's certificate is not trusted by our CA bundle, or the handshake failed: a
    /// wrong CA file, server name or certificate. Heals only when the CA file (re-read when it
    /// changes) or the server's certificate is fixed.
    Tls(String),
    /// The server's host name does not resolve. Heals only when the name or the resolver is
    /// fixed.
    Unresolved(String),
}

impl NoAnswer {
    /// Whether waiting is all it takes.
    pub fn heals_by_itself(&self) -> bool {
        matches!(self, NoAnswer::NotUp(_))
    }
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoAnswer::NotUp(why) | NoAnswer::Tls(why) | NoAnswer::Unresolved(why) => {
                f.write_str(why)
            }
        }
    }
}

impl Target {
    /// What a failed request says about the connection; `None` when the server answered (an
    /// HTTP status: the caller's to judge).
    pub fn classify(&self, err: &kube::Error) -> Option<NoAnswer> {
        if matches!(err, kube::Error::Api(_)) {
            return None;
        }
        if let Some(tls) = find_rustls_error(err) {
            return Some(NoAnswer::Tls(self.tls_failure(tls)));
        }
        if let Some(dns) = find_dns_error(err) {
            return Some(NoAnswer::Unresolved(format!(
                "cannot resolve the host of {}: {dns}; check the server URL and the node's resolver",
                self.server
            )));
        }
        Some(NoAnswer::NotUp(format!(
            "{} does not answer: {}",
            self.server,
            crate::base::error::chain(err)
        )))
    }

    /// One sentence for a failed TLS handshake: what was tried, with which files, and what to
    /// check (`sync` and `inspect` print it; `regenerate` through [`Target::classify`]).
    pub fn explain(&self, err: &(dyn std::error::Error + 'static)) -> Option<String> {
        find_rustls_error(err).map(|tls| self.tls_failure(tls))
    }

    fn tls_failure(&self, tls: &rustls::Error) -> String {
        let name = self.tls_server_name.as_deref().unwrap_or("the URL's host");
        let ca = self
            .ca_file
            .as_ref()
            .map_or("the configured CA data".to_owned(), |p| {
                p.display().to_string()
            });
        match tls {
            rustls::Error::InvalidCertificate(reason) => format!(
                "TLS to {} refused: the certificate served for server name {name} is not \
                 trusted by {ca} ({reason:?}); check that the CA file matches the server \
                 name's certificate",
                self.server
            ),
            other => format!("TLS to {} failed: {other}", self.server),
        }
    }
}

/// hyper-util's connector reports a failed name lookup as an error whose message is exactly
/// `dns error` (its type is not public), with the resolver's error as its source.
fn find_dns_error(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    causes(err)
        .into_iter()
        .find(|e| e.to_string() == "dns error")
        .map(|e| {
            e.source()
                .map_or_else(|| "dns error".to_owned(), |cause| cause.to_string())
        })
}

fn find_rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    causes(err)
        .into_iter()
        .find_map(|e| e.downcast_ref::<rustls::Error>())
}

/// Every error in `err`'s chain, including those an `io::Error` wraps: its `source` skips the
/// wrapped error itself, and hyper-rustls reports a failed handshake as an `io::Error` wrapping
/// tokio-rustls' `io::Error` wrapping the rustls error.
fn causes<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut found = Vec::new();
    let mut next = vec![err];
    // Bounded: a chain that loops back on itself is not followed for ever.
    while let Some(err) = next.pop() {
        if found.len() >= 64 {
            break;
        }
        found.push(err);
        if let Some(source) = err.source() {
            next.push(source);
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            next.push(inner);
        }
    }
    found
}
