//! How many reload passes one rotation costs, per writer style (issue 19 item 4), counted through
//! `Status::passes`. Alone in its test binary: it measures passes, which other sets' events do
//! not disturb, but it wants the crate's runtime thread to itself for honest timing.

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
        drop(set);
    }
    for (writer, passes, failed) in &report {
        println!(
            "{writer}: {passes} passes ({failed} rejected) for {ROTATIONS} rotations = {:.2} per rotation",
            *passes as f64 / ROTATIONS as f64
        );
    }
}
