//! What the client can learn about the server's handshake beyond `ClientConnection`'s getters:
//! the signature scheme of its CertificateVerify and the session tickets it sends. Both pass
//! through client-side hooks rustls calls once per event (the certificate verifier and the
//! session store), so they are counted there, for the whole run: a peer comparison needs to know
//! that every handshake was alike, not which connection saw what.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::{DigitallySignedStruct, NamedGroup, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// Counts shared by the verifier and the session store of one `ClientConfig`.
#[derive(Debug, Default)]
pub struct Observer {
    signature_schemes: Mutex<BTreeMap<String, u64>>,
    tickets: AtomicU64,
}

impl Observer {
    /// A verifier that delegates every decision to `inner` and counts the signature scheme of
    /// each handshake signature it checked successfully.
    pub fn verifier(self: &Arc<Self>, inner: Arc<dyn ServerCertVerifier>) -> Arc<CountingVerifier> {
        Arc::new(CountingVerifier {
            inner,
            observer: Arc::clone(self),
        })
    }

    /// A session store that counts the TLS 1.3 tickets received, then passes them to `inner`
    /// (`None`: forgets them, so nothing ever resumes).
    pub fn store(
        self: &Arc<Self>,
        inner: Option<Arc<dyn ClientSessionStore>>,
    ) -> Arc<CountingStore> {
        Arc::new(CountingStore {
            inner,
            observer: Arc::clone(self),
        })
    }

    /// Handshake signatures verified, by scheme (`ECDSA_NISTP256_SHA256`, ...). Resumed
    /// handshakes have none.
    pub fn signature_schemes(&self) -> BTreeMap<String, u64> {
        self.signature_schemes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// TLS 1.3 session tickets received (NewSessionTicket messages) in the run.
    pub fn tickets(&self) -> u64 {
        self.tickets.load(Ordering::Relaxed)
    }

    fn signed(&self, scheme: SignatureScheme) {
        *self
            .signature_schemes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(format!("{scheme:?}"))
            .or_default() += 1;
    }
}

/// See [`Observer::verifier`].
#[derive(Debug)]
pub struct CountingVerifier {
    inner: Arc<dyn ServerCertVerifier>,
    observer: Arc<Observer>,
}

impl ServerCertVerifier for CountingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let valid = self.inner.verify_tls12_signature(message, cert, dss)?;
        self.observer.signed(dss.scheme);
        Ok(valid)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let valid = self.inner.verify_tls13_signature(message, cert, dss)?;
        self.observer.signed(dss.scheme);
        Ok(valid)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

/// See [`Observer::store`].
#[derive(Debug)]
pub struct CountingStore {
    inner: Option<Arc<dyn ClientSessionStore>>,
    observer: Arc<Observer>,
}

impl ClientSessionStore for CountingStore {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        if let Some(inner) = &self.inner {
            inner.set_kx_hint(server_name, group);
        }
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.inner.as_ref()?.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        if let Some(inner) = &self.inner {
            inner.set_tls12_session(server_name, value);
        }
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.inner.as_ref()?.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        if let Some(inner) = &self.inner {
            inner.remove_tls12_session(server_name);
        }
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.observer.tickets.fetch_add(1, Ordering::Relaxed);
        if let Some(inner) = &self.inner {
            inner.insert_tls13_ticket(server_name, value);
        }
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.inner.as_ref()?.take_tls13_ticket(server_name)
    }
}
