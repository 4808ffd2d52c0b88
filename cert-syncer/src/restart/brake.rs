//! The brake on restart storms: at most `budget` restarts of one container within `window`.
//! A writer that keeps changing a pair (two controllers that disagree, a loop) restarts the
//! server `budget` times, then the restart waits until the oldest leaves the window; the held
//! restart is an Event and `cert_syncer_container_restarts_held_total{reason="brake"}`. The
//! newest bytes are restarted into once the window allows, so a storm ends with the server on
//! the last pair. Time is tokio's clock (paused in the unit tests).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The restarts of one container within the window.
#[derive(Debug)]
pub struct Brake {
    budget: usize,
    window: Duration,
    restarts: VecDeque<Instant>,
}

impl Brake {
    pub fn new(budget: usize, window: Duration) -> Brake {
        Brake {
            budget: budget.max(1),
            window,
            restarts: VecDeque::new(),
        }
    }

    /// Records a restart now.
    pub fn record(&mut self) {
        self.restarts.push_back(Instant::now());
        while self.restarts.len() > self.budget {
            self.restarts.pop_front();
        }
    }

    /// `None` when a restart may happen now; else how long until it may.
    pub fn holds(&mut self) -> Option<Duration> {
        let now = Instant::now();
        while self
            .restarts
            .front()
            .is_some_and(|at| now.duration_since(*at) >= self.window)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() < self.budget {
            return None;
        }
        let oldest = *self.restarts.front()?;
        Some(self.window - now.duration_since(oldest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_budget_is_per_window_and_comes_back_as_restarts_leave_it() {
        let window = Duration::from_secs(600);
        let mut brake = Brake::new(3, window);
        for _ in 0..3 {
            assert_eq!(brake.holds(), None);
            brake.record();
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        // Three restarts at 0, 10, 20 s; now 30 s: the first leaves the window at 600 s.
        assert_eq!(brake.holds(), Some(Duration::from_secs(570)));
        tokio::time::advance(Duration::from_secs(569)).await;
        assert!(brake.holds().is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(brake.holds(), None);
        brake.record();
        assert_eq!(brake.holds(), Some(Duration::from_secs(10)));
    }
}
