//! Reading the small files cert-syncer is configured with (the bearer token, the CA bundle, the
//! kubeconfig) and node mode's host file: regular files only, size-capped, never blocking.
//!
//! A FIFO, a character device or a directory at such a path would block `read` forever (a FIFO
//! with no writer blocks even `open`) or feed it without end; the process would hang at
//! start-up with no log line. So the file is opened non-blocking, checked with `fstat` on the
//! opened descriptor (no race with a rename in between), and read up to a cap.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Largest token file accepted (service-account tokens are about 1 KiB).
pub const MAX_TOKEN_FILE: u64 = 64 * 1024;
/// Largest CA bundle or kubeconfig accepted.
pub const MAX_CONFIG_FILE: u64 = 8 * 1024 * 1024;

/// The bytes of the regular file at `path` (symlinks followed) and its metadata, or why not:
/// the message names `what` and the path, never the content.
pub fn read(what: &str, path: &Path, max: u64) -> Result<(Vec<u8>, Metadata), String> {
    let file = open(path).map_err(|err| format!("cannot read {what} {}: {err}", path.display()))?;
    read_open(what, path, file, max)
}

/// [`read`], with `Ok(None)` when nothing is at `path` (a file that may legitimately be absent,
/// such as node mode's host file before its first write).
pub fn read_if_exists(
    what: &str,
    path: &Path,
    max: u64,
) -> Result<Option<(Vec<u8>, Metadata)>, String> {
    match open(path) {
        Ok(file) => read_open(what, path, file, max).map(Some),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("cannot read {what} {}: {err}", path.display())),
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        // O_NONBLOCK: opening a FIFO without a writer returns at once instead of blocking.
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

fn read_open(what: &str, path: &Path, file: File, max: u64) -> Result<(Vec<u8>, Metadata), String> {
    let shown = path.display();
    let meta = check(what, path, &file, max)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The cap holds even if the file grows between fstat and read.
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot read {what} {shown}: {err}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("{what} {shown} is larger than {max} bytes"));
    }
    Ok((bytes, meta))
}

/// Checks that `path` is a regular file of at most `max` bytes without reading it.
pub fn check_path(what: &str, path: &Path, max: u64) -> Result<Metadata, String> {
    let file = open(path).map_err(|err| format!("cannot read {what} {}: {err}", path.display()))?;
    check(what, path, &file, max)
}

fn check(what: &str, path: &Path, file: &File, max: u64) -> Result<Metadata, String> {
    let shown = path.display();
    let meta = file
        .metadata()
        .map_err(|err| format!("cannot read {what} {shown}: {err}"))?;
    if !meta.is_file() {
        return Err(format!(
            "{what} {shown} is not a regular file ({}); refusing to read it",
            file_type(&meta)
        ));
    }
    if meta.len() > max {
        return Err(format!(
            "{what} {shown} is {} bytes, more than the {max} accepted",
            meta.len()
        ));
    }
    Ok(meta)
}

fn file_type(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_directory_and_a_device_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        // Would block forever in a plain `open` + `read`.
        let err = read("token file", &fifo, MAX_TOKEN_FILE).unwrap_err();
        assert!(
            err.contains("a FIFO") && err.contains("token file"),
            "{err}"
        );
        let err = read("CA file", dir.path(), MAX_CONFIG_FILE).unwrap_err();
        assert!(err.contains("a directory"), "{err}");
        let err = read("CA file", Path::new("/dev/zero"), MAX_CONFIG_FILE).unwrap_err();
        assert!(err.contains("character device"), "{err}");
    }

    #[test]
    fn a_file_over_the_cap_is_refused_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cr3t".repeat(20)).unwrap();
        let err = read("token file", &path, 16).unwrap_err();
        assert!(
            err.contains("more than the 16") && !err.contains("s3cr3t"),
            "{err}"
        );
        let (bytes, meta) = read("token file", &path, 1024).unwrap();
        assert_eq!(bytes.len(), 120);
        assert!(meta.is_file());
    }
}
