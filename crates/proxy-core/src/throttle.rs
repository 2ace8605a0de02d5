//! Log lines about events that can repeat once per request (a breaker refusing, a dead
//! authorization service): the first is written, then at most one a second with the count of
//! those in between, so an overload does not also flood the log and slow the path it hits.

use std::cell::Cell;
use std::time::Duration;

use tokio::time::Instant;

/// One line a second at most, per worker and subject.
#[derive(Default)]
pub(crate) struct LogThrottle {
    unlogged: Cell<u64>,
    logged_at: Cell<Option<Instant>>,
}

impl LogThrottle {
    /// Counts one event. `Some(n)` when a line should be written now, `n` being the events it
    /// stands for (this one and those not logged since the last line).
    pub(crate) fn hit(&self) -> Option<u64> {
        let events = self.unlogged.get() + 1;
        let now = Instant::now();
        if self
            .logged_at
            .get()
            .is_some_and(|at| now - at < Duration::from_secs(1))
        {
            self.unlogged.set(events);
            return None;
        }
        self.logged_at.set(Some(now));
        self.unlogged.set(0);
        Some(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_a_second_carries_the_count_in_between() {
        let throttle = LogThrottle::default();
        assert_eq!(throttle.hit(), Some(1));
        assert_eq!(throttle.hit(), None);
        assert_eq!(throttle.hit(), None);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(throttle.hit(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(throttle.hit(), Some(4));
        assert_eq!(throttle.hit(), None);
    }
}
