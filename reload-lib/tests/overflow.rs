//! An inotify queue overflow makes every reloader re-read everything. Alone in its test binary:
//! the queue size is fixed when the process's inotify instance is created, so this test shrinks
//! `max_queued_events` around that moment.

mod common;

use common::*;
use reload_lib::ServingSet;

const MAX_QUEUED: &str = "/proc/sys/fs/inotify/max_queued_events";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_overflow_triggers_a_full_reload() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let mut dir = PairDir::new(tmp.path(), Writer::Rename, &first);

    let original = std::fs::read_to_string(MAX_QUEUED).unwrap();
    let shrunk = std::fs::write(MAX_QUEUED, "1").is_ok();
    // Creating the first set creates the process's inotify instance, with the shrunk queue.
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await;
    if shrunk {
        std::fs::write(MAX_QUEUED, original.trim()).unwrap();
    }
    let set = set.unwrap();
    if !shrunk {
        // Not root, or /proc/sys read-only: fall back to a burst that may or may not overflow.
        eprintln!("cannot write {MAX_QUEUED}; relying on a burst of events to overflow the queue");
    }
    let addr = echo_server(set.acceptor()).await;
    let client = client_config(&[&ca.cert_pem], None);

    // A burst of unrelated events around the real change: more than the queue holds.
    let next = ca.leaf(&["localhost"], 30);
    // A rename queues two events in one system call, more than a queue of one holds. Distinct
    // names, since the kernel merges identical consecutive events.
    std::fs::write(tmp.path().join("noise-0"), b"x").unwrap();
    for round in 0..if shrunk { 200 } else { 40_000 } {
        let (from, to) = (
            format!("noise-{}", round % 2),
            format!("noise-{}", (round + 1) % 2),
        );
        std::fs::rename(tmp.path().join(from), tmp.path().join(to)).unwrap();
        if round == 100 {
            dir.write(&next);
        }
    }
    wait_for_serial(addr, "localhost", &client, &next.serial).await;
    if shrunk {
        assert!(
            reload_lib::watch::overflow_count() > 0,
            "the queue should have overflowed"
        );
    }
}
