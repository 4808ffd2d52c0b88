//! When the controller's loop runs its next pass (see the module docs of `regenerate`).

use std::time::Duration;

use backon::ExponentialBackoff;

use super::report::Report;
use crate::base::backoff::doubling;

/// The longest the loop sleeps without a reason (a guard against clock jumps; not a poll:
/// the pass it triggers normally finds nothing to do).
const MAX_SLEEP: Duration = Duration::from_secs(6 * 3600);

/// When the loop runs its next pass (watch events wake it earlier): one second after the next
/// deadline a pass reported (an expiry or a rotation point), at most [`MAX_SLEEP`]; after a
/// failed pass, a backoff from 1 s doubling to 60 s, reset by a pass that succeeds.
#[derive(Debug, Default)]
pub(super) struct PassTimer {
    /// The failed passes' backoff (backon's exponential backoff, without jitter: there is one
    /// controller); `None` while passes succeed.
    retry: Option<ExponentialBackoff>,
}

/// First retry after a failed pass, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

impl PassTimer {
    /// The sleep after a pass that succeeded at `pass_now` (Unix seconds).
    fn after_success(&mut self, next_deadline: Option<i64>, pass_now: i64) -> Duration {
        self.retry = None;
        next_deadline
            .map(|at| Duration::from_secs((at - pass_now).max(0) as u64 + 1))
            .unwrap_or(MAX_SLEEP)
            .min(MAX_SLEEP)
    }

    /// The sleep after `report`'s pass (made at `pass_now`): after a failure the backoff,
    /// else until the next deadline; a pass that wrote without failures is followed by another
    /// at once (a write can change the decision for an item earlier in the order: a bundle
    /// prunes an expired CA once the leaves it issued are re-issued; the cache already holds our
    /// writes, so their watch events wake nothing). Never longer than until a write the brake
    /// held may be made. What bounds the passes a write loop makes is the brake (each object's
    /// write budget): a pass that only holds writes writes nothing, and the loop sleeps.
    pub(super) fn after_pass(&mut self, report: &Report, pass_now: i64) -> Duration {
        let sleep = if !report.failures.is_empty() {
            self.after_failure()
        } else if !report.written.is_empty() {
            self.retry = None;
            Duration::ZERO
        } else {
            self.after_success(report.next_deadline, pass_now)
        };
        report
            .held
            .iter()
            .filter_map(|held| held.release_in)
            .fold(sleep, Duration::min)
    }

    /// The sleep after a pass with failures.
    fn after_failure(&mut self) -> Duration {
        self.retry
            .get_or_insert_with(|| doubling(RETRY_FIRST, RETRY_MAX))
            .next()
            .unwrap_or(RETRY_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_SLEEP, PassTimer};
    use std::time::Duration;

    #[test]
    fn the_next_pass_is_a_second_after_the_deadline_and_never_later_than_max_sleep() {
        let mut timer = PassTimer::default();
        assert_eq!(
            timer.after_success(Some(1_100), 1_000),
            Duration::from_secs(101)
        );
        // A deadline already past: at once (one second, so the clock has moved past it).
        assert_eq!(
            timer.after_success(Some(900), 1_000),
            Duration::from_secs(1)
        );
        assert_eq!(timer.after_success(None, 1_000), MAX_SLEEP);
        assert_eq!(timer.after_success(Some(i64::MAX / 2), 0), MAX_SLEEP);
    }

    #[test]
    fn failures_back_off_to_a_minute_and_a_success_resets_the_backoff() {
        let mut timer = PassTimer::default();
        let backoff: Vec<u64> = (0..8).map(|_| timer.after_failure().as_secs()).collect();
        assert_eq!(backoff, [1, 2, 4, 8, 16, 32, 60, 60]);
        timer.after_success(Some(10), 0);
        assert_eq!(timer.after_failure(), Duration::from_secs(1));
    }

    /// On tokio's paused clock: a pass whose next deadline is 100 s away sleeps until a second
    /// after it, not before (the loop's `sleep(sleep_for)` with the timer's value).
    #[tokio::test(start_paused = true)]
    async fn the_timer_wakes_the_loop_just_after_the_deadline_on_tokios_clock() {
        let mut timer = PassTimer::default();
        let start = tokio::time::Instant::now();
        let sleep = tokio::time::sleep(timer.after_success(Some(100), 0));
        tokio::pin!(sleep);
        tokio::time::advance(Duration::from_secs(100)).await;
        assert!(
            futures::poll!(&mut sleep).is_pending(),
            "woke before the deadline had passed"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(futures::poll!(&mut sleep).is_ready());
        assert_eq!(start.elapsed(), Duration::from_secs(101));
    }
}
