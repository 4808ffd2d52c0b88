//! The crate's error type.

use std::path::PathBuf;
use std::sync::Arc;

/// Errors from loading, validating and serving reloadable TLS material.
///
/// Every variant that comes from a file names the file. Messages are lowercase and do not repeat
/// their cause: walk [`std::error::Error::source`] (or print with `{:#}` through `anyhow`) to see it.
///
/// Callers are only expected to branch on [`Error::InvalidMaterial`] (the files exist but what they
/// hold cannot be served); every other variant is an I/O or set-up failure and should be reported
/// as is. New variants may be added.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// # let other = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&key, other.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, Error, InvalidMaterial, ServingSet};
///
/// // tls.key belongs to another certificate.
/// let err = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await.unwrap_err();
/// assert_eq!(err.invalid_material(), Some(&InvalidMaterial::KeyMismatch));
/// assert!(matches!(&err, Error::InvalidMaterial { path, .. } if *path == crt));
/// assert_eq!(
///     err.to_string(),
///     format!("invalid material in {}: the private key does not match the certificate's public key", crt.display()),
/// );
///
/// let missing = ServingSet::builder(CertKeyPaths::new("/nonexistent/tls.crt", &key)).start().await;
/// assert_eq!(missing.unwrap_err().to_string(), "failed to read /nonexistent/tls.crt");
/// # Ok(()) }
/// ```
///
/// # Security
/// Messages name files and describe the problem; they never contain key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read.
    #[error("failed to read {path}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its content cannot be served; the last good material keeps serving.
    #[error("invalid material in {path}: {reason}")]
    InvalidMaterial {
        /// The file whose content was rejected (for a pair, the certificate file unless the key
        /// itself is at fault).
        path: PathBuf,
        /// What is wrong with it.
        reason: InvalidMaterial,
    },
    /// The TLS configuration could not be built from otherwise valid material.
    #[error("failed to build the TLS configuration for {what}")]
    BuildConfig {
        /// Which part (e.g. `client CA bundle /etc/ca.crt`).
        what: String,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
    /// The client-certificate verifier could not be built from the CA bundle.
    #[error("failed to build the client certificate verifier from {path}")]
    BuildVerifier {
        /// The CA bundle.
        path: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// The server certificate verifier could not be built from the root bundle.
    #[error("failed to build the server certificate verifier from {path}")]
    BuildServerVerifier {
        /// The root bundle.
        path: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::client::VerifierBuilderError,
    },
    /// The background reload task is gone.
    #[error("the reload task is not running")]
    ReloaderGone,
    /// A pass of reading and checking the files took longer than the read timeout (a hung
    /// filesystem?). The last good material keeps serving; the pass is collected when it
    /// finishes, and no other pass of the set starts meanwhile.
    #[error("reading the files of set {set} did not finish within {timeout:?}")]
    ReadTimeout {
        /// The set's name.
        set: String,
        /// The configured read timeout.
        timeout: std::time::Duration,
    },
    /// A failure that was also published to subscribers (see [`Status::last_error`](crate::Status)).
    #[error(transparent)]
    Retained(Arc<Error>),
}

/// Why material was rejected. Part of [`Error::InvalidMaterial`].
///
/// Most rejections after start-up are transient (a writer caught mid-way: [`Empty`](Self::Empty),
/// [`KeyMismatch`](Self::KeyMismatch)) and are retried by the set; a rejection that persists
/// means the files are wrong and someone should look.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, InvalidMaterial, ServingSet};
///
/// std::fs::write(&crt, "")?;
/// let err = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await.unwrap_err();
/// match err.invalid_material() {
///     Some(InvalidMaterial::Empty) => eprintln!("{} is empty: {err}", crt.display()),
///     Some(other) => panic!("unexpected rejection: {other}"),
///     None => panic!("not a material problem: {err}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMaterial {
    /// The file is empty (often a writer caught mid-write).
    #[error("the file is empty")]
    Empty,
    /// The PEM could not be decoded.
    #[error("malformed PEM: {0}")]
    Pem(String),
    /// No `CERTIFICATE` block was found.
    #[error("no certificate found")]
    NoCertificate,
    /// No private key block was found.
    #[error("no private key found")]
    NoPrivateKey,
    /// A certificate could not be parsed as X.509.
    #[error("certificate {index} cannot be parsed: {detail}")]
    BadCertificate {
        /// Position in the file, 0 for the first.
        index: usize,
        /// Parser message.
        detail: String,
    },
    /// The private key is not usable (unsupported algorithm or corrupt).
    #[error("the private key is not usable: {0}")]
    BadKey(String),
    /// The private key does not belong to the leaf certificate (often a torn write: the
    /// certificate was replaced and the key not yet, or the other way round).
    #[error("the private key does not match the certificate's public key")]
    KeyMismatch,
    /// A configured SNI name is not covered by the certificate's subject alternative names.
    #[error("the certificate does not cover the configured name {0}")]
    NameNotCovered(String),
    /// The chain has expired (the earliest notAfter of the leaf and its intermediates) and the
    /// material it would replace has not.
    #[error("the certificate chain expired at {not_after} and the served one is still valid")]
    Expired {
        /// The earliest notAfter in the rejected chain, RFC 3339.
        not_after: String,
    },
    /// The chain is not valid yet (the latest notBefore of the leaf and its intermediates) and
    /// the material it would replace is valid now.
    #[error(
        "the certificate chain is not valid before {not_before} and the served one is valid now"
    )]
    NotYetValid {
        /// The latest notBefore in the rejected chain, RFC 3339.
        not_before: String,
    },
    /// The chain is shorter than the served one, which still holds the missing issuer: a writer
    /// caught mid-write. Accepted once the same bytes are read again on a later pass.
    #[error("the chain lost its issuer certificate {missing_issuer} (a write in progress?)")]
    ChainShortened {
        /// Subject of the issuer certificate the served chain holds and the new one lacks.
        missing_issuer: String,
    },
    /// A CRL could not be parsed.
    #[error("CRL {index} cannot be parsed")]
    BadCrl {
        /// Position in the file, 0 for the first.
        index: usize,
    },
    /// A configured CRL file holds no CRL (neither PEM `X509 CRL` blocks nor one DER CRL).
    #[error("no CRL found (neither a PEM X509 CRL block nor a DER CRL)")]
    NoCrl,
    /// A CRL was not issued (name and signature) by any CA of the bundle it is checked with.
    #[error("CRL {index} is not issued by a CA of the bundle (issuer {issuer})")]
    CrlIssuerUnknown {
        /// Position in the file, 0 for the first.
        index: usize,
        /// The CRL's issuer name.
        issuer: String,
    },
    /// A CRL is past its nextUpdate while the CRLs in force are not (an old CRL replayed?).
    #[error("CRL {index} is stale (nextUpdate {next_update}) and the CRLs in force are not")]
    CrlStale {
        /// Position in the file, 0 for the first.
        index: usize,
        /// The CRL's nextUpdate, RFC 3339.
        next_update: String,
    },
    /// A CRL is older than one of its series this process already accepted (same issuer, key
    /// and scope; a lower cRLNumber, or without numbers an earlier thisUpdate): an old CRL
    /// replayed would un-revoke certificates. Checked for every CRL series, also after its CA
    /// left the bundle and came back (see the crate's security notes for the bound).
    #[error(
        "CRL {index} of {issuer} ({position}) is older than one already accepted for the same issuer and scope ({served}); it would un-revoke certificates"
    )]
    CrlOlder {
        /// Position in the file, 0 for the first.
        index: usize,
        /// The CRL's issuer name.
        issuer: String,
        /// Its place in the issuer's series: `cRLNumber N`, or `thisUpdate <RFC 3339>`.
        position: String,
        /// The same for the newest CRL of that series accepted so far.
        served: String,
    },
    /// A CRL of another series would come first among its issuer's CRLs, before the one that
    /// came first so far: rustls checks a certificate without a CRL distribution point against
    /// the first CRL of its issuer, so the new one could hide the old one's revocations.
    #[error(
        "CRL {index} of {issuer} ({position}) comes before the CRL that came first for that issuer so far ({served}); certificates checked against that one would lose its revocations (list the new CRL after it, or restart to reorder)"
    )]
    CrlReordered {
        /// Position in the file, 0 for the first.
        index: usize,
        /// The CRL's issuer name.
        issuer: String,
        /// Its place in its series: `cRLNumber N`, or `thisUpdate <RFC 3339>`.
        position: String,
        /// The same for the CRL that came first so far.
        served: String,
    },
    /// A CRL series of a CA that is in the bundle is gone (the path is the file it was in): the
    /// CA's CRL, or one of its partitioned CRLs (issuing distribution points), dropped while the
    /// CA stays, or a CA that had CRLs back without them.
    #[error(
        "a CRL of {issuer} ({served}) is gone while that CA is trusted; once checked, a CA's revocations stay checked until the process restarts"
    )]
    CrlDropped {
        /// The CA's name (the CRL's issuer).
        issuer: String,
        /// The newest CRL of that series accepted so far: `cRLNumber N`, or `thisUpdate <RFC
        /// 3339>`.
        served: String,
    },
}

/// `Result` with [`Error`] as the default error.
///
/// ```
/// use reload_lib::{CertKeyPaths, Result, ServingSet};
///
/// async fn serve(paths: CertKeyPaths) -> Result<ServingSet> {
///     let set = ServingSet::builder(paths).start().await?;
///     set.reload_on_sighup().ok();
///     Ok(set)
/// }
/// # drop(serve(CertKeyPaths::new("tls.crt", "tls.key")));
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The rejection reason when this is [`Error::InvalidMaterial`] (also through
    /// [`Error::Retained`]). See the [`Error`] example.
    pub fn invalid_material(&self) -> Option<&InvalidMaterial> {
        match self {
            Error::InvalidMaterial { reason, .. } => Some(reason),
            Error::Retained(inner) => inner.invalid_material(),
            _ => None,
        }
    }

    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: InvalidMaterial) -> Self {
        Error::InvalidMaterial {
            path: path.into(),
            reason,
        }
    }
}
