//! Throwaway PKI (rcgen): CAs and intermediates issuing server and client certificates with
//! chosen names, validity, serials and key types, CRLs, and a temporary directory to write them
//! to.
//!
//! Serials come from one counter per process, so a serial names one certificate across every
//! CA of a test. They print as lowercase hex without leading zeros; the counter starts at
//! `0x1000_0000`, so they have 8 digits, the form reload-lib's `CertInfo::serial` (whole bytes)
//! gives them too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use time::{Duration, OffsetDateTime};

use crate::rename;

mod crl;

/// The next serial number (and CRL number) of this process.
static SERIAL: AtomicU64 = AtomicU64::new(0x1000_0000);
/// Numbers the CAs made without a name.
static NEXT_CA: AtomicU64 = AtomicU64::new(0);

fn next_serial() -> u64 {
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// The key algorithm of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyKind {
    /// ECDSA P-256 with SHA-256 (rcgen's default; fast to generate).
    #[default]
    EcdsaP256,
    /// RSA 2048 with PKCS#1 v1.5 SHA-256 (slow to generate: about 0.1-1 s).
    Rsa2048,
}

impl KeyKind {
    /// A fresh key pair of this kind.
    ///
    /// # Panics
    /// When the system cannot generate a key (no randomness).
    pub fn generate(self) -> KeyPair {
        match self {
            KeyKind::EcdsaP256 => KeyPair::generate(),
            KeyKind::Rsa2048 => {
                KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            }
        }
        .expect("key generation")
    }
}

/// A fresh key pair as PEM: (private key, PKCS#8; public key, SPKI), for tests that need a
/// key and no certificate (a service-account signing key, a key that matches nothing).
pub fn key_pair_pem(kind: KeyKind) -> (String, String) {
    let key = kind.generate();
    (key.serialize_pem(), key.public_key_pem())
}

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
    /// Serial number; `None` takes the process's next one.
    pub serial: Option<u64>,
    /// Extended key usage: client auth (`true`) or server auth.
    pub client: bool,
    /// Both server and client auth, whatever `client` says: a peer certificate (etcd's
    /// `--peer-cert-file` serves peers and is presented to them).
    pub peer: bool,
    /// The key algorithm of a fresh key.
    pub key: KeyKind,
    /// An existing key (PEM) to certify instead of a fresh one (many certificates, few keys).
    pub reuse_key: Option<String>,
    /// CRL distribution point URIs (which partitioned CRL covers it: [`Ca::crl_scoped`]).
    pub crl_distribution_points: Vec<String>,
}

impl CertSpec {
    /// A server certificate for `sans` (CN = the first), valid from an hour ago for a day.
    pub fn server(sans: &[&str]) -> CertSpec {
        let now = OffsetDateTime::now_utc();
        CertSpec {
            common_name: sans.first().copied().unwrap_or("server").to_owned(),
            organizations: Vec::new(),
            sans: sans.iter().map(|s| (*s).to_owned()).collect(),
            not_before: now - Duration::hours(1),
            not_after: now + Duration::days(1),
            serial: None,
            client: false,
            peer: false,
            key: KeyKind::EcdsaP256,
            reuse_key: None,
            crl_distribution_points: Vec::new(),
        }
    }

    /// A client certificate with subject CN `cn`, valid from an hour ago for a day.
    pub fn client(cn: &str) -> CertSpec {
        CertSpec {
            common_name: cn.to_owned(),
            client: true,
            ..CertSpec::server(&[])
        }
    }

    /// A peer certificate for `sans` (CN = the first): server and client auth, valid from an
    /// hour ago for a day.
    pub fn peer(sans: &[&str]) -> CertSpec {
        CertSpec {
            peer: true,
            ..CertSpec::server(sans)
        }
    }

    /// Sets the validity window.
    #[must_use]
    pub fn valid(mut self, not_before: OffsetDateTime, not_after: OffsetDateTime) -> CertSpec {
        self.not_before = not_before;
        self.not_after = not_after;
        self
    }

    /// Valid from an hour ago for `days` days; a negative `days` is expired: valid from
    /// `30 - days` days ago until `-days` days ago.
    #[must_use]
    pub fn days(self, days: i64) -> CertSpec {
        let now = OffsetDateTime::now_utc();
        if days >= 0 {
            self.valid(now - Duration::hours(1), now + Duration::days(days))
        } else {
            self.valid(now - Duration::days(-days + 30), now + Duration::days(days))
        }
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

    /// Valid from `from` until `to`, both relative to now (a positive `from`: not yet valid).
    #[must_use]
    pub fn between(self, from: Duration, to: Duration) -> CertSpec {
        let now = OffsetDateTime::now_utc();
        self.valid(now + from, now + to)
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

    /// Sets the subject CN.
    #[must_use]
    pub fn common_name(mut self, cn: &str) -> CertSpec {
        cn.clone_into(&mut self.common_name);
        self
    }

    /// Sets the key algorithm.
    #[must_use]
    pub fn key(mut self, kind: KeyKind) -> CertSpec {
        self.key = kind;
        self
    }

    /// Certifies this existing key (PEM) instead of a fresh one.
    #[must_use]
    pub fn reuse_key(mut self, key_pem: &str) -> CertSpec {
        self.reuse_key = Some(key_pem.to_owned());
        self
    }

    /// Adds a CRL distribution point URI.
    #[must_use]
    pub fn crl_distribution_point(mut self, uri: &str) -> CertSpec {
        self.crl_distribution_points.push(uri.to_owned());
        self
    }

    fn params(&self, serial: u64) -> (CertificateParams, KeyPair) {
        let key = match &self.reuse_key {
            Some(pem) => KeyPair::from_pem(pem).expect("the reused key is a valid PEM key"),
            None => self.key.generate(),
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no SANs is valid");
        for name in &self.sans {
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    name.as_str()
                        .try_into()
                        .unwrap_or_else(|err| panic!("SAN {name:?}: {err}")),
                ),
            });
        }
        params
            .distinguished_name
            .push(DnType::CommonName, self.common_name.as_str());
        for organization in &self.organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization.as_str());
        }
        params.serial_number = Some(serial.into());
        params.not_before = self.not_before;
        params.not_after = self.not_after;
        if !self.crl_distribution_points.is_empty() {
            params.crl_distribution_points = vec![rcgen::CrlDistributionPoint {
                uris: self.crl_distribution_points.clone(),
            }];
        }
        params.extended_key_usages = if self.peer {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        } else if self.client {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![ExtendedKeyUsagePurpose::ServerAuth]
        };
        (params, key)
    }
}

/// An issued certificate and its key, in memory.
#[derive(Clone)]
pub struct Issued {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM (PKCS#8).
    pub key_pem: String,
    /// Certificate, DER.
    pub der: Vec<u8>,
    /// Serial number, lowercase hex without leading zeros.
    pub serial: String,
    /// Serial number.
    pub serial_number: u64,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No key bytes in any `Debug`, even a test's.
        f.debug_struct("Issued")
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl Issued {
    fn new(cert: &rcgen::Certificate, key: &KeyPair, serial: u64) -> Issued {
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            serial: format!("{serial:x}"),
            serial_number: serial,
        }
    }

    /// The certificate followed by `ca`'s (a chain for a server that sends its intermediate).
    pub fn chain_with(&self, ca: &Ca) -> String {
        format!("{}{}", self.cert_pem, ca.cert_pem)
    }

    /// Key and certificate in one PEM (a `CertKeyPaths::bundle` file).
    pub fn bundle(&self) -> String {
        format!("{}{}", self.key_pem, self.cert_pem)
    }
}

/// A self-signed server certificate as `spec` says (no CA; the certificate is its own root).
///
/// # Panics
/// If rcgen rejects the spec (a test bug).
pub fn self_signed(spec: &CertSpec) -> Issued {
    let serial = spec.serial.unwrap_or_else(next_serial);
    let (params, key) = spec.params(serial);
    let cert = params.self_signed(&key).expect("self-signing");
    Issued::new(&cert, &key, serial)
}

/// A throwaway CA (root or intermediate).
pub struct Ca {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Default for Ca {
    /// A root CA named `testkit ca <n>` (n: the CA's number in this process), valid from an
    /// hour ago for 30 days.
    fn default() -> Self {
        let now = OffsetDateTime::now_utc();
        Ca::with_validity(now - Duration::hours(1), now + Duration::days(30))
    }
}

impl Ca {
    /// A root CA with subject CN `name`, valid from an hour ago for a year.
    pub fn new(name: &str) -> Ca {
        let now = OffsetDateTime::now_utc();
        Ca::root(name, now - Duration::hours(1), now + Duration::days(365))
    }

    /// A root CA named `testkit ca <n>` with the given validity window.
    pub fn with_validity(not_before: OffsetDateTime, not_after: OffsetDateTime) -> Ca {
        let number = NEXT_CA.fetch_add(1, Ordering::Relaxed);
        Ca::root(&format!("testkit ca {number}"), not_before, not_after)
    }

    /// A root CA with subject CN `name` and the given validity window.
    ///
    /// # Panics
    /// When the key cannot be generated or the certificate signed.
    pub fn root(name: &str, not_before: OffsetDateTime, not_after: OffsetDateTime) -> Ca {
        let key = KeyKind::EcdsaP256.generate();
        let params = ca_params(name, not_before, not_after);
        let cert_pem = params.self_signed(&key).expect("self-signing").pem();
        Ca {
            cert_pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// An intermediate CA signed by this one, valid from 400 days ago until `days` from now.
    ///
    /// # Panics
    /// When the key cannot be generated or the certificate signed.
    pub fn intermediate(&self, name: &str, days: i64) -> Ca {
        let now = OffsetDateTime::now_utc();
        let key = KeyKind::EcdsaP256.generate();
        let params = ca_params(name, now - Duration::days(400), now + Duration::days(days));
        let cert_pem = params.signed_by(&key, &self.issuer).expect("signing").pem();
        Ca {
            cert_pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A CA someone else made, from its certificate and private key (PEM): issue certificates
    /// with it (e.g. from a signer a controller under test generated).
    ///
    /// # Panics
    /// When either does not parse.
    pub fn from_pems(cert_pem: &str, key_pem: &str) -> Ca {
        let key = KeyPair::from_pem(key_pem).expect("a PEM private key");
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).expect("a PEM CA certificate");
        Ca {
            cert_pem: cert_pem.to_owned(),
            issuer,
        }
    }

    /// A root CA whose certificate carries a subjectUniqueID (X.509 v2's field, still legal in
    /// v3): OpenSSL and Go take it as a CA, webpki refuses it as a trust anchor. The DER is
    /// built from rcgen's and signed again with the CA's key; the CA issues as any other.
    ///
    /// # Panics
    /// When the key cannot be generated or the certificate signed.
    pub fn with_subject_unique_id(name: &str) -> Ca {
        let now = OffsetDateTime::now_utc();
        let key = KeyKind::EcdsaP256.generate();
        let params = ca_params(name, now - Duration::hours(1), now + Duration::days(365));
        let cert = params.self_signed(&key).expect("self-signing");
        let der = crate::der::with_subject_unique_id(cert.der(), &key);
        Ca {
            cert_pem: crate::der::pem_of(&der),
            issuer: Issuer::new(params, key),
        }
    }

    /// A root CA whose certificate is over 64 KiB (a large private extension): legal, but more
    /// than webpki reads.
    ///
    /// # Panics
    /// When the key cannot be generated or the certificate signed.
    pub fn oversized(name: &str) -> Ca {
        let now = OffsetDateTime::now_utc();
        let key = KeyKind::EcdsaP256.generate();
        let mut params = ca_params(name, now - Duration::hours(1), now + Duration::days(365));
        // An OCTET STRING of 70,000 bytes under a private-arc OID, not critical.
        let padding = crate::der::tlv(0x04, &vec![0x5a; 70_000]);
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 55555, 1],
                padding,
            ));
        let cert_pem = params.self_signed(&key).expect("self-signing").pem();
        Ca {
            cert_pem,
            issuer: Issuer::new(params, key),
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
    pub fn issue(&self, spec: &CertSpec) -> Issued {
        let serial = spec.serial.unwrap_or_else(next_serial);
        let (params, key) = spec.params(serial);
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        Issued::new(&cert, &key, serial)
    }

    /// A serving leaf for `names` (CN = the first), valid from an hour ago for `days` days
    /// (negative: expired, see [`CertSpec::days`]).
    pub fn leaf(&self, names: &[&str], days: i64) -> Issued {
        self.issue(&CertSpec::server(names).days(days))
    }

    /// A serving leaf valid from `from` to `to` (relative to now).
    pub fn leaf_between(&self, names: &[&str], from: Duration, to: Duration) -> Issued {
        self.issue(&CertSpec::server(names).between(from, to))
    }

    /// A serving leaf for `localhost` and `127.0.0.1`, valid for a day: (cert PEM, key PEM,
    /// serial hex).
    pub fn localhost_leaf(&self) -> (String, String, String) {
        self.leaf_for(&["localhost", "127.0.0.1"])
    }

    /// A serving leaf for `names`, valid for a day: (cert PEM, key PEM, serial hex).
    pub fn leaf_for(&self, names: &[&str]) -> (String, String, String) {
        let issued = self.issue(&CertSpec::server(names));
        (issued.cert_pem, issued.key_pem, issued.serial)
    }

    /// A client certificate with subject CN `cn`, valid for 30 days.
    pub fn client(&self, cn: &str) -> Issued {
        self.client_valid_for(cn, 30)
    }

    /// A client certificate valid for `days` more days (negative: expired).
    pub fn client_valid_for(&self, cn: &str, days: i64) -> Issued {
        self.issue(&CertSpec::client(cn).days(days))
    }

    /// A client certificate with subject CN `cn`, valid for a day: (cert PEM, key PEM).
    pub fn client_leaf(&self, cn: &str) -> (String, String) {
        let issued = self.issue(&CertSpec::client(cn));
        (issued.cert_pem, issued.key_pem)
    }
}

fn ca_params(
    name: &str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no SANs is valid");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.not_before = not_before;
    params.not_after = not_after;
    params
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
    ///
    /// # Panics
    /// When no temporary directory can be created.
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
        let ca = Ca::default();
        let path = self.path().join(format!("{name}.crt"));
        rename::rename_into(&path, ca.cert_pem.as_bytes());
        (ca, path)
    }

    /// Issues `spec` from `ca` and writes `<name>.crt` and `<name>.key` (see [`write_pair`]).
    pub fn issue(&self, ca: &Ca, name: &str, spec: &CertSpec) -> CertFiles {
        let issued = ca.issue(spec);
        let cert = self.path().join(format!("{name}.crt"));
        let key = self.path().join(format!("{name}.key"));
        write_pair(&cert, &key, &issued);
        CertFiles { cert, key, issued }
    }
}

/// Writes a certificate and key over existing files, key first (0600), each renamed into place
/// so a watcher never reads a torn file; a reader may still see the new key with the old
/// certificate for a moment, which reload-lib rejects and retries.
pub fn write_pair(cert: &Path, key: &Path, issued: &Issued) {
    rename::rename_into_with_mode(key, issued.key_pem.as_bytes(), 0o600);
    rename::rename_into(cert, issued.cert_pem.as_bytes());
}
