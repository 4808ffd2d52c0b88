//! Where material comes from: file paths, and how to read them so that a certificate and its key
//! come from the same write.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::layout;

/// A certificate chain and its private key on disk: two files, or one bundle file holding the key
/// and the chain (leaf first).
///
/// Kubernetes Secret volumes (`tls.crt -> ..data/tls.crt`) are read through one resolved `..data`
/// generation, so the certificate and the key always come from the same atomic write.
///
/// ```
/// use reload_lib::CertKeyPaths;
/// let pair = CertKeyPaths::new("/etc/tls/tls.crt", "/etc/tls/tls.key");
/// assert_eq!(pair.key().to_str(), Some("/etc/tls/tls.key"));
/// let bundle = CertKeyPaths::bundle("/etc/tls/credential.pem");
/// assert_eq!(bundle.cert(), bundle.key());
/// ```
///
/// # Security
/// The paths come from your configuration and are trusted as such; they are only ever read
/// (never written, created or chmod-ed). Their file modes are not checked: keep key files
/// `0600` (the writers in [`fs`](crate::fs) create them with the mode you give).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertKeyPaths {
    cert: PathBuf,
    key: PathBuf,
}

impl CertKeyPaths {
    /// A certificate chain file and a private key file.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
        }
    }

    /// One file holding the private key and the chain (the kubelet `credentialBundlePath` shape),
    /// which a writer can replace in a single atomic step, so no torn pair is ever seen.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    /// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
    /// use reload_lib::{CertKeyPaths, ServingSet, fs::write_file_atomic};
    ///
    /// let bundle = dir.path().join("credential.pem");
    /// let pem = pair.signing_key.serialize_pem() + &pair.cert.pem(); // key and chain, any order
    /// write_file_atomic(&bundle, pem.as_bytes(), 0o600)?;
    /// let set = ServingSet::builder(CertKeyPaths::bundle(&bundle)).start().await?;
    /// assert_eq!(set.current().certificate_for(None).dns_names, ["api.example"]);
    /// # Ok(()) }
    /// ```
    pub fn bundle(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            cert: path.clone(),
            key: path,
        }
    }

    /// The certificate chain file.
    pub fn cert(&self) -> &Path {
        &self.cert
    }

    /// The private key file (the same as [`cert`](Self::cert) for a bundle).
    pub fn key(&self) -> &Path {
        &self.key
    }
}

/// Reads files for one load pass. Within a pass, every `..data` directory is resolved once, so all
/// files read through it come from one generation even if a writer commits meanwhile.
#[derive(Debug)]
pub(crate) struct PassReader {
    generations: HashMap<PathBuf, Option<PathBuf>>,
    max_file_size: u64,
    symlinks: Vec<PathBuf>,
}

impl Default for PassReader {
    fn default() -> Self {
        Self::new(crate::read::DEFAULT_MAX_FILE_SIZE)
    }
}

impl PassReader {
    /// A reader for one pass that refuses files larger than `max_file_size` bytes.
    pub(crate) fn new(max_file_size: u64) -> Self {
        Self {
            generations: HashMap::new(),
            max_file_size,
            symlinks: Vec::new(),
        }
    }

    /// The files read through a symlink of their own other than the kubelet's `..data` links
    /// (a symlink to a file elsewhere), for the watcher to follow (see
    /// `watch::Subscription::follow`). Plain files, the usual case, cost nothing here: their
    /// open with `O_NOFOLLOW` succeeded.
    pub(crate) fn into_symlinks(self) -> Vec<PathBuf> {
        self.symlinks
    }

    /// The bytes of the regular file at `path` (see [`crate::read`]); errors name `path` and
    /// never hold any of its content.
    pub(crate) fn read(&mut self, path: &Path) -> Result<Vec<u8>> {
        // A plain file (not a symlink) is read as it is: only symlinks can go through `..data`.
        let read = match crate::read::read_regular_unless_symlink(path, self.max_file_size) {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => crate::read::read_regular(&self.resolve(path), self.max_file_size),
            Err(err) => Err(err),
        };
        read.map_err(|source| Error::ReadFile {
            path: path.to_owned(),
            source,
        })
    }

    /// `dir/name -> ..data/name` becomes `dir/..<generation>/name`; any other path is returned
    /// unchanged (the kernel follows ordinary symlinks).
    fn resolve(&mut self, path: &Path) -> PathBuf {
        let (Some(dir), Ok(target)) = (path.parent(), std::fs::read_link(path)) else {
            return path.to_owned();
        };
        let Some(rest) = layout::through_data(&target) else {
            self.symlinks.push(path.to_owned());
            return path.to_owned();
        };
        let generation = self
            .generations
            .entry(dir.to_owned())
            .or_insert_with(|| layout::current_generation(dir));
        match generation {
            Some(generation) => dir.join(generation).join(rest),
            None => path.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_kubelet_layout_is_read_through_one_generation() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..gen1")).unwrap();
        std::fs::write(d.join("..gen1/tls.crt"), "one").unwrap();
        std::fs::create_dir(d.join("..gen2")).unwrap();
        std::fs::write(d.join("..gen2/tls.crt"), "two").unwrap();
        symlink("..gen1", d.join("..data")).unwrap();
        symlink("..data/tls.crt", d.join("tls.crt")).unwrap();

        let mut pass = PassReader::default();
        assert_eq!(pass.read(&d.join("tls.crt")).unwrap(), b"one");
        std::fs::remove_file(d.join("..data")).unwrap();
        symlink("..gen2", d.join("..data")).unwrap();
        // Same pass: still the generation resolved first.
        assert_eq!(pass.read(&d.join("tls.crt")).unwrap(), b"one");
        assert_eq!(
            PassReader::default().read(&d.join("tls.crt")).unwrap(),
            b"two"
        );
    }
}
