//! Idle HTTP/1.1 connections parked as their sockets alone (worker/parking.rs), through the
//! real binary: a connection idle for a second is parked and serves its next request as if it
//! had never left; a parked one closes at its idle timeout or maximum duration, and at once
//! when the proxy stops; bytes sent in pieces across the park are not lost.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use hyper_util::rt::TokioIo;
use testbed::NoopUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn upstream() -> testbed::NoopHandle {
    NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn config(upstream: SocketAddr, http: &str) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
drain_timeout: 120s
listeners:
  - name: main
    address: 127.0.0.1:0
    http: {{ {http} }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

/// A keep-alive connection to `addr` that has had one request answered, and stays open.
async fn served_once(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    stream
}

/// Waits until `n` connections are parked.
fn wait_parked(admin: SocketAddr, n: i64) {
    assert_eq!(stat_settled(admin, "downstream_cx_parked", n), n, "parked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_connections_serve_their_next_requests() {
    let backend = upstream().await;
    let proxy = Proxy::start(&config(backend.local_addr(), ""), 2);
    let admin = proxy.admin.unwrap();

    // Twenty keep-alive connections, a request each, then idle.
    let mut senders = Vec::new();
    for i in 0..20 {
        let stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let r = sender
            .send_request(get(&format!("/first/{i}"), &[]))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let _ = text(r.into_body()).await;
        senders.push(sender);
    }
    wait_parked(admin, 20);
    assert_eq!(stat(admin, "downstream_cx_active"), 20);
    // Each is served again on the same connection, and parks again.
    for round in 0..2 {
        for (i, sender) in senders.iter_mut().enumerate() {
            sender.ready().await.unwrap();
            let r = sender
                .send_request(get(
                    &format!("/again/{round}/{i}"),
                    &[("x-noop-echo", "headers")],
                ))
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body = text(r.into_body()).await;
            assert!(
                body.starts_with(&format!("GET /again/{round}/{i} ")),
                "{body}"
            );
        }
        wait_parked(admin, 20);
    }
    assert_eq!(
        stat(admin, "downstream_cx_total"),
        20,
        "no connection was replaced"
    );
    drop(senders);
    assert_eq!(stat_settled(admin, "downstream_cx_active", 0), 0);
    assert_eq!(stat(admin, "downstream_cx_parked"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_split_across_the_park_is_read_whole() {
    let backend = upstream().await;
    let proxy = Proxy::start(&config(backend.local_addr(), ""), 1);
    let admin = proxy.admin.unwrap();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"GET /one HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    wait_parked(admin, 1);
    // Half a head wakes it: back with a task, it waits for the rest.
    stream.write_all(b"GET /two HTTP/1.1\r\nho").await.unwrap();
    assert_eq!(stat_settled(admin, "downstream_cx_parked", 0), 0);
    stream
        .write_all(b"st: a\r\nx-noop-echo: headers\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = String::from_utf8(read_until_closed(&mut stream).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("GET /two HTTP/1.1"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_connections_close_at_their_deadlines() {
    let backend = upstream().await;
    // Two listeners: one closes idle connections after 2 s, one ends every connection after
    // 3 s whatever it does.
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: idle
    address: 127.0.0.1:0
    http: {{ idle_timeout: 2s }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
  - name: duration
    address: 127.0.0.1:0
    http: {{ max_connection_duration: 3s }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        backend.local_addr()
    );
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    for (at, counter) in [
        (proxy.addrs[0], "downstream_cx_idle_timeout"),
        (proxy.addrs[1], "downstream_cx_max_duration_reached"),
    ] {
        let mut stream = served_once(at).await;
        wait_parked(admin, 1);
        // Closed by the lot: the client reads the end, and it is counted as the task would.
        let rest = read_until_closed(&mut stream).await;
        assert!(
            rest.is_empty() || rest.starts_with(b"HTTP/1.1 200"),
            "{rest:?}"
        );
        assert_eq!(stat_settled(admin, counter, 1), 1, "{counter}");
        assert_eq!(stat(admin, "downstream_cx_parked"), 0);
        assert_eq!(stat_settled(admin, "downstream_cx_active", 0), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_closes_parked_connections_at_once() {
    let backend = upstream().await;
    // A drain time far longer than the test may wait: parked connections must not hold the
    // stop for it.
    let mut proxy = Proxy::start(&config(backend.local_addr(), ""), 2);
    let admin = proxy.admin.unwrap();
    let mut streams = Vec::new();
    for _ in 0..10 {
        streams.push(served_once(proxy.addr()).await);
    }
    wait_parked(admin, 10);
    proxy.terminate();
    let status = proxy
        .wait(Duration::from_secs(60))
        .expect("stopped within the minute");
    assert!(status.success(), "{status:?}");
    for stream in &mut streams {
        assert!(read_until_closed(stream).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_listener_closes_its_parked_connections_at_once() {
    let backend = upstream().await;
    let two = |second: bool| {
        let mut yaml = config(backend.local_addr(), "");
        if second {
            yaml = yaml.replace(
                "clusters:",
                "  - name: second\n    address: 127.0.0.1:0\n    routes:\n      - match: { prefix: / }\n        cluster: backend\nclusters:",
            );
        }
        yaml
    };
    let proxy = Proxy::start(&two(true), 1);
    let admin = proxy.admin.unwrap();
    let mut stream = served_once(proxy.addrs[1]).await;
    wait_parked(admin, 1);
    // The second listener goes (the drain time is 120 s): its parked connection closes now.
    proxy.rewrite_config(&two(false));
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    assert!(read_until_closed(&mut stream).await.is_empty());
    assert_eq!(stat(admin, "downstream_cx_parked"), 0);
    // The first listener serves on.
    let r = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(r.status(), 200);
}
