//! The host file and the decision to write it: ours when the file is absent or still holds
//! what we wrote last; someone else's content is left alone until it has stayed unchanged for
//! the grace period, then replaced (once); content with the same certificates as ours, however
//! formatted, is never rewritten.
//!
//! | file holds | action |
//! |---|---|
//! | our certificates (any formatting) | nothing |
//! | nothing (absent) | write now |
//! | exactly what we wrote last (the sources changed) | write now |
//! | anything else (another writer) | wait until it has been unchanged for the grace period, then write |
//!
//! Before any write the guard ([`super::guard`]) may refuse the new bundle (no unexpired CA, or
//! it would remove every unexpired certificate the file holds): the file then keeps what it
//! holds, whoever wrote it.
//!
//! The file is read with the crate's safe reader ([`crate::base::input_file`]): a FIFO, a device or a
//! directory at the path is an error at once, never a blocked `open`.
//!
//! "Unchanged" is the file's identity (inode, size, mtime, ctime): a writer that keeps
//! rewriting the file, even with the same bytes, keeps us waiting, so two writers never take
//! turns on every write (no flapping). After a restart nothing is known about our last write,
//! so a differing file waits for the grace period too.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::bundle::{self, Bundle};
use super::guard::{self, Refusal};

/// Files larger than this are not read (a CA bundle is a few KiB; this is a guard, not a
/// limit anyone should meet).
const MAX_READ: u64 = 16 << 20;

/// What [`Target::reconcile`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The file holds our certificates.
    InSync,
    /// We wrote the file. `replaced` is the fingerprint of another writer's content we replaced
    /// after the grace period.
    Written { replaced: Option<String> },
    /// Another writer's content (fingerprint) is there; we wait until `until`. `first` is true
    /// the first time this content (or write) is seen.
    Waiting {
        fingerprint: String,
        until: Instant,
        first: bool,
    },
    /// The guard refused the new bundle; the file keeps its content (`held`: its fingerprint,
    /// `None` when there is no file).
    Refused {
        refusal: Refusal,
        held: Option<String>,
    },
}

/// A failed read or write, naming the file and the step.
#[derive(Debug, thiserror::Error)]
#[error("{step} {}: {source}", path.display())]
pub struct WriteError {
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The identity of a file version: another write changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

#[derive(Debug)]
struct Foreign {
    identity: Identity,
    since: Instant,
}

/// The host file.
#[derive(Debug)]
pub struct Target {
    path: PathBuf,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    grace: Duration,
    last_written: Option<Vec<u8>>,
    foreign: Option<Foreign>,
}

impl Target {
    pub fn new(
        path: PathBuf,
        mode: Option<u32>,
        owner: Option<(u32, u32)>,
        grace: Duration,
    ) -> Target {
        Target {
            path,
            mode,
            owner,
            grace,
            last_written: None,
            foreign: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Compares the file with `desired` and writes when the table in the module docs says so
    /// and the guard lets it. `now` times the grace period; `unix_now` (seconds since the
    /// epoch) judges expiry.
    pub fn reconcile(
        &mut self,
        desired: &Bundle,
        now: Instant,
        unix_now: i64,
    ) -> Result<Outcome, WriteError> {
        let current = self.read()?;
        let Some((bytes, meta)) = current else {
            if let Err(refusal) = guard::check(&desired.certificates, &[], unix_now) {
                return Ok(Outcome::Refused {
                    refusal,
                    held: None,
                });
            }
            self.write(desired, None)?;
            return Ok(Outcome::Written { replaced: None });
        };
        let desired_ders: Vec<Vec<u8>> =
            desired.certificates.iter().map(|c| c.der.clone()).collect();
        if bundle::certificate_ders(&bytes).as_ref() == Some(&desired_ders) {
            self.foreign = None;
            self.last_written = Some(bytes);
            return Ok(Outcome::InSync);
        }
        let held = bundle::held_certificates(&bytes);
        if let Err(refusal) = guard::check(&desired.certificates, &held, unix_now) {
            return Ok(Outcome::Refused {
                refusal,
                held: Some(bundle::fingerprint(&bytes)),
            });
        }
        if self.last_written.as_ref() == Some(&bytes) {
            self.write(desired, Some(&meta))?;
            return Ok(Outcome::Written { replaced: None });
        }
        let identity = identity(&meta);
        let fingerprint = bundle::fingerprint(&bytes);
        let first = match &self.foreign {
            Some(foreign) if foreign.identity == identity => false,
            _ => {
                self.foreign = Some(Foreign {
                    identity,
                    since: now,
                });
                true
            }
        };
        let since = self.foreign.as_ref().map_or(now, |f| f.since);
        let until = since + self.grace;
        if now >= until {
            self.write(desired, Some(&meta))?;
            return Ok(Outcome::Written {
                replaced: Some(fingerprint),
            });
        }
        Ok(Outcome::Waiting {
            fingerprint,
            until,
            first,
        })
    }

    /// The file's bytes and metadata; `None` when it does not exist.
    fn read(&self) -> Result<Option<(Vec<u8>, std::fs::Metadata)>, WriteError> {
        // Regular files only, opened non-blocking: a FIFO here would block a plain `open`
        // forever (and the whole loop with it).
        crate::base::input_file::read_if_exists("host file", &self.path, MAX_READ).map_err(
            |message| WriteError {
                step: "read",
                path: self.path.clone(),
                source: std::io::Error::other(message),
            },
        )
    }

    /// Writes atomically (reload-lib's writer: temporary file, fsync, rename, directory
    /// fsync) with the configured mode or the existing file's, then the configured owner or the
    /// existing file's.
    fn write(
        &mut self,
        desired: &Bundle,
        existing: Option<&std::fs::Metadata>,
    ) -> Result<(), WriteError> {
        let mode = self
            .mode
            .or(existing.map(|m| m.permissions().mode() & 0o777))
            .unwrap_or(0o644);
        reload_lib::fs::write_file_atomic(&self.path, &desired.pem, mode).map_err(|err| {
            WriteError {
                step: "write",
                path: self.path.clone(),
                source: std::io::Error::other(err.to_string()),
            }
        })?;
        let owner = self.owner.or(existing.map(|m| (m.uid(), m.gid())));
        if let Some((uid, gid)) = owner {
            let written = std::fs::metadata(&self.path).map_err(|source| WriteError {
                step: "stat",
                path: self.path.clone(),
                source,
            })?;
            if (written.uid(), written.gid()) != (uid, gid) {
                // The new file belongs to us until here (its mode is already final, and this
                // process is at least as trusted as the owner it hands the file to).
                std::os::unix::fs::chown(&self.path, Some(uid), Some(gid)).map_err(|source| {
                    WriteError {
                        step: "chown",
                        path: self.path.clone(),
                        source,
                    }
                })?;
            }
        }
        self.last_written = Some(desired.pem.clone());
        self.foreign = None;
        Ok(())
    }
}

fn identity(meta: &std::fs::Metadata) -> Identity {
    Identity {
        ino: meta.ino(),
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::bundle::{assemble, parse_certificates};

    /// A self-signed CA certificate, PEM.
    fn ca(name: &str) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn bundle_of(pems: &[&str]) -> Bundle {
        let certs = parse_certificates(pems.concat().as_bytes()).unwrap();
        assemble([certs.as_slice()])
    }

    fn wall() -> i64 {
        crate::base::time::unix_now()
    }

    #[test]
    fn an_absent_file_is_written_and_then_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let mut target = Target::new(path.clone(), None, None, Duration::from_secs(60));
        let (a, b) = (ca("a"), ca("b"));
        let bundle = bundle_of(&[&a]);
        let now = Instant::now();
        assert_eq!(
            target.reconcile(&bundle, now, wall()).unwrap(),
            Outcome::Written { replaced: None }
        );
        assert_eq!(std::fs::read(&path).unwrap(), bundle.pem);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert_eq!(
            target.reconcile(&bundle, now, wall()).unwrap(),
            Outcome::InSync
        );
        // Our own previous content is updated at once when the sources change.
        let next = bundle_of(&[&a, &b]);
        assert_eq!(
            target.reconcile(&next, now, wall()).unwrap(),
            Outcome::Written { replaced: None }
        );
    }

    #[test]
    fn the_same_certificates_formatted_otherwise_are_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let bundle = bundle_of(&[&ca("a")]);
        let crlf = String::from_utf8(bundle.pem.clone())
            .unwrap()
            .replace('\n', "\r\n");
        std::fs::write(&path, format!("# written by someone else\n{crlf}")).unwrap();
        let mut target = Target::new(path.clone(), None, None, Duration::from_secs(60));
        assert_eq!(
            target.reconcile(&bundle, Instant::now(), wall()).unwrap(),
            Outcome::InSync
        );
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .starts_with("# written")
        );
    }

    #[test]
    fn another_writer_keeps_the_file_until_it_has_been_quiet_for_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let grace = Duration::from_secs(60);
        let mut target = Target::new(path.clone(), None, None, grace);
        let shared = ca("shared");
        let ours = bundle_of(&[&shared, &ca("ours")]);
        let start = Instant::now();
        target.reconcile(&ours, start, wall()).unwrap();
        // Another writer lagging a rotation: the shared signer and one we dropped.
        let theirs = bundle_of(&[&ca("theirs"), &shared]);
        std::fs::write(&path, &theirs.pem).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let Outcome::Waiting {
            first: true,
            fingerprint,
            ..
        } = target.reconcile(&ours, start, wall()).unwrap()
        else {
            panic!("another writer's content must be waited for");
        };
        assert_eq!(fingerprint, bundle::fingerprint(&theirs.pem));
        assert!(matches!(
            target.reconcile(&ours, start + grace / 2, wall()).unwrap(),
            Outcome::Waiting { first: false, .. }
        ));
        // A rewrite (same bytes, new inode) starts the wait again.
        let tmp = dir.path().join("tmp");
        std::fs::write(&tmp, &theirs.pem).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let later = start + grace / 2 + Duration::from_secs(1);
        assert!(matches!(
            target.reconcile(&ours, later, wall()).unwrap(),
            Outcome::Waiting { first: true, .. }
        ));
        assert!(matches!(
            target.reconcile(&ours, later + grace / 2, wall()).unwrap(),
            Outcome::Waiting { first: false, .. }
        ));
        assert_eq!(
            target.reconcile(&ours, later + grace, wall()).unwrap(),
            Outcome::Written {
                replaced: Some(fingerprint)
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), ours.pem);
        // The existing file's mode is kept.
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn the_existing_owner_is_kept_and_a_configured_one_applied() {
        if std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(1)
            != 0
        {
            eprintln!("SKIP: changing a file's owner needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, b"old").unwrap();
        std::os::unix::fs::chown(&path, Some(1234), Some(4321)).unwrap();
        let a = ca("a");
        let mut target = Target::new(path.clone(), None, None, Duration::ZERO);
        target
            .reconcile(&bundle_of(&[&a]), Instant::now(), wall())
            .unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1234, 4321), "kept");
        let mut target = Target::new(path.clone(), None, Some((0, 0)), Duration::ZERO);
        target
            .reconcile(&bundle_of(&[&a, &ca("b")]), Instant::now(), wall())
            .unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "configured");
    }

    #[test]
    fn a_configured_mode_wins_over_the_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut target = Target::new(path.clone(), Some(0o640), None, Duration::ZERO);
        let bundle = bundle_of(&[&ca("a")]);
        assert!(matches!(
            target.reconcile(&bundle, Instant::now(), wall()).unwrap(),
            Outcome::Written { replaced: Some(_) }
        ));
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[test]
    fn a_refused_bundle_leaves_the_file_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let mut target = Target::new(path.clone(), None, None, Duration::ZERO);
        // No file yet, and a leaf (not a CA): nothing is written.
        let mut params = rcgen::CertificateParams::new(vec!["leaf.example".to_owned()]).unwrap();
        params.is_ca = rcgen::IsCa::NoCa;
        let leaf = params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem();
        assert!(matches!(
            target
                .reconcile(&bundle_of(&[&leaf]), Instant::now(), wall())
                .unwrap(),
            Outcome::Refused {
                refusal: Refusal::NoUnexpiredCa { .. },
                held: None
            }
        ));
        assert!(!path.exists());
        // Written once, then an unrelated bundle from the same source: refused, kept.
        let good = bundle_of(&[&ca("a")]);
        target.reconcile(&good, Instant::now(), wall()).unwrap();
        let unrelated = bundle_of(&[&ca("z")]);
        assert_eq!(
            target
                .reconcile(&unrelated, Instant::now(), wall())
                .unwrap(),
            Outcome::Refused {
                refusal: Refusal::RemovesEveryUnexpired { held: 1 },
                held: Some(bundle::fingerprint(&good.pem))
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), good.pem);
        // Removed by an administrator (a wholesale replacement on purpose): written.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            target
                .reconcile(&unrelated, Instant::now(), wall())
                .unwrap(),
            Outcome::Written { replaced: None }
        );
    }

    #[test]
    fn a_fifo_at_the_path_is_an_error_at_once_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let fifo = path.clone();
        // On a thread: a blocking `open` of a FIFO without a writer never returns, and this
        // test must fail, not hang, when that comes back.
        std::thread::spawn(move || {
            let mut target = Target::new(fifo, None, None, Duration::ZERO);
            let _ = tx.send(target.reconcile(&bundle_of(&[&ca("a")]), Instant::now(), wall()));
        });
        let result = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("reconcile returned within 10 s (a blocking open hangs on a FIFO)");
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("a FIFO") && err.contains(&path.display().to_string()),
            "{err}"
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_fifo(),
            "the FIFO is left alone"
        );
    }
}
