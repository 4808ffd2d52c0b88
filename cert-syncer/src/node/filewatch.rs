//! Wakes the node loop when something touches the host file: one inotify watch on its
//! directory (a watch on the file itself would die with the first rename over it), read by a
//! thread of its own. Without inotify the loop polls instead.

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use inotify::{Inotify, WatchMask};
use tokio::sync::Notify;

/// A notifier woken on every create, write, rename or removal of `file` in its directory.
///
/// # Errors
/// inotify cannot be used (instance or watch limit, no such directory).
pub fn watch(file: &Path) -> std::io::Result<Arc<Notify>> {
    let dir = file
        .parent()
        .ok_or_else(|| std::io::Error::other("the file has no directory"))?;
    let name: OsString = file
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?
        .to_owned();
    let mut inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::ATTRIB,
    )?;
    let notify = Arc::new(Notify::new());
    let wake = Arc::clone(&notify);
    std::thread::Builder::new()
        .name("node-file-watch".into())
        .spawn(move || {
            let mut buffer = [0u8; 4096];
            loop {
                match inotify.read_events_blocking(&mut buffer) {
                    Ok(events) => {
                        let mut touched = false;
                        for event in events {
                            // An overflow names no file: check anyway.
                            touched |= event.name.is_none_or(|n| n == name.as_os_str());
                        }
                        if touched {
                            wake.notify_one();
                        }
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(err) => {
                        tracing::error!(error = %err, "inotify read failed; the file is checked at the resync interval only");
                        return;
                    }
                }
            }
        })?;
    Ok(notify)
}
