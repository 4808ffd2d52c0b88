//! Reading material files safely: regular files only (a FIFO, a device such as `/dev/zero`, a
//! directory or a socket at a watched path is refused without blocking), at most a configured
//! size (a huge file is refused before it is read), and never any of the content in an error.
//! Reads run on the crate's own runtime thread (the start-up pass on its blocking pool), watched
//! for the set's read timeout (see `reload` and `runtime`), so nothing here can stall the
//! caller's async workers.

use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Default cap on the size of one file: far above any certificate chain, key or CA bundle
/// (a Kubernetes Secret holds at most 1 MiB), far below what would hurt memory.
pub(crate) const DEFAULT_MAX_FILE_SIZE: u64 = 4 << 20;

/// Reads the regular file at `path` (symlinks followed), refusing anything else and anything
/// larger than `max_size` bytes.
pub(crate) fn read_regular(path: &Path, max_size: u64) -> std::io::Result<Vec<u8>> {
    read_open(open(path, 0)?, max_size)
}

/// [`read_regular`] when `path` itself is not a symlink; `Ok(None)` when it is (its parent
/// directories' symlinks are followed). Lets a reader that treats some symlinks specially (the
/// kubelet's `..data` links) skip a `readlink` for plain files, the usual case.
pub(crate) fn read_regular_unless_symlink(
    path: &Path,
    max_size: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    match open(path, libc::O_NOFOLLOW) {
        Ok(file) => read_open(file, max_size).map(Some),
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => Ok(None),
        Err(err) => Err(err),
    }
}

fn open(path: &Path, flags: i32) -> std::io::Result<std::fs::File> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
    // changes nothing for regular files. The type is checked on the open descriptor, so a swap
    // between a check and the open cannot slip a FIFO through.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | flags)
        .open(path)
}

fn read_open(mut file: std::fs::File, max_size: u64) -> std::io::Result<Vec<u8>> {
    let metadata = file.metadata()?;
    let kind = metadata.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file: {what}"),
        ));
    }
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the limit of {max_size} bytes"),
        )
    };
    if metadata.len() > max_size {
        return Err(too_large());
    }
    // One read of one byte more than the size: when exactly the size comes back, that is the
    // whole file (a regular file's read falls short only at its end), and the second read that
    // `read_to_end` makes to see the end (it returns 0) is saved, one system call per file.
    // Anything else (the file grew or shrank meanwhile, a pseudo-file whose size says nothing)
    // is read on to its end, never past the cap.
    let size = metadata.len();
    let mut bytes = vec![0; size as usize + 1];
    let first = loop {
        match file.read(&mut bytes) {
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            read => break read?,
        }
    };
    bytes.truncate(first);
    if first as u64 == size {
        return Ok(bytes);
    }
    file.take((max_size + 1).saturating_sub(first as u64))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_size {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        assert!(
            read_regular(&file, 4)
                .unwrap_err()
                .to_string()
                .contains("limit")
        );
        assert!(
            read_regular(dir.path(), 5)
                .unwrap_err()
                .to_string()
                .contains("directory")
        );
        assert!(
            read_regular(Path::new("/dev/zero"), 5)
                .unwrap_err()
                .to_string()
                .contains("character device")
        );
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(
            read_regular(&fifo, 5)
                .unwrap_err()
                .to_string()
                .contains("FIFO")
        );
        assert!(
            read_regular_unless_symlink(&fifo, 5)
                .unwrap_err()
                .to_string()
                .contains("FIFO")
        );
    }

    #[test]
    fn a_file_whose_size_says_nothing_is_read_to_its_end_and_capped() {
        // A pseudo-file: a regular file of size 0 whose content is made as it is read.
        let status = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(status).unwrap().len(), 0);
        let bytes = read_regular(status, 1 << 20).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("VmRSS:"), "read whole: {} bytes", text.len());
        assert!(
            read_regular(status, 10)
                .unwrap_err()
                .to_string()
                .contains("limit")
        );
        // An empty file and one of exactly the cap.
        let dir = tempfile::tempdir().unwrap();
        let (empty, full) = (dir.path().join("empty"), dir.path().join("full"));
        std::fs::write(&empty, b"").unwrap();
        std::fs::write(&full, [7u8; 64]).unwrap();
        assert!(read_regular(&empty, 5).unwrap().is_empty());
        assert_eq!(read_regular(&full, 64).unwrap(), [7u8; 64]);
    }

    #[test]
    fn a_symlink_is_left_to_the_caller_and_a_plain_file_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("f", &link).unwrap();
        assert_eq!(
            read_regular_unless_symlink(&file, 5).unwrap().unwrap(),
            b"12345"
        );
        assert!(read_regular_unless_symlink(&link, 5).unwrap().is_none());
        assert!(read_regular_unless_symlink(&dir.path().join("missing"), 5).is_err());
    }
}
