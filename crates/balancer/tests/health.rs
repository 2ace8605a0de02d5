//! Health, degraded hosts and panic mode, as Envoy computes them for one priority level.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use balancer::{BuildError, Health, HostSet, HostSpec, LbPolicy, LoadBalancer};
use common::*;

fn set(healths: &[Health]) -> HostSet {
    HostSet::new(
        healths
            .iter()
            .enumerate()
            .map(|(i, &h)| HostSpec::new(addr(i)).with_health(h))
            .collect(),
    )
    .unwrap()
}

fn share_of(lb: &LoadBalancer, healths: &[Health], wanted: Health, picks: u64) -> f64 {
    let mut hits = 0;
    for i in 0..picks {
        let picked = lb.pick(key_for(lb.policy(), i)).unwrap();
        if healths[picked.index()] == wanted {
            hits += 1;
        }
    }
    hits as f64 / picks as f64
}

use Health::{Degraded, Ejected, Healthy, Unhealthy};

#[test]
fn unhealthy_and_ejected_hosts_get_nothing_above_the_threshold() {
    let healths = [Healthy, Healthy, Healthy, Unhealthy, Ejected];
    for policy in all_policies() {
        let lb = LoadBalancer::new(set(&healths), policy).unwrap();
        assert!(!lb.in_panic());
        assert_eq!(
            share_of(&lb, &healths, Healthy, 5_000),
            1.0,
            "{}",
            policy.name()
        );
    }
}

#[test]
fn below_the_threshold_every_host_takes_traffic() {
    // 2 of 5 available (40% < 50%): panic, balance over all five.
    let healths = [Healthy, Unhealthy, Degraded, Unhealthy, Ejected];
    for policy in all_policies() {
        let lb = LoadBalancer::new(set(&healths), policy).unwrap();
        assert!(lb.in_panic(), "{}", policy.name());
        let counts = pick_counts(&lb, 5, 20_000);
        assert!(
            counts.iter().all(|&c| c > 1_000),
            "{}: {counts:?}",
            policy.name()
        );
    }
}

#[test]
fn the_threshold_is_configurable_and_zero_turns_panic_off() {
    let healths = [Healthy, Unhealthy, Unhealthy, Unhealthy];
    let strict = LoadBalancer::with_panic_threshold(set(&healths), LbPolicy::Random, 20.0).unwrap();
    assert!(!strict.in_panic()); // 25% available >= 20%
    assert_eq!(share_of(&strict, &healths, Healthy, 2_000), 1.0);

    let all_down = [Unhealthy, Unhealthy];
    let off = LoadBalancer::with_panic_threshold(set(&all_down), LbPolicy::Random, 0.0).unwrap();
    assert!(off.pick(None).is_none());
    let default = LoadBalancer::new(set(&all_down), LbPolicy::Random).unwrap();
    assert!(default.pick(None).is_some());

    assert!(matches!(
        LoadBalancer::with_panic_threshold(set(&all_down), LbPolicy::Random, 120.0),
        Err(BuildError::PanicThresholdOutOfRange { .. })
    ));
}

#[test]
fn degraded_hosts_take_what_healthy_ones_cannot() {
    // 6 healthy, 4 degraded of 10: healthy availability min(100, 1.4 * 60) = 84, degraded
    // 56, total 100: 84% of picks to healthy hosts, 16% to degraded ones.
    let healths = [
        Healthy, Healthy, Healthy, Healthy, Healthy, Healthy, Degraded, Degraded, Degraded,
        Degraded,
    ];
    for policy in all_policies() {
        let lb = LoadBalancer::new(set(&healths), policy).unwrap();
        let degraded = share_of(&lb, &healths, Degraded, 40_000);
        assert!(
            (degraded - 0.16).abs() < 0.015,
            "{}: {degraded}",
            policy.name()
        );
    }

    // 8 healthy of 10 (1.4 * 80 >= 100): degraded hosts get nothing.
    let mostly_healthy = [
        Healthy, Healthy, Healthy, Healthy, Healthy, Healthy, Healthy, Healthy, Degraded, Degraded,
    ];
    let lb = LoadBalancer::new(set(&mostly_healthy), LbPolicy::least_request()).unwrap();
    assert_eq!(share_of(&lb, &mostly_healthy, Healthy, 5_000), 1.0);

    // Only degraded hosts available (and above the threshold): they take everything.
    let only_degraded = [Degraded, Degraded, Unhealthy];
    let lb = LoadBalancer::new(set(&only_degraded), LbPolicy::RoundRobin).unwrap();
    assert!(!lb.in_panic());
    assert_eq!(share_of(&lb, &only_degraded, Degraded, 1_000), 1.0);
}

#[test]
fn health_changes_apply_to_the_next_pick() {
    let healths = [Healthy, Healthy, Healthy];
    let hosts = set(&healths);
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
    let _ = lb.pick(None);
    assert!(hosts.set_health(addr(1), Unhealthy));
    assert!(!hosts.set_health(addr(9), Unhealthy), "unknown address");
    for _ in 0..100 {
        assert_ne!(lb.pick(None).unwrap().addr(), addr(1));
    }
    assert_eq!(hosts.snapshot().get(1).unwrap().health(), Unhealthy);
    assert!(hosts.set_health(addr(1), Healthy));
    let back = (0..10)
        .filter(|_| lb.pick(None).unwrap().addr() == addr(1))
        .count();
    assert!(back > 0);
}

#[test]
fn an_empty_set_yields_no_host_until_hosts_arrive() {
    let hosts = HostSet::new(Vec::new()).unwrap();
    for policy in all_policies() {
        let lb = LoadBalancer::new(hosts.clone(), policy).unwrap();
        assert!(lb.pick(Some(7)).is_none());
    }
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::maglev()).unwrap();
    hosts.update(equal_specs(2)).unwrap();
    assert!(lb.pick(Some(7)).is_some());
}

#[test]
fn host_lists_are_validated() {
    assert_eq!(
        HostSet::new(vec![HostSpec::new(addr(1)).with_weight(0)]).unwrap_err(),
        BuildError::ZeroWeight { addr: addr(1) }
    );
    assert_eq!(
        HostSet::new(vec![HostSpec::new(addr(1)), HostSpec::new(addr(1))]).unwrap_err(),
        BuildError::DuplicateHost { addr: addr(1) }
    );
    let hosts = HostSet::new(equal_specs(2)).unwrap();
    assert!(
        hosts
            .update(vec![HostSpec::new(addr(3)).with_weight(0)])
            .is_err()
    );
    assert_eq!(
        hosts.snapshot().len(),
        2,
        "a rejected update publishes nothing"
    );
    assert_eq!(
        hosts.set_weight(addr(0), 0),
        Err(BuildError::ZeroWeight { addr: addr(0) })
    );
    assert_eq!(hosts.set_weight(addr(0), 5), Ok(true));
    assert_eq!(hosts.snapshot().get(0).unwrap().weight(), 5);
}

#[test]
fn versions_move_with_every_change() {
    let hosts = HostSet::new(equal_specs(2)).unwrap();
    let v0 = hosts.version();
    hosts.set_health(addr(0), Degraded);
    hosts.update(equal_specs(3)).unwrap();
    assert_eq!(hosts.version(), v0 + 2);
    assert_eq!(hosts.snapshot().version(), v0 + 2);
}

#[test]
fn tables_are_rebuilt_at_the_next_pick_or_on_refresh() {
    let hosts = HostSet::new(equal_specs(3)).unwrap();
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::maglev()).unwrap();
    let v0 = lb.tables_version();
    hosts.update(equal_specs(4)).unwrap();
    assert_eq!(lb.tables_version(), v0, "nothing rebuilt yet");
    lb.refresh();
    assert_eq!(lb.tables_version(), hosts.version());
    hosts.set_health(addr(3), Unhealthy);
    let _ = lb.pick(Some(1));
    assert_eq!(lb.tables_version(), hosts.version());
}

#[test]
fn picked_guards_count_requests_in_flight() {
    let hosts = HostSet::new(equal_specs(1)).unwrap();
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::least_request()).unwrap();
    let a = lb.pick(None).unwrap();
    let b = lb.pick(None).unwrap();
    assert_eq!(a.active_requests(), 2);
    assert_eq!(a.index(), 0);
    assert_eq!(a.addr(), addr(0));
    drop(a);
    assert_eq!(b.host().active_requests(), 1);
    drop(b);
    assert_eq!(hosts.snapshot().get(0).unwrap().active_requests(), 0);
}
