//! A certificate and its key in two files, replaced one after the other: the
//! set waits for the second file instead of parsing, rejecting and reporting the pair caught
//! half way, and a pair that really does not match is still rejected, reported and never
//! served. Real files, real renames, real inotify.

mod common;

use common::*;
use reload_lib::{InvalidMaterial, ServingSet};

const ROTATIONS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_renamed_file_by_file_is_published_without_a_failed_reload_in_either_order() {
    init_tracing();
    let ca = Ca::new("ca");
    for key_first in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let first = ca.leaf(&["localhost"], 30);
        let dir = PairDir::new(tmp.path(), Writer::Rename, &first);
        let set = ServingSet::builder(dir.paths())
            .resync_interval(None)
            .start()
            .await
            .unwrap();
        let before = set.status();
        for i in 1..=ROTATIONS {
            let next = ca.leaf(&["localhost"], 30);
            let target = set.status().generation + 1;
            if key_first {
                rename_into(&dir.key(), next.key_pem.as_bytes());
                rename_into(&dir.cert(), next.cert_pem.as_bytes());
            } else {
                rename_into(&dir.cert(), next.cert_pem.as_bytes());
                rename_into(&dir.key(), next.key_pem.as_bytes());
            }
            let published = wait_status(&set, |s| s.generation >= target).await;
            assert_eq!(
                published.served[0].info.serial, next.serial,
                "rotation {i}: the new pair is served"
            );
        }
        // Whatever the last rotation queued has been taken before the counters are read.
        set.reload().await.unwrap();
        let after = set.status();
        let passes = after.passes - before.passes - 1;
        let failed = after.reloads_failed - before.reloads_failed;
        println!(
            "{} first: {passes} passes, {failed} failed, for {ROTATIONS} rotations",
            if key_first { "key" } else { "certificate" }
        );
        // The second rename follows the first within microseconds: its event is awaited. A
        // pass that ran anyway (the writer descheduled for longer than the wait) is retried,
        // not reported.
        assert_eq!(failed, 0, "no rotation counted as a failed reload");
        assert!(after.last_error.is_none());
        assert!(
            passes < 2 * ROTATIONS,
            "{passes} passes: most rotations cost one"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renewed_for_the_same_key_is_published_after_the_wait() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let dir = PairDir::new(tmp.path(), Writer::Rename, &first);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    // Only the certificate changes: no partner event ever comes.
    let renewed = ca.issue(&CertSpec::server(&["localhost"]).reuse_key(&first.key_pem));
    rename_into(&dir.cert(), renewed.cert_pem.as_bytes());
    let status = wait_status(&set, |s| s.generation == 2).await;
    assert_eq!(status.served[0].info.serial, renewed.serial);
    assert_eq!(status.reloads_failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_does_not_match_is_still_rejected_and_reported_after_the_wait() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let first = ca.leaf(&["localhost"], 30);
    let dir = PairDir::new(tmp.path(), Writer::Rename, &first);
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = no_resumption(&client_config(&[&ca.cert_pem], None));

    // Certificate alone, for a key that never comes: a pair caught half way at first, wrong
    // for good after the wait.
    let stranger = ca.leaf(&["localhost"], 30);
    rename_into(&dir.cert(), stranger.cert_pem.as_bytes());
    let status = wait_status(&set, |s| s.reloads_failed > 0).await;
    let err = status.last_error.expect("the rejection is reported");
    assert_eq!(err.invalid_material(), Some(&InvalidMaterial::KeyMismatch));
    assert!(err.to_string().contains(&dir.cert().display().to_string()));
    assert_eq!(status.generation, 1, "nothing was published");
    // Fail closed: the old pair keeps serving.
    let seen = handshake(addr, "localhost", client.clone()).await.unwrap();
    assert_eq!(seen.serial, first.serial);

    // Key alone, for a certificate that never comes: the same, in the other order. The files
    // first go back to the served pair, which ends the failure.
    rename_into(&dir.cert(), first.cert_pem.as_bytes());
    wait_status(&set, |s| s.last_error.is_none()).await;
    let failed = set.status().reloads_failed;
    rename_into(&dir.key(), stranger.key_pem.as_bytes());
    let status = wait_status(&set, |s| s.reloads_failed > failed).await;
    let err = status.last_error.expect("the rejection is reported");
    assert_eq!(err.invalid_material(), Some(&InvalidMaterial::KeyMismatch));
    assert_eq!(status.generation, 1, "nothing was published");
    let seen = handshake(addr, "localhost", client).await.unwrap();
    assert_eq!(seen.serial, first.serial);

    // Both files of a matching pair: served.
    rename_into(&dir.cert(), stranger.cert_pem.as_bytes());
    let status = wait_status(&set, |s| s.generation == 2).await;
    assert_eq!(status.served[0].info.serial, stranger.serial);
    assert!(status.last_error.is_none());
}
