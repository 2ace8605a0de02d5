//! How long does finding the route for a request take, as the route table grows? How long
//! does building the lookup take, and how much memory does it hold (it is built on every
//! config change)?
//!
//! Two shapes of table: `flat`, routes that each name their host (`match.host`) in one list,
//! and `vhosts`, the same routes grouped into virtual hosts by domain.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use proxy_core::Config;
use proxy_core::config::{
    Domain, HostMatch, PathMatch, RouteConfig, RouteConfiguration, RouteFilters, VirtualHostConfig,
};
use proxy_core::router::RouteTable;

/// Bytes allocated and not yet freed, to weigh the tables.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is an
// atomic, which neither allocates nor re-enters the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A canary route (header match) and a catch-all, as a config would have them.
fn tail() -> Vec<Arc<RouteConfig>> {
    let yaml = "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: { prefix: /, headers: [{ name: x-canary, exact: \"1\" }] }\n        direct_response: { status: 200 }\n      - match: { prefix: / }\n        direct_response: { status: 200 }\n";
    let config = Config::from_yaml(yaml).expect("bench config is valid");
    config.listeners[0].route_config.routes.to_vec()
}

fn host_name(h: usize) -> String {
    format!("svc{h}.example.com")
}

/// Route `i`: prefix `/api/v{i}/`, on host `i % hosts`.
fn route(template: &RouteConfig, i: usize, host: HostMatch) -> Arc<RouteConfig> {
    let mut route = template.clone();
    route.matcher.host = host;
    route.matcher.path = PathMatch::Prefix(format!("/api/v{i}/"));
    Arc::new(route)
}

/// `n` prefix routes, each naming its host, then the canary and the catch-all.
fn flat(n: usize, hosts: usize) -> RouteConfiguration {
    let tail = tail();
    let mut routes: Vec<Arc<RouteConfig>> = (0..n)
        .map(|i| route(&tail[1], i, HostMatch::Exact(host_name(i % hosts))))
        .collect();
    routes.extend(tail);
    RouteConfiguration::flat(routes)
}

/// The same `n` routes in `hosts` virtual hosts (`svcH.example.com` and `*.svcH.example.com`),
/// then a `*` host with the canary and the catch-all.
fn vhosts(n: usize, hosts: usize) -> RouteConfiguration {
    let tail = tail();
    let mut routes = Vec::with_capacity(n + 2);
    let mut virtual_hosts = Vec::with_capacity(hosts + 1);
    let host = |name: String, domains: Vec<Domain>, span| VirtualHostConfig {
        name,
        domains,
        routes: span,
        retry_policy: None,
        filters: RouteFilters::default(),
        rate_limits: Vec::new(),
    };
    for h in 0..hosts {
        let start = routes.len();
        routes.extend(
            (h..n)
                .step_by(hosts)
                .map(|i| route(&tail[1], i, HostMatch::Any)),
        );
        let name = host_name(h);
        let wildcard = Domain::Suffix(format!(".{name}"));
        virtual_hosts.push(host(
            format!("h{h}"),
            vec![Domain::Exact(name), wildcard],
            start..routes.len(),
        ));
    }
    let start = routes.len();
    routes.extend(tail);
    virtual_hosts.push(host("rest".into(), vec![Domain::Any], start..routes.len()));
    RouteConfiguration {
        routes: Arc::new(routes),
        virtual_hosts,
        flat: false,
        ignore_port_in_host_matching: false,
        cluster_names: Default::default(),
    }
}

const SIZES: [(usize, usize); 9] = [
    (1, 1),
    (100, 1),
    (100, 100),
    (10_000, 1),
    (10_000, 100),
    (10_000, 10_000),
    (100_000, 1),
    (100_000, 100),
    (100_000, 10_000),
];

fn route_match(c: &mut Criterion) {
    let mut group = c.benchmark_group("router/find");
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", HeaderValue::from_static("bench"));
    headers.insert("accept", HeaderValue::from_static("*/*"));
    for (shape, make) in [
        ("flat", flat as fn(usize, usize) -> RouteConfiguration),
        ("vhosts", vhosts),
    ] {
        for (n, hosts) in SIZES {
            let t = RouteTable::new(make(n, hosts));
            let last = format!("{}:8080", host_name((n - 1) % hosts));
            let path = format!("/api/v{}/items", n - 1);
            let id = format!("{shape}/{n}_routes_{hosts}_hosts");
            let found = t.find(&last, &path, None, &headers).route;
            assert_eq!(found, t.find_by_scan(&last, &path, None, &headers).route);
            group.bench_with_input(BenchmarkId::new("last_host_route", &id), &n, |b, _| {
                b.iter(|| black_box(t.find(black_box(&last), black_box(&path), None, &headers)))
            });
            if shape == "vhosts" {
                let wildcard = format!("eu.{}", host_name((n - 1) % hosts));
                group.bench_with_input(BenchmarkId::new("wildcard_host", &id), &n, |b, _| {
                    b.iter(|| {
                        black_box(t.find(black_box(&wildcard), black_box(&path), None, &headers))
                    })
                });
            }
            group.bench_with_input(BenchmarkId::new("catch_all", &id), &n, |b, _| {
                b.iter(|| {
                    black_box(t.find(black_box("other.test"), black_box("/"), None, &headers))
                })
            });
            if n <= 10_000 && shape == "flat" {
                // The scan the index replaced, for the ratio.
                group.bench_with_input(
                    BenchmarkId::new("last_host_route_scan", &id),
                    &n,
                    |b, _| {
                        b.iter(|| {
                            black_box(t.find_by_scan(
                                black_box(&last),
                                black_box(&path),
                                None,
                                &headers,
                            ))
                        })
                    },
                );
            }
        }
    }
    group.finish();

    let mut build = c.benchmark_group("router/build");
    build.sample_size(10);
    for (shape, make) in [
        ("flat", flat as fn(usize, usize) -> RouteConfiguration),
        ("vhosts", vhosts),
    ] {
        for (n, hosts) in [(10_000, 100), (100_000, 1), (100_000, 10_000)] {
            let id = format!("{shape}/{n}_routes_{hosts}_hosts");
            let config = weigh(&id, || make(n, hosts));
            build.bench_with_input(BenchmarkId::new("table", &id), &n, |b, _| {
                b.iter(|| black_box(RouteTable::new(config.clone())))
            });
        }
    }
    build.finish();
}

/// Prints what the routes and their lookup hold in memory, and gives back the routes.
fn weigh(id: &str, make: impl FnOnce() -> RouteConfiguration) -> RouteConfiguration {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let config = make();
    let routes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    // The table shares the routes with the config; what it adds is the lookup.
    let table = RouteTable::new(config.clone());
    let index = LIVE_BYTES.load(Ordering::Relaxed) - before - routes;
    println!(
        "router/memory/{id}: routes {:.1} MiB ({} bytes per route), lookup {:.1} MiB ({} bytes per route)",
        routes as f64 / (1 << 20) as f64,
        routes / config.routes.len().max(1),
        index as f64 / (1 << 20) as f64,
        index / config.routes.len().max(1),
    );
    drop(black_box(table));
    config
}

criterion_group!(benches, route_match);
criterion_main!(benches);
