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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::Arc;

    use super::*;
    use crate::kube::connection::{Settings, connect};

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

    fn settings(server: String, ca_file: PathBuf) -> Settings {
        Settings {
            kubeconfig: None,
            context: None,
            server: Some(server),
            ca_file: Some(ca_file),
            token_file: None,
            tls_server_name_override: None,
            insecure_plain_http: false,
            connect_timeout: std::time::Duration::from_secs(5),
            read_idle_timeout: std::time::Duration::from_secs(5),
        }
    }

    /// A CA file holding a CA of its own (trusting nothing the tests serve).
    fn unrelated_ca(dir: &std::path::Path) -> PathBuf {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let path = dir.join("ca.crt");
        std::fs::write(&path, ca.pem()).unwrap();
        path
    }

    async fn classified(server: String, ca_file: PathBuf) -> Option<NoAnswer> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let connection = connect(&settings(server, ca_file)).await.unwrap();
        let err = connection
            .client
            .apiserver_version()
            .await
            .expect_err("no apiserver there");
        connection.target.classify(&err)
    }

    /// Real sockets: a port nobody listens on is "not up" (heals by itself); a host that does
    /// not resolve, and a TLS server whose certificate the CA file does not trust, are not,
    /// and say so in the words `sync` and `inspect` use.
    #[tokio::test]
    async fn no_answer_is_classified_as_not_up_unresolved_or_untrusted() {
        let dir = tempfile::tempdir().unwrap();
        let ca = unrelated_ca(dir.path());

        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let refused = classified(format!("https://127.0.0.1:{port}"), ca.clone()).await;
        assert!(
            matches!(&refused, Some(NoAnswer::NotUp(_)))
                && refused.as_ref().unwrap().heals_by_itself(),
            "{refused:?}"
        );

        let unresolved =
            classified("https://cert-reload-test.invalid:6443".into(), ca.clone()).await;
        assert!(
            matches!(&unresolved, Some(NoAnswer::Unresolved(_))),
            "{unresolved:?}"
        );
        assert!(!unresolved.unwrap().heals_by_itself());

        // A TLS server for `localhost` with a self-signed certificate.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
                )
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut buf = [0u8; 1024];
                // The client refuses the handshake; whatever happens here ends the connection.
                let _ = tls.read(&mut buf);
                let _ = tls.flush();
            }
        });
        let untrusted = classified(format!("https://127.0.0.1:{port}"), ca.clone()).await;
        let Some(NoAnswer::Tls(text)) = &untrusted else {
            panic!("{untrusted:?}");
        };
        assert!(
            text.contains(&format!("is not trusted by {}", ca.display())),
            "{text}"
        );
    }
}
