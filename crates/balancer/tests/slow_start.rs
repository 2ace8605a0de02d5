//! Slow start through a `LoadBalancer`: a host that joins, or passes its checks again, takes
//! a reduced share of its weight until its window has passed.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::time::{Duration, Instant};

use balancer::{BuildError, Health, HostSet, LbPolicy, LbSettings, LoadBalancer, SlowStart};
use common::*;

fn ramping(window: Duration, policy: LbPolicy, hosts: &HostSet) -> LoadBalancer {
    let settings = LbSettings {
        slow_start: Some(SlowStart::new(window)),
        ..LbSettings::default()
    };
    LoadBalancer::with_settings(hosts.clone(), policy, settings).unwrap()
}

/// Picks `n` times; how many went to host `index`.
fn picks_of(lb: &LoadBalancer, index: usize, n: u64) -> u64 {
    pick_counts(lb, 3, n)[index]
}

#[test]
fn a_joining_host_starts_at_the_minimum_weight_and_the_first_hosts_do_not_ramp() {
    let hosts = HostSet::new(equal_specs(2)).unwrap();
    // An hour's window: the new host stays at 10% of its weight for the whole test.
    let lb = ramping(Duration::from_secs(3600), LbPolicy::RoundRobin, &hosts);
    assert_eq!(
        pick_counts(&lb, 2, 200),
        vec![100, 100],
        "no ramp for the first hosts"
    );
    hosts.update(equal_specs(3)).unwrap();
    // Weights 100, 100 and 10: over whole cycles of 210, the new host gets 10.
    assert_eq!(picks_of(&lb, 2, 2100), 100);

    // Least request draws by the same weights: 10 of 210 is 4.8%.
    let lr = ramping(Duration::from_secs(3600), LbPolicy::least_request(), &hosts);
    let share = picks_of(&lr, 2, 10_000) as f64 / 10_000.0;
    assert!((share - 10.0 / 210.0).abs() < 0.015, "{share}");

    // Without slow start, a third.
    let plain = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
    assert_eq!(picks_of(&plain, 2, 300), 100);
}

#[test]
fn passing_checks_again_restarts_the_ramp_but_an_ejection_ending_does_not() {
    let hosts = HostSet::new(equal_specs(3)).unwrap();
    let lb = ramping(Duration::from_secs(3600), LbPolicy::RoundRobin, &hosts);
    let third = addr(2);
    hosts.set_health(third, Health::Ejected);
    hosts.set_health(third, Health::Healthy);
    assert_eq!(
        picks_of(&lb, 2, 300),
        100,
        "back from an ejection: full weight"
    );
    hosts.set_health(third, Health::Unhealthy);
    hosts.set_health(third, Health::Healthy);
    assert_eq!(picks_of(&lb, 2, 2100), 100, "passing again: 10 of 210");
}

#[test]
fn the_ramp_ends_with_the_window() {
    let hosts = HostSet::new(equal_specs(2)).unwrap();
    let window = Duration::from_millis(300);
    let lb = ramping(window, LbPolicy::RoundRobin, &hosts);
    hosts.update(equal_specs(3)).unwrap();
    let joined = Instant::now();
    // Once the window has passed, its full share (the tables are rebuilt as it ramps; the
    // reduced share early on is the test above's).
    let deadline = Instant::now() + Duration::from_secs(20);
    while picks_of(&lb, 2, 300) != 100 {
        assert!(Instant::now() < deadline, "the ramp never ended");
        std::thread::yield_now();
    }
    assert!(joined.elapsed() >= window);
}

#[test]
fn only_round_robin_and_least_request_ramp() {
    let hosts = HostSet::new(equal_specs(2)).unwrap();
    let settings = LbSettings {
        slow_start: Some(SlowStart::new(Duration::from_secs(1))),
        ..LbSettings::default()
    };
    for policy in [LbPolicy::Random, LbPolicy::ring_hash(), LbPolicy::maglev()] {
        let error = LoadBalancer::with_settings(hosts.clone(), policy, settings).unwrap_err();
        assert!(
            matches!(error, BuildError::SlowStartPolicy { .. }),
            "{error}"
        );
    }
}
