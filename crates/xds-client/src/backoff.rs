//! The wait between streams: exponential, with full jitter so that a fleet whose server
//! restarts does not come back in one wave.

use std::time::Duration;

/// Exponential backoff with full jitter: the n-th wait in a row is drawn uniformly from
/// `[0, min(base * 2^n, max)]`, and at least 10 ms so a dead server is not hammered.
#[derive(Debug, Clone)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    failures: u32,
}

impl Default for Backoff {
    /// Envoy's: 500 ms doubling up to 30 s.
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(30))
    }
}

const FLOOR: Duration = Duration::from_millis(10);

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            failures: 0,
        }
    }

    /// The wait before the next attempt; each call without a [`reset`](Self::reset) doubles
    /// the ceiling.
    pub fn next_wait(&mut self) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.failures.min(20))
            .min(self.max);
        self.failures = self.failures.saturating_add(1);
        ceiling.mul_f64(rand::random::<f64>()).max(FLOOR)
    }

    /// After a stream that worked: the next wait starts again from `base`.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_stay_under_a_doubling_ceiling_and_start_again_after_a_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let ceilings = [100, 200, 400, 800, 1000, 1000];
        for ceiling in ceilings {
            let wait = backoff.next_wait();
            assert!(
                wait <= Duration::from_millis(ceiling),
                "{wait:?} > {ceiling} ms"
            );
            assert!(wait >= FLOOR);
        }
        backoff.reset();
        assert!(backoff.next_wait() <= Duration::from_millis(100));
    }

    #[test]
    fn waits_are_spread() {
        let mut waits = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let mut backoff = Backoff::new(Duration::from_secs(10), Duration::from_secs(10));
            waits.insert(backoff.next_wait());
        }
        // 50 draws from [10 ms, 10 s]: all equal only if there were no jitter.
        assert!(waits.len() > 40, "{} distinct waits", waits.len());
    }
}
