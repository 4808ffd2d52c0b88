//! One file replaced by a temporary file renamed over it: the write every other helper of the
//! kit builds on. A leaf (no other module of the kit).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through `<path>.tmp` renamed into place, creating the parent
/// directories; the file gets the default mode (0644 under the usual umask).
///
/// # Panics
/// On I/O errors, naming the path.
pub fn rename_into(path: &Path, bytes: &[u8]) {
    write_renamed(path, bytes, None);
}

/// [`rename_into`] with the file's mode set before the rename (0600 for keys).
///
/// # Panics
/// On I/O errors, naming the path.
pub fn rename_into_with_mode(path: &Path, bytes: &[u8], mode: u32) {
    write_renamed(path, bytes, Some(mode));
}

fn write_renamed(path: &Path, bytes: &[u8], mode: Option<u32>) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .unwrap_or_else(|err| panic!("cannot create {}: {err}", parent.display()));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)
        .unwrap_or_else(|err| panic!("cannot write {}: {err}", tmp.display()));
    if let Some(mode) = mode {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|err| panic!("cannot chmod {}: {err}", tmp.display()));
    }
    std::fs::rename(&tmp, path).unwrap_or_else(|err| {
        panic!(
            "cannot rename {} to {}: {err}",
            tmp.display(),
            path.display()
        )
    });
}
