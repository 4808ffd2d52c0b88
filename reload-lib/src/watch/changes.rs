//! What the watcher reports to reloaders: the paths a reloader cares about ([`Interest`]) and
//! what changed among them ([`Changes`], [`Dirty`]). A leaf: the watcher and the reloaders both
//! use it, it uses neither.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tokio::sync::Notify;

/// The files a reloader reads, grouped by directory: what the watcher needs to know.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interest {
    pub(super) dirs: BTreeMap<PathBuf, BTreeSet<OsString>>,
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
    pub(super) dirty: Mutex<Dirty>,
    /// Set when some of the reloader's directories can no longer be watched (the watch limit
    /// reached mid-run, the inotify reader gone): it must poll from now on.
    degraded: std::sync::atomic::AtomicBool,
}

impl Changes {
    /// Waits for the next wake-up (returns at once if one is stored).
    pub(crate) async fn notified(&self) {
        self.wake.notified().await;
    }

    /// Looks at what was marked so far, leaving it marked.
    pub(crate) fn inspect<R>(&self, look: impl FnOnce(&Dirty) -> R) -> R {
        look(&self.lock())
    }

    /// Takes what was marked so far, leaving nothing marked.
    pub(crate) fn take(&self) -> Dirty {
        std::mem::take(&mut *self.lock())
    }

    /// Marks `file`; the watcher [`wake`](Self::wake)s once its queue is drained.
    pub(super) fn mark_file(&self, file: PathBuf) {
        let mut dirty = self.lock();
        if !dirty.all {
            dirty.files.insert(file);
        }
    }

    /// Marks `dir`; the watcher [`wake`](Self::wake)s once its queue is drained.
    pub(super) fn mark_dir(&self, dir: &Path) {
        let mut dirty = self.lock();
        if !dirty.all && !dirty.dirs.contains(dir) {
            dirty.dirs.insert(dir.to_owned());
        }
    }

    /// Wakes the reloader for what was marked.
    pub(super) fn wake(&self) {
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Dirty> {
        // Marks are plain inserts: a panic elsewhere cannot leave them half done.
        self.dirty
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
