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
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::source::current_generation;

/// The longest key accepted, in bytes (a DNS subdomain: the apiserver's own limit for keys).
///
/// ```
/// use reload_lib::fs::{MAX_KEY_LEN, validate_key};
/// assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
/// assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
/// ```
pub const MAX_KEY_LEN: usize = 253;

/// The content and mode of one file. `Debug` shows the length only: the bytes may be a private
/// key.
///
/// ```
/// use reload_lib::fs::FileContent;
///
/// let key = FileContent::new(b"-----BEGIN PRIVATE KEY-----".to_vec(), 0o600);
/// assert_eq!(format!("{key:?}"), "FileContent { len: 27, mode: 600 }");
/// // Only permission bits are kept: no file type, never more than 0o7777.
/// assert_eq!(FileContent::new(Vec::new(), 0o100644).mode(), 0o644);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct FileContent {
    bytes: Vec<u8>,
    mode: u32,
}

impl std::fmt::Debug for FileContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileContent")
            .field("len", &self.bytes.len())
            .field("mode", &format_args!("{:o}", self.mode))
            .finish()
    }
}

impl FileContent {
    /// `bytes` to be written with permission bits `mode` (e.g. `0o600` for keys, `0o644` for
    /// certificates); bits above `0o7777` are dropped.
    pub fn new(bytes: Vec<u8>, mode: u32) -> Self {
        Self {
            bytes,
            mode: mode & 0o7777,
        }
    }

    /// The content.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The permission bits.
    pub fn mode(&self) -> u32 {
        self.mode
    }
}

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

/// Errors of the atomic writers. See [`AtomicDirWriter::write`] for an example.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key cannot be a file name here; nothing was written.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as received.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A filesystem step failed. A failure before the commit leaves the previous generation in
    /// place; after it, the new one is committed and only clean-up is incomplete.
    #[error("failed to {step} {path}")]
    Io {
        /// The step (e.g. `write`, `rename`).
        step: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        step,
        path: path.to_owned(),
        source,
    }
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
    } else if key.starts_with("..") {
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
}

impl AtomicDirWriter {
    /// A writer for `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
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
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(io_err("create", dir))?;
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

        let generation = self.new_generation_dir()?;
        let generation_path = dir.join(&generation);
        for (key, content) in payload {
            write_new_file(&generation_path.join(key), content)?;
        }
        sync_dir(&generation_path)?;

        // The commit: one rename switches every key at once.
        let tmp = dir.join("..data_tmp");
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_err("remove", &tmp)(err)),
        }
        symlink(&generation, &tmp).map_err(io_err("symlink", &tmp))?;
        fs::rename(&tmp, dir.join("..data")).map_err(io_err("rename", &tmp))?;
        sync_dir(dir)?;

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
        self.prune(&generation)?;
        sync_dir(dir)?;
        tracing::debug!(dir = %dir.display(), generation = %generation.display(), "committed");
        Ok(WriteOutcome::Written {
            generation: generation_path,
            removed_keys,
        })
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
        let stamp = crate::material::rfc3339(now.as_secs() as i64)
            .replace(['-', ':', 'T'], "_")
            .trim_end_matches('Z')
            .to_owned();
        for attempt in 0u32.. {
            let name = PathBuf::from(format!(
                "..{stamp}.{:09}{}",
                now.subsec_nanos(),
                suffix(attempt)
            ));
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
            let target = Path::new("..data").join(key);
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
                    let tmp = self.dir.join("..link_tmp");
                    let _ = fs::remove_file(&tmp);
                    symlink(&target, &tmp).map_err(io_err("symlink", &tmp))?;
                    fs::rename(&tmp, &link).map_err(io_err("rename", &tmp))?;
                }
            }
        }
        Ok(())
    }

    /// Removes every `..*` generation directory except the new one (the previous generation,
    /// older ones, and orphans of interrupted writes).
    fn prune(&self, keep_new: &Path) -> Result<(), Error> {
        let entries = fs::read_dir(&self.dir).map_err(io_err("list", &self.dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err("list", &self.dir))?;
            let name = PathBuf::from(entry.file_name());
            let Some(text) = name.to_str() else { continue };
            if !text.starts_with("..") || text == "..data" || name == keep_new {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                fs::remove_dir_all(&path).map_err(io_err("remove", &path))?;
            } else if text == "..data_tmp" || text == "..link_tmp" {
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
            }
        }
        Ok(())
    }
}

fn suffix(attempt: u32) -> String {
    if attempt == 0 {
        String::new()
    } else {
        format!("-{attempt}")
    }
}

fn is_our_link(link: &Path, key: &str) -> bool {
    fs::read_link(link).is_ok_and(|target| target == Path::new("..data").join(key))
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
                meta.is_file() && meta.permissions().mode() & 0o7777 == content.mode
            });
            mode_matches && fs::read(&path).is_ok_and(|bytes| bytes == content.bytes)
        })
}

/// Creates `path` (it must not exist) with `content`'s mode from the start, sets the exact mode
/// (the umask may have narrowed it), writes and fsyncs.
fn write_new_file(path: &Path, content: &FileContent) -> Result<(), Error> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(content.mode)
        .open(path)
        .map_err(io_err("create", path))?;
    file.set_permissions(fs::Permissions::from_mode(content.mode))
        .map_err(io_err("chmod", path))?;
    file.write_all(&content.bytes)
        .map_err(io_err("write", path))?;
    file.sync_all().map_err(io_err("fsync", path))?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

/// Replaces one file atomically: a temporary file in the same directory (created with `mode`),
/// fsync, rename over `path`, fsync the directory. Returns `false` without writing when `path`
/// already holds `bytes` with `mode`.
///
/// # Errors
/// [`Error::Io`] naming the step; on failure `path` is untouched.
///
/// # Security
/// The temporary file is created exclusively with `mode` (then chmod-ed to exactly `mode`), so
/// the content is never readable with wider permissions, and readers see the old file or the
/// new one, never a partial write.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use reload_lib::fs::write_file_atomic;
/// use std::os::unix::fs::PermissionsExt;
///
/// let path = dir.path().join("tls.key");
/// assert!(write_file_atomic(&path, b"key PEM", 0o600)?);
/// assert!(!write_file_atomic(&path, b"key PEM", 0o600)?); // already there: not written
/// assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o7777, 0o600);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_file_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, Error> {
    let mode = mode & 0o7777;
    if let Ok(meta) = fs::metadata(path)
        && meta.is_file()
        && meta.permissions().mode() & 0o7777 == mode
        && fs::read(path).is_ok_and(|current| current == bytes)
    {
        return Ok(false);
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| Error::Io {
        step: "write",
        path: path.to_owned(),
        source: io::Error::other("not a file path"),
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    let result = write_new_file(&tmp, &FileContent::new(bytes.to_vec(), mode))
        .and_then(|()| fs::rename(&tmp, path).map_err(io_err("rename", &tmp)))
        .and_then(|()| sync_dir(dir));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(entries: &[(&str, &str, u32)]) -> BTreeMap<String, FileContent> {
        entries
            .iter()
            .map(|(k, v, m)| (k.to_string(), FileContent::new(v.as_bytes().to_vec(), *m)))
            .collect()
    }

    fn generations(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("..") && n != "..data")
            .collect();
        names.sort();
        names
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_first_write_creates_the_kubelet_layout_with_exact_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("secrets/serving");
        let writer = AtomicDirWriter::new(&dir);
        let outcome = writer
            .write(&payload(&[
                ("tls.crt", "cert", 0o600),
                ("ca.crt", "ca", 0o644),
            ]))
            .unwrap();
        assert!(matches!(outcome, WriteOutcome::Written { .. }));
        assert_eq!(
            fs::read_link(dir.join("tls.crt")).unwrap(),
            Path::new("..data/tls.crt")
        );
        assert_eq!(fs::read(dir.join("tls.crt")).unwrap(), b"cert");
        assert_eq!(mode(&dir.join("tls.crt")), 0o600);
        assert_eq!(mode(&dir.join("ca.crt")), 0o644);
        assert_eq!(mode(&dir.join("..data")), 0o755);
    }

    #[test]
    fn unchanged_content_writes_nothing_and_repairs_missing_links() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = AtomicDirWriter::new(tmp.path());
        let content = payload(&[("a", "1", 0o600)]);
        writer.write(&content).unwrap();
        let before = generations(tmp.path());
        fs::remove_file(tmp.path().join("a")).unwrap();
        assert_eq!(writer.write(&content).unwrap(), WriteOutcome::Unchanged);
        assert_eq!(generations(tmp.path()), before);
        assert_eq!(fs::read(tmp.path().join("a")).unwrap(), b"1");
        // A mode change is a change.
        assert!(matches!(
            writer.write(&payload(&[("a", "1", 0o644)])).unwrap(),
            WriteOutcome::Written { .. }
        ));
    }

    #[test]
    fn the_previous_generation_is_removed_right_after_the_swap() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = AtomicDirWriter::new(tmp.path());
        for i in 0..5 {
            writer
                .write(&payload(&[("a", &i.to_string(), 0o600)]))
                .unwrap();
            assert_eq!(generations(tmp.path()).len(), 1, "after write {i}");
        }
        assert_eq!(fs::read(tmp.path().join("a")).unwrap(), b"4");
    }

    #[test]
    fn keys_that_left_the_object_are_pruned() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = AtomicDirWriter::new(tmp.path());
        writer
            .write(&payload(&[("a", "1", 0o600), ("b", "2", 0o600)]))
            .unwrap();
        let outcome = writer.write(&payload(&[("a", "1", 0o600)])).unwrap();
        assert!(
            matches!(outcome, WriteOutcome::Written { ref removed_keys, .. } if removed_keys == &["b".to_owned()])
        );
        assert!(fs::symlink_metadata(tmp.path().join("b")).is_err());
    }

    #[test]
    fn bad_keys_are_rejected_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("obj");
        let writer = AtomicDirWriter::new(&dir);
        for key in [
            "../x",
            "..data",
            "a/b",
            "",
            ".",
            "..",
            "a\0b",
            &"k".repeat(254),
        ] {
            let err = writer
                .write(&payload(&[("ok", "1", 0o600), (key, "2", 0o600)]))
                .unwrap_err();
            assert!(matches!(err, Error::InvalidKey { .. }), "{key:?}: {err}");
            assert!(!dir.exists(), "{key:?} wrote something");
        }
        assert!(!tmp.path().join("x").exists());
    }

    #[test]
    fn a_plain_directory_is_migrated_without_a_missing_key() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("tls.crt"), "installer").unwrap();
        fs::write(tmp.path().join("unrelated"), "keep me").unwrap();
        let writer = AtomicDirWriter::new(tmp.path());
        writer
            .write(&payload(&[("tls.crt", "synced", 0o600)]))
            .unwrap();
        assert!(
            fs::symlink_metadata(tmp.path().join("tls.crt"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(tmp.path().join("tls.crt")).unwrap(), b"synced");
        assert_eq!(fs::read(tmp.path().join("unrelated")).unwrap(), b"keep me");
    }

    #[test]
    fn a_data_link_pointing_outside_is_never_followed_for_deletion() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("precious"), "x").unwrap();
        let dir = tmp.path().join("obj");
        fs::create_dir(&dir).unwrap();
        symlink(&outside, dir.join("..data")).unwrap();
        AtomicDirWriter::new(&dir)
            .write(&payload(&[("a", "1", 0o600)]))
            .unwrap();
        AtomicDirWriter::new(&dir)
            .write(&payload(&[("a", "2", 0o600)]))
            .unwrap();
        assert_eq!(fs::read(outside.join("precious")).unwrap(), b"x");
        assert_eq!(fs::read(dir.join("a")).unwrap(), b"2");
    }

    #[test]
    fn leftovers_of_an_interrupted_write_are_cleaned_up() {
        let tmp = tempfile::tempdir().unwrap();
        let writer = AtomicDirWriter::new(tmp.path());
        writer.write(&payload(&[("a", "1", 0o600)])).unwrap();
        fs::create_dir(tmp.path().join("..orphan")).unwrap();
        symlink("..orphan", tmp.path().join("..data_tmp")).unwrap();
        writer.write(&payload(&[("a", "2", 0o600)])).unwrap();
        assert!(!tmp.path().join("..orphan").exists());
        assert!(fs::symlink_metadata(tmp.path().join("..data_tmp")).is_err());
    }

    #[test]
    fn a_single_file_is_replaced_atomically_and_keeps_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("kubelet-ca.crt");
        assert!(write_file_atomic(&path, b"one", 0o644).unwrap());
        assert!(!write_file_atomic(&path, b"one", 0o644).unwrap());
        assert!(write_file_atomic(&path, b"two", 0o644).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o644);
        assert_eq!(
            fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    #[test]
    fn a_reader_never_sees_two_generations_mixed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let writer = AtomicDirWriter::new(&dir);
        writer
            .write(&payload(&[("cert", "0", 0o600), ("key", "0", 0o600)]))
            .unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (dir, done) = (dir.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut pass = crate::source::PassReader::default();
                    let (Ok(cert), Ok(key)) =
                        (pass.read(&dir.join("cert")), pass.read(&dir.join("key")))
                    else {
                        continue;
                    };
                    assert_eq!(cert, key, "mixed generations");
                    reads += 1;
                }
                reads
            })
        };
        for i in 1..=500 {
            let n = i.to_string();
            writer
                .write(&payload(&[("cert", &n, 0o600), ("key", &n, 0o600)]))
                .unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
