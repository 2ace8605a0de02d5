//! Declaring families, creating handles, and what happens to values when handles come and go.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use stats::{Registry, Value};

#[test]
fn declaring_a_family_twice_returns_the_same_family() {
    let registry = Registry::new();
    let a = registry.counter("rq_total", "Requests.", &["listener"]);
    let b = registry.counter("rq_total", "Other help is ignored.", &["listener"]);
    assert_eq!(a, b);
    assert_eq!(registry.snapshot().families().len(), 1);
}

#[test]
fn a_new_handle_continues_the_count_of_a_dropped_one() {
    let registry = Registry::new();
    let family = registry.counter("rq_total", "", &[]);
    let shard = registry.shard(&[]);
    let first = shard.counter(family, &[]);
    first.add(5);
    drop(first);
    assert_eq!(registry.snapshot().counter("rq_total", &[]), Some(5));
    let second = shard.counter(family, &[]);
    assert_eq!(second.get(), 5);
    second.inc();
    assert_eq!(registry.snapshot().counter("rq_total", &[]), Some(6));
}

#[test]
fn two_live_handles_on_one_series_get_their_own_cells_and_add_up() {
    let registry = Registry::new();
    let family = registry.gauge("cx_active", "", &[]);
    let shard = registry.shard(&[("worker", "0")]);
    let a = shard.gauge(family, &[]);
    let b = shard.gauge(family, &[]);
    a.set(3);
    b.add(4);
    assert_eq!(a.get(), 3);
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.gauge("cx_active", &[]), Some(7));
    let series = snapshot.family("cx_active").unwrap().get(&[]).unwrap();
    assert_eq!(series.per_shard(), [(shard.id(), Value::Gauge(7))]);
}

#[test]
fn histograms_values_outlive_their_handle() {
    let registry = Registry::new();
    let family = registry.histogram("rq_time", "", &[]);
    let shard = registry.shard(&[]);
    shard.histogram(family, &[]).record(100);
    shard.histogram(family, &[]).record(200);
    let h = registry
        .snapshot()
        .histogram("rq_time", &[])
        .unwrap()
        .clone();
    assert_eq!((h.count(), h.sum()), (2, 300));
}

#[test]
fn series_are_sorted_by_label_values_and_found_by_them() {
    let registry = Registry::new();
    let family = registry.counter("rq_total", "", &["cluster", "code_class"]);
    let shard = registry.shard(&[]);
    for (cluster, code) in [("b", "5xx"), ("a", "2xx"), ("b", "2xx")] {
        shard.counter(family, &[cluster, code]).inc();
    }
    let snapshot = registry.snapshot();
    let family = snapshot.family("rq_total").unwrap();
    let order: Vec<Vec<&str>> = family
        .series()
        .iter()
        .map(|s| s.label_values().collect())
        .collect();
    assert_eq!(order, [["a", "2xx"], ["b", "2xx"], ["b", "5xx"]]);
    assert!(family.get(&["b", "5xx"]).is_some());
    assert!(family.get(&["c", "5xx"]).is_none());
    assert_eq!(snapshot.counter("rq_total", &["a"]), None);
    assert_eq!(
        snapshot.gauge("rq_total", &["a", "2xx"]),
        None,
        "wrong kind"
    );
}

#[test]
fn text_shows_merged_lines_then_each_shard() {
    let registry = Registry::new();
    let active = registry.gauge("downstream_cx_active", "", &["listener"]);
    let total = registry.counter("downstream_cx_total", "", &["listener"]);
    let time = registry.histogram("downstream_rq_time", "", &[]);
    let idle = registry.histogram("a_idle_time", "", &[]);
    for worker in 0..2 {
        let shard = registry.shard(&[("worker", &worker.to_string())]);
        shard.gauge(active, &["public"]).set(worker + 1);
        shard.counter(total, &["public"]).add(10);
        let h = shard.histogram(time, &[]);
        h.record(100);
        h.record(300);
        let _ = shard.histogram(idle, &[]);
    }
    let snapshot = registry.snapshot();
    let text = snapshot.render_text(None);
    assert_eq!(
        text,
        "downstream_cx_active{listener=\"public\"}: 3\n\
         downstream_cx_active{listener=\"public\",worker=\"0\"}: 1\n\
         downstream_cx_active{listener=\"public\",worker=\"1\"}: 2\n\
         downstream_cx_total{listener=\"public\"}: 20\n\
         downstream_cx_total{listener=\"public\",worker=\"0\"}: 10\n\
         downstream_cx_total{listener=\"public\",worker=\"1\"}: 10\n\
         a_idle_time: No recorded values\n\
         downstream_rq_time: P50=100 P90=300 P99=300 P99.9=300 count=4 sum=800 mean=200.0 min=100 max=300\n"
    );
    assert_eq!(
        snapshot.render_text(Some("worker=\"1\"")),
        "downstream_cx_active{listener=\"public\",worker=\"1\"}: 2\n\
         downstream_cx_total{listener=\"public\",worker=\"1\"}: 10\n"
    );
    assert_eq!(snapshot.render_text(Some("rq_time")).lines().count(), 1);
    assert_eq!(snapshot.render_text(Some("nothing")), "");
}

#[test]
#[should_panic(expected = "invalid metric name")]
fn a_dotted_name_is_refused() {
    Registry::new().counter("cluster.upstream_rq", "", &[]);
}

#[test]
#[should_panic(expected = "invalid label name")]
fn a_reserved_label_name_is_refused() {
    Registry::new().counter("rq_total", "", &["__name"]);
}

#[test]
#[should_panic(expected = "given twice")]
fn a_repeated_label_name_is_refused() {
    Registry::new().counter("rq_total", "", &["a", "a"]);
}

#[test]
#[should_panic(expected = "already a counter")]
fn redeclaring_with_other_labels_is_refused() {
    let registry = Registry::new();
    registry.counter("rq_total", "", &["listener"]);
    registry.counter("rq_total", "", &["cluster"]);
}

#[test]
#[should_panic(expected = "which \"rq_time\" exports")]
fn a_name_that_collides_in_the_exposition_is_refused() {
    let registry = Registry::new();
    registry.histogram("rq_time", "", &[]);
    registry.gauge("rq_time_seconds_max", "", &[]);
}

#[test]
#[should_panic(expected = "quantile")]
fn a_histogram_label_named_quantile_is_refused() {
    Registry::new().histogram("rq_time", "", &["quantile"]);
}

#[test]
#[should_panic(expected = "given values")]
fn the_wrong_number_of_label_values_is_refused() {
    let registry = Registry::new();
    let family = registry.counter("rq_total", "", &["listener"]);
    registry.shard(&[]).counter(family, &[]);
}

#[test]
#[should_panic(expected = "another registry")]
fn a_family_of_another_registry_is_refused() {
    let family = Registry::new().counter("rq_total", "", &[]);
    Registry::new().shard(&[]).counter(family, &[]);
}

#[test]
#[should_panic(expected = "also a label of")]
fn a_shard_label_that_shadows_a_family_label_is_refused() {
    let registry = Registry::new();
    let family = registry.counter("rq_total", "", &["worker"]);
    registry.shard(&[("worker", "0")]).counter(family, &["1"]);
}

#[test]
fn the_registry_survives_a_panic_while_locked() {
    let registry = Registry::new();
    let family = registry.counter("rq_total", "", &["listener"]);
    let shard = registry.shard(&[]);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        shard.counter(family, &[]);
    }));
    assert!(caught.is_err());
    shard.counter(family, &["public"]).inc();
    assert_eq!(
        registry.snapshot().counter("rq_total", &["public"]),
        Some(1)
    );
}
