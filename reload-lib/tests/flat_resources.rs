//! Resource use across many swaps. Alone in its test binary: it counts the process's file
//! descriptors and inotify watches, which other tests in the same process would disturb.

mod common;

use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ServingSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_and_descriptors_stay_flat_across_10_000_swaps() {
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let pairs = [ca.leaf(&["localhost"], 30), ca.leaf(&["localhost"], 30)];
    let bundle = tmp.path().join("credential.pem");
    let write = |pair: &Pair| {
        rename_into(
            &bundle,
            format!("{}{}", pair.key_pem, pair.cert_pem).as_bytes(),
        )
    };
    write(&pairs[0]);
    let set = ServingSet::builder(CertKeyPaths::bundle(&bundle))
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let (fds_before, watches_before) = (fds(), reload_lib::watch::active_watch_count());
    let mut rx = set.subscribe();
    for i in 1..=10_000u64 {
        write(&pairs[(i % 2) as usize]);
        tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|s| s.generation == i + 1),
        )
        .await
        .unwrap_or_else(|_| panic!("swap {i} not seen"))
        .unwrap();
    }
    assert_eq!(fds(), fds_before, "open descriptors");
    assert_eq!(
        reload_lib::watch::active_watch_count(),
        watches_before,
        "inotify watches"
    );
    assert_eq!(set.status().reloads_failed, 0);
}
