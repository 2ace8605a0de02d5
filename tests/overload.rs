//! Overload protection through the real binary: circuit breakers that scale with the worker
//! count and answer a fast 503 with `x-legate-overloaded: true`, a bounded pending queue,
//! retries, health checks and outlier detection.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use testbed::NoopUpstream;

/// `n` requests at once, each on its own connection: (status, overloaded header) each.
async fn burst(
    addr: SocketAddr,
    n: usize,
    headers: &'static [(&'static str, &'static str)],
) -> Vec<(u16, bool)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let res =
                    tokio::time::timeout(Duration::from_secs(60), send_h1(addr, get("/", headers)))
                        .await
                        .expect("no request hangs");
                let overloaded = res
                    .headers()
                    .get("x-legate-overloaded")
                    .is_some_and(|v| v == "true");
                let status = res.status().as_u16();
                let _ = text(res.into_body()).await;
                (status, overloaded)
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

fn count(results: &[(u16, bool)], status: u16, overloaded: bool) -> usize {
    results
        .iter()
        .filter(|r| **r == (status, overloaded))
        .count()
}

fn breaker_config(upstream: SocketAddr, breakers: &str) -> String {
    forward_config(&[upstream], &format!("    circuit_breakers: {breakers}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_requests_per_core_admits_twenty_of_a_hundred_on_two_workers() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = breaker_config(noop.local_addr(), "{ max_requests: { per_core: 10 } }");
    let proxy = Proxy::start(&config, 2);
    let admin = proxy.admin.unwrap();
    assert_eq!(stat(admin, "circuit_breakers_remaining_rq"), 20);

    // Each admitted request holds its slot for 3 s, far longer than opening 100 connections
    // takes even on a busy machine.
    let results = burst(proxy.addr(), 100, &[("x-noop-delay", "3s")]).await;
    assert_eq!(count(&results, 200, false), 20, "{results:?}");
    assert_eq!(count(&results, 503, true), 80, "{results:?}");
    assert_eq!(noop.requests(), 20);
    assert_eq!(stat(admin, "upstream_rq_pending_overflow"), 80);
    assert_eq!(stat(admin, "upstream_rq_total"), 20);
    assert_eq!(
        stat(admin, "circuit_breakers_remaining_rq"),
        20,
        "all slots given back"
    );
    assert!(proxy.wait_for_log("circuit breaker open", Duration::from_secs(20)));
}

#[test]
fn per_core_limits_resolve_against_the_worker_count() {
    let config = breaker_config(
        "127.0.0.1:9".parse().unwrap(),
        "{ max_requests: { per_core: 10 }, max_connections: 7 }",
    );
    for (workers, expected) in [(1, 10), (4, 40)] {
        let proxy = Proxy::start(&config, workers);
        let admin = proxy.admin.unwrap();
        let (_, dump) = admin_request(admin, "GET", "/config_dump");
        let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
        let breakers = &dump["clusters"][0]["circuit_breakers"];
        assert_eq!(breakers["max_requests"]["per_core"], 10);
        assert_eq!(breakers["max_requests"]["resolved"], expected);
        assert_eq!(breakers["max_connections"]["resolved"], 7);
        assert_eq!(stat(admin, "circuit_breakers_remaining_rq"), expected);
        assert_eq!(stat(admin, "circuit_breakers_rq_open"), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_queues_up_to_max_pending_and_refuses_the_rest() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = breaker_config(
        noop.local_addr(),
        "{ max_connections: { per_core: 5 }, max_pending_requests: { per_core: 10 }, pending_timeout: 60s }",
    )
    // Three rounds of 3 s, longer still on a busy machine: not the 15 s default route timeout.
    .replace(
        "        cluster: backend\n",
        "        cluster: backend\n        timeout: 60s\n",
    );
    let proxy = Proxy::start(&config, 2);
    let admin = proxy.admin.unwrap();

    // 10 connections carry 10 requests at a time; 20 wait their turn; 70 are refused.
    // Upstream connections open at once, sampled through the burst.
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = std::thread::spawn({
        let sampling = std::sync::Arc::clone(&sampling);
        move || {
            let mut most = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(stat(admin, "upstream_cx_active"));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        }
    });
    let results = burst(proxy.addr(), 100, &[("x-noop-delay", "3s")]).await;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let most_connections = sampler.join().unwrap();
    assert_eq!(count(&results, 200, false), 30, "{results:?}");
    assert_eq!(count(&results, 503, true), 70, "{results:?}");
    assert_eq!(stat(admin, "upstream_rq_pending_overflow"), 70);
    assert_eq!(stat(admin, "upstream_rq_pending_total"), 20);
    assert_eq!(stat(admin, "upstream_rq_pending_timeout"), 0);
    assert_eq!(noop.requests(), 30);
    assert!(
        (1..=10).contains(&most_connections),
        "{most_connections} upstream connections at once"
    );
    assert_eq!(stat(admin, "circuit_breakers_remaining_pending"), 20);
    assert_eq!(stat(admin, "upstream_rq_pending_active"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_pending_longer_than_pending_timeout_gets_503() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = breaker_config(
        noop.local_addr(),
        "{ max_connections: 1, max_pending_requests: 10, pending_timeout: 200ms }",
    );
    let proxy = Proxy::start(&config, 1);
    let admin = proxy.admin.unwrap();
    let results = burst(proxy.addr(), 3, &[("x-noop-delay", "2s")]).await;
    assert_eq!(count(&results, 200, false), 1, "{results:?}");
    assert_eq!(count(&results, 503, true), 2, "{results:?}");
    assert_eq!(stat(admin, "upstream_rq_pending_timeout"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_resets_is_retried_on_another_host() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let resetting = testbed::FailingOrigin::bind(
        "127.0.0.1:0".parse().unwrap(),
        testbed::FailureMode::CloseWithoutResponse,
    )
    .await
    .unwrap();
    let config = forward_config(&[resetting.local_addr(), noop.local_addr()], "").replace(
        "        cluster: backend\n",
        "        cluster: backend\n        retry_policy: { retry_on: [reset, connect-failure], num_retries: 2 }\n",
    );
    let proxy = Proxy::start(&config, 1);
    let admin = proxy.admin.unwrap();
    for i in 0..20 {
        // Half are uploads: the recorded body is sent again whole.
        let body = format!("body of request {i}");
        let req = http::Request::post("/")
            .header("host", "legate.test")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        let res = send_h1(proxy.addr(), req).await;
        assert_eq!(res.status(), 200, "request {i}");
        assert_eq!(
            res.headers()["x-noop-request-bytes"],
            body.len().to_string().as_str()
        );
    }
    let retries = stat(admin, "upstream_rq_retry");
    assert!(
        retries >= 10,
        "round robin sends every other first try to the bad host: {retries}"
    );
    assert_eq!(stat(admin, "upstream_rq_retry_success"), retries);
    assert_eq!(stat(admin, "upstream_rq_retry_limit_exceeded"), 0);
    assert_eq!(noop.requests(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_at_num_retries_and_at_max_retries() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "    circuit_breakers: { max_retries: 1 }")
        .replace(
            "        cluster: backend\n",
            "        cluster: backend\n        retry_policy: { retry_on: [retriable-status-codes], retriable_status_codes: [503], num_retries: 2 }\n",
        );
    let proxy = Proxy::start(&config, 1);
    let admin = proxy.admin.unwrap();
    // Always 503: tried 3 times, then the 503 goes to the client.
    let res = send_h1(proxy.addr(), get("/", &[("x-noop-status", "503")])).await;
    assert_eq!(res.status(), 503);
    assert!(res.headers().get("x-legate-overloaded").is_none());
    assert_eq!(noop.requests(), 3);
    assert_eq!(stat(admin, "upstream_rq_retry"), 2);
    assert_eq!(stat(admin, "upstream_rq_retry_limit_exceeded"), 1);
    assert_eq!(
        stat(admin, "circuit_breakers_remaining_retries"),
        1,
        "retry slots given back"
    );

    // Two at once that each want a retry: max_retries 1 lets one of them retry.
    let slow_503 = [("x-noop-status", "503"), ("x-noop-delay", "1s")];
    let (a, b) = tokio::join!(
        send_h1(proxy.addr(), get("/", &slow_503)),
        send_h1(proxy.addr(), get("/", &slow_503)),
    );
    assert_eq!(
        (a.status(), b.status()),
        (503.try_into().unwrap(), 503.try_into().unwrap())
    );
    assert!(stat(admin, "upstream_rq_retry_overflow") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_budget_takes_the_place_of_max_retries() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let retried = "        retry_policy: { retry_on: [retriable-status-codes], retriable_status_codes: [503], num_retries: 2 }\n";
    let yaml = |budget: &str| {
        forward_config(
            &[noop.local_addr()],
            &format!("    circuit_breakers: {{ max_retries: 100, retry_budget: {budget} }}"),
        )
        .replace(
            "        cluster: backend\n",
            &format!("        cluster: backend\n{retried}"),
        )
    };
    // A budget of nothing: no retry, whatever max_retries says.
    let proxy = Proxy::start(&yaml("{ budget_percent: 0, min_retry_concurrency: 0 }"), 1);
    let admin = proxy.admin.unwrap();
    let res = send_h1(proxy.addr(), get("/", &[("x-noop-status", "503")])).await;
    assert_eq!(res.status(), 503);
    assert_eq!(noop.requests(), 1);
    assert_eq!(stat(admin, "upstream_rq_retry_overflow"), 1);
    assert_eq!(stat(admin, "upstream_rq_retry"), 0);
    drop(proxy);

    // Envoy's defaults (20%, at least 3): one request alone may retry.
    let proxy = Proxy::start(&yaml("{}"), 1);
    let admin = proxy.admin.unwrap();
    let res = send_h1(proxy.addr(), get("/", &[("x-noop-status", "503")])).await;
    assert_eq!(res.status(), 503);
    assert_eq!(noop.requests(), 4);
    assert_eq!(stat(admin, "upstream_rq_retry"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_per_host_keeps_each_host_to_its_limit() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // Envoy Gateway's `circuit-breaker` scenario: one connection per host, the rest wait.
    let config = breaker_config(
        noop.local_addr(),
        "{ max_connections_per_host: 1, pending_timeout: 60s }",
    )
    .replace(
        "        cluster: backend\n",
        "        cluster: backend\n        timeout: 60s\n",
    );
    let proxy = Proxy::start(&config, 1);
    let admin = proxy.admin.unwrap();
    // Eight at once: one connection carries them one after the other.
    let results = burst(proxy.addr(), 8, &[("x-noop-delay", "50ms")]).await;
    assert_eq!(count(&results, 200, false), 8, "{results:?}");
    assert_eq!(noop.connections(), 1, "one connection to the host");
    assert!(stat(admin, "upstream_cx_overflow") >= 1);
    assert_eq!(stat(admin, "upstream_rq_pending_timeout"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_connection_to_a_host_at_its_limit_may_open_one() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // HTTP/2 keeps each worker's connection open: under a per-host limit of one, the other
    // worker would wait out pending_timeout without Envoy's rule that a worker with no
    // connection to the host opens one anyway.
    let config = breaker_config(
        noop.local_addr(),
        "{ max_connections_per_host: 1, pending_timeout: 60s }\n    protocol: http2",
    );
    let proxy = Proxy::start(&config, 2);
    let admin = proxy.admin.unwrap();
    for _ in 0..4 {
        let results = burst(proxy.addr(), 8, &[]).await;
        assert_eq!(count(&results, 200, false), 8, "{results:?}");
    }
    assert!(
        noop.connections() <= 2,
        "{} connections",
        noop.connections()
    );
    assert_eq!(stat(admin, "upstream_rq_pending_timeout"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_past_max_connection_pools_is_refused_until_one_closes() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (a, b) = (
        NoopUpstream::start_in_thread(any).unwrap(),
        NoopUpstream::start_in_thread(any).unwrap(),
    );
    let proxy = Proxy::start(
        &forward_config(
            &[a.local_addr(), b.local_addr()],
            "    idle_timeout: 300ms\n    circuit_breakers: { max_connection_pools: 1 }",
        ),
        1,
    );
    let admin = proxy.admin.unwrap();
    // Round robin: the first host's pool keeps its connection, so the second host's pool
    // would be a second one.
    assert_eq!(send_h1(proxy.addr(), get("/", &[])).await.status(), 200);
    assert_eq!(send_h1(proxy.addr(), get("/", &[])).await.status(), 503);
    assert_eq!(stat(admin, "upstream_cx_pool_overflow"), 1);
    // A pool's connection closes when idle: its slot is free again, for either host (the
    // first host's pool, then the second's).
    for _ in 0..2 {
        eventually("the idle connection closed", async || {
            stat(admin, "upstream_cx_active") == 0
        })
        .await;
        assert_eq!(send_h1(proxy.addr(), get("/", &[])).await.status(), 200);
    }
    assert_eq!(stat(admin, "upstream_cx_pool_overflow"), 1);
    let (_, dump) = admin_request(admin, "GET", "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(
        dump["clusters"][0]["circuit_breakers"]["max_connection_pools"],
        1
    );
}
