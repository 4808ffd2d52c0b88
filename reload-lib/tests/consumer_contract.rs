//! The consumer contract of the atomic writers (see `reload_lib::fs`'s module docs): a consumer
//! that watches each *file* the way kube-apiserver, the kubelet's client-CA loader and
//! controller-runtime's certwatcher do (Go's fsnotify: an inotify watch on the inode the path
//! resolves to, re-added after a remove or rename, and no re-read on a timer) must see every
//! write, and read the new content each time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use reload_lib::fs::{AtomicDirWriter, FileContent, write_file_atomic};

/// How many consecutive writes each test makes.
const WRITES: usize = 50;
/// How long one write may take to reach the watcher (generous: CI machines are loaded).
const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// The events Go's fsnotify asks inotify for (`inotify.go`, `Add`).
fn fsnotify_mask() -> WatchMask {
    WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::CREATE
        | WatchMask::ATTRIB
        | WatchMask::MODIFY
        | WatchMask::MOVE_SELF
        | WatchMask::DELETE_SELF
        | WatchMask::DELETE
}

/// A Go-style file watcher over some paths. Like kube-apiserver's `DynamicCertKeyPairContent`
/// and `DynamicFileCAContent`: every event on a watched file queues a re-read of that path;
/// a remove or rename (or the watch going away) re-adds the watch on the path, which resolves
/// symlinks to whatever inode the path names now. It never reads a file without an event.
struct GoStyleWatcher {
    inotify: Inotify,
    watches: Vec<(PathBuf, WatchDescriptor)>,
    /// The content each path had when last read (after an event).
    content: BTreeMap<PathBuf, Vec<u8>>,
    /// Re-reads done (one per event batch per path): the watcher's only reads.
    reads: usize,
}

impl GoStyleWatcher {
    fn new(paths: &[PathBuf]) -> GoStyleWatcher {
        let inotify = Inotify::init().expect("inotify");
        let mut watcher = GoStyleWatcher {
            inotify,
            watches: Vec::new(),
            content: BTreeMap::new(),
            reads: 0,
        };
        for path in paths {
            let wd = watcher.add(path);
            watcher.watches.push((path.clone(), wd));
            // The initial load, as the Go loaders do at start.
            watcher
                .content
                .insert(path.clone(), std::fs::read(path).expect("initial read"));
        }
        watcher
    }

    fn add(&mut self, path: &Path) -> WatchDescriptor {
        self.inotify
            .watches()
            .add(path, fsnotify_mask())
            .unwrap_or_else(|err| panic!("watch {}: {err}", path.display()))
    }

    /// Handles whatever events are pending; returns whether there were any.
    fn handle_pending(&mut self) -> bool {
        let mut buffer = [0u8; 4096];
        let events: Vec<(WatchDescriptor, EventMask)> = match self.inotify.read_events(&mut buffer)
        {
            Ok(events) => events.map(|e| (e.wd.clone(), e.mask)).collect(),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(err) => panic!("reading inotify events: {err}"),
        };
        let mut to_read = Vec::new();
        let mut to_readd = Vec::new();
        for (wd, mask) in events {
            let Some(index) = self.watches.iter().position(|(_, w)| *w == wd) else {
                continue; // an event of a watch already replaced
            };
            if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED)
                && !to_readd.contains(&index)
            {
                to_readd.push(index);
            }
            if !to_read.contains(&index) {
                to_read.push(index);
            }
        }
        // Re-add first, then read: a write between the two is then not missed (kube-apiserver
        // queues the re-read with `defer` for the same reason).
        for index in to_readd {
            let path = self.watches[index].0.clone();
            let old = self.watches[index].1.clone();
            let _ = self.inotify.watches().remove(old);
            self.watches[index].1 = self.add(&path);
        }
        for index in to_read {
            let path = self.watches[index].0.clone();
            self.reads += 1;
            // A reader that loses the race with the writer's clean-up gets ENOENT; the Go
            // loaders retry with backoff, and the re-added watch brings the next event.
            if let Ok(bytes) = std::fs::read(&path) {
                self.content.insert(path, bytes);
            }
        }
        true
    }

    /// Waits (bounded) until every path has been read, after an event, with `want(path)`.
    /// Returns `false` on timeout.
    fn wait_for(&mut self, want: impl Fn(&Path) -> Vec<u8>, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let done = self
                .watches
                .iter()
                .all(|(path, _)| self.content.get(path) == Some(&want(path)));
            if done {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if !self.handle_pending() {
                // Nothing pending: wait for the next event (no file is read here).
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

fn payload(generation: usize) -> BTreeMap<String, FileContent> {
    BTreeMap::from([
        (
            "tls.crt".to_owned(),
            FileContent::new(format!("certificate {generation}").into_bytes(), 0o644),
        ),
        (
            "tls.key".to_owned(),
            FileContent::new(format!("key {generation}").into_bytes(), 0o600),
        ),
    ])
}

fn expected(generation: usize) -> impl Fn(&Path) -> Vec<u8> {
    move |path: &Path| {
        let key = path.file_name().unwrap().to_string_lossy().into_owned();
        payload(generation)[&key].bytes().to_vec()
    }
}

#[test]
fn a_go_style_file_watcher_sees_every_atomic_dir_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("secrets/serving-cert");
    let writer = AtomicDirWriter::new(&dir);
    writer.write(&payload(0)).unwrap();
    let mut watcher = GoStyleWatcher::new(&[dir.join("tls.crt"), dir.join("tls.key")]);
    for generation in 1..=WRITES {
        writer.write(&payload(generation)).unwrap();
        assert!(
            watcher.wait_for(expected(generation), SEEN_WITHIN),
            "write {generation} of {WRITES} was not seen by a file watcher within {SEEN_WITHIN:?} \
             (it still has {:?})",
            watcher.content
        );
    }
    assert!(
        watcher.reads >= 2 * WRITES,
        "one re-read per file per write"
    );
}

#[test]
fn a_go_style_file_watcher_sees_every_host_file_write() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ca-bundle.crt");
    write_file_atomic(&path, b"bundle 0", 0o644).unwrap();
    let mut watcher = GoStyleWatcher::new(std::slice::from_ref(&path));
    for generation in 1..=WRITES {
        let bytes = format!("bundle {generation}").into_bytes();
        assert!(write_file_atomic(&path, &bytes, 0o644).unwrap());
        assert!(
            watcher.wait_for(|_| bytes.clone(), SEEN_WITHIN),
            "host-file write {generation} of {WRITES} was not seen within {SEEN_WITHIN:?}"
        );
    }
}

/// The control: a `..data` swap that keeps the previous generation (what `AtomicDirWriter`
/// once did) is invisible to such a watcher. Shows the test above can fail.
#[test]
fn a_swap_that_keeps_the_old_generation_is_not_seen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("serving-cert");
    let writer = AtomicDirWriter::new(&dir);
    writer.write(&payload(0)).unwrap();
    let mut watcher = GoStyleWatcher::new(&[dir.join("tls.crt"), dir.join("tls.key")]);
    // A new generation beside the current one, then `..data` swapped to it; the old generation
    // stays on disk.
    let generation = dir.join("..kept-old-generation-test");
    std::fs::create_dir(&generation).unwrap();
    for (key, content) in payload(1) {
        std::fs::write(generation.join(key), content.bytes()).unwrap();
    }
    std::os::unix::fs::symlink("..kept-old-generation-test", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    // The paths now resolve to the new content...
    assert_eq!(
        std::fs::read(dir.join("tls.crt")).unwrap(),
        b"certificate 1"
    );
    // ...but the watched inodes got no event, so the watcher never re-reads.
    assert!(!watcher.wait_for(expected(1), Duration::from_millis(500)));
    assert_eq!(watcher.reads, 0, "no event reached the watched files");
}
