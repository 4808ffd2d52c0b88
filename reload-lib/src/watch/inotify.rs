//! The process-wide inotify instance and its reader.
//!
//! The reader is a task on the crate's own runtime (see `runtime`), the thread that runs every
//! reload pass, waiting on the instance through the runtime's epoll (`AsyncFd`): idle, it costs
//! no wake-up; woken by events, it marks and wakes the reloaders on the same thread, so the
//! pass that follows a rotation needs no second thread woken. Measured (BENCHMARKS.md,
//! "Rotations"): the dedicated reader thread it replaces was switched in 3.2 times per bundle
//! rotation, and each of its blocking reads cost four `fcntl`s (the inotify crate toggles
//! `O_NONBLOCK` around it), then woke the runtime thread through its eventfd. A pass stuck on a
//! hung filesystem holds the reader as well (as it holds every other set's passes): the kernel
//! queues the events meanwhile, and a queue overflow marks everything.
//!
//! Model: each directory of interest holds watches on a set of paths (inotify watches inodes,
//! found by path): the directory itself when it exists, else its nearest existing ancestor; the
//! directory holding each symlink on its path (so a swapped link, the static-pod
//! `…-certs -> …-N` pattern, is seen); and the directory of the target of each symlinked file
//! that points elsewhere. A watched path may be held by several directories, in several roles;
//! the kernel watch goes when the last holder lets go. Whenever what a path resolves to may
//! have changed (the directory went away, a trigger entry changed, a queue overflow, the periodic
//! resync), the directory is *repaired*: its paths are resolved and watched again, and its
//! subscribers re-read it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

mod events;
mod holds;

use super::changes::{Changes, Interest};
use crate::layout;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::io::unix::AsyncFd;

/// One mask for every watch: inotify keeps one watch per inode, so a directory watched in
/// several roles must have the same mask for all of them. `MODIFY` so that a writer that keeps
/// the file open is seen before it closes it.
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// The reader's buffer: a read returns as many queued events as fit.
const READ_BUFFER: usize = 64 * 1024;

/// Fewer events than this in one read left room in [`READ_BUFFER`] for one more of the largest
/// (`struct inotify_event`, 16 bytes, plus a name of up to `NAME_MAX` = 255 bytes and its NUL):
/// the kernel returned them all.
const EVENTS_SURELY_SHORT: usize = READ_BUFFER / (16 + 256) - 1;

/// How many times arming retries when a path component appears while it arms (`mkdir -p`).
const ARM_ATTEMPTS: usize = 16;

#[derive(Debug)]
pub(super) struct Watcher {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    watches: Watches,
    next_id: u64,
    subscribers: HashMap<u64, Subscriber>,
    /// Every directory some subscriber cares about, and what it holds.
    dirs: HashMap<PathBuf, DirWatch>,
    /// Watched path → its descriptor and the directories of interest holding it.
    paths: HashMap<PathBuf, Held>,
    /// Descriptor → the watched paths it stands for (several when paths alias one inode).
    by_wd: HashMap<WatchDescriptor, HashSet<PathBuf>>,
    /// Directory entry (`parent/name`) → the directories to repair when it changes: the next
    /// component of a missing directory's path, a symlink on a directory's path.
    triggers: HashMap<PathBuf, HashSet<PathBuf>>,
    /// Target of a symlinked file → the files of interest (`dir/name`) that point to it.
    aliases: HashMap<PathBuf, HashSet<PathBuf>>,
    /// Subscribers marked by events read so far, woken once the queue is drained (see `run`).
    to_wake: Vec<Arc<Changes>>,
    /// A cap on kernel watches below the kernel's own (tests: see [`Watcher::limit_watches`]).
    limit: Option<usize>,
    /// The names an event must carry to matter (see [`State::is_notable`]); `None` when the maps
    /// it is built from changed since.
    notable: Option<Notable>,
}

/// Every file name some subscriber reads, and the last component of every trigger entry and
/// symlink target: an event naming anything else (a writer's temporary file, most of what a
/// rotation makes the kernel report) cannot concern anyone.
#[derive(Debug, Default)]
struct Notable {
    names: HashSet<OsString>,
    /// A trigger or target without a last component: every name is notable.
    all: bool,
}

#[derive(Debug)]
struct Subscriber {
    changes: Arc<Changes>,
    dirs: HashMap<PathBuf, BTreeSet<OsString>>,
}

/// What one directory of interest holds.
#[derive(Debug, Default, Clone)]
struct DirWatch {
    held: BTreeSet<PathBuf>,
    triggers: BTreeSet<PathBuf>,
    /// (target file, file of interest) pairs registered in `aliases`.
    aliases: BTreeSet<(PathBuf, PathBuf)>,
    /// Files of interest (`dir/name`) that were symlinks when the directory was armed, other
    /// than the kubelet's `..data` links: an event naming one of them re-arms the directory (the
    /// link may point elsewhere now).
    symlinked: BTreeSet<PathBuf>,
}

#[derive(Debug, Default)]
struct Held {
    wd: Option<WatchDescriptor>,
    /// Directory of interest → how many of its arms hold this path (a repair arms the new
    /// resolution before releasing the old one, so a path in both never loses its watch).
    holders: HashMap<PathBuf, usize>,
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
                paths: HashMap::new(),
                by_wd: HashMap::new(),
                triggers: HashMap::new(),
                aliases: HashMap::new(),
                to_wake: Vec::new(),
                limit: None,
                notable: None,
            }),
        });
        let reader = Arc::clone(&watcher);
        crate::runtime::get().spawn(async move { reader.run(inotify).await });
        Ok(watcher)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that matters
        // more than losing reloads, so keep going with the inner value.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `interest`. All or nothing: when a directory cannot be watched, whatever this
    /// call armed is released again.
    pub(super) fn subscribe(&self, interest: &Interest, changes: Arc<Changes>) -> io::Result<u64> {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.notable = None;
        state.subscribers.insert(
            id,
            Subscriber {
                changes,
                dirs: interest.dirs.clone().into_iter().collect(),
            },
        );
        let mut armed = Vec::new();
        for dir in interest.dirs.keys() {
            if state.dirs.contains_key(dir) {
                // Shared with another set: re-resolve, so this set's symlinked files are followed.
                state.repair(dir);
                continue;
            }
            match state.arm(dir) {
                Ok(watch) => {
                    state.adopt(dir, watch);
                    armed.push(dir.clone());
                }
                Err(err) => {
                    state.subscribers.remove(&id);
                    for dir in armed {
                        state.forget_dir(&dir);
                    }
                    return Err(err);
                }
            }
        }
        Ok(id)
    }

    pub(super) fn unsubscribe(&self, id: u64) {
        let mut state = self.lock();
        let Some(subscriber) = state.subscribers.remove(&id) else {
            return;
        };
        state.notable = None;
        for dir in subscriber.dirs.keys() {
            let still_used = state.subscribers.values().any(|s| s.dirs.contains_key(dir));
            if !still_used {
                state.forget_dir(dir);
            }
        }
    }

    /// Re-resolves and re-watches the directories of subscriber `id` (the periodic resync: a
    /// renamed parent, a bind mount or anything else inotify cannot report is repaired here).
    pub(super) fn repair(&self, id: u64) {
        let mut state = self.lock();
        let dirs: Vec<PathBuf> = match state.subscribers.get(&id) {
            Some(subscriber) => subscriber.dirs.keys().cloned().collect(),
            None => return,
        };
        for dir in dirs {
            state.repair(&dir);
        }
    }

    /// A pass read `files` through symlinks of their own: the directories of those not armed as
    /// symlinked (a plain file replaced by a link) are re-armed and their subscribers woken to
    /// read them again, so a change of the link's target between that pass and the new watch is
    /// not missed.
    pub(super) fn follow(&self, files: &[PathBuf]) {
        let mut state = self.lock();
        for file in files {
            let file = super::watch_path(file);
            let Some(dir) = file.parent() else {
                continue;
            };
            if state
                .dirs
                .get(dir)
                .is_some_and(|watch| !watch.symlinked.contains(&file))
            {
                tracing::debug!(file = %file.display(), "file became a symlink; re-arming its directory");
                state.repair(dir);
                state.wake_for(dir, None);
            }
        }
        wake_marked(state);
    }

    pub(super) fn watch_count(&self) -> usize {
        self.lock().by_wd.len()
    }

    /// Caps the number of kernel watches: adding one more then fails with `ENOSPC`, exactly as
    /// when the kernel's `fs.inotify.max_user_watches` is reached. Tests use it to reach the
    /// limit mid-run without changing a system-wide setting; `None` removes the cap.
    pub(super) fn limit_watches(&self, max: Option<usize>) {
        self.lock().limit = max;
    }

    /// Reads events until the queue is empty, marking what they name, and only then wakes the
    /// subscribers: a writer's steps that are already queued together (a rotation's renames, the
    /// kubelet's `..data` sequence) cost one reload pass, not one each. It never waits for events
    /// that are not yet queued, so a lone event wakes at once.
    async fn run(&self, inotify: Inotify) {
        // Deprecated as unsound for a value that could close or swap its descriptor while
        // registered; `Inotify` owns its descriptor and is only read through the `AsyncFd` here,
        // never closed or replaced before the `AsyncFd` is dropped. The replacement,
        // `register_with_interest`, is `unsafe`, which this crate forbids.
        #[allow(deprecated)]
        let registered = AsyncFd::with_interest(inotify, tokio::io::Interest::READABLE);
        let mut inotify = match registered {
            Ok(inotify) => inotify,
            Err(err) => return self.stop_watching(&err),
        };
        let mut buffer = vec![0u8; READ_BUFFER];
        loop {
            let mut ready = match inotify.readable_mut().await {
                Ok(ready) => ready,
                Err(err) => return self.stop_watching(&err),
            };
            loop {
                let read = ready.try_io(|inotify| {
                    let events = inotify.get_mut().read_events(&mut buffer)?;
                    Ok(self.handle_events(events))
                });
                match read {
                    // Room was left for one more event of any size: the kernel stopped because
                    // the queue was empty, so the read that would say so (`EAGAIN`) is skipped.
                    // Clearing the readiness here loses nothing: this thread is the runtime's
                    // only worker, so its epoll has not been polled since the readiness was
                    // seen, and an event queued after this read makes the next poll report
                    // the descriptor again (edge-triggered: one report per event queued).
                    Ok(Ok(handled)) if handled < EVENTS_SURELY_SHORT => {
                        ready.clear_ready();
                        break;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                    Ok(Err(err)) => return self.stop_watching(&err),
                    // The queue is empty (and the readiness cleared): wake everyone marked.
                    Err(_would_block) => break,
                }
            }
            wake_marked(self.lock());
        }
    }

    /// Marks what one read's events name; returns how many there were.
    fn handle_events(&self, events: inotify::Events<'_>) -> usize {
        let mut state = self.lock();
        let mut handled = 0;
        for event in events {
            handled += 1;
            if event.mask.contains(EventMask::Q_OVERFLOW) {
                OVERFLOWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    "inotify event queue overflowed; re-arming and reloading everything"
                );
                // Events were lost, among them perhaps a directory replaced: re-resolve every
                // watch, then re-read everything.
                let dirs: Vec<PathBuf> = state.dirs.keys().cloned().collect();
                for dir in dirs {
                    state.repair(&dir);
                }
                state.wake_all();
                continue;
            }
            state.handle(&event.wd, event.mask, event.name);
        }
        handled
    }

    /// Without the reader nothing would ever wake: every reloader polls from now on.
    fn stop_watching(&self, err: &io::Error) {
        tracing::error!(error = %err, "inotify read failed; watching stopped");
        let state = self.lock();
        for subscriber in state.subscribers.values() {
            subscriber.changes.degrade();
        }
    }
}

impl State {
    /// `inotify_add_watch`, failing with `ENOSPC` past the [`limit`](State::limit) as the kernel
    /// does past its own.
    fn add_watch(&mut self, path: &Path) -> io::Result<WatchDescriptor> {
        let wd = self.watches.add(path, mask())?;
        if let Some(limit) = self.limit
            && !self.by_wd.contains_key(&wd)
            && self.by_wd.len() >= limit
        {
            // A watch nobody holds yet: undo it (its IN_IGNORED names an unknown descriptor).
            let _ = self.watches.remove(wd);
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(wd)
    }

    /// Resolves what `dir` must hold and takes those watches (for `dir`). Retries when a
    /// component appears meanwhile (a `mkdir -p` racing the arming).
    fn arm(&mut self, dir: &Path) -> io::Result<DirWatch> {
        let mut watch = DirWatch::default();
        for _ in 0..ARM_ATTEMPTS {
            watch = DirWatch::default();
            match self.arm_once(dir, &mut watch) {
                Ok(true) => return Ok(watch),
                Ok(false) => {
                    // A component appeared: release and resolve again.
                    self.release(&watch, dir);
                }
                Err(err) => {
                    self.release(&watch, dir);
                    return Err(err);
                }
            }
        }
        Ok(watch)
    }

    /// One resolution; `Ok(false)` when the path changed under it and it must be redone.
    fn arm_once(&mut self, dir: &Path, watch: &mut DirWatch) -> io::Result<bool> {
        // Symlinks on the path: watch the directory holding each, so a swapped link is seen.
        for link in dir.ancestors().filter(|p| is_symlink(p)) {
            if let Some(parent) = link.parent() {
                self.hold_best_effort(parent, dir, watch)?;
                watch.triggers.insert(link.to_owned());
            }
        }
        match self.add_watch(dir) {
            Ok(wd) => {
                self.take(watch, dir, wd, dir);
                self.alias_symlinked_files(dir, watch)?;
                tracing::debug!(dir = %dir.display(), "watching directory");
                Ok(true)
            }
            Err(err) if is_missing(&err) => {
                let mut child = dir;
                while let Some(candidate) = child.parent() {
                    match self.add_watch(candidate) {
                        Ok(wd) => {
                            self.take(watch, candidate, wd, dir);
                            watch.triggers.insert(child.to_owned());
                            tracing::debug!(dir = %dir.display(), ancestor = %candidate.display(), "directory missing; watching ancestor");
                            // Created between the failed add and this watch: its event is lost.
                            return Ok(std::fs::symlink_metadata(child).is_err());
                        }
                        Err(err) if is_missing(&err) => child = candidate,
                        Err(err) => return Err(err),
                    }
                }
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// A file of interest that is a symlink to another directory (not the kubelet's `..data`
    /// links, which the directory's own events cover): watch the target's directory too.
    fn alias_symlinked_files(&mut self, dir: &Path, watch: &mut DirWatch) -> io::Result<()> {
        let names: BTreeSet<OsString> = self
            .subscribers
            .values()
            .filter_map(|s| s.dirs.get(dir))
            .flatten()
            .cloned()
            .collect();
        for name in names {
            let file = dir.join(&name);
            let Ok(link) = std::fs::read_link(&file) else {
                continue;
            };
            if layout::through_data(&link).is_some() {
                continue;
            }
            watch.symlinked.insert(file.clone());
            let Ok(target) = std::fs::canonicalize(&file) else {
                continue;
            };
            let Some(target_dir) = target.parent() else {
                continue;
            };
            if target_dir == dir {
                continue;
            }
            self.hold_best_effort(target_dir, dir, watch)?;
            watch.aliases.insert((target.clone(), file));
        }
        Ok(())
    }

    /// Watches `path` for `dir` when possible; only running out of watches is an error (the
    /// caller falls back to polling), anything else just loses this early warning.
    fn hold_best_effort(
        &mut self,
        path: &Path,
        dir: &Path,
        watch: &mut DirWatch,
    ) -> io::Result<()> {
        match self.add_watch(path) {
            Ok(wd) => {
                self.take(watch, path, wd, dir);
                Ok(())
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => Err(err),
            Err(_) => Ok(()),
        }
    }

    /// Records `dir`'s watch (from `arm`) as its current one.
    fn adopt(&mut self, dir: &Path, watch: DirWatch) {
        self.notable = None;
        for trigger in &watch.triggers {
            self.triggers
                .entry(trigger.clone())
                .or_default()
                .insert(dir.to_owned());
        }
        for (target, file) in &watch.aliases {
            self.aliases
                .entry(target.clone())
                .or_default()
                .insert(file.clone());
        }
        self.dirs.insert(dir.to_owned(), watch);
    }

    /// Releases everything `dir` holds and forgets it.
    fn forget_dir(&mut self, dir: &Path) {
        let Some(watch) = self.dirs.remove(dir) else {
            return;
        };
        self.release(&watch, dir);
        self.unregister(&watch, dir);
    }

    /// Drops one hold on each path of `watch`.
    fn release(&mut self, watch: &DirWatch, dir: &Path) {
        for path in &watch.held {
            self.unhold(path, dir);
        }
    }

    /// Removes `watch`'s triggers and aliases from the lookup maps.
    fn unregister(&mut self, watch: &DirWatch, dir: &Path) {
        self.notable = None;
        for trigger in &watch.triggers {
            if let Some(dirs) = self.triggers.get_mut(trigger) {
                dirs.remove(dir);
                if dirs.is_empty() {
                    self.triggers.remove(trigger);
                }
            }
        }
        for (target, file) in &watch.aliases {
            if let Some(files) = self.aliases.get_mut(target) {
                files.remove(file);
                if files.is_empty() {
                    self.aliases.remove(target);
                }
            }
        }
    }

    /// Resolves `dir`'s watches again (arming the new ones before releasing the old, so a watch
    /// still needed is never dropped in between).
    fn repair(&mut self, dir: &Path) {
        let Some(old) = self.dirs.remove(dir) else {
            return;
        };
        self.unregister(&old, dir);
        match self.arm(dir) {
            Ok(new) => {
                self.release(&old, dir);
                self.adopt(dir, new);
            }
            Err(err) => {
                tracing::warn!(dir = %dir.display(), error = %err, "cannot watch directory; polling it");
                self.release(&old, dir);
                self.dirs.insert(dir.to_owned(), DirWatch::default());
                for subscriber in self.subscribers.values() {
                    if subscriber.dirs.contains_key(dir) {
                        subscriber.changes.degrade();
                    }
                }
            }
        }
    }
}

/// Wakes the subscribers marked so far, after letting go of the lock (a woken reloader may be on
/// another thread and take it).
fn wake_marked(mut state: MutexGuard<'_, State>) {
    let woken = std::mem::take(&mut state.to_wake);
    drop(state);
    for changes in woken {
        changes.wake();
    }
}

fn is_missing(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}
