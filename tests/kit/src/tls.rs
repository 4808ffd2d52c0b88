//! rustls client configs for tests: trusting test CAs, with or without a client certificate,
//! with or without session resumption.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::pki::Issued;

/// A client trusting every certificate in `ca_pems` (each may be a bundle), presenting
/// `identity` when given; TLS 1.2 and 1.3, resumption on (rustls' default).
///
/// # Panics
/// When a PEM does not parse, the bundle holds no certificate, or the identity's key does not
/// match its certificate.
pub fn client_config(ca_pems: &[&str], identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    build(
        ca_pems,
        identity.map(|i| (i.cert_pem.as_str(), i.key_pem.as_str())),
        rustls::DEFAULT_VERSIONS,
    )
}

/// [`client_config`], TLS 1.2 only.
pub fn client_config_tls12(
    ca_pems: &[&str],
    identity: Option<&Issued>,
) -> Arc<rustls::ClientConfig> {
    build(
        ca_pems,
        identity.map(|i| (i.cert_pem.as_str(), i.key_pem.as_str())),
        &[&rustls::version::TLS12],
    )
}

/// [`client_config`] with the identity given as PEM text: `cert_pem` (a chain) and `key_pem`.
pub fn client_config_with_pems(
    ca_pems: &[&str],
    cert_pem: &str,
    key_pem: &str,
) -> Arc<rustls::ClientConfig> {
    build(ca_pems, Some((cert_pem, key_pem)), rustls::DEFAULT_VERSIONS)
}

/// The same config with resumption off, so every handshake is a full one and shows the served
/// certificate.
pub fn no_resumption(config: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (**config).clone();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

fn build(
    ca_pems: &[&str],
    identity: Option<(&str, &str)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots
                .add(cert.expect("a PEM certificate"))
                .expect("a valid CA certificate");
        }
    }
    assert!(!roots.is_empty(), "no CA certificate to trust");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("the provider supports these versions")
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert_pem, key_pem)) => {
            let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("a PEM certificate chain");
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("a PEM key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("the client certificate matches its key")
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

impl crate::pki::Ca {
    /// A client config trusting this CA, resumption off.
    pub fn client_config(&self) -> std::sync::Arc<rustls::ClientConfig> {
        no_resumption(&client_config(&[&self.cert_pem], None))
    }
}
