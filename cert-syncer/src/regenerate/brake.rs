//! The brake on write loops: a per-object write budget that escalates, bounds every write, and
//! is remembered across restarts and leaders.
//!
//! A controller's decisions settle: a pass over what the previous pass wrote decides nothing.
//! When they do not (a rule that never accepts what it wrote, or another controller that
//! disagrees and keeps changing the object back), every pass rewrites the object: a new key,
//! every consumer reloading, forever. The brake bounds that whatever the cause.
//!
//! - **The budget**: an object written [`BUDGET`] times within [`WINDOW`] is in a fight. Every
//!   write counts, whatever its reason: an object missing or expired again seconds after we
//!   wrote it is being deleted or replaced by someone else (issue 35 item 6; before, "missing"
//!   and "expired" were exempt, and a controller deleting an object made ours loop at watch
//!   speed). An object that was not written within the window is never held: a first
//!   regeneration, or one after a month, always goes through.
//! - **The hold escalates**: the first fight holds the object until its oldest write in the
//!   window is [`WINDOW`] old (10 minutes, as before); a fight that starts again before the
//!   object has been quiet for as long as its last hold holds it twice as long, up to
//!   [`MAX_HOLD`] (10, 20, 40 … minutes, then a day). A permanent fight therefore costs at
//!   most 3 writes per hold: about 24 on its first day and 3 a day after, instead of 3 every
//!   10 minutes (~430 new keys a day). An object quiet for as long as its last hold starts over.
//! - **It is remembered** (`brake::lease`): with `--leader-elect`, the record (each object's
//!   last writes, level and hold) is kept in an annotation of the controller's own Lease,
//!   written after every pass that changed it and read when the Lease is acquired, so neither a
//!   restart nor another replica taking over resets a fight. It lives on our Lease, not on the
//!   fought object: whoever deletes or replaces that object cannot erase it. Without
//!   `--leader-elect` it lives in the process only (a restart forgets it).
//!
//! A held write is reported (`report.held`), an Event `RegenerationLoop` is recorded, the
//! metric `cert_regenerate_writes_held_total` counts it and `/readyz` names the object until a
//! pass no longer holds it.
//!
//! Time is Unix seconds from a clock the brake is given (the wall clock in the controller, a
//! hand-moved one in the tests): the record is compared across processes and nodes, so it
//! cannot be a monotonic clock.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::ObjectRef;

pub(super) mod lease;

/// Writes of one object allowed within [`WINDOW`].
pub const BUDGET: usize = 3;

/// The window of [`BUDGET`], and the first hold.
pub const WINDOW: Duration = Duration::from_secs(10 * 60);

/// The longest hold an escalating fight reaches.
pub const MAX_HOLD: Duration = Duration::from_secs(24 * 3600);

/// A write the brake withheld: why, and when the object may be written again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// When the object may be written again, from now.
    pub release_in: Duration,
    /// How many fights in a row this hold is the end of (1: the first).
    pub level: u32,
    /// The hold's length at this level.
    pub length: Duration,
}

/// What the brake remembers of one object, in the form kept on the Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// Unix seconds of the object's last [`BUDGET`] writes, oldest first.
    #[serde(rename = "w", default)]
    writes: Vec<i64>,
    /// Fights in a row (0: none yet, or quiet long enough to start over).
    #[serde(rename = "l", default)]
    level: u32,
    /// End of the last hold (Unix seconds; 0: never held).
    #[serde(rename = "u", default)]
    until: i64,
}

/// Per-object write history (see the module docs).
pub struct Brake {
    budget: usize,
    window: Duration,
    max_hold: Duration,
    clock: Box<dyn Fn() -> i64 + Send + Sync>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    records: BTreeMap<String, Record>,
    /// Changed since the record was last saved.
    dirty: bool,
}

impl std::fmt::Debug for Brake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brake")
            .field("budget", &self.budget)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl Default for Brake {
    fn default() -> Brake {
        Brake::new(BUDGET, WINDOW, MAX_HOLD, crate::base::time::unix_now)
    }
}

impl Brake {
    pub fn new(
        budget: usize,
        window: Duration,
        max_hold: Duration,
        clock: impl Fn() -> i64 + Send + Sync + 'static,
    ) -> Brake {
        Brake {
            budget: budget.max(1),
            window,
            max_hold: max_hold.max(window),
            clock: Box::new(clock),
            state: Mutex::new(State::default()),
        }
    }

    /// Writes allowed per object within [`Brake::window`].
    pub fn budget(&self) -> usize {
        self.budget
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The length of a hold at `level` (1: [`Brake::window`]), doubling up to the maximum.
    fn hold_length(&self, level: u32) -> i64 {
        let doubled = self
            .window
            .as_secs()
            .saturating_mul(1u64 << level.saturating_sub(1).min(32));
        doubled.min(self.max_hold.as_secs()) as i64
    }

    /// Records one write of `object` (now).
    pub fn record(&self, kind: &str, object: &ObjectRef) {
        let now = (self.clock)();
        let mut state = self.lock();
        let record = state.records.entry(key(kind, object)).or_default();
        record.writes.push(now);
        // Only the last `budget` writes matter.
        let excess = record.writes.len().saturating_sub(self.budget);
        record.writes.drain(..excess);
        state.dirty = true;
    }

    /// `None` when `object` may be written now; else the hold (its budget is spent: a fight).
    pub fn holds(&self, kind: &str, object: &ObjectRef) -> Option<Hold> {
        let now = (self.clock)();
        let window = self.window.as_secs() as i64;
        let mut state = self.lock();
        let key = key(kind, object);
        let record = state.records.get_mut(&key)?;
        if now < record.until {
            let level = record.level;
            return Some(Hold {
                release_in: Duration::from_secs((record.until - now) as u64),
                level,
                length: Duration::from_secs(self.hold_length(level) as u64),
            });
        }
        record.writes.retain(|at| now - at < window);
        if record.writes.len() < self.budget {
            return None;
        }
        // A fight: escalate if the last one ended less than its own length ago.
        let quiet = now - record.until;
        record.level = if record.level > 0 && quiet < self.hold_length(record.level) {
            record.level.saturating_add(1)
        } else {
            1
        };
        let length = self.hold_length(record.level);
        let oldest = record.writes.first().copied().unwrap_or(now);
        record.until = (oldest + length).max(now + 1);
        let hold = Hold {
            release_in: Duration::from_secs((record.until - now) as u64),
            level: record.level,
            length: Duration::from_secs(length as u64),
        };
        state.dirty = true;
        Some(hold)
    }

    /// Whether `object` is in a hold now (nothing recorded, nothing started).
    pub fn is_holding(&self, kind: &str, object: &ObjectRef) -> bool {
        let now = (self.clock)();
        self.lock()
            .records
            .get(&key(kind, object))
            .is_some_and(|r| now < r.until)
    }

    /// The record must be saved again (its last save failed).
    pub fn mark_unsaved(&self) {
        self.lock().dirty = true;
    }

    /// The record to keep (see `lease`), when it changed since the last call: the objects
    /// the brake still has a reason to remember.
    pub fn to_save(&self) -> Option<String> {
        let now = (self.clock)();
        let window = self.window.as_secs() as i64;
        let mut state = self.lock();
        if !state.dirty {
            return None;
        }
        state.dirty = false;
        let lengths: BTreeMap<u32, i64> = state
            .records
            .values()
            .map(|r| (r.level, self.hold_length(r.level)))
            .collect();
        // Forget an object with no write in the window whose last hold ended longer ago than
        // its length: it would start over anyway.
        state.records.retain(|_, r| {
            r.writes.iter().any(|at| now - at < window)
                || (r.level > 0 && now - r.until < lengths[&r.level])
        });
        Some(serde_json::to_string(&state.records).unwrap_or_default())
    }

    /// Takes over a record kept by an earlier process or another replica (see `lease`); what
    /// this process already knows of an object is kept where it is the more recent.
    pub fn restore(&self, saved: &str) -> Result<usize, String> {
        let records: BTreeMap<String, Record> = serde_json::from_str(saved)
            .map_err(|err| format!("the brake's record is not readable: {err}"))?;
        let mut state = self.lock();
        let count = records.len();
        for (key, saved) in records {
            let record = state.records.entry(key).or_default();
            let mut writes = saved.writes;
            writes.extend(record.writes.iter().copied());
            writes.sort_unstable();
            writes.dedup();
            let excess = writes.len().saturating_sub(self.budget);
            writes.drain(..excess);
            record.writes = writes;
            if saved.until > record.until {
                record.until = saved.until;
                record.level = saved.level;
            }
        }
        Ok(count)
    }
}

/// An object's key in the record: `kind/namespace/name`.
fn key(kind: &str, object: &ObjectRef) -> String {
    format!("{kind}/{object}")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;

    fn object(name: &str) -> ObjectRef {
        ObjectRef {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    /// A brake on a clock the test moves.
    fn brake() -> (Brake, Arc<AtomicI64>) {
        let now = Arc::new(AtomicI64::new(1_000_000));
        let clock = Arc::clone(&now);
        let brake = Brake::new(3, WINDOW, MAX_HOLD, move || clock.load(Ordering::SeqCst));
        (brake, now)
    }

    fn advance(now: &AtomicI64, seconds: i64) {
        now.fetch_add(seconds, Ordering::SeqCst);
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Three writes within the window spend the budget; the fourth is held until the first is
    /// a window old, whatever the reason (missing and expired too); objects and kinds have
    /// budgets of their own.
    #[test]
    fn the_budget_holds_a_fourth_write_of_any_reason_until_the_first_leaves_the_window() {
        let (brake, now) = brake();
        let a = object("a");
        for _ in 0..3 {
            assert_eq!(brake.holds("target", &a), None);
            brake.record("target", &a);
            advance(&now, 10);
        }
        // 30 s after the first write: held for the 570 s left of its window.
        let hold = brake.holds("target", &a).expect("held");
        assert_eq!((hold.release_in, hold.level), (secs(570), 1));
        assert_eq!(brake.holds("target", &object("b")), None);
        assert_eq!(brake.holds("bundle", &a), None);
        advance(&now, 569);
        assert_eq!(brake.holds("target", &a).unwrap().release_in, secs(1));
        advance(&now, 1);
        assert_eq!(brake.holds("target", &a), None);
    }

    /// A fight that goes on: each new hold is twice the last, up to a day; 24 hours of a
    /// controller that undoes every write at once cost 24 writes (3 per hold), not ~430.
    #[test]
    fn a_fight_that_goes_on_is_held_twice_as_long_each_time_up_to_a_day() {
        let (fought, now) = brake();
        let a = object("a");
        let mut lengths = Vec::new();
        let mut writes = 0;
        let start = now.load(Ordering::SeqCst);
        while now.load(Ordering::SeqCst) - start < 24 * 3600 {
            match fought.holds("target", &a) {
                None => {
                    fought.record("target", &a);
                    writes += 1;
                    advance(&now, 1);
                }
                Some(hold) => {
                    if lengths.last() != Some(&hold.length.as_secs()) {
                        lengths.push(hold.length.as_secs());
                    }
                    advance(&now, hold.release_in.as_secs() as i64);
                }
            }
        }
        assert_eq!(
            lengths,
            [600, 1200, 2400, 4800, 9600, 19200, 38400, 76800],
            "the holds double"
        );
        assert_eq!(writes, 24);
        let (long, now2) = brake();
        // Far into the fight the hold is capped at a day.
        for _ in 0..12 {
            while long.holds("t", &a).is_none() {
                long.record("t", &a);
                advance(&now2, 1);
            }
            let hold = long.holds("t", &a).unwrap();
            advance(&now2, hold.release_in.as_secs() as i64);
        }
        for _ in 0..3 {
            long.record("t", &a);
        }
        assert_eq!(long.holds("t", &a).unwrap().length, MAX_HOLD);
    }

    /// After a hold, an object left alone for as long as that hold starts over at level 1.
    #[test]
    fn a_quiet_object_starts_over() {
        let (brake, now) = brake();
        let a = object("a");
        let fight = |brake: &Brake, now: &AtomicI64| {
            for _ in 0..3 {
                brake.record("target", &a);
                advance(now, 1);
            }
            brake.holds("target", &a).unwrap()
        };
        assert_eq!(fight(&brake, &now).level, 1);
        advance(&now, 600);
        assert_eq!(fight(&brake, &now).level, 2, "again right after the hold");
        advance(&now, 1200 + 1200);
        assert_eq!(fight(&brake, &now).level, 1, "quiet for a whole hold: over");
    }

    /// The record survives a new process: writes, level and hold, as JSON; a restored brake
    /// holds what the old one held, and an unreadable record is an error, not a reset.
    #[test]
    fn the_record_survives_a_restart_and_merges_with_what_the_new_process_saw() {
        let (old, now) = brake();
        let a = object("a");
        for _ in 0..3 {
            old.record("bundle", &a);
        }
        let held = old.holds("bundle", &a).unwrap();
        let saved = old.to_save().expect("changed");
        assert_eq!(old.to_save(), None, "saved once until it changes again");

        let clock = Arc::clone(&now);
        let new = Brake::new(3, WINDOW, MAX_HOLD, move || clock.load(Ordering::SeqCst));
        assert_eq!(
            new.holds("bundle", &a),
            None,
            "a fresh process knows nothing"
        );
        assert_eq!(new.restore(&saved), Ok(1));
        assert_eq!(new.holds("bundle", &a), Some(held));
        assert!(new.restore("{not json").is_err());

        // Long quiet: forgotten when the record is next saved.
        advance(&now, 3 * 3600);
        new.record("bundle", &object("b"));
        let kept = new.to_save().unwrap();
        assert!(
            kept.contains("bundle/ns/b") && !kept.contains("bundle/ns/a"),
            "{kept}"
        );
    }
}
