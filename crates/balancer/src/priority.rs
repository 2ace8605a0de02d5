//! Envoy's priority levels: how much of the load each level takes (to its healthy hosts, and
//! to its degraded ones) from the health of its hosts, and which levels are in panic.
//!
//! A level's healthy availability is `min(100, factor * healthy / hosts)` percent, where
//! `factor` is the overprovisioning factor (140 by default: a level with 5 of 7 hosts healthy
//! still counts as whole); its degraded availability is the same over degraded hosts. The
//! load, 100 percent, goes to the levels' healthy availabilities in priority order, each
//! level taking its availability scaled by the total availability (capped at 100), then what
//! is left to degraded availabilities the same way; rounding leftovers go to the first level
//! with healthy hosts. A level is in panic when under `panic_threshold` percent of its hosts
//! are available and the total availability is under 100: a pick that lands there ignores
//! health. When every level is in panic, or nothing is available, levels take load in
//! proportion to their host counts instead.

/// One priority level's host counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LevelCounts {
    pub(crate) healthy: u64,
    pub(crate) degraded: u64,
    pub(crate) hosts: u64,
}

/// Per level: percent of picks to its healthy hosts and to its degraded hosts (all of them
/// add up to 100), whether the level is in panic, and its healthy and degraded availability.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Loads {
    pub(crate) healthy: Vec<u32>,
    pub(crate) degraded: Vec<u32>,
    pub(crate) panic: Vec<bool>,
    pub(crate) availability: Vec<(u32, u32)>,
}

/// Envoy's `recalculatePerPriorityState` and `recalculatePerPriorityPanic` over `levels`
/// (at least one), with the overprovisioning factor in percent.
pub(crate) fn loads(levels: &[LevelCounts], overprovisioning: u32, panic_threshold: f64) -> Loads {
    let n = levels.len();
    let mut loads = Loads {
        healthy: vec![0; n],
        degraded: vec![0; n],
        panic: vec![false; n],
        availability: Vec::new(),
    };
    if n == 0 {
        return loads;
    }
    let availability = |count: u64, hosts: u64| -> u32 {
        (u64::from(overprovisioning) * count)
            .checked_div(hosts)
            .map_or(0, |a| a.min(100) as u32)
    };
    let health: Vec<u32> = levels
        .iter()
        .map(|l| availability(l.healthy, l.hosts))
        .collect();
    let degraded: Vec<u32> = levels
        .iter()
        .map(|l| availability(l.degraded, l.hosts))
        .collect();
    loads.availability = health
        .iter()
        .copied()
        .zip(degraded.iter().copied())
        .collect();
    let total: u32 = health
        .iter()
        .chain(&degraded)
        .fold(0u32, |sum, a| sum.saturating_add(*a))
        .min(100);
    if total == 0 && panic_threshold <= 0.0 {
        // Nothing available and panic mode off: all of it to the first level, whose healthy
        // hosts (if any, under the rounding) take it.
        loads.healthy[0] = 100;
        return loads;
    }
    if total == 0 {
        by_host_count(levels, &mut loads);
    } else {
        let (first_healthy, left) = distribute(&mut loads.healthy, &health, 100, total);
        let (first_degraded, left) = distribute(&mut loads.degraded, &degraded, left, total);
        if left > 0 {
            match (first_healthy, first_degraded) {
                (Some(i), _) => loads.healthy[i] += left,
                (None, Some(i)) => loads.degraded[i] += left,
                (None, None) => {}
            }
        }
    }
    if total < 100 {
        for (panic, level) in loads.panic.iter_mut().zip(levels) {
            *panic = in_panic(level, panic_threshold);
        }
        if loads.panic.iter().all(|p| *p) {
            by_host_count(levels, &mut loads);
        }
    }
    loads
}

/// Envoy's `previous_priorities` retry priority: the loads with the `excluded` levels'
/// availability taken as 0, as `(healthy, degraded)` per level; `None` when nothing else is
/// available (a retry then uses the loads as they are).
pub(crate) fn excluding(
    availability: &[(u32, u32)],
    excluded: &[bool],
) -> Option<(Vec<u32>, Vec<u32>)> {
    let kept = |i: usize| !excluded.get(i).copied().unwrap_or(false);
    let health: Vec<u32> = (0..availability.len())
        .map(|i| if kept(i) { availability[i].0 } else { 0 })
        .collect();
    let degraded: Vec<u32> = (0..availability.len())
        .map(|i| if kept(i) { availability[i].1 } else { 0 })
        .collect();
    let total = health.iter().chain(&degraded).sum::<u32>().min(100);
    if total == 0 {
        return None;
    }
    let mut healthy_load = vec![0; health.len()];
    let mut degraded_load = vec![0; health.len()];
    let (first_healthy, left) = distribute(&mut healthy_load, &health, 100, total);
    let (first_degraded, left) = distribute(&mut degraded_load, &degraded, left, total);
    match (first_healthy, first_degraded) {
        (Some(i), _) => healthy_load[i] += left,
        (None, Some(i)) => degraded_load[i] += left,
        (None, None) => {}
    }
    Some((healthy_load, degraded_load))
}

/// Gives each level `availability * 100 / total` of `load` in order while load is left.
/// The first level with any availability, and the load left.
fn distribute(
    load: &mut [u32],
    availability: &[u32],
    mut left: u32,
    total: u32,
) -> (Option<usize>, u32) {
    let mut first = None;
    for (i, (load, a)) in load.iter_mut().zip(availability).enumerate() {
        if first.is_none() && *a > 0 {
            first = Some(i);
        }
        *load = left.min(a * 100 / total);
        left -= *load;
    }
    (first, left)
}

/// Envoy's `recalculateLoadInTotalPanic`: load in proportion to host counts, to all hosts.
fn by_host_count(levels: &[LevelCounts], loads: &mut Loads) {
    let hosts: u64 = levels.iter().map(|l| l.hosts).sum();
    loads.degraded.iter_mut().for_each(|d| *d = 0);
    if hosts == 0 {
        loads.healthy.iter_mut().for_each(|h| *h = 0);
        loads.healthy[0] = 100;
        return;
    }
    let mut left = 100;
    for (load, level) in loads.healthy.iter_mut().zip(levels) {
        *load = (100 * level.hosts / hosts) as u32;
        left -= *load;
    }
    if let Some(first) = levels.iter().position(|l| l.hosts > 0) {
        loads.healthy[first] += left;
    }
}

/// Whether under `threshold` percent of the level's hosts are available (an empty level is).
fn in_panic(level: &LevelCounts, threshold: f64) -> bool {
    let available = if level.hosts == 0 {
        0.0
    } else {
        100.0 * (level.healthy + level.degraded) as f64 / level.hosts as f64
    };
    available < threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(healthy: u64, degraded: u64, hosts: u64) -> LevelCounts {
        LevelCounts {
            healthy,
            degraded,
            hosts,
        }
    }

    fn healthy_loads(levels: &[LevelCounts]) -> Vec<u32> {
        loads(levels, 140, 50.0).healthy
    }

    #[test]
    fn one_level_follows_envoys_arithmetic() {
        let one = |h, d, n, threshold| {
            let l = loads(&[level(h, d, n)], 140, threshold);
            (l.healthy[0], l.degraded[0], l.panic[0])
        };
        assert_eq!(one(10, 0, 10, 50.0), (100, 0, false));
        // 1.4 * 60% = 84% healthy, 1.4 * 40% = 56% degraded, total capped at 100.
        assert_eq!(one(6, 4, 10, 50.0), (84, 16, false));
        // 1.4 * 80% >= 100%: degraded hosts not needed.
        assert_eq!(one(8, 2, 10, 50.0), (100, 0, false));
        // 42% and 28%: loads 60 / 40; 50% available is not below the threshold.
        assert_eq!(one(3, 2, 10, 50.0), (60, 40, false));
        assert_eq!(one(3, 1, 10, 50.0), (100, 0, true));
        assert_eq!(one(0, 3, 3, 50.0), (0, 100, false));
        assert_eq!(one(0, 0, 3, 50.0), (100, 0, true));
        // Nothing available, panic off: all to the (missing) healthy hosts.
        assert_eq!(one(0, 0, 3, 0.0), (100, 0, false));
        // 1 healthy of 200 rounds to no availability; with panic off it still gets traffic.
        assert_eq!(one(1, 0, 200, 0.0), (100, 0, false));
    }

    /// The table of Envoy's priority-levels documentation (arch_overview_load_balancing_
    /// priority_levels): P0 and P1 healthy percentages against the load each takes.
    #[test]
    fn two_levels_match_envoys_documented_table() {
        let of_ten = |p0: u64, p1: u64| healthy_loads(&[level(p0, 0, 10), level(p1, 0, 10)]);
        assert_eq!(of_ten(10, 10), vec![100, 0]);
        assert_eq!(of_ten(7, 10), vec![98, 2]); // 1.4 * 70% = 98%
        assert_eq!(of_ten(5, 10), vec![70, 30]);
        assert_eq!(of_ten(2, 10), vec![28, 72]);
        assert_eq!(of_ten(0, 10), vec![0, 100]);
        // 50% and 50%: 70 + 70 > 100, no scaling.
        assert_eq!(of_ten(5, 5), vec![70, 30]);
        // Docs: P0 20%, P1 20%: total 56% -> normalized 50 / 50, both in panic -> by count.
        let l = loads(&[level(2, 0, 10), level(2, 0, 10)], 140, 50.0);
        assert_eq!(l.panic, vec![true, true]);
        assert_eq!(l.healthy, vec![50, 50]);
        // P0 at 25% (the docs' 35 / 65): under the threshold, but the total is whole: no panic.
        let l = loads(&[level(1, 0, 4), level(4, 0, 4)], 140, 50.0);
        assert_eq!(
            (l.healthy.clone(), l.panic.clone()),
            (vec![35, 65], vec![false, false])
        );
    }

    #[test]
    fn three_levels_and_an_empty_one() {
        // Envoy's docs: P0 20%, P1 20%, P2 100%: 28 + 28 + 44.
        assert_eq!(
            healthy_loads(&[level(2, 0, 10), level(2, 0, 10), level(10, 0, 10)]),
            vec![28, 28, 44]
        );
        // An empty P0 (Envoy Gateway's fallback backends): everything to P1.
        let l = loads(&[level(0, 0, 0), level(3, 0, 3)], 140, 50.0);
        assert_eq!((l.healthy, l.panic), (vec![0, 100], vec![false, false]));
    }

    #[test]
    fn degraded_hosts_of_a_level_come_after_healthy_hosts_of_every_level() {
        // P0: 2 healthy, 8 degraded of 10 -> 28 healthy, 100 degraded; P1 all healthy.
        let l = loads(&[level(2, 8, 10), level(10, 0, 10)], 140, 50.0);
        assert_eq!(l.healthy, vec![28, 72]);
        assert_eq!(l.degraded, vec![0, 0]);
        let l = loads(&[level(2, 8, 10), level(1, 0, 10)], 140, 50.0);
        assert_eq!(l.healthy, vec![28, 14]);
        assert_eq!(l.degraded, vec![58, 0]);
    }

    #[test]
    fn the_overprovisioning_factor_is_the_endpoints_own() {
        // Factor 100: 8 of 10 healthy is 80% available; P1 takes the rest.
        assert_eq!(
            loads(&[level(8, 0, 10), level(10, 0, 10)], 100, 50.0).healthy,
            vec![80, 20]
        );
        assert_eq!(
            loads(&[level(8, 0, 10), level(10, 0, 10)], 140, 50.0).healthy,
            vec![100, 0]
        );
    }

    #[test]
    fn a_retry_leaves_out_the_levels_tried() {
        let l = loads(
            &[level(10, 0, 10), level(5, 0, 10), level(10, 0, 10)],
            140,
            50.0,
        );
        assert_eq!(l.healthy, vec![100, 0, 0]);
        // P0 tried: P1 takes its 70%, P2 the rest.
        assert_eq!(
            excluding(&l.availability, &[true]),
            Some((vec![0, 70, 30], vec![0, 0, 0]))
        );
        assert_eq!(
            excluding(&l.availability, &[true, true]),
            Some((vec![0, 0, 100], vec![0, 0, 0]))
        );
        // Everything tried: nothing is left to move to.
        assert_eq!(excluding(&l.availability, &[true, true, true]), None);
    }

    #[test]
    fn loads_always_add_up_to_one_hundred() {
        for a in 0..=6u64 {
            for b in 0..=6u64 {
                for c in 0..=3u64 {
                    let levels = [level(a, 0, 6), level(b, c.min(6 - b), 6), level(0, 0, c)];
                    for threshold in [0.0, 50.0, 100.0] {
                        let l = loads(&levels, 140, threshold);
                        let sum: u32 = l.healthy.iter().chain(&l.degraded).sum();
                        assert_eq!(sum, 100, "{levels:?} at {threshold}: {l:?}");
                    }
                }
            }
        }
    }
}
