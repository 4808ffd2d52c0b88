//! Turning inotify events into marks: which subscribers care about an event, which directories
//! it makes the watcher repair (a watched path gone, a trigger entry or a symlinked file
//! changed), and the kubelet `..data` machinery told apart from the files of interest.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inotify::{EventMask, WatchDescriptor};

use super::{Notable, State};
use crate::layout;

impl State {
    pub(super) fn handle(&mut self, wd: &WatchDescriptor, mask: EventMask, name: Option<&OsStr>) {
        let gone =
            mask.intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF);
        // Most events of a rotation name the writer's temporary file: one lookup, no path
        // built, hashed, copied or allocated for them.
        if !gone
            && let Some(name) = name
            && !layout::is_internal(name)
            && !self.is_notable(name)
        {
            return;
        }
        let Some(paths) = self.by_wd.get(wd).cloned() else {
            return;
        };
        if mask.contains(EventMask::IGNORED) {
            // The kernel dropped the watch: no path holds it any more.
            self.by_wd.remove(wd);
            for path in &paths {
                if let Some(held) = self.paths.get_mut(path)
                    && held.wd.as_ref() == Some(wd)
                {
                    held.wd = None;
                }
            }
        }
        let mut repair: BTreeSet<PathBuf> = BTreeSet::new();
        for path in &paths {
            if gone {
                if let Some(held) = self.paths.get(path) {
                    repair.extend(held.holders.keys().cloned());
                }
                continue;
            }
            if self.dirs.contains_key(path) {
                self.wake_for(path, name);
            }
            if let Some(name) = name {
                let entry = path.join(name);
                if let Some(dirs) = self.triggers.get(&entry) {
                    repair.extend(dirs.iter().cloned());
                }
                if let Some(files) = self.aliases.get(&entry).cloned() {
                    for file in files {
                        self.wake_file(&file);
                    }
                }
                // A symlinked file of interest changed: where it points may have changed too. A
                // plain file that became a symlink is reported by the pass that reads it
                // (`Watcher::follow`), without a system call here for every rotation's event.
                if self
                    .dirs
                    .get(path)
                    .is_some_and(|w| w.symlinked.contains(&entry))
                {
                    repair.insert(path.clone());
                }
            }
        }
        for dir in repair {
            tracing::debug!(dir = %dir.display(), "re-arming directory watch");
            self.repair(&dir);
            self.wake_for(&dir, None);
        }
    }

    /// Marks the subscribers of `dir` that care about `name` (woken once the queue is drained).
    /// Names starting with `..` are the kubelet's `..data` machinery and concern every file of
    /// the directory that resolves through them; `None` means the directory itself.
    pub(super) fn wake_for(&mut self, dir: &Path, name: Option<&OsStr>) {
        let dotted = name.is_some_and(layout::is_internal);
        for subscriber in self.subscribers.values() {
            let Some(names) = subscriber.dirs.get(dir) else {
                continue;
            };
            match name {
                None => subscriber.changes.mark_dir(dir),
                // Only an entry some file resolves through: the kubelet's swap also creates the
                // next revision directory and `..data_tmp` and deletes the old revision, and a
                // pass for each of those would find nothing changed.
                Some(name)
                    if dotted && names.iter().any(|file| resolves_through(dir, file, name)) =>
                {
                    subscriber.changes.mark_dir(dir)
                }
                Some(name) if names.contains(name) => subscriber.changes.mark_file(dir.join(name)),
                _ => continue,
            }
            if !self
                .to_wake
                .iter()
                .any(|c| Arc::ptr_eq(c, &subscriber.changes))
            {
                self.to_wake.push(Arc::clone(&subscriber.changes));
            }
        }
    }

    /// Whether an event naming `name` can concern anyone: a file some subscriber reads (to wake
    /// it, or to follow it when it is a symlink), a trigger entry (to repair), a symlink target
    /// (to wake the files pointing to it). Names starting with `..` are the kubelet's machinery,
    /// asked about separately.
    fn is_notable(&mut self, name: &OsStr) -> bool {
        let notable = self.notable.get_or_insert_with(|| {
            let mut notable = Notable::default();
            let names = self
                .subscribers
                .values()
                .flat_map(|subscriber| subscriber.dirs.values().flatten().cloned());
            notable.names.extend(names);
            for entry in self.triggers.keys().chain(self.aliases.keys()) {
                match entry.file_name() {
                    Some(last) => {
                        notable.names.insert(last.to_owned());
                    }
                    None => notable.all = true,
                }
            }
            notable
        });
        notable.all || notable.names.contains(name)
    }

    /// Wakes the subscribers of the file of interest `file` (`dir/name`).
    fn wake_file(&mut self, file: &Path) {
        if let (Some(dir), Some(name)) = (file.parent(), file.file_name()) {
            self.wake_for(dir, Some(name));
        }
    }

    pub(super) fn wake_all(&self) {
        for subscriber in self.subscribers.values() {
            subscriber.changes.mark_all();
        }
    }
}

/// Whether `dir/file` resolves through the entry `dir/name`, following the relative symlinks it
/// meets in `dir` (`tls.crt -> ..data/tls.crt`, `..data -> ..2026_01_01`). True when unsure (a
/// link missing mid-swap, an absolute target, a chain too long), so no change is ever missed.
fn resolves_through(dir: &Path, file: &OsStr, name: &OsStr) -> bool {
    let mut entry = file.to_owned();
    for _ in 0..8 {
        if entry == name {
            return true;
        }
        let target = match std::fs::read_link(dir.join(&entry)) {
            Ok(target) => target,
            // A regular file or directory: the resolution ends here, away from `name`.
            Err(err) if err.kind() == io::ErrorKind::InvalidInput => return false,
            Err(_) => return true,
        };
        match target.components().next() {
            Some(std::path::Component::Normal(first)) => entry = first.to_owned(),
            _ => return true,
        }
    }
    true
}
