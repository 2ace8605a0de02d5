//! Eight threads pick while another thread keeps changing the host set.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use balancer::{Health, HostSet, HostSpec, LbPolicy, LoadBalancer, Picked};
use common::*;

const PICKERS: usize = 8;
/// The updater publishes at least this many changes, and goes on until the pickers have
/// made at least `MIN_PICKS` picks, so picks and updates really overlap.
const UPDATES: usize = 200;
const MIN_PICKS: u64 = 50_000;

/// The updater cycles through adding, removing, reweighting and flipping the health of
/// hosts; hosts 0..4 are always present and healthy, so every pick must find a host. Each
/// picker holds a few guards at a time. At the end nothing is left in flight.
fn pick_while_updating(policy: LbPolicy, shared: bool) {
    let hosts = HostSet::new(equal_specs(8)).unwrap();
    let shared_lb = Arc::new(LoadBalancer::new(hosts.clone(), policy).unwrap());
    // Every address the set ever holds: picks must come from it.
    let universe: HashSet<SocketAddr> = (0..16).map(addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let picks = Arc::new(AtomicU64::new(0));
    let survivors: Arc<Mutex<Vec<Arc<LoadBalancer>>>> = Arc::default();

    thread::scope(|scope| {
        for t in 0..PICKERS {
            // Either all threads share one balancer, or each has its own over the same set.
            let lb = if shared {
                Arc::clone(&shared_lb)
            } else {
                Arc::new(LoadBalancer::new(hosts.clone(), policy).unwrap())
            };
            survivors.lock().unwrap().push(Arc::clone(&lb));
            let (stop, picks, universe) = (&stop, &picks, &universe);
            scope.spawn(move || {
                let mut held: Vec<Picked> = Vec::new();
                let mut i = t as u64 * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let picked = lb
                        .pick(key_for(&policy, i))
                        .expect("hosts 0..4 are always there");
                    assert!(universe.contains(&picked.addr()), "{:?}", picked.addr());
                    assert!(picked.active_requests() >= 1);
                    held.push(picked);
                    if held.len() > 3 {
                        drop(held.remove(0));
                    }
                    picks.fetch_add(1, Ordering::Relaxed);
                }
            });
        }

        let updater_hosts = hosts.clone();
        let (stop, picks) = (&stop, &picks);
        scope.spawn(move || {
            for round in 0.. {
                if round >= UPDATES && picks.load(Ordering::Relaxed) >= MIN_PICKS {
                    break;
                }
                let extra = round % 9; // 0..8 extra hosts beyond the four fixed ones
                let mut list: Vec<HostSpec> = (0..4).map(|i| HostSpec::new(addr(i))).collect();
                for j in 0..extra {
                    let health = match (round + j) % 4 {
                        0 => Health::Healthy,
                        1 => Health::Degraded,
                        2 => Health::Unhealthy,
                        _ => Health::Ejected,
                    };
                    list.push(
                        HostSpec::new(addr(4 + (round + j) % 12))
                            .with_weight(1 + ((round * 7 + j) % 5) as u32)
                            .with_health(health),
                    );
                }
                list.sort_by_key(|s| s.addr);
                list.dedup_by_key(|s| s.addr);
                updater_hosts.update(list).unwrap();
                if round % 3 == 0 {
                    updater_hosts.set_health(addr(round % 4), Health::Healthy);
                    updater_hosts
                        .set_weight(addr(round % 4), 1 + (round % 3) as u32)
                        .unwrap();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    });

    assert!(picks.load(Ordering::Relaxed) >= MIN_PICKS);
    let snapshot = hosts.snapshot();
    for host in snapshot.hosts() {
        assert_eq!(host.active_requests(), 0, "{host:?}");
    }
    // The balancers caught up with the last version.
    for lb in survivors.lock().unwrap().iter() {
        let picked = lb.pick(key_for(&policy, 0)).unwrap();
        assert!(snapshot.position(picked.addr()).is_some());
    }
}

#[test]
fn eight_threads_share_a_balancer_while_the_set_changes() {
    for policy in all_policies() {
        pick_while_updating(policy, true);
    }
}

#[test]
fn eight_per_thread_balancers_follow_one_changing_set() {
    for policy in all_policies() {
        pick_while_updating(policy, false);
    }
}

#[test]
fn updates_keep_the_in_flight_count_of_hosts_that_stay() {
    let hosts = HostSet::new(equal_specs(3)).unwrap();
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
    let held: Vec<Picked> = (0..3).map(|_| lb.pick(None).unwrap()).collect();
    assert!(held.iter().all(|p| p.active_requests() == 1));

    // Host 1 leaves, host 0 is reweighted, host 2 turns degraded, host 5 joins.
    hosts
        .update(vec![
            HostSpec::new(addr(0)).with_weight(4),
            HostSpec::new(addr(2)).with_health(Health::Degraded),
            HostSpec::new(addr(5)),
        ])
        .unwrap();
    let snapshot = hosts.snapshot();
    let count = |a| {
        snapshot
            .get(snapshot.position(a).unwrap())
            .unwrap()
            .active_requests()
    };
    assert_eq!(count(addr(0)), 1);
    assert_eq!(count(addr(2)), 1);
    assert_eq!(count(addr(5)), 0);
    assert_eq!(snapshot.get(0).unwrap().weight(), 4);

    // The removed host's guard still works and releases its own count.
    let removed = held.iter().find(|p| p.addr() == addr(1)).unwrap();
    assert_eq!(removed.active_requests(), 1);
    drop(held);
    assert_eq!(count(addr(0)), 0);
    assert_eq!(count(addr(2)), 0);
}
