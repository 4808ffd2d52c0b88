//! The demo's timeline: each step printed with the time since start, and remembered (with its
//! time) so the demo can check what happened and hand back its milestones
//! ([`crate::milestones`], for `recovery-demo --timeline`). A leaf of `recovery`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::milestones::Milestone;

/// Prints events with the time since start.
#[derive(Clone)]
pub(super) struct Timeline {
    pub(super) start: Instant,
    seen: Arc<Mutex<Vec<Milestone>>>,
}

impl Timeline {
    pub(super) fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Vec<Milestone>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn mark(&self, what: &str) {
        Self::push(&mut self.seen(), self.start, what);
    }

    fn push(seen: &mut Vec<Milestone>, start: Instant, what: &str) {
        let at = start.elapsed();
        println!("[{:>6} ms] {what}", at.as_millis());
        seen.push(Milestone {
            series: None,
            name: what.to_owned(),
            at,
        });
    }

    /// Whether `what` was marked.
    pub(super) fn has(&self, what: &str) -> bool {
        self.seen().iter().any(|m| m.name == what)
    }

    /// Marks `what` the first time only (checked and marked under one lock: two log lines of
    /// the same step never mark it twice).
    pub(super) fn mark_once(&self, what: &str) {
        let mut seen = self.seen();
        if !seen.iter().any(|m| m.name == what) {
            Self::push(&mut seen, self.start, what);
        }
    }

    /// Every mark so far, in order.
    pub(super) fn milestones(&self) -> Vec<Milestone> {
        self.seen().clone()
    }
}
