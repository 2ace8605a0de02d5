//! What a balancer records through the `metrics` facade, read back from a real recorder
//! (metrics-exporter-prometheus's), as an embedding service would export it.

#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use std::net::SocketAddr;

use balancer::{Health, HostSet, HostSpec, LbPolicy, LoadBalancer};
use metrics_exporter_prometheus::PrometheusBuilder;

/// The value of the sample line starting with `series ` in `text`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn picks_panic_mode_and_updates_are_recorded() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let addrs: Vec<SocketAddr> = (0..4)
            .map(|i| format!("127.0.0.1:{}", 9000 + i).parse().unwrap())
            .collect();
        let hosts = HostSet::new(addrs.iter().map(|&a| HostSpec::new(a)).collect()).unwrap();
        let balancer = LoadBalancer::new(hosts.clone(), LbPolicy::RoundRobin).unwrap();
        for _ in 0..100 {
            assert!(balancer.pick(None).is_some());
        }
        for &addr in &addrs[..3] {
            hosts.set_health(addr, Health::Unhealthy);
        }
        for _ in 0..10 {
            assert!(balancer.pick(None).is_some());
        }
        let text = handle.render();
        let policy = "{policy=\"round_robin\"}";
        assert_eq!(
            value(&text, &format!("balancer_picks_total{policy}")),
            110.0
        );
        assert_eq!(value(&text, &format!("balancer_panic_mode{policy}")), 1.0);
        assert_eq!(
            value(&text, &format!("balancer_panic_mode_entered_total{policy}")),
            1.0
        );
        assert_eq!(value(&text, "balancer_host_set_updates_total"), 3.0);

        // Health comes back; a set with no host yields failed picks.
        for &addr in &addrs[..3] {
            hosts.set_health(addr, Health::Healthy);
        }
        balancer.refresh();
        hosts.update(Vec::new()).unwrap();
        assert!(balancer.pick(None).is_none());
        let text = handle.render();
        assert_eq!(value(&text, &format!("balancer_panic_mode{policy}")), 0.0);
        assert_eq!(
            value(&text, &format!("balancer_pick_failures_total{policy}")),
            1.0
        );
        assert_eq!(value(&text, "balancer_host_set_updates_total"), 7.0);
        assert_eq!(
            value(&text, &format!("balancer_panic_mode_entered_total{policy}")),
            1.0
        );
    });
}
