//! Priority levels and locality-weighted balancing, as Envoy shares load over them.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use balancer::{BuildError, Health, HostSet, HostSpec, LbPolicy, LbSettings, LoadBalancer};
use common::*;

use Health::{Healthy, Unhealthy};

/// Hosts `(priority, locality, locality weight, health)`.
fn set(hosts: &[(u32, u32, u32, Health)]) -> HostSet {
    HostSet::new(
        hosts
            .iter()
            .enumerate()
            .map(|(i, &(priority, locality, weight, health))| {
                HostSpec::new(addr(i))
                    .with_priority(priority)
                    .with_locality(locality, weight)
                    .with_health(health)
            })
            .collect(),
    )
    .unwrap()
}

/// Share of `picks` that went to hosts for which `which` holds.
fn share(lb: &LoadBalancer, picks: u64, which: impl Fn(&HostSpec) -> bool) -> f64 {
    let specs = lb.hosts().snapshot().specs();
    let hits = (0..picks)
        .filter(|&i| which(&specs[lb.pick(key_for(lb.policy(), i)).unwrap().index()]))
        .count();
    hits as f64 / picks as f64
}

/// Within `tolerance` of `expected`: 10,000 picks put a binomial share within 0.02 of its
/// mean at over five standard deviations.
fn near(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() < 0.02,
        "{what}: {actual:.3}, expected {expected:.3}"
    );
}

#[test]
fn a_healthy_first_level_takes_everything() {
    let hosts = set(&[
        (0, 0, 0, Healthy),
        (0, 0, 0, Healthy),
        (1, 0, 0, Healthy),
        (1, 0, 0, Healthy),
    ]);
    for policy in all_policies() {
        let lb = LoadBalancer::new(hosts.clone(), policy).unwrap();
        assert_eq!(
            share(&lb, 2_000, |s| s.priority == 0),
            1.0,
            "{}",
            policy.name()
        );
    }
}

#[test]
fn load_fails_over_to_the_next_level_as_envoys_table_says_and_comes_back() {
    // Ten hosts at P0, ten at P1.
    let specs: Vec<(u32, u32, u32, Health)> = (0..20).map(|i| (i / 10, 0, 0, Healthy)).collect();
    let hosts = set(&specs);
    for policy in all_policies() {
        let lb = LoadBalancer::new(hosts.clone(), policy).unwrap();
        // P0 at 50%: 70 / 30 (1.4 * 50%).
        for i in 0..5 {
            hosts.set_health(addr(i), Unhealthy);
        }
        near(share(&lb, 10_000, |s| s.priority == 0), 0.70, policy.name());
        assert!(!lb.in_panic());
        // P0 all down: everything to P1.
        for i in 5..10 {
            hosts.set_health(addr(i), Unhealthy);
        }
        assert_eq!(
            share(&lb, 2_000, |s| s.priority == 0),
            0.0,
            "{}",
            policy.name()
        );
        // Back: everything to P0 again.
        for i in 0..10 {
            hosts.set_health(addr(i), Healthy);
        }
        assert_eq!(
            share(&lb, 2_000, |s| s.priority == 0),
            1.0,
            "{}",
            policy.name()
        );
    }
}

#[test]
fn unavailable_hosts_of_a_failing_level_get_nothing_while_another_level_serves() {
    // P0: 1 of 4 healthy (35% of the load); P1 whole. P0's unhealthy hosts get nothing.
    let hosts = set(&[
        (0, 0, 0, Healthy),
        (0, 0, 0, Unhealthy),
        (0, 0, 0, Unhealthy),
        (0, 0, 0, Unhealthy),
        (1, 0, 0, Healthy),
        (1, 0, 0, Healthy),
    ]);
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
    near(share(&lb, 10_000, |s| s.priority == 0), 0.35, "P0");
    assert_eq!(share(&lb, 2_000, |s| s.health == Unhealthy), 0.0);
}

#[test]
fn when_every_level_is_in_panic_load_follows_host_counts_over_all_hosts() {
    // 1 of 5 at P0 and 0 of 5 at P1 healthy: total 28%, both levels under 50%: total panic,
    // 50 / 50 by host count, unhealthy hosts included.
    let specs: Vec<(u32, u32, u32, Health)> = (0..10)
        .map(|i| (i / 5, 0, 0, if i == 0 { Healthy } else { Unhealthy }))
        .collect();
    let lb = LoadBalancer::new(set(&specs), LbPolicy::Random).unwrap();
    assert!(lb.in_panic());
    near(share(&lb, 10_000, |s| s.priority == 0), 0.5, "P0");
    near(
        share(&lb, 10_000, |s| s.health == Unhealthy),
        0.9,
        "unhealthy",
    );
}

#[test]
fn an_empty_or_missing_first_level_passes_everything_on() {
    // Priorities need not start at 0 nor be contiguous.
    let lb = LoadBalancer::new(
        set(&[(3, 0, 0, Healthy), (7, 0, 0, Healthy)]),
        LbPolicy::RoundRobin,
    )
    .unwrap();
    near(share(&lb, 10_000, |s| s.priority == 3), 1.0, "P3");
}

#[test]
fn a_hash_key_keeps_to_one_level() {
    // P0 at 50% (70 / 30): a key always lands on the same level and host.
    let specs: Vec<(u32, u32, u32, Health)> = (0..20)
        .map(|i| (i / 10, 0, 0, if i < 5 { Unhealthy } else { Healthy }))
        .collect();
    let lb = LoadBalancer::new(set(&specs), LbPolicy::maglev()).unwrap();
    for k in 0..200u64 {
        let key = balancer::hash_key(&k.to_le_bytes());
        let first = lb.pick(Some(key)).unwrap().addr();
        assert_eq!(lb.pick(Some(key)).unwrap().addr(), first);
    }
}

fn locality_weighted() -> LbSettings {
    LbSettings {
        locality_weighted: true,
        ..LbSettings::default()
    }
}

#[test]
fn localities_take_load_by_weight_whatever_their_host_counts() {
    // Locality 1 (weight 1) has three hosts, locality 2 (weight 3) one.
    let hosts = set(&[
        (0, 1, 1, Healthy),
        (0, 1, 1, Healthy),
        (0, 1, 1, Healthy),
        (0, 2, 3, Healthy),
    ]);
    for policy in [
        LbPolicy::RoundRobin,
        LbPolicy::least_request(),
        LbPolicy::Random,
    ] {
        let lb = LoadBalancer::with_settings(hosts.clone(), policy, locality_weighted()).unwrap();
        near(share(&lb, 10_000, |s| s.locality == 2), 0.75, policy.name());
        // Without locality weighting, hosts share equally.
        let flat = LoadBalancer::new(hosts.clone(), policy).unwrap();
        near(
            share(&flat, 10_000, |s| s.locality == 2),
            0.25,
            policy.name(),
        );
    }
}

#[test]
fn a_locality_short_of_hosts_sheds_load_and_one_without_weight_gets_none() {
    // Locality 1: 1 of 4 healthy -> weight 1 * 1.4 * 0.25 = 0.35; locality 2: weight 1.
    // Locality 3 has no weight: nothing.
    let hosts = set(&[
        (0, 1, 1, Healthy),
        (0, 1, 1, Unhealthy),
        (0, 1, 1, Unhealthy),
        (0, 1, 1, Unhealthy),
        (0, 2, 1, Healthy),
        (0, 2, 1, Healthy),
        (0, 2, 1, Healthy),
        (0, 2, 1, Healthy),
        (0, 3, 0, Healthy),
        (0, 3, 0, Healthy),
    ]);
    let lb = LoadBalancer::with_settings(hosts, LbPolicy::RoundRobin, locality_weighted()).unwrap();
    near(
        share(&lb, 10_000, |s| s.locality == 1),
        0.35 / 1.35,
        "locality 1",
    );
    assert_eq!(share(&lb, 2_000, |s| s.locality == 3), 0.0);
}

#[test]
fn round_robin_within_a_locality_keeps_turns_across_rebuilds() {
    let hosts = set(&[(0, 1, 1, Healthy), (0, 1, 1, Healthy), (1, 2, 1, Healthy)]);
    let lb = LoadBalancer::with_settings(hosts.clone(), LbPolicy::RoundRobin, locality_weighted())
        .unwrap();
    let mut last = lb.pick(None).unwrap().index();
    // Unrelated changes (a P1 host's health) rebuild the tables; the turns go on alternating
    // (a rotation restarted at random would repeat a host about every other time).
    for i in 0..20 {
        hosts.set_health(addr(2), if i % 2 == 0 { Unhealthy } else { Healthy });
        let next = lb.pick(None).unwrap().index();
        assert_ne!(next, last, "pick {i}");
        last = next;
    }
}

#[test]
fn hashing_policies_share_the_table_by_locality_weight() {
    // Locality 1 (weight 3) has three hosts, locality 2 (weight 1) one: the lone host takes a
    // quarter of the keys, each of the three a quarter too.
    let hosts = set(&[
        (0, 1, 3, Healthy),
        (0, 1, 3, Healthy),
        (0, 1, 3, Healthy),
        (0, 2, 1, Healthy),
    ]);
    // A ring of 1024 entries follows weights only roughly: a large one is compared.
    let large_ring = LbPolicy::RingHash(balancer::RingHashOptions {
        minimum_ring_size: 1 << 20,
        ..balancer::RingHashOptions::default()
    });
    for policy in [LbPolicy::maglev(), large_ring] {
        let lb = LoadBalancer::with_settings(hosts.clone(), policy, locality_weighted()).unwrap();
        near(
            share(&lb, 10_000, |s| s.locality == 2),
            0.25,
            "the lone host",
        );
        // Without locality weighting, a quarter each as well; with weights 1 and 1, half.
        let even = set(&[
            (0, 1, 1, Healthy),
            (0, 1, 1, Healthy),
            (0, 1, 1, Healthy),
            (0, 2, 1, Healthy),
        ]);
        let lb = LoadBalancer::with_settings(even, policy, locality_weighted()).unwrap();
        near(
            share(&lb, 10_000, |s| s.locality == 2),
            0.5,
            "half to its locality",
        );
        // One key still maps to one host.
        let key = Some(balancer::hash_key(b"user-7"));
        let first = lb.pick(key).unwrap().index();
        assert_eq!(lb.pick(key).unwrap().index(), first);
    }
}

#[test]
fn settings_are_checked() {
    let hosts = set(&[(0, 0, 0, Healthy)]);
    let zero = LbSettings {
        overprovisioning_factor: 0,
        ..LbSettings::default()
    };
    assert_eq!(
        LoadBalancer::with_settings(hosts, LbPolicy::Random, zero).unwrap_err(),
        BuildError::OverprovisioningFactorZero
    );
}

#[test]
fn a_retry_leaves_out_the_priorities_already_tried() {
    let specs: Vec<(u32, u32, u32, Health)> = (0..6).map(|i| (i / 2, 0, 0, Healthy)).collect();
    for policy in all_policies() {
        let lb = LoadBalancer::new(set(&specs), policy).unwrap();
        let levels = |excluded: &[u32]| -> Vec<u32> {
            let mut seen: Vec<u32> = (0..300u64)
                .map(|i| {
                    lb.pick_excluding(key_for(&policy, i), excluded)
                        .unwrap()
                        .priority()
                })
                .collect();
            seen.sort_unstable();
            seen.dedup();
            seen
        };
        assert_eq!(levels(&[]), [0], "{}", policy.name());
        assert_eq!(levels(&[0]), [1], "{}", policy.name());
        assert_eq!(levels(&[0, 1]), [2], "{}", policy.name());
        // Every level tried: nothing else to move to, the loads as they are.
        assert_eq!(levels(&[0, 1, 2]), [0], "{}", policy.name());
    }
}

#[test]
fn draining_hosts_leave_the_counts_and_get_nothing_outside_panic() {
    use balancer::Health::Draining;
    // A rollout: eight of ten P0 hosts draining. The two left are all of P0's hosts, whole:
    // P0 keeps everything, and the draining ones get nothing.
    let specs: Vec<(u32, u32, u32, Health)> = (0..12)
        .map(|i| match i {
            0 | 1 => (0, 0, 0, Healthy),
            10 | 11 => (1, 0, 0, Healthy),
            _ => (0, 0, 0, Draining),
        })
        .collect();
    for policy in all_policies() {
        let lb = LoadBalancer::new(set(&specs), policy).unwrap();
        assert!(!lb.in_panic());
        assert_eq!(
            share(&lb, 2_000, |s| s.priority == 0 && s.health == Healthy),
            1.0,
            "{}",
            policy.name()
        );
    }
}
