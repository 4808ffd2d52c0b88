//! The inotify watch limit reached mid-run falls back to polling, and a
//! subscribe that fails halfway (the limit reached on its second directory) leaves no watch
//! behind; a `FileWatch` that cannot watch, from the start or after losing its watches, wakes by
//! polling. The limit is the watcher's own cap (`watch::__limit_watches`), which fails exactly as
//! the kernel's `max_user_watches` does, so no system-wide setting is touched.

mod common;

use std::time::Duration;

use common::*;
use reload_lib::watch::{__limit_watches, FileWatch, active_watch_count};
use reload_lib::{CertKeyPaths, ServingSet, WatchMode};

/// The cap and the watch count are per process: the tests of this file take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Removes the cap when the test ends, even by a panic.
struct Uncap;

impl Drop for Uncap {
    fn drop(&mut self) {
        __limit_watches(None);
    }
}

/// Waits (bounded) until the sets dropped by a test have released their watches: a set's
/// watches go when its reload task ends, after the drop.
async fn watches_back_to(baseline: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while active_watch_count() > baseline {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watches not released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaching_the_watch_limit_mid_run_falls_back_to_polling() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_tracing();
    let baseline = active_watch_count();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    let mut dir = PairDir::new(&certs, Writer::Rename, &ca.leaf(&["localhost"], 30));
    // No resync: after the fallback only polling can see a change.
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .poll_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    if *set.watch_mode() != WatchMode::Inotify {
        eprintln!("skipped: inotify unavailable here ({:?})", set.watch_mode());
        return;
    }
    let _uncap = Uncap;
    // Not one watch more from now on.
    __limit_watches(Some(active_watch_count()));

    // The directory is replaced: watching its new inode (or the parent, while it is missing)
    // needs a watch the limit refuses.
    std::fs::rename(&certs, tmp.path().join("certs-old")).unwrap();
    let replaced = ca.leaf(&["localhost"], 30);
    dir = PairDir::new(&certs, Writer::Rename, &replaced);
    wait_served(&set, &replaced.serial, "the replaced directory").await;
    // Nothing watches the new directory: these are seen by polling alone.
    for round in 0..3 {
        let next = ca.leaf(&["localhost"], 30);
        dir.write(&next);
        wait_served(&set, &next.serial, &format!("polled write {round}")).await;
    }
    drop(set);
    watches_back_to(baseline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_that_fails_halfway_leaves_no_watch_behind_and_polls() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    // The certificate and the key in two directories: two watches to add.
    let (cert_dir, key_dir) = (tmp.path().join("a-cert"), tmp.path().join("b-key"));
    std::fs::create_dir_all(&cert_dir).unwrap();
    std::fs::create_dir_all(&key_dir).unwrap();
    let paths = CertKeyPaths::new(cert_dir.join("tls.crt"), key_dir.join("tls.key"));
    let write = |pair: &Pair| {
        rename_into(paths.key(), pair.key_pem.as_bytes());
        rename_into(paths.cert(), pair.cert_pem.as_bytes());
    };
    write(&ca.leaf(&["localhost"], 30));

    // Starts the process's inotify instance if no test did.
    let before = active_watch_count();
    let _uncap = Uncap;
    // Room for the first directory only.
    __limit_watches(Some(before + 1));
    let set = ServingSet::builder(paths.clone())
        .resync_interval(None)
        .poll_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    match set.watch_mode() {
        WatchMode::Polling(reason) if reason.contains("unavailable") => {
            eprintln!("skipped: {reason}");
            return;
        }
        WatchMode::Polling(reason) => assert!(
            reason.contains("inotify watches"),
            "unexpected reason: {reason}"
        ),
        WatchMode::Inotify => panic!("the second directory's watch should have been refused"),
    }
    assert_eq!(
        active_watch_count(),
        before,
        "the first directory's watch was left behind"
    );
    let next = ca.leaf(&["localhost"], 30);
    write(&next);
    wait_served(&set, &next.serial, "a write seen by polling").await;
    drop(set);
    watches_back_to(before).await;
}

/// Whether `watch.changed()` resolves within 5 s.
async fn wakes(watch: &FileWatch) -> bool {
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .is_ok()
}

/// Writes `content` into `file` until `watch` wakes (a poll may fall between a write and the
/// next; bounded): whether it did.
async fn written_and_seen(watch: &FileWatch, file: &std::path::Path, content: &str) -> bool {
    for attempt in 0..3 {
        rename_into(file, format!("{content} {attempt}").as_bytes());
        if wakes(watch).await {
            return true;
        }
    }
    false
}

// Node mode's host file after lost watches: `FileWatch::changed` must go on waking by polling,
// not stay silent until the caller's slow resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_watch_that_loses_its_watches_mid_run_wakes_by_polling() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_tracing();
    let baseline = active_watch_count();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("ca-bundle.crt");
    rename_into(&file, b"first");
    let watch = FileWatch::new([&file]).poll_interval(Duration::from_millis(100));
    if watch.mode() != WatchMode::Inotify {
        eprintln!("skipped: inotify unavailable here ({:?})", watch.mode());
        return;
    }
    let _uncap = Uncap;
    __limit_watches(Some(active_watch_count()));
    // The directory replaced: watching the new one needs a watch the limit refuses.
    std::fs::rename(&dir, tmp.path().join("pki-old")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    rename_into(&file, b"second");
    assert!(wakes(&watch).await, "the replacement itself");
    testkit::wait::wait_until("the fallback", Duration::from_secs(10), || async {
        matches!(watch.mode(), WatchMode::Polling(_))
    })
    .await;
    // Drain a wake-up still due to the replacement, then every write is seen by polling alone.
    let _ = tokio::time::timeout(Duration::from_millis(300), watch.changed()).await;
    for round in 0..3 {
        assert!(
            written_and_seen(&watch, &file, &format!("polled {round}")).await,
            "write {round} after the watches were lost was not seen"
        );
    }
    // Nothing changes: no wake-up (polling compares, it does not tick).
    let quiet = tokio::time::timeout(Duration::from_millis(500), watch.changed()).await;
    assert!(quiet.is_err(), "woken by polling although nothing changed");
    drop(watch);
    watches_back_to(baseline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_watch_that_cannot_watch_from_the_start_wakes_by_polling() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("kubelet-ca.crt");
    // Starts the process's inotify instance if no test did, then leaves no room.
    let before = active_watch_count();
    let _uncap = Uncap;
    __limit_watches(Some(before));
    let watch = FileWatch::new([&file]).poll_interval(Duration::from_millis(100));
    match watch.mode() {
        WatchMode::Polling(reason) if reason.contains("unavailable") => {
            eprintln!("skipped: {reason}");
            return;
        }
        WatchMode::Polling(_) => {}
        WatchMode::Inotify => panic!("the watch should have been refused"),
    }
    // Created, rewritten (renamed over, and in place), removed: each seen.
    assert!(written_and_seen(&watch, &file, "created").await, "creation");
    assert!(written_and_seen(&watch, &file, "renamed").await, "rename");
    std::fs::write(&file, "in place, longer").unwrap();
    assert!(wakes(&watch).await, "an in-place write");
    std::fs::remove_file(&file).unwrap();
    assert!(wakes(&watch).await, "a removal");
    let quiet = tokio::time::timeout(Duration::from_millis(500), watch.changed()).await;
    assert!(quiet.is_err(), "woken by polling although nothing changed");
}
