//! What does one pick cost, per policy, at 10, 100 and 1000 hosts, alone and with a second
//! thread picking from the same balancer? And how does least request compare with what a
//! Rust user would otherwise embed, tower's power-of-two-choices balancer?
//!
//! Every measured pick includes dropping its guard (the in-flight decrement), so one
//! iteration is one whole request's worth of balancer work. Ring hash and maglev get a
//! different hash key each iteration (from a precomputed table of 4096), so their lookups
//! are not served by one hot cache line.
//!
//! `balancer/levels` picks over 100 hosts in 3 localities x 2 priorities, with P0 short of
//! healthy hosts so that both levels take load, locality-weighted for the policies that
//! allow it; `balancer/update` publishes a new list of 1000 hosts (one host replaced, the
//! rest kept with their state) and rebuilds the tables.
//!
//! Run: `cargo bench -p legate-benches --bench balancer_pick -- --warm-up-time 1 --measurement-time 2`

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;

use balancer::{
    Balance, Health, HostSet, HostSpec, LbPolicy, LbSettings, LoadBalancer, LocalCluster,
};
use criterion::{Criterion, criterion_group, criterion_main};
use tower::Service;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::service_fn;

const HOST_COUNTS: [usize; 3] = [10, 100, 1000];
const KEYS: usize = 4096;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 8080))
}

fn host_set(n: usize) -> HostSet {
    HostSet::new((0..n).map(|i| HostSpec::new(addr(i))).collect()).expect("distinct hosts")
}

fn policies() -> [(&'static str, LbPolicy); 5] {
    [
        ("round_robin", LbPolicy::RoundRobin),
        ("least_request", LbPolicy::least_request()),
        ("random", LbPolicy::Random),
        ("ring_hash", LbPolicy::ring_hash()),
        ("maglev", LbPolicy::maglev()),
    ]
}

/// Hash keys for the consistent-hash policies, none for the others.
struct Keys {
    keyed: bool,
    table: Vec<u64>,
    next: usize,
}

impl Keys {
    fn for_policy(policy: &LbPolicy) -> Self {
        Self {
            keyed: matches!(policy, LbPolicy::RingHash(_) | LbPolicy::Maglev(_)),
            table: (0..KEYS as u64)
                .map(|i| balancer::hash_key(&i.to_le_bytes()))
                .collect(),
            next: 0,
        }
    }

    #[inline]
    fn next(&mut self) -> Option<u64> {
        self.next = (self.next + 1) & (KEYS - 1);
        self.keyed.then(|| self.table[self.next])
    }
}

fn pick(c: &mut Criterion) {
    for (name, policy) in policies() {
        for n in HOST_COUNTS {
            let lb = LoadBalancer::new(host_set(n), policy).expect("valid policy");
            let mut group = c.benchmark_group(format!("balancer/pick/{name}/hosts={n}"));

            let mut keys = Keys::for_policy(&policy);
            group.bench_function("single_thread", |b| {
                b.iter(|| {
                    let picked = lb.pick(keys.next());
                    black_box(&picked);
                })
            });

            // A second thread picks for as long as each of these variants is measured:
            // - contended_2_threads: from the same balancer (shared round-robin cursor and
            //   in-flight counters bounce between the two cores);
            // - per_worker_2_threads: from its own balancer over the same host set, as
            //   Legate's workers do (only the hosts' in-flight counters are shared).
            // The two vCPUs here may be siblings of one physical core, so even work that
            // shares nothing runs slower while the other thread spins.
            let own = LoadBalancer::new(lb.hosts().clone(), policy).expect("valid policy");
            for (variant, background) in
                [("contended_2_threads", &lb), ("per_worker_2_threads", &own)]
            {
                let stop = AtomicBool::new(false);
                thread::scope(|scope| {
                    scope.spawn(|| {
                        // Another stream of keys: other requests, other hosts.
                        let mut keys = Keys::for_policy(&policy);
                        keys.next = KEYS / 2;
                        while !stop.load(Ordering::Relaxed) {
                            let picked = background.pick(keys.next());
                            black_box(&picked);
                        }
                    });
                    let mut keys = Keys::for_policy(&policy);
                    group.bench_function(variant, |b| {
                        b.iter(|| {
                            let picked = lb.pick(keys.next());
                            black_box(&picked);
                        })
                    });
                    stop.store(true, Ordering::Relaxed);
                });
            }
            group.finish();
        }
    }
}

/// 100 hosts: priority `i % 2`, locality `i % 3` (weights 1, 2, 3); a third of P0 unhealthy
/// (1.4 * 2/3 = 93%: P1 takes 7%).
fn levels_set() -> HostSet {
    HostSet::new(
        (0..100)
            .map(|i| {
                let locality = (i % 3) as u32;
                let health = if i % 2 == 0 && i % 6 == 0 {
                    Health::Unhealthy
                } else {
                    Health::Healthy
                };
                HostSpec::new(addr(i))
                    .with_priority((i % 2) as u32)
                    .with_locality(locality, locality + 1)
                    .with_health(health)
            })
            .collect(),
    )
    .expect("distinct hosts")
}

fn levels(c: &mut Criterion) {
    let mut group = c.benchmark_group("balancer/levels/hosts=100");
    for (name, policy) in policies() {
        let settings = LbSettings {
            locality_weighted: !policy.hashes(),
            ..LbSettings::default()
        };
        let lb = LoadBalancer::with_settings(levels_set(), policy, settings).expect("valid");
        let mut keys = Keys::for_policy(&policy);
        group.bench_function(name, |b| {
            b.iter(|| {
                let picked = lb.pick(keys.next());
                black_box(&picked);
            })
        });
    }
    group.finish();
}

/// Zone-aware routing: 100 hosts in 3 zones (20/50/30) from a fleet spread 40/40/20, so that
/// picks are sampled and some cross zones.
fn zones(c: &mut Criterion) {
    let zone_of = |i: usize, split: [usize; 2]| {
        if i < split[0] {
            1
        } else if i < split[1] {
            2
        } else {
            3
        }
    };
    let upstream = HostSet::new(
        (0..100)
            .map(|i| HostSpec::new(addr(i)).with_locality(zone_of(i, [20, 70]), 0))
            .collect(),
    )
    .expect("distinct hosts");
    let fleet = HostSet::new(
        (0..10)
            .map(|i| HostSpec::new(addr(1000 + i)).with_locality(zone_of(i, [4, 8]), 0))
            .collect(),
    )
    .expect("distinct hosts");
    let mut group = c.benchmark_group("balancer/zones/hosts=100");
    for (name, policy) in [
        ("round_robin", LbPolicy::RoundRobin),
        ("least_request", LbPolicy::least_request()),
    ] {
        let lb = LoadBalancer::with_local_cluster(
            upstream.clone(),
            policy,
            LbSettings::default(),
            Some(LocalCluster {
                hosts: fleet.clone(),
                locality: 1,
            }),
        )
        .expect("valid");
        group.bench_function(name, |b| {
            b.iter(|| {
                let picked = lb.pick(None);
                black_box(&picked);
            })
        });
    }
    group.finish();
}

fn update(c: &mut Criterion) {
    let mut group = c.benchmark_group("balancer/update/hosts=1000");
    for (name, policy) in [
        ("round_robin", LbPolicy::RoundRobin),
        ("least_request", LbPolicy::least_request()),
        ("maglev", LbPolicy::maglev()),
    ] {
        let hosts = host_set(1000);
        let lb = LoadBalancer::new(hosts.clone(), policy).expect("valid");
        let lists: [Vec<HostSpec>; 2] = [1000, 1001].map(|last| {
            (0..999)
                .chain([last])
                .map(|i| HostSpec::new(addr(i)))
                .collect()
        });
        let mut turn = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                turn ^= 1;
                hosts.update(lists[turn].clone()).expect("distinct hosts");
                lb.refresh();
            })
        });
    }
    group.finish();
}

type ReadyService = tower::util::ServiceFn<fn(u64) -> Ready<Result<u64, Infallible>>>;

/// A service that is always ready and answers at once.
fn ready_service() -> ReadyService {
    let answer: fn(u64) -> Ready<Result<u64, Infallible>> = |req| ready(Ok(req));
    service_fn(answer)
}

/// One request through a tower service: `poll_ready` (must be ready), `call`, and one poll
/// of the response future (must be done), all with a no-op waker; no runtime involved.
#[inline]
fn one_request<S>(svc: &mut S, cx: &mut Context<'_>, req: u64)
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    match svc.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        other => panic!("service not ready: {other:?}"),
    }
    let response = pin!(svc.call(req));
    match response.poll(cx) {
        Poll::Ready(Ok(r)) => {
            black_box(r);
        }
        _ => panic!("response not ready"),
    }
}

/// Least request (P2C over equal weights) against `tower::balance::p2c` over the same
/// number of always-ready services. Three rows:
/// - `legate_pick`: `LoadBalancer::pick` + guard drop, what an embedder calls per request;
/// - `legate_tower_adapter`: the same balancer as a tower service (`balancer::Balance`):
///   poll_ready + call + completing the response future;
/// - `tower_p2c`: `p2c::Balance` over a `ServiceList` of the same services, each wrapped in
///   `PendingRequests` (tower's in-flight counter, the analogue of least request's): the
///   same poll_ready + call + completion.
fn p2c_vs_tower(c: &mut Criterion) {
    let mut cx = Context::from_waker(Waker::noop());
    for n in HOST_COUNTS {
        let mut group = c.benchmark_group(format!("balancer/p2c_vs_tower/hosts={n}"));

        let lb = LoadBalancer::new(host_set(n), LbPolicy::least_request()).expect("valid");
        group.bench_function("legate_pick", |b| {
            b.iter(|| {
                let picked = lb.pick(None);
                black_box(&picked);
            })
        });

        let endpoints = (0..n)
            .map(|i| (HostSpec::new(addr(i)), ready_service()))
            .collect();
        let mut adapter = Balance::new(endpoints, LbPolicy::least_request()).expect("valid");
        let mut req = 0u64;
        group.bench_function("legate_tower_adapter", |b| {
            b.iter(|| {
                req += 1;
                one_request(&mut adapter, &mut cx, req);
            })
        });

        let services: Vec<_> = (0..n)
            .map(|_| PendingRequests::new(ready_service(), CompleteOnResponse::default()))
            .collect();
        let mut p2c = tower::balance::p2c::Balance::new(ServiceList::new(services));
        group.bench_function("tower_p2c", |b| {
            b.iter(|| {
                req += 1;
                one_request(&mut p2c, &mut cx, req);
            })
        });
        group.finish();
    }
}

criterion_group!(benches, pick, levels, zones, update, p2c_vs_tower);
criterion_main!(benches);
