//! A bind mount over a watched directory. inotify reports nothing (the watch
//! stays on the covered directory's inode), so the resync, or an explicit reload, must repair
//! the watch: from then on writes into the mounted directory are seen by events.
//!
//! Needs `mount --bind` (root, or a user namespace allowing it); skipped with the reason
//! otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use reload_lib::ServingSet;

/// Unmounts when dropped (before the temporary directory is removed), even after a panic.
struct BindMount(PathBuf);

impl BindMount {
    fn new(source: &Path, target: &Path) -> Result<Self, String> {
        let output = Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(target)
            .output()
            .map_err(|err| format!("cannot run mount: {err}"))?;
        if output.status.success() {
            Ok(Self(target.to_owned()))
        } else {
            Err(format!(
                "mount --bind failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_mount_over_the_watched_directory_is_watched_after_a_repair() {
    init_tracing();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    let dir = PairDir::new(&certs, Writer::Rename, &ca.leaf(&["localhost"], 30));
    let mounted = ca.leaf(&["localhost"], 30);
    let mut other = PairDir::new(&tmp.path().join("other"), Writer::Rename, &mounted);
    // No resync: only events and the explicit reload below can see a change.
    let set = ServingSet::builder(dir.paths())
        .resync_interval(None)
        .start()
        .await
        .unwrap();

    let _mount = match BindMount::new(&tmp.path().join("other"), &certs) {
        Ok(mount) => mount,
        Err(reason) => {
            eprintln!("skipped: {reason}");
            return;
        }
    };
    // Nothing inotify reports; the explicit reload (like the resync) re-reads and re-watches.
    set.reload().await.unwrap();
    wait_served(
        &set,
        &mounted.serial,
        "the mounted directory after the repair",
    )
    .await;
    for round in 0..3 {
        let next = ca.leaf(&["localhost"], 30);
        other.write(&next);
        wait_served(
            &set,
            &next.serial,
            &format!("write {round} into the mounted directory"),
        )
        .await;
    }
}
