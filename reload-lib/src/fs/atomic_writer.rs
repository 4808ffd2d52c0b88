//! Writing a set of files so that readers see all of the old set or all of the new one: the
//! kubelet `AtomicWriter` protocol (Secret and ConfigMap volumes), plus fsync.
//!
//! Layout of a managed directory:
//!
//! ```text
//! dir/..2026_11_22_18_40_20.123456789   generation directory: the real files
//! dir/..data -> ..2026_11_22_18_40_20.123456789   the commit point (one rename)
//! dir/tls.crt -> ..data/tls.crt          one link per key
//! ```
//!
//! A write: validate every key; stop if nothing changed; create a fresh generation directory, write
//! and fsync every file (created with its final mode, never wider), fsync the directory; point
//! `..data_tmp` at it and rename it over `..data` (the commit); fsync the parent; add missing key
//! links (replacing plain files by rename, never unlink-then-create); remove links of keys that
//! left; remove every other generation at once, as the kubelet does.
//! Spec: <https://github.com/kubernetes/kubernetes/blob/master/pkg/volume/util/atomic_writer.go>.
//!
//! # The consumer contract
//! kube-apiserver (`--tls-cert-file`, `--tls-sni-cert-key`, `--client-ca-file`), the kubelet's
//! client-CA loader and controller-runtime's certwatcher watch each *file* with fsnotify: an
//! inotify watch on the inode that `dir/<key>` resolves to (the file inside the generation
//! directory), re-added after a remove or rename event, and no periodic re-read. Such a consumer
//! sees a write only when the inode it watches gets an event. So the old generation is removed
//! right after the `..data` swap: its files are unlinked, each watched inode gets
//! `IN_DELETE_SELF`, and the consumer re-resolves the path and reads the new generation. Keeping the
//! previous generation until the next write (as this writer once did) made every other write
//! invisible to those consumers. A reader that resolved `..data` just before the swap and loses
//! the race gets `ENOENT` and must retry (reload-lib's reader does; so do the Go loaders, which
//! re-add the watch and re-read).
//!
//! # Security
//! Keys come from the API and are untrusted: they must be one path component (no `/`, not `.` or
//! `..`, no NUL), must not start with `..` (that namespace is the writer's), and are at most 253
//! bytes (a DNS subdomain, the longest Secret key the apiserver accepts). A bad key fails the whole
//! write before anything touches the disk. Nothing outside `dir` is ever written or removed: a
//! `..data` that points anywhere but a `..name` inside `dir` is treated as absent, and only plain
//! directories named `..*` inside `dir` are pruned.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::file::{Error, FileContent, io_err, sync_dir, write_new_file};
use crate::layout::{self, current_generation};

/// The longest key accepted, in bytes (a DNS subdomain: the apiserver's own limit for keys).
///
/// ```
/// use reload_lib::fs::{MAX_KEY_LEN, validate_key};
/// assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
/// assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
/// ```
pub const MAX_KEY_LEN: usize = 253;
/// What a write did. See [`AtomicDirWriter`] for an example.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// The directory already held exactly this content: nothing was written.
    Unchanged,
    /// A new generation was committed.
    Written {
        /// The new generation directory.
        generation: PathBuf,
        /// Keys of the previous generation that are gone.
        removed_keys: Vec<String>,
    },
}
/// Checks that `key` can be a file name in a managed directory (see the module docs).
///
/// ```
/// use reload_lib::fs::validate_key;
/// assert!(validate_key("tls.crt").is_ok());
/// assert!(validate_key("../etc/passwd").is_err());
/// assert!(validate_key("..data").is_err());
/// ```
pub fn validate_key(key: &str) -> Result<(), Error> {
    let reason = if key.is_empty() {
        "empty"
    } else if key.len() > MAX_KEY_LEN {
        "longer than 253 bytes"
    } else if key == "." || key == ".." {
        "not a file name"
    } else if key.contains('/') {
        "contains '/'"
    } else if key.contains('\0') {
        "contains NUL"
    } else if layout::is_internal(std::ffi::OsStr::new(key)) {
        "starts with '..' (reserved for the writer)"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

/// Writes sets of files into one directory with the kubelet `..data` protocol. Synchronous
/// (`std::fs`); call it from `spawn_blocking` in async code. One writer per directory at a time.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use reload_lib::fs::{AtomicDirWriter, FileContent, WriteOutcome};
/// use std::collections::BTreeMap;
/// use std::os::unix::fs::PermissionsExt;
///
/// let writer = AtomicDirWriter::new(dir.path().join("serving-cert"));
/// let payload = BTreeMap::from([
///     ("tls.crt".to_owned(), FileContent::new(b"certificate PEM".to_vec(), 0o644)),
///     ("tls.key".to_owned(), FileContent::new(b"key PEM".to_vec(), 0o600)),
/// ]);
/// assert!(matches!(writer.write(&payload)?, WriteOutcome::Written { .. }));
/// assert_eq!(writer.write(&payload)?, WriteOutcome::Unchanged); // no new generation
///
/// // serving-cert/tls.key -> ..data/tls.key, ..data -> ..<timestamp>
/// let key = writer.dir().join("tls.key");
/// assert_eq!(std::fs::read_link(&key)?, std::path::Path::new("..data/tls.key"));
/// assert_eq!(std::fs::read(&key)?, b"key PEM");
/// assert_eq!(std::fs::metadata(&key)?.permissions().mode() & 0o7777, 0o600);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Security
/// Every file is created with its final mode (exclusive create, then an explicit chmod because
/// the umask may have narrowed it), so a key is never readable by others, not even for a
/// moment. Keys are untrusted file names and are validated before anything touches the disk
/// ([`validate_key`]); nothing outside the directory is written or removed (see the module
/// docs). Contents are fsynced before the commit, so a crash leaves the old or the new set.
#[derive(Debug, Clone)]
pub struct AtomicDirWriter {
    dir: PathBuf,
    /// The trusted top of the tree: every component below it, down to `dir`, must be a real
    /// directory (never a symlink).
    root: Option<PathBuf>,
}

impl AtomicDirWriter {
    /// A writer for `dir` (created on the first write). `dir` itself must not be a symlink.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            root: None,
        }
    }

    /// Also refuses a symlink at any component between `root` (trusted, may itself be a link)
    /// and the managed directory, e.g. `root/secrets` or `root/secrets/<name>`: otherwise
    /// whoever can create such a link sends our writes and deletes anywhere. `dir` must be
    /// under `root`.
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?;
    /// use reload_lib::fs::{AtomicDirWriter, Error, FileContent};
    /// use std::collections::BTreeMap;
    ///
    /// let outside = tmp.path().join("outside");
    /// std::fs::create_dir_all(tmp.path().join("dest"))?;
    /// std::fs::create_dir(&outside)?;
    /// std::os::unix::fs::symlink(&outside, tmp.path().join("dest/secrets"))?;
    /// let writer = AtomicDirWriter::new(tmp.path().join("dest/secrets/serving"))
    ///     .with_root(tmp.path().join("dest"));
    /// let payload = BTreeMap::from([("k".to_owned(), FileContent::new(b"v".to_vec(), 0o600))]);
    /// assert!(matches!(writer.write(&payload), Err(Error::Unsafe { .. })));
    /// assert_eq!(std::fs::read_dir(&outside)?.count(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    /// The paths that must be real directories: every component below the root down to `dir`
    /// (just `dir` without a root, or when `dir` is not under it).
    fn checked_paths(&self) -> Vec<PathBuf> {
        let relative = self
            .root
            .as_deref()
            .and_then(|root| Some((root, self.dir.strip_prefix(root).ok()?)));
        match relative {
            Some((root, relative)) => {
                let mut path = root.to_owned();
                let mut paths = Vec::new();
                for component in relative.components() {
                    path.push(component);
                    paths.push(path.clone());
                }
                paths
            }
            None => vec![self.dir.clone()],
        }
    }

    /// Checks (and with `create`, creates mode 0755) every directory of [`Self::checked_paths`]
    /// without following a symlink. `Ok(false)`: a component is missing (only without `create`).
    fn ensure_real_dirs(&self, create: bool) -> Result<bool, Error> {
        if create {
            // The root (or, without one, the parent of `dir`) is trusted: created as usual.
            let top = match &self.root {
                Some(root) => Some(root.as_path()),
                None => self.dir.parent().filter(|p| !p.as_os_str().is_empty()),
            };
            if let Some(top) = top {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(top)
                    .map_err(io_err("create", top))?;
            }
        }
        for path in self.checked_paths() {
            let meta = match fs::symlink_metadata(&path) {
                Err(err) if err.kind() == io::ErrorKind::NotFound && create => {
                    // mkdir never follows a symlink in its last component.
                    match fs::DirBuilder::new().mode(0o755).create(&path) {
                        Ok(()) => {}
                        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(err) => return Err(io_err("create", &path)(err)),
                    }
                    fs::symlink_metadata(&path).map_err(io_err("inspect", &path))?
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(err) => return Err(io_err("inspect", &path)(err)),
                Ok(meta) => meta,
            };
            if meta.file_type().is_symlink() {
                return Err(Error::Unsafe {
                    path,
                    reason: "it is a symbolic link",
                });
            }
            if !meta.is_dir() {
                return Err(Error::Unsafe {
                    path,
                    reason: "it is not a directory",
                });
            }
        }
        Ok(true)
    }

    /// The managed directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the directory hold exactly `payload`: keys that are not in it are removed, and every
    /// generation but the new one is removed right after the commit (the consumer contract in the
    /// module docs).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] before anything is written; [`Error::Io`] naming the step and path.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use reload_lib::fs::{AtomicDirWriter, Error, FileContent};
    /// use std::collections::BTreeMap;
    ///
    /// let writer = AtomicDirWriter::new(dir.path().join("secret"));
    /// let payload = BTreeMap::from([("../escape".to_owned(), FileContent::new(b"x".to_vec(), 0o600))]);
    /// let err = writer.write(&payload).unwrap_err();
    /// assert!(matches!(err, Error::InvalidKey { ref key, .. } if key == "../escape"));
    /// assert!(!writer.dir().exists()); // nothing touched the disk
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, payload: &BTreeMap<String, FileContent>) -> Result<WriteOutcome, Error> {
        for key in payload.keys() {
            validate_key(key)?;
        }
        let dir = &self.dir;
        self.ensure_real_dirs(true)?;
        let previous = current_generation(dir);
        let previous_keys = match &previous {
            Some(generation) => list_files(&dir.join(generation))?,
            None => BTreeSet::new(),
        };

        if let Some(generation) = &previous
            && holds_exactly(&dir.join(generation), &previous_keys, payload)
        {
            self.link_keys(payload.keys())?;
            return Ok(WriteOutcome::Unchanged);
        }

        // Leftovers of earlier failed or interrupted writes first: on a full disk they are what
        // keeps it full. Only the generation `..data` points at is kept.
        self.prune(previous.as_deref())?;
        let generation = self.new_generation_dir()?;
        let generation_path = dir.join(&generation);
        let tmp = dir.join(layout::DATA_TMP);
        if let Err(err) = self.stage(payload, &generation, &generation_path, &tmp) {
            // Nothing was committed: remove what this write created, so a failure (disk full)
            // does not leave the disk fuller than it found it.
            let _ = fs::remove_file(&tmp);
            if let Err(cleanup) = fs::remove_dir_all(&generation_path) {
                tracing::warn!(path = %generation_path.display(), error = %cleanup, "cannot remove the generation of a failed write");
            }
            return Err(err);
        }

        self.link_keys(payload.keys())?;
        let removed_keys: Vec<String> = previous_keys
            .iter()
            .filter(|key| !payload.contains_key(*key))
            .cloned()
            .collect();
        for key in &removed_keys {
            let link = dir.join(key);
            if is_our_link(&link, key) {
                fs::remove_file(&link).map_err(io_err("remove", &link))?;
            }
        }
        // Removing the old generation at once is what tells file-watching consumers (module docs).
        self.prune(Some(&generation))?;
        sync_dir(dir)?;
        tracing::debug!(dir = %dir.display(), generation = %generation.display(), "committed");
        Ok(WriteOutcome::Written {
            generation: generation_path,
            removed_keys,
        })
    }

    /// Writes the new generation and commits it (the `..data` rename). An error means nothing
    /// was committed.
    fn stage(
        &self,
        payload: &BTreeMap<String, FileContent>,
        generation: &Path,
        generation_path: &Path,
        tmp: &Path,
    ) -> Result<(), Error> {
        for (key, content) in payload {
            write_new_file(&generation_path.join(key), content)?;
        }
        sync_dir(generation_path)?;
        // The commit: one rename switches every key at once.
        match fs::remove_file(tmp) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_err("remove", tmp)(err)),
        }
        symlink(generation, tmp).map_err(io_err("symlink", tmp))?;
        fs::rename(tmp, self.dir.join(layout::DATA)).map_err(io_err("rename", tmp))?;
        // After the rename the new generation is committed and must stay (it is what `..data`
        // points at), so a failed directory fsync is only reported.
        if let Err(err) = sync_dir(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %err, "committed, but the directory fsync failed");
        }
        Ok(())
    }

    /// Removes the managed directory and everything in it (the object was deleted). Returns
    /// whether there was anything to remove. Symlinks inside are removed, never followed.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use reload_lib::fs::{AtomicDirWriter, FileContent};
    /// use std::collections::BTreeMap;
    ///
    /// let writer = AtomicDirWriter::new(dir.path().join("secret"));
    /// writer.write(&BTreeMap::from([("token".to_owned(), FileContent::new(b"t".to_vec(), 0o600))]))?;
    /// assert!(writer.remove_all()?);
    /// assert!(!writer.remove_all()?); // already gone
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] when the removal fails.
    pub fn remove_all(&self) -> Result<bool, Error> {
        if !self.ensure_real_dirs(false)? {
            return Ok(false);
        }
        match fs::symlink_metadata(&self.dir) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(io_err("inspect", &self.dir)(err)),
            Ok(meta) if !meta.is_dir() => Err(Error::Io {
                step: "remove",
                path: self.dir.clone(),
                source: io::Error::other("not a directory"),
            }),
            Ok(_) => {
                fs::remove_dir_all(&self.dir).map_err(io_err("remove", &self.dir))?;
                if let Some(parent) = self.dir.parent() {
                    sync_dir(parent)?;
                }
                Ok(true)
            }
        }
    }

    fn new_generation_dir(&self) -> Result<PathBuf, Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        for attempt in 0u32.. {
            let name = layout::generation_name(now.as_secs() as i64, now.subsec_nanos(), attempt);
            let path = self.dir.join(&name);
            match fs::DirBuilder::new().mode(0o755).create(&path) {
                Ok(()) => {
                    // The umask may have narrowed it.
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                        .map_err(io_err("chmod", &path))?;
                    return Ok(name);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists && attempt < 1000 => {
                    continue;
                }
                Err(err) => return Err(io_err("create", &path)(err)),
            }
        }
        unreachable!("the loop returns or fails")
    }

    /// Ensures `key -> ..data/key` for every key; a plain file in the way (an installer's layout)
    /// is replaced by rename, so the path never disappears.
    fn link_keys<'a>(&self, keys: impl Iterator<Item = &'a String>) -> Result<(), Error> {
        for key in keys {
            let link = self.dir.join(key);
            if is_our_link(&link, key) {
                continue;
            }
            let target = layout::key_link_target(key);
            match fs::symlink_metadata(&link) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    symlink(&target, &link).map_err(io_err("symlink", &link))?;
                }
                Err(err) => return Err(io_err("inspect", &link)(err)),
                Ok(meta) if meta.is_dir() => {
                    return Err(Error::Io {
                        step: "link",
                        path: link,
                        source: io::Error::other("a directory is in the way of the key link"),
                    });
                }
                Ok(_) => {
                    let tmp = self.dir.join(layout::LINK_TMP);
                    let _ = fs::remove_file(&tmp);
                    symlink(&target, &tmp).map_err(io_err("symlink", &tmp))?;
                    fs::rename(&tmp, &link).map_err(io_err("rename", &tmp))?;
                }
            }
        }
        Ok(())
    }

    /// Removes every `..*` generation directory except `keep` (the previous generation, older
    /// ones, and orphans of interrupted writes).
    fn prune(&self, keep: Option<&Path>) -> Result<(), Error> {
        let entries = fs::read_dir(&self.dir).map_err(io_err("list", &self.dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err("list", &self.dir))?;
            let name = PathBuf::from(entry.file_name());
            let Some(text) = name.to_str() else { continue };
            if !layout::is_internal(name.as_os_str())
                || text == layout::DATA
                || Some(name.as_path()) == keep
            {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                fs::remove_dir_all(&path).map_err(io_err("remove", &path))?;
            } else if text == layout::DATA_TMP || text == layout::LINK_TMP {
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
            }
        }
        Ok(())
    }
}

fn is_our_link(link: &Path, key: &str) -> bool {
    fs::read_link(link).is_ok_and(|target| target == layout::key_link_target(key))
}

fn list_files(dir: &Path) -> Result<BTreeSet<String>, Error> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.insert(name);
        }
    }
    Ok(names)
}

/// Whether `generation` holds exactly the keys, bytes and modes of `payload`.
fn holds_exactly(
    generation: &Path,
    keys: &BTreeSet<String>,
    payload: &BTreeMap<String, FileContent>,
) -> bool {
    keys.len() == payload.len()
        && payload.iter().all(|(key, content)| {
            let path = generation.join(key);
            let mode_matches = fs::symlink_metadata(&path).is_ok_and(|meta| {
                meta.is_file() && meta.permissions().mode() & 0o7777 == content.mode()
            });
            mode_matches && fs::read(&path).is_ok_and(|bytes| bytes == content.bytes())
        })
}

#[cfg(test)]
mod tests;
