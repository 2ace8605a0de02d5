//! A management server in trouble, against the real binary. It flaps (ends every stream every
//! 100 ms), sends a response over the size limit, sends a flood of clusters at once, sends
//! clusters that name each other in a loop, and falls silent. Through each, Legate serves the
//! last good config without failing a request, and takes the next good one once the server
//! behaves again.
//!
//! CI runs the short form. The long form sets `LEGATE_FAULT_SECONDS=60` (how long the server
//! flaps) and `LEGATE_FAULT_CLUSTERS=100000` (the flood), and prints the resident memory at
//! each step: `cargo test --release --test control_plane_faults -- --nocapture`.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
use envoy_types::pb::google::protobuf::Any;
use testbed::resources::{self, eds_cluster};
use testbed::xds::{SeenRequest, any, type_url};
use testbed::{ManagementServer, NoopHandle};

use common::xds::*;
use common::*;

const LIMIT: Duration = Duration::from_secs(20);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of `pid`, in MiB.
fn resident_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib / 1024
}

/// A proxy serving `/` from the cluster `backend` (EDS: `one`), its config from `server`.
struct Serving {
    server: ManagementServer,
    proxy: Proxy,
    addr: SocketAddr,
    one: NoopHandle,
    two: NoopHandle,
}

impl Serving {
    /// `protocol`: `sotw` or `delta`, and any other keys of `ads` after it.
    async fn start(protocol: &str, bootstrap_extra: &str) -> Serving {
        let (one, two) = upstreams().await;
        let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        serve_backend(&server, one.local_addr());
        let yaml = bootstrap(server.local_addr(), protocol) + bootstrap_extra;
        let proxy = Proxy::start(&yaml, 2);
        let addr = listener_address(&proxy, "web").await;
        let by_one = (200, one.local_addr().to_string());
        eventually("serving from the first host", async || {
            answer(addr, "/").await == by_one
        })
        .await;
        Serving {
            server,
            proxy,
            addr,
            one,
            two,
        }
    }

    fn admin(&self) -> SocketAddr {
        self.proxy.admin.unwrap()
    }

    /// Moves `backend` to the second host and waits until the proxy serves from it: the
    /// proof that it takes the server's config again.
    async fn follows_the_next_change(&self) {
        self.server.set(
            type_url::ENDPOINT,
            vec![assignment("backend", &[self.two.local_addr()])],
        );
        let by_two = (200, self.two.local_addr().to_string());
        eventually("the next change in force", async || {
            answer(self.addr, "/").await == by_two
        })
        .await;
    }

    /// Whether the proxy ACKs `type_url` in a request after the first `seen` the server
    /// recorded, with the type's current version (state of the world).
    async fn acked_after(&self, type_url: &str, seen: usize, limit: Duration) -> bool {
        let version = self.server.version(type_url);
        let acked = |requests: &[SeenRequest]| {
            requests.iter().skip(seen).any(|r| {
                r.type_url == type_url && r.is_ack() && (r.delta || r.version_info == version)
            })
        };
        self.server
            .wait_for(limit, |requests, _| acked(requests))
            .await
    }
}

async fn no_request_failed(steady: SteadyClient) {
    let (sent, failures) = steady.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {sent} failed: {failures:?}",
        failures.len()
    );
}

/// Every stream ended every 100 ms: the proxy reconnects each time, resynchronises, and
/// serves throughout.
async fn a_flapping_server_loses_no_request(protocol: &str) {
    let serving = Serving::start(protocol, "").await;
    let steady = SteadyClient::start(serving.addr).await;
    let pid = serving.proxy.pid();
    let before = resident_mib(pid);
    let flapping = Duration::from_secs(env_or("LEGATE_FAULT_SECONDS", 1));
    let until = Instant::now() + flapping;
    let mut resets = 0;
    while Instant::now() < until {
        serving.server.reset_streams();
        resets += 1;
        // The fault's own pace, not a wait for the proxy.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let streams = {
        let mut ids: Vec<u64> = serving.server.requests().iter().map(|r| r.stream).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    };
    // Reconnected after resets, not once: a stream that had a response waits at most 500 ms.
    assert!(streams >= 3, "{resets} resets, {streams} streams");
    serving.follows_the_next_change().await;
    let after = resident_mib(pid);
    eprintln!(
        "{protocol}: {resets} resets over {flapping:?}, {streams} streams; resident {before} MiB before, {after} MiB after"
    );
    // Each stream's state is freed with it: no growth in proportion to the resets.
    assert!(after <= before + 32, "{before} MiB then {after} MiB");
    no_request_failed(steady).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_the_world_survives_a_flapping_server() {
    a_flapping_server_loses_no_request("sotw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_survives_a_flapping_server() {
    a_flapping_server_loses_no_request("delta").await;
}

/// `count` clusters of one host each, with names long enough to weigh.
fn heavy_clusters(count: usize, host: SocketAddr) -> Vec<(String, Any)> {
    (0..count)
        .map(|i| {
            let name = format!("flood-{i:06}-{}", "x".repeat(100));
            let cluster = Cluster {
                name: name.clone(),
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::Static as i32,
                )),
                load_assignment: Some(resources::assignment(&name, &[host])),
                ..Default::default()
            };
            (name, any(&cluster))
        })
        .collect()
}

/// A response over `ads.max_message_size` is refused unread and counted; the config in
/// force stays; a response within the limit is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_size_limit_is_refused_and_the_config_stays() {
    // 64KiB: the least the limit may be.
    let serving = Serving::start("sotw, max_message_size: 64KiB", "").await;
    let (addr, admin) = (serving.addr, serving.admin());
    let by_one = (200, serving.one.local_addr().to_string());
    let steady = SteadyClient::start(addr).await;

    // 1,000 clusters with names of over 100 bytes: well over the 64 KiB limit.
    let mut flood = heavy_clusters(1000, serving.one.local_addr());
    flood.push(named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)));
    serving.server.set(type_url::CLUSTER, flood);
    eventually("the response refused", async || {
        stat(admin, "xds_response_too_large_total") >= 1
    })
    .await;
    assert_eq!(answer(addr, "/").await, by_one);
    assert_eq!(stat(admin, "xds_update_rejected_total"), 0);

    // Back within the limit: taken on the next stream.
    serving.server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster("backend", cluster::LbPolicy::RoundRobin))],
    );
    serving.server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[serving.two.local_addr()])],
    );
    let by_two = (200, serving.two.local_addr().to_string());
    eventually("the next response taken", async || {
        answer(addr, "/").await == by_two
    })
    .await;
    no_request_failed(steady).await;
}

/// A flood of clusters in one response is put in force and ACKed while requests go on; the
/// flood removed, its series are retired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_clusters_is_taken_while_serving() {
    let serving = Serving::start("delta", "stats: { retire_after: 1s }\n").await;
    let steady = SteadyClient::start(serving.addr).await;
    let pid = serving.proxy.pid();
    let before = resident_mib(pid);
    let count = env_or("LEGATE_FAULT_CLUSTERS", 2000) as usize;
    // The short form's deadline, and a millisecond per cluster beyond it for the long form.
    let limit = LIMIT + Duration::from_millis(count.saturating_sub(2000) as u64);
    let started = Instant::now();
    let mut flood = heavy_clusters(count, serving.one.local_addr());
    let last = flood.last().unwrap().0.clone();
    flood.push(named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)));
    let seen = serving.server.requests().len();
    serving.server.set(type_url::CLUSTER, flood);
    assert!(
        serving.acked_after(type_url::CLUSTER, seen, limit).await,
        "the flood ACKed"
    );
    let taken = started.elapsed();
    let during = resident_mib(pid);
    eprintln!(
        "{count} clusters taken in {taken:?}; resident {before} MiB before, {during} MiB with them"
    );
    // The last of them routes.
    serving.server.set(
        type_url::ROUTE,
        vec![route_config(
            "web-routes",
            &[("/flood", last.as_str()), ("/", "backend")],
        )],
    );
    let by_one = (200, serving.one.local_addr().to_string());
    eventually_within(limit, "a route to the last flooded cluster", async || {
        answer(serving.addr, "/flood").await.0 == 200
    })
    .await;
    assert_eq!(answer(serving.addr, "/").await, by_one);
    let admin = serving.admin();
    let (_, series) = admin_request(admin, "GET", "/stats?filter=flood-");
    assert!(!series.trim().is_empty(), "the flood's series in /stats");

    // Gone again, with their series.
    serving.server.set(
        type_url::ROUTE,
        vec![route_config("web-routes", &[("/", "backend")])],
    );
    serving.server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster("backend", cluster::LbPolicy::RoundRobin))],
    );
    let removed = Instant::now();
    eventually_within(limit, "the flood's series retired", async || {
        let (_, text) = admin_request(admin, "GET", "/stats?filter=flood-");
        text.trim().is_empty()
    })
    .await;
    let retired = removed.elapsed();
    // Their memory goes back to the system: at least half of what they added.
    let bound = before + (during - before) / 2;
    eventually_within(limit, "the flood's memory returned", async || {
        resident_mib(pid) <= bound
    })
    .await;
    eprintln!(
        "their series retired {retired:?} after their removal; resident {} MiB {:?} after it",
        resident_mib(pid),
        removed.elapsed()
    );
    serving.follows_the_next_change().await;
    no_request_failed(steady).await;
}

/// Two aggregate clusters that name each other: refused by name (NACK), as every aggregate
/// cluster is; the config in force stays and the next good one is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_that_name_each_other_are_refused_and_the_config_stays() {
    let serving = Serving::start("sotw", "").await;
    let steady = SteadyClient::start(serving.addr).await;
    let aggregate = |name: &str, of: &str| {
        let config = ClusterConfig {
            clusters: vec![of.to_owned()],
        };
        named(Cluster {
            name: name.into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::ClusterType(
                cluster::CustomClusterType {
                    name: "envoy.clusters.aggregate".into(),
                    typed_config: Some(any(&config)),
                },
            )),
            ..Default::default()
        })
    };
    serving.server.set(
        type_url::CLUSTER,
        vec![
            named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            aggregate("loop-a", "loop-b"),
            aggregate("loop-b", "loop-a"),
        ],
    );
    let nacked = serving
        .server
        .wait_for(LIMIT, |requests, _| {
            requests
                .iter()
                .any(|r| r.type_url == type_url::CLUSTER && r.is_nack())
        })
        .await;
    assert!(nacked, "the loop NACKed");
    let detail = serving
        .server
        .requests()
        .into_iter()
        .find_map(|r| r.error_detail)
        .unwrap();
    assert!(
        detail.contains("loop-a") && detail.contains("cluster_type"),
        "{detail}"
    );
    assert_eq!(
        answer(serving.addr, "/").await,
        (200, serving.one.local_addr().to_string())
    );
    serving.server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster("backend", cluster::LbPolicy::RoundRobin))],
    );
    serving.follows_the_next_change().await;
    no_request_failed(steady).await;
}

/// A server that stops answering (ACKs and all) while its streams stay open: the proxy
/// serves what it has, and takes what changed once the server speaks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_leaves_the_config_in_force_until_it_speaks() {
    let serving = Serving::start("delta", "").await;
    let steady = SteadyClient::start(serving.addr).await;
    serving.server.set_silent(true);
    let sent_before = serving.server.responses().len();
    // A change made while silent is not sent; the route keeps its host.
    serving.server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[serving.two.local_addr()])],
    );
    steady.keeps_going().await;
    // Nothing goes out while silent (a response would show within this wait).
    let spoke = serving
        .server
        .wait_for(Duration::from_millis(500), |_, responses| {
            responses.len() > sent_before
        })
        .await;
    assert!(!spoke, "a response was sent while silent");
    assert_eq!(
        answer(serving.addr, "/").await,
        (200, serving.one.local_addr().to_string())
    );
    assert_eq!(stat(serving.admin(), "control_plane_connected_state"), 1);
    serving.server.set_silent(false);
    let by_two = (200, serving.two.local_addr().to_string());
    eventually("the change taken once the server speaks", async || {
        answer(serving.addr, "/").await == by_two
    })
    .await;
    no_request_failed(steady).await;
}
