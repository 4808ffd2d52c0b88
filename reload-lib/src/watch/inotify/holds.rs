//! Who holds which kernel watch: a watched path is held by the directories of interest that
//! need it (each arm counts once), and the kernel watch goes when the last holder lets go or
//! when no path uses its descriptor any more.

use std::path::Path;

use inotify::WatchDescriptor;

use super::{DirWatch, State};

impl State {
    /// Records that `watch` (an arm of `dir`) holds `path`, watched as `wd`.
    pub(super) fn take(
        &mut self,
        watch: &mut DirWatch,
        path: &Path,
        wd: WatchDescriptor,
        dir: &Path,
    ) {
        let new = watch.held.insert(path.to_owned());
        self.hold(path, wd, dir, new);
    }

    fn hold(&mut self, path: &Path, wd: WatchDescriptor, dir: &Path, count: bool) {
        let held = self.paths.entry(path.to_owned()).or_default();
        if count {
            *held.holders.entry(dir.to_owned()).or_default() += 1;
        }
        if held.wd.as_ref() != Some(&wd) {
            let old = held.wd.replace(wd.clone());
            self.by_wd.entry(wd).or_default().insert(path.to_owned());
            if let Some(old) = old {
                self.drop_wd_path(&old, path);
            }
        }
    }

    pub(super) fn unhold(&mut self, path: &Path, dir: &Path) {
        let Some(held) = self.paths.get_mut(path) else {
            return;
        };
        if let Some(count) = held.holders.get_mut(dir) {
            *count -= 1;
            if *count == 0 {
                held.holders.remove(dir);
            }
        }
        if held.holders.is_empty() {
            let wd = held.wd.take();
            self.paths.remove(path);
            if let Some(wd) = wd {
                self.drop_wd_path(&wd, path);
            }
        }
    }

    /// `path` no longer uses `wd`; the kernel watch goes when no path does.
    fn drop_wd_path(&mut self, wd: &WatchDescriptor, path: &Path) {
        if let Some(paths) = self.by_wd.get_mut(wd) {
            paths.remove(path);
            if paths.is_empty() {
                self.by_wd.remove(wd);
                // Fails harmlessly when the kernel already dropped the watch.
                let _ = self.watches.remove(wd.clone());
            }
        }
    }
}
