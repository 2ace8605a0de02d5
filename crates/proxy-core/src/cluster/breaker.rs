//! Circuit breakers: Envoy's four limits of a cluster (connections, pending requests, requests,
//! retries), each counted over all workers of the process. A request past a limit is refused
//! at once with 503 and `x-legate-overloaded: true`, never queued without bound.
//!
//! The counts are atomics shared by the workers: one read-modify-write per admission and one
//! per release, on a cache line all workers touch. The limits come from the config, resolved
//! against the worker count when the server starts (`{ per_core: N }` is N per worker).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use config::CircuitBreakerConfig;

/// One limit and what is held against it.
#[derive(Debug)]
pub(crate) struct Breaker {
    limit: u32,
    active: AtomicU32,
}

impl Breaker {
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            limit,
            active: AtomicU32::new(0),
        }
    }

    /// Takes a slot if one is free.
    #[inline]
    pub(crate) fn try_acquire(&self) -> bool {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |active| {
                (active < self.limit).then_some(active + 1)
            })
            .is_ok()
    }

    /// Gives back a slot taken with [`Breaker::try_acquire`].
    #[inline]
    pub(crate) fn release(&self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    pub(crate) fn active(&self) -> u32 {
        self.active.load(Ordering::Relaxed)
    }

    pub(crate) fn remaining(&self) -> u32 {
        self.limit.saturating_sub(self.active())
    }

    /// True while the limit is reached: the next admission would be refused.
    pub(crate) fn is_open(&self) -> bool {
        self.active() >= self.limit
    }
}

/// A cluster's breakers, shared by every worker.
#[derive(Debug)]
pub(crate) struct CircuitBreakers {
    pub(crate) connections: Breaker,
    pub(crate) pending: Breaker,
    pub(crate) requests: Breaker,
    pub(crate) retries: Breaker,
    /// Where given, the retries' limit follows the load instead of `retries`' fixed one.
    retry_budget: Option<config::RetryBudget>,
    pub(crate) pending_timeout: Duration,
    /// Connections open to any one host at once (`max_connections_per_host`).
    pub(crate) max_connections_per_host: Option<u32>,
    /// Connection pools with a connection at once (`max_connection_pools`).
    pub(crate) pools: Option<Breaker>,
    /// Woken when an upstream connection of the cluster closes, for requests pending on
    /// `max_connections` on any worker.
    pub(crate) connection_freed: tokio::sync::Notify,
}

impl CircuitBreakers {
    pub(crate) fn new(config: &CircuitBreakerConfig, workers: usize) -> Self {
        Self {
            connections: Breaker::new(config.max_connections.resolve(workers)),
            pending: Breaker::new(config.max_pending_requests.resolve(workers)),
            requests: Breaker::new(config.max_requests.resolve(workers)),
            retries: Breaker::new(config.max_retries.resolve(workers)),
            retry_budget: config.retry_budget,
            max_connections_per_host: config.max_connections_per_host,
            pools: config.max_connection_pools.map(Breaker::new),
            pending_timeout: config.pending_timeout,
            connection_freed: tokio::sync::Notify::new(),
        }
    }

    /// The retries allowed in flight now: the fixed limit, or the budget's share of the
    /// requests active and pending (at least its minimum), as Envoy's `RetryBudget::max`.
    pub(crate) fn retry_limit(&self) -> u32 {
        match self.retry_budget {
            None => self.retries.limit(),
            Some(budget) => {
                let active = u64::from(self.requests.active()) + u64::from(self.pending.active());
                let share = (budget.budget_percent / 100.0 * active as f64) as u64;
                share
                    .max(u64::from(budget.min_retry_concurrency))
                    .min(u64::from(u32::MAX)) as u32
            }
        }
    }

    /// Takes a retry slot if the limit allows; given back with `retries.release()`.
    pub(crate) fn try_acquire_retry(&self) -> bool {
        let limit = self.retry_limit();
        self.retries
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |active| {
                (active < limit).then_some(active + 1)
            })
            .is_ok()
    }

    /// Gives back a connection slot and wakes requests waiting for one.
    pub(crate) fn connection_closed(&self) {
        self.connections.release();
        if self.pending.active() > 0 {
            self.connection_freed.notify_waiters();
        }
    }
}

/// Holds a slot of `breaker` until dropped.
pub(crate) struct Slot<'a>(&'a Breaker);

impl<'a> Slot<'a> {
    pub(crate) fn try_take(breaker: &'a Breaker) -> Option<Self> {
        // Lazily: a `Slot` built and dropped on refusal would give back a slot never taken.
        breaker.try_acquire().then(|| Slot(breaker))
    }
}

impl Slot<'_> {
    /// Keeps the slot taken past this guard: whoever takes it over calls
    /// [`Breaker::release`] once.
    pub(crate) fn hand_over(self) {
        std::mem::forget(self);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::LimitSpec;

    #[test]
    fn a_breaker_admits_up_to_its_limit_and_frees_on_release() {
        let breaker = Breaker::new(2);
        assert!(breaker.try_acquire());
        assert!(breaker.try_acquire());
        assert!(breaker.is_open());
        assert!(!breaker.try_acquire());
        assert_eq!(breaker.active(), 2, "a refused admission holds nothing");
        breaker.release();
        assert_eq!(breaker.remaining(), 1);
        {
            let _slot = Slot::try_take(&breaker).unwrap();
            assert!(Slot::try_take(&breaker).is_none());
        }
        assert_eq!(breaker.active(), 1);
    }

    #[test]
    fn per_core_limits_scale_with_the_workers() {
        let config = CircuitBreakerConfig {
            max_requests: LimitSpec::PerCore(10),
            max_connections: LimitSpec::Fixed(7),
            ..CircuitBreakerConfig::default()
        };
        for (workers, expected) in [(1, 10), (2, 20), (4, 40)] {
            let breakers = CircuitBreakers::new(&config, workers);
            assert_eq!(breakers.requests.limit(), expected);
            assert_eq!(breakers.connections.limit(), 7);
        }
    }

    #[test]
    fn concurrent_admissions_never_exceed_the_limit() {
        let breaker = std::sync::Arc::new(Breaker::new(100));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let breaker = std::sync::Arc::clone(&breaker);
                std::thread::spawn(move || {
                    let mut held = 0;
                    for _ in 0..1000 {
                        if breaker.try_acquire() {
                            held += 1;
                        }
                    }
                    held
                })
            })
            .collect();
        let held: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(held, 100);
        assert_eq!(breaker.active(), 100);
    }

    #[test]
    fn a_retry_budget_follows_the_requests_active_and_pending() {
        let mut config = CircuitBreakerConfig {
            max_retries: LimitSpec::Fixed(1),
            ..CircuitBreakerConfig::default()
        };
        config.retry_budget = Some(config::RetryBudget {
            budget_percent: 20.0,
            min_retry_concurrency: 3,
        });
        let breakers = CircuitBreakers::new(&config, 1);
        // Nothing active: the minimum, not max_retries.
        assert_eq!(breakers.retry_limit(), 3);
        for _ in 0..40 {
            assert!(breakers.requests.try_acquire());
        }
        for _ in 0..10 {
            assert!(breakers.pending.try_acquire());
        }
        // 20% of 50.
        assert_eq!(breakers.retry_limit(), 10);
        let taken = (0..20).filter(|_| breakers.try_acquire_retry()).count();
        assert_eq!(taken, 10);
        config.retry_budget = None;
        assert_eq!(CircuitBreakers::new(&config, 1).retry_limit(), 1);
    }
}
