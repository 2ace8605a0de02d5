//! How long does finding the route for a request take, as the route table grows?

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use proxy_core::Config;
use proxy_core::router::RouteTable;

/// A listener with `n` prefix routes for distinct hosts, then a catch-all.
fn table(n: usize) -> RouteTable {
    let mut yaml = String::from("listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "      - match: {{ prefix: /api/v{i}, host: \"svc{i}.example.com\" }}\n        direct_response: {{ status: 200 }}\n"
        ));
    }
    yaml.push_str("      - match: { prefix: /, headers: [{ name: x-canary, exact: \"1\" }] }\n        direct_response: { status: 200 }\n");
    yaml.push_str("      - match: { prefix: / }\n        direct_response: { status: 200 }\n");
    let config = Config::from_yaml(&yaml).expect("bench config is valid");
    RouteTable::new(config.listeners[0].routes.clone())
}

fn route_match(c: &mut Criterion) {
    let mut group = c.benchmark_group("router/find");
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", HeaderValue::from_static("bench"));
    headers.insert("accept", HeaderValue::from_static("*/*"));
    for n in [1usize, 10, 100] {
        let t = table(n);
        let last = format!("svc{}.example.com:8080", n - 1);
        let path = format!("/api/v{}/items", n - 1);
        group.bench_with_input(BenchmarkId::new("last_host_route", n), &n, |b, _| {
            b.iter(|| black_box(t.find(black_box(&last), black_box(&path), &headers)))
        });
        group.bench_with_input(BenchmarkId::new("catch_all", n), &n, |b, _| {
            b.iter(|| black_box(t.find(black_box("other.test"), black_box("/"), &headers)))
        });
    }
    group.finish();
}

criterion_group!(benches, route_match);
criterion_main!(benches);
