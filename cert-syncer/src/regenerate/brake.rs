//! The brake on write loops: a per-object write budget.
//!
//! A controller's decisions settle: a pass over what the previous pass wrote decides nothing.
//! When they do not (a rule that never accepts what it wrote, or another controller that
//! disagrees and keeps changing the object back), every pass rewrites the object: a new key,
//! every consumer reloading, forever. The brake bounds that whatever the cause: an object
//! written [`BUDGET`] times within [`WINDOW`] is not written again until its oldest write in
//! the window is older than the window, unless it is missing or expired (nothing is served
//! then, and a write cannot make it worse). A held write is reported (`report.held`), an Event
//! `RegenerationLoop` is recorded, the metric `cert_regenerate_writes_held_total` counts it and
//! `/readyz` names the object until a pass no longer holds it.
//!
//! Time is tokio's clock, so the unit tests run the window on a paused clock. The budget lives
//! in the process: `--once` makes a single pass, and a restart starts a fresh budget.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::config::ObjectRef;

/// Writes of one object allowed within [`WINDOW`].
pub const BUDGET: usize = 3;

/// The window of [`BUDGET`].
pub const WINDOW: Duration = Duration::from_secs(10 * 60);

/// Reason labels a write is always allowed for: nothing usable is there to keep.
const EXEMPT: &[&str] = &["missing", "expired"];

/// A write the brake withheld.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub kind: &'static str,
    pub object: ObjectRef,
    /// Why the pass wanted to write it.
    pub reason: String,
    /// When it may be written again (seconds from the check).
    pub release_in: Duration,
}

/// Per-object write history on tokio's clock (see the module docs).
#[derive(Debug)]
pub struct Brake {
    budget: usize,
    window: Duration,
    writes: Mutex<BTreeMap<(&'static str, ObjectRef), VecDeque<Instant>>>,
}

impl Default for Brake {
    fn default() -> Brake {
        Brake::new(BUDGET, WINDOW)
    }
}

impl Brake {
    pub fn new(budget: usize, window: Duration) -> Brake {
        Brake {
            budget,
            window,
            writes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Writes allowed per object within [`Brake::window`].
    pub fn budget(&self) -> usize {
        self.budget
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<(&'static str, ObjectRef), VecDeque<Instant>>> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one write of `object` (now).
    pub fn record(&self, kind: &'static str, object: &ObjectRef) {
        let now = Instant::now();
        let mut writes = self.lock();
        let history = writes.entry((kind, object.clone())).or_default();
        history.push_back(now);
        // Only the last `budget` writes matter.
        while history.len() > self.budget {
            history.pop_front();
        }
    }

    /// `None` when `object` may be written now for a reason labelled `reason_label`; else how
    /// long until it may (its budget is spent within the window).
    pub fn holds(
        &self,
        kind: &'static str,
        object: &ObjectRef,
        reason_label: &str,
    ) -> Option<Duration> {
        if EXEMPT.contains(&reason_label) {
            return None;
        }
        let now = Instant::now();
        let mut writes = self.lock();
        let key = (kind, object.clone());
        let history = writes.get_mut(&key)?;
        while history
            .front()
            .is_some_and(|at| now.duration_since(*at) >= self.window)
        {
            history.pop_front();
        }
        if history.is_empty() {
            writes.remove(&key);
            return None;
        }
        if history.len() < self.budget {
            return None;
        }
        let oldest = *history.front()?;
        Some(self.window - now.duration_since(oldest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> ObjectRef {
        ObjectRef {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    /// On tokio's paused clock: three writes within the window spend the budget; the fourth is
    /// held until the first is a window old; missing and expired are never held; objects and
    /// kinds have budgets of their own.
    #[tokio::test(start_paused = true)]
    async fn the_budget_holds_a_fourth_write_until_the_first_leaves_the_window() {
        let brake = Brake::new(3, Duration::from_secs(600));
        let a = object("a");
        for _ in 0..3 {
            assert_eq!(brake.holds("target", &a, "chain"), None);
            brake.record("target", &a);
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        // 30 s after the first write: held for the 570 s left of its window.
        assert_eq!(
            brake.holds("target", &a, "chain"),
            Some(Duration::from_secs(570))
        );
        assert_eq!(
            brake.holds("target", &a, "hostnames"),
            Some(Duration::from_secs(570))
        );
        assert_eq!(brake.holds("target", &a, "missing"), None);
        assert_eq!(brake.holds("target", &a, "expired"), None);
        assert_eq!(brake.holds("target", &object("b"), "chain"), None);
        assert_eq!(brake.holds("bundle", &a, "ca-added"), None);
        tokio::time::advance(Duration::from_secs(569)).await;
        assert_eq!(
            brake.holds("target", &a, "chain"),
            Some(Duration::from_secs(1))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(brake.holds("target", &a, "chain"), None);
        // One write allowed; then held again until the second write leaves the window.
        brake.record("target", &a);
        assert_eq!(
            brake.holds("target", &a, "chain"),
            Some(Duration::from_secs(10))
        );
    }
}
