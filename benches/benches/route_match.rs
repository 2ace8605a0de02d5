//! How long does finding the route for a request take, as the route table grows? And how long
//! does building the lookup take (it is on the live-configuration path)?

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use proxy_core::Config;
use proxy_core::config::{HostMatch, PathMatch, RouteConfig};
use proxy_core::router::RouteTable;

/// `n` prefix routes spread over `hosts` hosts (`/api/v{i}/` on `svc{i % hosts}.example.com`),
/// then a canary route and a catch-all.
fn routes(n: usize, hosts: usize) -> Vec<RouteConfig> {
    let yaml = "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: { prefix: /, headers: [{ name: x-canary, exact: \"1\" }] }\n        direct_response: { status: 200 }\n      - match: { prefix: / }\n        direct_response: { status: 200 }\n";
    let config = Config::from_yaml(yaml).expect("bench config is valid");
    let tail = config.listeners[0].routes.clone();
    let mut routes: Vec<RouteConfig> = (0..n)
        .map(|i| {
            let mut route = tail[1].clone();
            route.matcher.host = HostMatch::Exact(format!("svc{}.example.com", i % hosts));
            route.matcher.path = PathMatch::Prefix(format!("/api/v{i}/"));
            route
        })
        .collect();
    routes.extend(tail);
    routes
}

fn route_match(c: &mut Criterion) {
    let mut group = c.benchmark_group("router/find");
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", HeaderValue::from_static("bench"));
    headers.insert("accept", HeaderValue::from_static("*/*"));
    for (n, hosts) in [
        (1, 1),
        (100, 1),
        (100, 100),
        (10_000, 1),
        (10_000, 100),
        (10_000, 10_000),
        (100_000, 1),
        (100_000, 100),
        (100_000, 10_000),
    ] {
        let t = RouteTable::new(routes(n, hosts));
        let last = format!("svc{}.example.com:8080", (n - 1) % hosts);
        let path = format!("/api/v{}/items", n - 1);
        let id = format!("{n}_routes_{hosts}_hosts");
        group.bench_with_input(BenchmarkId::new("last_host_route", &id), &n, |b, _| {
            b.iter(|| black_box(t.find(black_box(&last), black_box(&path), &headers)))
        });
        group.bench_with_input(BenchmarkId::new("catch_all", &id), &n, |b, _| {
            b.iter(|| black_box(t.find(black_box("other.test"), black_box("/"), &headers)))
        });
        if n <= 10_000 {
            // The scan the index replaced, for the ratio.
            group.bench_with_input(BenchmarkId::new("last_host_route_scan", &id), &n, |b, _| {
                b.iter(|| {
                    black_box(t.position_by_scan(black_box(&last), black_box(&path), &headers))
                })
            });
        }
    }
    group.finish();

    let mut build = c.benchmark_group("router/build");
    build.sample_size(10);
    for (n, hosts) in [(10_000, 100), (100_000, 10_000)] {
        let list = routes(n, hosts);
        build.bench_with_input(
            BenchmarkId::new("table", format!("{n}_routes_{hosts}_hosts")),
            &n,
            |b, _| b.iter(|| black_box(RouteTable::new(list.clone()))),
        );
    }
    build.finish();
}

criterion_group!(benches, route_match);
criterion_main!(benches);
