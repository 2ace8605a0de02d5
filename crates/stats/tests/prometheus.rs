//! The Prometheus exposition parses, and says what the snapshot says.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use std::collections::HashMap;

use prometheus_parse::{Sample, Scrape, Value as Parsed};
use stats::{Registry, Snapshot};

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

fn labels(sample: &Sample) -> HashMap<String, String> {
    sample
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), unescape(v)))
        .collect()
}

/// prometheus-parse hands label values over still escaped: undo `\\`, `\"` and `\n`.
fn unescape(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The series' label values, in the family's label order, from a parsed sample.
fn values_for(snapshot: &Snapshot, family: &str, sample: &Sample) -> Vec<String> {
    let labels = labels(sample);
    snapshot
        .family(family)
        .unwrap_or_else(|| panic!("no family {family}"))
        .label_names()
        .map(|name| labels[name].clone())
        .collect()
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn seconds(us: Option<u64>) -> f64 {
    us.map_or(f64::NAN, |us| us as f64 / 1e6)
}

fn sample_registry() -> Registry {
    let registry = Registry::new();
    let requests = registry.counter(
        "downstream_rq_total",
        "Requests received.",
        &["listener", "code_class"],
    );
    let active = registry.gauge("downstream_cx_active", "Open connections.", &["listener"]);
    let overflow = registry.counter("upstream_rq_pending_overflow", "", &[]);
    let time = registry.histogram("upstream_rq_time", "Upstream request time.", &["cluster"]);
    let idle = registry.histogram("idle_time", "Never recorded.", &[]);
    for worker in 0..3 {
        let shard = registry.shard(&[("worker", &worker.to_string())]);
        for (i, code) in ["2xx", "4xx", "5xx"].iter().enumerate() {
            shard
                .counter(requests, &["public", code])
                .add(100 * worker + i as u64);
            // (prometheus-parse trims every `"` off a value's ends, so none ends with one.)
            shard
                .counter(requests, &["admin \"internal\" api", code])
                .add(worker);
        }
        let gauge = shard.gauge(active, &["public"]);
        gauge.set(10 * worker as i64 - 15);
        shard.counter(overflow, &[]).add(worker);
        let histogram = shard.histogram(time, &["backend"]);
        for v in 1..=1000 {
            histogram.record(v * 37 * (worker + 1));
        }
        let _ = shard.histogram(time, &["empty"]);
        let _ = shard.histogram(idle, &[]);
    }
    registry
}

#[test]
fn every_parsed_value_equals_the_snapshot() {
    let snapshot = sample_registry().snapshot();
    let text = snapshot.render_prometheus();
    let scrape = parse(&text);
    let mut checked = 0;
    for sample in &scrape.samples {
        let name = sample.metric.as_str();
        match &sample.value {
            Parsed::Counter(v) => {
                let values = values_for(&snapshot, name, sample);
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                assert_eq!(
                    snapshot.counter(name, &values).map(|c| c as f64),
                    Some(*v),
                    "{name}"
                );
            }
            Parsed::Gauge(v) if name.ends_with("_seconds_quantile") => {
                let family = name.strip_suffix("_seconds_quantile").unwrap();
                let values = values_for(&snapshot, family, sample);
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                let h = snapshot.histogram(family, &values).unwrap();
                let q: f64 = labels(sample)["quantile"].parse().unwrap();
                assert!([0.5, 0.9, 0.99, 0.999].contains(&q), "{q}");
                assert!(same(seconds(h.quantile(q)), *v), "{name} {q}");
            }
            Parsed::Gauge(v) => {
                let (family, pick): (&str, fn(&stats::HistogramSnapshot) -> f64) =
                    if let Some(f) = name.strip_suffix("_seconds_mean") {
                        (f, |h| h.mean().map_or(f64::NAN, |m| m / 1e6))
                    } else if let Some(f) = name.strip_suffix("_seconds_max") {
                        (f, |h| seconds(h.max()))
                    } else {
                        let values = values_for(&snapshot, name, sample);
                        let values: Vec<&str> = values.iter().map(String::as_str).collect();
                        assert_eq!(
                            snapshot.gauge(name, &values).map(|g| g as f64),
                            Some(*v),
                            "{name}"
                        );
                        checked += 1;
                        continue;
                    };
                let values = values_for(&snapshot, family, sample);
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                let h = snapshot.histogram(family, &values).unwrap();
                assert!(same(pick(h), *v), "{name}: {} vs {v}", pick(h));
            }
            Parsed::Histogram(buckets) => {
                let family = name.strip_suffix("_seconds").unwrap();
                let values = values_for(&snapshot, family, sample);
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                let h = snapshot.histogram(family, &values).unwrap();
                let mut want: Vec<(f64, f64)> = stats::DEFAULT_BUCKETS_US
                    .iter()
                    .zip(h.cumulative_counts(&stats::DEFAULT_BUCKETS_US))
                    .map(|(&us, count)| (us as f64 / 1e6, count as f64))
                    .collect();
                want.push((f64::INFINITY, h.count() as f64));
                let got: Vec<(f64, f64)> = buckets.iter().map(|b| (b.less_than, b.count)).collect();
                assert_eq!(got, want, "{name}");
            }
            Parsed::Summary(_) => panic!("no summaries are exported"),
            Parsed::Untyped(v) => {
                // `_sum` and `_count` of a histogram.
                let (family, want) = if let Some(f) = name.strip_suffix("_seconds_sum") {
                    let values = values_for(&snapshot, f, sample);
                    let values: Vec<&str> = values.iter().map(String::as_str).collect();
                    (
                        f,
                        snapshot.histogram(f, &values).unwrap().sum() as f64 / 1e6,
                    )
                } else {
                    let f = name.strip_suffix("_seconds_count").unwrap();
                    let values = values_for(&snapshot, f, sample);
                    let values: Vec<&str> = values.iter().map(String::as_str).collect();
                    (f, snapshot.histogram(f, &values).unwrap().count() as f64)
                };
                assert_eq!(want, *v, "{family}");
            }
        }
        checked += 1;
    }
    // 6 + 1 counters, 1 gauge, 3 histogram series x (buckets, sum, count, 4 quantiles, mean,
    // max).
    assert_eq!(checked, 6 + 1 + 1 + 3 * 9);
    assert_eq!(scrape.docs["downstream_rq_total"], "Requests received.");
    assert_eq!(
        scrape.docs["upstream_rq_time_seconds"],
        "Upstream request time."
    );
}

#[test]
fn types_and_shapes_follow_the_exposition_format() {
    let text = sample_registry().snapshot().render_prometheus();
    for line in [
        "# TYPE downstream_rq_total counter",
        "# TYPE downstream_cx_active gauge",
        "downstream_cx_active{listener=\"public\"} -15",
        "upstream_rq_pending_overflow 3",
        "# TYPE upstream_rq_time_seconds histogram",
        "# TYPE upstream_rq_time_seconds_quantile gauge",
        "upstream_rq_time_seconds_bucket{cluster=\"backend\",le=\"+Inf\"} 3000",
        "upstream_rq_time_seconds_bucket{cluster=\"backend\",le=\"0.00005\"} 1",
        "# TYPE upstream_rq_time_seconds_mean gauge",
        "# TYPE upstream_rq_time_seconds_max gauge",
        "upstream_rq_time_seconds_count{cluster=\"backend\"} 3000",
        "upstream_rq_time_seconds_max{cluster=\"backend\"} 0.111",
        "upstream_rq_time_seconds_quantile{cluster=\"empty\",quantile=\"0.99\"} NaN",
        "upstream_rq_time_seconds_bucket{cluster=\"empty\",le=\"10\"} 0",
        "upstream_rq_time_seconds_count{cluster=\"empty\"} 0",
        "idle_time_seconds_sum 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // No HELP line for an empty help text; every sample line is `name{labels} value`.
    assert!(!text.contains("# HELP upstream_rq_pending_overflow"));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value == "NaN" || value.parse::<f64>().is_ok(), "{line}");
    }
}

#[test]
fn label_values_and_help_are_escaped() {
    let registry = Registry::new();
    let family = registry.counter("c_total", "Line one\nback\\slash \"quoted\".", &["path"]);
    let shard = registry.shard(&[]);
    let nasty = "a\"b\\c\nd";
    shard.counter(family, &[nasty]).add(7);
    let text = registry.snapshot().render_prometheus();
    assert!(
        text.contains("# HELP c_total Line one\\nback\\\\slash \"quoted\".\n"),
        "{text}"
    );
    assert!(
        text.contains("c_total{path=\"a\\\"b\\\\c\\nd\"} 7\n"),
        "{text}"
    );
    assert_eq!(
        text.lines().count(),
        3,
        "a newline in a value stays escaped: {text}"
    );

    let scrape = parse(&text);
    assert_eq!(scrape.samples.len(), 1);
    let sample = &scrape.samples[0];
    assert_eq!(labels(sample)["path"], nasty);
    assert_eq!(sample.value, Parsed::Counter(7.0));
}

#[test]
fn per_shard_families_appear_once_per_shard_with_its_labels() {
    let registry = stats::Registry::new();
    let open = registry.per_shard_gauge("worker_cx_active", "Open connections per worker.", &[]);
    let merged = registry.counter("rq_total", "Requests.", &[]);
    let shards: Vec<_> = (0..2)
        .map(|w| registry.shard(&[("worker", &w.to_string())]))
        .collect();
    let gauges: Vec<_> = shards.iter().map(|s| s.gauge(open, &[])).collect();
    let counters: Vec<_> = shards.iter().map(|s| s.counter(merged, &[])).collect();
    gauges[0].set(3);
    gauges[1].set(5);
    counters[0].add(2);
    counters[1].add(4);
    let text = registry.snapshot().render_prometheus();
    assert!(
        text.contains("worker_cx_active{worker=\"0\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("worker_cx_active{worker=\"1\"} 5\n"),
        "{text}"
    );
    assert!(!text.contains("worker_cx_active 8"), "{text}");
    assert!(text.contains("rq_total 6\n"), "{text}");
}

#[test]
fn bucket_counts_are_cumulative_and_close_to_exact() {
    let registry = Registry::new();
    let family = registry.histogram("t", "", &[]);
    let shard = registry.shard(&[]);
    let h = shard.histogram(family, &[]);
    // 1 us to 2 s, spread log-uniformly.
    let values: Vec<u64> = (0..20_000)
        .map(|i| (2_000_000f64.powf(f64::from(i) / 20_000.0)) as u64)
        .collect();
    for &v in &values {
        h.record(v);
    }
    let snapshot = registry.snapshot();
    let h = snapshot.histogram("t", &[]).unwrap();
    let bounds = stats::DEFAULT_BUCKETS_US;
    let counts = h.cumulative_counts(&bounds);
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    for (&bound, &count) in bounds.iter().zip(&counts) {
        let exact = values.iter().filter(|&&v| v <= bound).count() as u64;
        // Off only by values within 1/256 of the bound.
        let near = values
            .iter()
            .filter(|&&v| (v as f64 - bound as f64).abs() <= bound as f64 / 256.0 + 1.0)
            .count() as u64;
        assert!(count.abs_diff(exact) <= near, "{bound}: {count} vs {exact}");
    }
    // Past the largest value, everything; an empty histogram, nothing.
    assert_eq!(h.cumulative_counts(&[3_000_000]), [20_000]);
    assert_eq!(
        stats::HistogramSnapshot::default().cumulative_counts(&bounds),
        vec![0; bounds.len()]
    );

    // Fewer buckets, no quantiles: as configured.
    let options = stats::PrometheusOptions {
        buckets: vec![1_000, 1_000_000],
        quantiles: false,
    };
    let text = snapshot.render_prometheus_with(&options);
    let buckets: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("t_seconds_bucket"))
        .collect();
    assert_eq!(buckets.len(), 3, "{text}");
    assert!(
        buckets[0].starts_with("t_seconds_bucket{le=\"0.001\"} "),
        "{text}"
    );
    assert!(
        buckets[2].starts_with("t_seconds_bucket{le=\"+Inf\"} 20000"),
        "{text}"
    );
    assert!(!text.contains("_quantile"), "{text}");
    assert!(text.contains("t_seconds_mean"), "{text}");
}
