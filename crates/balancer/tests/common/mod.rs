//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;

use balancer::{Health, HostSpec, LbPolicy, LoadBalancer, RingHashOptions};
use proptest::prelude::*;

/// A distinct address per host number.
pub fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 8000))
}

pub fn specs(weights: &[u32]) -> Vec<HostSpec> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| HostSpec::new(addr(i)).with_weight(w))
        .collect()
}

pub fn equal_specs(n: usize) -> Vec<HostSpec> {
    specs(&vec![1; n])
}

/// Every policy with Envoy's defaults.
pub fn all_policies() -> Vec<LbPolicy> {
    vec![
        LbPolicy::RoundRobin,
        LbPolicy::least_request(),
        LbPolicy::Random,
        LbPolicy::ring_hash(),
        LbPolicy::maglev(),
    ]
}

pub fn any_policy() -> impl Strategy<Value = LbPolicy> {
    proptest::sample::select(all_policies())
}

pub fn any_health() -> impl Strategy<Value = Health> {
    prop_oneof![
        Just(Health::Healthy),
        Just(Health::Degraded),
        Just(Health::Unhealthy),
        Just(Health::Ejected),
    ]
}

/// A hash key per pick for the consistent-hash policies (a fresh random one), none for the
/// others.
pub fn key_for(policy: &LbPolicy, i: u64) -> Option<u64> {
    match policy {
        LbPolicy::RingHash(_) | LbPolicy::Maglev(_) => Some(balancer::hash_key(&i.to_le_bytes())),
        _ => None,
    }
}

/// Picks `n` times (dropping each guard at once) and counts picks per host index.
pub fn pick_counts(lb: &LoadBalancer, hosts: usize, n: u64) -> Vec<u64> {
    let mut counts = vec![0; hosts];
    for i in 0..n {
        let picked = lb.pick(key_for(lb.policy(), i)).expect("a host");
        counts[picked.index()] += 1;
    }
    counts
}

/// Pearson's chi-square statistic of `observed` against shares proportional to `weights`.
pub fn chi_square(observed: &[u64], weights: &[u32]) -> f64 {
    let total: u64 = observed.iter().sum();
    let weight_sum: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    observed
        .iter()
        .zip(weights)
        .map(|(&o, &w)| {
            let expected = total as f64 * f64::from(w) / weight_sum;
            (o as f64 - expected).powi(2) / expected
        })
        .sum()
}

/// An upper bound of the chi-square critical value at p = 1e-6 for `df` degrees of freedom
/// (Wilson-Hilferty, which errs high for small df): a correct sampler fails this less than
/// once in a million runs.
pub fn chi_square_critical(df: usize) -> f64 {
    let df = df as f64;
    let z = 4.753; // one-sided normal quantile of 1e-6
    let c = 2.0 / (9.0 * df);
    df * (1.0 - c + z * c.sqrt()).powi(3)
}

/// A ring large enough that every host's share is close to its weight (the default 1024
/// entries give each of a few hosts only a few hundred arcs, whose total length varies by
/// several percent).
pub fn fine_ring() -> LbPolicy {
    LbPolicy::RingHash(RingHashOptions {
        minimum_ring_size: 1 << 16,
        ..Default::default()
    })
}
