//! HTTP/2 to the hosts with a cluster's own flow-control windows (Envoy's cluster
//! `http2_protocol_options`, which Envoy Gateway sends with every HTTP/2 backend), as a host
//! sees them in the proxy's connection preface.
//! Connections closed after `idle_timeout` and retired at `max_connection_duration`, over
//! both protocols. A `downstream` cluster speaks the client's protocol to the host.
//! `max_concurrent_streams` opens more connections to a host; `http2_keepalive` PINGs drop a
//! host that stopped answering, and retire a connection idle too long to trust. A host's
//! malformed message closes its connection, as Envoy's default.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use common::*;

const LIMIT: Duration = Duration::from_secs(20);

/// Accepts the proxy's connection and reads its preface: the SETTINGS_INITIAL_WINDOW_SIZE it
/// announces (65535 if it gives none) and the connection window its first WINDOW_UPDATE
/// opens (65535 + the increment; 65535 when none comes before its first HEADERS).
async fn client_windows(listener: TcpListener) -> (u32, u32) {
    let (mut stream, _) = listener.accept().await.unwrap();
    let read = async {
        let mut magic = [0u8; 24];
        stream.read_exact(&mut magic).await.unwrap();
        assert_eq!(&magic, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let (mut stream_window, mut connection_window) = (65_535, 65_535);
        loop {
            let mut head = [0u8; 9];
            stream.read_exact(&mut head).await.unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            let mut payload = vec![0u8; len];
            stream.read_exact(&mut payload).await.unwrap();
            match kind {
                4 if flags & 1 == 0 => {
                    for setting in payload.chunks_exact(6) {
                        if u16::from_be_bytes([setting[0], setting[1]]) == 4 {
                            stream_window = u32::from_be_bytes([
                                setting[2], setting[3], setting[4], setting[5],
                            ]);
                        }
                    }
                }
                8 if stream_id == 0 => {
                    let increment =
                        u32::from_be_bytes([payload[0] & 0x7f, payload[1], payload[2], payload[3]]);
                    connection_window = 65_535 + increment;
                }
                // The request's HEADERS: the preface is over.
                1 => return (stream_window, connection_window),
                _ => {}
            }
        }
    };
    tokio::time::timeout(LIMIT, read)
        .await
        .expect("the proxy's preface and request")
}

fn config(upstream: SocketAddr, windows: &str) -> String {
    format!(
        r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: backend
        timeout: 1s
clusters:
  - name: backend
    endpoints: ["{upstream}"]
    protocol: http2
{windows}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_windows_are_what_its_hosts_are_offered() {
    for (windows, expected) in [
        // Envoy Gateway's: 64 KiB per stream, 1 MiB for the connection.
        (
            "    initial_stream_window_size: 65536\n    initial_connection_window_size: 1048576",
            (65_536, 1_048_576),
        ),
        // None given: the 32 KiB buffer limit per stream, HTTP/2's 64 KiB for the connection.
        ("", (32_768, 65_535)),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let proxy = Proxy::start(&config(upstream, windows), 1);
        let request = tokio::spawn(try_send_h1(proxy.addr(), get("/", &[])));
        assert_eq!(client_windows(listener).await, expected, "{windows:?}");
        // The host went away without answering: the request ends (502 or 503), not hangs.
        let answer = tokio::time::timeout(LIMIT, request).await.unwrap().unwrap();
        assert!(answer.is_ok_and(|r| r.status().is_server_error()));
    }
}

/// A proxy with one worker in front of `upstream`, speaking `protocol` to it, with the
/// cluster settings `extra`.
fn timed_proxy(upstream: SocketAddr, protocol: &str, extra: &str) -> Proxy {
    Proxy::start(
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
    endpoints: ["{upstream}"]
    protocol: {protocol}
    {extra}
"#
        ),
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_connection_idle_past_idle_timeout_is_closed_over_both_protocols() {
    for protocol in ["http1", "http2"] {
        let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let proxy = timed_proxy(
            upstream.local_addr(),
            protocol,
            "idle_timeout: 200ms\n    tcp_keepalive: { probes: 3, time: 60s, interval: 10s }",
        );
        let admin = proxy.admin.unwrap();
        let (_, dump) = admin_request(admin, "GET", "/config_dump");
        let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
        let keepalive = &dump["clusters"][0]["tcp_keepalive"];
        assert_eq!(
            *keepalive,
            serde_json::json!({ "probes": 3, "time": "60s", "interval": "10s" })
        );
        let res = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(res.status(), 200);
        text(res.into_body()).await;
        // Closed by the proxy with no request after it: nothing else would close it.
        eventually("the idle connection closed", async || {
            stat(admin, "upstream_cx_idle_timeout") == 1 && stat(admin, "upstream_cx_active") == 0
        })
        .await;
        // The next request opens a new connection.
        let res = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(res.status(), 200, "{protocol}");
        assert_eq!(upstream.connections(), 2, "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_a_request_longer_than_idle_timeout_is_not_idle() {
    for protocol in ["http1", "http2"] {
        let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let proxy = timed_proxy(upstream.local_addr(), protocol, "idle_timeout: 400ms");
        let admin = proxy.admin.unwrap();
        // The response takes three idle timeouts: the connection is busy, not idle, all along.
        let res = send_h1(proxy.addr(), get("/", &[("x-noop-delay", "1200ms")])).await;
        assert_eq!(res.status(), 200, "{protocol}");
        text(res.into_body()).await;
        assert_eq!(stat(admin, "upstream_cx_idle_timeout"), 0, "{protocol}");
        // Idle from the response's end on.
        eventually("the connection closed once idle", async || {
            stat(admin, "upstream_cx_idle_timeout") == 1
        })
        .await;
        assert_eq!(upstream.connections(), 1, "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_upstream_connection_is_replaced_at_max_connection_duration_over_both_protocols() {
    for protocol in ["http1", "http2"] {
        let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let proxy = timed_proxy(
            upstream.local_addr(),
            protocol,
            "max_connection_duration: 200ms",
        );
        let admin = proxy.admin.unwrap();
        // Requests one after another, never idle long: the first connection is retired
        // when it reaches 200 ms, and no request fails for it.
        eventually("a second upstream connection", async || {
            let res = send_h1(proxy.addr(), get("/", &[])).await;
            assert_eq!(res.status(), 200, "{protocol}");
            text(res.into_body()).await;
            upstream.connections() >= 2
        })
        .await;
        assert!(
            stat(admin, "upstream_cx_max_duration_reached") >= 1,
            "{protocol}"
        );
        assert_eq!(stat(admin, "upstream_cx_idle_timeout"), 0, "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_cluster_speaks_to_the_host_what_the_client_spoke() {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = timed_proxy(upstream.local_addr(), "downstream", "");
    // The no-op upstream echoes its request line, version included.
    let res = send_h1(proxy.addr(), get("/one", &[("x-noop-echo", "headers")])).await;
    assert_eq!(res.status(), 200);
    let echoed = text(res.into_body()).await;
    assert!(echoed.starts_with("GET /one HTTP/1.1\n"), "{echoed}");
    let res = send_h2(proxy.addr(), get_h2("/two", &[("x-noop-echo", "headers")])).await;
    assert_eq!(res.status(), 200);
    let echoed = text(res.into_body()).await;
    assert!(echoed.starts_with("GET /two HTTP/2.0\n"), "{echoed}");
    // And HTTP/1.1 again, on the connection it kept.
    let res = send_h1(proxy.addr(), get("/three", &[("x-noop-echo", "headers")])).await;
    let echoed = text(res.into_body()).await;
    assert!(echoed.starts_with("GET /three HTTP/1.1\n"), "{echoed}");
    assert_eq!(upstream.connections(), 2, "one connection per protocol");
}

/// `n` requests sent at once through `proxy`, each on a connection of its own.
fn requests_at_once(
    proxy: SocketAddr,
    n: usize,
) -> Vec<tokio::task::JoinHandle<hyper::Response<hyper::body::Incoming>>> {
    (0..n)
        .map(|_| tokio::spawn(async move { send_h1(proxy, get("/", &[])).await }))
        .collect()
}

/// Waits for each of `requests` (at most [`LIMIT`] each): every one answered 200.
async fn all_answered(
    requests: impl IntoIterator<Item = tokio::task::JoinHandle<hyper::Response<hyper::body::Incoming>>>,
) {
    for request in requests {
        let res = tokio::time::timeout(LIMIT, request).await.unwrap().unwrap();
        assert_eq!(res.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gets_another_http2_connection_past_max_concurrent_streams() {
    let upstream = HeldUpstream::start().await;
    let proxy = timed_proxy(upstream.addr, "http2", "max_concurrent_streams: 2");
    let admin = proxy.admin.unwrap();
    let requests = requests_at_once(proxy.addr(), 5);
    upstream.wait_for_requests(5).await;
    // Five streams held open, two to a connection: three connections, on one worker.
    assert_eq!(stat(admin, "upstream_cx_total"), 3);
    assert_eq!(stat(admin, "upstream_cx_active"), 3);
    upstream.release();
    all_answered(requests).await;
    // The connections with room take the next requests: none is opened for them.
    for _ in 0..4 {
        let res = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(res.status(), 200);
        text(res.into_body()).await;
    }
    assert_eq!(stat(admin, "upstream_cx_total"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_finding_every_http2_connection_full_wait_for_a_stream_at_max_connections() {
    let upstream = HeldUpstream::start().await;
    let proxy = timed_proxy(
        upstream.addr,
        "http2",
        "max_concurrent_streams: 2\n    circuit_breakers: { max_connections: 2, pending_timeout: 20s }",
    );
    let admin = proxy.admin.unwrap();
    let requests = requests_at_once(proxy.addr(), 6);
    upstream.wait_for_requests(4).await;
    // The fifth and sixth wait in the pending queue: no third connection, no fifth stream.
    eventually("two requests pending", async || {
        stat(admin, "upstream_rq_pending_active") == 2
    })
    .await;
    assert_eq!(upstream.arrived(), 4);
    assert_eq!(stat(admin, "upstream_cx_total"), 2);
    upstream.release();
    all_answered(requests).await;
    // Each stream freed lets one waiter on: both get one.
    assert_eq!(upstream.arrived(), 6);
    assert_eq!(stat(admin, "upstream_cx_total"), 2);
    assert_eq!(stat(admin, "upstream_rq_pending_overflow"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_host_that_stops_answering_pings_is_dropped() {
    // A host that takes the connection and its request, then answers nothing: no response,
    // no PING ACK.
    let mute = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = mute.local_addr().unwrap();
    let host = tokio::spawn(async move {
        let (mut stream, _) = mute.accept().await.unwrap();
        let mut magic = [0u8; 24];
        stream.read_exact(&mut magic).await.unwrap();
        read_until_closed(&mut stream).await
    });
    // The route's timeout is far off: only an unanswered PING can end the request within the
    // bound.
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
        timeout: 120s
clusters:
  - name: backend
    endpoints: ["{addr}"]
    protocol: http2
    http2_keepalive: {{ interval: 200ms, timeout: 200ms, interval_jitter: 0 }}
"#
        ),
        1,
    );
    let admin = proxy.admin.unwrap();
    let res = tokio::time::timeout(LIMIT, send_h1(proxy.addr(), get("/", &[])))
        .await
        .expect("answered before the route's timeout");
    assert!(res.status().is_server_error(), "{}", res.status());
    let frames = frame_types(&tokio::time::timeout(LIMIT, host).await.unwrap().unwrap());
    assert!(frames.contains(&0x6), "a PING was sent: {frames:?}");
    let (_, dump) = admin_request(admin, "GET", "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(
        dump["clusters"][0]["http2_keepalive"],
        serde_json::json!({
            "interval": "200ms", "timeout": "200ms", "interval_jitter": 0.0,
            "connection_idle_interval": null
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_idle_past_connection_idle_interval_takes_no_new_stream() {
    for (idle, connections) in [("300ms", 2), ("60s", 1)] {
        let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let proxy = timed_proxy(
            upstream.local_addr(),
            "http2",
            &format!("http2_keepalive: {{ connection_idle_interval: {idle} }}"),
        );
        let res = send_h1(proxy.addr(), get("/", &[])).await;
        text(res.into_body()).await;
        // The idleness under test: longer than the short interval, far below the long one.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let res = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(res.status(), 200);
        text(res.into_body()).await;
        assert_eq!(upstream.connections(), connections, "{idle}");
    }
}

/// An HTTP/2 host that answers each request from a connection's `answer_from`th on with a
/// head HTTP/2 forbids (`connection: close`), and those before it never; `.1` counts the
/// connections it took, `.2` the requests.
async fn malformed_host(answer_from: usize) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (count, asked) = (Arc::clone(&accepted), Arc::clone(&requests));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let asked = Arc::clone(&asked);
            tokio::spawn(async move {
                let mut on_this = 0;
                let mut magic = [0u8; 24];
                stream.read_exact(&mut magic).await?;
                stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await?;
                loop {
                    let mut head = [0u8; 9];
                    stream.read_exact(&mut head).await?;
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let mut payload = vec![0u8; len];
                    stream.read_exact(&mut payload).await?;
                    match head[3] {
                        // SETTINGS: acknowledged.
                        4 if head[4] & 1 == 0 => {
                            stream.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await?;
                        }
                        // HEADERS: `:status: 200` and `connection: close`, ending the stream.
                        1 => {
                            asked.fetch_add(1, Ordering::SeqCst);
                            on_this += 1;
                            if on_this < answer_from {
                                continue;
                            }
                            let mut block = vec![0x88, 0x00, 10];
                            block.extend_from_slice(b"connection");
                            block.push(5);
                            block.extend_from_slice(b"close");
                            let mut frame = vec![0, 0, block.len() as u8, 1, 0x5];
                            frame.extend_from_slice(&head[5..9]);
                            frame.extend_from_slice(&block);
                            stream.write_all(&frame).await?;
                        }
                        _ => {}
                    }
                }
                #[allow(unreachable_code)]
                Ok::<_, std::io::Error>(())
            });
        }
    });
    (addr, accepted, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_closes_the_http2_connection_unless_told_to_reset_the_stream() {
    for (setting, connections) in [("", 2), ("stream_error_on_invalid_http_message: true", 1)] {
        let (host, accepted, _) = malformed_host(1).await;
        let proxy = timed_proxy(host, "http2", setting);
        for _ in 0..2 {
            let res = send_h1(proxy.addr(), get("/", &[])).await;
            assert_eq!(res.status(), 502, "{setting}");
            text(res.into_body()).await;
        }
        // Envoy's default: the connection that carried a malformed head is closed, and the
        // next request opens another; told to, only the stream is reset.
        assert_eq!(accepted.load(Ordering::SeqCst), connections, "{setting}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_opened_before_a_host_is_ejected_take_no_new_request() {
    for protocol in ["http1", "http2"] {
        let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let proxy = timed_proxy(
            upstream.local_addr(),
            protocol,
            "outlier_detection: { consecutive_5xx: 1, max_ejection_percent: 100 }",
        );
        let admin = proxy.admin.unwrap();
        // Two requests at once: two HTTP/1.1 connections (one HTTP/2), idle once answered.
        let slow = |_| {
            let proxy = proxy.addr();
            tokio::spawn(async move {
                let res = send_h1(proxy, get("/", &[("x-noop-delay", "1s")])).await;
                assert_eq!(res.status(), 200);
                text(res.into_body()).await;
            })
        };
        for request in (0..2).map(slow).collect::<Vec<_>>() {
            request.await.unwrap();
        }
        let opened = if protocol == "http1" { 2 } else { 1 };
        assert_eq!(upstream.connections(), opened, "{protocol}");
        // A 500 ejects the only host (its requests then go to it in panic).
        let res = send_h1(proxy.addr(), get("/", &[("x-noop-status", "500")])).await;
        assert_eq!(res.status(), 500);
        text(res.into_body()).await;
        // Envoy drains a failed host's pools: idle connections close at once...
        eventually("the drained connections closed", async || {
            stat(admin, "upstream_cx_active") == 0
        })
        .await;
        // ...and the next request opens a new one.
        let res = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(res.status(), 200, "{protocol}");
        text(res.into_body()).await;
        assert_eq!(upstream.connections(), opened + 1, "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_for_a_connection_all_take_the_new_http2_one() {
    let upstream = HeldUpstream::start().await;
    let proxy = timed_proxy(
        upstream.addr,
        "http2",
        "max_connection_duration: 1s\n    circuit_breakers: { max_connections: 1, pending_timeout: 20s }",
    );
    let admin = proxy.admin.unwrap();
    let first = requests_at_once(proxy.addr(), 1);
    upstream.wait_for_requests(1).await;
    // The one connection is retired by age while busy: it takes no new stream, and holds
    // the one connection slot until its stream ends.
    eventually("the busy connection retired", async || {
        stat(admin, "upstream_cx_max_duration_reached") == 1
    })
    .await;
    let waiting = requests_at_once(proxy.addr(), 2);
    eventually("two requests pending", async || {
        stat(admin, "upstream_rq_pending_active") == 2
    })
    .await;
    upstream.release();
    // The slot freed, one waiter opens a connection; the other takes a stream on it at once,
    // long before that connection's own second of age (a third connection).
    all_answered(first.into_iter().chain(waiting)).await;
    assert_eq!(stat(admin, "upstream_cx_total"), 2);
    assert_eq!(stat(admin, "upstream_rq_pending_timeout"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_fails_the_other_streams_of_its_connection_at_once() {
    // The first request is never answered; the second's malformed head closes the
    // connection, and the first fails with it rather than wait out its route's two minutes.
    let (host, _, requests) = malformed_host(2).await;
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
        timeout: 120s
clusters:
  - name: backend
    endpoints: ["{host}"]
    protocol: http2
"#
        ),
        1,
    );
    let admin = proxy.admin.unwrap();
    let first = requests_at_once(proxy.addr(), 1);
    eventually("the first request at the host", async || {
        requests.load(Ordering::SeqCst) == 1
    })
    .await;
    let res = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(res.status(), 502);
    for request in first {
        let res = tokio::time::timeout(LIMIT, request).await.unwrap().unwrap();
        assert!(res.status().is_server_error(), "{}", res.status());
    }
    eventually("the connection closed", async || {
        stat(admin, "upstream_cx_active") == 0
    })
    .await;
}
