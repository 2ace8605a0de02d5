//! Retiring series nobody records into any more: gone from snapshots after the grace period,
//! their memory freed, and a later handle starting from zero.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use std::time::{Duration, Instant};

use stats::{Registry, Retired};

#[global_allocator]
static GLOBAL: alloc_meter::Counting = alloc_meter::Counting;

const GRACE: Duration = Duration::from_secs(60);

#[test]
fn a_series_without_handles_goes_after_the_grace_period_and_comes_back_from_zero() {
    let registry = Registry::new();
    let family = registry.counter("upstream_rq_total", "", &["cluster"]);
    let shard = registry.shard(&[("worker", "0")]);
    let kept = shard.counter(family, &["kept"]);
    let removed = shard.counter(family, &["removed"]);
    kept.add(2);
    removed.add(7);
    let t0 = Instant::now();
    assert_eq!(
        registry.retire_unheld_at(GRACE, t0),
        Retired {
            series: 0,
            pending: 0
        }
    );

    drop(removed);
    // Found unheld: its grace period starts; it is still scraped meanwhile.
    assert_eq!(registry.retire_unheld_at(GRACE, t0).pending, 1);
    let just_before = t0 + GRACE - Duration::from_millis(1);
    assert_eq!(registry.retire_unheld_at(GRACE, just_before).series, 0);
    assert_eq!(
        registry
            .snapshot()
            .counter("upstream_rq_total", &["removed"]),
        Some(7)
    );
    assert_eq!(registry.retire_unheld_at(GRACE, t0 + GRACE).series, 1);
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.counter("upstream_rq_total", &["removed"]), None);
    assert_eq!(snapshot.counter("upstream_rq_total", &["kept"]), Some(2));
    let text = snapshot.render_prometheus();
    assert!(!text.contains("removed"), "{text}");

    // Added again: a new series, from zero.
    let again = shard.counter(family, &["removed"]);
    assert_eq!(again.get(), 0);
    again.inc();
    assert_eq!(
        registry
            .snapshot()
            .counter("upstream_rq_total", &["removed"]),
        Some(1)
    );
}

#[test]
fn a_handle_made_during_the_grace_period_keeps_the_series_and_its_count() {
    let registry = Registry::new();
    let family = registry.histogram("upstream_rq_time", "", &["cluster"]);
    let shard = registry.shard(&[]);
    shard.histogram(family, &["c"]).record(100);
    let t0 = Instant::now();
    assert_eq!(registry.retire_unheld_at(GRACE, t0).pending, 1);
    // A config swap made a new handle before the grace period ran out.
    let back = shard.histogram(family, &["c"]);
    assert_eq!(registry.retire_unheld_at(GRACE, t0 + GRACE).series, 0);
    drop(back);
    // Its grace period starts again from the sweep that finds it unheld.
    let t1 = t0 + GRACE + Duration::from_secs(1);
    assert_eq!(registry.retire_unheld_at(GRACE, t1).series, 0);
    assert_eq!(
        registry
            .snapshot()
            .histogram("upstream_rq_time", &["c"])
            .unwrap()
            .count(),
        1
    );
    assert_eq!(registry.retire_unheld_at(GRACE, t1 + GRACE).series, 1);
    assert!(
        registry
            .snapshot()
            .histogram("upstream_rq_time", &["c"])
            .is_none()
    );
}

/// A handle made and dropped between two sweeps: the series was in use, so its grace period
/// starts again from the next sweep rather than from the first one that found it unheld.
#[test]
fn a_handle_used_between_two_sweeps_starts_the_grace_period_again() {
    let registry = Registry::new();
    let family = registry.counter("host_rq_total", "", &["host"]);
    let shard = registry.shard(&[]);
    shard.counter(family, &["h"]).inc();
    let t0 = Instant::now();
    assert_eq!(registry.retire_unheld_at(GRACE, t0).pending, 1);
    shard.counter(family, &["h"]).inc();
    assert_eq!(registry.retire_unheld_at(GRACE, t0 + GRACE).series, 0);
    assert_eq!(
        registry.snapshot().counter("host_rq_total", &["h"]),
        Some(2)
    );
    let t1 = t0 + GRACE;
    assert_eq!(registry.retire_unheld_at(GRACE, t1 + GRACE).series, 1);
}

#[test]
fn a_shared_gauge_is_held_while_any_of_its_clones_lives() {
    let registry = Registry::new();
    let family = registry.gauge("membership_healthy", "", &["cluster"]);
    let shard = registry.shard(&[]);
    let gauge = shard.shared_gauge(family, &["c"]);
    let other = shard.shared_gauge(family, &["c"]);
    gauge.set(3);
    drop(gauge);
    let t0 = Instant::now();
    assert_eq!(registry.retire_unheld_at(Duration::ZERO, t0).series, 0);
    drop(other);
    assert_eq!(registry.retire_unheld_at(Duration::ZERO, t0).series, 1);
}

/// The point of retiring: endpoint churn does not grow memory. A thousand hosts' series
/// (cells on two shards, labels, the map's nodes) come and go, and what the registry holds
/// afterwards is what it held before.
#[test]
fn retired_series_give_their_memory_back() {
    let registry = Registry::new();
    let connections = registry.counter("host_cx_total", "", &["cluster", "host"]);
    let active = registry.gauge("host_cx_active", "", &["cluster", "host"]);
    let time = registry.histogram("host_rq_time", "", &["cluster", "host"]);
    let shards = [
        registry.shard(&[("worker", "0")]),
        registry.shard(&[("worker", "1")]),
    ];
    // The first round sizes the registry's own structures; the rounds after must not grow it.
    let churn = |round: u32| {
        let mut handles = Vec::new();
        for host in 0..1000 {
            let host = format!("10.{round}.{}.{}:8080", host / 256, host % 256);
            for shard in &shards {
                let c = shard.counter(connections, &["backend", &host]);
                c.inc();
                let g = shard.gauge(active, &["backend", &host]);
                g.set(1);
                let h = shard.histogram(time, &["backend", &host]);
                h.record(250);
                handles.push((c, g, h));
            }
        }
        assert!(
            registry
                .snapshot()
                .render_prometheus()
                .contains(&format!("10.{round}.0.1:8080"))
        );
        drop(handles);
        let retired = registry.retire_unheld_at(Duration::ZERO, Instant::now());
        assert_eq!(retired.series, 3000);
    };
    churn(0);
    let kept = alloc_meter::bytes_kept_during(|| {
        for round in 1..=3 {
            churn(round);
        }
    });
    assert!(
        kept <= 0,
        "three rounds of 1000 hosts added and retired kept {kept} bytes"
    );
    let text = registry.snapshot().render_prometheus();
    assert!(!text.contains("10."), "{text}");
}
