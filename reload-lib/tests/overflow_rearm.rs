//! Issue 14, item 6: a directory replaced while the inotify queue overflowed is watched again.
//! Alone in its test binary: the queue size is fixed when the process's inotify instance is
//! created, so this test shrinks `max_queued_events` around that moment (as `overflow.rs`).

mod common;

use std::time::Duration;

use common::*;
use reload_lib::ServingSet;

const MAX_QUEUED: &str = "/proc/sys/fs/inotify/max_queued_events";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_replaced_during_a_queue_overflow_is_watched_again() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    let mut dir = PairDir::new(&certs, Writer::Rename, &ca.leaf(&["localhost"], 30));

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

    // Replace the directory (new inode) amid bursts that overflow a queue of one (a rename in a
    // watched directory queues two events at once): the events that would re-arm it may be lost.
    let replaced = ca.leaf(&["localhost"], 30);
    let old = tmp.path().join("certs-old");
    std::fs::write(certs.join("noise-0"), b"x").unwrap();
    for round in 0..200 {
        let noisy = if round < 100 { &certs } else { &old };
        let (from, to) = (
            format!("noise-{}", round % 2),
            format!("noise-{}", (round + 1) % 2),
        );
        std::fs::rename(noisy.join(from), noisy.join(to)).unwrap();
        if round == 99 {
            std::fs::rename(&certs, &old).unwrap();
            dir = PairDir::new(&certs, Writer::Rename, &replaced);
        }
    }
    let mut rx = set.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.served[0].info.serial == replaced.serial),
    )
    .await
    .expect("the overflow's full reload did not serve the replaced directory")
    .unwrap();
    assert!(reload_lib::watch::overflow_count() > 0);

    // Later writes into the new directory are seen by events.
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
