//! The one retry schedule of the crate's loops: backon's exponential backoff, doubling from a
//! first delay up to a cap, without jitter (each schedule paces one object or one controller,
//! so there is no herd to spread) and without an end (a loop retries until it succeeds or is
//! told to stop).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays from `first`, doubling, capped at `max`, never ending.
pub(crate) fn doubling(first: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::doubling;
    use std::time::Duration;

    #[test]
    fn doubles_from_the_first_delay_up_to_the_cap_and_never_ends() {
        let delays: Vec<Duration> = doubling(Duration::from_millis(500), Duration::from_secs(3))
            .take(6)
            .collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [500, 1000, 2000, 3000, 3000, 3000]);
    }
}
