//! What does one pick cost?

use std::hint::black_box;

use balancer::RoundRobin;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn pick(c: &mut Criterion) {
    let mut group = c.benchmark_group("balancer/pick/round_robin");
    for hosts in [10usize, 100, 1000] {
        let rr = RoundRobin::new(hosts).expect("hosts > 0");
        group.bench_with_input(BenchmarkId::new("hosts", hosts), &hosts, |b, _| {
            b.iter(|| black_box(rr.pick()))
        });
    }
    group.finish();
}

criterion_group!(benches, pick);
criterion_main!(benches);
