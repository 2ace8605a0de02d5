//! Counters, gauges and latency histograms that a worker records without sharing anything:
//! no lock, no atomic read-modify-write, no allocation on the request path. Shards are merged
//! only when someone reads them.
//!
//! Legate runs one worker per core, each a single-threaded runtime. Each worker gets a
//! [`Shard`] of a shared [`Registry`] and, when it starts or swaps its config, a handle per
//! series it records ([`Counter`], [`Gauge`], [`Histogram`]). Recording through a handle
//! writes cells that only that handle writes (a load and a store, as cheap as a `Cell`); the
//! admin thread's [`Registry::snapshot`] reads every cell, merges the shards, and renders
//! Envoy's `/stats` text or the Prometheus format. The crate needs neither tokio nor the proxy.
//!
//! ```
//! use std::thread;
//! use std::time::Duration;
//!
//! use stats::Registry;
//!
//! let registry = Registry::new();
//! let requests = registry.counter("downstream_rq_total", "Requests received.", &["listener"]);
//! let rq_time = registry.histogram("upstream_rq_time", "Time to the upstream's full response.", &["cluster"]);
//!
//! let workers: Vec<_> = (0..2)
//!     .map(|worker| {
//!         // One shard per worker; the handles are built once, then only record.
//!         let shard = registry.shard(&[("worker", &worker.to_string())]);
//!         let total = shard.counter(requests, &["public"]);
//!         let time = shard.histogram(rq_time, &["backend"]);
//!         thread::spawn(move || {
//!             for i in 1..=1000u64 {
//!                 total.inc();
//!                 time.record_duration(Duration::from_micros(i * 100));
//!             }
//!         })
//!     })
//!     .collect();
//! for worker in workers {
//!     worker.join().expect("worker panicked");
//! }
//!
//! let snapshot = registry.snapshot();
//! assert_eq!(snapshot.counter("downstream_rq_total", &["public"]), Some(2000));
//! let time = snapshot.histogram("upstream_rq_time", &["backend"]).expect("declared");
//! let p99 = time.quantile(0.99).expect("recorded");
//! let mean = time.mean().expect("recorded");
//! println!("p99 {p99} us, mean {mean:.1} us");
//! assert!(p99.abs_diff(99_000) <= 99_000 / 256); // within stats::RELATIVE_ERROR
//! assert_eq!(mean, 50_050.0); // exact
//! print!("{}", snapshot.render_text(Some("downstream_rq")));
//! assert!(snapshot.render_prometheus().contains("upstream_rq_time_seconds_count{cluster=\"backend\"} 2000"));
//! ```
//!
//! # Modules
//!
//! | file | holds |
//! |---|---|
//! | `cell.rs` | the single-writer cell and its invariant |
//! | `counter.rs`, `gauge.rs` | [`Counter`]; [`Gauge`] and [`SharedGauge`] |
//! | `histogram.rs` | bucket layout and error bound, [`Histogram`], [`HistogramSnapshot`] |
//! | `naming.rs` | [`MetricKind`], the names and label sets series are rendered under |
//! | `registry.rs` | [`Registry`], the families, [`Shard`] |
//! | `snapshot.rs` | [`Snapshot`]: the merge, per series and per shard |
//! | `text.rs`, `prometheus.rs` | the two renderers, and [`Snapshot`]'s methods that call them |
//!
//! # Single writer
//!
//! Each recorded number is an `AtomicU64` that one thread writes with `load(Relaxed)` +
//! `store(Relaxed)` and the scraper reads with `load`. The registry gives every handle cells
//! of its own, and a handle is `Send` but neither `Sync` nor `Clone`, so only the thread
//! holding it can record through it. Cells are padded to 128 bytes, so two workers never write
//! the same cache line. A handle's values outlive it; a new handle for the same series from the
//! same shard continues them. [`SharedGauge`] is the exception, for a gauge several threads
//! move: it uses `fetch_add`.
//!
//! # Histograms
//!
//! Values are microseconds, in HDR-style log-linear buckets: exact below 256 us, then 128
//! buckets per power of two up to [`MAX_TRACKED_US`] (2^36 - 1 us, about 19 h); larger values
//! count in the top bucket. Quantiles report the midpoint of the bucket that holds the
//! nearest-rank value, clamped to `[min, max]`: within [`RELATIVE_ERROR`] (1/256) of the exact
//! value. `count`, `sum`, `mean`, `min` and `max` are exact.
//!
//! # Text format
//!
//! [`Snapshot::render_text`] writes `name{labels}: value` lines, families sorted by name with
//! histograms last, as Envoy's `/stats` does. Counters and gauges are followed by one line
//! per shard with the shard's labels added, when there are several shards. Histograms read
//! `name{labels}: P50=.. P90=.. P99=.. P99.9=.. count=.. sum=.. mean=.. min=.. max=..` in
//! microseconds.
//!
//! # Prometheus format
//!
//! [`Snapshot::render_prometheus`] writes the text exposition format 0.0.4, merged over
//! shards. Counters and gauges keep their names. A histogram `x` becomes, in seconds, a
//! histogram `x_seconds` (cumulative `x_seconds_bucket{le}` series at
//! [`PrometheusOptions::buckets`], `x_seconds_sum`, `x_seconds_count`: they add up across
//! processes), the gauge `x_seconds_quantile` (quantiles 0.5, 0.9, 0.99, 0.999 of this
//! process, unless [`PrometheusOptions::quantiles`] is off) and the gauges `x_seconds_mean` and
//! `x_seconds_max`: declare histograms without a unit suffix. Label values and help texts are
//! escaped.
//!
//! # The `metrics` facade
//!
//! With the `metrics` feature, [`MetricsRecorder`] is a `metrics::Recorder` into a registry:
//! what any library records with `metrics::counter!`, `gauge!` and `histogram!` is exported
//! with the registry's own families.

#![warn(missing_docs)]

mod cell;
mod counter;
#[cfg(feature = "metrics")]
mod facade;
mod gauge;
mod histogram;
mod naming;
mod prometheus;
mod registry;
mod snapshot;
mod text;

pub use counter::Counter;
#[cfg(feature = "metrics")]
pub use facade::MetricsRecorder;
pub use gauge::{Gauge, SharedGauge};
pub use histogram::{Histogram, HistogramSnapshot, MAX_TRACKED_US, RELATIVE_ERROR};
pub use naming::MetricKind;
pub use prometheus::{DEFAULT_BUCKETS_US, PrometheusOptions};
pub use registry::{
    CounterFamily, GaugeFamily, HistogramFamily, Registry, Retired, Shard, ShardId,
};
pub use snapshot::{FamilySnapshot, SeriesSnapshot, Snapshot, Value};
