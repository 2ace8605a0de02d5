//! Picks told ahead (`LoadBalancer::peek`), for a proxy to open connections before the
//! requests come (Envoy's predictive preconnect).
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use balancer::{HostSet, HostSpec, LbPolicy, LoadBalancer};
use common::*;

fn set(n: usize) -> HostSet {
    HostSet::new((0..n).map(|i| HostSpec::new(addr(i))).collect()).unwrap()
}

#[test]
fn the_next_picks_go_where_the_peeks_said_in_order() {
    for policy in [LbPolicy::RoundRobin, LbPolicy::Random] {
        let lb = LoadBalancer::new(set(5), policy).unwrap();
        let peeked: Vec<_> = (0..3).map(|_| lb.peek().unwrap()).collect();
        for peek in &peeked {
            let picked = lb.pick(None).unwrap();
            assert_eq!(picked.addr(), peek.addr(), "{}", policy.name());
            assert_eq!(picked.index(), peek.index());
        }
    }
}

#[test]
fn round_robin_peeks_take_the_turns_the_picks_would_have() {
    let plain = LoadBalancer::new(set(4), LbPolicy::RoundRobin).unwrap();
    let peeking = LoadBalancer::new(set(4), LbPolicy::RoundRobin).unwrap();
    // Both start at a random place: align them on the same host first.
    let start = plain.pick(None).unwrap().index();
    while peeking.pick(None).unwrap().index() != start {}
    let peek = peeking.peek().unwrap();
    let expected: Vec<usize> = (0..8).map(|_| plain.pick(None).unwrap().index()).collect();
    assert_eq!(peek.index(), expected[0]);
    let got: Vec<usize> = (0..8)
        .map(|_| peeking.pick(None).unwrap().index())
        .collect();
    assert_eq!(got, expected, "the rotation goes on after the peeked turn");
}

#[test]
fn at_most_one_peek_ahead_per_host() {
    let lb = LoadBalancer::new(set(3), LbPolicy::RoundRobin).unwrap();
    assert!((0..3).all(|_| lb.peek().is_some()));
    assert_eq!(lb.peek(), None, "three hosts, three peeks ahead");
    let _ = lb.pick(None).unwrap();
    assert!(lb.peek().is_some(), "a pick took one: room for another");
}

#[test]
fn a_peeked_host_is_not_counted_in_flight_until_picked() {
    let lb = LoadBalancer::new(set(2), LbPolicy::Random).unwrap();
    let peek = lb.peek().unwrap();
    let host = |i: usize| lb.hosts().snapshot().get(i).unwrap().active_requests();
    assert_eq!(host(peek.index()), 0);
    let picked = lb.pick(None).unwrap();
    assert_eq!(host(peek.index()), 1);
    drop(picked);
    assert_eq!(host(peek.index()), 0);
}

#[test]
fn peeks_made_before_the_hosts_changed_are_dropped() {
    let hosts = set(2);
    let lb = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
    let peek = lb.peek().unwrap();
    // The peeked host leaves: a pick must not hand it out.
    let left: Vec<HostSpec> = (0..2)
        .filter(|&i| addr(i) != peek.addr())
        .map(|i| HostSpec::new(addr(i)))
        .collect();
    hosts.update(left).unwrap();
    for _ in 0..4 {
        assert_ne!(lb.pick(None).unwrap().addr(), peek.addr());
    }
}

#[test]
fn policies_that_cannot_tell_do_not_peek() {
    for policy in all_policies().into_iter().filter(|p| !p.peeks()) {
        let lb = LoadBalancer::new(set(3), policy).unwrap();
        assert_eq!(lb.peek(), None, "{}", policy.name());
    }
}
