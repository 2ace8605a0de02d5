//! Several threads, each recording into its own shard: the merged values are exact.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use stats::{Registry, Value};

const PER_THREAD: u64 = 10_000;

#[test]
fn counts_and_sums_are_exact_across_four_threads() {
    let registry = Registry::new();
    let requests = registry.counter("rq_total", "Requests.", &["listener"]);
    let bytes = registry.counter("rx_bytes_total", "", &[]);
    let active = registry.gauge("cx_active", "Open connections.", &[]);
    let time = registry.histogram("rq_time", "Request time.", &["listener"]);

    // A scraper reads all along: it must see counters only grow, and never disturb the sums.
    let done = Arc::new(AtomicBool::new(false));
    let scraper = {
        let registry = registry.clone();
        let done = Arc::clone(&done);
        thread::spawn(move || {
            let mut last = 0;
            let mut scrapes = 0;
            while !done.load(Ordering::Relaxed) || scrapes == 0 {
                let snapshot = registry.snapshot();
                let now = snapshot.counter("rq_total", &["public"]).unwrap_or(0);
                assert!(now >= last, "counter went back from {last} to {now}");
                last = now;
                let _ = snapshot.render_prometheus();
                scrapes += 1;
            }
            scrapes
        })
    };

    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let shard = registry.shard(&[("worker", &worker.to_string())]);
            let requests = shard.counter(requests, &["public"]);
            let bytes = shard.counter(bytes, &[]);
            let active = shard.gauge(active, &[]);
            let time = shard.histogram(time, &["public"]);
            thread::spawn(move || {
                for i in 1..=PER_THREAD {
                    requests.inc();
                    bytes.add(i);
                    active.inc();
                    time.record(i * (worker + 1));
                    if i % 2 == 0 {
                        active.dec();
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    assert!(scraper.join().unwrap() > 0);

    let snapshot = registry.snapshot();
    let triangle = PER_THREAD * (PER_THREAD + 1) / 2;
    assert_eq!(
        snapshot.counter("rq_total", &["public"]),
        Some(4 * PER_THREAD)
    );
    assert_eq!(snapshot.counter("rx_bytes_total", &[]), Some(4 * triangle));
    assert_eq!(
        snapshot.gauge("cx_active", &[]),
        Some(4 * PER_THREAD as i64 / 2)
    );

    let time = snapshot.histogram("rq_time", &["public"]).unwrap();
    assert_eq!(time.count(), 4 * PER_THREAD);
    assert_eq!(time.sum(), (1 + 2 + 3 + 4) * triangle);
    assert_eq!(time.min(), Some(1));
    assert_eq!(time.max(), Some(4 * PER_THREAD));

    // Per shard: each worker's own part.
    let series = snapshot
        .family("rq_time")
        .unwrap()
        .get(&["public"])
        .unwrap();
    assert_eq!(series.per_shard().len(), 4);
    for (shard, value) in series.per_shard() {
        let worker = shard.index() as u64;
        let labels: Vec<_> = snapshot.shard_labels(*shard).collect();
        assert_eq!(labels, [("worker", worker.to_string().as_str())]);
        let h = value.as_histogram().unwrap();
        assert_eq!(h.count(), PER_THREAD);
        assert_eq!(h.sum(), (worker + 1) * triangle);
        assert_eq!(h.max(), Some((worker + 1) * PER_THREAD));
    }
    let active = snapshot.family("cx_active").unwrap().get(&[]).unwrap();
    for (_, value) in active.per_shard() {
        assert_eq!(*value, Value::Gauge(PER_THREAD as i64 / 2));
    }
}

#[test]
fn a_shared_gauge_adds_up_from_several_threads() {
    let registry = Registry::new();
    let pending = registry.gauge("pending", "", &[]);
    let shard = registry.shard(&[]);
    let gauge = shard.shared_gauge(pending, &[]);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let gauge = gauge.clone();
            thread::spawn(move || {
                for _ in 0..10_000 {
                    gauge.inc();
                }
                for _ in 0..5_000 {
                    gauge.dec();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // The same series from the same shard is the same cell.
    let again = shard.shared_gauge(pending, &[]);
    again.add(-20_000);
    assert_eq!(gauge.get(), 0);
    assert_eq!(registry.snapshot().gauge("pending", &[]), Some(0));
}
