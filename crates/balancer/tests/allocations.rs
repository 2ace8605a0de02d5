//! No pick allocates: a counting global allocator watches 10,000 picks of every policy
//! (after the first, which may build the tables).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use balancer::{Health, HostSet, LbPolicy, LeastRequestOptions, LoadBalancer};
use common::*;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialized thread-local Cell, which neither allocates nor re-enters the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn picks_do_not_allocate() {
    // The meter works.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);

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
            let count = allocations_during(|| {
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
