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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
/// the caller re-reads the files and compares. When inotify cannot be used, from the start or
/// since the watches were lost mid-run (the watch limit reached, the reader gone), [`mode`] says
/// why and [`changed`] polls: every [`poll_interval`] (1 s by default) it compares each file's
/// `stat` (device, inode, size, modification and change times, following symlinks, so a
/// `..data` swap counts) with the last poll's, and resolves when one differs. A rewrite that
/// keeps all of these (same size, within the file system's timestamp granularity: nanoseconds
/// on ext4, xfs and tmpfs) is not seen by polling; the caller's own periodic resync covers it.
/// Dropping the `FileWatch` removes the watches nobody else uses.
///
/// [`mode`]: FileWatch::mode
/// [`changed`]: FileWatch::changed
/// [`poll_interval`]: FileWatch::poll_interval
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use reload_lib::watch::FileWatch;
///
/// let dir = tempfile::tempdir()?;
/// let bundle = dir.path().join("ca-bundle.crt");
/// let watch = FileWatch::new([&bundle]).poll_interval(Duration::from_millis(500));
/// std::fs::write(&bundle, "new content")?;
/// // Whether inotify or polling sees it.
/// watch.changed().await;
/// // Now re-read the file.
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FileWatch {
    changes: Arc<Changes>,
    /// Holds the directory watches; `None` while polling.
    _subscription: Option<Subscription>,
    mode: WatchMode,
    files: Arc<[PathBuf]>,
    poll_interval: Duration,
    /// While polling: what the files looked like at the last poll, and when the next one is due
    /// (kept across calls, so a `changed` dropped by a `select!` does not put the poll off).
    polled: Mutex<Polled>,
}

/// What one poll saw of each file (`None`: it could not be `stat`ed, e.g. absent).
type Stamps = Vec<Option<FileStamp>>;

/// The `stat` facts that change when a file is written, replaced or removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

#[derive(Debug, Default)]
struct Polled {
    /// `None` until polling begins (at the start, or when the watches are lost).
    stamps: Option<Stamps>,
    next: Option<tokio::time::Instant>,
}

const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

impl FileWatch {
    /// Watches `files`: they need not exist yet, nor their directories (the nearest existing
    /// ancestor is watched until they appear). Never fails: without inotify (unsupported, the
    /// instance or watch limit reached) the watch is [`WatchMode::Polling`] with the reason.
    pub fn new<P: AsRef<Path>>(files: impl IntoIterator<Item = P>) -> FileWatch {
        let mut interest = Interest::default();
        let mut paths = Vec::new();
        for file in files {
            interest.add_file(file.as_ref());
            paths.push(file.as_ref().to_owned());
        }
        let changes = Arc::new(Changes::default());
        let (subscription, mode) = subscribe(&interest, Arc::clone(&changes));
        let watch = FileWatch {
            changes,
            _subscription: subscription,
            mode,
            files: paths.into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            polled: Mutex::default(),
        };
        if watch.is_polling() {
            // The caller reads the files after this: anything later differs from these.
            watch.lock_polled().stamps = Some(stamps(&watch.files));
        }
        watch
    }

    /// How often [`changed`](FileWatch::changed) looks at the files while polling (default
    /// 1 s). Never used while inotify works.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> FileWatch {
        self.poll_interval = interval;
        self
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
    /// already happened): an inotify event, or, while [`mode`](FileWatch::mode) is polling, a
    /// poll that saw a file differ. When the watches are lost mid-run it resolves once at once
    /// (re-read everything), then polls. Cancel-safe: dropped and called again, it neither
    /// loses a change nor restarts the poll interval.
    pub async fn changed(&self) {
        loop {
            if self.is_polling() {
                if self.begin_polling().await {
                    return;
                }
                return self.polled_change().await;
            }
            self.changes.notified().await;
            // Something was marked (or everything was): a wake-up worth returning.
            let dirty = self.changes.take();
            if self.changes.is_degraded() {
                // The watches were lost: polling begins (next turn).
                continue;
            }
            if dirty.all || !dirty.files.is_empty() || !dirty.dirs.is_empty() {
                return;
            }
        }
    }

    fn is_polling(&self) -> bool {
        matches!(self.mode, WatchMode::Polling(_)) || self.changes.is_degraded()
    }

    /// The first call since the watches were lost: takes what the files look like now as the
    /// base of the polls and says so (`true`: the caller must re-read, changes since its last
    /// read were not watched). `false` once polling has begun.
    async fn begin_polling(&self) -> bool {
        if self.lock_polled().stamps.is_some() {
            return false;
        }
        let now = self.stamp_files().await;
        let mut polled = self.lock_polled();
        polled.stamps = Some(now);
        polled.next = Some(tokio::time::Instant::now() + self.poll_interval);
        true
    }

    /// Polls at the interval until a file's stamp differs from the last poll's.
    async fn polled_change(&self) {
        loop {
            let due = *self
                .lock_polled()
                .next
                .get_or_insert_with(|| tokio::time::Instant::now() + self.poll_interval);
            tokio::time::sleep_until(due).await;
            let now = self.stamp_files().await;
            let mut polled = self.lock_polled();
            polled.next = Some(tokio::time::Instant::now() + self.poll_interval);
            let changed = polled.stamps.as_ref() != Some(&now);
            polled.stamps = Some(now);
            if changed {
                return;
            }
        }
    }

    /// The files' stamps, read off the async workers (`stat` may block on a hung network file
    /// system).
    async fn stamp_files(&self) -> Stamps {
        let files = Arc::clone(&self.files);
        match tokio::task::spawn_blocking(move || stamps(&files)).await {
            Ok(stamps) => stamps,
            // The blocking pool is shutting down with the runtime: read here.
            Err(_) => stamps(&self.files),
        }
    }

    fn lock_polled(&self) -> std::sync::MutexGuard<'_, Polled> {
        // Plain assignments: a panic elsewhere cannot leave them half done.
        self.polled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn stamps(files: &[PathBuf]) -> Stamps {
    use std::os::unix::fs::MetadataExt;
    files
        .iter()
        .map(|file| {
            let meta = std::fs::metadata(file).ok()?;
            Some(FileStamp {
                dev: meta.dev(),
                ino: meta.ino(),
                len: meta.len(),
                modified: (meta.mtime(), meta.mtime_nsec()),
                changed: (meta.ctime(), meta.ctime_nsec()),
            })
        })
        .collect()
}
