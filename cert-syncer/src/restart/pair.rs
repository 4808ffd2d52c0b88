//! What a container's pairs hold on disk: one digest over every pair's bytes (a real change is
//! a change of bytes), when they were last written (the newest inode change time: a rename
//! into place and a `..data` swap both set it, and no tool can set it back), and whether every
//! pair is one a server may be restarted into (parses, the key fits, valid now).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

use crate::base::input_file;
use crate::pki::{key_fits, parse_certs};

/// Largest certificate or key file read.
const MAX_FILE: u64 = 1024 * 1024;

/// A certificate file and its key file (one path twice for a file that holds both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.cert.display())
    }
}

/// SHA-256 over the pairs' bytes (or, for a pair that cannot be read, over why).
pub type Digest = [u8; 32];

/// The pairs of one container as read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub digest: Digest,
    /// The newest change time of the files (`None` when a file could not be read).
    pub written: Option<SystemTime>,
    /// What makes the pairs unfit for a restart (the first problem found), or their leaves'
    /// facts for the log and the Event.
    pub verdict: Result<Vec<Leaf>, String>,
}

/// The facts of a valid pair's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub serial: String,
    pub not_after: i64,
}

/// Reads `pairs` and judges them at `now` (Unix seconds).
pub fn read(pairs: &[Pair], now: i64) -> Seen {
    let mut hash = Sha256::new();
    let mut written: Option<SystemTime> = None;
    let mut leaves = Vec::new();
    let mut problem: Option<String> = None;
    let mut unreadable = false;
    for pair in pairs {
        match read_pair(pair) {
            Ok((cert, key, changed)) => {
                for bytes in [&cert, &key] {
                    hash.update((bytes.len() as u64).to_be_bytes());
                    hash.update(bytes);
                }
                written = written.max(Some(changed));
                match judge(pair, &cert, &key, now) {
                    Ok(leaf) => leaves.push(leaf),
                    Err(why) => {
                        problem.get_or_insert(why);
                    }
                }
            }
            Err(why) => {
                hash.update(why.as_bytes());
                unreadable = true;
                problem.get_or_insert(why);
            }
        }
    }
    Seen {
        digest: hash.finalize().into(),
        written: if unreadable { None } else { written },
        verdict: match problem {
            Some(why) => Err(why),
            None => Ok(leaves),
        },
    }
}

/// The bytes of both files and the newer change time.
fn read_pair(pair: &Pair) -> Result<(Vec<u8>, Vec<u8>, SystemTime), String> {
    let (cert, cert_meta) = input_file::read("certificate", &pair.cert, MAX_FILE)?;
    let (key, key_meta) = input_file::read("key", &pair.key, MAX_FILE)?;
    Ok((cert, key, changed(&cert_meta).max(changed(&key_meta))))
}

fn changed(meta: &std::fs::Metadata) -> SystemTime {
    use std::os::unix::fs::MetadataExt;
    let (seconds, nanos) = (meta.ctime(), meta.ctime_nsec());
    SystemTime::UNIX_EPOCH
        + std::time::Duration::new(seconds.max(0) as u64, nanos.clamp(0, 999_999_999) as u32)
}

/// A pair a server may be restarted into: certificates parse, the key fits the first one,
/// which is valid at `now`. The message names the files, never their content.
fn judge(pair: &Pair, cert: &[u8], key: &[u8], now: i64) -> Result<Leaf, String> {
    let shown = |path: &Path| path.display().to_string();
    let chain = parse_certs(cert).map_err(|err| format!("{}: {err}", shown(&pair.cert)))?;
    let leaf = &chain[0];
    match key_fits(leaf, key) {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "{} does not fit the certificate of {}",
                shown(&pair.key),
                shown(&pair.cert)
            ));
        }
        Err(err) => return Err(format!("{}: {err}", shown(&pair.key))),
    }
    if now < leaf.not_before {
        return Err(format!(
            "{} is not valid before {}",
            shown(&pair.cert),
            crate::base::time::rfc3339(leaf.not_before)
        ));
    }
    if leaf.is_expired_at(now) {
        return Err(format!(
            "{} expired at {}",
            shown(&pair.cert),
            crate::base::time::rfc3339(leaf.not_after)
        ));
    }
    Ok(Leaf {
        serial: leaf.serial.clone(),
        not_after: leaf.not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::pki::{Ca, CertSpec};
    use testkit::rename::rename_into_with_mode;

    fn write(dir: &Path, cert: &str, key: &str) -> Pair {
        let pair = Pair {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        rename_into_with_mode(&pair.cert, cert.as_bytes(), 0o644);
        rename_into_with_mode(&pair.key, key.as_bytes(), 0o600);
        pair
    }

    #[test]
    fn a_valid_pair_is_fit_and_its_digest_follows_its_bytes_only() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("restart-test-ca");
        let leaf = ca.issue(&CertSpec::client("system:kube-controller-manager"));
        let pair = write(dir.path(), &leaf.cert_pem, &leaf.key_pem);
        let now = crate::base::time::unix_now();
        let first = read(std::slice::from_ref(&pair), now);
        assert!(first.verdict.is_ok(), "{:?}", first.verdict);
        assert!(first.written.is_some());
        // The same bytes written again: the same digest (a `touch` or a rewrite is no change).
        let pair = write(dir.path(), &leaf.cert_pem, &leaf.key_pem);
        let again = read(std::slice::from_ref(&pair), now);
        assert_eq!(again.digest, first.digest);
        assert!(again.written >= first.written);
        let other = ca.issue(&CertSpec::client("system:kube-controller-manager"));
        let pair = write(dir.path(), &other.cert_pem, &other.key_pem);
        assert_ne!(read(&[pair], now).digest, first.digest);
    }

    #[test]
    fn a_mismatched_expired_or_missing_pair_is_unfit_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("restart-test-ca");
        let now = crate::base::time::unix_now();
        let (a, b) = (
            ca.issue(&CertSpec::client("a")),
            ca.issue(&CertSpec::client("b")),
        );
        let pair = write(dir.path(), &a.cert_pem, &b.key_pem);
        let why = read(std::slice::from_ref(&pair), now).verdict.unwrap_err();
        assert!(why.contains("does not fit"), "{why}");
        assert!(!why.contains("PRIVATE"), "no key bytes: {why}");

        let expired = ca.issue(&CertSpec::client("a").expired(2));
        let pair = write(dir.path(), &expired.cert_pem, &expired.key_pem);
        let why = read(std::slice::from_ref(&pair), now).verdict.unwrap_err();
        assert!(why.contains("expired"), "{why}");

        std::fs::remove_file(&pair.key).unwrap();
        let seen = read(std::slice::from_ref(&pair), now);
        assert!(seen.verdict.unwrap_err().contains("tls.key"));
        assert_eq!(seen.written, None);
    }
}
