//! Host health shared by every worker: what active health checks found and whether outlier
//! detection has ejected the host. The two combine into the health the balancers see (an
//! ejected host is out even if it passes checks; a host failing checks is out even when its
//! ejection ends).
//!
//! Workers report each try's outcome with a couple of relaxed atomic operations; the lock is
//! taken only when a host crosses a threshold (an ejection) and by the once-a-second monitor.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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

/// A host's consecutive failures, and its tries and failures in the current interval,
/// counted by every worker's tries without a lock.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Connections open (or being opened) to the host, from every worker.
    pub(crate) connections: AtomicU32,
    /// With local-origin failures split out: those in a row, and the interval's tries and
    /// local-origin failures.
    consecutive_local: AtomicU32,
    local_tries: AtomicU64,
    local_failures: AtomicU64,
    consecutive_5xx: AtomicU32,
    consecutive_gateway: AtomicU32,
    tries: AtomicU64,
    failures: AtomicU64,
    /// Times the host failed its health checks or was ejected: each worker's connections
    /// made before the latest take no new request (Envoy drains a failed host's pools).
    health_failures: AtomicU32,
    /// Woken (all waiters) when the host fails: its idle connections' watchers, its relays
    /// that close with it.
    pub(crate) failed: tokio::sync::Notify,
}

impl Counters {
    /// How many times the host has failed (see `health_failures`).
    pub(crate) fn health_failures(&self) -> u32 {
        self.health_failures.load(Ordering::Relaxed)
    }
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

/// What an interval's success-rate and failure-percentage evaluation found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RateEjections {
    pub(crate) success_rate_detected: u64,
    pub(crate) success_rate_enforced: u64,
    pub(crate) failure_percentage_detected: u64,
    pub(crate) failure_percentage_enforced: u64,
    /// Enforced ejections skipped because `max_ejection_percent` hosts were out already.
    pub(crate) overflow: u64,
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
    /// When success rates and failure percentages were last evaluated.
    evaluated_at: Mutex<Instant>,
}

impl HostHealth {
    pub(crate) fn new(host_set: &HostSet, outlier: Option<OutlierDetectionConfig>) -> Self {
        Self {
            outlier,
            evaluated_at: Mutex::new(Instant::now()),
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
        let (server_error, gateway) = match (outcome, config.local_origin) {
            (TryOutcome::Status(code), _) => (code >= 500, matches!(code, 502..=504)),
            (TryOutcome::NoResponse, None) => (true, true),
            // Split out: a local-origin failure counts on its own, not as the host's answer.
            (TryOutcome::NoResponse, Some(local)) => {
                counters.local_tries.fetch_add(1, Ordering::Relaxed);
                counters.local_failures.fetch_add(1, Ordering::Relaxed);
                if over(&counters.consecutive_local, true, local.consecutive_failure) {
                    return self.eject(host_set, addr, &config);
                }
                return Ejection::None;
            }
        };
        if let Some(local) = config.local_origin {
            // An answer is a local-origin success.
            counters.local_tries.fetch_add(1, Ordering::Relaxed);
            over(
                &counters.consecutive_local,
                false,
                local.consecutive_failure,
            );
        }
        // For the interval's success rate: a 5xx (or, not split out, no response) is a
        // failure.
        counters.tries.fetch_add(1, Ordering::Relaxed);
        if server_error {
            counters.failures.fetch_add(1, Ordering::Relaxed);
        }
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
        let Some(index) = hosts.iter().position(|h| h.addr == addr) else {
            return Ejection::None; // removed from the set meanwhile
        };
        let ejection = eject_locked(&mut hosts, index, config, Instant::now());
        let host = &hosts[index];
        if ejection == Ejection::Ejected {
            tracing::warn!(host = %host.addr, ejections = host.ejections, "outlier detection ejected a host");
            // Under the lock: a health check ending the ejection cannot land in between.
            apply(host_set, host);
            self.failed(host);
        }
        ejection
    }

    /// Every `interval`: Envoy's success-rate and failure-percentage ejections over the
    /// tries since the last evaluation, of hosts not ejected with enough of them.
    pub(crate) fn evaluate_rates(&self, host_set: &HostSet, now: Instant) -> RateEjections {
        let mut found = RateEjections::default();
        let Some(config) = self.outlier else {
            return found;
        };
        {
            let mut evaluated_at = self
                .evaluated_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if now.duration_since(*evaluated_at) < config.interval {
                return found;
            }
            *evaluated_at = now;
        }
        let mut hosts = self.lock();
        // (index, success rate in percent, tries) of each host not ejected that was tried;
        // every host's counts start over, so an ejected host comes back with a clean slate.
        let bucket = |tries: &AtomicU64, failures: &AtomicU64, ejected: bool| {
            let tries = tries.swap(0, Ordering::Relaxed);
            let failures = failures.swap(0, Ordering::Relaxed).min(tries);
            (!ejected && tries > 0)
                .then(|| (100.0 * (tries - failures) as f64 / tries as f64, tries))
        };
        let rates: Vec<(usize, f64, u64)> = hosts
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let c = &h.counters;
                let (rate, tries) = bucket(&c.tries, &c.failures, h.ejected_until.is_some())?;
                Some((i, rate, tries))
            })
            .collect();
        // Local-origin failures, when split out, are judged by the same rules apart.
        let local_rates: Vec<(usize, f64, u64)> = hosts
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let c = &h.counters;
                let (rate, tries) =
                    bucket(&c.local_tries, &c.local_failures, h.ejected_until.is_some())?;
                Some((i, rate, tries))
            })
            .collect();
        let mut outliers: Vec<(usize, bool, u32)> = Vec::new(); // (host, by success rate, enforcing)
        find_outliers(
            &rates,
            &config.success_rate,
            &config.failure_percentage,
            None,
            &mut outliers,
        );
        if let Some(local) = config.local_origin {
            find_outliers(
                &local_rates,
                &config.success_rate,
                &config.failure_percentage,
                Some((
                    local.success_rate_enforcing,
                    local.failure_percentage_enforcing,
                )),
                &mut outliers,
            );
        }
        for (index, by_success_rate, enforcing) in outliers {
            let (detected, enforced) = if by_success_rate {
                (
                    &mut found.success_rate_detected,
                    &mut found.success_rate_enforced,
                )
            } else {
                (
                    &mut found.failure_percentage_detected,
                    &mut found.failure_percentage_enforced,
                )
            };
            *detected += 1;
            if !crate::random::percent_drawn(enforcing) {
                continue;
            }
            match eject_locked(&mut hosts, index, &config, now) {
                Ejection::Ejected => {
                    *enforced += 1;
                    let host = &hosts[index];
                    tracing::warn!(host = %host.addr, ejections = host.ejections, "outlier detection ejected a host by its rates");
                    apply(host_set, host);
                    self.failed(host);
                }
                Ejection::Overflow => found.overflow += 1,
                Ejection::None => {}
            }
        }
        found
    }
}

/// The success-rate and failure-percentage outliers among `rates` (host, success percent,
/// tries): `(host, by success rate, enforcing percent)`, the enforcement `local`'s when given.
fn find_outliers(
    rates: &[(usize, f64, u64)],
    success_rate: &config::RateEjection,
    failure_percentage: &config::RateEjection,
    local: Option<(u32, u32)>,
    outliers: &mut Vec<(usize, bool, u32)>,
) {
    {
        let judged = |rule: &config::RateEjection| -> Vec<(usize, f64)> {
            let valid: Vec<(usize, f64)> = rates
                .iter()
                .filter(|(_, _, tries)| *tries >= u64::from(rule.request_volume))
                .map(|(i, rate, _)| (*i, *rate))
                .collect();
            if valid.is_empty() || valid.len() < rule.minimum_hosts as usize {
                Vec::new()
            } else {
                valid
            }
        };
        let valid = judged(success_rate);
        if let Some(threshold) = success_rate_threshold(&valid, success_rate.threshold) {
            let enforcing = local.map_or(success_rate.enforcing, |(sr, _)| sr);
            outliers.extend(
                valid
                    .iter()
                    .filter(|(_, r)| *r < threshold)
                    .map(|(i, _)| (*i, true, enforcing)),
            );
        }
        let limit = f64::from(failure_percentage.threshold);
        let enforcing = local.map_or(failure_percentage.enforcing, |(_, fp)| fp);
        for (i, rate) in judged(failure_percentage) {
            // Counted as found again when success rate found it too, as in Envoy; a host is
            // ejected once.
            if 100.0 - rate >= limit {
                outliers.push((i, false, enforcing));
            }
        }
    }
}

impl HostHealth {
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

    /// A health check passed: it ends the host's ejection where the configuration says so
    /// (Envoy's `successful_active_health_check_uneject_host`).
    pub(crate) fn check_passed(&self, host_set: &HostSet, addr: SocketAddr) {
        if !self.outlier.is_some_and(|o| o.uneject_on_health_check) {
            return;
        }
        let mut hosts = self.lock();
        if let Some(host) = hosts.iter_mut().find(|h| h.addr == addr)
            && host.ejected_until.is_some()
        {
            host.ejected_until = None;
            host.counters.consecutive_5xx.store(0, Ordering::Relaxed);
            host.counters
                .consecutive_gateway
                .store(0, Ordering::Relaxed);
            host.counters.consecutive_local.store(0, Ordering::Relaxed);
            tracing::info!(host = %host.addr, "a passing health check ended an ejection");
            apply(host_set, host);
        }
    }

    /// Records a health-check verdict that changed.
    pub(crate) fn set_passing(&self, host_set: &HostSet, addr: SocketAddr, passing: bool) {
        let mut hosts = self.lock();
        if let Some(host) = hosts.iter_mut().find(|h| h.addr == addr) {
            host.passing_checks = passing;
            apply(host_set, host);
            if !passing {
                self.failed(host);
            }
        }
    }

    /// Counts a failure of `host`, and wakes what waits for one.
    fn failed(&self, host: &HostState) {
        host.counters
            .health_failures
            .fetch_add(1, Ordering::Relaxed);
        host.counters.failed.notify_waiters();
    }

    /// (ejected now, ejections so far, passing health checks) of the host at `addr`.
    pub(crate) fn describe(&self, addr: SocketAddr) -> Option<(bool, u32, bool)> {
        self.lock()
            .iter()
            .find(|h| h.addr == addr)
            .map(|h| (h.ejected_until.is_some(), h.ejections, h.passing_checks))
    }
}

/// Ejects `hosts[index]` if Envoy's cap allows: `100 * (ejected + 1) / hosts` at most
/// `max_ejection_percent`, or none ejected yet with `always_eject_one_host`.
fn eject_locked(
    hosts: &mut [HostState],
    index: usize,
    config: &OutlierDetectionConfig,
    now: Instant,
) -> Ejection {
    if hosts[index].ejected_until.is_some() {
        return Ejection::None; // reported by another worker at the same moment
    }
    let ejected = hosts.iter().filter(|h| h.ejected_until.is_some()).count();
    let share = 100.0 * (ejected + 1) as f64 / hosts.len() as f64;
    let allowed = share <= f64::from(config.max_ejection_percent)
        || (config.always_eject_one_host && ejected == 0);
    if !allowed {
        // Counted again from zero, as after any detection in Envoy.
        hosts[index]
            .counters
            .consecutive_5xx
            .store(0, Ordering::Relaxed);
        hosts[index]
            .counters
            .consecutive_gateway
            .store(0, Ordering::Relaxed);
        hosts[index]
            .counters
            .consecutive_local
            .store(0, Ordering::Relaxed);
        return Ejection::Overflow;
    }
    let host = &mut hosts[index];
    host.ejections += 1;
    let time = config.base_ejection_time.saturating_mul(host.ejections);
    host.ejected_until = Some(now + time.min(config.max_ejection_time));
    host.counters.consecutive_5xx.store(0, Ordering::Relaxed);
    host.counters
        .consecutive_gateway
        .store(0, Ordering::Relaxed);
    host.counters.consecutive_local.store(0, Ordering::Relaxed);
    Ejection::Ejected
}

/// Envoy's success-rate ejection threshold over the judged hosts' rates (percent): the mean
/// less `stdev_factor / 1000` population standard deviations; `None` with no host judged.
fn success_rate_threshold(rates: &[(usize, f64)], stdev_factor: u32) -> Option<f64> {
    if rates.is_empty() {
        return None;
    }
    let n = rates.len() as f64;
    let mean = rates.iter().map(|(_, r)| r).sum::<f64>() / n;
    let variance = rates.iter().map(|(_, r)| (r - mean).powi(2)).sum::<f64>() / n;
    Some(mean - f64::from(stdev_factor) / 1000.0 * variance.sqrt())
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
            always_eject_one_host: false,
            uneject_on_health_check: true,
            interval: Duration::from_secs(10),
            success_rate: config::RateEjection::SUCCESS_RATE,
            failure_percentage: config::RateEjection::FAILURE_PERCENTAGE,
            local_origin: None,
        }
    }

    /// `tries` tries at host `i`, `failures` of them 503s (consecutive ejection off).
    fn tries(health: &HostHealth, hosts: &HostSet, i: u16, tries: u32, failures: u32) {
        let counters = health.counters(addr(i));
        for n in 0..tries {
            let status = if n < failures { 503 } else { 200 };
            health.report(hosts, &counters, addr(i), TryOutcome::Status(status));
        }
    }

    fn rates_config() -> OutlierDetectionConfig {
        OutlierDetectionConfig {
            consecutive_5xx: 0,
            max_ejection_percent: 100,
            ..config(100)
        }
    }

    #[test]
    fn success_rate_ejects_the_host_far_below_the_others() {
        // Five hosts of 200 tries each; host 4 fails half of them. Rates 100, 99, 100, 99,
        // 50: mean 89.6, deviation 19.8, threshold 89.6 - 1.9 x 19.8 = 52.0.
        let hosts = set(5);
        let health = HostHealth::new(&hosts, Some(rates_config()));
        let start = Instant::now();
        for (i, failures) in [(0, 0), (1, 2), (2, 0), (3, 2), (4, 100)] {
            tries(&health, &hosts, i, 200, failures);
        }
        // Not before the interval.
        assert_eq!(
            health.evaluate_rates(&hosts, start),
            RateEjections::default()
        );
        let found = health.evaluate_rates(&hosts, start + Duration::from_secs(11));
        assert_eq!(found.success_rate_detected, 1);
        assert_eq!(found.success_rate_enforced, 1);
        assert_eq!(found.failure_percentage_detected, 0, "50% is under 85%");
        assert_eq!(health.describe(addr(4)), Some((true, 1, true)));
        assert_eq!(health.describe(addr(1)), Some((false, 0, true)));
        // The counts start over: the next interval has nothing to judge.
        let next = health.evaluate_rates(&hosts, start + Duration::from_secs(22));
        assert_eq!(next, RateEjections::default());
    }

    #[test]
    fn rates_need_enough_hosts_with_enough_tries() {
        let hosts = set(5);
        let health = HostHealth::new(&hosts, Some(rates_config()));
        let start = Instant::now();
        // Four hosts of 100 tries, one of 49: four judged (by either rule), under the
        // minimum of five.
        for i in 0..4 {
            tries(&health, &hosts, i, 100, if i == 0 { 100 } else { 0 });
        }
        tries(&health, &hosts, 4, 49, 0);
        let found = health.evaluate_rates(&hosts, start + Duration::from_secs(11));
        assert_eq!(found, RateEjections::default());
    }

    #[test]
    fn failure_percentage_is_detected_and_enforced_as_configured() {
        let hosts = set(5);
        let mut config = rates_config();
        config.success_rate.enforcing = 0;
        let health = HostHealth::new(&hosts, Some(config));
        let start = Instant::now();
        for i in 0..5 {
            tries(&health, &hosts, i, 100, if i == 2 { 92 } else { 0 });
        }
        // Envoy's default: failure percentage detected, not enforced.
        let found = health.evaluate_rates(&hosts, start + Duration::from_secs(11));
        assert_eq!(found.success_rate_detected, 1);
        assert_eq!(found.failure_percentage_detected, 1, "found by both rules");
        assert_eq!(
            found.success_rate_enforced + found.failure_percentage_enforced,
            0
        );
        assert_eq!(health.describe(addr(2)), Some((false, 0, true)));

        config.success_rate.minimum_hosts = 100; // success rate judges nothing
        config.failure_percentage.enforcing = 100;
        let health = HostHealth::new(&hosts, Some(config));
        for i in 0..5 {
            tries(&health, &hosts, i, 100, if i == 2 { 92 } else { 0 });
        }
        let found = health.evaluate_rates(&hosts, start + Duration::from_secs(11));
        assert_eq!(found.failure_percentage_detected, 1);
        assert_eq!(found.failure_percentage_enforced, 1);
        assert_eq!(health.describe(addr(2)), Some((true, 1, true)));
    }

    #[test]
    fn the_ejection_cap_is_envoys_and_one_host_may_go_when_asked() {
        // 10% of 5 hosts is under one host: nothing may be ejected...
        let hosts = set(5);
        let health = HostHealth::new(&hosts, Some(config(10)));
        for _ in 0..3 {
            report(&health, &hosts, 0, TryOutcome::Status(503));
        }
        assert_eq!(health.describe(addr(0)), Some((false, 0, true)));
        // ...unless always_eject_one_host says one may.
        let one = OutlierDetectionConfig {
            always_eject_one_host: true,
            ..config(10)
        };
        let health = HostHealth::new(&hosts, Some(one));
        for _ in 0..3 {
            report(&health, &hosts, 0, TryOutcome::Status(503));
        }
        assert_eq!(health.describe(addr(0)), Some((true, 1, true)));
        let mut last = Ejection::None;
        for _ in 0..3 {
            last = report(&health, &hosts, 1, TryOutcome::Status(503));
        }
        assert_eq!(last, Ejection::Overflow, "only the first");
    }

    #[test]
    fn a_passing_health_check_ends_an_ejection_unless_told_otherwise() {
        for uneject in [true, false] {
            let hosts = set(2);
            let config = OutlierDetectionConfig {
                uneject_on_health_check: uneject,
                ..config(50)
            };
            let health = HostHealth::new(&hosts, Some(config));
            for _ in 0..3 {
                report(&health, &hosts, 0, TryOutcome::Status(503));
            }
            assert_eq!(hosts.snapshot().get(0).unwrap().health(), Health::Ejected);
            health.check_passed(&hosts, addr(0));
            let expected = if uneject {
                Health::Healthy
            } else {
                Health::Ejected
            };
            assert_eq!(hosts.snapshot().get(0).unwrap().health(), expected);
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
    fn split_local_origin_failures_count_apart_from_the_hosts_answers() {
        let hosts = set(4);
        let split = OutlierDetectionConfig {
            local_origin: Some(config::LocalOriginConfig {
                consecutive_failure: 3,
                success_rate_enforcing: 100,
                failure_percentage_enforcing: 0,
            }),
            ..config(50)
        };
        let health = HostHealth::new(&hosts, Some(split));
        let (fail, none) = (TryOutcome::Status(500), TryOutcome::NoResponse);
        // No response does not count towards consecutive_5xx (3) when split out...
        for outcome in [fail, fail, none, none] {
            assert_eq!(report(&health, &hosts, 1, outcome), Ejection::None);
        }
        // ...and an answer, even a 5xx, ends a run of local-origin failures.
        assert_eq!(
            report(&health, &hosts, 1, fail),
            Ejection::Ejected,
            "third 5xx"
        );
        for outcome in [none, none, TryOutcome::Status(503), none, none] {
            assert_eq!(report(&health, &hosts, 2, outcome), Ejection::None);
        }
        assert_eq!(
            report(&health, &hosts, 2, none),
            Ejection::Ejected,
            "third in a row"
        );
        // Counted from zero again, as after any detection in Envoy.
        let counters = health.counters(addr(2));
        assert_eq!(counters.consecutive_local.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn max_ejection_percent_caps_ejections() {
        // 25% of 4 hosts: one.
        let hosts = set(4);
        let health = HostHealth::new(&hosts, Some(config(25)));
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
