//! The Prometheus text exposition format 0.0.4, and the label escaping the text format shares.
//!
//! Counters and gauges are exported under their own names. A histogram `x` (microseconds)
//! becomes, in seconds as Prometheus wants:
//!
//! - a `histogram` named `x_seconds`: cumulative `x_seconds_bucket{le="..."}` series at the
//!   [`PrometheusOptions::buckets`] bounds and `+Inf`, `x_seconds_sum` and `x_seconds_count`.
//!   Buckets add up across processes, so `histogram_quantile` over a fleet's sum is a fleet's
//!   quantile;
//! - unless [`PrometheusOptions::quantiles`] is off, a gauge `x_seconds_quantile` with this
//!   process's quantiles 0.5, 0.9, 0.99 and 0.999 (from all its values, not the buckets);
//! - a gauge `x_seconds_mean` and a gauge `x_seconds_max`.
//!
//! An empty histogram exports `NaN` quantiles, mean and max. The series merged over shards are
//! exported, except for families declared per shard, which appear once per shard with its
//! labels.

use std::fmt::{Display, Write};

use crate::histogram::{HistogramSnapshot, REPORTED_QUANTILES};
use crate::naming::{MetricKind, push_label_set};
use crate::snapshot::{FamilySnapshot, SeriesSnapshot, Snapshot, Value};

/// How histograms are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusOptions {
    /// The upper bounds of the `_bucket` series, in microseconds, ascending (`+Inf` is
    /// always added).
    pub buckets: Vec<u64>,
    /// Whether each histogram also exports its quantiles as the gauge `x_seconds_quantile`.
    pub quantiles: bool,
}

/// The bucket bounds used unless configured: 50 us to 10 s, for latencies from a loopback
/// hop to a slow upstream.
pub const DEFAULT_BUCKETS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

impl Default for PrometheusOptions {
    fn default() -> Self {
        Self {
            buckets: DEFAULT_BUCKETS_US.to_vec(),
            quantiles: true,
        }
    }
}

pub(crate) fn render(snapshot: &Snapshot, options: &PrometheusOptions) -> String {
    // About 60 bytes a line, eight lines for a histogram.
    let lines: usize = snapshot
        .families()
        .iter()
        .map(|f| {
            f.series().len()
                * if f.kind() == MetricKind::Histogram {
                    options.buckets.len() + 9
                } else {
                    1
                }
                + 2
        })
        .sum();
    let mut out = String::with_capacity(lines * 64);
    for family in snapshot.families() {
        if family.series().is_empty() {
            continue;
        }
        match family.kind() {
            MetricKind::Counter | MetricKind::Gauge => {
                let kind = if family.kind() == MetricKind::Counter {
                    "counter"
                } else {
                    "gauge"
                };
                header(&mut out, family.name(), "", family.help(), kind);
                for series in family.series() {
                    if family.is_per_shard() {
                        for (shard, value) in series.per_shard() {
                            let shard_labels = snapshot.rendered_shard_labels(*shard);
                            sample_name(
                                &mut out,
                                family,
                                "",
                                series.rendered_labels(),
                                shard_labels,
                            );
                            push_value(&mut out, value);
                        }
                    } else {
                        sample_name(&mut out, family, "", series.rendered_labels(), "");
                        push_value(&mut out, series.value());
                    }
                }
            }
            MetricKind::Histogram => render_histogram(&mut out, family, options),
        }
    }
    out
}

fn render_histogram<'a>(out: &mut String, family: &'a FamilySnapshot, options: &PrometheusOptions) {
    let empty = HistogramSnapshot::default();
    let hist = |series: &'a SeriesSnapshot| series.value().as_histogram().unwrap_or(&empty);
    // `le="0.0001"`: the bounds' labels, written once for every series.
    let bounds: Vec<String> = options
        .buckets
        .iter()
        .map(|&us| format!("le=\"{}\"", us as f64 / 1e6))
        .collect();
    header(out, family.name(), "_seconds", family.help(), "histogram");
    for series in family.series() {
        let h = hist(series);
        let labels = series.rendered_labels();
        for (le, count) in bounds.iter().zip(h.cumulative_counts(&options.buckets)) {
            sample_name(out, family, "_seconds_bucket", labels, le);
            push(out, count);
            out.push('\n');
        }
        sample_name(out, family, "_seconds_bucket", labels, "le=\"+Inf\"");
        push(out, h.count());
        out.push('\n');
        sample_name(out, family, "_seconds_sum", labels, "");
        push(out, h.sum() as f64 / 1e6);
        out.push('\n');
        sample_name(out, family, "_seconds_count", labels, "");
        push(out, h.count());
        out.push('\n');
    }
    if options.quantiles {
        let help = format!("Quantiles of {}_seconds in this process.", family.name());
        header(out, family.name(), "_seconds_quantile", &help, "gauge");
        for series in family.series() {
            let h = hist(series);
            let labels = series.rendered_labels();
            let estimates = h.quantiles(REPORTED_QUANTILES.map(|(q, _, _)| q));
            for ((_, label, _), estimate) in REPORTED_QUANTILES.iter().zip(estimates) {
                sample_name(out, family, "_seconds_quantile", labels, label);
                push(out, seconds(estimate));
                out.push('\n');
            }
        }
    }
    let help = format!("Mean of {}_seconds.", family.name());
    header(out, family.name(), "_seconds_mean", &help, "gauge");
    for series in family.series() {
        let h = hist(series);
        sample_name(out, family, "_seconds_mean", series.rendered_labels(), "");
        push(out, h.mean().map_or(f64::NAN, |us| us / 1e6));
        out.push('\n');
    }
    let help = format!("Largest {}_seconds observed.", family.name());
    header(out, family.name(), "_seconds_max", &help, "gauge");
    for series in family.series() {
        let h = hist(series);
        sample_name(out, family, "_seconds_max", series.rendered_labels(), "");
        push(out, seconds(h.max()));
        out.push('\n');
    }
}

fn seconds(us: Option<u64>) -> f64 {
    us.map_or(f64::NAN, |us| us as f64 / 1e6)
}

fn header(out: &mut String, name: &str, suffix: &str, help: &str, kind: &str) {
    if !help.is_empty() {
        out.push_str("# HELP ");
        out.push_str(name);
        out.push_str(suffix);
        out.push(' ');
        escape_help(out, help);
        out.push('\n');
    }
    out.push_str("# TYPE ");
    out.push_str(name);
    out.push_str(suffix);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// Writes `name{labels} ` (with the trailing space).
fn sample_name(out: &mut String, family: &FamilySnapshot, suffix: &str, labels: &str, extra: &str) {
    out.push_str(family.name());
    out.push_str(suffix);
    push_label_set(out, &[labels, extra]);
    out.push(' ');
}

/// A counter's or gauge's value and the line end.
fn push_value(out: &mut String, value: &Value) {
    match *value {
        Value::Counter(v) => push(out, v),
        Value::Gauge(v) => push(out, v),
        Value::Histogram(_) => {}
    }
    out.push('\n');
}

fn push(out: &mut String, value: impl Display) {
    // Writing into a String cannot fail.
    let _ = write!(out, "{value}");
}

/// A HELP text: `\` and newline escaped.
fn escape_help(out: &mut String, help: &str) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

impl Snapshot {
    /// The Prometheus text exposition format 0.0.4, series merged over shards, histograms
    /// with the default buckets and quantiles. See [`prometheus`](crate#prometheus-format).
    pub fn render_prometheus(&self) -> String {
        render(self, &PrometheusOptions::default())
    }

    /// [`render_prometheus`](Self::render_prometheus) with histograms as `options` say.
    pub fn render_prometheus_with(&self, options: &PrometheusOptions) -> String {
        render(self, options)
    }
}
