//! Large SNI sets: a change to one pair re-reads and re-parses that pair only, and every other
//! entry of the new snapshot is the very same parsed entry (pointer-equal) as before the swap.
//! Real files, real inotify, real handshakes over 127.0.0.1.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ServingSet, ServingSnapshot};

fn name(i: usize) -> String {
    format!("host-{i}.test")
}

/// `count` pairs as `<dir>/host-<i>.crt` and `.key` in one flat directory.
fn flat_pairs(ca: &Ca, dir: &Path, count: usize) -> Vec<Pair> {
    std::fs::create_dir_all(dir).unwrap();
    (0..count)
        .map(|i| {
            let pair = ca.leaf(&[&name(i)], 30);
            write_flat(dir, i, &pair);
            pair
        })
        .collect()
}

fn flat_paths(dir: &Path, i: usize) -> CertKeyPaths {
    CertKeyPaths::new(
        dir.join(format!("host-{i}.crt")),
        dir.join(format!("host-{i}.key")),
    )
}

/// Certificate, then key, each renamed into place (two events; a torn state in between).
fn write_flat(dir: &Path, i: usize, pair: &Pair) {
    let paths = flat_paths(dir, i);
    rename_into(paths.cert(), pair.cert_pem.as_bytes());
    rename_into(paths.key(), pair.key_pem.as_bytes());
}

/// Asserts that every name except `changed` resolves to the same parsed entry in both snapshots.
fn assert_shared_except(
    before: &ServingSnapshot,
    after: &ServingSnapshot,
    count: usize,
    changed: usize,
) {
    for i in (0..count).filter(|i| *i != changed) {
        let name = name(i);
        assert!(
            Arc::ptr_eq(
                before.certified_key_for(Some(&name)),
                after.certified_key_for(Some(&name))
            ),
            "{name} was rebuilt by a swap that did not concern it"
        );
    }
    assert!(Arc::ptr_eq(
        before.certified_key_for(None),
        after.certified_key_for(None)
    ));
    assert!(!Arc::ptr_eq(
        before.certified_key_for(Some(&name(changed))),
        after.certified_key_for(Some(&name(changed)))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_one_pair_among_many_re_reads_only_that_pair() {
    init_tracing();
    const COUNT: usize = 200;
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pairs");
    flat_pairs(&ca, &dir, COUNT);
    let default = PairDir::new(
        &tmp.path().join("default"),
        Writer::Rename,
        &ca.leaf(&["default.test"], 30),
    );
    let mut builder = ServingSet::builder(default.paths()).resync_interval(None);
    for i in 0..COUNT {
        builder = builder.sni(name(i), flat_paths(&dir, i));
    }
    let set = builder.start().await.unwrap();
    let status = set.status();
    assert_eq!(status.served.len(), COUNT + 1);
    assert_eq!(status.last_reload_sources_read, COUNT + 1);
    assert_eq!(status.last_reload_sources_parsed, COUNT + 1);
    let addr = echo_server(set.acceptor()).await;
    let client = client_config(&[&ca.cert_pem], None);

    for (round, changed) in [37, 0, COUNT - 1, 37].into_iter().enumerate() {
        let before = set.current();
        let served_before = set.status().served;
        let next = ca.leaf(&[&name(changed)], 30);
        write_flat(&dir, changed, &next);
        wait_for_serial(addr, &name(changed), &client, &next.serial).await;

        let after = set.current();
        let status = set.status();
        assert_eq!(
            (
                status.last_reload_sources_read,
                status.last_reload_sources_parsed
            ),
            (1, 1),
            "round {round}: the pass that published read and parsed only pair {changed}"
        );
        assert_shared_except(&before, &after, COUNT, changed);
        // The served list shares the unchanged entries too (index 0 is the default pair).
        for i in (0..=COUNT).filter(|i| *i != changed + 1) {
            assert!(std::ptr::eq(
                served_before.get(i).unwrap(),
                status.served.get(i).unwrap()
            ));
        }
        assert_eq!(status.served[changed + 1].info.serial, next.serial);
        assert!(status.last_error.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_swap_re_reads_only_the_pairs_of_its_directory() {
    init_tracing();
    const COUNT: usize = 50;
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs: Vec<PairDir> = (0..COUNT)
        .map(|i| {
            PairDir::new(
                &tmp.path().join(i.to_string()),
                Writer::Kubelet,
                &ca.leaf(&[&name(i)], 30),
            )
        })
        .collect();
    let default = PairDir::new(
        &tmp.path().join("default"),
        Writer::Kubelet,
        &ca.leaf(&["default.test"], 30),
    );
    let mut builder = ServingSet::builder(default.paths()).resync_interval(None);
    for dir in &dirs {
        builder = builder.sni_from_certificate(dir.paths());
    }
    let set = builder.start().await.unwrap();

    let before = set.current();
    let next = ca.leaf(&[&name(21)], 30);
    dirs[21].write(&next);
    let status = wait_status(&set, |s| s.generation == 2).await;
    assert_eq!(
        (
            status.last_reload_sources_read,
            status.last_reload_sources_parsed
        ),
        (1, 1)
    );
    assert_eq!(
        set.current().certificate_for(Some(&name(21))).serial,
        next.serial
    );
    assert_shared_except(&before, &set.current(), COUNT, 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unattributed_reload_re_reads_every_pair_but_parses_only_the_changed_one() {
    init_tracing();
    const COUNT: usize = 100;
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pairs");
    flat_pairs(&ca, &dir, COUNT);
    // No events at all: only the explicit reload reads.
    let mut builder = ServingSet::builder(flat_paths(&dir, 0))
        .poll_only(true)
        .poll_interval(Duration::from_secs(3600));
    for i in 0..COUNT {
        builder = builder.sni(name(i), flat_paths(&dir, i));
    }
    let set = builder.start().await.unwrap();
    assert!(
        !set.reload().await.unwrap(),
        "unchanged files publish nothing"
    );

    let before = set.current();
    let next = ca.leaf(&[&name(64)], 30);
    write_flat(&dir, 64, &next);
    assert!(set.reload().await.unwrap());
    let status = set.status();
    assert_eq!(status.last_reload_sources_read, COUNT + 1);
    assert_eq!(status.last_reload_sources_parsed, 1);
    assert_shared_except(&before, &set.current(), COUNT, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_pair_keeps_its_last_good_entry_without_holding_back_the_others() {
    init_tracing();
    const COUNT: usize = 20;
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pairs");
    let pairs = flat_pairs(&ca, &dir, COUNT);
    let default = PairDir::new(
        &tmp.path().join("default"),
        Writer::Rename,
        &ca.leaf(&["default.test"], 30),
    );
    let mut builder = ServingSet::builder(default.paths()).resync_interval(None);
    for i in 0..COUNT {
        builder = builder.sni(name(i), flat_paths(&dir, i));
    }
    let set = builder.start().await.unwrap();
    let addr = echo_server(set.acceptor()).await;
    let client = client_config(&[&ca.cert_pem], None);

    // Pair 3 turns to garbage: rejected, its last good entry keeps serving.
    rename_into(flat_paths(&dir, 3).cert(), b"garbage");
    let status = wait_status(&set, |s| s.last_error.is_some()).await;
    let message = status.last_error.unwrap().to_string();
    assert!(message.contains("host-3.crt"), "{message}");

    // Pair 9 rotates meanwhile: published although pair 3 is still rejected.
    let next = ca.leaf(&[&name(9)], 30);
    write_flat(&dir, 9, &next);
    wait_for_serial(addr, &name(9), &client, &next.serial).await;
    assert_eq!(
        handshake(addr, &name(3), no_resumption(&client))
            .await
            .unwrap()
            .serial,
        pairs[3].serial
    );
    assert!(
        set.status().last_error.is_some(),
        "pair 3 is still rejected"
    );

    // Pair 3 repaired: the error clears.
    let repaired = ca.leaf(&[&name(3)], 30);
    write_flat(&dir, 3, &repaired);
    wait_for_serial(addr, &name(3), &client, &repaired.serial).await;
    wait_status(&set, |s| s.last_error.is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_that_drops_a_name_hands_it_to_the_next_claimant() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let default = ca.leaf(&["d.test", "a.test"], 30);
    let x = ca.leaf(&["a.test", "b.test"], 30);
    let y = ca.leaf(&["b.test", "c.test"], 30);
    let mut dirs: Vec<PairDir> = [&default, &x, &y]
        .iter()
        .enumerate()
        .map(|(i, pair)| PairDir::new(&tmp.path().join(i.to_string()), Writer::Kubelet, pair))
        .collect();
    let set = ServingSet::builder(dirs[0].paths())
        .sni_from_certificate(dirs[1].paths())
        .sni_from_certificate(dirs[2].paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let serial = |name: &str| set.current().certificate_for(Some(name)).serial.clone();
    assert_eq!(
        serial("a.test"),
        x.serial,
        "an SNI pair beats the default's own names"
    );
    assert_eq!(serial("b.test"), x.serial, "the earlier pair wins");
    assert_eq!(serial("c.test"), y.serial);

    // X drops b.test: Y gets it. X keeps a.test.
    let x2 = ca.leaf(&["a.test"], 30);
    dirs[1].write(&x2);
    wait_status(&set, |s| s.generation == 2).await;
    assert_eq!(serial("b.test"), y.serial);
    assert_eq!(serial("a.test"), x2.serial);

    // X drops a.test too: the default pair's own name takes over; X takes e.test.
    let x3 = ca.leaf(&["e.test"], 30);
    dirs[1].write(&x3);
    wait_status(&set, |s| s.generation == 3).await;
    assert_eq!(serial("a.test"), default.serial);
    assert_eq!(serial("e.test"), x3.serial);

    // Y claims e.test as well: X, configured first, keeps it.
    let y2 = ca.leaf(&["e.test", "c.test"], 30);
    dirs[2].write(&y2);
    wait_status(&set, |s| s.generation == 4).await;
    assert_eq!(serial("e.test"), x3.serial);
    assert_eq!(serial("c.test"), y2.serial);
    assert_eq!(serial("b.test"), default.serial);
}
