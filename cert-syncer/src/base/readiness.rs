//! Why the process is not ready: the blockers a job sets and clears, which `/readyz` (the app
//! shell's health server) reports.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Why the process is not ready, per object (`secret/name`) or concern (`auth`).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    blockers: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Readiness {
    /// Marks `what` as blocking readiness, with the reason shown by `/readyz`.
    pub fn block(&self, what: &str, reason: impl Into<String>) {
        self.lock().insert(what.to_owned(), reason.into());
    }

    /// Clears `what`.
    pub fn clear(&self, what: &str) {
        self.lock().remove(what);
    }

    /// `None` when ready, else the reasons, one per line.
    pub fn blockers(&self) -> Option<String> {
        let blockers = self.lock();
        (!blockers.is_empty()).then(|| {
            blockers
                .iter()
                .map(|(what, why)| format!("{what}: {why}\n"))
                .collect()
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.blockers.lock().unwrap_or_else(|p| p.into_inner())
    }
}
