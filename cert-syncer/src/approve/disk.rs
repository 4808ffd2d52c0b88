//! The kubelet's client certificate on this node's disk: the one fact that tells a recovery
//! (the kubelet cannot authenticate, so a human would have to approve) from a normal rotation
//! (the kubelet still holds a valid certificate: nothing to do here).

use std::path::Path;

use crate::base::input_file;

/// Largest file read (a certificate and its key: a few KiB).
const MAX_FILE: u64 = 1024 * 1024;

/// What the kubelet's client certificate file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletCert {
    /// Nothing at the path (or a dangling symlink: `kubelet-client-current.pem` points to a
    /// dated file that was removed).
    Absent,
    /// The first certificate's notAfter is past.
    Expired { not_after: i64 },
    /// The first certificate is valid now (or not yet valid: the kubelet holds a certificate
    /// that some clock will accept, so this is not a recovery).
    Valid { not_after: i64 },
    /// Unreadable, not a regular file, or no parseable certificate: fail closed (nothing is
    /// approved, the reason is logged), because "I cannot tell" must not open the door.
    Unknown(String),
}

impl KubeletCert {
    /// Reads `path` (non-blocking, size-capped) and judges its first certificate at `now`.
    pub fn read(path: &Path, now: i64) -> KubeletCert {
        let what = "kubelet client certificate";
        let bytes = match input_file::read_if_exists(what, path, MAX_FILE) {
            Ok(None) => return KubeletCert::Absent,
            Ok(Some((bytes, _))) => bytes,
            Err(err) => return KubeletCert::Unknown(err),
        };
        // Only the CERTIFICATE blocks: the file also holds the private key, which is never
        // parsed, kept or shown.
        let blocks = match crate::pki::pem::blocks_skipping_torn(&bytes) {
            Ok(blocks) => blocks,
            Err(err) => {
                return KubeletCert::Unknown(format!("{what} {}: not PEM ({err})", path.display()));
            }
        };
        let Some(first) = blocks.into_iter().find(|b| b.label == "CERTIFICATE") else {
            return KubeletCert::Unknown(format!(
                "{what} {}: no CERTIFICATE block",
                path.display()
            ));
        };
        let der = rustls_pki_types::CertificateDer::from(first.der);
        match crate::pki::Cert::from_der(der) {
            Ok(cert) if cert.not_after <= now => KubeletCert::Expired {
                not_after: cert.not_after,
            },
            Ok(cert) => KubeletCert::Valid {
                not_after: cert.not_after,
            },
            Err(err) => KubeletCert::Unknown(format!(
                "{what} {}: its certificate does not parse ({err})",
                path.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::pki::{Ca, CertSpec};

    fn now() -> i64 {
        crate::base::time::unix_now()
    }

    #[test]
    fn absent_expired_valid_and_garbage_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet-client-current.pem");
        assert_eq!(KubeletCert::read(&path, now()), KubeletCert::Absent);

        // A dangling symlink, as kubelet-client-current.pem after its target was removed.
        std::os::unix::fs::symlink(dir.path().join("gone.pem"), &path).unwrap();
        assert_eq!(KubeletCert::read(&path, now()), KubeletCert::Absent);
        std::fs::remove_file(&path).unwrap();

        let ca = Ca::new("kubelet-signer");
        let expired = ca.issue(&CertSpec::client("system:node:n1").expired(1));
        std::fs::write(&path, expired.bundle()).unwrap();
        assert!(matches!(
            KubeletCert::read(&path, now()),
            KubeletCert::Expired { .. }
        ));

        let valid = ca.issue(&CertSpec::client("system:node:n1").days(30));
        std::fs::write(&path, format!("{}{}", valid.key_pem, valid.cert_pem)).unwrap();
        assert!(matches!(
            KubeletCert::read(&path, now()),
            KubeletCert::Valid { .. }
        ));

        for garbage in [
            "",
            "not pem at all",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            std::fs::write(&path, garbage).unwrap();
            let read = KubeletCert::read(&path, now());
            assert!(
                matches!(read, KubeletCert::Unknown(_)),
                "{garbage:?}: {read:?}"
            );
        }
        // A key alone: no certificate, and no key bytes in the reason.
        std::fs::write(&path, &valid.key_pem).unwrap();
        let KubeletCert::Unknown(reason) = KubeletCert::read(&path, now()) else {
            panic!("a key alone is not a certificate")
        };
        assert!(
            reason.contains("no CERTIFICATE") && !reason.contains("PRIVATE"),
            "{reason}"
        );

        // A directory at the path: unreadable, fail closed.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(
            KubeletCert::read(&path, now()),
            KubeletCert::Unknown(_)
        ));
    }
}
