//! Envoy's `/stats` text format: `name{labels}: value`, one series a line.
//!
//! Families are sorted by name, counters and gauges first, histograms last. Each counter or
//! gauge series is followed, when the registry has more than one shard, by one line per shard
//! that has it, with the shard's labels added (`downstream_cx_active{worker="0"}: 3`), so the
//! spread over workers shows. Histograms show only their merged line, in microseconds:
//!
//! ```text
//! upstream_rq_time{cluster="backend"}: P50=1234 P90=2010 P99=9001 P99.9=15007 count=1000 sum=1402113 mean=1402.1 min=95 max=20113
//! ```
//!
//! or `No recorded values` when empty.

use std::fmt::Write;

use crate::histogram::{HistogramSnapshot, REPORTED_QUANTILES};
use crate::naming::MetricKind;
use crate::naming::write_key;
use crate::snapshot::{Snapshot, Value};

pub(crate) fn render(snapshot: &Snapshot, filter: Option<&str>) -> String {
    let mut families: Vec<_> = snapshot.families().iter().collect();
    families.sort_by_key(|f| (f.kind() == MetricKind::Histogram, f.name()));
    let per_shard = snapshot.shard_count() > 1;
    let keep = |key: &str| filter.is_none_or(|f| key.contains(f));
    let mut out = String::new();
    let mut key = String::new();
    for family in families {
        for series in family.series() {
            let labels = series.rendered_labels();
            write_key(&mut key, family.name(), &[labels]);
            if keep(&key) {
                line(&mut out, &key, series.value());
            }
            if !per_shard || family.kind() == MetricKind::Histogram {
                continue;
            }
            for (shard, value) in series.per_shard() {
                let shard_labels = snapshot.rendered_shard_labels(*shard);
                if shard_labels.is_empty() {
                    continue;
                }
                write_key(&mut key, family.name(), &[labels, shard_labels]);
                if keep(&key) {
                    line(&mut out, &key, value);
                }
            }
        }
    }
    out
}

fn line(out: &mut String, key: &str, value: &Value) {
    out.push_str(key);
    out.push_str(": ");
    // Writing into a String cannot fail.
    let _ = match value {
        Value::Counter(v) => write!(out, "{v}"),
        Value::Gauge(v) => write!(out, "{v}"),
        Value::Histogram(h) => histogram(out, h),
    };
    out.push('\n');
}

fn histogram(out: &mut String, h: &HistogramSnapshot) -> std::fmt::Result {
    let (Some(min), Some(max), Some(mean)) = (h.min(), h.max(), h.mean()) else {
        out.push_str("No recorded values");
        return Ok(());
    };
    let estimates = h.quantiles(REPORTED_QUANTILES.map(|(q, _, _)| q));
    for ((_, _, label), estimate) in REPORTED_QUANTILES.iter().zip(estimates) {
        write!(out, "{label}={} ", estimate.unwrap_or(0))?;
    }
    write!(
        out,
        "count={} sum={} mean={mean:.1} min={min} max={max}",
        h.count(),
        h.sum()
    )
}

impl Snapshot {
    /// Envoy's `/stats` format, one line per series, families sorted by name with histograms
    /// last; `filter` keeps the lines whose `name{labels}` contains it. See [`text`](crate#text-format).
    pub fn render_text(&self, filter: Option<&str>) -> String {
        render(self, filter)
    }
}
