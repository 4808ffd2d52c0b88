//! The on-disk layout of Kubernetes Secret and ConfigMap volumes (the kubelet's `AtomicWriter`
//! protocol), named once for the three parts of the crate that depend on it:
//!
//! - the writer ([`fs::AtomicDirWriter`](crate::fs::AtomicDirWriter)) creates it;
//! - the reader (`source::PassReader`) reads a certificate and its key through one generation;
//! - the watcher (`watch`) tells the writer's machinery from the files of interest.
//!
//! ```text
//! dir/..2026_11_22_18_40_20.123456789   a generation directory: the real files
//! dir/..data -> ..2026_11_22_18_40_20.123456789   the commit point (one rename)
//! dir/..data_tmp                        the new `..data`, staged before that rename
//! dir/tls.crt -> ..data/tls.crt         one link per key
//! ```
//!
//! Every name the writer uses starts with `..`; keys never do (see
//! [`fs::validate_key`](crate::fs::validate_key)), so the two namespaces cannot collide.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

/// The commit point: a symlink to the current generation directory.
pub(crate) const DATA: &str = "..data";
/// The next `..data`, staged and renamed over it.
pub(crate) const DATA_TMP: &str = "..data_tmp";
/// A key link staged and renamed over a plain file in the way.
pub(crate) const LINK_TMP: &str = "..link_tmp";
/// What every name of the writer starts with.
const PREFIX: &str = "..";

/// Whether `name` belongs to the writer: a generation directory, `..data` or a staged link.
pub(crate) fn is_internal(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(PREFIX.as_bytes())
}

/// Whether `name` can be a generation directory (a `..name` that is not one of the links).
pub(crate) fn is_generation(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.starts_with(PREFIX) && n.len() > 2 && n != DATA && n != DATA_TMP)
}

/// What a key's link points to: `..data/<key>`.
pub(crate) fn key_link_target(key: &str) -> PathBuf {
    Path::new(DATA).join(key)
}

/// The rest of a link target that goes through `..data` (`..data/tls.crt` → `tls.crt`).
pub(crate) fn through_data(target: &Path) -> Option<&Path> {
    target.strip_prefix(DATA).ok()
}

/// The generation directory `dir/..data` points to, if it is a plain `..name` in `dir` (anything
/// else is not the kubelet layout: the reader lets the kernel resolve it, and the writer never
/// follows it).
pub(crate) fn current_generation(dir: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(dir.join(DATA)).ok()?;
    let mut components = target.components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(name)), None) if is_generation(name) => Some(target),
        _ => None,
    }
}

/// The name of a generation directory written at `secs.nanos` since the Unix epoch, as the
/// kubelet names them (`..2026_11_22_18_40_20.123456789`), with `-attempt` when that name is
/// taken.
pub(crate) fn generation_name(secs: i64, nanos: u32, attempt: u32) -> PathBuf {
    let stamp = crate::material::rfc3339(secs)
        .replace(['-', ':', 'T'], "_")
        .trim_end_matches('Z')
        .to_owned();
    let suffix = if attempt == 0 {
        String::new()
    } else {
        format!("-{attempt}")
    };
    PathBuf::from(format!("{PREFIX}{stamp}.{nanos:09}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn generation_names_are_internal_and_recognised() {
        let name = generation_name(1_795_000_000, 42, 0);
        assert_eq!(name.to_str(), Some("..2026_11_18_11_06_40.000000042"));
        assert!(is_generation(name.as_os_str()) && is_internal(name.as_os_str()));
        assert!(generation_name(0, 0, 3).to_str().unwrap().ends_with("-3"));
        for link in [DATA, DATA_TMP] {
            assert!(is_internal(OsStr::new(link)) && !is_generation(OsStr::new(link)));
        }
        assert!(!is_internal(OsStr::new("tls.crt")) && !is_generation(OsStr::new("..")));
        assert_eq!(
            through_data(&key_link_target("tls.crt")),
            Some(Path::new("tls.crt"))
        );
        assert_eq!(through_data(Path::new("../tls.crt")), None);
    }

    #[test]
    fn only_a_generation_inside_the_directory_is_current() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(current_generation(dir.path()), None);
        symlink("..gen1", dir.path().join(DATA)).unwrap();
        assert_eq!(
            current_generation(dir.path()),
            Some(PathBuf::from("..gen1"))
        );
        std::fs::remove_file(dir.path().join(DATA)).unwrap();
        symlink("/etc", dir.path().join(DATA)).unwrap();
        assert_eq!(current_generation(dir.path()), None);
        std::fs::remove_file(dir.path().join(DATA)).unwrap();
        symlink("..gen1/sub", dir.path().join(DATA)).unwrap();
        assert_eq!(current_generation(dir.path()), None);
    }
}
