//! Tests of the directory writer and of `write_file_atomic`.

use super::*;
use crate::fs::write_file_atomic;

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
fn a_symlinked_object_directory_or_parent_is_never_written_or_removed_through() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join("..olddir")).unwrap();
    fs::write(outside.join("..olddir/keep"), "x").unwrap();
    fs::write(outside.join("tls.crt"), "precious").unwrap();
    let snapshot = |dir: &Path| {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let before = snapshot(&outside);
    let content = payload(&[("tls.crt", "synced", 0o600), ("tls.key", "key", 0o600)]);
    // The object directory itself, then its parent, a symlink to elsewhere.
    fs::create_dir_all(dest.join("secrets")).unwrap();
    symlink(&outside, dest.join("secrets/serving")).unwrap();
    let writer = AtomicDirWriter::new(dest.join("secrets/serving")).with_root(&dest);
    let err = writer.write(&content).unwrap_err();
    assert!(
        matches!(&err, Error::Unsafe { path, .. } if path == &dest.join("secrets/serving")),
        "{err}"
    );
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(matches!(writer.remove_all(), Err(Error::Unsafe { .. })));
    // Without a root the directory itself is still checked.
    let plain = AtomicDirWriter::new(dest.join("secrets/serving"));
    assert!(matches!(plain.write(&content), Err(Error::Unsafe { .. })));
    assert!(matches!(plain.remove_all(), Err(Error::Unsafe { .. })));
    fs::remove_file(dest.join("secrets/serving")).unwrap();
    fs::remove_dir(dest.join("secrets")).unwrap();
    symlink(&outside, dest.join("secrets")).unwrap();
    let err = writer.write(&content).unwrap_err();
    assert!(
        matches!(&err, Error::Unsafe { path, .. } if path == &dest.join("secrets")),
        "{err}"
    );
    assert!(matches!(writer.remove_all(), Err(Error::Unsafe { .. })));
    assert_eq!(snapshot(&outside), before);
    assert_eq!(fs::read(outside.join("tls.crt")).unwrap(), b"precious");
    assert!(outside.join("..olddir/keep").exists());
    // Real directories: written.
    fs::remove_file(dest.join("secrets")).unwrap();
    writer.write(&content).unwrap();
    assert_eq!(
        fs::read(dest.join("secrets/serving/tls.crt")).unwrap(),
        b"synced"
    );
}

/// Mounts a tmpfs of `size` at `at`; `false` (with the reason printed) where mounting is not
/// permitted (not root, no CAP_SYS_ADMIN, a restricted container).
fn mount_tmpfs(at: &Path, size: &str) -> bool {
    let output = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
        ])
        .arg(at)
        .output();
    match output {
        Ok(output) if output.status.success() => true,
        Ok(output) => {
            eprintln!(
                "SKIPPED: cannot mount a tmpfs: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
            false
        }
        Err(err) => {
            eprintln!("SKIPPED: cannot run mount: {err}");
            false
        }
    }
}

struct Unmount(PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_write_that_fills_the_disk_removes_what_it_created_so_the_next_one_fits() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    if !mount_tmpfs(&mnt, "1m") {
        return;
    }
    let _unmount = Unmount(mnt.clone());
    let writer = AtomicDirWriter::new(mnt.join("secrets/serving"));
    let small = |fill: u8| {
        BTreeMap::from([(
            "tls.crt".to_owned(),
            FileContent::new(vec![fill; 200 * 1024], 0o600),
        )])
    };
    writer.write(&small(b'a')).unwrap();
    // 600 KiB + 600 KiB: the second file does not fit next to the first one.
    let big = BTreeMap::from([
        (
            "a".to_owned(),
            FileContent::new(vec![b'b'; 600 * 1024], 0o600),
        ),
        (
            "b".to_owned(),
            FileContent::new(vec![b'b'; 600 * 1024], 0o600),
        ),
    ]);
    let err = writer.write(&big).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert_eq!(
        generations(writer.dir()).len(),
        1,
        "only the committed generation is left: {:?}",
        generations(writer.dir())
    );
    assert_eq!(
        fs::read(writer.dir().join("tls.crt")).unwrap(),
        vec![b'a'; 200 * 1024]
    );
    assert!(fs::symlink_metadata(writer.dir().join("..data_tmp")).is_err());
    // The next, smaller write fits again (200 KiB old + 200 KiB new on a 1 MiB disk).
    writer.write(&small(b'c')).unwrap();
    assert_eq!(
        fs::read(writer.dir().join("tls.crt")).unwrap(),
        vec![b'c'; 200 * 1024]
    );
    // An orphan left by a crash (not by us) is removed before the next write needs its room.
    fs::create_dir(writer.dir().join("..orphan")).unwrap();
    fs::write(writer.dir().join("..orphan/blob"), vec![0u8; 500 * 1024]).unwrap();
    writer.write(&small(b'd')).unwrap();
    assert_eq!(generations(writer.dir()).len(), 1);
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
