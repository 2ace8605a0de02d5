//! `GET /stats?format=json`: every stat as JSON, merged over workers, for programs (the
//! dashboard draws its histograms from it). A histogram carries its exact count, sum, mean,
//! min and max, its quantiles, and its non-empty buckets as `[lowest, highest, count]` in
//! microseconds. A `filter=` keeps the series whose `/stats` text name (`name{labels}`) it
//! matches, as it does for the text.

use regex::Regex;
use serde_json::{Map, Value as Json, json};
use stats::{HistogramSnapshot, Snapshot, Value};

/// The quantiles a histogram reports, as its keys say them.
const QUANTILES: [(f64, &str); 4] = [(0.5, "0.5"), (0.9, "0.9"), (0.99, "0.99"), (0.999, "0.999")];

pub(super) fn stats_json(snapshot: &Snapshot, filter: Option<&Regex>) -> Json {
    let families: Vec<Json> = snapshot
        .families()
        .iter()
        .filter_map(|family| {
            let names: Vec<&str> = family.label_names().collect();
            let series: Vec<Json> = family
                .series()
                .iter()
                .filter(|series| {
                    filter.is_none_or(|re| re.is_match(&series.text_key(family.name())))
                })
                .map(|series| {
                    let labels: Map<String, Json> = names
                        .iter()
                        .zip(series.label_values())
                        .map(|(name, value)| ((*name).to_owned(), Json::from(value)))
                        .collect();
                    let mut entry = match series.value() {
                        Value::Counter(v) => json!({ "value": v }),
                        Value::Gauge(v) => json!({ "value": v }),
                        Value::Histogram(h) => histogram(h),
                    };
                    entry["labels"] = Json::Object(labels);
                    entry
                })
                .collect();
            (!series.is_empty()).then(|| {
                json!({
                    "name": family.name(),
                    "kind": family.kind().to_string(),
                    "series": series,
                })
            })
        })
        .collect();
    json!({ "stats": families })
}

fn histogram(h: &HistogramSnapshot) -> Json {
    let quantiles: Map<String, Json> = QUANTILES
        .iter()
        .map(|(q, key)| ((*key).to_owned(), json!(h.quantile(*q))))
        .collect();
    let buckets: Vec<[u64; 3]> = h
        .buckets()
        .map(|(low, high, count)| [low, high, count])
        .collect();
    json!({
        "count": h.count(),
        "sum_us": h.sum(),
        "mean_us": h.mean(),
        "min_us": h.min(),
        "max_us": h.max(),
        "quantiles_us": quantiles,
        "buckets": buckets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_with_its_labels() {
        let registry = stats::Registry::new();
        let requests = registry.counter("rq_total", "", &["listener"]);
        let time = registry.histogram("rq_time", "", &["listener"]);
        let shard = registry.shard(&[("worker", "0")]);
        shard.counter(requests, &["main"]).add(3);
        let h = shard.histogram(time, &["main"]);
        for us in [100, 200, 300] {
            h.record(us);
        }
        let json = stats_json(&registry.snapshot(), None);
        let stats = json["stats"].as_array().unwrap();
        assert_eq!(stats[0]["name"], "rq_total");
        assert_eq!(stats[0]["series"][0]["value"], 3);
        assert_eq!(stats[0]["series"][0]["labels"]["listener"], "main");
        let time = &stats[1]["series"][0];
        assert_eq!(stats[1]["kind"], "histogram");
        assert_eq!(time["count"], 3);
        assert_eq!(time["mean_us"], 200.0);
        assert_eq!(time["quantiles_us"]["0.5"], 200);
        // Exact below 256 us; two-wide above.
        assert_eq!(
            time["buckets"],
            json!([[100, 100, 1], [200, 200, 1], [300, 301, 1]])
        );
    }

    #[test]
    fn a_filter_keeps_the_series_whose_text_name_it_matches() {
        let registry = stats::Registry::new();
        let requests = registry.counter("rq_total", "", &["listener"]);
        let time = registry.histogram("rq_time", "", &["listener"]);
        let shard = registry.shard(&[("worker", "0")]);
        shard.counter(requests, &["main"]).add(3);
        shard.counter(requests, &["admin"]).add(1);
        shard.histogram(time, &["main"]).record(100);
        let snapshot = registry.snapshot();
        let kept = |pattern: &str| {
            let re = Regex::new(pattern).unwrap();
            stats_json(&snapshot, Some(&re))["stats"].clone()
        };
        // By name: the other family goes.
        let time_only = kept("^rq_time");
        assert_eq!(time_only.as_array().unwrap().len(), 1);
        assert_eq!(time_only[0]["name"], "rq_time");
        // By label, as the text line shows it: one series of one family.
        let main_requests = kept(r#"rq_total\{listener="main"\}"#);
        assert_eq!(main_requests.as_array().unwrap().len(), 1);
        assert_eq!(main_requests[0]["series"].as_array().unwrap().len(), 1);
        assert_eq!(main_requests[0]["series"][0]["value"], 3);
        // Nothing matched: no family, not empty ones.
        assert_eq!(kept("^nothing"), json!([]));
    }
}
