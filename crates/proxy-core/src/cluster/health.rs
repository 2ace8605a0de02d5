//! Host health shared by every worker: what active health checks found and whether outlier
//! detection has ejected the host. The two combine into the health the balancers see (an
//! ejected host is out even if it passes checks; a host failing checks is out even when its
//! ejection ends).
//!
//! Workers report each try's outcome with a couple of relaxed atomic operations; the lock is
//! taken only when a host crosses a threshold (an ejection) and by the once-a-second monitor.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use balancer::{Health, HostSet};

use crate::config::OutlierDetectionConfig;

/// How one try at a host ended, as outlier detection counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TryOutcome {
    /// A response with this status.
    Status(u16),
    /// No response: connect failure, reset, timeout, invalid response.
    NoResponse,
}

#[derive(Debug, Default)]
struct Counters {
    consecutive_5xx: AtomicU32,
    consecutive_gateway: AtomicU32,
}

#[derive(Debug, Clone, Copy)]
struct HostState {
    addr: SocketAddr,
    passing_checks: bool,
    ejected_until: Option<Instant>,
    ejections: u32,
}

/// What an outlier report led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ejection {
    None,
    Ejected,
    /// The threshold was reached but `max_ejection_percent` hosts are out already.
    Overflow,
}

pub(crate) struct HostHealth {
    outlier: Option<OutlierDetectionConfig>,
    counters: Vec<Counters>,
    hosts: Mutex<Vec<HostState>>,
}

impl HostHealth {
    pub(crate) fn new(host_set: &HostSet, outlier: Option<OutlierDetectionConfig>) -> Self {
        let snapshot = host_set.snapshot();
        Self {
            outlier,
            counters: snapshot.hosts().map(|_| Counters::default()).collect(),
            hosts: Mutex::new(
                snapshot
                    .hosts()
                    .map(|h| HostState {
                        addr: h.addr(),
                        passing_checks: true,
                        ejected_until: None,
                        ejections: 0,
                    })
                    .collect(),
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<HostState>> {
        self.hosts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a try at host `index`; ejects the host when a threshold is reached.
    #[inline]
    pub(crate) fn report(&self, host_set: &HostSet, index: usize, outcome: TryOutcome) -> Ejection {
        let (Some(config), Some(counters)) = (self.outlier, self.counters.get(index)) else {
            return Ejection::None;
        };
        let (server_error, gateway) = match outcome {
            TryOutcome::Status(code) => (code >= 500, matches!(code, 502..=504)),
            TryOutcome::NoResponse => (true, true),
        };
        let over = |counter: &AtomicU32, failed: bool, threshold: u32| {
            if !failed {
                // Read first: a healthy host's counter stays 0 and its cache line clean.
                if counter.load(Ordering::Relaxed) != 0 {
                    counter.store(0, Ordering::Relaxed);
                }
                return false;
            }
            let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
            threshold > 0 && n >= threshold
        };
        let by_5xx = over(
            &counters.consecutive_5xx,
            server_error,
            config.consecutive_5xx,
        );
        let by_gateway = over(
            &counters.consecutive_gateway,
            gateway,
            config.consecutive_gateway_failure,
        );
        if by_5xx || by_gateway {
            self.eject(host_set, index, &config)
        } else {
            Ejection::None
        }
    }

    fn eject(&self, host_set: &HostSet, index: usize, config: &OutlierDetectionConfig) -> Ejection {
        let mut hosts = self.lock();
        let now = Instant::now();
        if hosts[index].ejected_until.is_some() {
            return Ejection::None; // reported by another worker at the same moment
        }
        let ejected = hosts.iter().filter(|h| h.ejected_until.is_some()).count();
        let allowed = (hosts.len() * config.max_ejection_percent as usize / 100).max(1);
        if config.max_ejection_percent == 0 || ejected >= allowed {
            return Ejection::Overflow;
        }
        let host = &mut hosts[index];
        host.ejections += 1;
        host.ejected_until = Some(now + config.base_ejection_time * host.ejections);
        let counters = &self.counters[index];
        counters.consecutive_5xx.store(0, Ordering::Relaxed);
        counters.consecutive_gateway.store(0, Ordering::Relaxed);
        let host = *host;
        drop(hosts);
        tracing::warn!(host = %host.addr, ejections = host.ejections, "outlier detection ejected a host");
        apply(host_set, &host);
        Ejection::Ejected
    }

    /// Ends ejections whose time is up.
    pub(crate) fn expire_ejections(&self, host_set: &HostSet) {
        let mut hosts = self.lock();
        let now = Instant::now();
        for host in hosts.iter_mut() {
            if host.ejected_until.is_some_and(|until| until <= now) {
                host.ejected_until = None;
                tracing::info!(host = %host.addr, "ejection ended");
                apply(host_set, host);
            }
        }
    }

    /// Records a health-check verdict that changed.
    pub(crate) fn set_passing(&self, host_set: &HostSet, index: usize, passing: bool) {
        let mut hosts = self.lock();
        if let Some(host) = hosts.get_mut(index) {
            host.passing_checks = passing;
            apply(host_set, host);
        }
    }

    /// (ejected now, ejections so far, passing health checks) of host `index`.
    pub(crate) fn describe(&self, index: usize) -> Option<(bool, u32, bool)> {
        self.lock()
            .get(index)
            .map(|h| (h.ejected_until.is_some(), h.ejections, h.passing_checks))
    }
}

fn apply(host_set: &HostSet, host: &HostState) {
    let health = if host.ejected_until.is_some() {
        Health::Ejected
    } else if !host.passing_checks {
        Health::Unhealthy
    } else {
        Health::Healthy
    };
    host_set.set_health(host.addr, health);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn set(n: u16) -> HostSet {
        HostSet::new(
            (0..n)
                .map(|i| balancer::HostSpec::new(SocketAddr::from(([127, 0, 0, 1], 9000 + i))))
                .collect(),
        )
        .unwrap()
    }

    fn config(max_ejection_percent: u32) -> OutlierDetectionConfig {
        OutlierDetectionConfig {
            consecutive_5xx: 3,
            consecutive_gateway_failure: 0,
            base_ejection_time: Duration::from_millis(50),
            max_ejection_percent,
        }
    }

    #[test]
    fn consecutive_5xx_eject_and_a_success_resets_the_count() {
        let hosts = set(4);
        let health = HostHealth::new(&hosts, Some(config(50)));
        let fail = TryOutcome::Status(500);
        assert_eq!(health.report(&hosts, 1, fail), Ejection::None);
        assert_eq!(health.report(&hosts, 1, fail), Ejection::None);
        assert_eq!(
            health.report(&hosts, 1, TryOutcome::Status(200)),
            Ejection::None
        );
        assert_eq!(health.report(&hosts, 1, fail), Ejection::None);
        assert_eq!(health.report(&hosts, 1, fail), Ejection::None);
        assert_eq!(
            health.report(&hosts, 1, TryOutcome::NoResponse),
            Ejection::Ejected
        );
        assert_eq!(hosts.snapshot().get(1).unwrap().health(), Health::Ejected);
        assert_eq!(health.describe(1), Some((true, 1, true)));

        std::thread::sleep(Duration::from_millis(60));
        health.expire_ejections(&hosts);
        assert_eq!(hosts.snapshot().get(1).unwrap().health(), Health::Healthy);
    }

    #[test]
    fn max_ejection_percent_caps_ejections_but_allows_one() {
        let hosts = set(4);
        let health = HostHealth::new(&hosts, Some(config(10)));
        for _ in 0..3 {
            health.report(&hosts, 0, TryOutcome::Status(503));
        }
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Ejected);
        let mut last = Ejection::None;
        for _ in 0..3 {
            last = health.report(&hosts, 2, TryOutcome::Status(503));
        }
        assert_eq!(last, Ejection::Overflow);
        assert_eq!(hosts.snapshot().get(2).unwrap().health(), Health::Healthy);
    }

    #[test]
    fn failing_checks_keep_a_host_out_after_its_ejection() {
        let hosts = set(2);
        let health = HostHealth::new(&hosts, Some(config(50)));
        health.set_passing(&hosts, 0, false);
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Unhealthy);
        for _ in 0..3 {
            health.report(&hosts, 0, TryOutcome::NoResponse);
        }
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Ejected);
        std::thread::sleep(Duration::from_millis(60));
        health.expire_ejections(&hosts);
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Unhealthy);
        health.set_passing(&hosts, 0, true);
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Healthy);
    }
}
