//! Property tests of every policy: health is respected, every host is used, weights are
//! followed, least request avoids load, consistent hashing is stable.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;

use balancer::{Health, HostSet, HostSpec, LbPolicy, LeastRequestOptions, LoadBalancer};
use common::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// While healthy and degraded hosts make up at least the panic threshold (50%), no pick
    /// goes to an unhealthy or ejected host; while healthy hosts alone are enough (Envoy's
    /// 140% overprovisioned availability reaches 100%), none goes to a degraded host either.
    /// Below the threshold every pick still finds a host (panic mode).
    #[test]
    fn never_picks_an_unavailable_host_above_the_panic_threshold(
        healths in prop::collection::vec(any_health(), 1..40),
        weights in prop::collection::vec(1u32..10, 40),
        policy in any_policy(),
    ) {
        let n = healths.len();
        let hosts: Vec<HostSpec> = (0..n)
            .map(|i| HostSpec::new(addr(i)).with_weight(weights[i]).with_health(healths[i]))
            .collect();
        let lb = LoadBalancer::new(HostSet::new(hosts).unwrap(), policy).unwrap();
        let healthy = healths.iter().filter(|h| **h == Health::Healthy).count();
        let degraded = healths.iter().filter(|h| **h == Health::Degraded).count();
        let available_percent = 100.0 * (healthy + degraded) as f64 / n as f64;
        let healthy_enough = 140 * healthy / n >= 100;

        for i in 0..300 {
            let picked = lb.pick(key_for(&policy, i));
            prop_assert!(picked.is_some(), "a non-empty set always yields a host");
            let health = healths[picked.unwrap().index()];
            if available_percent >= 50.0 {
                prop_assert!(matches!(health, Health::Healthy | Health::Degraded), "{health:?}");
                if healthy_enough {
                    prop_assert_eq!(health, Health::Healthy);
                }
            }
        }
        if available_percent >= 50.0 {
            prop_assert!(!lb.in_panic());
        }
    }

    /// Over 20,000 picks every host is chosen at least once (the lightest host's share here
    /// is at least 1/150, so a miss would be a bug, not chance).
    #[test]
    fn every_host_is_picked(
        weights in prop::collection::vec(1u32..6, 1..30),
        policy in any_policy(),
    ) {
        let lb = LoadBalancer::new(HostSet::new(specs(&weights)).unwrap(), policy).unwrap();
        let counts = pick_counts(&lb, weights.len(), 20_000);
        prop_assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Round robin, least request (no load) and random follow the weights: over 100,000
    /// picks the chi-square statistic against the weights' shares stays under its critical
    /// value at p = 1e-6.
    #[test]
    fn weights_are_respected(
        weights in prop::collection::vec(1u32..9, 2..9),
        policy in proptest::sample::select(vec![
            LbPolicy::RoundRobin,
            LbPolicy::least_request(),
            LbPolicy::Random,
        ]),
    ) {
        let lb = LoadBalancer::new(HostSet::new(specs(&weights)).unwrap(), policy).unwrap();
        let counts = pick_counts(&lb, weights.len(), 100_000);
        let chi2 = chi_square(&counts, &weights);
        let critical = chi_square_critical(weights.len() - 1);
        prop_assert!(chi2 < critical, "{}: chi2 {chi2:.1} >= {critical:.1}, {counts:?} for {weights:?}", policy.name());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Ring hash (on a 2^18-entry ring) and maglev (default table) give each host a share of
    /// 100,000 random keys within 15% of its weight's share. That is over five standard
    /// deviations of the sampling noise plus the noise of where a host's ring entries fall.
    #[test]
    fn consistent_hash_shares_follow_the_weights(
        weights in prop::collection::vec(1u32..9, 2..9),
        policy in proptest::sample::select(vec![
            LbPolicy::RingHash(balancer::RingHashOptions {
                minimum_ring_size: 1 << 18,
                ..Default::default()
            }),
            LbPolicy::maglev(),
        ]),
    ) {
        let lb = LoadBalancer::new(HostSet::new(specs(&weights)).unwrap(), policy).unwrap();
        let picks = 100_000u64;
        let counts = pick_counts(&lb, weights.len(), picks);
        let total: u32 = weights.iter().sum();
        for (i, (&c, &w)) in counts.iter().zip(&weights).enumerate() {
            let expected = picks as f64 * f64::from(w) / f64::from(total);
            let error = (c as f64 - expected).abs() / expected;
            prop_assert!(error < 0.15, "{}: host {i} got {c}, expected {expected:.0}", policy.name());
        }
    }

    /// Removing one of N hosts moves few keys. Maglev: about 1/N (bound: 1/N + 2 points).
    /// Ring hash: the removed host's 1/N, plus the arcs of the entries the remaining hosts
    /// gain, because Envoy's ring sizing gives each ceil(1024 / (N - 1)) entries instead of
    /// ceil(1024 / N) (bound: 1.5 x that sum + 1 point, the margin covering the spread of arc
    /// lengths); that is at most about 2/N.
    #[test]
    fn removing_a_host_moves_about_one_nth_of_the_keys(
        n in 5usize..40,
        removed in any::<prop::sample::Index>(),
        policy in proptest::sample::select(vec![LbPolicy::ring_hash(), LbPolicy::maglev()]),
    ) {
        let removed = removed.index(n);
        let hosts = HostSet::new(equal_specs(n)).unwrap();
        let lb = LoadBalancer::new(hosts.clone(), policy).unwrap();
        let keys: Vec<u64> = (0..20_000u64).map(|i| balancer::hash_key(&i.to_be_bytes())).collect();
        let before: Vec<SocketAddr> = keys.iter().map(|&k| lb.pick(Some(k)).unwrap().addr()).collect();

        let mut remaining = equal_specs(n);
        remaining.remove(removed);
        hosts.update(remaining).unwrap();
        let after: Vec<SocketAddr> = keys.iter().map(|&k| lb.pick(Some(k)).unwrap().addr()).collect();

        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count() as f64 / keys.len() as f64;
        let one_nth = 1.0 / n as f64;
        let bound = match policy {
            LbPolicy::Maglev(_) => one_nth + 0.02,
            _ => {
                let entries = |hosts: usize| 1024usize.div_ceil(hosts) as f64;
                let gained = (entries(n - 1) - entries(n)) / entries(n - 1);
                1.5 * (one_nth + gained) + 0.01
            }
        };
        prop_assert!(moved <= bound, "{}: {moved:.3} of keys moved, bound {bound:.3} (n = {n})", policy.name());
        // Every key of the removed host moved, and nothing moved onto it.
        for (b, a) in before.iter().zip(&after) {
            prop_assert_ne!(*a, addr(removed));
            if *b == addr(removed) {
                prop_assert_ne!(a, b);
            }
        }
    }

    /// A key maps to the same host whenever the tables are rebuilt for the same hosts: in
    /// another list order, on another balancer, after a host leaves and comes back.
    #[test]
    fn a_key_maps_to_the_same_host_across_rebuilds(
        weights in prop::collection::vec(1u32..5, 2..30),
        seed in any::<u64>(),
        policy in proptest::sample::select(vec![LbPolicy::ring_hash(), LbPolicy::maglev()]),
    ) {
        let keys: Vec<u64> = (0..2_000u64).map(|i| balancer::hash_key(&(i ^ seed).to_le_bytes())).collect();
        let map = |lb: &LoadBalancer| -> Vec<SocketAddr> {
            keys.iter().map(|&k| lb.pick(Some(k)).unwrap().addr()).collect()
        };
        let original = specs(&weights);
        let hosts = HostSet::new(original.clone()).unwrap();
        let lb = LoadBalancer::new(hosts.clone(), policy).unwrap();
        let first = map(&lb);

        let mut shuffled = original.clone();
        shuffled.rotate_left((seed % weights.len() as u64) as usize);
        shuffled.reverse();
        let other = LoadBalancer::new(HostSet::new(shuffled).unwrap(), policy).unwrap();
        prop_assert_eq!(&map(&other), &first);

        hosts.update(original[1..].to_vec()).unwrap();
        let _ = map(&lb);
        hosts.update(original.clone()).unwrap();
        prop_assert_eq!(&map(&lb), &first);
    }

    /// Least request (equal weights, P2C) sends a loaded host far less than its fair share:
    /// it wins only when both random choices are itself, about 1/N of its fair share.
    #[test]
    fn least_request_prefers_less_loaded_hosts(
        n in 2usize..12,
        loaded in any::<prop::sample::Index>(),
        load in 1usize..20,
    ) {
        let loaded = loaded.index(n);
        let hosts = HostSet::new(equal_specs(n)).unwrap();
        let lb = LoadBalancer::new(hosts.clone(), LbPolicy::least_request()).unwrap();
        let _in_flight = hold(&hosts, loaded, load);
        let counts = pick_counts(&lb, n, 20_000);
        let share = counts[loaded] as f64 / 20_000.0;
        let fair = 1.0 / n as f64;
        prop_assert!(share < 0.6 * fair, "loaded host got {share:.3}, fair share {fair:.3}");
    }
}

/// Holds `count` requests in flight to host `index`, through a round-robin balancer over the
/// same host set (in-flight counts are per host, shared by every balancer).
fn hold(hosts: &HostSet, index: usize, count: usize) -> Vec<balancer::Picked> {
    let rr = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
    let mut held = Vec::new();
    while held.len() < count {
        let picked = rr.pick(None).unwrap();
        if picked.index() == index {
            held.push(picked);
        }
    }
    held
}

#[test]
fn weighted_least_request_gives_a_loaded_host_less() {
    let weights = [1, 1, 2, 2];
    let hosts = HostSet::new(specs(&weights)).unwrap();
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::least_request()).unwrap();
    let idle = pick_counts(&lb, 4, 60_000);
    let held = hold(&hosts, 2, 5);
    let loaded = pick_counts(&lb, 4, 60_000);
    drop(held);
    // Idle: host 2 gets its weight's third. With 5 in flight its odds against an idle
    // candidate are (1/6) : 1, so its share drops to about half.
    assert!(
        (idle[2] as f64 / 60_000.0 - 1.0 / 3.0).abs() < 0.02,
        "{idle:?}"
    );
    assert!(
        (loaded[2] as f64) < 0.75 * idle[2] as f64,
        "idle {idle:?}, loaded {loaded:?}"
    );
}

#[test]
fn a_larger_bias_avoids_load_more() {
    let weights = [1, 2, 3];
    let share_with_bias = |bias: f64| {
        let hosts = HostSet::new(specs(&weights)).unwrap();
        let lb = LoadBalancer::new(
            hosts.clone(),
            LbPolicy::LeastRequest(LeastRequestOptions {
                choice_count: 2,
                active_request_bias: bias,
            }),
        )
        .unwrap();
        let _held = hold(&hosts, 2, 3);
        pick_counts(&lb, 3, 60_000)[2] as f64 / 60_000.0
    };
    let (none, one, two) = (
        share_with_bias(0.0),
        share_with_bias(1.0),
        share_with_bias(2.0),
    );
    // Bias 0 ignores load: host 2 keeps its weight's half.
    assert!((none - 0.5).abs() < 0.02, "{none}");
    assert!(one < none - 0.05 && two < one - 0.02, "{none} {one} {two}");
}

#[test]
fn round_robin_cycles_through_a_smooth_weighted_schedule() {
    let lb =
        LoadBalancer::new(HostSet::new(specs(&[3, 1])).unwrap(), LbPolicy::RoundRobin).unwrap();
    let picks: Vec<usize> = (0..8).map(|_| lb.pick(None).unwrap().index()).collect();
    // Host 1 appears once in every four picks, wherever the cycle started, and host 0 never
    // three times in a row... except around host 1's single slot, never four.
    assert_eq!(picks.iter().filter(|&&i| i == 1).count(), 2);
    let run = picks.windows(4).any(|w| w.iter().all(|&i| i == 0));
    assert!(!run, "{picks:?}");
}

#[test]
fn ring_hash_and_maglev_agree_with_hash_key_on_bytes() {
    // The same bytes give the same key, hence the same host, on separately built balancers.
    for policy in [LbPolicy::ring_hash(), LbPolicy::maglev()] {
        let a = LoadBalancer::new(HostSet::new(equal_specs(10)).unwrap(), policy).unwrap();
        let b = LoadBalancer::new(HostSet::new(equal_specs(10)).unwrap(), policy).unwrap();
        let mut seen = HashMap::new();
        for user in 0..200 {
            let key = balancer::hash_key(format!("user-{user}").as_bytes());
            let host = a.pick(Some(key)).unwrap().addr();
            assert_eq!(b.pick(Some(key)).unwrap().addr(), host);
            seen.insert(host, ());
        }
        assert_eq!(seen.len(), 10, "{}", policy.name());
    }
}
