//! The atomic directory writer (`reload_lib::fs`): key validation, and writes of fuzzed key sets
//! into a managed directory inside a temporary directory.
//!
//! Input (`arbitrary`): up to two payloads written one after the other (a write, then an update
//! that adds, changes and removes keys), each a map of key → (bytes, mode).
//!
//! Properties, besides no panic:
//! - `validate_key` accepts exactly the keys the module documents (one path component, not `.`
//!   or `..`, no `/` or NUL, not starting with `..`, 1 to 253 bytes);
//! - a payload with an invalid key fails with `InvalidKey` and touches nothing;
//! - after a successful write the directory holds exactly the payload (bytes and modes, read back
//!   through the key links), every key link resolves inside the managed directory, and nothing
//!   appears, changes or disappears outside it (a sentinel file and an empty sibling directory
//!   are checked).

#![no_main]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use reload_lib::fs::{AtomicDirWriter, Error, FileContent, MAX_KEY_LEN, validate_key};

#[derive(Debug, Arbitrary)]
struct Input {
    first: BTreeMap<String, (Vec<u8>, u16)>,
    second: Option<BTreeMap<String, (Vec<u8>, u16)>>,
}

const SENTINEL: &[u8] = b"outside the managed directory";

fn documented_valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key != "."
        && key != ".."
        && !key.contains('/')
        && !key.contains('\0')
        && !key.starts_with("..")
}

fn payload(map: &BTreeMap<String, (Vec<u8>, u16)>) -> BTreeMap<String, FileContent> {
    map.iter()
        .map(|(key, (bytes, mode))| {
            // Owner read/write always: the writer reads a generation back to detect no-ops.
            let mode = (u32::from(*mode) & 0o777) | 0o600;
            (key.clone(), FileContent::new(bytes.clone(), mode))
        })
        .collect()
}

/// Everything under `root` (relative paths), symlinks not followed.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("list") {
            let path = entry.expect("entry").path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if fs::symlink_metadata(&path).expect("stat").is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

fn check_outside(root: &Path, managed: &Path) {
    assert_eq!(fs::read(root.join("sentinel")).expect("sentinel"), SENTINEL);
    assert_eq!(tree(&root.join("sibling")), Vec::<String>::new());
    let mut top: Vec<_> = fs::read_dir(root)
        .expect("list root")
        .map(|e| e.expect("entry").file_name().into_string().unwrap())
        .collect();
    top.sort();
    let expected: Vec<String> = if managed.exists() {
        vec!["managed".into(), "sentinel".into(), "sibling".into()]
    } else {
        vec!["sentinel".into(), "sibling".into()]
    };
    assert_eq!(
        top, expected,
        "something was written outside the managed directory"
    );
}

fn write_and_check(writer: &AtomicDirWriter, root: &Path, map: &BTreeMap<String, (Vec<u8>, u16)>) {
    let managed = writer.dir();
    let before = if managed.exists() {
        tree(managed)
    } else {
        Vec::new()
    };
    let payload = payload(map);
    let all_valid = payload.keys().all(|key| documented_valid(key));
    match writer.write(&payload) {
        Err(Error::InvalidKey { key, .. }) => {
            assert!(!all_valid, "a valid key was refused: {key:?}");
            assert!(!documented_valid(&key));
            let after = if managed.exists() {
                tree(managed)
            } else {
                Vec::new()
            };
            assert_eq!(before, after, "a refused write touched the directory");
        }
        Err(err) => panic!("write failed: {err}"),
        Ok(_) => {
            assert!(all_valid, "an invalid key was accepted");
            let canonical = managed.canonicalize().expect("managed dir");
            for (key, content) in &payload {
                let link = managed.join(key);
                let resolved = link.canonicalize().expect("key link resolves");
                assert!(
                    resolved.starts_with(&canonical) && resolved != canonical,
                    "{key:?} resolves to {resolved:?}, outside {canonical:?}"
                );
                assert_eq!(fs::read(&link).expect("read key"), content.bytes());
                let mode = fs::metadata(&link).expect("stat key").permissions().mode();
                assert_eq!(mode & 0o7777, content.mode(), "mode of {key:?}");
            }
            // Exactly the keys, `..data` and the generation(s), nothing else at the top.
            for entry in fs::read_dir(managed).expect("list managed") {
                let name = entry.expect("entry").file_name().into_string().unwrap();
                assert!(
                    payload.contains_key(&name) || name.starts_with(".."),
                    "unexpected entry {name:?}"
                );
                assert_ne!(name, "..data_tmp");
                assert_ne!(name, "..link_tmp");
            }
        }
    }
    check_outside(root, managed);
}

fn scratch() -> tempfile::TempDir {
    // tmpfs when there is one: the writer fsyncs every file.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("fuzz-aw").tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix("fuzz-aw")
        .tempdir()
        .expect("temp dir")
}

fuzz_target!(|input: Input| {
    for key in input
        .first
        .keys()
        .chain(input.second.iter().flat_map(|m| m.keys()))
    {
        assert_eq!(validate_key(key).is_ok(), documented_valid(key), "{key:?}");
    }
    if input.first.len() > 16 || input.second.as_ref().is_some_and(|m| m.len() > 16) {
        return;
    }

    let root = scratch();
    fs::write(root.path().join("sentinel"), SENTINEL).expect("sentinel");
    fs::create_dir(root.path().join("sibling")).expect("sibling");
    let writer = AtomicDirWriter::new(root.path().join("managed"));
    write_and_check(&writer, root.path(), &input.first);
    if let Some(second) = &input.second {
        write_and_check(&writer, root.path(), second);
    }
});
