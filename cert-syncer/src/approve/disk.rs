//! The kubelet's client certificate on this node's disk: the one fact that tells a recovery
//! (the kubelet cannot authenticate, so a human would have to approve) from a normal rotation
//! (the kubelet still holds a valid certificate: nothing to do here).
//!
//! "Absent" is a strong statement and is made only when it is sure: the directory that holds
//! the file exists and the file does not. A missing directory (an unmounted
//! `/var/lib/kubelet/pki`, a typo in `--kubelet-client-cert`, a kubelet that keeps its
//! certificate elsewhere) is "cannot tell", like an unreadable file or garbage: fail closed.

use std::path::{Path, PathBuf};

use crate::base::input_file;

/// Largest file read (a certificate and its key: a few KiB).
const MAX_FILE: u64 = 1024 * 1024;
/// Symbolic links followed at most (`kubelet-client-current.pem` is one).
const MAX_LINKS: usize = 8;

/// What the kubelet's client certificate file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletCert {
    /// The directory exists and holds no such file (for a symbolic link, such as
    /// `kubelet-client-current.pem`: the directory its target names exists, the target does
    /// not). `since`: that directory's last change (Unix seconds), when the file went away at
    /// the latest.
    Absent { since: i64 },
    /// The first certificate's notAfter is past. `fingerprint`: its SHA-256, hex.
    Expired { not_after: i64, fingerprint: String },
    /// The first certificate is valid now (or not yet valid: the kubelet holds a certificate
    /// that some clock will accept, so this is not a recovery).
    Valid { not_after: i64 },
    /// Unreadable, not a regular file, no parseable certificate, or its directory missing:
    /// fail closed (nothing is approved, the reason is logged), because "I cannot tell" must
    /// not open the door.
    Unknown(String),
}

impl KubeletCert {
    /// Reads `path` (non-blocking, size-capped) and judges its first certificate at `now`.
    pub fn read(path: &Path, now: i64) -> KubeletCert {
        let what = "kubelet client certificate";
        let bytes = match input_file::read_if_exists(what, path, MAX_FILE) {
            Ok(None) => return absent(path),
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
                fingerprint: cert.info.sha256,
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

    /// What one approval is allowed for: this certificate (`sha256:…`), or this absence (`absent
    /// since …`, the directory's last change). `None` while nothing may be approved.
    pub fn approval_key(&self) -> Option<String> {
        match self {
            KubeletCert::Expired { fingerprint, .. } => Some(format!("sha256:{fingerprint}")),
            KubeletCert::Absent { since } => Some(format!(
                "absent since {}",
                crate::base::time::rfc3339(*since)
            )),
            KubeletCert::Valid { .. } | KubeletCert::Unknown(_) => None,
        }
    }
}

/// Nothing at `path`: absent if the directory the name lives in (after following links) exists,
/// else cannot tell.
fn absent(path: &Path) -> KubeletCert {
    let mut current = path.to_owned();
    for _ in 0..MAX_LINKS {
        let parent = match current.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        match std::fs::symlink_metadata(&current) {
            // A dangling link: the file is where it points.
            Ok(meta) if meta.file_type().is_symlink() => match std::fs::read_link(&current) {
                Ok(target) => current = parent.join(target),
                Err(err) => return unknown(path, &format!("cannot read its link ({err})")),
            },
            Ok(_) => return unknown(path, "it appeared while being read"),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return match std::fs::metadata(&parent) {
                    Ok(meta) if meta.is_dir() => KubeletCert::Absent {
                        since: modified(&meta),
                    },
                    Ok(_) => unknown(path, &format!("{} is not a directory", parent.display())),
                    Err(err) => unknown(
                        path,
                        &format!("its directory {} cannot be read ({err})", parent.display()),
                    ),
                };
            }
            Err(err) => return unknown(path, &err.to_string()),
        }
    }
    unknown(path, "too many symbolic links")
}

fn unknown(path: &Path, why: &str) -> KubeletCert {
    KubeletCert::Unknown(format!(
        "kubelet client certificate {}: not there, and not known to be absent: {why}",
        path.display()
    ))
}

fn modified(meta: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    meta.mtime()
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
        assert!(matches!(
            KubeletCert::read(&path, now()),
            KubeletCert::Absent { .. }
        ));

        // A dangling symlink into an existing directory, as kubelet-client-current.pem after
        // its target was removed.
        std::os::unix::fs::symlink(dir.path().join("gone.pem"), &path).unwrap();
        assert!(matches!(
            KubeletCert::read(&path, now()),
            KubeletCert::Absent { .. }
        ));
        std::fs::remove_file(&path).unwrap();

        let ca = Ca::new("kubelet-signer");
        let expired = ca.issue(&CertSpec::client("system:node:n1").expired(1));
        std::fs::write(&path, expired.bundle()).unwrap();
        let read = KubeletCert::read(&path, now());
        let KubeletCert::Expired { fingerprint, .. } = &read else {
            panic!("{read:?}")
        };
        assert_eq!(fingerprint.len(), 64);
        assert_eq!(read.approval_key(), Some(format!("sha256:{fingerprint}")));

        let valid = ca.issue(&CertSpec::client("system:node:n1").days(30));
        std::fs::write(&path, format!("{}{}", valid.key_pem, valid.cert_pem)).unwrap();
        let read = KubeletCert::read(&path, now());
        assert!(matches!(read, KubeletCert::Valid { .. }));
        assert_eq!(read.approval_key(), None);

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

    #[test]
    fn absent_only_when_the_directory_exists() {
        let dir = tempfile::tempdir().unwrap();
        // A missing directory (unmounted, a typo): cannot tell.
        let missing = dir.path().join("pki/kubelet-client-current.pem");
        let KubeletCert::Unknown(reason) = KubeletCert::read(&missing, now()) else {
            panic!("a missing directory is not an absence")
        };
        assert!(reason.contains("not known to be absent"), "{reason}");
        // A file where the directory should be.
        std::fs::write(dir.path().join("pki"), "x").unwrap();
        assert!(matches!(
            KubeletCert::read(&missing, now()),
            KubeletCert::Unknown(_)
        ));
        // A link to a file in a directory that does not exist (a target on an unmounted path).
        let link = dir.path().join("current.pem");
        std::os::unix::fs::symlink(dir.path().join("unmounted/k.pem"), &link).unwrap();
        assert!(matches!(
            KubeletCert::read(&link, now()),
            KubeletCert::Unknown(_)
        ));
        // A relative link whose target's directory exists: absent, since that directory's
        // last change.
        std::fs::create_dir(dir.path().join("certs")).unwrap();
        let relative = dir.path().join("relative.pem");
        std::os::unix::fs::symlink("certs/k.pem", &relative).unwrap();
        let read = KubeletCert::read(&relative, now());
        let KubeletCert::Absent { since } = read else {
            panic!("{read:?}")
        };
        assert!((since - now()).abs() < 60, "{since}");
        assert!(read.approval_key().unwrap().starts_with("absent since "));
    }
}
