//! Directories into groups: one group per directory that holds files, recursively.
//!
//! A directory with the kubelet `..data` layout (what `sync` writes for each object) is read
//! through the generation `..data` points to, resolved once, so its files are one consistent
//! set even while a writer swaps in the next one. Names starting with `..` (the layout's own
//! machinery) are skipped everywhere. Symbolic links to files are followed; symbolic links to
//! directories are not (no loops, no escaping the tree), and neither are sockets or FIFOs
//! (reading one could block).

use std::path::{Path, PathBuf};

use super::source::{Entry, Group, Origin};
use crate::base::error::ConfigError;

/// Deeper than any resource directory; stops pathological trees.
const MAX_DEPTH: usize = 16;
/// A CA bundle of every public root is about 200 KiB; anything far larger is not material.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Every directory under `root` (included) that holds files, in name order, parents first.
///
/// # Errors
/// When `root` is not a readable directory (a bad flag: exit code 2). Problems below it become
/// entries that say what is wrong.
pub(super) fn directory(root: &Path) -> Result<Vec<Group>, ConfigError> {
    let metadata = std::fs::metadata(root)
        .map_err(|err| ConfigError(format!("--dir {}: {err}", root.display())))?;
    if !metadata.is_dir() {
        return Err(ConfigError(format!(
            "--dir {}: not a directory",
            root.display()
        )));
    }
    std::fs::read_dir(root)
        .map_err(|err| ConfigError(format!("--dir {}: {err}", root.display())))?;
    let mut groups = Vec::new();
    walk(root, 0, &mut groups);
    Ok(groups)
}

fn walk(dir: &Path, depth: usize, groups: &mut Vec<Group>) {
    if let Some(generation) = reload_lib::fs::current_generation(dir) {
        let generation_dir = dir.join(generation);
        let entries = match visible_names(&generation_dir) {
            Ok(names) => names
                .into_iter()
                .filter(|(_, path)| is_regular_file(path))
                .map(|(name, path)| read_entry(name, &path))
                .collect(),
            Err(err) => vec![unlistable(&generation_dir, &err)],
        };
        push(groups, dir, entries);
        return;
    }
    let names = match visible_names(dir) {
        Ok(names) => names,
        Err(err) => {
            let parent = dir.parent().unwrap_or(dir);
            push(groups, parent, vec![unlistable(dir, &err)]);
            return;
        }
    };
    let mut entries = Vec::new();
    let mut subdirs = Vec::new();
    for (name, path) in names {
        let Ok(link) = std::fs::symlink_metadata(&path) else {
            continue; // gone since the listing
        };
        if link.is_dir() {
            subdirs.push(path);
        } else if is_regular_file(&path) {
            entries.push(read_entry(name, &path));
        }
    }
    push(groups, dir, entries);
    if depth < MAX_DEPTH {
        for subdir in subdirs {
            walk(&subdir, depth + 1, groups);
        }
    }
}

fn push(groups: &mut Vec<Group>, dir: &Path, entries: Vec<Entry>) {
    if !entries.is_empty() {
        groups.push(Group {
            origin: Origin::Dir(dir.to_owned()),
            entries,
        });
    }
}

/// The names in `dir` that are not `..`-prefixed, sorted, with their paths.
fn visible_names(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut names = Vec::new();
    for item in std::fs::read_dir(dir)? {
        let item = item?;
        let name = item.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") {
            names.push((name, item.path()));
        }
    }
    names.sort();
    Ok(names)
}

/// A regular file, or a symbolic link to one.
fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

fn read_entry(name: String, path: &Path) -> Entry {
    let bytes = match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE_BYTES => Err(format!(
            "{} bytes: too large to be certificate material",
            m.len()
        )),
        _ => std::fs::read(path).map_err(|err| format!("cannot read: {err}")),
    };
    Entry { name, bytes }
}

fn unlistable(dir: &Path, err: &std::io::Error) -> Entry {
    Entry {
        name: dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        bytes: Err(format!("cannot list the directory: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn names(group: &Group) -> Vec<&str> {
        group.entries.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn a_kubelet_layout_is_read_through_its_current_generation_only() {
        let tmp = tempfile::tempdir().unwrap();
        let object = tmp.path().join("secrets/serving");
        std::fs::create_dir_all(object.join("..gen1")).unwrap();
        std::fs::create_dir_all(object.join("..gen2")).unwrap();
        std::fs::write(object.join("..gen1/tls.crt"), "old").unwrap();
        std::fs::write(object.join("..gen2/tls.crt"), "new").unwrap();
        std::fs::write(object.join("..gen2/tls.key"), "key").unwrap();
        symlink("..gen2", object.join("..data")).unwrap();
        symlink("..data/tls.crt", object.join("tls.crt")).unwrap();
        symlink("..data/tls.key", object.join("tls.key")).unwrap();

        let groups = directory(tmp.path()).unwrap();
        assert_eq!(groups.len(), 1);
        let Origin::Dir(dir) = &groups[0].origin else {
            panic!("a directory")
        };
        assert_eq!(dir, &object);
        assert_eq!(names(&groups[0]), ["tls.crt", "tls.key"]);
        assert_eq!(groups[0].entries[0].bytes.as_deref().unwrap(), b"new");
    }

    #[test]
    fn plain_directories_are_walked_in_name_order_without_following_directory_links() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("b")).unwrap();
        std::fs::write(tmp.path().join("b/x.crt"), "x").unwrap();
        std::fs::write(tmp.path().join("a.crt"), "a").unwrap();
        std::fs::write(tmp.path().join("..hidden"), "h").unwrap();
        symlink(tmp.path(), tmp.path().join("loop")).unwrap();

        let groups = directory(tmp.path()).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(names(&groups[0]), ["a.crt"]);
        assert_eq!(names(&groups[1]), ["x.crt"]);
    }

    #[test]
    fn a_missing_root_is_a_config_error_naming_it() {
        let err = directory(Path::new("/nonexistent/inspect-root")).unwrap_err();
        assert!(err.0.contains("/nonexistent/inspect-root"), "{err}");
    }
}
