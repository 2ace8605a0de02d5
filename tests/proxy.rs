//! HTTP/1.1 and HTTP/2 through the real binary to a real upstream: bodies, headers, routing.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use http::Request;
use testbed::{NoopUpstream, pattern_sha256};

/// The upstream that answered, as its address; `None` for the proxy's own replies.
fn served_by(r: &http::Response<hyper::body::Incoming>) -> Option<String> {
    r.headers()
        .get("x-noop-served-by")
        .map(|v| v.to_str().unwrap().to_string())
}

async fn upstream() -> testbed::NoopHandle {
    NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_http1_and_h2c_on_the_same_port() {
    let noop = upstream().await;
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 2);

    let response = send_h1(proxy.addr(), get("/hello", &[])).await;
    assert_eq!(response.status(), 200);
    assert_eq!(text(response.into_body()).await.len(), 100);

    let response = send_h2(proxy.addr(), get_h2("/hello", &[])).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(text(response.into_body()).await.len(), 100);

    let response = send_h1(proxy.addr(), get("/healthz", &[])).await;
    assert_eq!(response.status(), 200);
    assert_eq!(text(response.into_body()).await, "ok\n");
}

/// Downloads and uploads of every size, framed both ways, over both protocols.
async fn check_bodies(proxy_addr: std::net::SocketAddr, sizes: &[u64]) {
    for &size in sizes {
        for chunked in [false, true] {
            for h2 in [false, true] {
                let what = format!("size {size} chunked {chunked} h2 {h2}");
                // Download.
                let mut headers = vec![("x-noop-size", size.to_string())];
                if chunked {
                    headers.push(("x-noop-chunked", "1".to_string()));
                }
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                let response = if h2 {
                    send_h2(proxy_addr, get_h2("/download", &headers)).await
                } else {
                    send_h1(proxy_addr, get("/download", &headers)).await
                };
                assert_eq!(response.status(), 200, "{what}");
                if !chunked && !h2 {
                    assert_eq!(
                        response.headers()["content-length"],
                        size.to_string().as_str(),
                        "{what}"
                    );
                }
                let (len, sha) = digest(response.into_body()).await;
                assert_eq!(len, size, "download {what}");
                assert_eq!(sha, pattern_sha256(size), "download {what}");

                // Upload.
                let uri = if h2 {
                    "http://legate.test/upload"
                } else {
                    "/upload"
                };
                let request = Request::post(uri)
                    .header("host", "legate.test")
                    .body(PatternBody::new(size, !chunked))
                    .unwrap();
                let response = if h2 {
                    let request = request.map(Box::pin);
                    let (mut sender, _) = h2_client(proxy_addr).await;
                    sender.send_request(request).await.unwrap()
                } else {
                    send_h1(proxy_addr, request).await
                };
                assert_eq!(response.status(), 200, "upload {what}");
                assert_eq!(
                    response.headers()["x-noop-request-bytes"],
                    size.to_string().as_str(),
                    "upload {what}"
                );
                assert_eq!(
                    response.headers()["x-noop-request-sha256"],
                    pattern_sha256(size).as_str(),
                    "upload {what}"
                );
                let _ = text(response.into_body()).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_large_bodies_arrive_intact() {
    let noop = upstream().await;
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 2);
    check_bodies(proxy.addr(), &[0, 1, 1 << 20, 64 << 20]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_arrive_intact_over_an_http2_upstream() {
    let noop = upstream().await;
    let config = forward_config(&[noop.local_addr()], "    protocol: http2");
    let proxy = Proxy::start(&config, 2);
    check_bodies(proxy.addr(), &[0, 1, 1 << 20]).await;
    assert!(
        noop.connections() <= 2,
        "one HTTP/2 connection per worker, saw {}",
        noop.connections()
    );
}

/// The same over Legate's own HTTP/2 codec (`http.http2_codec: legate`), to an HTTP/1.1 and
/// an HTTP/2 upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_arrive_intact_on_legates_own_http2_codec() {
    let noop = upstream().await;
    for cluster in ["", "    protocol: http2"] {
        let config = forward_config(&[noop.local_addr()], cluster).replacen(
            "    address: 127.0.0.1:0\n",
            "    address: 127.0.0.1:0\n    http: { http2_codec: legate }\n",
            1,
        );
        let proxy = Proxy::start(&config, 2);
        check_bodies(proxy.addr(), &[0, 1, 1 << 20, 16 << 20]).await;
    }
}

/// A stream the client resets ends its request (and the upstream request behind it) at once,
/// on either HTTP/2 codec; the connection's other streams go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_resets_cancels_its_request() {
    for codec in ["hyper", "legate"] {
        // Requests wait upstream until released; the route's timeout is longer than the test.
        let held = HeldUpstream::start().await;
        let config = forward_config(&[held.addr], "")
            .replacen(
                "    address: 127.0.0.1:0\n",
                &format!("    address: 127.0.0.1:0\n    http: {{ http2_codec: {codec} }}\n"),
                1,
            )
            .replace(
                "        cluster: backend",
                "        cluster: backend\n        timeout: 120s",
            );
        let proxy = Proxy::start(&config, 1);
        let admin = proxy.admin.unwrap();
        let (mut sender, _conn) = h2_client(proxy.addr()).await;
        let reset = tokio::spawn(sender.send_request(get_h2("/reset", &[])));
        let other = tokio::spawn(sender.send_request(get_h2("/other", &[])));
        held.wait_for_requests(2).await;
        // Dropping the response resets the stream (CANCEL).
        reset.abort();
        assert!(reset.await.is_err_and(|e| e.is_cancelled()), "{codec}");
        // Both still held upstream: only the reset can have ended one of them.
        eventually("the reset request is cancelled", async || {
            stat(admin, "downstream_rq_active") == 1 && stat(admin, "upstream_rq_active") == 1
        })
        .await;
        held.release();
        let response = other.await.unwrap().unwrap();
        assert_eq!(response.status(), 200, "{codec}");
        assert_eq!(text(response.into_body()).await, "released\n", "{codec}");
        let response = sender.send_request(get_h2("/after", &[])).await.unwrap();
        assert_eq!(response.status(), 200, "{codec}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_echoed_back_streams_both_ways() {
    let noop = upstream().await;
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 1);
    let request = Request::post("/echo")
        .header("host", "legate.test")
        .header("x-noop-echo", "body")
        .body(PatternBody::new(8 << 20, false))
        .unwrap();
    let response = send_h1(proxy.addr(), request).await;
    assert_eq!(response.status(), 200);
    let (len, sha) = digest(response.into_body()).await;
    assert_eq!(len, 8 << 20);
    assert_eq!(sha, pattern_sha256(8 << 20));
}

fn echoed_headers(body: &str) -> HashMap<String, Vec<String>> {
    let mut map: HashMap<String, Vec<String>> = HashMap::new();
    for line in body.lines().skip(1) {
        if let Some((name, value)) = line.split_once(": ") {
            map.entry(name.to_ascii_lowercase())
                .or_default()
                .push(value.to_string());
        }
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_follow_the_rules() {
    let noop = upstream().await;
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 1);

    let response = send_h1(
        proxy.addr(),
        get(
            "/echo?q=1",
            &[
                ("x-noop-echo", "headers"),
                ("connection", "keep-alive, x-hop"),
                ("x-hop", "secret"),
                ("keep-alive", "timeout=5"),
                ("proxy-connection", "keep-alive"),
                ("te", "gzip"),
                ("x-forwarded-for", "203.0.113.7"),
                ("x-custom", "kept"),
            ],
        ),
    )
    .await;
    assert_eq!(response.status(), 200);
    let body = text(response.into_body()).await;
    assert!(body.starts_with("GET /echo?q=1 HTTP/1.1"), "{body}");
    let h = echoed_headers(&body);
    for hop in [
        "connection",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "te",
        "transfer-encoding",
    ] {
        assert!(!h.contains_key(hop), "{hop} was forwarded: {body}");
    }
    assert_eq!(h["x-forwarded-for"], ["203.0.113.7, 127.0.0.1"]);
    assert_eq!(h["x-forwarded-proto"], ["http"]);
    assert_eq!(h["host"], ["legate.test"]);
    assert_eq!(h["x-custom"], ["kept"]);
    let id = &h["x-request-id"][0];
    assert_eq!(id.len(), 36, "{id}");

    // A client's request id is kept.
    let response = send_h1(
        proxy.addr(),
        get(
            "/",
            &[("x-noop-echo", "headers"), ("x-request-id", "abc-123")],
        ),
    )
    .await;
    let h = echoed_headers(&text(response.into_body()).await);
    assert_eq!(h["x-request-id"], ["abc-123"]);

    // HTTP/2 downstream: the authority becomes the upstream's host header.
    let response = send_h2(proxy.addr(), get_h2("/h2", &[("x-noop-echo", "headers")])).await;
    let body = text(response.into_body()).await;
    let h = echoed_headers(&body);
    assert_eq!(h["host"], ["legate.test"], "{body}");
    assert!(body.starts_with("GET /h2 HTTP/1.1"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_host_path_and_header() {
    let a = upstream().await;
    let b = upstream().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /, host: "*.b.test" }}
        cluster: b
      - match: {{ path: /exact-b }}
        cluster: b
      - match: {{ prefix: /, headers: [{{ name: x-to, exact: b }}] }}
        cluster: b
        host_rewrite: rewritten.internal
      - match: {{ prefix: /api }}
        cluster: a
clusters:
  - name: a
    endpoints: [{}]
  - name: b
    endpoints: [{}]
"#,
        a.local_addr(),
        b.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let a_addr = a.local_addr().to_string();
    let b_addr = b.local_addr().to_string();

    let r = send_h1(proxy.addr(), get("/api/x", &[])).await;
    assert_eq!(served_by(&r).as_deref(), Some(a_addr.as_str()));
    let r = send_h1(
        proxy.addr(),
        Request::get("/api/x")
            .header("host", "eu.b.test:8080")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap(),
    )
    .await;
    assert_eq!(served_by(&r).as_deref(), Some(b_addr.as_str()));
    let r = send_h1(proxy.addr(), get("/exact-b", &[])).await;
    assert_eq!(served_by(&r).as_deref(), Some(b_addr.as_str()));
    let r = send_h1(proxy.addr(), get("/exact-b/not", &[])).await;
    assert_eq!(r.status(), 404, "no route");
    let r = send_h1(
        proxy.addr(),
        get("/other", &[("x-to", "b"), ("x-noop-echo", "headers")]),
    )
    .await;
    assert_eq!(served_by(&r).as_deref(), Some(b_addr.as_str()));
    let h = echoed_headers(&text(r.into_body()).await);
    assert_eq!(h["host"], ["rewritten.internal"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_hosts_pick_routes_by_domain_over_http1_and_http2() {
    let a = upstream().await;
    let b = upstream().await;
    let config = |b_domains: &str| {
        format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    virtual_hosts:
      - name: a
        domains: [a.test]
        routes:
          - match: {{ prefix: /only }}
            cluster: a
      - name: b
        domains: [{b_domains}]
        routes:
          - match: {{ prefix: / }}
            cluster: b
      - name: rest
        domains: ["*"]
        routes:
          - match: {{ prefix: / }}
            direct_response: {{ status: 200, body: rest }}
clusters:
  - name: a
    endpoints: [{}]
  - name: b
    endpoints: [{}]
"#,
            a.local_addr(),
            b.local_addr()
        )
    };
    let proxy = Proxy::start(&config(r#""*.b.test", "b.*""#), 1);
    let h1 = |host: &str, path: &str| {
        Request::get(path)
            .header("host", host)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let h2 = |host: &str, path: &str| {
        Request::get(format!("http://{host}{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let (a_addr, b_addr) = (a.local_addr().to_string(), b.local_addr().to_string());

    let r = send_h1(proxy.addr(), h1("A.Test:8080", "/only/x")).await;
    assert_eq!(served_by(&r).as_deref(), Some(a_addr.as_str()));
    // The host's routes are the only ones it has: no falling through to `*`.
    let r = send_h1(proxy.addr(), h1("a.test", "/other")).await;
    assert_eq!(r.status(), 404);
    let r = send_h1(proxy.addr(), h1("eu.b.test", "/x")).await;
    assert_eq!(served_by(&r).as_deref(), Some(b_addr.as_str()));
    let r = send_h2(proxy.addr(), h2("b.example:443", "/x")).await;
    assert_eq!(served_by(&r).as_deref(), Some(b_addr.as_str()));
    let r = send_h2(proxy.addr(), h2("unknown.test", "/x")).await;
    assert_eq!(served_by(&r), None);
    assert_eq!(text(r.into_body()).await, "rest");

    // A reload moves a domain from one host to another.
    proxy.rewrite_config(&config(r#""*.b.test", "unknown.test""#));
    let (status, body) = admin_request(proxy.admin.unwrap(), "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    let r = send_h1(proxy.addr(), h1("unknown.test", "/x")).await;
    assert_eq!(served_by(&r).as_deref(), Some(b_addr.as_str()));
    let r = send_h1(proxy.addr(), h1("b.example", "/x")).await;
    assert_eq!(text(r.into_body()).await, "rest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_requests_and_reuses_connections() {
    let a = upstream().await;
    let b = upstream().await;
    let proxy = Proxy::start(&forward_config(&[a.local_addr(), b.local_addr()], ""), 1);
    let (mut sender, _) = h2_client(proxy.addr()).await;
    for _ in 0..40 {
        let response = sender.send_request(get_h2("/", &[])).await.unwrap();
        assert_eq!(response.status(), 200);
        let _ = text(response.into_body()).await;
    }
    assert_eq!(a.requests(), 20);
    assert_eq!(b.requests(), 20);
    // Sequential requests reuse one keep-alive connection per host.
    assert_eq!(a.connections(), 1);
    assert_eq!(b.connections(), 1);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let noop = rt.block_on(upstream());
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 1);
    let mut stream = std::net::TcpStream::connect(proxy.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut batch = String::new();
    for (i, delay) in ["300ms", "0ms", "100ms"].iter().enumerate() {
        batch.push_str(&format!(
            "GET /p{i} HTTP/1.1\r\nhost: legate.test\r\nx-noop-echo: headers\r\nx-noop-delay: {delay}\r\n\r\n"
        ));
    }
    batch.push_str("GET /last HTTP/1.1\r\nhost: legate.test\r\nconnection: close\r\nx-noop-echo: headers\r\n\r\n");
    stream.write_all(batch.as_bytes()).unwrap();
    let mut all = String::new();
    stream.read_to_string(&mut all).unwrap();
    let order: Vec<&str> = all
        .lines()
        .filter(|l| l.starts_with("GET /"))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(order, ["/p0", "/p1", "/p2", "/last"], "{all}");
    assert_eq!(all.matches("HTTP/1.1 200 OK").count(), 4);
}

/// Reads one HTTP/1.1 response with a content-length from a raw socket: (head, body).
fn read_response(stream: &mut std::net::TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).unwrap(),
            1,
            "connection closed mid-head"
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).unwrap();
    (head, body)
}

#[test]
fn idle_keep_alive_connections_park_and_resume() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let noop = rt.block_on(upstream());
    let proxy = Proxy::start_with_env(
        &forward_config(&[noop.local_addr()], ""),
        1,
        &[("RUST_LOG", "info,proxy_core::conn=trace")],
    );
    let mut stream = std::net::TcpStream::connect(proxy.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /one HTTP/1.1\r\nhost: legate.test\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut stream);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body.len(), 100);

    // Idle past the parking delay: the codec is dropped, the socket kept.
    assert!(
        proxy.wait_for_log("parked", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
    stream
        .write_all(b"GET /two HTTP/1.1\r\nhost: legate.test\r\n\r\n")
        .unwrap();
    let (head, _) = read_response(&mut stream);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // A request head that arrives in two parts with a park in between loses nothing.
    stream.write_all(b"GET /three HTTP/1.1\r\nho").unwrap();
    let parked_with_partial_head = || {
        proxy
            .log()
            .lines()
            .any(|l| l.contains("parked") && !l.contains("buffered=0"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !parked_with_partial_head() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(parked_with_partial_head(), "{}", proxy.log());
    stream
        .write_all(b"st: legate.test\r\nx-noop-echo: headers\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut stream);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    assert!(String::from_utf8_lossy(&body).starts_with("GET /three HTTP/1.1"));
    stream
        .write_all(b"GET /four HTTP/1.1\r\nhost: legate.test\r\n\r\n")
        .unwrap();
    let (head, _) = read_response(&mut stream);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(noop.requests(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_balance_by_policy_weight_and_hash_key() {
    let a = upstream().await;
    let b = upstream().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /sticky }}
        cluster: sticky
      - match: {{ prefix: / }}
        cluster: weighted
clusters:
  - name: weighted
    endpoints: [{a}, {{ address: "{b}", weight: 3 }}]
  - name: sticky
    lb_policy: maglev
    hash_key: {{ header: x-user }}
    endpoints: [{a}, {b}]
"#,
        a = a.local_addr(),
        b = b.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let (mut sender, _) = h2_client(proxy.addr()).await;
    for _ in 0..40 {
        let response = sender.send_request(get_h2("/", &[])).await.unwrap();
        text(response.into_body()).await;
    }
    assert_eq!((a.requests(), b.requests()), (10, 30), "weights 1:3");

    let mut served_by = std::collections::HashMap::new();
    for user in 0..20 {
        for _ in 0..3 {
            let user = format!("user-{user}");
            let response = sender
                .send_request(get_h2("/sticky", &[("x-user", &user)]))
                .await
                .unwrap();
            let host = response.headers()["x-noop-served-by"]
                .to_str()
                .unwrap()
                .to_string();
            text(response.into_body()).await;
            let first = served_by.entry(user).or_insert_with(|| host.clone());
            assert_eq!(*first, host, "a user moved between hosts");
        }
    }
    let on_a = served_by
        .values()
        .filter(|h| **h == a.local_addr().to_string())
        .count();
    assert!(
        on_a > 0 && on_a < 20,
        "20 users all on one host: {served_by:?}"
    );
}

/// Whether the kernel runs a keep-alive timer on the established connection from `client`
/// to the proxy's `local` port: `/proc/net/tcp`'s `tr` column is 2 for keep-alive.
fn keepalive_timer_on(local: std::net::SocketAddr, client: std::net::SocketAddr) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let hex = |a: std::net::SocketAddr| match a.ip() {
        std::net::IpAddr::V4(ip) => {
            format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
        }
        std::net::IpAddr::V6(_) => unreachable!("the test listens on 127.0.0.1"),
    };
    let (ours, theirs) = (hex(local), hex(client));
    table.lines().skip(1).any(|line| {
        let cells: Vec<&str> = line.split_whitespace().collect();
        // local, remote, state (01: established), then tx:rx queues, then tr:when.
        cells.get(1) == Some(&ours.as_str())
            && cells.get(2) == Some(&theirs.as_str())
            && cells.get(3) == Some(&"01")
            && cells.get(5).is_some_and(|timer| timer.starts_with("02:"))
    })
}

/// `tcp_keepalive` on a listener: its accepted connections carry the kernel's keep-alive;
/// a listener without it leaves them without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_connections_get_the_listeners_tcp_keepalive() {
    let upstream = upstream().await;
    let yaml = format!(
        "listeners:\n  - name: kept\n    address: 127.0.0.1:0\n    tcp_keepalive: {{ time: 600s, interval: 30s, probes: 3 }}\n    routes: [{{ match: {{ prefix: / }}, cluster: b }}]\n  - name: plain\n    address: 127.0.0.1:0\n    routes: [{{ match: {{ prefix: / }}, cluster: b }}]\nclusters:\n  - name: b\n    endpoints: [{}]\n",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&yaml, 1);
    for (addr, expected) in [(proxy.addrs[0], true), (proxy.addrs[1], false)] {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let client = stream.local_addr().unwrap();
        // A request answered: the proxy has accepted and set up the connection.
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        assert_eq!(
            sender.send_request(get("/", &[])).await.unwrap().status(),
            200
        );
        assert_eq!(keepalive_timer_on(addr, client), expected, "{addr}");
    }
}
