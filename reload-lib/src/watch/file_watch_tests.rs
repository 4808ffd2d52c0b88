//! [`FileWatch`](super::FileWatch) on real files and real inotify.

use super::{FileWatch, WatchMode};
use std::time::Duration;

async fn wakes(watch: &FileWatch) -> bool {
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .is_ok()
}

#[tokio::test]
async fn a_write_a_rename_over_and_a_removal_each_wake_and_other_files_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ca-bundle.crt");
    let watch = FileWatch::new([&file]);
    if let WatchMode::Polling(reason) = watch.mode() {
        println!("SKIP: no inotify here: {reason}");
        return;
    }
    std::fs::write(&file, "one").unwrap();
    assert!(wakes(&watch).await, "a created file");

    let staged = dir.path().join(".staged");
    std::fs::write(&staged, "two").unwrap();
    std::fs::rename(&staged, &file).unwrap();
    assert!(wakes(&watch).await, "a rename over the file");

    std::fs::remove_file(&file).unwrap();
    assert!(wakes(&watch).await, "a removal");

    // Another file of the same directory: no wake-up.
    std::fs::write(dir.path().join("unrelated"), "x").unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(300), watch.changed()).await;
    assert!(quiet.is_err(), "woken by a file it does not watch");
}

#[tokio::test]
async fn a_file_whose_directory_appears_later_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("later/ca-bundle.crt");
    let watch = FileWatch::new([&file]);
    if let WatchMode::Polling(reason) = watch.mode() {
        println!("SKIP: no inotify here: {reason}");
        return;
    }
    std::fs::create_dir(dir.path().join("later")).unwrap();
    assert!(wakes(&watch).await, "the directory's creation");
    // The watch moves to the new directory: a write there wakes it (written until seen,
    // as the move and the first write may cross).
    let mut seen = false;
    for _ in 0..5 {
        std::fs::write(&file, "content").unwrap();
        if wakes(&watch).await {
            seen = true;
            break;
        }
    }
    assert!(seen, "a write in the directory that appeared");
}
