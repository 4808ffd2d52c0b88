//! Change detection. One inotify instance per process, shared by every reloader, watching
//! directories (never files: a file watch dies when the file is renamed over). When inotify cannot
//! be used, reloaders fall back to polling: never to no reload.
//!
//! The watcher only says "something in a directory you care about changed"; reloaders re-read and
//! compare content, so a spurious wake-up costs one read and no swap.

mod inotify;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Notify;

/// How a reloader learns about changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMode {
    /// inotify directory watches, plus the periodic resync.
    Inotify,
    /// No inotify (instance or watch limit reached, or not supported): the files are polled at the
    /// poll interval. The reason says why.
    Polling(String),
}

/// The files a reloader reads, grouped by directory: what the watcher needs to know.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interest {
    dirs: BTreeMap<PathBuf, BTreeSet<OsString>>,
}

impl Interest {
    pub(crate) fn add_file(&mut self, file: &Path) {
        let file = std::path::absolute(file).unwrap_or_else(|_| file.to_owned());
        let dir = file
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("/"));
        let names = self.dirs.entry(dir).or_default();
        if let Some(name) = file.file_name() {
            names.insert(name.to_owned());
        }
    }
}

/// An active registration; dropping it removes the watches nobody else uses.
#[derive(Debug)]
pub(crate) struct Subscription {
    id: u64,
    watcher: Arc<inotify::Watcher>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watcher.unsubscribe(self.id);
    }
}

/// Registers `interest`; `wake` is notified (coalescing: one stored permit) whenever one of the
/// files may have changed, after an event-queue overflow, and when a watched directory comes back.
pub(crate) fn subscribe(
    interest: &Interest,
    wake: Arc<Notify>,
) -> (Option<Subscription>, WatchMode) {
    let watcher = match inotify::Watcher::global() {
        Ok(watcher) => watcher,
        Err(reason) => return (None, WatchMode::Polling(reason)),
    };
    match watcher.subscribe(interest, wake) {
        Ok(id) => (Some(Subscription { id, watcher }), WatchMode::Inotify),
        Err(err) => (
            None,
            WatchMode::Polling(format!("cannot add inotify watches: {err}")),
        ),
    }
}

/// The number of directory watches held by this process's shared inotify instance (for tests and
/// metrics).
pub fn active_watch_count() -> usize {
    inotify::Watcher::global()
        .map(|watcher| watcher.watch_count())
        .unwrap_or(0)
}

/// How many times this process's inotify queue overflowed (each time, every reloader re-read
/// everything).
pub fn overflow_count() -> u64 {
    inotify::OVERFLOWS.load(std::sync::atomic::Ordering::Relaxed)
}
