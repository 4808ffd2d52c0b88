//! The crate's own tokio runtime, on which every set's reload task runs, and the watchdog that
//! reports a pass stuck on that thread. A set then keeps reloading when the runtime that started
//! it shuts down (a library used from a short-lived runtime, a test harness, a `block_on` at
//! start-up), and a hostile or hung file can never stall the caller's async workers.
//!
//! One worker thread, and passes run inline on it (see `reload` for why not on the blocking
//! pool): the files are opened non-blocking and only regular files within the size cap are read
//! (see `read`), so a FIFO, a device or a huge file costs nothing. What can still block is a hung
//! filesystem (a hard-mounted NFS server that went away); the [`watchdog`] then reports the stuck
//! pass in the set's `Status` after the set's read timeout, and the set keeps serving its last
//! good material. While one pass is stuck, other sets' passes wait behind it: the files of a
//! process usually live on one filesystem, so they would hang as well.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Runtime};

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime, created on first use.
pub(crate) fn get() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("reload-lib")
            .enable_all()
            .build()
            // Only fails when no thread can be created at all, where nothing else would work.
            .expect("cannot start the reload-lib runtime thread")
    })
}

/// Called by the watchdog, from its own thread, when a pass outlives its deadline.
pub(crate) type OnStuck = Arc<dyn Fn() + Send + Sync>;

/// A pass in flight (one on the runtime thread; tests may watch more).
struct Watched {
    deadline: Instant,
    on_stuck: OnStuck,
    reported: bool,
}

#[derive(Default)]
struct State {
    watched: Vec<(u64, Watched)>,
    next_id: u64,
    /// The watchdog sleeps without a deadline: the next pass must wake it.
    idle: bool,
    /// The deadline the watchdog sleeps towards, if any: a pass with an earlier one (a set with
    /// a shorter read timeout) must wake it too.
    sleeping_until: Option<Instant>,
    started: bool,
}

#[derive(Default)]
struct Watchdog {
    state: Mutex<State>,
    wake: Condvar,
}

static WATCHDOG: OnceLock<Arc<Watchdog>> = OnceLock::new();

/// Reports passes that run longer than their timeout.
///
/// Nothing on the fast path waits for it: starting a pass takes an uncontended lock and wakes
/// the watchdog thread only when it sleeps without a deadline (the first pass after a quiet
/// period) or towards a later deadline than the new pass's (a set with a shorter read timeout);
/// passes that start while it sleeps towards an earlier deadline just replace what it will look
/// at when it wakes. Idle, it does not wake at all.
pub(crate) mod watchdog {
    use super::*;

    /// Marks the start of a pass on the runtime thread; [`Guard::finish`] marks its end.
    pub(crate) fn watch(timeout: Duration, on_stuck: OnStuck) -> Guard {
        let dog = WATCHDOG.get_or_init(|| Arc::new(Watchdog::default()));
        let mut state = dog.state.lock().unwrap_or_else(|p| p.into_inner());
        let id = state.next_id;
        state.next_id += 1;
        let deadline = Instant::now() + timeout;
        let watched = Watched {
            deadline,
            on_stuck,
            reported: false,
        };
        state.watched.push((id, watched));
        if !state.started {
            state.started = true;
            let dog = Arc::clone(dog);
            // Without a watchdog thread passes still run; only a hang goes unreported.
            let spawned = std::thread::Builder::new()
                .name("reload-lib-watchdog".to_owned())
                .spawn(move || run(&dog));
            if let Err(err) = spawned {
                tracing::warn!(error = %err, "cannot start the reload watchdog thread");
            }
        } else if state.idle || state.sleeping_until.is_some_and(|until| deadline < until) {
            state.idle = false;
            state.sleeping_until = None;
            dog.wake.notify_one();
        }
        Guard { id, ended: false }
    }

    /// A pass being watched.
    pub(crate) struct Guard {
        id: u64,
        ended: bool,
    }

    impl Guard {
        /// Ends the watch. True when the pass was reported as stuck.
        pub(crate) fn finish(mut self) -> bool {
            self.ended = true;
            end(self.id)
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            // A pass that panicked: stop watching it all the same.
            if !self.ended {
                end(self.id);
            }
        }
    }

    fn end(id: u64) -> bool {
        let Some(dog) = WATCHDOG.get() else {
            return false;
        };
        let mut state = dog.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.watched.iter().position(|(watched, _)| *watched == id) {
            Some(at) => state.watched.swap_remove(at).1.reported,
            None => false,
        }
    }

    fn run(dog: &Watchdog) {
        let mut state = dog.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            let overdue = state
                .watched
                .iter_mut()
                .find(|(_, watched)| !watched.reported && watched.deadline <= now);
            if let Some((_, watched)) = overdue {
                watched.reported = true;
                let on_stuck = Arc::clone(&watched.on_stuck);
                // Reported outside the lock: it touches the set's status.
                drop(state);
                on_stuck();
                state = dog.state.lock().unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let next = state
                .watched
                .iter()
                .filter(|(_, watched)| !watched.reported)
                .map(|(_, watched)| watched.deadline - now)
                .min();
            state = match next {
                None => {
                    state.idle = true;
                    state.sleeping_until = None;
                    dog.wake.wait(state).unwrap_or_else(|p| p.into_inner())
                }
                Some(wait) => {
                    state.idle = false;
                    state.sleeping_until = Some(now + wait);
                    dog.wake
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_outlives_its_timeout_is_reported_once_and_a_quick_one_never() {
        let (reported, reports) = std::sync::mpsc::channel();
        let report = move |what: &'static str| -> OnStuck {
            let reported = reported.clone();
            Arc::new(move || reported.send(what).unwrap())
        };
        let quick = watchdog::watch(Duration::from_secs(3600), report("quick"));
        assert!(!quick.finish());
        let stuck = watchdog::watch(Duration::from_millis(20), report("stuck"));
        // Awaits the report itself (generous for a loaded machine).
        let first = reports.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(first, "stuck");
        assert!(
            stuck.finish(),
            "the pass that was reported learns it on finishing"
        );
        // A second pass after a quiet period wakes the watchdog again.
        let again = watchdog::watch(Duration::from_millis(20), report("again"));
        assert_eq!(
            reports.recv_timeout(Duration::from_secs(30)).unwrap(),
            "again"
        );
        assert!(again.finish());
        assert!(reports.try_recv().is_err(), "nothing reported twice");
    }

    #[test]
    fn a_pass_with_a_shorter_timeout_wakes_a_watchdog_sleeping_towards_a_later_deadline() {
        let (reported, reports) = std::sync::mpsc::channel();
        let long = watchdog::watch(Duration::from_secs(3600), Arc::new(|| {}));
        // Until the watchdog thread sleeps towards the long pass's deadline (bounded).
        let dog = WATCHDOG.get().unwrap();
        let asleep = Instant::now() + Duration::from_secs(30);
        while dog.state.lock().unwrap().sleeping_until.is_none() {
            assert!(Instant::now() < asleep, "the watchdog never went to sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        let short = watchdog::watch(
            Duration::from_millis(20),
            Arc::new(move || reported.send(()).unwrap()),
        );
        // Reported after about 20 ms, not after the hour the watchdog was sleeping for.
        reports
            .recv_timeout(Duration::from_secs(30))
            .expect("the shorter deadline was not reported");
        assert!(short.finish());
        assert!(!long.finish());
    }
}
