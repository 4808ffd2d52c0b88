//! How many reload passes one rotation costs, per writer style, counted through
//! `Status::passes`. The counts depend on timing (whether a writer's next step is already queued
//! when the watcher reads), so only bounds that hold under load are asserted; the figures are
//! printed (`--no-capture`).

mod common;

use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ServingSet};

const ROTATIONS: u64 = 60;

/// Runs `ROTATIONS` rotations through `rotate`, each awaited until published, and returns the
/// passes they cost (failed, unchanged and publishing ones) and how many were rejected.
async fn passes_for(set: &ServingSet, mut rotate: impl FnMut(u64)) -> (u64, u64) {
    let mut updates = set.subscribe();
    let before = set.status();
    for i in 1..=ROTATIONS {
        let target = set.status().generation + 1;
        rotate(i);
        let published = updates.wait_for(|s| s.generation >= target);
        tokio::time::timeout(Duration::from_secs(30), published)
            .await
            .expect("a rotation is published")
            .unwrap();
    }
    // An explicit pass runs after whatever the last rotation queued has been taken.
    set.reload().await.unwrap();
    let after = set.status();
    (
        after.passes - before.passes - 1,
        after.reloads_failed - before.reloads_failed,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_per_rotation_by_writer() {
    let ca = Ca::new("ca");
    let pairs = [ca.leaf(&["localhost"], 30), ca.leaf(&["localhost"], 30)];
    let mut report = Vec::new();

    // One file: one rename per rotation.
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("credential.pem");
    let write = |pair: &Pair| {
        rename_into(
            &bundle,
            format!("{}{}", pair.key_pem, pair.cert_pem).as_bytes(),
        )
    };
    write(&pairs[0]);
    let set = ServingSet::builder(CertKeyPaths::bundle(&bundle))
        .start()
        .await
        .unwrap();
    let (passes, failed) = passes_for(&set, |i| write(&pairs[(i % 2) as usize])).await;
    report.push(("bundle rename", passes, failed));
    // One atomic change is one pass.
    assert_eq!(passes, ROTATIONS, "bundle: {passes} passes");
    drop(set);

    for writer in [Writer::Kubelet, Writer::Rename] {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = PairDir::new(tmp.path(), writer, &pairs[0]);
        let set = ServingSet::builder(dir.paths()).start().await.unwrap();
        let (passes, failed) = passes_for(&set, |i| dir.write(&pairs[(i % 2) as usize])).await;
        report.push((
            match writer {
                Writer::Kubelet => "kubelet ..data swap",
                _ => "cert rename + key rename",
            },
            passes,
            failed,
        ));
        if writer == Writer::Kubelet {
            // Five events per swap (the next revision directory, `..data_tmp` created and
            // moved, `..data`, the old revision deleted); only `..data` is on the files' path.
            // Before the watcher told them apart: 3.1 to 3.9 passes per rotation.
            assert!(
                passes * 4 <= ROTATIONS * 5,
                "kubelet swap: {passes} passes for {ROTATIONS} rotations"
            );
        }
        drop(set);
    }
    // Both files staged first, then renamed back to back (cert-syncer's style).
    let tmp = tempfile::tempdir().unwrap();
    let dir = PairDir::new(tmp.path(), Writer::Rename, &pairs[0]);
    let set = ServingSet::builder(dir.paths()).start().await.unwrap();
    let (cert, key) = (dir.cert(), dir.key());
    let staged = |i: u64| {
        let pair = &pairs[(i % 2) as usize];
        let (cert_tmp, key_tmp) = (
            cert.with_extension("crt.new"),
            key.with_extension("key.new"),
        );
        std::fs::write(&cert_tmp, &pair.cert_pem).unwrap();
        std::fs::write(&key_tmp, &pair.key_pem).unwrap();
        std::fs::rename(&cert_tmp, &cert).unwrap();
        std::fs::rename(&key_tmp, &key).unwrap();
    };
    let (passes, failed) = passes_for(&set, staged).await;
    report.push(("staged, then cert rename + key rename", passes, failed));
    drop(set);

    for (writer, passes, failed) in &report {
        println!(
            "{writer}: {passes} passes ({failed} rejected) for {ROTATIONS} rotations = {:.2} per rotation",
            *passes as f64 / ROTATIONS as f64
        );
    }
}
