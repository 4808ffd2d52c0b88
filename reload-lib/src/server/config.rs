//! What the builder hands the reload engine: SNI entries, the client-CA settings and the
//! caller's `configure` hook. A leaf of `server`: the builder writes these, the engine reads them.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;

use super::auth::ClientAuth;
use crate::source::CertKeyPaths;

/// How a set of SNI names is chosen for a pair.
#[derive(Debug, Clone)]
pub(super) enum SniNames {
    /// Configured names; each must be covered by the certificate's SANs.
    Explicit(Vec<String>),
    /// The certificate's DNS SANs (or its CN when it has none), re-read on every reload.
    FromCertificate,
}

#[derive(Debug, Clone)]
pub(super) struct SniEntry {
    pub(super) names: SniNames,
    pub(super) paths: CertKeyPaths,
}

#[derive(Debug, Clone)]
pub(super) struct ClientCaConfig {
    pub(super) path: PathBuf,
    pub(super) crls: Vec<PathBuf>,
    pub(super) auth: ClientAuth,
}

pub(super) type Configure = Arc<dyn Fn(&mut ServerConfig) + Send + Sync>;
