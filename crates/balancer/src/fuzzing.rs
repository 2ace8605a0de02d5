//! The fuzz target of the balancer: under arbitrary host-set updates, health and weight changes and picks, with
//! every policy: a pick is a host of the current set, never unavailable outside panic mode;
//! a non-empty set always yields one unless panic mode is off; consistent hashing maps one key
//! to one host while nothing changes; in-flight counts return to zero.
//! `fuzz/fuzz_targets/balancer.rs` runs it; the workspace's tests/fuzz_corpus.rs replays the
//! corpus and `fuzz/regressions/balancer`.

use std::net::SocketAddr;

use crate::{
    Health, HostSet, HostSpec, LbPolicy, LeastRequestOptions, LoadBalancer, MaglevOptions, Picked,
    RingHashOptions,
};

/// Reads the fuzz input a byte at a time; zeros once it runs out.
struct Input<'a>(std::slice::Iter<'a, u8>);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        self.0.next().copied().unwrap_or(0)
    }

    fn done(&self) -> bool {
        self.0.len() == 0
    }
}

fn addr(index: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1 + index % 12], 80))
}

fn health(byte: u8) -> Health {
    match byte % 4 {
        0 => Health::Healthy,
        1 => Health::Degraded,
        2 => Health::Unhealthy,
        _ => Health::Ejected,
    }
}

/// Up to 8 hosts (addresses may repeat: the set refuses that).
fn specs(input: &mut Input<'_>) -> Vec<HostSpec> {
    (0..input.byte() % 9)
        .map(|_| {
            HostSpec::new(addr(input.byte()))
                .with_weight(u32::from(input.byte() % 5))
                .with_health(health(input.byte()))
        })
        .collect()
}

fn policy(input: &mut Input<'_>) -> LbPolicy {
    match input.byte() % 5 {
        0 => LbPolicy::RoundRobin,
        1 => LbPolicy::LeastRequest(LeastRequestOptions {
            choice_count: u32::from(input.byte() % 4),
            active_request_bias: f64::from(input.byte() % 3) / 2.0,
        }),
        2 => LbPolicy::Random,
        3 => LbPolicy::RingHash(RingHashOptions {
            minimum_ring_size: u64::from(input.byte()) * 4,
            maximum_ring_size: u64::from(input.byte()) * 16,
        }),
        _ => LbPolicy::Maglev(MaglevOptions {
            table_size: [7, 13, 100, 251, 1009][usize::from(input.byte() % 5)],
        }),
    }
}

/// Reads `data` as a policy, a host set and a run of operations on them.
pub fn operations(data: &[u8]) {
    let mut input = Input(data.iter());
    let policy = policy(&mut input);
    let threshold = [50.0, 0.0, 100.0, 30.0][usize::from(input.byte() % 4)];
    let Ok(hosts) = HostSet::new(specs(&mut input)) else {
        return;
    };
    let Ok(lb) = LoadBalancer::with_panic_threshold(hosts.clone(), policy, threshold) else {
        return;
    };
    let hashing = matches!(lb.policy(), LbPolicy::RingHash(_) | LbPolicy::Maglev(_));
    let mut held: Vec<Picked> = Vec::new();
    while !input.done() {
        match input.byte() % 6 {
            0 => {
                let _ = hosts.update(specs(&mut input));
            }
            1 => {
                hosts.set_health(addr(input.byte()), health(input.byte()));
            }
            2 => {
                let _ = hosts.set_weight(addr(input.byte()), u32::from(input.byte() % 5));
            }
            3 => {
                let key = u64::from(input.byte()).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let picked = pick(&lb, &hosts, Some(key));
                if hashing && let Some(first) = &picked {
                    let again = pick(&lb, &hosts, Some(key)).map(|p| p.addr());
                    assert_eq!(again, Some(first.addr()), "one key, two hosts");
                }
                if let Some(picked) = picked
                    && held.len() < 16
                {
                    held.push(picked);
                }
            }
            4 => held.clear(),
            _ => {
                pick(&lb, &hosts, None);
            }
        }
    }
    drop(held);
    for host in hosts.snapshot().hosts() {
        assert_eq!(host.active_requests(), 0, "{} still counted", host.addr());
    }
}

/// One pick, checked against the set it was made from.
fn pick(lb: &LoadBalancer, hosts: &HostSet, key: Option<u64>) -> Option<Picked> {
    let snapshot = hosts.snapshot();
    let picked = lb.pick(key);
    let available = snapshot
        .hosts()
        .any(|h| matches!(h.health(), Health::Healthy | Health::Degraded));
    match &picked {
        Some(p) => {
            assert!(
                snapshot.position(p.addr()).is_some(),
                "{} is not in the set",
                p.addr()
            );
            assert!(p.active_requests() >= 1);
            if !lb.in_panic() {
                assert!(
                    matches!(p.host().health(), Health::Healthy | Health::Degraded),
                    "{} picked while {:?}",
                    p.addr(),
                    p.host().health()
                );
            }
        }
        None => assert!(
            snapshot.is_empty() || (lb.panic_threshold() == 0.0 && !available),
            "no pick from {} hosts",
            snapshot.len()
        ),
    }
    picked
}
