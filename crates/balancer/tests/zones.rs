//! Zone-aware routing through a `LoadBalancer`: the shares Envoy's worked example gives, how
//! each pick was routed, and a local fleet that changes.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use balancer::{
    Health, HostSet, HostSpec, LbPolicy, LbSettings, LoadBalancer, LocalCluster, ZoneAwareSettings,
    ZoneRoute, ZoneRouting,
};
use common::*;

/// `counts[l]` hosts in locality `l + 1`, numbered from `first`.
fn fleet(first: usize, counts: &[usize]) -> Vec<HostSpec> {
    let mut specs = Vec::new();
    for (l, &count) in counts.iter().enumerate() {
        for _ in 0..count {
            specs.push(HostSpec::new(addr(first + specs.len())).with_locality(l as u32 + 1, 0));
        }
    }
    specs
}

fn zone_balancer(upstream: &HostSet, local: &HostSet, policy: LbPolicy) -> LoadBalancer {
    LoadBalancer::with_local_cluster(
        upstream.clone(),
        policy,
        LbSettings::default(),
        Some(LocalCluster {
            hosts: local.clone(),
            locality: 1,
        }),
    )
    .unwrap()
}

/// The share of 10,000 picks per locality (1-based index 0..3), and the routes taken.
fn shares(lb: &LoadBalancer) -> ([f64; 3], Vec<Option<ZoneRoute>>) {
    let specs = lb.hosts().snapshot().specs();
    let mut counts = [0u32; 3];
    let mut routes = Vec::new();
    for _ in 0..10_000 {
        let picked = lb.pick(None).unwrap();
        counts[specs[picked.index()].locality as usize - 1] += 1;
        routes.push(picked.zone_route());
    }
    (counts.map(|c| f64::from(c) / 10_000.0), routes)
}

#[test]
fn the_worked_example_keeps_62_5_percent_local_and_sends_the_rest_by_spare_capacity() {
    // Proxies 40/40/20 %, upstream hosts 25/50/25 %.
    let local = HostSet::new(fleet(100, &[4, 4, 2])).unwrap();
    let upstream = HostSet::new(fleet(0, &[2, 4, 2])).unwrap();
    for policy in [
        LbPolicy::RoundRobin,
        LbPolicy::least_request(),
        LbPolicy::Random,
    ] {
        let lb = zone_balancer(&upstream, &local, policy);
        assert_eq!(
            lb.zone_routing(),
            ZoneRouting::Residual { local_share: 6250 }
        );
        let (share, routes) = shares(&lb);
        // 10,000 picks: a share within 0.025 of its mean is over five standard deviations.
        assert!((share[0] - 0.625).abs() < 0.025, "{share:?}");
        assert!((share[1] - 0.25).abs() < 0.025, "{share:?}");
        assert!((share[2] - 0.125).abs() < 0.025, "{share:?}");
        let sampled = routes
            .iter()
            .filter(|r| **r == Some(ZoneRoute::Sampled))
            .count();
        let cross = routes
            .iter()
            .filter(|r| **r == Some(ZoneRoute::CrossZone))
            .count();
        assert_eq!(sampled + cross, routes.len());
    }
}

#[test]
fn a_change_in_the_local_fleet_moves_the_shares() {
    let local = HostSet::new(fleet(100, &[4, 4, 2])).unwrap();
    let upstream = HostSet::new(fleet(0, &[2, 4, 2])).unwrap();
    let lb = zone_balancer(&upstream, &local, LbPolicy::RoundRobin);
    assert!(matches!(lb.zone_routing(), ZoneRouting::Residual { .. }));
    // The first zone's proxies shrink to a quarter of the fleet: its hosts suffice.
    local.update(fleet(100, &[1, 2, 1])).unwrap();
    assert_eq!(lb.zone_routing(), ZoneRouting::Direct);
    let (share, routes) = shares(&lb);
    assert_eq!(share[0], 1.0);
    assert!(routes.iter().all(|r| *r == Some(ZoneRoute::AllDirectly)));
}

#[test]
fn small_clusters_hashing_policies_and_a_local_fleet_in_panic_are_not_routed_by_zone() {
    let local = HostSet::new(fleet(100, &[1, 1])).unwrap();
    let upstream = HostSet::new(fleet(0, &[2, 2])).unwrap();
    // Four healthy hosts, six needed by default.
    let lb = zone_balancer(&upstream, &local, LbPolicy::RoundRobin);
    assert_eq!(lb.zone_routing(), ZoneRouting::ClusterTooSmall);
    assert!(shares(&lb).1.iter().all(Option::is_none));
    // Ring hash picks over every locality.
    let lb = zone_balancer(&upstream, &local, LbPolicy::ring_hash());
    assert_eq!(lb.zone_routing(), ZoneRouting::Off);

    let settings = LbSettings {
        zone_aware: ZoneAwareSettings {
            min_cluster_size: 1,
            ..ZoneAwareSettings::default()
        },
        ..LbSettings::default()
    };
    let lb = LoadBalancer::with_local_cluster(
        upstream.clone(),
        LbPolicy::RoundRobin,
        settings,
        Some(LocalCluster {
            hosts: local.clone(),
            locality: 1,
        }),
    )
    .unwrap();
    assert_eq!(lb.zone_routing(), ZoneRouting::Direct);
    // Every proxy unhealthy: the fleet is in panic, and picks go everywhere.
    for spec in fleet(100, &[1, 1]) {
        local.set_health(spec.addr, Health::Unhealthy);
    }
    let (share, routes) = shares(&lb);
    assert!((share[0] - 0.5).abs() < 0.025, "{share:?}");
    assert!(
        routes
            .iter()
            .all(|r| *r == Some(ZoneRoute::LocalClusterNotOk))
    );
}

#[test]
fn routing_enabled_leaves_the_other_requests_to_every_locality() {
    let local = HostSet::new(fleet(100, &[1, 1])).unwrap();
    let upstream = HostSet::new(fleet(0, &[3, 3])).unwrap();
    let settings = LbSettings {
        zone_aware: ZoneAwareSettings {
            routing_enabled: 60,
            ..ZoneAwareSettings::default()
        },
        ..LbSettings::default()
    };
    let lb = LoadBalancer::with_local_cluster(
        upstream,
        LbPolicy::Random,
        settings,
        Some(LocalCluster {
            hosts: local,
            locality: 1,
        }),
    )
    .unwrap();
    // 60% routed directly, 40% over both: 80% local.
    let (share, routes) = shares(&lb);
    assert!((share[0] - 0.8).abs() < 0.025, "{share:?}");
    let routed = routes.iter().filter(|r| r.is_some()).count() as f64 / 10_000.0;
    assert!((routed - 0.6).abs() < 0.025, "{routed}");
}
