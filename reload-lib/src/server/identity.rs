//! `ClientAuth::Request`: ask for a client certificate, complete the handshake whatever it is,
//! and tell the application what the certificate proved, as kube-apiserver does (an expired or
//! unknown client certificate plus a valid bearer token is a request authenticated by the token,
//! not a dead TLS connection).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::material::CertInfo;

/// What a client's certificate proved in one handshake. Returned by
/// [`Acceptor::accept_with_identity`](crate::Acceptor::accept_with_identity).
///
/// # Security
/// Only [`Verified`](Self::Verified) authenticates anyone: the chain was verified against the
/// client-CA bundle (and CRLs) of the snapshot that served the handshake, at the end of the
/// handshake (so a resumed session is checked against the trust in force now, not the trust it
/// was made under). The facts in [`Rejected`](Self::Rejected) come from an unverified
/// certificate: log them, never authorize with them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientIdentity {
    /// No certificate was presented (or the set has no client-CA bundle).
    Anonymous,
    /// The certificate chains to the client-CA bundle, is valid now, is for client
    /// authentication and is not revoked. Its leaf's facts.
    Verified(CertInfo),
    /// A certificate was presented and the client proved it holds its key, but it does not
    /// verify: expired, unknown issuer, revoked, wrong usage.
    Rejected {
        /// The leaf's facts, when it parses (unverified).
        leaf: Option<CertInfo>,
        /// Why verification failed (rustls' error, e.g. `invalid peer certificate: Expired`).
        reason: String,
    },
}

impl ClientIdentity {
    /// Checks `chain` (leaf first) with `verifier`.
    pub(crate) fn check(
        verifier: &dyn ClientCertVerifier,
        chain: Option<&[CertificateDer<'_>]>,
    ) -> Self {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return ClientIdentity::Anonymous;
        };
        let info = CertInfo::from_der(leaf).ok();
        match (
            verifier.verify_client_cert(leaf, intermediates, UnixTime::now()),
            info,
        ) {
            (Ok(_), Some(info)) => ClientIdentity::Verified(info),
            (Ok(_), None) => ClientIdentity::Rejected {
                leaf: None,
                reason: "the certificate verifies but its facts cannot be parsed".to_owned(),
            },
            (Err(err), leaf) => ClientIdentity::Rejected {
                leaf,
                reason: err.to_string(),
            },
        }
    }
}

/// The handshake side of `Request`: asks for a certificate, accepts any chain (the application
/// gets the verdict through [`ClientIdentity`]), but still checks that the client signed the
/// handshake with the certificate's key, so a presented certificate is at least the client's.
#[derive(Debug)]
pub(crate) struct RequestVerifier {
    pub(crate) strict: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.strict.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Deferred: `ClientIdentity::check` after the handshake.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.strict.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.strict.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.strict.supported_verify_schemes()
    }
}
