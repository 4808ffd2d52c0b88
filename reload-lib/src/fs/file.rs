//! Single files: their content and mode ([`FileContent`]), creating one with its final mode
//! and fsyncing it, and replacing one atomically ([`write_file_atomic`]). The primitives the
//! directory writer builds on, and the errors of both.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
/// Errors of the atomic writers. See [`AtomicDirWriter::write`](super::AtomicDirWriter::write)
/// for an example.
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
    /// A directory on the way to the managed directory (or the managed directory itself) is a
    /// symbolic link or not a directory: writing or removing through it could touch files
    /// outside the destination. Nothing was written or removed.
    #[error("refusing to write or remove through {path}: {reason}")]
    Unsafe {
        /// The offending path.
        path: PathBuf,
        /// What it is.
        reason: &'static str,
    },
    /// A filesystem step failed. A failure before the commit leaves the previous generation in
    /// place (and removes what the failed write created); after it, the new one is committed
    /// and only clean-up is incomplete.
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

pub(super) fn io_err<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        step,
        path: path.to_owned(),
        source,
    }
}
/// Creates `path` (it must not exist) with `content`'s mode from the start, sets the exact mode
/// (the umask may have narrowed it), writes and fsyncs.
pub(super) fn write_new_file(path: &Path, content: &FileContent) -> Result<(), Error> {
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

pub(super) fn sync_dir(dir: &Path) -> Result<(), Error> {
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
