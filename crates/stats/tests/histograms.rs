//! Quantiles, mean, min and max of known distributions, against the exact values by sorting.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use stats::{HistogramSnapshot, MAX_TRACKED_US, RELATIVE_ERROR, Registry};

const QUANTILES: [f64; 12] = [
    0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0,
];

fn record(values: &[u64]) -> HistogramSnapshot {
    let registry = Registry::new();
    let family = registry.histogram("t", "", &[]);
    let histogram = registry.shard(&[]).histogram(family, &[]);
    for &v in values {
        histogram.record(v);
    }
    registry.snapshot().histogram("t", &[]).unwrap().clone()
}

/// The nearest-rank quantile: the `ceil(q * n)`-th smallest value.
fn exact(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len() as u128;
    let ppm = (q * 1e6).round() as u128;
    let rank = (n * ppm).div_ceil(1_000_000).clamp(1, n);
    sorted[rank as usize - 1]
}

fn check(name: &str, mut values: Vec<u64>) {
    let h = record(&values);
    values.sort_unstable();
    let sum: u64 = values.iter().sum();
    assert_eq!(h.count(), values.len() as u64, "{name}");
    assert_eq!(h.sum(), sum, "{name}");
    assert_eq!(h.mean(), Some(sum as f64 / values.len() as f64), "{name}");
    assert_eq!(h.min(), values.first().copied(), "{name}");
    assert_eq!(h.max(), values.last().copied(), "{name}");
    for q in QUANTILES {
        let want = exact(&values, q);
        let got = h.quantile(q).unwrap();
        let error = got.abs_diff(want) as f64;
        assert!(
            error <= want as f64 * RELATIVE_ERROR,
            "{name}: q={q}: got {got}, exact {want}"
        );
    }
}

/// A deterministic xorshift, uniform in (0, 1].
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn uniform_1_to_100_000_us() {
    check("uniform", (1..=100_000).collect());
}

#[test]
fn a_constant_is_reported_exactly() {
    let h = record(&[12_345; 1000]);
    for q in QUANTILES {
        assert_eq!(h.quantile(q), Some(12_345));
    }
    assert_eq!(h.mean(), Some(12_345.0));
}

#[test]
fn exponential_with_a_long_tail() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Mean 2 ms, plus one value in a hundred from a second mode at ~500 ms.
    let values = (0..200_000)
        .map(|i| {
            let base = if i % 100 == 0 { 500_000.0 } else { 2_000.0 };
            (-rng.next().ln() * base) as u64 + 1
        })
        .collect();
    check("exponential", values);
}

#[test]
fn log_uniform_over_the_whole_range() {
    let mut rng = Rng(42);
    let values = (0..100_000)
        .map(|_| ((rng.next() * (MAX_TRACKED_US as f64).ln()).exp() as u64).min(MAX_TRACKED_US))
        .collect();
    check("log-uniform", values);
}

#[test]
fn edges_zero_one_and_sixty_seconds() {
    let h = record(&[0, 1, 60_000_000]);
    assert_eq!(h.min(), Some(0));
    assert_eq!(h.max(), Some(60_000_000));
    assert_eq!(h.sum(), 60_000_001);
    assert_eq!(h.quantile(0.0), Some(0));
    assert_eq!(h.quantile(0.5), Some(1));
    assert_eq!(h.quantile(1.0), Some(60_000_000));
    check(
        "edges",
        vec![
            0, 0, 1, 1, 2, 255, 256, 257, 59_999_999, 60_000_000, 60_000_001,
        ],
    );
}

#[test]
fn huge_values_count_in_the_top_bucket_with_exact_max() {
    let huge = 1u64 << 40;
    let h = record(&[10, huge, MAX_TRACKED_US, u64::MAX]);
    assert_eq!(h.count(), 4);
    assert_eq!(h.min(), Some(10));
    assert_eq!(h.max(), Some(u64::MAX));
    assert_eq!(h.sum(), u64::MAX, "the sum saturates");
    assert_eq!(h.quantile(1.0), Some(u64::MAX));
    // Ranks in between land in the top bucket: capped near MAX_TRACKED_US.
    let p50 = h.quantile(0.5).unwrap();
    assert!(p50.abs_diff(MAX_TRACKED_US) as f64 <= MAX_TRACKED_US as f64 * RELATIVE_ERROR);
    let top: Vec<_> = h.buckets().collect();
    assert_eq!(top.len(), 2);
    assert_eq!(top[1].1, MAX_TRACKED_US);
    assert_eq!(top[1].2, 3);
}

#[test]
fn durations_are_recorded_in_whole_microseconds() {
    let registry = Registry::new();
    let family = registry.histogram("t", "", &[]);
    let histogram = registry.shard(&[]).histogram(family, &[]);
    histogram.record_duration(std::time::Duration::from_nanos(1_999));
    histogram.record_duration(std::time::Duration::from_secs(60));
    histogram.record_duration(std::time::Duration::MAX);
    let h = histogram.snapshot();
    assert_eq!(h.min(), Some(1));
    assert_eq!(h.max(), Some(u64::MAX));
    assert_eq!(h.count(), 3);
}

#[test]
fn quantiles_merge_across_shards() {
    let registry = Registry::new();
    let family = registry.histogram("t", "", &[]);
    let mut all = Vec::new();
    for shard in 0..3u64 {
        let histogram = registry.shard(&[]).histogram(family, &[]);
        for v in 0..10_000 {
            let v = v * (shard + 1) * 7 + shard;
            histogram.record(v);
            all.push(v);
        }
    }
    let merged = registry.snapshot().histogram("t", &[]).unwrap().clone();
    assert_eq!(merged, record(&all));
}
