//! Priorities and localities through the real binary: a cluster shaped as Envoy Gateway sends
//! it (`load_balancing_policy` LeastRequest with locality weighting, `common_lb_config`,
//! `ignore_health_on_host_removal`) with endpoints at two priorities, failing over as the
//! management server marks hosts unhealthy and coming back; locality weights from the file;
//! and failover driven by active health checks, where retries with `previous_priorities`
//! lose no request; zone-aware routing from the local cluster.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, LoadBalancingPolicy, cluster, load_balancing_policy,
};
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Locality, TypedExtensionConfig};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::{
    LocalityLbConfig, locality_lb_config,
};
use envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest;
use envoy_types::pb::google::protobuf::UInt32Value;
use testbed::resources::{self, eds_cluster};
use testbed::xds::{any, type_url};
use testbed::{ManagementServer, NoopUpstream};

use common::*;

/// How many of `n` requests each upstream served (by `x-noop-served-by`), over one HTTP/2
/// connection; every request must succeed.
async fn served_by(addr: SocketAddr, n: usize) -> HashMap<String, usize> {
    served_at(addr, "/", n).await
}

async fn served_at(addr: SocketAddr, path: &str, n: usize) -> HashMap<String, usize> {
    let (mut client, _task) = h2_client(addr).await;
    let mut counts = HashMap::new();
    for _ in 0..n {
        let res = client.send_request(get_h2(path, &[])).await.unwrap();
        assert_eq!(res.status(), 200);
        let by = res.headers()["x-noop-served-by"]
            .to_str()
            .unwrap()
            .to_owned();
        *counts.entry(by).or_insert(0) += 1;
    }
    counts
}

fn share(counts: &HashMap<String, usize>, upstreams: &[SocketAddr]) -> f64 {
    let total: usize = counts.values().sum();
    let hits: usize = upstreams
        .iter()
        .map(|u| counts.get(&u.to_string()).copied().unwrap_or(0))
        .sum();
    hits as f64 / total as f64
}

/// The cluster `backend` as Envoy Gateway writes it (its `http-route` scenario).
fn gateway_cluster() -> Cluster {
    let mut c = eds_cluster("backend", cluster::LbPolicy::RoundRobin);
    c.common_lb_config = Some(Default::default());
    c.ignore_health_on_host_removal = true;
    c.per_connection_buffer_limit_bytes = Some(UInt32Value { value: 32768 });
    let policy = LeastRequest {
        locality_lb_config: Some(LocalityLbConfig {
            locality_config_specifier: Some(
                locality_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                    Default::default(),
                ),
            ),
        }),
        ..Default::default()
    };
    c.load_balancing_policy = Some(LoadBalancingPolicy {
        policies: vec![load_balancing_policy::Policy {
            typed_extension_config: Some(TypedExtensionConfig {
                name: "envoy.load_balancing_policies.least_request".into(),
                typed_config: Some(any(&policy)),
            }),
        }],
    });
    c
}

/// One locality per priority, as Envoy Gateway writes a backend and its fallback:
/// `(priority, hosts with their EDS health)`.
fn assignment(levels: &[(u32, &[(SocketAddr, HealthStatus)])]) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: "backend".into(),
        endpoints: levels
            .iter()
            .map(|(priority, hosts)| LocalityLbEndpoints {
                locality: Some(Locality {
                    region: format!("backend/{priority}"),
                    ..Default::default()
                }),
                load_balancing_weight: Some(UInt32Value { value: 1 }),
                priority: *priority,
                lb_endpoints: hosts
                    .iter()
                    .map(|(addr, health)| LbEndpoint {
                        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                            address: resources::socket(*addr),
                            ..Default::default()
                        })),
                        health_status: *health as i32,
                        load_balancing_weight: Some(UInt32Value { value: 1 }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_fail_over_and_back_as_the_management_server_marks_hosts() {
    let upstreams: Vec<_> = futures_upstreams(3).await;
    let [a, b, c] = [0, 1, 2].map(|i| upstreams[i].local_addr());
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    server.set(
        type_url::LISTENER,
        vec![(
            "web".into(),
            any(&resources::listener(
                "web",
                "127.0.0.1:0".parse().unwrap(),
                "web-routes",
            )),
        )],
    );
    server.set(
        type_url::ROUTE,
        vec![(
            "web-routes".into(),
            any(&resources::route_config(
                "web-routes",
                vec![resources::forward("/", "backend")],
            )),
        )],
    );
    server.set(
        type_url::CLUSTER,
        vec![("backend".into(), any(&gateway_cluster()))],
    );
    let set_endpoints = |health_a: HealthStatus, health_b: HealthStatus| {
        server.set(
            type_url::ENDPOINT,
            vec![(
                "backend".into(),
                any(&assignment(&[
                    (0, &[(a, health_a), (b, health_b)]),
                    (1, &[(c, HealthStatus::Healthy)]),
                ])),
            )],
        );
    };
    set_endpoints(HealthStatus::Healthy, HealthStatus::Healthy);
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{}\" }} }}\n",
        server.local_addr()
    );
    let proxy = Proxy::start(&config, 2);
    let admin = proxy.admin.unwrap();
    let addr = listener_address(admin).await;

    // Priority 0 whole: it takes everything.
    eventually("the endpoints in force", async || {
        share(&served_by(addr, 20).await, &[a, b]) == 1.0
    })
    .await;
    assert_eq!(share(&served_by(addr, 300).await, &[a, b]), 1.0);
    let (_, clusters) = admin_request(admin, "GET", "/clusters");
    let clusters: serde_json::Value = serde_json::from_str(&clusters).unwrap();
    let hosts = clusters["clusters"][0]["hosts"].as_array().unwrap();
    let c_host = hosts
        .iter()
        .find(|h| h["address"] == c.to_string())
        .unwrap();
    assert_eq!(
        (c_host["priority"].as_u64(), c_host["locality"].as_str()),
        (Some(1), Some("backend/1"))
    );
    assert_eq!(clusters["clusters"][0]["locality_weighted"], true);

    // One of two unhealthy: priority 0 is 1.4 x 50% = 70% available, priority 1 takes 30%.
    // Over 2000 requests the share is within 0.05 of that at over four standard deviations.
    set_endpoints(HealthStatus::Unhealthy, HealthStatus::Healthy);
    eventually("a's health in force", async || {
        !served_by(addr, 20).await.contains_key(&a.to_string())
            && share(&served_by(addr, 100).await, &[c]) > 0.0
    })
    .await;
    let counts = served_by(addr, 2000).await;
    assert_eq!(
        counts.get(&a.to_string()),
        None,
        "an unhealthy host gets nothing"
    );
    let to_c = share(&counts, &[c]);
    assert!((to_c - 0.30).abs() < 0.05, "priority 1 took {to_c:.3}");

    // Both down (draining, as a rollout marks them): everything to priority 1.
    set_endpoints(HealthStatus::Draining, HealthStatus::Unhealthy);
    eventually("priority 1 takes everything", async || {
        share(&served_by(addr, 50).await, &[c]) == 1.0
    })
    .await;
    assert_eq!(share(&served_by(addr, 300).await, &[c]), 1.0);

    // Back: everything to priority 0 again.
    set_endpoints(HealthStatus::Healthy, HealthStatus::Healthy);
    eventually("priority 0 takes everything again", async || {
        share(&served_by(addr, 50).await, &[a, b]) == 1.0
    })
    .await;
    assert_eq!(share(&served_by(addr, 300).await, &[a, b]), 1.0);
}

async fn futures_upstreams(n: usize) -> Vec<testbed::NoopHandle> {
    let mut upstreams = Vec::with_capacity(n);
    for _ in 0..n {
        upstreams.push(
            NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap(),
        );
    }
    upstreams
}

/// The bound address of listener `web` once it is in force.
async fn listener_address(admin: SocketAddr) -> SocketAddr {
    let mut found = None;
    eventually("listener web in force", async || {
        let (_, body) = admin_request(admin, "GET", "/config_dump");
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
        found = dump["listeners"].as_array().and_then(|l| {
            l.iter()
                .find(|l| l["name"] == "web")
                .and_then(|l| l["bound_address"].as_str()?.parse().ok())
        });
        found.is_some()
    })
    .await;
    found.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localities_share_load_by_weight_from_the_file() {
    let upstreams = futures_upstreams(3).await;
    let [a, b, c] = [0, 1, 2].map(|i| upstreams[i].local_addr());
    let proxy = Proxy::start(
        &format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    locality_weighted: true
    endpoints:
      - {{ address: "{a}", locality: eu/a, locality_weight: 1 }}
      - {{ address: "{b}", locality: eu/a, locality_weight: 1 }}
      - {{ address: "{c}", locality: eu/b, locality_weight: 3 }}
"#
        ),
        2,
    );
    // Locality eu/b has one host but three times the weight: 75% of the load. Over 2000
    // requests the share is within 0.05 of that at over five standard deviations.
    let counts = served_by(proxy.addr(), 2000).await;
    let to_c = share(&counts, &[c]);
    assert!((to_c - 0.75).abs() < 0.05, "locality eu/b took {to_c:.3}");
    assert!(share(&counts, &[a]) > 0.05 && share(&counts, &[b]) > 0.05);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_aware_routing_keeps_the_local_zones_share_and_spreads_the_rest_by_spare_capacity() {
    // Envoy's worked example: the proxies are 40/40/20 % across three zones, the upstream
    // hosts 25/50/25 %. This proxy, in zone a, keeps 25/40 = 62.5% of its requests in zone a
    // and sends the rest to the zones with more hosts than proxies, b (1000 of 10000 spare)
    // and c (500): 25% and 12.5%.
    let upstreams = futures_upstreams(8).await;
    let addrs: Vec<SocketAddr> = upstreams.iter().map(|u| u.local_addr()).collect();
    let zone_of = |i: usize| match i {
        0..=1 => "a",
        2..=5 => "b",
        _ => "c",
    };
    let endpoints: String = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "      - {{ address: \"{a}\", locality: eu/{}/ }}\n",
                zone_of(i)
            )
        })
        .collect();
    // The fleet's hosts are only counted, never connected to.
    let fleet: String = (0..10)
        .map(|i| {
            let zone = ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"][i];
            format!(
                "      - {{ address: \"127.0.0.9:{}\", locality: eu/{zone}/ }}\n",
                1000 + i
            )
        })
        .collect();
    let proxy = Proxy::start(
        &format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
node: {{ locality: {{ region: eu, zone: a }} }}
cluster_manager: {{ local_cluster_name: fleet }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: fleet
    endpoints:
{fleet}  - name: backend
    zone_aware: {{ min_cluster_size: 6 }}
    endpoints:
{endpoints}"#
        ),
        2,
    );
    let total = 10_000;
    let counts = served_by(proxy.addr(), total).await;
    let zone_share = |zone: &str| {
        let hosts: Vec<SocketAddr> = (0..8)
            .filter(|&i| zone_of(i) == zone)
            .map(|i| addrs[i])
            .collect();
        share(&counts, &hosts)
    };
    // 10,000 requests: each share within 0.025 of its mean at over five standard deviations.
    for (zone, expected) in [("a", 0.625), ("b", 0.25), ("c", 0.125)] {
        let got = zone_share(zone);
        assert!(
            (got - expected).abs() < 0.025,
            "zone {zone} took {got:.4}, expected {expected}"
        );
    }
    let admin = proxy.admin.unwrap();
    let sampled = stat(admin, "lb_zone_routing_sampled");
    let cross = stat(admin, "lb_zone_routing_cross_zone");
    assert_eq!(sampled + cross, total as i64);
    assert!(
        (sampled as f64 / total as f64 - 0.625).abs() < 0.025,
        "{sampled}"
    );
    assert_eq!(stat(admin, "lb_zone_routing_all_directly"), 0);
    // Worked out once per worker that picked (two here), and found fit to route.
    let recalculated = stat(admin, "lb_recalculate_zone_structures");
    assert!((1..=2).contains(&recalculated), "{recalculated}");
    assert_eq!(stat(admin, "lb_zone_cluster_too_small"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_fail_a_priority_over_and_retries_lose_nothing() {
    let standby = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dead = closed_port();
    let (dead, standby_addr) = (dead.addr, standby.local_addr());
    let proxy = Proxy::start(
        &format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /retried }}
        cluster: unchecked
        retry_policy:
          retry_on: [connect-failure]
          num_retries: 2
          previous_priorities: 1
      - match: {{ prefix: / }}
        cluster: checked
clusters:
  - name: unchecked
    endpoints: ["{dead}", {{ address: "{standby_addr}", priority: 1 }}]
  - name: checked
    endpoints: ["{dead}", {{ address: "{standby_addr}", priority: 1 }}]
    health_check: {{ path: /healthz, interval: 100ms, timeout: 1s, unhealthy_threshold: 1 }}
"#
        ),
        1,
    );
    let admin = proxy.admin.unwrap();
    // Nothing marks the dead priority-0 host: every request tries it first, and its retry
    // goes to priority 1 (previous_priorities leaves the level tried out, where
    // previous_hosts alone would pick the only priority-0 host again). None fails.
    let counts = served_at(proxy.addr(), "/retried", 50).await;
    assert_eq!(share(&counts, &[standby_addr]), 1.0);
    assert_eq!(
        stat(admin, "upstream_rq_retry"),
        50,
        "each request retried once"
    );

    // Once the health check has marked the host, priority 1 takes everything, no try wasted.
    eventually("the dead host marked unhealthy", async || {
        let (_, body) = admin_request(admin, "GET", "/clusters");
        let clusters: serde_json::Value = serde_json::from_str(&body).unwrap();
        clusters["clusters"][1]["hosts"][0]["health"] == "unhealthy"
    })
    .await;
    let counts = served_by(proxy.addr(), 200).await;
    assert_eq!(share(&counts, &[standby_addr]), 1.0);
    assert_eq!(
        stat(admin, "upstream_cx_connect_fail"),
        50,
        "only the retried tries failed"
    );
}
