//! Throwaway PKI: rcgen CAs issuing server and client certificates with chosen names, validity
//! and serials, written to files the binaries read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use time::{Duration, OffsetDateTime};

static NEXT_CA: AtomicU64 = AtomicU64::new(0);

/// What to put in a certificate. Start from [`CertSpec::server`] or [`CertSpec::client`].
#[derive(Debug, Clone)]
pub struct CertSpec {
    /// Subject CN.
    pub common_name: String,
    /// Subject O values (client certificates: the groups kube-apiserver derives).
    pub organizations: Vec<String>,
    /// Subject alternative names; IP literals become IP SANs.
    pub sans: Vec<String>,
    /// notBefore.
    pub not_before: OffsetDateTime,
    /// notAfter.
    pub not_after: OffsetDateTime,
    /// Serial number; `None` takes the CA's next one.
    pub serial: Option<u64>,
    /// Extended key usage: client auth (`true`) or server auth.
    pub client: bool,
}

impl CertSpec {
    /// A server certificate for `sans` (CN = the first), valid from an hour ago for a day.
    pub fn server(sans: &[&str]) -> CertSpec {
        CertSpec {
            common_name: sans.first().copied().unwrap_or("server").to_owned(),
            organizations: Vec::new(),
            sans: sans.iter().map(|s| (*s).to_owned()).collect(),
            not_before: OffsetDateTime::now_utc() - Duration::hours(1),
            not_after: OffsetDateTime::now_utc() + Duration::days(1),
            serial: None,
            client: false,
        }
    }

    /// A client certificate with subject CN `cn`, valid from an hour ago for a day.
    pub fn client(cn: &str) -> CertSpec {
        CertSpec {
            common_name: cn.to_owned(),
            sans: Vec::new(),
            client: true,
            ..CertSpec::server(&[])
        }
    }

    /// Sets the validity window.
    #[must_use]
    pub fn valid(mut self, not_before: OffsetDateTime, not_after: OffsetDateTime) -> CertSpec {
        self.not_before = not_before;
        self.not_after = not_after;
        self
    }

    /// Valid from `days_ago + 1` days ago until `days_ago` days ago: expired.
    #[must_use]
    pub fn expired(self, days_ago: i64) -> CertSpec {
        let now = OffsetDateTime::now_utc();
        self.valid(
            now - Duration::days(days_ago + 1),
            now - Duration::days(days_ago),
        )
    }

    /// Sets the serial number.
    #[must_use]
    pub fn serial(mut self, serial: u64) -> CertSpec {
        self.serial = Some(serial);
        self
    }

    /// Adds an O value to the subject.
    #[must_use]
    pub fn organization(mut self, organization: &str) -> CertSpec {
        self.organizations.push(organization.to_owned());
        self
    }
}

/// An issued certificate, in memory.
#[derive(Clone)]
pub struct Issued {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM (PKCS#8).
    pub key_pem: String,
    /// Certificate, DER.
    pub der: Vec<u8>,
    /// Serial number, lowercase hex without leading zeros (as [`crate::tls::serial_of`]).
    pub serial: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

/// A throwaway CA. Each CA has its own serial range, so serials identify certificates across
/// CAs within a test process.
pub struct Ca {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
    serial: u64,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("next_serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl Default for Ca {
    fn default() -> Self {
        Self::new()
    }
}

impl Ca {
    /// A fresh CA valid from an hour ago for 30 days.
    pub fn new() -> Ca {
        let now = OffsetDateTime::now_utc();
        Ca::with_validity(now - Duration::hours(1), now + Duration::days(30))
    }

    /// A fresh CA with the given validity window.
    pub fn with_validity(not_before: OffsetDateTime, not_after: OffsetDateTime) -> Ca {
        let key = KeyPair::generate().expect("key generation");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no SANs is valid");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let number = NEXT_CA.fetch_add(1, Ordering::Relaxed);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("e2e ca {number}"));
        params.not_before = not_before;
        params.not_after = not_after;
        let pem = params.self_signed(&key).expect("self-signing").pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
            serial: 0x7000_0000 + (number + 1) * 0x1000,
        }
    }

    /// The CA's private key, PEM (for tests that store the CA in a Secret as a signer).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a certificate as `spec` says.
    ///
    /// # Panics
    /// If rcgen rejects the spec (a test bug).
    pub fn issue(&mut self, spec: &CertSpec) -> Issued {
        let serial = spec.serial.unwrap_or_else(|| {
            self.serial += 1;
            self.serial
        });
        let key = KeyPair::generate().expect("key generation");
        let mut params = CertificateParams::new(spec.sans.clone()).expect("valid SANs");
        params
            .distinguished_name
            .push(DnType::CommonName, spec.common_name.as_str());
        for organization in &spec.organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization.as_str());
        }
        params.serial_number = Some(serial.into());
        params.not_before = spec.not_before;
        params.not_after = spec.not_after;
        params.extended_key_usages = vec![if spec.client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            serial: format!("{serial:x}"),
        }
    }

    /// (cert PEM, key PEM, serial hex) for `localhost` and `127.0.0.1`.
    pub fn leaf(&mut self) -> (String, String, String) {
        self.leaf_for(&["localhost", "127.0.0.1"])
    }

    /// (cert PEM, key PEM, serial hex) for the given names.
    pub fn leaf_for(&mut self, names: &[&str]) -> (String, String, String) {
        let issued = self.issue(&CertSpec::server(names));
        (issued.cert_pem, issued.key_pem, issued.serial)
    }

    /// (cert PEM, key PEM) of a client certificate with subject CN `cn`.
    pub fn client_leaf(&mut self, cn: &str) -> (String, String) {
        let issued = self.issue(&CertSpec::client(cn));
        (issued.cert_pem, issued.key_pem)
    }

    /// A client config trusting this CA, resumption off.
    pub fn client(&self) -> std::sync::Arc<rustls::ClientConfig> {
        crate::tls::client_config(&self.pem)
    }
}

/// Files of one issued certificate.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// Certificate chain file.
    pub cert: PathBuf,
    /// Key file.
    pub key: PathBuf,
    /// What was written.
    pub issued: Issued,
}

/// A temporary directory of CAs and certificates, removed on drop.
#[derive(Debug)]
pub struct TempPki {
    dir: tempfile::TempDir,
}

impl Default for TempPki {
    fn default() -> Self {
        Self::new()
    }
}

impl TempPki {
    /// A new, empty directory.
    pub fn new() -> TempPki {
        TempPki {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A new CA whose certificate is written to `<name>.crt`; returns it and the path.
    pub fn ca(&self, name: &str) -> (Ca, PathBuf) {
        let ca = Ca::new();
        let path = self.path().join(format!("{name}.crt"));
        write_atomic(&path, ca.pem.as_bytes());
        (ca, path)
    }

    /// Issues `spec` from `ca` and writes `<name>.crt` and `<name>.key` (each renamed into
    /// place, key first, so a watcher never reads a torn file; a reader may still see the new
    /// key with the old certificate for a moment, which reload-lib rejects and retries).
    pub fn issue(&self, ca: &mut Ca, name: &str, spec: &CertSpec) -> CertFiles {
        let issued = ca.issue(spec);
        let cert = self.path().join(format!("{name}.crt"));
        let key = self.path().join(format!("{name}.key"));
        write_files(&cert, &key, &issued);
        CertFiles { cert, key, issued }
    }
}

/// Writes a certificate and key over existing files, key first, each renamed into place.
pub fn write_files(cert: &Path, key: &Path, issued: &Issued) {
    write_atomic(key, issued.key_pem.as_bytes());
    write_atomic(cert, issued.cert_pem.as_bytes());
}

/// Writes `bytes` to `path` through a temporary file renamed into place.
///
/// # Panics
/// On I/O errors, naming the path.
pub fn write_atomic(path: &Path, bytes: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .unwrap_or_else(|err| panic!("cannot create {}: {err}", parent.display()));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes).unwrap_or_else(|err| panic!("cannot write {tmp:?}: {err}"));
    std::fs::rename(&tmp, path)
        .unwrap_or_else(|err| panic!("cannot rename {tmp:?} to {}: {err}", path.display()));
}
