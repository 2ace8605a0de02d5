//! No pick allocates: a counting global allocator watches 10,000 picks of every policy
//! (after the first, which may build the tables).

mod common;

use balancer::{Health, HostSet, LbPolicy, LeastRequestOptions, LoadBalancer};
use common::*;

#[global_allocator]
static GLOBAL: alloc_meter::Counting = alloc_meter::Counting;

#[test]
fn picks_do_not_allocate() {
    // The meter works.
    assert!(alloc_meter::allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);

    let mut policies = all_policies();
    policies.push(LbPolicy::LeastRequest(LeastRequestOptions {
        choice_count: 3,
        active_request_bias: 0.5,
    }));
    for weights in [vec![1u32; 100], (1..=100).collect::<Vec<u32>>()] {
        for &policy in &policies {
            let hosts = HostSet::new(specs(&weights)).expect("valid hosts");
            // Some degraded hosts, so the healthy/degraded split is exercised too.
            for i in 0..35 {
                hosts.set_health(addr(i), Health::Degraded);
            }
            let lb = LoadBalancer::new(hosts, policy).expect("valid policy");
            drop(lb.pick(Some(1)));
            let mut held = Vec::with_capacity(16);
            let count = alloc_meter::allocations_during(|| {
                for i in 0..10_000u64 {
                    let picked = lb.pick(key_for(&policy, i)).expect("a host");
                    if held.len() < held.capacity() {
                        held.push(picked);
                    }
                }
            });
            assert_eq!(count, 0, "{} allocated {count} times", policy.name());
        }
    }
}
