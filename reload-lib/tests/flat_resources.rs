//! Resource use across many swaps. Alone in its test binary: it counts the process's file
//! descriptors and inotify watches, which other tests in the same process would disturb.

mod common;

use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ServingSet};

/// Both tests measure the whole process: under `cargo test` they share one, so take turns.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)]
async fn watches_and_descriptors_stay_flat_across_10_000_swaps() {
    // Held across awaits on purpose: the whole test must run alone.
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
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

/// Context switches of every thread of this process except the caller's.
fn other_threads_context_switches() -> u64 {
    let me = std::fs::read_link("/proc/thread-self").unwrap();
    let me = me.file_name().unwrap().to_owned();
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap();
        if task.file_name() == me {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(n) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
    }
    total
}

#[test]
fn an_idle_set_does_not_wake_up() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = PairDir::new(tmp.path(), Writer::Rename, &ca.leaf(&["localhost"], 30));
    // The default 60 s resync is the only timer.
    let set = rt
        .block_on(ServingSet::builder(dir.paths()).start())
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = other_threads_context_switches();
    std::thread::sleep(Duration::from_secs(2));
    let woke = other_threads_context_switches() - before;
    assert!(
        woke <= 2,
        "the runtime, the reload task and the inotify thread woke {woke} times while idle"
    );
    drop(set);
}
