//! Watches that used to be lost for good (a parent's watch dropped for
//! another role, symlinked revision directories, symlinked files, renamed parents, `mkdir -p`
//! races). Every set here has no resync, so only events (or an explicit repair) can see a
//! change.

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use common::*;
use reload_lib::{CertKeyPaths, ServingSet};

async fn set_for(paths: CertKeyPaths) -> ServingSet {
    ServingSet::builder(paths)
        .resync_interval(None)
        .start()
        .await
        .unwrap()
}

fn write_pair(dir: &Path, pair: &Pair) {
    std::fs::create_dir_all(dir).unwrap();
    rename_into(&dir.join("tls.key"), pair.key_pem.as_bytes());
    rename_into(&dir.join("tls.crt"), pair.cert_pem.as_bytes());
}

fn pair_in(dir: &Path) -> CertKeyPaths {
    CertKeyPaths::new(dir.join("tls.crt"), dir.join("tls.key"))
}

// Item 5 -----------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_directory_stays_watched_when_a_subdirectory_is_recreated() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("p");
    write_pair(&parent, &ca.leaf(&["localhost"], 30));
    write_pair(&parent.join("sub"), &ca.leaf(&["localhost"], 30));
    let outer = set_for(pair_in(&parent)).await;
    let inner = set_for(pair_in(&parent.join("sub"))).await;

    // The subdirectory goes away; once its set has seen that (it then also watches the parent,
    // for the subdirectory's return), it comes back. Without the wait the watcher may only see
    // the subdirectory already recreated, and the parent's watch is never shared.
    let mut inner_rx = inner.subscribe();
    std::fs::remove_dir_all(parent.join("sub")).unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        inner_rx.wait_for(|s| s.last_error.is_some()),
    )
    .await
    .expect("the deleted subdirectory was not reported")
    .unwrap();
    let back = ca.leaf(&["localhost"], 30);
    write_pair(&parent.join("sub"), &back);
    wait_served(&inner, &back.serial, "the recreated subdirectory").await;

    // The parent's own set still sees its rotations.
    let next = ca.leaf(&["localhost"], 30);
    write_pair(&parent, &next);
    wait_served(
        &outer,
        &next.serial,
        "the parent after the subdirectory came back",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_set_that_waits_below_a_directory_keeps_that_directory_watched() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("p");
    write_pair(&parent, &ca.leaf(&["localhost"], 30));
    let outer = set_for(pair_in(&parent)).await;
    // A second set whose directory below `p` goes away: it then waits on `p` for it to return.
    write_pair(&parent.join("later"), &ca.leaf(&["localhost"], 30));
    let waiting = set_for(pair_in(&parent.join("later"))).await;
    std::fs::remove_dir_all(parent.join("later")).unwrap();
    // Let the watcher move the waiting set's watch to the parent.
    let mut rx = waiting.subscribe();
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.last_error.is_some()),
    )
    .await;
    drop(waiting);

    let next = ca.leaf(&["localhost"], 30);
    write_pair(&parent, &next);
    wait_served(
        &outer,
        &next.serial,
        "the parent after the other set was dropped",
    )
    .await;
}

// Item 7 -----------------------------------------------------------------------------------------

/// `ln -sfn target link`, atomically (a new link renamed over the old one).
fn swap_link(target: &str, link: &Path) {
    let tmp = link.with_extension("tmp-link");
    let _ = std::fs::remove_file(&tmp);
    symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_revision_directory_swap_is_seen_every_time() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    // /etc/kubernetes/static-pod-resources/kube-apiserver-certs -> kube-apiserver-pod-N
    let base = tmp.path().join("static-pod-resources");
    write_pair(
        &base.join("kube-apiserver-pod-1"),
        &ca.leaf(&["localhost"], 30),
    );
    let certs = base.join("kube-apiserver-certs");
    symlink("kube-apiserver-pod-1", &certs).unwrap();
    let set = set_for(pair_in(&certs)).await;
    for revision in 2..=4 {
        let next = ca.leaf(&["localhost"], 30);
        let name = format!("kube-apiserver-pod-{revision}");
        write_pair(&base.join(&name), &next);
        swap_link(&name, &certs);
        wait_served(&set, &next.serial, &format!("revision {revision}")).await;
        // And a rotation inside the revision now linked.
        let inside = ca.leaf(&["localhost"], 30);
        write_pair(&base.join(&name), &inside);
        wait_served(
            &set,
            &inside.serial,
            &format!("a write inside revision {revision}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinked_files_whose_targets_change_elsewhere_are_seen() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    write_pair(&real, &ca.leaf(&["localhost"], 30));
    let links = tmp.path().join("links");
    std::fs::create_dir(&links).unwrap();
    symlink(real.join("tls.crt"), links.join("tls.crt")).unwrap();
    symlink(real.join("tls.key"), links.join("tls.key")).unwrap();
    let set = set_for(pair_in(&links)).await;
    for round in 0..3 {
        let next = ca.leaf(&["localhost"], 30);
        write_pair(&real, &next);
        wait_served(
            &set,
            &next.serial,
            &format!("target rewritten, round {round}"),
        )
        .await;
    }
    // The links now point to another directory: that one is followed from then on.
    let other = tmp.path().join("other");
    let moved = ca.leaf(&["localhost"], 30);
    write_pair(&other, &moved);
    swap_link(
        other.join("tls.key").to_str().unwrap(),
        &links.join("tls.key"),
    );
    swap_link(
        other.join("tls.crt").to_str().unwrap(),
        &links.join("tls.crt"),
    );
    wait_served(&set, &moved.serial, "links re-pointed").await;
    let after = ca.leaf(&["localhost"], 30);
    write_pair(&other, &after);
    wait_served(&set, &after.serial, "the new target rewritten").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_files_replaced_by_symlinks_to_another_directory_are_followed_there() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    write_pair(&certs, &ca.leaf(&["localhost"], 30));
    let set = set_for(pair_in(&certs)).await;
    // The plain files become links into another directory (renamed over them: the events name
    // the files; nothing says they are links but the pass that reads them).
    let other = tmp.path().join("other");
    let moved = ca.leaf(&["localhost"], 30);
    write_pair(&other, &moved);
    swap_link(
        other.join("tls.key").to_str().unwrap(),
        &certs.join("tls.key"),
    );
    swap_link(
        other.join("tls.crt").to_str().unwrap(),
        &certs.join("tls.crt"),
    );
    wait_served(&set, &moved.serial, "files replaced by links").await;
    // Only a watch on the other directory sees this (no resync, no event in `certs`).
    for round in 0..3 {
        let next = ca.leaf(&["localhost"], 30);
        write_pair(&other, &next);
        wait_served(
            &set,
            &next.serial,
            &format!("link target rewritten, round {round}"),
        )
        .await;
    }
    // Plain files again: followed where they are.
    let plain = ca.leaf(&["localhost"], 30);
    let staged = tmp.path().join("staged");
    write_pair(&staged, &plain);
    std::fs::rename(staged.join("tls.key"), certs.join("tls.key")).unwrap();
    std::fs::rename(staged.join("tls.crt"), certs.join("tls.crt")).unwrap();
    wait_served(&set, &plain.serial, "links replaced by plain files").await;
    let last = ca.leaf(&["localhost"], 30);
    write_pair(&certs, &last);
    wait_served(&set, &last.serial, "plain files rewritten").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_roots_file_replaced_by_a_symlink_is_followed_into_its_directory() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let roots = tmp.path().join("roots.crt");
    rename_into(&roots, Ca::new("one").cert_pem.as_bytes());
    let client = reload_lib::ClientTls::builder(&roots)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let (two, three) = (Ca::new("two"), Ca::new("three"));
    rename_into(&elsewhere.join("bundle.crt"), two.cert_pem.as_bytes());
    swap_link(elsewhere.join("bundle.crt").to_str().unwrap(), &roots);
    let mut rx = client.subscribe();
    let subject = |rx: &reload_lib::Status| rx.served[0].info.subject.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| subject(s).contains("two")),
    )
    .await
    .expect("the roots file replaced by a link was not read")
    .unwrap();
    rename_into(&elsewhere.join("bundle.crt"), three.cert_pem.as_bytes());
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| subject(s).contains("three")),
    )
    .await
    .expect("the link's target rewritten in its own directory was not seen")
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_parent_is_watched_again_after_a_repair() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("a").join("certs");
    write_pair(&certs, &ca.leaf(&["localhost"], 30));
    let set = set_for(pair_in(&certs)).await;
    // The parent moves away (the watch follows the moved inode) and a new tree takes its place.
    std::fs::rename(tmp.path().join("a"), tmp.path().join("a-old")).unwrap();
    let replaced = ca.leaf(&["localhost"], 30);
    write_pair(&certs, &replaced);
    // Nothing inotify reports; the explicit reload (like the resync) repairs the watches.
    set.reload().await.unwrap();
    wait_served(&set, &replaced.serial, "after the repair").await;
    let next = ca.leaf(&["localhost"], 30);
    write_pair(&certs, &next);
    wait_served(&set, &next.serial, "an event after the repair").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mkdir_p_racing_the_re_arm_of_a_deleted_directory_never_leaves_it_unwatched() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("x").join("y").join("certs");
    write_pair(&certs, &ca.leaf(&["localhost"], 30));
    let set = set_for(pair_in(&certs)).await;
    for round in 0..100 {
        std::fs::remove_dir_all(tmp.path().join("x")).unwrap();
        let next = ca.leaf(&["localhost"], 30);
        // `mkdir -p` then the files, as fast as possible.
        write_pair(&certs, &next);
        wait_served(&set, &next.serial, &format!("round {round}")).await;
    }
}
