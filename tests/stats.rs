//! Stats through the real binary: a known request sequence must show up exactly in the
//! admin server's /stats/prometheus (parsed with a real Prometheus parser) and /workers.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use testbed::NoopUpstream;

fn admin_get(addr: SocketAddr, path: &str) -> String {
    let (status, body) = admin_request(addr, "GET", path);
    assert_eq!(status, 200, "{body}");
    body
}

/// Sample values by metric name and sorted `k=v` labels.
fn scrape(admin: SocketAddr) -> HashMap<String, f64> {
    let text = admin_get(admin, "/stats/prometheus");
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let mut out = HashMap::new();
    for sample in parsed.samples {
        let mut labels: Vec<String> = sample
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        labels.sort();
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Summary(_) | prometheus_parse::Value::Histogram(_) => continue,
        };
        out.insert(format!("{}{{{}}}", sample.metric, labels.join(",")), value);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_request_sequence_is_counted_exactly() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 2);
    let admin = proxy.admin.unwrap();
    let addr = proxy.addr();

    // 1000 requests over 50 connections (so both workers take some), every other one a 503.
    let mut clients = Vec::new();
    for c in 0..50 {
        clients.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            for i in 0..20 {
                let status = if (c * 20 + i) % 2 == 0 { "200" } else { "503" };
                let response = sender
                    .send_request(get("/", &[("x-noop-status", status)]))
                    .await
                    .unwrap();
                assert_eq!(response.status().as_str(), status);
                text(response.into_body()).await;
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }

    // The last responses' bookkeeping finishes as their bodies are dropped, and connections
    // close as the clients go: poll until both have settled. (A connection's worker and
    // listener gauges drop one after the other, so a scrape in between sees them apart.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let stats = scrape(admin);
        let value = |key: &str| stats.get(key).copied().unwrap_or(-1.0);
        let done = value("downstream_rq_active{listener=main}") == 0.0
            && value("downstream_rq_total{listener=main}") == 1000.0
            && value("worker_downstream_cx_active{worker=0}")
                + value("worker_downstream_cx_active{worker=1}")
                == value("downstream_cx_active{listener=main}");
        if done || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let get = |key: &str| {
        stats
            .get(key)
            .copied()
            .unwrap_or_else(|| panic!("no {key} in {stats:?}"))
    };
    assert_eq!(get("downstream_rq_total{listener=main}"), 1000.0);
    assert_eq!(get("downstream_rq_xx{code_class=2xx,listener=main}"), 500.0);
    assert_eq!(get("downstream_rq_xx{code_class=5xx,listener=main}"), 500.0);
    assert_eq!(get("downstream_cx_total{listener=main}"), 50.0);
    assert_eq!(
        get("downstream_rq_time_seconds_count{listener=main}"),
        1000.0
    );
    assert!(get("downstream_rq_time_seconds_mean{listener=main}") > 0.0);
    assert_eq!(get("upstream_rq_total{cluster=backend}"), 1000.0);
    assert_eq!(get("upstream_rq_xx{cluster=backend,code_class=5xx}"), 500.0);
    assert_eq!(
        get("upstream_rq_time_seconds_count{cluster=backend}"),
        1000.0
    );
    assert_eq!(get("upstream_rq_active{cluster=backend}"), 0.0);
    assert!(get("upstream_cx_total{cluster=backend}") >= 1.0);
    assert_eq!(get("server_concurrency{}"), 2.0);
    // Per worker in the Prometheus output too: both took requests, and they add up.
    let (w0, w1) = (
        get("worker_downstream_rq_total{worker=0}"),
        get("worker_downstream_rq_total{worker=1}"),
    );
    assert!(w0 > 0.0 && w1 > 0.0 && w0 + w1 == 1000.0, "{w0} + {w1}");
    assert_eq!(
        get("worker_downstream_cx_active{worker=0}") + get("worker_downstream_cx_active{worker=1}"),
        get("downstream_cx_active{listener=main}")
    );
    assert_eq!(get("server_live{}"), 1.0);

    // Per worker: both took connections, and the totals add up.
    let workers: serde_json::Value = serde_json::from_str(&admin_get(admin, "/workers")).unwrap();
    let list = workers["workers"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{workers}");
    let total: u64 = list
        .iter()
        .map(|w| w["downstream_rq_total"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 1000);
    assert!(
        list.iter()
            .all(|w| w["downstream_rq_total"].as_u64().unwrap() > 0),
        "{workers}"
    );

    let text = admin_get(admin, "/stats?filter=upstream_rq_time");
    assert!(text.contains("upstream_rq_time"), "{text}");
    assert!(text.contains("P99"), "{text}");
    assert!(!text.contains("downstream_cx_total"), "{text}");
    let text = admin_get(admin, "/stats?filter=%5Edownstream_rq_xx.*5xx.*worker");
    assert_eq!(text.lines().count(), 2, "one 5xx line per worker: {text}");
    // The same filter over JSON: the series whose text name matches, families left out.
    let filtered: serde_json::Value = serde_json::from_str(&admin_get(
        admin,
        "/stats?format=json&filter=%5Eupstream_rq_time%5C%7B",
    ))
    .unwrap();
    let names: Vec<&str> = filtered["stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|family| family["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["upstream_rq_time"], "{filtered}");
    assert_eq!(
        filtered["stats"][0]["series"][0]["count"], 1000,
        "{filtered}"
    );
    let (status, _) = admin_request(admin, "GET", "/stats?format=json&filter=(");
    assert_eq!(status, 400);

    let clusters: serde_json::Value = serde_json::from_str(&admin_get(admin, "/clusters")).unwrap();
    assert_eq!(
        clusters["clusters"][0]["hosts"][0]["address"],
        noop.local_addr().to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_and_timeouts_are_counted() {
    let closed = closed_port();
    let dead = closed.addr;
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[dead], "    per_endpoint_stats: true").replace(
        "clusters:",
        &format!(
            "clusters:\n  - name: slow\n    endpoints: [{}]\n    per_endpoint_stats: true\n",
            noop.local_addr()
        ),
    )
    .replace(
        "      - match: { prefix: / }",
        "      - match: { prefix: /slow }\n        cluster: slow\n        timeout: 200ms\n      - match: { prefix: / }",
    );
    let proxy = Proxy::start(&config, 1);
    for _ in 0..3 {
        let r = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(r.status(), 503);
    }
    let r = send_h1(proxy.addr(), get("/slow", &[("x-noop-delay", "2s")])).await;
    assert_eq!(r.status(), 504);
    let r = send_h1(proxy.addr(), get("/slow", &[("x-noop-status", "503")])).await;
    assert_eq!(r.status(), 503);
    text(r.into_body()).await;
    let r = send_h1(proxy.addr(), get("/slow", &[])).await;
    assert_eq!(r.status(), 200);
    text(r.into_body()).await;
    let admin = proxy.admin.unwrap();
    // The last response is counted as its body is dropped.
    stat_settled(admin, "host_rq_success", 1);
    let stats = scrape(admin);
    assert_eq!(stats["upstream_cx_connect_fail{cluster=backend}"], 3.0);
    assert_eq!(stats["upstream_rq_timeout{cluster=slow}"], 1.0);
    assert_eq!(stats["downstream_rq_xx{code_class=5xx,listener=main}"], 5.0);
    // Each host's own counts (per_endpoint_stats).
    let (dead, live) = (dead.to_string(), noop.local_addr().to_string());
    let host = |name: &str, cluster: &str, host: &str| {
        stats[&format!("{name}{{cluster={cluster},host={host}}}")]
    };
    assert_eq!(host("host_cx_connect_fail", "backend", &dead), 3.0);
    assert_eq!(host("host_rq_total", "backend", &dead), 3.0);
    assert_eq!(host("host_rq_error", "backend", &dead), 3.0);
    assert_eq!(host("host_rq_total", "slow", &live), 3.0);
    assert_eq!(host("host_rq_timeout", "slow", &live), 1.0);
    assert_eq!(
        host("host_rq_error", "slow", &live),
        2.0,
        "the timeout and the 503"
    );
    assert_eq!(host("host_rq_success", "slow", &live), 1.0);
    assert!(host("host_cx_total", "slow", &live) >= 1.0);
}

/// A histogram's cumulative bucket counts by `le`, from /stats/prometheus.
fn buckets(admin: SocketAddr, metric: &str, label: (&str, &str)) -> Vec<(f64, f64)> {
    let text = admin_get(admin, "/stats/prometheus");
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    parsed
        .samples
        .into_iter()
        .find_map(|sample| match sample.value {
            prometheus_parse::Value::Histogram(counts)
                if sample.metric == metric && sample.labels.get(label.0) == Some(label.1) =>
            {
                Some(counts.iter().map(|c| (c.less_than, c.count)).collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no histogram {metric} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucketed_histograms_add_up_across_processes() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "").replace(
        "listeners:",
        "stats: { histogram_buckets: [100ms, 150ms, 10s] }\nlisteners:",
    );
    let (slow, fast) = (Proxy::start(&config, 1), Proxy::start(&config, 1));
    // Ten requests the upstream holds for 200 ms through one proxy, thirty at once through
    // the other.
    let (n_slow, n_fast) = (10u32, 30u32);
    for _ in 0..n_slow {
        let r = send_h1(slow.addr(), get("/", &[("x-noop-delay", "200ms")])).await;
        assert_eq!(r.status(), 200);
        text(r.into_body()).await;
    }
    for _ in 0..n_fast {
        let r = send_h1(fast.addr(), get("/", &[])).await;
        assert_eq!(r.status(), 200);
        text(r.into_body()).await;
    }
    let label = ("cluster", "backend");
    let metric = "upstream_rq_time_seconds";
    let mut per_process = Vec::new();
    for (proxy, want) in [(&slow, n_slow), (&fast, n_fast)] {
        let admin = proxy.admin.unwrap();
        // Counted once the exchange is done: wait for the count.
        eventually("every request counted", async || {
            buckets(admin, metric, label).last().map(|c| c.1) == Some(f64::from(want))
        })
        .await;
        let counts = buckets(admin, metric, label);
        let les: Vec<f64> = counts.iter().map(|c| c.0).collect();
        assert_eq!(les, [0.1, 0.15, 10.0, f64::INFINITY]);
        assert!(counts.windows(2).all(|w| w[0].1 <= w[1].1), "{counts:?}");
        per_process.push(counts.iter().map(|c| c.1).collect::<Vec<f64>>());
    }
    let (slow_counts, fast_counts) = (&per_process[0], &per_process[1]);
    // Held 200 ms: none at or under 100 ms or 150 ms, all under 10 s.
    assert_eq!(slow_counts, &[0.0, 0.0, 10.0, 10.0]);
    assert_eq!(fast_counts[2], f64::from(n_fast), "{fast_counts:?}");
    // Summed bucket by bucket, as a fleet's query sums them: the same bounds in both, every
    // request counted once, and the fast proxy's alone under 150 ms.
    let summed: Vec<f64> = (0..4).map(|i| slow_counts[i] + fast_counts[i]).collect();
    assert_eq!(summed[1], fast_counts[1]);
    assert_eq!(summed[2..], [f64::from(n_slow + n_fast); 2]);
}

/// Two clusters behind path routes; `gone` only when its host is given. `kept`'s hosts are
/// `kept_hosts`, with a connect timeout of `timeout` seconds (changing it changes the
/// cluster), and per-host counters.
fn churn_config(kept_hosts: &[SocketAddr], timeout: u32, gone: Option<SocketAddr>) -> String {
    let kept_hosts: Vec<String> = kept_hosts.iter().map(ToString::to_string).collect();
    let kept_hosts = kept_hosts.join(", ");
    let (route, cluster) = match gone {
        Some(host) => (
            "      - match: { prefix: /gone }\n        cluster: gone\n".to_owned(),
            format!("  - name: gone\n    endpoints: [{host}]\n"),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
stats: {{ retire_after: 1s }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
{route}      - match: {{ prefix: / }}
        cluster: kept
clusters:
  - name: kept
    endpoints: [{kept_hosts}]
    connect_timeout: {timeout}s
    per_endpoint_stats: true
{cluster}"#
    )
}

/// What an endpoint churn leaves behind: nothing, once `retire_after` has passed. A removed
/// cluster's series and a removed host's leave /stats/prometheus (their memory with them),
/// while a kept cluster's stay even with no request since the change; a cluster added again
/// counts from zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_of_removed_clusters_and_hosts_are_retired_and_come_back_from_zero() {
    let first = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let second = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let third = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (a, b, c) = (first.local_addr(), second.local_addr(), third.local_addr());
    let proxy = Proxy::start(&churn_config(&[a, c], 1, Some(b)), 2);
    let (addr, admin) = (proxy.addr(), proxy.admin.unwrap());
    let request = async |path: &str| {
        let response = send_h1(addr, get(path, &[("connection", "close")])).await;
        assert_eq!(response.status(), 200);
        text(response.into_body()).await;
    };
    request("/gone").await;
    // Both of `kept`'s hosts take requests (round robin on each worker).
    let old_host = format!("host_rq_total{{cluster=kept,host={a}}}");
    let staying = format!("host_rq_total{{cluster=kept,host={c}}}");
    let mut sent = 0;
    while !(scrape(admin).contains_key(&old_host) && scrape(admin).contains_key(&staying)) {
        assert!(sent < 50, "{sent} requests never reached both hosts");
        request("/").await;
        sent += 1;
    }
    let kept_total = "upstream_rq_total{cluster=kept}";
    let gone_total = "upstream_rq_total{cluster=gone}";
    let before = scrape(admin);
    assert_eq!(before.get(kept_total), Some(&f64::from(sent)), "{before:?}");
    assert_eq!(before.get(gone_total), Some(&1.0), "{before:?}");
    let staying_count = before[&staying];

    // `gone` removed; `kept` changed: `a` replaced by `b`, `c` stays.
    proxy.rewrite_config(&churn_config(&[b, c], 2, None));
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    eventually(
        "the removed cluster's and host's series retired",
        async || {
            let now = scrape(admin);
            !now.keys()
                .any(|k| k.contains("cluster=gone") || k.contains(&a.to_string()))
        },
    )
    .await;
    // The kept cluster changed (a new host, a new timeout) and took no request since: its
    // counts stay, and those of its host that stayed.
    let after = scrape(admin);
    assert_eq!(after.get(kept_total), Some(&f64::from(sent)), "{after:?}");
    assert_eq!(after.get(&staying), Some(&staying_count), "{after:?}");

    // Added again: counted from zero.
    proxy.rewrite_config(&churn_config(&[b, c], 2, Some(a)));
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    let response = send_h1(addr, get("/gone", &[("connection", "close")])).await;
    assert_eq!(response.status(), 200);
    text(response.into_body()).await;
    assert_eq!(scrape(admin).get(gone_total), Some(&1.0));
}
