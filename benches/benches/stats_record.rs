//! What does recording a stat cost a worker, does it stay flat as workers are added, and what
//! does a scrape (merge + render) of a large registry cost?
//!
//! `stats/histogram_record/threads/N` times one worker recording into its own shard while
//! N - 1 others record into theirs. Each batch of 1000 records is timed on its own and the
//! median batch is reported: on a machine with fewer cores than threads (CI's has 2), the
//! time a thread spends descheduled is the scheduler's, not the recording's. The rival
//! `shared_fetch_add/threads/N` has every thread `fetch_add` one shared atomic, the cost this
//! crate's single-writer cells avoid.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stats::{Histogram, Registry};

const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
const BATCH: u64 = 1000;

/// 1024 latencies from 50 us to ~1 s, log-uniform (a deterministic xorshift).
fn latencies() -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
            (50.0 * (20_000f64).powf(unit)) as u64
        })
        .collect()
}

fn counter_inc(c: &mut Criterion) {
    let mut group = c.benchmark_group("stats/counter_inc");
    let registry = Registry::new();
    let family = registry.counter("rq_total", "", &["listener"]);
    let counter = registry.shard(&[]).counter(family, &["public"]);
    group.bench_function("single_writer", |b| b.iter(|| black_box(&counter).inc()));
    let shared = AtomicU64::new(0);
    group.bench_function("fetch_add_uncontended", |b| {
        b.iter(|| black_box(&shared).fetch_add(1, Ordering::Relaxed))
    });
    group.finish();
}

/// Runs `record` in batches of `BATCH`, timing each, and returns `iters` times the median
/// batch's time per record.
fn median_batches(iters: u64, mut record: impl FnMut(u64)) -> Duration {
    let batches = iters.div_ceil(BATCH).max(1);
    let mut times = Vec::with_capacity(batches as usize);
    let mut i = 0u64;
    for _ in 0..batches {
        let start = Instant::now();
        for _ in 0..BATCH {
            record(i);
            i = i.wrapping_add(1);
        }
        times.push(start.elapsed());
    }
    times.sort_unstable();
    Duration::from_secs_f64(times[times.len() / 2].as_secs_f64() * iters as f64 / BATCH as f64)
}

/// Starts `n` threads that call `work` in a loop until the returned guard is dropped.
struct Background {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Background {
    fn start<W: FnMut(u64) + Send + 'static>(n: usize, mut make: impl FnMut() -> W) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let mut work = make();
                thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..BATCH {
                            work(i);
                            i = i.wrapping_add(1);
                        }
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().expect("background recorder panicked");
        }
    }
}

fn histogram_record(c: &mut Criterion) {
    let values: Arc<[u64]> = latencies().into();
    let registry = Registry::new();
    let family = registry.histogram("upstream_rq_time", "", &["cluster"]);
    let handle = |worker: usize| -> Histogram {
        registry
            .shard(&[("worker", &worker.to_string())])
            .histogram(family, &["backend"])
    };

    let mut group = c.benchmark_group("stats/histogram_record");
    let own = handle(0);
    group.bench_function("single", |b| {
        let mut i = 0usize;
        b.iter(|| {
            own.record(black_box(values[i & 1023]));
            i = i.wrapping_add(1);
        })
    });

    for threads in THREADS {
        let mut next_worker = 1;
        let _others = Background::start(threads - 1, || {
            let h = handle(next_worker);
            next_worker += 1;
            let values = Arc::clone(&values);
            move |i: u64| h.record(black_box(values[i as usize & 1023]))
        });
        let own = handle(100 + threads);
        group.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, _| {
            b.iter_custom(|iters| {
                median_batches(iters, |i| own.record(black_box(values[i as usize & 1023])))
            })
        });
    }

    for threads in THREADS {
        let shared = Arc::new(AtomicU64::new(0));
        let _others = Background::start(threads - 1, || {
            let shared = Arc::clone(&shared);
            move |i: u64| {
                shared.fetch_add(black_box(i), Ordering::Relaxed);
            }
        });
        group.bench_with_input(
            BenchmarkId::new("shared_fetch_add/threads", threads),
            &threads,
            |b, _| {
                b.iter_custom(|iters| {
                    median_batches(iters, |i| {
                        shared.fetch_add(black_box(i), Ordering::Relaxed);
                    })
                })
            },
        );
    }
    group.finish();
}

const SHARDS: usize = 16;

/// A registry of 16 shards holding 10 000 series cells: 80 % counters, 15 % gauges, 5 %
/// histograms (200 latencies each). The handles are dropped: their values stay. With `spread`, series `i` lives in shard `i % 16` only
/// (10 000 distinct series); without, 625 series each live in all 16 shards.
fn big_registry(spread: bool) -> Registry {
    let values = latencies();
    let registry = Registry::new();
    let requests = registry.counter(
        "upstream_rq_total",
        "Requests sent upstream.",
        &["cluster", "code_class"],
    );
    let active = registry.gauge(
        "upstream_cx_active",
        "Open upstream connections.",
        &["cluster"],
    );
    let time = registry.histogram("upstream_rq_time", "Upstream request time.", &["cluster"]);
    let shards: Vec<_> = (0..SHARDS)
        .map(|w| registry.shard(&[("worker", &w.to_string())]))
        .collect();
    let series = if spread { 10_000 } else { 10_000 / SHARDS };
    for i in 0..series {
        let cluster = format!("cluster_{}", i / 20);
        let owners: Vec<&stats::Shard> = if spread {
            vec![&shards[i % SHARDS]]
        } else {
            shards.iter().collect()
        };
        for shard in owners {
            match i % 20 {
                0 => {
                    let h = shard.histogram(time, &[&cluster]);
                    for k in 0..200 {
                        h.record(values[(i + k) & 1023]);
                    }
                }
                1..=3 => {
                    let g = shard.gauge(active, &[&format!("{cluster}_{}", i % 20)]);
                    g.set(i as i64);
                }
                k => {
                    let c = shard.counter(requests, &[&cluster, &format!("c{k}")]);
                    c.add(i as u64);
                }
            }
        }
    }
    registry
}

fn merge_render(c: &mut Criterion) {
    let mut group = c.benchmark_group("stats/merge_render");
    for (spread, name) in [
        (true, "10000_series_1_shard_each"),
        (false, "625_series_16_shards_each"),
    ] {
        let registry = big_registry(spread);
        let snapshot = registry.snapshot();
        eprintln!(
            "{name}: prometheus {} bytes, text {} bytes",
            snapshot.render_prometheus().len(),
            snapshot.render_text(None).len()
        );
        group.bench_function(BenchmarkId::new("snapshot", name), |b| {
            b.iter(|| black_box(registry.snapshot()))
        });
        group.bench_function(BenchmarkId::new("snapshot_prometheus", name), |b| {
            b.iter(|| black_box(registry.snapshot().render_prometheus()))
        });
        group.bench_function(BenchmarkId::new("snapshot_text", name), |b| {
            b.iter(|| black_box(registry.snapshot().render_text(None)))
        });
    }
    group.finish();
}

criterion_group!(benches, counter_inc, histogram_record, merge_render);
criterion_main!(benches);
