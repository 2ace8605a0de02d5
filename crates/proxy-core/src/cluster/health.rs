//! Host health shared by every worker: what active health checks found and whether outlier
//! detection has ejected the host. The two combine into the health the balancers see (an
//! ejected host is out even if it passes checks; a host failing checks is out even when its
//! ejection ends).
//!
//! Workers report each try's outcome with a couple of relaxed atomic operations; the lock is
//! taken only when a host crosses a threshold (an ejection) and by the once-a-second monitor.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use balancer::{Health, HostSet};

use config::OutlierDetectionConfig;

/// How one try at a host ended, as outlier detection counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TryOutcome {
    /// A response with this status.
    Status(u16),
    /// No response: connect failure, reset, timeout, invalid response.
    NoResponse,
}

/// A host's consecutive failures, counted by every worker's tries without a lock.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    consecutive_5xx: AtomicU32,
    consecutive_gateway: AtomicU32,
}

#[derive(Debug, Clone)]
struct HostState {
    addr: SocketAddr,
    /// The health the configuration (EDS) gives the host.
    configured: Health,
    passing_checks: bool,
    ejected_until: Option<Instant>,
    ejections: u32,
    counters: Arc<Counters>,
}

impl HostState {
    fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            configured: Health::Healthy,
            passing_checks: true,
            ejected_until: None,
            ejections: 0,
            counters: Arc::default(),
        }
    }
}

/// What an outlier report led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ejection {
    None,
    Ejected,
    /// The threshold was reached but `max_ejection_percent` hosts are out already.
    Overflow,
}

/// Hosts are known by address, so the state of a host that stays in the set survives
/// endpoint updates (a reload, DNS).
pub(crate) struct HostHealth {
    outlier: Option<OutlierDetectionConfig>,
    hosts: Mutex<Vec<HostState>>,
}

impl HostHealth {
    pub(crate) fn new(host_set: &HostSet, outlier: Option<OutlierDetectionConfig>) -> Self {
        Self {
            outlier,
            hosts: Mutex::new(
                host_set
                    .snapshot()
                    .hosts()
                    .map(|h| HostState {
                        configured: h.health(),
                        ..HostState::new(h.addr())
                    })
                    .collect(),
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<HostState>> {
        self.hosts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The failure counters of the host at `addr`, which a worker's host pool keeps.
    pub(crate) fn counters(&self, addr: SocketAddr) -> Arc<Counters> {
        let mut hosts = self.lock();
        if let Some(host) = hosts.iter().find(|h| h.addr == addr) {
            return Arc::clone(&host.counters);
        }
        let host = HostState::new(addr);
        let counters = Arc::clone(&host.counters);
        hosts.push(host);
        counters
    }

    /// Publishes a new host list: hosts that stay keep their state (ejections, checks), new
    /// ones start passing checks, removed ones are forgotten. Each host's health is the one
    /// the list gives (the configuration's) made worse by what checks and ejections found.
    pub(crate) fn publish(
        &self,
        host_set: &HostSet,
        mut specs: Vec<balancer::HostSpec>,
    ) -> Result<(), balancer::BuildError> {
        let mut hosts = self.lock();
        let listed: std::collections::HashSet<SocketAddr> = specs.iter().map(|s| s.addr).collect();
        hosts.retain(|h| listed.contains(&h.addr));
        for spec in &mut specs {
            let state = match hosts.iter_mut().position(|h| h.addr == spec.addr) {
                Some(i) => &mut hosts[i],
                None => {
                    hosts.push(HostState::new(spec.addr));
                    hosts.last_mut().expect("just pushed")
                }
            };
            state.configured = spec.health;
            spec.health = state.health();
        }
        // Under the lock, so that a verdict or an ejection cannot land between the list and
        // its publication.
        host_set.update(specs)
    }

    /// Counts a try at the host at `addr`; ejects it when a threshold is reached.
    #[inline]
    pub(crate) fn report(
        &self,
        host_set: &HostSet,
        counters: &Counters,
        addr: SocketAddr,
        outcome: TryOutcome,
    ) -> Ejection {
        let Some(config) = self.outlier else {
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
            self.eject(host_set, addr, &config)
        } else {
            Ejection::None
        }
    }

    fn eject(
        &self,
        host_set: &HostSet,
        addr: SocketAddr,
        config: &OutlierDetectionConfig,
    ) -> Ejection {
        let mut hosts = self.lock();
        let now = Instant::now();
        let ejected = hosts.iter().filter(|h| h.ejected_until.is_some()).count();
        let allowed = (hosts.len() * config.max_ejection_percent as usize / 100).max(1);
        let Some(host) = hosts.iter_mut().find(|h| h.addr == addr) else {
            return Ejection::None; // removed from the set meanwhile
        };
        if host.ejected_until.is_some() {
            return Ejection::None; // reported by another worker at the same moment
        }
        if config.max_ejection_percent == 0 || ejected >= allowed {
            return Ejection::Overflow;
        }
        host.ejections += 1;
        let time = config.base_ejection_time.saturating_mul(host.ejections);
        host.ejected_until = Some(now + time.min(config.max_ejection_time));
        host.counters.consecutive_5xx.store(0, Ordering::Relaxed);
        host.counters
            .consecutive_gateway
            .store(0, Ordering::Relaxed);
        let host = host.clone();
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
    pub(crate) fn set_passing(&self, host_set: &HostSet, addr: SocketAddr, passing: bool) {
        let mut hosts = self.lock();
        if let Some(host) = hosts.iter_mut().find(|h| h.addr == addr) {
            host.passing_checks = passing;
            apply(host_set, host);
        }
    }

    /// (ejected now, ejections so far, passing health checks) of the host at `addr`.
    pub(crate) fn describe(&self, addr: SocketAddr) -> Option<(bool, u32, bool)> {
        self.lock()
            .iter()
            .find(|h| h.addr == addr)
            .map(|h| (h.ejected_until.is_some(), h.ejections, h.passing_checks))
    }
}

fn apply(host_set: &HostSet, host: &HostState) {
    host_set.set_health(host.addr, host.health());
}

impl HostState {
    fn health(&self) -> Health {
        if self.ejected_until.is_some() {
            Health::Ejected
        } else if !self.passing_checks {
            Health::Unhealthy
        } else {
            self.configured
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9000 + i))
    }

    fn report(health: &HostHealth, hosts: &HostSet, i: u16, outcome: TryOutcome) -> Ejection {
        let counters = health.counters(addr(i));
        health.report(hosts, &counters, addr(i), outcome)
    }

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
            max_ejection_time: Duration::from_millis(120),
            max_ejection_percent,
        }
    }

    #[test]
    fn ejection_time_grows_with_each_ejection_up_to_the_cap() {
        let hosts = set(2);
        let health = HostHealth::new(&hosts, Some(config(50)));
        let mut lengths = Vec::new();
        for _ in 0..4 {
            for _ in 0..3 {
                report(&health, &hosts, 0, TryOutcome::Status(503));
            }
            let mut state = health.lock();
            let host = state.iter_mut().find(|h| h.addr == addr(0)).unwrap();
            let until = host.ejected_until.take().expect("ejected");
            lengths.push(until.saturating_duration_since(Instant::now()));
        }
        // 50 ms, 100 ms, then the 120 ms cap instead of 150 ms and 200 ms.
        assert!(lengths[0] <= Duration::from_millis(50), "{lengths:?}");
        assert!(lengths[1] > Duration::from_millis(50), "{lengths:?}");
        for capped in &lengths[2..] {
            assert!(*capped > Duration::from_millis(100), "{lengths:?}");
            assert!(*capped <= Duration::from_millis(120), "{lengths:?}");
        }
    }

    #[test]
    fn consecutive_5xx_eject_and_a_success_resets_the_count() {
        let hosts = set(4);
        let health = HostHealth::new(&hosts, Some(config(50)));
        let fail = TryOutcome::Status(500);
        assert_eq!(report(&health, &hosts, 1, fail), Ejection::None);
        assert_eq!(report(&health, &hosts, 1, fail), Ejection::None);
        assert_eq!(
            report(&health, &hosts, 1, TryOutcome::Status(200)),
            Ejection::None
        );
        assert_eq!(report(&health, &hosts, 1, fail), Ejection::None);
        assert_eq!(report(&health, &hosts, 1, fail), Ejection::None);
        assert_eq!(
            report(&health, &hosts, 1, TryOutcome::NoResponse),
            Ejection::Ejected
        );
        assert_eq!(hosts.snapshot().get(1).unwrap().health(), Health::Ejected);
        assert_eq!(health.describe(addr(1)), Some((true, 1, true)));

        std::thread::sleep(Duration::from_millis(60));
        health.expire_ejections(&hosts);
        assert_eq!(hosts.snapshot().get(1).unwrap().health(), Health::Healthy);
    }

    #[test]
    fn max_ejection_percent_caps_ejections_but_allows_one() {
        let hosts = set(4);
        let health = HostHealth::new(&hosts, Some(config(10)));
        for _ in 0..3 {
            report(&health, &hosts, 0, TryOutcome::Status(503));
        }
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Ejected);
        let mut last = Ejection::None;
        for _ in 0..3 {
            last = report(&health, &hosts, 2, TryOutcome::Status(503));
        }
        assert_eq!(last, Ejection::Overflow);
        assert_eq!(hosts.snapshot().get(2).unwrap().health(), Health::Healthy);
    }

    #[test]
    fn failing_checks_keep_a_host_out_after_its_ejection() {
        let hosts = set(2);
        let health = HostHealth::new(&hosts, Some(config(50)));
        health.set_passing(&hosts, addr(0), false);
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Unhealthy);
        for _ in 0..3 {
            report(&health, &hosts, 0, TryOutcome::NoResponse);
        }
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Ejected);
        std::thread::sleep(Duration::from_millis(60));
        health.expire_ejections(&hosts);
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Unhealthy);
        health.set_passing(&hosts, addr(0), true);
        assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Healthy);
    }

    #[test]
    fn hosts_that_stay_keep_their_ejection_across_an_update() {
        let hosts = set(3);
        let health = HostHealth::new(&hosts, Some(config(100)));
        for _ in 0..3 {
            report(&health, &hosts, 1, TryOutcome::Status(503));
        }
        health
            .publish(
                &hosts,
                vec![
                    balancer::HostSpec::new(addr(1)),
                    balancer::HostSpec::new(addr(7)).with_health(Health::Degraded),
                ],
            )
            .unwrap();
        let snapshot = hosts.snapshot();
        let health_of = |i| {
            snapshot
                .get(snapshot.position(addr(i)).unwrap())
                .unwrap()
                .health()
        };
        assert_eq!(health_of(1), Health::Ejected, "the ejection survives");
        assert_eq!(health_of(7), Health::Degraded, "as the configuration says");
        // Passing checks make a host no better than its configured health.
        health.set_passing(&hosts, addr(7), false);
        health.set_passing(&hosts, addr(7), true);
        assert_eq!(hosts.snapshot().get(1).unwrap().health(), Health::Degraded);
        assert_eq!(health.describe(addr(1)), Some((true, 1, true)));
        assert_eq!(
            health.describe(addr(0)),
            None,
            "a removed host is forgotten"
        );
    }
}
