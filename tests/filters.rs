//! HTTP filters through the real binary: the chain's order and short-circuit, per-route
//! settings, and each filter's behaviour (rate limit, headers, compression, CORS), over real
//! sockets against the testbed upstream and sidecar.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use sha2::{Digest, Sha256};

async fn upstream() -> testbed::NoopHandle {
    testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// One listener with `filters` (YAML list items) and `routes` before a catch-all to `upstream`.
fn config(filters: &str, routes: &str, upstream: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
{filters}
    routes:
{routes}      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

/// Sends `n` requests at once over `n` connections: the statuses, counted.
async fn burst(addr: SocketAddr, n: usize, headers: &[(&str, &str)]) -> BTreeMap<u16, usize> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let req = get("/", headers);
            tokio::spawn(async move { send_h1(addr, req).await.status().as_u16() })
        })
        .collect();
    let mut counts = BTreeMap::new();
    for task in tasks {
        *counts.entry(task.await.unwrap()).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limit_admits_exactly_its_tokens_across_workers() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            "      - local_rate_limit: { token_bucket: { max_tokens: 50, fill_interval: 1h } }",
            "",
            upstream.local_addr(),
        ),
        2,
    );
    let counts = burst(proxy.addr(), 200, &[]).await;
    assert_eq!(counts, BTreeMap::from([(200, 50), (429, 150)]));
    let admin = proxy.admin.unwrap();
    assert_eq!(stat(admin, "http_local_rate_limit_ok"), 50);
    assert_eq!(stat(admin, "http_local_rate_limit_rate_limited"), 150);
    // Both workers took requests, so the count held across them.
    let workers: serde_json::Value =
        serde_json::from_str(&admin_request(admin, "GET", "/workers").1).unwrap();
    let served: Vec<u64> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["downstream_rq_total"].as_u64().unwrap())
        .collect();
    assert!(
        served.len() == 2 && served.iter().all(|n| *n > 0),
        "{served:?}"
    );

    let refused = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = refused.headers();
    assert_eq!(h["x-ratelimit-limit"], "50");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!((1..=3600).contains(&reset), "{reset}");
    assert_eq!(h["retry-after"], h["x-ratelimit-reset"]);
    assert_eq!(text(refused.into_body()).await, "rate limited\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_by_key_by_route_and_refilled() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            "      - local_rate_limit:
          token_bucket: { max_tokens: 2, fill_interval: 1h }
          key: { header: x-api-key }
          x_ratelimit_headers: always",
            "      - match: { prefix: /free }
        direct_response: { status: 200 }
        filters: { local_rate_limit: disabled }
      - match: { prefix: /refill }
        direct_response: { status: 200 }
        filters: { local_rate_limit: { token_bucket: { max_tokens: 1, fill_interval: 1s }, scope: worker } }
",
            upstream.local_addr(),
        ),
        1,
    );
    let addr = proxy.addr();
    let statuses = |key: &'static str, n| async move {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(
                send_h1(addr, get("/", &[("x-api-key", key)]))
                    .await
                    .status()
                    .as_u16(),
            );
        }
        out
    };
    assert_eq!(statuses("alice", 3).await, [200, 200, 429]);
    assert_eq!(
        statuses("bob", 3).await,
        [200, 200, 429],
        "a bucket per key"
    );
    let allowed = send_h1(addr, get("/", &[])).await;
    assert_eq!(
        allowed.status(),
        200,
        "requests without the key share their own bucket"
    );
    assert_eq!(
        allowed.headers()["x-ratelimit-remaining"],
        "1",
        "headers on every response"
    );
    for _ in 0..10 {
        assert_eq!(send_h1(addr, get("/free", &[])).await.status(), 200);
    }

    // Refused with the time until the next token (an hour's bucket: no timing luck).
    let refused = send_h1(addr, get("/", &[("x-api-key", "alice")])).await;
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3000..=3600).contains(&retry_after), "{retry_after}");

    // A bucket of one a second: drained until refused, then allowed again once it refills.
    let deadline = Instant::now() + Duration::from_secs(20);
    while send_h1(addr, get("/refill", &[])).await.status() != 429 {
        assert!(Instant::now() < deadline, "the bucket never ran out");
    }
    loop {
        if send_h1(addr, get("/refill", &[])).await.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the bucket never refilled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_skips_the_filters_after_it_but_not_those_before() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(alice_or_401()).await;
    let sidecar_addr = sidecar.local_addr().unwrap();
    let proxy = Proxy::start(
        &config(
            &format!(
                "      - cors: {{ allow_origins: [\"https://app.test\"] }}
      - local_rate_limit: {{ token_bucket: {{ max_tokens: 3, fill_interval: 1h }} }}
      - ext_authz: {{ grpc: {{ address: {sidecar_addr} }}, timeout: 30s }}
      - headers: {{ response: {{ set: {{ x-after-authz: yes }} }} }}"
            ),
            "",
            upstream.local_addr(),
        ),
        1,
    );
    let origin = ("origin", "https://app.test");
    // Denied by ext_authz: CORS (before it) still marks the answer; headers (after) never ran.
    let denied = send_h1(proxy.addr(), get("/", &[origin])).await;
    assert_eq!(denied.status(), 401);
    assert_eq!(
        denied.headers()["access-control-allow-origin"],
        "https://app.test"
    );
    assert!(!denied.headers().contains_key("x-after-authz"));
    let allowed = send_h1(proxy.addr(), get("/", &[origin, ("x-user", "alice")])).await;
    assert_eq!(allowed.status(), 200);
    assert_eq!(allowed.headers()["x-after-authz"], "yes");
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "https://app.test"
    );
    // The limit comes before the check: once it refuses, the sidecar hears nothing more.
    assert_eq!(send_h1(proxy.addr(), get("/", &[])).await.status(), 401);
    assert_eq!(sidecar.checks(), 3);
    for _ in 0..5 {
        let limited = send_h1(proxy.addr(), get("/", &[origin])).await;
        assert_eq!(limited.status(), 429);
        assert_eq!(
            limited.headers()["access-control-allow-origin"],
            "https://app.test"
        );
    }
    assert_eq!(sidecar.checks(), 3);
}

fn echoed(body: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in body.lines().skip(1) {
        if let Some((name, value)) = line.split_once(": ") {
            out.entry(name.to_string())
                .or_default()
                .push(value.to_string());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_rules_change_requests_and_responses() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            "      - headers:
          request:
            set: { x-client-ip: \"%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%\", x-trace: \"id-%REQ_ID%\" }
            add: { x-via: legate }
            remove: [x-internal]
          response:
            set: { x-served-by: \"%UPSTREAM_HOST%\", x-request-id: \"%REQ_ID%\" }
            remove: [x-noop-served-by]",
            "      - match: { prefix: /static }
        direct_response: { status: 200, body: \"static\\n\" }
        filters: { headers: { response: { set: { cache-control: max-age=60 } } } }
      - match: { prefix: /plain }
        cluster: backend
        filters: { headers: disabled }
",
            upstream.local_addr(),
        ),
        1,
    );
    for h2 in [false, true] {
        let headers = [
            ("x-noop-echo", "headers"),
            ("x-internal", "secret"),
            ("x-via", "cdn"),
            ("x-request-id", "req-1"),
        ];
        let response = if h2 {
            send_h2(proxy.addr(), get_h2("/api", &headers)).await
        } else {
            send_h1(proxy.addr(), get("/api", &headers)).await
        };
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["x-served-by"],
            upstream.local_addr().to_string()
        );
        assert_eq!(response.headers()["x-request-id"], "req-1");
        assert!(!response.headers().contains_key("x-noop-served-by"));
        let seen = echoed(&text(response.into_body()).await);
        assert_eq!(seen["x-client-ip"], ["127.0.0.1"]);
        assert_eq!(seen["x-trace"], ["id-req-1"]);
        assert_eq!(seen["x-via"], ["cdn", "legate"]);
        assert!(!seen.contains_key("x-internal"), "{seen:?}");
    }
    let direct = send_h1(proxy.addr(), get("/static", &[])).await;
    assert_eq!(
        direct.headers()["cache-control"],
        "max-age=60",
        "the route's rules"
    );
    assert!(
        direct.headers().contains_key("x-request-id"),
        "and the listener's"
    );
    let plain = send_h1(proxy.addr(), get("/plain", &[("x-noop-echo", "headers")])).await;
    assert!(!plain.headers().contains_key("x-served-by"));
    assert!(plain.headers().contains_key("x-noop-served-by"));
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_decompress_to_the_original() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config("      - compression: {}", "", upstream.local_addr()),
        1,
    );
    let size = 300_000u64;
    let size_text = size.to_string();
    let text_type = (
        "x-noop-response-header",
        "content-type: text/plain; charset=utf-8",
    );
    let mut compressed_total = 0;
    for encoding in ["gzip", "br", "zstd"] {
        for (h2, chunked) in [(false, false), (false, true), (true, false), (true, true)] {
            let headers = [
                ("accept-encoding", encoding),
                ("x-noop-size", size_text.as_str()),
                ("x-noop-chunked", if chunked { "1" } else { "0" }),
                text_type,
                ("x-noop-response-header", "etag: \"v1\""),
            ];
            let response = if h2 {
                send_h2(proxy.addr(), get_h2("/", &headers)).await
            } else {
                send_h1(proxy.addr(), get("/", &headers)).await
            };
            let what = format!("{encoding} h2={h2} chunked={chunked}");
            assert_eq!(response.status(), 200, "{what}");
            let h = response.headers().clone();
            assert_eq!(h["content-encoding"], encoding, "{what}");
            assert_eq!(h["vary"], "accept-encoding", "{what}");
            assert_eq!(h["etag"], "W/\"v1\"", "{what}");
            assert!(!h.contains_key("content-length"), "{what}");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert!(
                (body.len() as u64) < size / 10,
                "{what}: {} bytes",
                body.len()
            );
            compressed_total += body.len();
            let decoded = decompress(encoding, &body);
            assert_eq!(decoded.len() as u64, size, "{what}");
            assert_eq!(sha256(&decoded), testbed::pattern_sha256(size), "{what}");
        }
    }
    let admin = proxy.admin.unwrap();
    // Byte counts are added when each compressed body is done with, which may be just after
    // the client has read its end.
    assert_eq!(stat_settled(admin, "compression_compressed", 12), 12);
    let uncompressed = 12 * size as i64;
    assert_eq!(
        stat_settled(admin, "compression_uncompressed_bytes", uncompressed),
        uncompressed
    );
    assert_eq!(
        stat_settled(
            admin,
            "compression_compressed_bytes",
            compressed_total as i64
        ),
        compressed_total as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_that_must_not_be_compressed_pass_unchanged() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            "      - compression: { min_content_length: 1KiB, encodings: [gzip] }",
            "      - match: { prefix: /raw }
        cluster: backend
        filters: { compression: disabled }
",
            upstream.local_addr(),
        ),
        1,
    );
    let addr = proxy.addr();
    let text_type = ("x-noop-response-header", "content-type: text/html");
    // (what, request headers, the `vary` expected)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>);
    let cases: [Case; 8] = [
        (
            "no accept-encoding",
            vec![("x-noop-size", "5000"), text_type],
            Some("accept-encoding"),
        ),
        (
            "only others accepted",
            vec![
                ("accept-encoding", "br, zstd"),
                ("x-noop-size", "5000"),
                text_type,
            ],
            Some("accept-encoding"),
        ),
        (
            "an uncompressible type",
            vec![("accept-encoding", "gzip"), ("x-noop-size", "5000")],
            None,
        ),
        (
            "shorter than the minimum",
            vec![
                ("accept-encoding", "gzip"),
                ("x-noop-size", "500"),
                text_type,
            ],
            Some("accept-encoding"),
        ),
        (
            "already encoded",
            vec![
                ("accept-encoding", "gzip"),
                ("x-noop-size", "5000"),
                text_type,
                ("x-noop-response-header", "content-encoding: br"),
            ],
            Some("accept-encoding"),
        ),
        (
            "a partial response",
            vec![
                ("accept-encoding", "gzip"),
                ("x-noop-size", "5000"),
                ("x-noop-status", "206"),
                text_type,
                ("x-noop-response-header", "content-range: bytes 0-4999/9000"),
            ],
            Some("accept-encoding"),
        ),
        (
            "no-transform",
            vec![
                ("accept-encoding", "gzip"),
                ("x-noop-size", "5000"),
                text_type,
                ("x-noop-response-header", "cache-control: no-transform"),
            ],
            Some("accept-encoding"),
        ),
        (
            "gzip;q=0",
            vec![
                ("accept-encoding", "gzip;q=0, identity"),
                ("x-noop-size", "5000"),
                text_type,
            ],
            Some("accept-encoding"),
        ),
    ];
    for (what, headers, vary) in cases {
        let response = send_h1(addr, get("/", &headers)).await;
        // Never compressed by the proxy (the upstream's own encoding, if any, stays).
        assert_ne!(
            response
                .headers()
                .get("content-encoding")
                .map(|v| v.to_str().unwrap()),
            Some("gzip"),
            "{what}"
        );
        assert_eq!(
            response.headers().get("vary").map(|v| v.to_str().unwrap()),
            vary,
            "{what}"
        );
        let length = response.headers().get("content-length").cloned();
        let (len, _) = digest(response.into_body()).await;
        assert_eq!(length.unwrap().to_str().unwrap(), len.to_string(), "{what}");
    }
    // HEAD: the headers of the uncompressed representation, no body.
    let head = Request::builder()
        .method(Method::HEAD)
        .uri("/")
        .header("host", "legate.test")
        .header("accept-encoding", "gzip")
        .header("x-noop-size", "5000")
        .header(text_type.0, text_type.1)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = send_h1(addr, head).await;
    assert!(!response.headers().contains_key("content-encoding"));
    assert_eq!(response.headers()["content-length"], "5000");
    // A route with compression off.
    let raw = send_h1(
        addr,
        get(
            "/raw",
            &[
                ("accept-encoding", "gzip"),
                ("x-noop-size", "5000"),
                text_type,
            ],
        ),
    )
    .await;
    assert!(!raw.headers().contains_key("content-encoding"));
    assert!(!raw.headers().contains_key("vary"));
    let compressed = send_h1(
        addr,
        get(
            "/",
            &[
                ("accept-encoding", "gzip"),
                ("x-noop-size", "5000"),
                text_type,
            ],
        ),
    )
    .await;
    assert_eq!(compressed.headers()["content-encoding"], "gzip");
    let admin = proxy.admin.unwrap();
    assert_eq!(stat(admin, "compression_compressed"), 1);
    assert_eq!(
        stat(admin, "compression_not_compressed"),
        8,
        "the HEAD and 7 compressible-type cases"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_preflights_and_marks_allowed_responses() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            "      - cors:
          allow_origins: [\"https://app.example.com\"]
          allow_methods: [GET, POST]
          allow_headers: [content-type, x-api-key]
          max_age: 10m",
            "",
            upstream.local_addr(),
        ),
        1,
    );
    let preflight = Request::builder()
        .method(Method::OPTIONS)
        .uri("/api")
        .header("host", "legate.test")
        .header("origin", "https://app.example.com")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "x-api-key")
        .header("x-noop-status", "500")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = send_h1(proxy.addr(), preflight).await;
    assert_eq!(
        answer.status(),
        StatusCode::NO_CONTENT,
        "answered by the proxy"
    );
    let h = answer.headers();
    assert_eq!(h["access-control-allow-origin"], "https://app.example.com");
    assert_eq!(h["access-control-allow-methods"], "GET, POST");
    assert_eq!(h["access-control-allow-headers"], "content-type, x-api-key");
    assert_eq!(h["access-control-max-age"], "600");
    assert_eq!(h["vary"], "origin");
    let simple = send_h1(
        proxy.addr(),
        get("/api", &[("origin", "https://app.example.com")]),
    )
    .await;
    assert_eq!(simple.status(), 200);
    assert_eq!(
        simple.headers()["access-control-allow-origin"],
        "https://app.example.com"
    );
    let other = send_h1(
        proxy.addr(),
        get("/api", &[("origin", "https://evil.test")]),
    )
    .await;
    assert_eq!(other.status(), 200);
    assert!(!other.headers().contains_key("access-control-allow-origin"));
}

/// The Envoy-style CORS settings from the file: origins by string matcher, a 200 answer,
/// the methods asked for, no headers named, other origins' preflights answered here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_settings_as_envoy_has_them() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            "      - cors:
          allow_origins: [{ suffix: .example.com, ignore_case: true }, { exact: \"*\" }]
          allow_methods: [\"*\"]
          allow_headers: []
          preflight_status: 200
          forward_not_matching_preflights: false
          allow_private_network_access: true",
            "",
            upstream.local_addr(),
        ),
        1,
    );
    let preflight = |origin: &str| {
        Request::builder()
            .method(Method::OPTIONS)
            .uri("/api")
            .header("host", "legate.test")
            .header("origin", origin)
            .header("access-control-request-method", "DELETE")
            .header("access-control-request-headers", "x-api-key")
            .header("access-control-request-private-network", "true")
            .header("x-noop-status", "500")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    // A matcher that matches `*` allows every origin, as Envoy's: the origin is echoed.
    let answer = send_h1(proxy.addr(), preflight("https://anyone.test")).await;
    assert_eq!(answer.status(), StatusCode::OK, "answered by the proxy");
    let h = answer.headers();
    assert_eq!(h["access-control-allow-origin"], "https://anyone.test");
    assert_eq!(h["access-control-allow-methods"], "DELETE");
    assert!(!h.contains_key("access-control-allow-headers"));
    assert_eq!(h["access-control-allow-private-network"], "true");
    let proxy2 = Proxy::start(
        &config(
            "      - cors:
          allow_origins: [{ suffix: .example.com, ignore_case: true }]
          preflight_status: 200
          forward_not_matching_preflights: false",
            "",
            upstream.local_addr(),
        ),
        1,
    );
    let answer = send_h1(proxy2.addr(), preflight("https://App.EXAMPLE.com")).await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        answer.headers()["access-control-allow-origin"],
        "https://App.EXAMPLE.com"
    );
    assert!(
        !answer
            .headers()
            .contains_key("access-control-allow-private-network")
    );
    // Not allowed, and not forwarded: answered without `access-control-allow-origin`.
    let answer = send_h1(proxy2.addr(), preflight("https://evil.test")).await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(!answer.headers().contains_key("access-control-allow-origin"));
    assert_eq!(answer.headers()["access-control-allow-methods"], "DELETE");
}

/// The fault filter: a fixed delay and a fixed abort on their routes, a share of requests
/// aborted within statistical bounds, faults asked for by request headers, and a route that
/// turns the filter off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_delay_and_abort_their_share_of_requests() {
    let noop = upstream().await;
    let routes = r#"      - match: { prefix: /delayed }
        cluster: backend
        filters: { fault: { delay: { fixed: 300ms, percentage: 100% } } }
      - match: { prefix: /aborted }
        cluster: backend
        filters: { fault: { abort: { status: 503, percentage: 100% } } }
      - match: { prefix: /half }
        cluster: backend
        filters: { fault: { abort: { status: 500, percentage: 50%, body: "injected\n" } } }
      - match: { prefix: /asked }
        cluster: backend
        filters: { fault: { abort: { header: true, percentage: 100% }, delay: { header: true, percentage: 100% } } }
      - match: { prefix: /untouched }
        cluster: backend
        filters: { fault: disabled }
      - match: { prefix: /grpc }
        cluster: backend
        filters: { fault: { abort: { grpc_status: 8, percentage: 100% } } }
"#;
    let filters = "      - fault: { abort: { status: 418, percentage: 100% } }";
    let proxy = Proxy::start(&config(filters, routes, noop.local_addr()), 2);
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();

    let started = Instant::now();
    let res = send_h1(addr, get("/delayed", &[])).await;
    assert_eq!(res.status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let res = send_h1(addr, get("/aborted", &[])).await;
    assert_eq!(res.status(), 503);
    assert_eq!(text(res.into_body()).await, "fault filter abort");
    // The listener's own settings where a route has none; none where a route turns it off.
    assert_eq!(send_h1(addr, get("/other", &[])).await.status(), 418);
    assert_eq!(send_h1(addr, get("/untouched", &[])).await.status(), 200);
    let call = send_h1(addr, get("/grpc", &[("content-type", "application/grpc")])).await;
    assert_eq!(call.status(), 200);
    assert_eq!(call.headers()["grpc-status"], "8");

    // 400 requests at 50%: the count of aborts is within 8 standard deviations (10 each).
    let mut aborted: i64 = 0;
    for _ in 0..400 {
        let res = send_h1(addr, get("/half", &[])).await;
        if res.status() == 500 {
            assert_eq!(text(res.into_body()).await, "injected\n");
            aborted += 1;
        }
    }
    assert!((120..=280).contains(&aborted), "{aborted} of 400 aborted");

    // Asked for by the request: no header, no fault; then a 429 after 200 ms.
    assert_eq!(send_h1(addr, get("/asked", &[])).await.status(), 200);
    let started = Instant::now();
    let res = send_h1(
        addr,
        get(
            "/asked",
            &[
                ("x-envoy-fault-abort-request", "429"),
                ("x-envoy-fault-delay-request", "200"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 429);
    assert!(started.elapsed() >= Duration::from_millis(200));
    let res = send_h1(
        addr,
        get(
            "/asked",
            &[
                ("x-envoy-fault-abort-request", "429"),
                ("x-envoy-fault-abort-request-percentage", "0"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200, "the request's own 0%");
    assert_eq!(stat_settled(admin, "http_fault_delays_injected", 2), 2);
    assert_eq!(
        stat_settled(admin, "http_fault_aborts_injected", aborted + 4),
        aborted + 4
    );
}

/// The custom_response filter: responses (an upstream's or the proxy's own) picked by status
/// and headers become the first matching rule's answer (its status, headers and body, as
/// Envoy's local reply); a route can turn it off; the compression filter before it in the
/// chain (after it for responses) leaves a new body alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_responses_replace_the_responses_their_rules_pick() {
    let noop = upstream().await;
    let filters = r#"      - compression: { min_content_length: 10 }
      - custom_response:
          rules:
            - when: { and: [{ status: { exact: "404" } }, { local_reply: { exact: "true" } }] }
              body: "no such page here"
            - when: { status: { exact: "404" } }
              body: "gateway-1 Not Found"
              headers: { set: { x-set-header: set-404, x-request: "%REQ_ID%" }, add: { x-add-header: added-404 } }
            - when: { and: [{ status: { exact: "503" } }, { header: { name: x-error-type, prefix: upstream- } }] }
              status: 502
              body: '{"error":"combined match"}'
              headers: { set: { content-type: application/json } }
            - when: { not: { status: { regex: "[2-4][0-9][0-9]" } } }
              headers: { set: { x-server-error: "yes" } }"#;
    let routes = r#"      - match: { prefix: /off }
        cluster: backend
        filters: { custom_response: disabled }
      - match: { prefix: /direct }
        direct_response: { status: 404, body: "not here\n" }
"#;
    let proxy = Proxy::start(&config(filters, routes, noop.local_addr()), 1);
    let addr = proxy.addr();

    // An upstream's 404, which the compression filter would gzip: the new body, plain, and
    // none of the upstream's headers.
    let res = send_h1(
        addr,
        get(
            "/x",
            &[
                ("x-noop-status", "404"),
                ("accept-encoding", "gzip"),
                ("x-noop-response-header", "etag: \"v1\""),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 404);
    assert_eq!(res.headers()["content-type"], "text/plain");
    assert!(res.headers().get("etag").is_none());
    assert!(res.headers().get("vary").is_none());
    assert_eq!(res.headers()["x-set-header"], "set-404");
    assert_eq!(res.headers()["x-add-header"], "added-404");
    // The request's id, made for the filter that names it.
    let id = res.headers()["x-request"].to_str().unwrap();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert!(res.headers().get("content-encoding").is_none());
    assert_eq!(text(res.into_body()).await, "gateway-1 Not Found");
    // The proxy's own 404 (a direct response), told apart from an upstream's.
    let res = send_h1(addr, get("/direct", &[])).await;
    assert_eq!(text(res.into_body()).await, "no such page here");

    // Both halves of an `and`: a new status and a typed body.
    let res = send_h1(
        addr,
        get(
            "/x",
            &[
                ("x-noop-status", "503"),
                ("x-noop-response-header", "x-error-type: upstream-timeout"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()["content-type"], "application/json");
    assert_eq!(text(res.into_body()).await, r#"{"error":"combined match"}"#);
    // One half only: the next rule, which has no body: the answer has none (Envoy's).
    let res = send_h1(addr, get("/x", &[("x-noop-status", "503")])).await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["x-server-error"], "yes");
    assert_eq!(text(res.into_body()).await, "");
    // A route that turns the filter off, and a response no rule picks.
    let res = send_h1(addr, get("/off", &[("x-noop-status", "404")])).await;
    assert!(res.headers().get("x-set-header").is_none());
    assert!(
        text(res.into_body())
            .await
            .starts_with("ok: legate testbed")
    );
    let res = send_h1(addr, get("/x", &[("accept-encoding", "gzip")])).await;
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("x-server-error").is_none());
    // What the compression filter does where no rule gives a new body.
    assert_eq!(res.headers()["content-encoding"], "gzip");
    // A gRPC call's upstream 404 picked by a rule: the rule's answer in gRPC's form, as
    // Envoy's local reply (UNIMPLEMENTED, the body as the message).
    let res = send_h1(
        addr,
        get(
            "/x",
            &[
                ("x-noop-status", "404"),
                ("content-type", "application/grpc"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    assert_eq!(res.headers()["grpc-status"], "12");
    assert_eq!(res.headers()["grpc-message"], "gateway-1 Not Found");
    assert_eq!(res.headers()["x-set-header"], "set-404");
    assert_eq!(text(res.into_body()).await, "");
}

/// An encoding's own rules (`by_encoding`, as Envoy's compressor per library): the client's
/// choice picks the encoding, whose own minimum and types then decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoding_with_rules_of_its_own_decides_by_them() {
    let upstream = upstream().await;
    let filters = "      - compression: { encodings: [br, gzip], min_content_length: 100, by_encoding: { gzip: { min_content_length: 10KiB }, br: { content_types: [application/json] } } }";
    let proxy = Proxy::start(&config(filters, "", upstream.local_addr()), 1);
    let encoded = async |accept: &str, size: &str, content_type: &str| {
        let res = send_h1(
            proxy.addr(),
            get(
                "/",
                &[
                    ("accept-encoding", accept),
                    ("x-noop-size", size),
                    ("x-noop-response-header", content_type),
                ],
            ),
        )
        .await;
        assert_eq!(res.status(), 200);
        let encoding = res
            .headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        text(res.into_body()).await;
        encoding
    };
    let json = "content-type: application/json";
    let plain = "content-type: text/plain";
    assert_eq!(encoded("br", "2000", json).await.as_deref(), Some("br"));
    assert_eq!(
        encoded("br", "2000", plain).await,
        None,
        "not brotli's type"
    );
    assert_eq!(
        encoded("gzip", "2000", plain).await,
        None,
        "under gzip's 10 KiB"
    );
    assert_eq!(
        encoded("gzip", "20000", plain).await.as_deref(),
        Some("gzip")
    );
    // The client's choice is brotli: its rules decide, gzip is not tried instead.
    assert_eq!(encoded("br, gzip;q=0.5", "20000", plain).await, None);
}

/// RBAC: rules by path, method and client address (behind a trusted proxy, from
/// `x-forwarded-for`), over HTTP/1.1 and HTTP/2; shadow rules counted only; a route's own
/// rules replacing the listener's, and a route with the filter off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_rules_allow_and_deny_by_path_method_and_client() {
    let upstream = upstream().await;
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http: {{ xff_num_trusted_hops: 1 }}
    http_filters:
      - rbac:
          rules:
            action: deny
            policies:
              admin-from-outside:
                permissions: [{{ path: {{ prefix: /admin }} }}]
                principals: [{{ not: {{ remote_ip: [10.0.0.0/8] }} }}]
              no-deletes:
                permissions: [{{ header: {{ name: ':method', exact: DELETE }} }}]
                principals: [{{ any: true }}]
          shadow_rules:
            matchers:
              - {{ name: reports, action: deny, match: {{ path: {{ prefix: /reports }} }} }}
            on_no_match: allow
          shadow_rules_stat_prefix: dry_
    routes:
      - match: {{ prefix: /open }}
        cluster: backend
        filters: {{ rbac: disabled }}
      - match: {{ prefix: /partners }}
        cluster: backend
        filters:
          rbac:
            rules:
              matchers:
                - {{ name: partner, action: allow, match: {{ header: {{ name: x-partner, present: true }} }} }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        upstream.local_addr()
    );
    let proxy = Proxy::start(&yaml, 1);
    let addr = proxy.addr();
    let status = async |method: Method, path: &str, headers: &[(&str, &str)]| {
        let mut req = get(path, headers);
        *req.method_mut() = method;
        send_h1(addr, req).await.status().as_u16()
    };
    let outside = [("x-forwarded-for", "203.0.113.7")];
    let inside = [("x-forwarded-for", "10.1.2.3")];
    assert_eq!(status(Method::GET, "/", &outside).await, 200);
    let denied = send_h1(addr, get("/admin/users", &outside)).await;
    assert_eq!(denied.status(), 403);
    assert_eq!(text(denied.into_body()).await, "RBAC: access denied");
    assert_eq!(status(Method::GET, "/admin/users", &inside).await, 200);
    assert_eq!(status(Method::DELETE, "/items/1", &inside).await, 403);
    // The same rules over HTTP/2.
    let over_h2 = send_h2(addr, get("/admin", &outside)).await;
    assert_eq!(over_h2.status(), 403);
    // Shadow rules deny nothing.
    assert_eq!(status(Method::GET, "/reports/q3", &outside).await, 200);
    // Off on /open; /partners has its own rules (in the ordered form, denying the rest).
    assert_eq!(status(Method::DELETE, "/open/admin", &outside).await, 200);
    assert_eq!(
        status(Method::GET, "/partners", &[("x-partner", "acme")]).await,
        200
    );
    assert_eq!(status(Method::GET, "/partners", &inside).await, 403);

    let admin = proxy.admin.unwrap();
    // Enforced: /, /admin/users (inside), /reports allowed; /admin/users, DELETE, h2 /admin
    // denied; then /partners once each way.
    assert_eq!(stat(admin, "http_rbac_allowed"), 4);
    assert_eq!(stat(admin, "http_rbac_denied"), 4);
    // Shadow rules ran where the listener's settings applied (a route's own replace them
    // all): one request of six would have been denied.
    assert_eq!(stat(admin, "http_rbac_shadow_denied"), 1);
    assert_eq!(stat(admin, "http_rbac_shadow_allowed"), 5);
    let (_, text) = admin_request(admin, "GET", "/stats/prometheus");
    assert!(
        text.contains(r#"http_rbac_shadow_denied{listener="main",prefix="dry_"} 1"#),
        "{text}"
    );
}

/// `basic_auth`: htpasswd SHA users on the listener, a route's own users, a route without the
/// filter; the user's name forwarded; Envoy's reasons and a `Basic` challenge otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_takes_listed_users_and_routes_give_their_own() {
    use base64::Engine;
    let upstream = upstream().await;
    // `htpasswd -nbs alice secret`, `htpasswd -nbs ops hunter2`.
    let filters = r#"      - basic_auth:
          users: "alice:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ="
          forward_username_header: x-user
"#;
    let routes = r#"      - match: { prefix: /ops }
        cluster: backend
        filters: { basic_auth: { users: "ops:{SHA}87u9ZqY9S/F0eUBXjsPQEDUw4h0=" } }
      - match: { prefix: /open }
        cluster: backend
        filters: { basic_auth: disabled }
"#;
    let proxy = Proxy::start(&config(filters, routes, upstream.local_addr()), 1);
    let addr = proxy.addr();
    let basic = |pair: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    };
    let call = async |path: &str, credentials: Option<String>| {
        let mut headers = vec![("x-noop-echo", "headers".to_owned())];
        if let Some(c) = credentials {
            headers.push(("authorization", c));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let response = send_h1(addr, get(path, &headers)).await;
        let status = response.status().as_u16();
        let challenge = (response.headers().get("www-authenticate"))
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, text(response.into_body()).await, challenge)
    };
    let (status, echoed, _) = call("/", Some(basic("alice:secret"))).await;
    assert_eq!(status, 200);
    assert!(
        echoed.to_ascii_lowercase().contains("x-user: alice"),
        "{echoed}"
    );
    let (status, body, challenge) = call("/x", None).await;
    assert_eq!(
        (status, body.as_str()),
        (
            401,
            "User authentication failed. Missing username and password."
        )
    );
    assert_eq!(challenge, r#"Basic realm="http://legate.test/x""#);
    assert_eq!(
        call("/", Some(basic("alice:wrong"))).await.1,
        "User authentication failed. Invalid username/password combination."
    );
    assert_eq!(
        call("/", Some("Bearer abc".into())).await.1,
        "User authentication failed. Expected 'Basic' authentication scheme."
    );
    // The route's users replace the listener's.
    assert_eq!(call("/ops", Some(basic("ops:hunter2"))).await.0, 200);
    assert_eq!(call("/ops", Some(basic("alice:secret"))).await.0, 401);
    assert_eq!(call("/open", None).await.0, 200);
    let admin = proxy.admin.unwrap();
    assert_eq!(stat(admin, "http_basic_auth_allowed"), 2);
    assert_eq!(stat(admin, "http_basic_auth_denied"), 4);
}
