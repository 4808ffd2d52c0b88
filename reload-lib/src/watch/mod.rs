//! Change detection. One inotify instance per process, shared by every reloader, watching
//! directories (never files: a file watch dies when the file is renamed over). When inotify cannot
//! be used, reloaders fall back to polling: never to no reload.
//!
//! The watcher says which file (or, for the kubelet's `..data` machinery and re-armed directories,
//! which directory) may have changed; reloaders re-read those and compare content, so a spurious
//! wake-up costs one read and no swap. Events it cannot attribute (queue overflow, a failed read)
//! mark everything.

mod inotify;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

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

/// The files a reloader reads, grouped by directory: what the watcher needs to know.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interest {
    dirs: BTreeMap<PathBuf, BTreeSet<OsString>>,
}

impl Interest {
    pub(crate) fn add_file(&mut self, file: &Path) {
        let file = watch_path(file);
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

/// The form in which the watcher reports `path` in [`Dirty`] (absolute, not canonicalised: a
/// symlinked file is reported under its own name).
pub(crate) fn watch_path(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// What may have changed since the reloader last looked.
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    /// Something nobody can attribute (queue overflow, watching stopped, an explicit reload, a
    /// resync): re-read everything.
    pub(crate) all: bool,
    /// Files named in events (in [`watch_path`] form).
    pub(crate) files: HashSet<PathBuf>,
    /// Directories where any file may have changed: `..data` swaps, a directory re-armed.
    pub(crate) dirs: HashSet<PathBuf>,
}

impl Dirty {
    /// Everything.
    pub(crate) fn all() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    /// Adds what `other` marks.
    pub(crate) fn merge(&mut self, other: Dirty) {
        self.all |= other.all;
        if !self.all {
            self.files.extend(other.files);
            self.dirs.extend(other.dirs);
        }
    }
}

/// Where the watcher records changes for one reloader and wakes it: a coalescing wake-up (one
/// stored permit, the dirty flag) plus what was marked since the reloader last took it.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    wake: Notify,
    dirty: Mutex<Dirty>,
    /// Set when some of the reloader's directories can no longer be watched (the watch limit
    /// reached mid-run, the reader thread gone): it must poll from now on.
    degraded: std::sync::atomic::AtomicBool,
}

impl Changes {
    /// Waits for the next wake-up (returns at once if one is stored).
    pub(crate) async fn notified(&self) {
        self.wake.notified().await;
    }

    /// Takes what was marked so far, leaving nothing marked.
    pub(crate) fn take(&self) -> Dirty {
        std::mem::take(&mut *self.lock())
    }

    /// Marks `file`; the watcher [`wake`](Self::wake)s once its queue is drained.
    fn mark_file(&self, file: PathBuf) {
        let mut dirty = self.lock();
        if !dirty.all {
            dirty.files.insert(file);
        }
    }

    /// Marks `dir`; the watcher [`wake`](Self::wake)s once its queue is drained.
    fn mark_dir(&self, dir: &Path) {
        let mut dirty = self.lock();
        if !dirty.all && !dirty.dirs.contains(dir) {
            dirty.dirs.insert(dir.to_owned());
        }
    }

    /// Wakes the reloader for what was marked.
    fn wake(&self) {
        self.wake.notify_one();
    }

    /// Tells the reloader to poll from now on, and to re-read everything now.
    pub(crate) fn degrade(&self) {
        self.degraded
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.mark_all();
    }

    /// Whether [`degrade`](Self::degrade) was called.
    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn mark_all(&self) {
        let mut dirty = self.lock();
        *dirty = Dirty::all();
        drop(dirty);
        self.wake.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Dirty> {
        // Marks are plain inserts: a panic elsewhere cannot leave them half done.
        self.dirty
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
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
