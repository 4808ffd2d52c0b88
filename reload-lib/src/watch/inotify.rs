//! The process-wide inotify instance and its reader thread.
//!
//! A thread, not a tokio `AsyncFd`: the instance is shared by every runtime in the process (tests
//! run one runtime each), and a blocking read costs no wake-ups while idle.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::{Changes, Interest};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};

/// One mask for every watch: inotify keeps one watch per inode, so a directory that is both
/// watched and an ancestor of a missing one must have the same mask for both roles.
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

#[derive(Debug)]
pub(super) struct Watcher {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    watches: Watches,
    next_id: u64,
    subscribers: HashMap<u64, Subscriber>,
    /// Every directory some subscriber cares about.
    dirs: HashMap<PathBuf, DirState>,
    /// Which paths (watched directories or ancestors of missing ones) a descriptor stands for.
    by_wd: HashMap<WatchDescriptor, HashSet<PathBuf>>,
    /// Ancestor path → the missing directories waiting below it.
    ancestors: HashMap<PathBuf, (WatchDescriptor, HashSet<PathBuf>)>,
}

#[derive(Debug)]
struct Subscriber {
    changes: Arc<Changes>,
    dirs: HashMap<PathBuf, BTreeSet<OsString>>,
}

#[derive(Debug)]
enum DirState {
    Armed(WatchDescriptor),
    /// The directory does not exist; the nearest existing ancestor is watched instead.
    Missing {
        ancestor: PathBuf,
    },
}

/// `IN_Q_OVERFLOW` events seen by this process.
pub(super) static OVERFLOWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

static GLOBAL: OnceLock<Result<Arc<Watcher>, String>> = OnceLock::new();

impl Watcher {
    pub(super) fn global() -> Result<Arc<Watcher>, String> {
        GLOBAL
            .get_or_init(|| {
                Watcher::start().map_err(|err| {
                    tracing::warn!(error = %err, "inotify is unavailable; reloaders will poll");
                    format!("inotify unavailable: {err}")
                })
            })
            .clone()
    }

    fn start() -> io::Result<Arc<Watcher>> {
        let inotify = Inotify::init()?;
        let watcher = Arc::new(Watcher {
            state: Mutex::new(State {
                watches: inotify.watches(),
                next_id: 0,
                subscribers: HashMap::new(),
                dirs: HashMap::new(),
                by_wd: HashMap::new(),
                ancestors: HashMap::new(),
            }),
        });
        let reader = Arc::clone(&watcher);
        std::thread::Builder::new()
            .name("reload-lib-inotify".into())
            .spawn(move || reader.run(inotify))?;
        Ok(watcher)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that matters
        // more than losing reloads, so keep going with the inner value.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn subscribe(&self, interest: &Interest, changes: Arc<Changes>) -> io::Result<u64> {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        for dir in interest.dirs.keys() {
            if !state.dirs.contains_key(dir) {
                state.arm_nearest(dir)?;
            }
        }
        state.subscribers.insert(
            id,
            Subscriber {
                changes,
                dirs: interest.dirs.clone().into_iter().collect(),
            },
        );
        Ok(id)
    }

    pub(super) fn unsubscribe(&self, id: u64) {
        let mut state = self.lock();
        let Some(subscriber) = state.subscribers.remove(&id) else {
            return;
        };
        for dir in subscriber.dirs.keys() {
            let still_used = state.subscribers.values().any(|s| s.dirs.contains_key(dir));
            if !still_used {
                state.forget_dir(dir);
            }
        }
    }

    pub(super) fn watch_count(&self) -> usize {
        self.lock().by_wd.len()
    }

    fn run(&self, mut inotify: Inotify) {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let events = match inotify.read_events_blocking(&mut buffer) {
                Ok(events) => events,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    // Without the reader nothing would ever wake; tell everyone to re-read and
                    // rely on their resync timers from now on.
                    tracing::error!(error = %err, "inotify read failed; watching stopped");
                    self.lock().wake_all();
                    return;
                }
            };
            let mut state = self.lock();
            for event in events {
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    OVERFLOWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!("inotify event queue overflowed; reloading everything");
                    state.wake_all();
                    continue;
                }
                state.handle(&event.wd, event.mask, event.name);
            }
        }
    }
}

impl State {
    /// Watches `dir`, or its nearest existing ancestor when it does not exist (yet).
    fn arm_nearest(&mut self, dir: &Path) -> io::Result<()> {
        match self.watches.add(dir, mask()) {
            Ok(wd) => {
                self.by_wd
                    .entry(wd.clone())
                    .or_default()
                    .insert(dir.to_owned());
                self.dirs.insert(dir.to_owned(), DirState::Armed(wd));
                tracing::debug!(dir = %dir.display(), "watching directory");
                Ok(())
            }
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                let mut ancestor = dir.parent();
                while let Some(candidate) = ancestor {
                    match self.watches.add(candidate, mask()) {
                        Ok(wd) => {
                            self.by_wd
                                .entry(wd.clone())
                                .or_default()
                                .insert(candidate.to_owned());
                            self.ancestors
                                .entry(candidate.to_owned())
                                .or_insert_with(|| (wd, HashSet::new()))
                                .1
                                .insert(dir.to_owned());
                            self.dirs.insert(
                                dir.to_owned(),
                                DirState::Missing {
                                    ancestor: candidate.to_owned(),
                                },
                            );
                            tracing::debug!(dir = %dir.display(), ancestor = %candidate.display(), "directory missing; watching ancestor");
                            return Ok(());
                        }
                        Err(err)
                            if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
                        {
                            ancestor = candidate.parent();
                        }
                        Err(err) => return Err(err),
                    }
                }
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// Drops `path`'s use of `wd`, removing the kernel watch when nothing else uses it.
    fn release(&mut self, wd: &WatchDescriptor, path: &Path, kernel_removed: bool) {
        if let Some(paths) = self.by_wd.get_mut(wd) {
            paths.remove(path);
            if paths.is_empty() {
                self.by_wd.remove(wd);
                if !kernel_removed {
                    // Fails harmlessly when the kernel already dropped the watch.
                    let _ = self.watches.remove(wd.clone());
                }
            }
        }
    }

    fn forget_dir(&mut self, dir: &Path) {
        match self.dirs.remove(dir) {
            Some(DirState::Armed(wd)) => self.release(&wd, dir, false),
            Some(DirState::Missing { ancestor }) => self.leave_ancestor(&ancestor, dir),
            None => {}
        }
    }

    fn leave_ancestor(&mut self, ancestor: &Path, dir: &Path) {
        if let Some((wd, waiting)) = self.ancestors.get_mut(ancestor) {
            waiting.remove(dir);
            if waiting.is_empty() {
                let wd = wd.clone();
                self.ancestors.remove(ancestor);
                self.release(&wd, ancestor, false);
            }
        }
    }

    fn handle(&mut self, wd: &WatchDescriptor, mask: EventMask, name: Option<&std::ffi::OsStr>) {
        let Some(paths) = self.by_wd.get(wd).cloned() else {
            return;
        };
        let gone =
            mask.intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF);
        for path in paths {
            if matches!(self.dirs.get(&path), Some(DirState::Armed(armed)) if armed == wd) {
                if gone {
                    self.rearm(&path, wd, mask.contains(EventMask::IGNORED));
                } else {
                    self.wake_for(&path, name);
                }
            }
            if self.ancestors.contains_key(&path) {
                self.retry_missing_below(&path);
            }
        }
    }

    /// The watched directory itself went away (deleted, moved, or replaced): watch whatever is at
    /// its path now, or its nearest ancestor, and make subscribers re-read.
    fn rearm(&mut self, dir: &Path, wd: &WatchDescriptor, kernel_removed: bool) {
        tracing::debug!(dir = %dir.display(), "watched directory went away; re-arming");
        self.dirs.remove(dir);
        self.release(wd, dir, kernel_removed);
        if let Err(err) = self.arm_nearest(dir) {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot re-arm directory watch; relying on resync");
        }
        self.wake_for(dir, None);
    }

    fn retry_missing_below(&mut self, ancestor: &Path) {
        let Some((_, waiting)) = self.ancestors.get(ancestor) else {
            return;
        };
        for dir in waiting.clone() {
            self.leave_ancestor(ancestor, &dir);
            self.dirs.remove(&dir);
            match self.arm_nearest(&dir) {
                Ok(()) => {
                    if matches!(self.dirs.get(&dir), Some(DirState::Armed(_))) {
                        tracing::debug!(dir = %dir.display(), "watched directory is back");
                        self.wake_for(&dir, None);
                    }
                }
                Err(err) => {
                    tracing::warn!(dir = %dir.display(), error = %err, "cannot re-arm directory watch; relying on resync")
                }
            }
        }
    }

    /// Marks and wakes the subscribers of `dir` that care about `name`. Names starting with `..`
    /// are the kubelet's `..data` machinery and concern every file of the directory; `None` means
    /// the directory itself.
    fn wake_for(&self, dir: &Path, name: Option<&std::ffi::OsStr>) {
        let whole_dir = name.is_none_or(|n| n.as_encoded_bytes().starts_with(b".."));
        for subscriber in self.subscribers.values() {
            let Some(names) = subscriber.dirs.get(dir) else {
                continue;
            };
            match name {
                _ if whole_dir => subscriber.changes.mark_dir(dir),
                Some(name) if names.contains(name) => subscriber.changes.mark_file(dir.join(name)),
                _ => {}
            }
        }
    }

    fn wake_all(&self) {
        for subscriber in self.subscribers.values() {
            subscriber.changes.mark_all();
        }
    }
}
