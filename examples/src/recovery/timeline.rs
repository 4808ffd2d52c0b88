//! The demo's timeline: each step printed with the time since start, and remembered so the
//! demo can check what happened. A leaf of `recovery`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Prints events with the time since start.
#[derive(Clone)]
pub(super) struct Timeline {
    pub(super) start: Instant,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Timeline {
    pub(super) fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub(super) fn mark(&self, what: &str) {
        println!("[{:>6} ms] {what}", self.start.elapsed().as_millis());
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what.to_owned());
    }

    /// Whether `what` was marked.
    pub(super) fn has(&self, what: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|s| s == what)
    }

    /// Marks `what` the first time only.
    pub(super) fn mark_once(&self, what: &str) {
        let first = !self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|s| s == what);
        if first {
            self.mark(what);
        }
    }
}
