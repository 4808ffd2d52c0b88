//! Change detection. One inotify instance per process, shared by every reloader, watching
//! directories (never files: a file watch dies when the file is renamed over). When inotify cannot
//! be used, reloaders fall back to polling: never to no reload.
//!
//! The watcher says which file (or, for the kubelet's `..data` machinery and re-armed directories,
//! which directory) may have changed; reloaders re-read those and compare content, so a spurious
//! wake-up costs one read and no swap. Events it cannot attribute (queue overflow, a failed read)
//! mark everything.
//!
//! [`FileWatch`] offers the same watcher to code that reacts to files itself.

mod changes;
#[cfg(test)]
mod file_watch_tests;
mod inotify;

pub(crate) use changes::{Changes, Dirty, Interest, watch_path};

use std::path::Path;
use std::sync::Arc;

/// How a reloader learns about changes. Either way, changes are found: polling is a fallback,
/// never "no reload".
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, ServingSet, WatchMode};
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
/// match set.watch_mode() {
///     WatchMode::Inotify => println!("changes are seen within milliseconds"),
///     WatchMode::Polling(reason) => println!("polling every second: {reason}"),
/// }
/// let polled = ServingSet::builder(CertKeyPaths::new(&crt, &key)).poll_only(true).start().await?;
/// assert!(matches!(polled.watch_mode(), WatchMode::Polling(_)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMode {
    /// inotify directory watches, plus the periodic resync.
    Inotify,
    /// No inotify (instance or watch limit reached, or not supported): the files are polled at the
    /// poll interval. The reason says why.
    Polling(String),
}

/// An active registration; dropping it removes the watches nobody else uses.
#[derive(Debug)]
pub(crate) struct Subscription {
    id: u64,
    watcher: Arc<inotify::Watcher>,
}

impl Subscription {
    /// Re-resolves and re-watches every directory of the subscription: the periodic resync's
    /// repair of whatever inotify could not report (a renamed parent, a bind mount).
    pub(crate) fn repair(&self) {
        self.watcher.repair(self.id);
    }

    /// Files a pass read through a symlink of their own (to a file elsewhere): the directory of
    /// each one the watcher does not yet know as symlinked is armed again, so the directory the
    /// link points into is watched as well, and read again. The watcher itself never `lstat`s a
    /// file to learn this: every rotation would pay a system call for the rare symlinked file.
    pub(crate) fn follow(&self, symlinked: &[std::path::PathBuf]) {
        if !symlinked.is_empty() {
            self.watcher.follow(symlinked);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watcher.unsubscribe(self.id);
    }
}

/// Registers `interest`; `changes` is marked and woken whenever one of the files may have
/// changed (the file, or its whole directory for `..data` swaps and re-armed directories), and
/// marked entirely after an event-queue overflow.
pub(crate) fn subscribe(
    interest: &Interest,
    changes: Arc<Changes>,
) -> (Option<Subscription>, WatchMode) {
    let watcher = match inotify::Watcher::global() {
        Ok(watcher) => watcher,
        Err(reason) => return (None, WatchMode::Polling(reason)),
    };
    match watcher.subscribe(interest, changes) {
        Ok(id) => (Some(Subscription { id, watcher }), WatchMode::Inotify),
        Err(err) => (
            None,
            WatchMode::Polling(format!("cannot add inotify watches: {err}")),
        ),
    }
}

/// The number of directory watches held by this process's shared inotify instance (for tests and
/// metrics). Watches are per directory and shared between sets; they are removed when the last
/// set using a directory is dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
/// # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
/// # std::fs::write(&crt, pair.cert.pem())?;
/// # std::fs::write(&key, pair.signing_key.serialize_pem())?;
/// use reload_lib::{CertKeyPaths, ServingSet, WatchMode, watch::active_watch_count};
///
/// let set = ServingSet::builder(CertKeyPaths::new(&crt, &key)).start().await?;
/// if *set.watch_mode() == WatchMode::Inotify {
///     assert!(active_watch_count() >= 1); // the directory of tls.crt and tls.key
/// }
/// # Ok(()) }
/// ```
pub fn active_watch_count() -> usize {
    inotify::Watcher::global()
        .map(|watcher| watcher.watch_count())
        .unwrap_or(0)
}

/// Caps the kernel watches of this process's inotify instance at `max` (`None`: the kernel's
/// limit only), so a test can reach the watch limit mid-run, and see the polling fallback,
/// without lowering the system-wide `fs.inotify.max_user_watches`. Not part of the API.
#[doc(hidden)]
pub fn __limit_watches(max: Option<usize>) {
    if let Ok(watcher) = inotify::Watcher::global() {
        watcher.limit_watches(max);
    }
}

/// How many times this process's inotify queue overflowed (each time, every reloader re-read
/// everything, so no change was lost). Worth a metric; a growing count means the kernel's
/// `max_queued_events` is too small for the write rate.
///
/// ```
/// let overflows: u64 = reload_lib::watch::overflow_count();
/// println!("inotify queue overflows so far: {overflows}");
/// ```
pub fn overflow_count() -> u64 {
    inotify::OVERFLOWS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Wakes a task when one of some files may have changed: created, written, renamed over or
/// removed, including a `..data` swap of a Kubernetes volume. It uses the same inotify instance
/// and directory watches as the reloaders (never a watch on a file: it would die with the first
/// rename over it), so it costs no inotify instance of its own.
///
/// Wake-ups coalesce (many events before the task looks are one wake-up) and may be spurious:
/// the caller re-reads the files and compares. When inotify cannot be used, [`mode`] says why
/// and [`changed`] never resolves: the caller polls instead. Dropping the `FileWatch` removes
/// the watches nobody else uses.
///
/// [`mode`]: FileWatch::mode
/// [`changed`]: FileWatch::changed
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use reload_lib::{WatchMode, watch::FileWatch};
///
/// let dir = tempfile::tempdir()?;
/// let bundle = dir.path().join("ca-bundle.crt");
/// let watch = FileWatch::new([&bundle]);
/// std::fs::write(&bundle, "new content")?;
/// match watch.mode() {
///     WatchMode::Inotify => watch.changed().await,
///     WatchMode::Polling(_) => tokio::time::sleep(Duration::from_secs(1)).await,
/// }
/// // Now re-read the file.
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FileWatch {
    changes: Arc<Changes>,
    /// Holds the directory watches; `None` while polling.
    _subscription: Option<Subscription>,
    mode: WatchMode,
}

impl FileWatch {
    /// Watches `files`: they need not exist yet, nor their directories (the nearest existing
    /// ancestor is watched until they appear). Never fails: without inotify (unsupported, the
    /// instance or watch limit reached) the watch is [`WatchMode::Polling`] with the reason.
    pub fn new<P: AsRef<Path>>(files: impl IntoIterator<Item = P>) -> FileWatch {
        let mut interest = Interest::default();
        for file in files {
            interest.add_file(file.as_ref());
        }
        let changes = Arc::new(Changes::default());
        let (subscription, mode) = subscribe(&interest, Arc::clone(&changes));
        FileWatch {
            changes,
            _subscription: subscription,
            mode,
        }
    }

    /// How changes are seen: [`WatchMode::Inotify`], or [`WatchMode::Polling`] with the reason
    /// (from the start, or since the watches were lost mid-run: the watch limit reached, the
    /// inotify reader gone).
    pub fn mode(&self) -> WatchMode {
        match &self.mode {
            WatchMode::Inotify if self.changes.is_degraded() => WatchMode::Polling(
                "the inotify watches were lost (watch limit or reader failure)".to_owned(),
            ),
            mode => mode.clone(),
        }
    }

    /// Resolves when a file may have changed since the last call returned (at once if that
    /// already happened). Never resolves while [`mode`](FileWatch::mode) is polling from the
    /// start; once the watches are lost mid-run it resolves one last time.
    pub async fn changed(&self) {
        loop {
            self.changes.notified().await;
            // Something was marked (or everything was): a wake-up worth returning.
            let dirty = self.changes.take();
            if dirty.all || !dirty.files.is_empty() || !dirty.dirs.is_empty() {
                return;
            }
        }
    }
}
