//! A directory replaced while the inotify queue overflowed is watched again.
//! Alone in its test binary: the queue size is fixed when the process's inotify instance is
//! created, so this test shrinks `max_queued_events` around that moment (as `overflow.rs`).
//!
//! Deterministic loss: a second set watches the parent directory, so the one `rename(2)` that
//! replaces the watched directory queues three events at once (`IN_MOVED_FROM` and `IN_MOVED_TO`
//! in the parent, `IN_MOVE_SELF` on the directory). With a queue of one, the directory's own
//! `IN_MOVE_SELF` is always lost to the overflow: only the overflow's re-arm can find the new
//! directory.

mod common;

use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ServingSet};

const MAX_QUEUED: &str = "/proc/sys/fs/inotify/max_queued_events";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_replaced_during_a_queue_overflow_is_watched_again() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    let mut dir = PairDir::new(&certs, Writer::Rename, &ca.leaf(&["localhost"], 30));
    // A pair directly in the parent, for the second set.
    let sibling = ca.leaf(&["localhost"], 30);
    rename_into(&tmp.path().join("sibling.key"), sibling.key_pem.as_bytes());
    rename_into(&tmp.path().join("sibling.crt"), sibling.cert_pem.as_bytes());

    let original = std::fs::read_to_string(MAX_QUEUED).unwrap();
    if std::fs::write(MAX_QUEUED, "1").is_err() {
        eprintln!("skipped: cannot write {MAX_QUEUED} (not root?), so no overflow can be forced");
        return;
    }
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await;
    std::fs::write(MAX_QUEUED, original.trim()).unwrap();
    let set = set.unwrap();
    let _parent_watcher = ServingSet::builder(CertKeyPaths::new(
        tmp.path().join("sibling.crt"),
        tmp.path().join("sibling.key"),
    ))
    .resync_interval(None)
    .start()
    .await
    .unwrap();

    // The directory moves away: its IN_MOVE_SELF is lost to the overflow. The overflow's full
    // pass then finds the files missing (no resync, so nothing else reads them).
    let mut rx = set.subscribe();
    std::fs::rename(&certs, tmp.path().join("certs-old")).unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.last_error.is_some()),
    )
    .await
    .expect("the overflow's full pass did not report the missing files")
    .unwrap();
    assert!(reload_lib::watch::overflow_count() > 0);

    // A new directory takes its place (the rejected pass's retries may read it).
    let replaced = ca.leaf(&["localhost"], 30);
    dir = PairDir::new(&certs, Writer::Rename, &replaced);
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.served[0].info.serial == replaced.serial),
    )
    .await
    .expect("the replaced directory was not served")
    .unwrap();

    // Later writes into the new directory are seen: it is watched (not the old one).
    for round in 0..3 {
        let next = ca.leaf(&["localhost"], 30);
        dir.write(&next);
        tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|s| s.served[0].info.serial == next.serial),
        )
        .await
        .unwrap_or_else(|_| panic!("write {round} into the replaced directory not seen"))
        .unwrap();
    }
}
