//! Envoy's zone-aware routing: send as much traffic as possible to the upstream hosts in the
//! proxy's own locality while keeping every upstream host's load even.
//!
//! The *local cluster* is the proxy's own fleet, by locality. If the upstream cluster's
//! priority-0 healthy hosts are spread across localities no less than the proxies are, each
//! proxy routes everything to its own locality ("directly"). If its locality has fewer
//! upstream hosts than proxies, it keeps the share it can (`upstream% / local% * 10000`, in
//! ten-thousandths) and sends the rest to the localities that have more upstream hosts than
//! proxies, in proportion to that surplus (the "residual capacity").
//!
//! The plan is computed once per host-set change ([`plan`]); a pick costs at most two random
//! draws ([`Plan::choose`]). Integer arithmetic is Envoy's (`10000` is 100%, divisions
//! floor), so that the shares match Envoy's to the unit.

use std::collections::BTreeMap;

use crate::host::{Entry, HostSet, ZoneRoute};
use crate::{Health, rng};

/// Zone-aware routing's settings (Envoy's `zone_aware_lb_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneAwareSettings {
    /// The percentage of requests zone-aware routing applies to (`routing_enabled`; 100 by
    /// default); the others are balanced over every locality.
    pub routing_enabled: u32,
    /// Below this many healthy upstream hosts at priority 0, no zone-aware routing
    /// (`min_cluster_size`; 6 by default).
    pub min_cluster_size: u64,
    /// `force_local_zone.min_size`: with at least this many healthy upstream hosts in the
    /// local locality, route everything there whatever the shares; and route by zone even
    /// when the local cluster is in one locality.
    pub force_local_zone_min_size: Option<u32>,
    /// When a level (or the local cluster) is in panic, fail the pick rather than use every
    /// host (`fail_traffic_on_panic`).
    pub fail_traffic_on_panic: bool,
    /// Measure a locality by its healthy hosts' weights rather than their number
    /// (`locality_basis: HEALTHY_HOSTS_WEIGHT`).
    pub weight_basis: bool,
}

impl Default for ZoneAwareSettings {
    fn default() -> Self {
        Self {
            routing_enabled: 100,
            min_cluster_size: 6,
            force_local_zone_min_size: None,
            fail_traffic_on_panic: false,
            weight_basis: false,
        }
    }
}

/// The proxy's own fleet, for zone-aware routing (Envoy's `local_cluster_name` and the
/// node's locality).
#[derive(Debug, Clone)]
pub struct LocalCluster {
    /// The proxies, with their localities (only priority 0 counts).
    pub hosts: HostSet,
    /// The locality this proxy runs in, numbered as the upstream hosts' localities are.
    pub locality: u32,
}

/// Where zone-aware routing stands for the current hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneRouting {
    /// Not in use: no local cluster, a hashing policy, or locality-weighted balancing.
    Off,
    /// The upstream's priority 0 (or the local cluster, without `force_local_zone`) spans
    /// fewer than two localities.
    TooFewLocalities,
    /// The local cluster has no host in the proxy's locality (`lb_local_cluster_not_ok`).
    LocalClusterNotOk,
    /// Fewer healthy upstream hosts than `min_cluster_size` (`lb_zone_cluster_too_small`).
    ClusterTooSmall,
    /// Every routed request goes to the local locality.
    Direct,
    /// This many ten-thousandths of routed requests stay local; the rest go to the
    /// localities with spare capacity.
    Residual { local_share: u64 },
}

/// The routing computed for one host-set version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) state: ZoneRouting,
    /// The upstream priority-0 localities, the local one first when it has hosts.
    pub(crate) localities: Vec<u32>,
    /// Running sums of each locality's spare capacity (ten-thousandths); the local one adds
    /// none.
    residual: Vec<u64>,
    /// Whether the local cluster's priority 0 is in panic.
    pub(crate) local_in_panic: bool,
}

/// Per locality, the number of hosts and the measure of its healthy ones.
#[derive(Default, Clone, Copy)]
struct Tally {
    hosts: u64,
    healthy: u64,
    measure: u64,
}

fn tally<'a>(hosts: impl Iterator<Item = &'a Entry>, weight_basis: bool) -> BTreeMap<u32, Tally> {
    let mut by_locality = BTreeMap::new();
    for entry in hosts {
        let t: &mut Tally = by_locality.entry(entry.spec.locality).or_default();
        t.hosts += 1;
        if entry.spec.health == Health::Healthy {
            t.healthy += 1;
            t.measure += if weight_basis {
                u64::from(entry.spec.weight)
            } else {
                1
            };
        }
    }
    by_locality
}

/// Envoy's panic test for the local cluster: healthy plus degraded below the threshold, over
/// the hosts that are not draining.
fn in_panic<'a>(hosts: impl Iterator<Item = &'a Entry>, panic_threshold: f64) -> bool {
    let (mut counted, mut available) = (0u64, 0u64);
    for entry in hosts {
        match entry.spec.health {
            Health::Draining => continue,
            Health::Healthy | Health::Degraded => available += 1,
            Health::Unhealthy | Health::Ejected => {}
        }
        counted += 1;
    }
    let percent = if counted == 0 {
        0.0
    } else {
        100.0 * available as f64 / counted as f64
    };
    percent < panic_threshold.min(100.0)
}

/// The routing for `upstream` (the upstream cluster's priority-0 hosts) from a proxy in
/// `local_locality` of a fleet whose priority-0 hosts are `local`.
pub(crate) fn plan<'a>(
    upstream: impl Iterator<Item = &'a Entry>,
    local: impl Iterator<Item = &'a Entry> + Clone,
    local_locality: u32,
    settings: &ZoneAwareSettings,
    panic_threshold: f64,
) -> Plan {
    let up = tally(upstream, settings.weight_basis);
    let mine = tally(local.clone(), settings.weight_basis);
    let has_local = up.contains_key(&local_locality);
    let mut localities: Vec<u32> = Vec::with_capacity(up.len());
    if has_local {
        localities.push(local_locality);
    }
    localities.extend(up.keys().copied().filter(|&l| l != local_locality));
    let mut plan = Plan {
        state: ZoneRouting::Direct,
        localities,
        residual: Vec::new(),
        local_in_panic: in_panic(local, panic_threshold),
    };
    // Envoy's early exits, in its order.
    let local_hosts = mine.get(&local_locality).map_or(0, |t| t.hosts);
    let upstream_healthy: u64 = up.values().map(|t| t.healthy).sum();
    plan.state = if up.len() < 2 || (settings.force_local_zone_min_size.is_none() && mine.len() < 2)
    {
        ZoneRouting::TooFewLocalities
    } else if local_hosts == 0 {
        ZoneRouting::LocalClusterNotOk
    } else if upstream_healthy < settings.min_cluster_size {
        ZoneRouting::ClusterTooSmall
    } else {
        ZoneRouting::Direct
    };
    if plan.state != ZoneRouting::Direct {
        return plan;
    }

    let total = |m: &BTreeMap<u32, Tally>| m.values().map(|t| t.measure).sum::<u64>();
    let (local_total, up_total) = (total(&mine), total(&up));
    // (local share, upstream share) of each upstream locality, in ten-thousandths.
    let shares: Vec<(u64, u64)> = plan
        .localities
        .iter()
        .map(|l| {
            let u = up[l];
            if u.healthy == 0 {
                return (0, 0);
            }
            let local_share = match (local_total, mine.get(l)) {
                (0, _) | (_, None) => 0,
                (t, Some(m)) => 10_000 * m.measure / t,
            };
            let up_share = (10_000 * u.measure).checked_div(up_total).unwrap_or(0);
            (local_share, up_share)
        })
        .collect();
    let (local0, up0) = shares[0];
    let forced = settings
        .force_local_zone_min_size
        .is_some_and(|min| has_local && up[&plan.localities[0]].healthy >= u64::from(min));
    if has_local && ((up0 > 0 && up0 >= local0) || forced) {
        return plan;
    }
    let local_share = if has_local && local0 > 0 {
        up0 * 10_000 / local0
    } else {
        0
    };
    let mut last = 0;
    plan.residual = shares
        .iter()
        .enumerate()
        .map(|(i, &(local_share, up_share))| {
            if !(i == 0 && has_local) && up_share > local_share {
                last += up_share - local_share;
            }
            last
        })
        .collect();
    plan.state = ZoneRouting::Residual { local_share };
    plan
}

impl Plan {
    /// Whether picks route by zone.
    pub(crate) fn routes(&self) -> bool {
        matches!(
            self.state,
            ZoneRouting::Direct | ZoneRouting::Residual { .. }
        )
    }

    /// The locality (an index into `localities`) for one pick, and how it was chosen. Only
    /// for a plan that [`routes`](Self::routes).
    pub(crate) fn choose(&self) -> (usize, ZoneRoute) {
        let ZoneRouting::Residual { local_share } = self.state else {
            return (0, ZoneRoute::AllDirectly);
        };
        if rng::next_u64() % 10_000 < local_share {
            return (0, ZoneRoute::Sampled);
        }
        let n = self.localities.len();
        let capacity = self.residual.last().copied().unwrap_or(0);
        if capacity == 0 {
            return (
                (rng::next_u64() % n as u64) as usize,
                ZoneRoute::NoCapacityLeft,
            );
        }
        let threshold = rng::next_u64() % capacity;
        let i = self
            .residual
            .iter()
            .position(|&r| threshold < r)
            .unwrap_or(n - 1);
        (i, ZoneRoute::CrossZone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostSpec;

    /// Hosts `count` per locality (1, 2, 3, ...), all healthy unless `unhealthy` says how many
    /// of each locality are not.
    fn hosts(net: u8, counts: &[usize], unhealthy: &[usize]) -> HostSet {
        let mut specs = Vec::new();
        for (l, &count) in counts.iter().enumerate() {
            for i in 0..count {
                let addr = format!("10.{net}.{l}.{}:80", i + 1).parse().unwrap();
                let mut spec = HostSpec::new(addr).with_locality(l as u32 + 1, 0);
                if i < unhealthy.get(l).copied().unwrap_or(0) {
                    spec = spec.with_health(Health::Unhealthy);
                }
                specs.push(spec);
            }
        }
        HostSet::new(specs).unwrap()
    }

    fn plan_for(
        upstream: &HostSet,
        local: &HostSet,
        locality: u32,
        settings: &ZoneAwareSettings,
    ) -> Plan {
        let (u, l) = (upstream.snapshot(), local.snapshot());
        plan(
            u.entries().iter(),
            l.entries().iter(),
            locality,
            settings,
            50.0,
        )
    }

    #[test]
    fn envoys_worked_example_keeps_62_5_percent_local_and_splits_the_rest_by_spare_capacity() {
        // Local fleet 40/40/20 %, upstream 25/50/25 %.
        let local = hosts(1, &[4, 4, 2], &[]);
        let upstream = hosts(2, &[2, 4, 2], &[]);
        let plan = plan_for(&upstream, &local, 1, &ZoneAwareSettings::default());
        assert_eq!(plan.state, ZoneRouting::Residual { local_share: 6250 });
        assert_eq!(plan.localities, vec![1, 2, 3]);
        // Spare capacity: 5000 - 4000 in the second, 2500 - 2000 in the third.
        assert_eq!(plan.residual, vec![0, 1000, 1500]);
    }

    #[test]
    fn a_locality_with_its_share_of_upstream_hosts_routes_directly() {
        let local = hosts(1, &[1, 1], &[]);
        let upstream = hosts(2, &[3, 3], &[]);
        let plan = plan_for(&upstream, &local, 2, &ZoneAwareSettings::default());
        assert_eq!(plan.state, ZoneRouting::Direct);
        assert_eq!(plan.localities, vec![2, 1]);
        assert_eq!(plan.choose(), (0, ZoneRoute::AllDirectly));
    }

    #[test]
    fn the_early_exits_come_in_envoys_order() {
        let settings = ZoneAwareSettings::default();
        let two = hosts(1, &[2, 2], &[]);
        // One upstream locality.
        let state = |up: &HostSet, local: &HostSet, l: u32, s: &ZoneAwareSettings| {
            plan_for(up, local, l, s).state
        };
        assert_eq!(
            state(&hosts(2, &[6], &[]), &two, 1, &settings),
            ZoneRouting::TooFewLocalities
        );
        // One local locality, unless force_local_zone.
        let one = hosts(1, &[3], &[]);
        let up = hosts(2, &[3, 3], &[]);
        assert_eq!(
            state(&up, &one, 1, &settings),
            ZoneRouting::TooFewLocalities
        );
        let forced = ZoneAwareSettings {
            force_local_zone_min_size: Some(1),
            ..settings
        };
        assert_eq!(state(&up, &one, 1, &forced), ZoneRouting::Direct);
        // The proxy's locality is not in the local cluster.
        assert_eq!(
            state(&up, &two, 7, &settings),
            ZoneRouting::LocalClusterNotOk
        );
        // Five healthy upstream hosts, six needed.
        assert_eq!(
            state(&hosts(2, &[3, 3], &[1]), &two, 1, &settings),
            ZoneRouting::ClusterTooSmall
        );
    }

    #[test]
    fn force_local_zone_routes_directly_once_the_local_locality_has_enough_hosts() {
        let local = hosts(1, &[5, 5], &[]);
        let upstream = hosts(2, &[2, 8], &[]);
        let base = ZoneAwareSettings::default();
        assert_eq!(
            plan_for(&upstream, &local, 1, &base).state,
            ZoneRouting::Residual { local_share: 4000 }
        );
        let forced = |min| ZoneAwareSettings {
            force_local_zone_min_size: Some(min),
            ..base
        };
        assert_eq!(
            plan_for(&upstream, &local, 1, &forced(2)).state,
            ZoneRouting::Direct
        );
        assert_eq!(
            plan_for(&upstream, &local, 1, &forced(3)).state,
            ZoneRouting::Residual { local_share: 4000 }
        );
    }

    #[test]
    fn unhealthy_hosts_do_not_count_and_an_upstream_without_the_local_locality_spreads() {
        // Upstream localities 2 and 3; the proxy is in 1.
        let local = hosts(1, &[2, 1, 1], &[]);
        let upstream = {
            let specs = (0..8)
                .map(|i| {
                    HostSpec::new(format!("10.2.0.{}:80", i + 1).parse().unwrap())
                        .with_locality(if i < 4 { 2 } else { 3 }, 0)
                        .with_health(if i == 0 {
                            Health::Unhealthy
                        } else {
                            Health::Healthy
                        })
                })
                .collect();
            HostSet::new(specs).unwrap()
        };
        let plan = plan_for(&upstream, &local, 1, &ZoneAwareSettings::default());
        assert_eq!(plan.localities, vec![2, 3]);
        assert_eq!(plan.state, ZoneRouting::Residual { local_share: 0 });
        // Shares: local 2500/2500, upstream 3/7 = 4285 and 4/7 = 5714.
        assert_eq!(plan.residual, vec![1785, 1785 + 3214]);
    }

    #[test]
    fn the_weight_basis_measures_localities_by_weight() {
        let local = hosts(1, &[1, 1], &[]);
        let specs = vec![
            HostSpec::new("10.2.0.1:80".parse().unwrap())
                .with_locality(1, 0)
                .with_weight(1),
            HostSpec::new("10.2.0.2:80".parse().unwrap())
                .with_locality(1, 0)
                .with_weight(1),
            HostSpec::new("10.2.1.1:80".parse().unwrap())
                .with_locality(2, 0)
                .with_weight(6),
        ];
        let upstream = HostSet::new(specs).unwrap();
        let count = ZoneAwareSettings {
            min_cluster_size: 1,
            ..ZoneAwareSettings::default()
        };
        assert_eq!(
            plan_for(&upstream, &local, 1, &count).state,
            ZoneRouting::Direct
        );
        let weight = ZoneAwareSettings {
            weight_basis: true,
            ..count
        };
        // Upstream locality 1 holds 2 of 8 weight: 2500 of the local 5000 keeps half.
        assert_eq!(
            plan_for(&upstream, &local, 1, &weight).state,
            ZoneRouting::Residual { local_share: 5000 }
        );
    }

    #[test]
    fn the_local_cluster_is_in_panic_below_the_threshold() {
        let local = hosts(1, &[2, 2], &[2, 1]);
        let upstream = hosts(2, &[3, 3], &[]);
        assert!(plan_for(&upstream, &local, 1, &ZoneAwareSettings::default()).local_in_panic);
        let local = hosts(1, &[2, 2], &[1]);
        assert!(!plan_for(&upstream, &local, 1, &ZoneAwareSettings::default()).local_in_panic);
    }

    #[test]
    fn sampled_choices_follow_the_shares() {
        let local = hosts(1, &[4, 4, 2], &[]);
        let upstream = hosts(2, &[2, 4, 2], &[]);
        let plan = plan_for(&upstream, &local, 1, &ZoneAwareSettings::default());
        let mut counts = [0u32; 3];
        let draws = 100_000;
        for _ in 0..draws {
            counts[plan.choose().0] += 1;
        }
        // 62.5% local; the other 37.5% by spare capacity, 1000 : 500: 25% and 12.5%.
        let share = |c: u32| f64::from(c) / f64::from(draws);
        assert!((share(counts[0]) - 0.625).abs() < 0.01, "{counts:?}");
        assert!((share(counts[1]) - 0.25).abs() < 0.01, "{counts:?}");
        assert!((share(counts[2]) - 0.125).abs() < 0.01, "{counts:?}");
    }
}
