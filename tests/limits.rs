//! Connection limits through the real binary: past the limit a connection is closed at once
//! and counted; the connections within it are served.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;

/// Sends a request on an open connection; true if a response came back.
fn is_served(stream: &mut std::net::TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    if stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: legate.test\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 512];
    matches!(stream.read(&mut buf), Ok(n) if n > 0 && buf.starts_with(b"HTTP/1.1 200"))
}

#[test]
fn a_listener_limit_of_50_serves_50_of_80_and_counts_30() {
    let config = forward_config(&["127.0.0.1:9"], "").replace(
        "    address: 127.0.0.1:0\n    routes:",
        "    address: 127.0.0.1:0\n    connection_limit: 50\n    routes:",
    );
    assert!(config.contains("connection_limit: 50"), "{config}");
    let proxy = Proxy::start(&config, 2);
    let admin = proxy.admin.unwrap();

    let mut conns: Vec<std::net::TcpStream> = (0..80)
        .map(|_| std::net::TcpStream::connect(proxy.addr()).unwrap())
        .collect();
    // Every connect is accepted (and judged) once the overflow count reaches 30.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(admin, "downstream_cx_overflow") < 30 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let served = conns.iter_mut().map(is_served).filter(|ok| *ok).count();
    assert_eq!(served, 50);
    assert_eq!(stat(admin, "downstream_cx_overflow"), 30);

    // Closing admitted connections makes room again.
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut fresh = std::net::TcpStream::connect(proxy.addr()).unwrap();
        if is_served(&mut fresh) {
            break;
        }
        assert!(Instant::now() < deadline, "no room after the clients left");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn max_connections_limits_the_whole_process() {
    let config = forward_config(&["127.0.0.1:9"], "")
        .replace("listeners:", "max_connections: 5\nlisteners:");
    let proxy = Proxy::start(&config, 2);
    let mut conns: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(proxy.addr()).unwrap())
        .collect();
    let admin = proxy.admin.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(admin, "downstream_cx_overflow") < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(conns.iter_mut().map(is_served).filter(|ok| *ok).count(), 5);
    assert_eq!(stat(admin, "downstream_cx_overflow"), 3);
}

/// Reads until the server closes; the time it took.
fn time_to_close(stream: &mut std::net::TcpStream) -> Duration {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

#[test]
fn idle_connections_and_slow_heads_are_closed_and_counted() {
    let config = forward_config(&["127.0.0.1:9"], "").replace(
        "    address: 127.0.0.1:0\n    routes:",
        "    address: 127.0.0.1:0\n    http: { idle_timeout: 3s, request_headers_timeout: 1s }\n    routes:",
    );
    let proxy = Proxy::start(&config, 1);
    let admin = proxy.admin.unwrap();

    // A connection that says nothing, and one that goes quiet after a request.
    let mut silent = std::net::TcpStream::connect(proxy.addr()).unwrap();
    let mut quiet = std::net::TcpStream::connect(proxy.addr()).unwrap();
    assert!(is_served(&mut quiet));
    // A head that never completes (slowloris).
    let mut slow = std::net::TcpStream::connect(proxy.addr()).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nhost: legate").unwrap();

    let slow_closed = time_to_close(&mut slow);
    // By the 1 s head timeout, well before the 3 s idle timeout (the stats below say which
    // timer closed what; the times only need to tell the two apart).
    assert!(
        slow_closed < Duration::from_millis(2500),
        "slow head closed after {slow_closed:?}"
    );
    let silent_closed = time_to_close(&mut silent);
    let quiet_closed = time_to_close(&mut quiet);
    assert!(silent_closed < Duration::from_secs(20), "{silent_closed:?}");
    assert!(quiet_closed < Duration::from_secs(20), "{quiet_closed:?}");
    assert_eq!(stat(admin, "downstream_cx_idle_timeout"), 2);
    assert_eq!(stat(admin, "downstream_cx_headers_timeout"), 1);

    // A connection in use is not idle.
    let mut busy = std::net::TcpStream::connect(proxy.addr()).unwrap();
    for _ in 0..6 {
        assert!(is_served(&mut busy), "closed while in use");
        std::thread::sleep(Duration::from_millis(400));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_over_the_limit_get_431() {
    let noop = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "").replace(
        "    address: 127.0.0.1:0\n    routes:",
        "    address: 127.0.0.1:0\n    http: { max_request_headers_kb: 16 }\n    routes:",
    );
    let proxy = Proxy::start(&config, 1);
    let small = "x".repeat(8 * 1024);
    let r = send_h1(proxy.addr(), get("/", &[("x-big", &small)])).await;
    assert_eq!(r.status(), 200);
    // 20 KiB fits the 32 KiB buffer (the proxy refuses it), 40 KiB does not (the codec does).
    for kib in [20, 40] {
        let answer = oversized_head(proxy.addr(), kib).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{kib} KiB: {answer:?}");
    }
    assert_eq!(
        noop.requests(),
        1,
        "the oversized request reached the upstream"
    );
}

async fn oversized_head(addr: std::net::SocketAddr, kib: usize) -> String {
    let big = "x".repeat(kib * 1024);
    tokio::task::spawn_blocking({
        move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let _ = s
                .write_all(format!("GET / HTTP/1.1\r\nhost: a\r\nx-big: {big}\r\n\r\n").as_bytes());
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap_or(0);
            String::from_utf8_lossy(&buf[..n]).into_owned()
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_connection_request_caps_retire_connections_without_failing_requests() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let noop = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "    max_requests_per_connection: 4")
        .replace(
            "    address: 127.0.0.1:0\n    routes:",
            "    address: 127.0.0.1:0\n    http: { max_requests_per_connection: 5 }\n    routes:",
        );
    let proxy = Proxy::start(&config, 1);
    let url: http::Uri = format!("http://{}/", proxy.addr()).parse().unwrap();

    // HTTP/1.1 on one connection at a time (a pooled client may open a second connection
    // before the first is back in its pool, which spreads the requests): a new connection
    // whenever the proxy says `connection: close`.
    let mut connections = 0;
    let mut sender = None;
    for i in 0..15 {
        if sender.is_none() {
            let stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
            let (s, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            sender = Some(s);
            connections += 1;
        }
        let s = sender.as_mut().unwrap();
        s.ready().await.unwrap();
        let response = s
            .send_request(get("/", &[]))
            .await
            .unwrap_or_else(|e| panic!("h1 request {i}: {e}"));
        assert_eq!(response.status(), 200, "h1 request {i}");
        let closing = response
            .headers()
            .get("connection")
            .is_some_and(|v| v == "close");
        text(response.into_body()).await;
        if closing {
            sender = None;
        }
    }
    assert_eq!(connections, 3, "5 requests a connection");
    let h2: Client<_, http_body_util::Empty<bytes::Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for i in 0..15 {
        let response = h2
            .get(url.clone())
            .await
            .unwrap_or_else(|e| panic!("h2 request {i}: {e}"));
        assert_eq!(response.status(), 200, "h2 request {i}");
        text(response.into_body()).await;
    }

    let admin = proxy.admin.unwrap();
    // 15 HTTP/1.1 requests at 5 a connection: 3 retirements; 15 HTTP/2 streams: 3 GOAWAYs.
    assert_eq!(stat(admin, "downstream_cx_max_requests_reached"), 6);
    // 30 upstream requests at 4 a connection: retired after requests 4, 8, ..., 28.
    assert_eq!(stat(admin, "upstream_cx_max_requests"), 7);
    assert_eq!(noop.requests(), 30);
}

/// Opens `n` connections that each complete one request and stay open; returns the open
/// connections per worker from /workers.
fn spread_over_workers(proxy: &Proxy, n: usize) -> (Vec<std::net::TcpStream>, Vec<u64>) {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = std::net::TcpStream::connect(proxy.addr()).unwrap();
        assert!(is_served(&mut c));
        conns.push(c);
    }
    let (_, body) = admin_request(proxy.admin.unwrap(), "GET", "/workers");
    let workers: serde_json::Value = serde_json::from_str(&body).unwrap();
    let per_worker = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["downstream_cx_active"].as_u64().unwrap())
        .collect();
    (conns, per_worker)
}

#[test]
fn exact_balancing_spreads_connections_evenly_over_workers() {
    let base = forward_config(&["127.0.0.1:9"], "");
    let exact = base.replace(
        "    address: 127.0.0.1:0\n    routes:",
        "    address: 127.0.0.1:0\n    connection_balance: exact\n    routes:",
    );
    let proxy = Proxy::start(&exact, 4);
    let (_conns, per_worker) = spread_over_workers(&proxy, 400);
    assert_eq!(per_worker.len(), 4, "{per_worker:?}");
    assert_eq!(per_worker.iter().sum::<u64>(), 400);
    let (min, max) = (
        per_worker.iter().min().unwrap(),
        per_worker.iter().max().unwrap(),
    );
    assert!(max - min <= 1, "exact: {per_worker:?}");

    // For comparison (not asserted: it is up to the kernel's hash).
    let proxy = Proxy::start(&base, 4);
    let (_conns, per_worker) = spread_over_workers(&proxy, 400);
    eprintln!("reuse_port spread of 400 connections over 4 workers: {per_worker:?}");
}

/// A listener with `ignore_global_conn_limit` is served when the process is full, and its
/// connections take no room from the others.
#[test]
fn a_listener_ignoring_the_process_limit_is_served_when_the_process_is_full() {
    let config = "admin: { address: 127.0.0.1:0 }\nmax_connections: 2\nlisteners:
  - name: public
    address: 127.0.0.1:0
    routes: [{ match: { prefix: / }, direct_response: { status: 200 } }]
  - name: health
    address: 127.0.0.1:0
    ignore_global_conn_limit: true
    routes: [{ match: { prefix: / }, direct_response: { status: 200 } }]
";
    let proxy = Proxy::start(config, 1);
    let (public, health) = (proxy.addrs[0], proxy.addrs[1]);
    let mut checks: Vec<std::net::TcpStream> = (0..3)
        .map(|_| std::net::TcpStream::connect(health).unwrap())
        .collect();
    assert!(checks.iter_mut().all(is_served), "health: not limited");
    let mut full: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(public).unwrap())
        .collect();
    assert!(full.iter_mut().all(is_served), "public: room for 2");
    let mut over = std::net::TcpStream::connect(public).unwrap();
    assert!(!is_served(&mut over), "public: the process is full");
    let mut another_check = std::net::TcpStream::connect(health).unwrap();
    assert!(is_served(&mut another_check), "health: served while full");
    assert_eq!(stat(proxy.admin.unwrap(), "downstream_cx_overflow"), 1);
}
