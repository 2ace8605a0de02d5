//! Edge defences through the real binary (docs/security.md). Path normalisation: a guard on
//! `/private` cannot be walked around by another spelling of the path, over HTTP/1.1 (raw
//! request lines, so nothing on the client side rewrites them) and HTTP/2; the upstream gets
//! the normalised path; the escaped-slash actions; normalisation turned off. Hosts: anything
//! but `host[:port]` gets 400 and reaches no upstream. A response whose length could be read
//! two ways is a 502.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use testbed::{NoopHandle, NoopUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn upstream() -> NoopHandle {
    NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// `/private` answers 403 from the proxy; everything else goes to `upstream`.
fn config(upstream: SocketAddr, path_normalization: &str) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http: {{ {path_normalization} }}
    routes:
      - match: {{ prefix: /private }}
        direct_response: {{ status: 403, body: "guarded\n" }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

/// One HTTP/1.1 request with `target` as written: (status, the `location` header, the body).
async fn raw_get(addr: SocketAddr, target: &str) -> (u16, Option<String>, String) {
    raw_request(addr, target, "edge").await
}

/// The same with `host` as written.
async fn raw_request(addr: SocketAddr, target: &str, host: &str) -> (u16, Option<String>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {target} HTTP/1.1\r\nhost: {host}\r\nx-noop-echo: headers\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let location = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("location")
            .then(|| value.trim().to_owned())
    });
    (status, location, body.to_owned())
}

/// The request line the upstream saw, from its echo.
fn seen_target(body: &str) -> &str {
    body.lines()
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_spellings_of_a_guarded_path_meet_the_guard() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&config(upstream.local_addr(), ""), 1);
    let addr = proxy.addr();
    for target in [
        "/private",
        "//private",
        "/%70rivate",
        "/x/../private",
        "/./private/",
        "/%2e%2e/private",
        "/public/..//private",
    ] {
        let (status, _, body) = raw_get(addr, target).await;
        assert_eq!((status, body.as_str()), (403, "guarded\n"), "{target}");
    }

    // Forwarded with the path in its one spelling; the query as sent.
    let (status, _, body) = raw_get(addr, "/a//b/./c/../d%7e%2f?q=%2e%2E").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(seen_target(&body), "/a/b/d~%2F?q=%2e%2E");

    let (status, _, _) = raw_get(addr, "/a%zz").await;
    assert_eq!(status, 400, "a broken escape");

    // HTTP/2 takes the same way.
    let response = send_h2(addr, get_h2("/x/../private", &[])).await;
    assert_eq!(response.status(), 403);
    let response = send_h2(addr, get_h2("/a/./b", &[("x-noop-echo", "headers")])).await;
    assert_eq!(response.status(), 200);
    assert_eq!(seen_target(&text(response.into_body()).await), "/a/b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_slashes_are_kept_refused_or_unescaped_as_configured() {
    let upstream = upstream().await;
    let target = "/a%2Fb/..%5c?x=1";
    for (action, expected) in [
        ("keep", (200, None, "/a%2Fb/..%5C?x=1")),
        ("reject", (400, None, "")),
        ("unescape_and_forward", (200, None, "/a/?x=1")),
        ("unescape_and_redirect", (307, Some("/a/?x=1"), "")),
    ] {
        let settings = format!("path_normalization: {{ escaped_slashes: {action} }}");
        let proxy = Proxy::start(&config(upstream.local_addr(), &settings), 1);
        let (status, location, body) = raw_get(proxy.addr(), target).await;
        let seen = if status == 200 {
            seen_target(&body)
        } else {
            ""
        };
        assert_eq!(
            (status, location.as_deref(), seen),
            expected,
            "{action}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_never_leaves_the_site() {
    let upstream = upstream().await;
    let settings =
        "path_normalization: { merge_slashes: false, escaped_slashes: unescape_and_redirect }";
    let proxy = Proxy::start(&config(upstream.local_addr(), settings), 1);
    for target in ["/%2Fevil.example/x", "/%5Cevil.example/x"] {
        let (status, location, _) = raw_get(proxy.addr(), target).await;
        assert_eq!(
            (status, location.as_deref()),
            (307, Some("/evil.example/x")),
            "{target}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turned_off_the_path_goes_as_sent() {
    let upstream = upstream().await;
    let settings = "path_normalization: { normalize: false, merge_slashes: false }";
    let proxy = Proxy::start(&config(upstream.local_addr(), settings), 1);
    let (status, _, body) = raw_get(proxy.addr(), "//private/%70").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(seen_target(&body), "//private/%70");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_host_and_port_is_refused_and_never_forwarded() {
    for codec in CODECS {
        a_host_that_is_not_host_and_port_is_refused_and_never_forwarded_on(codec).await;
    }
}

async fn a_host_that_is_not_host_and_port_is_refused_and_never_forwarded_on(codec: &str) {
    let upstream = upstream().await;
    let proxy = Proxy::start(&config(upstream.local_addr(), &with_codec("", codec)), 1);
    let addr = proxy.addr();
    for host in ["a b", "a/b@c", "user@edge", "edge:port", "[::1", "a%zz"] {
        let (status, _, body) = raw_request(addr, "/", host).await;
        assert_eq!(status, 400, "{host}: {body}");
    }
    let (status, _, body) = raw_request(addr, "/", "edge.example:8080").await;
    assert_eq!(status, 200, "{body}");
    // Only the good one reached the upstream.
    assert_eq!(upstream.requests(), 1);

    // HTTP/2: user info in :authority.
    let request = http::Request::get("http://user@edge/")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(send_h2(addr, request).await.status(), 400);
    assert_eq!(upstream.requests(), 1);
}

/// An upstream on a raw socket: every connection it accepts is counted, and each request
/// (one per connection) is answered with `response` as written.
async fn raw_upstream(response: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(response.as_bytes()).await;
                // Held open: the proxy decides whether to use the connection again.
                let _ = stream.read(&mut buf).await;
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_two_lengths_is_a_502_and_its_connection_is_dropped() {
    // Both headers: a chunked reader sees an empty body and then a second response; a
    // length reader sees five bytes. Neither is relayed.
    let (upstream, accepted) = raw_upstream(
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    )
    .await;
    let proxy = Proxy::start(&config(upstream, ""), 1);
    for round in 1..=2 {
        let (status, _, body) = raw_get(proxy.addr(), "/").await;
        assert_eq!((status, body.as_str()), (502, "upstream protocol error\n"));
        // A new connection each time: the first was not pooled.
        assert_eq!(accepted.load(Ordering::SeqCst), round);
    }
}

/// The HTTP/2 codecs a listener may use: each HTTP/2 defence is checked on both.
const CODECS: [&str; 2] = ["hyper", "legate"];

/// `settings` (the listener's `http` keys) with `codec` for its HTTP/2 connections.
fn with_codec(settings: &str, codec: &str) -> String {
    if settings.is_empty() {
        format!("http2_codec: {codec}")
    } else {
        format!("{settings}, http2_codec: {codec}")
    }
}

const PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
const GOAWAY: u8 = 0x7;
const PING: u8 = 0x6;
const SETTINGS: u8 = 0x4;
const CONTINUATION: u8 = 0x9;
const RST_STREAM: u8 = 0x3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_http2_connections_are_closed() {
    for codec in CODECS {
        quiet_http2_connections_are_closed_on(codec).await;
    }
}

async fn quiet_http2_connections_are_closed_on(codec: &str) {
    let upstream = upstream().await;
    let settings = "request_headers_timeout: 300ms";
    let proxy = Proxy::start(
        &config(upstream.local_addr(), &with_codec(settings, codec)),
        1,
    );
    let admin = proxy.admin.unwrap();

    // A connection that never asks for anything: GOAWAY after request_headers_timeout.
    let mut silent = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    silent.write_all(PREFACE_AND_SETTINGS).await.unwrap();
    let frames = frame_types(&read_until_closed(&mut silent).await);
    assert!(frames.contains(&GOAWAY), "{frames:?}");
    assert_eq!(stat(admin, "downstream_cx_headers_timeout"), 1);

    // One that asked once and then went quiet: GOAWAY after idle_timeout. (The header
    // timeout is far off here, so a slow first request cannot be taken for it.)
    let settings = "idle_timeout: 300ms, request_headers_timeout: 60s";
    let proxy = Proxy::start(
        &config(upstream.local_addr(), &with_codec(settings, codec)),
        1,
    );
    let admin = proxy.admin.unwrap();
    let (mut sender, connection) = h2_client(proxy.addr()).await;
    let response = sender.send_request(get_h2("/", &[])).await.unwrap();
    assert_eq!(response.status(), 200);
    text(response.into_body()).await;
    tokio::time::timeout(std::time::Duration::from_secs(20), connection)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert_eq!(stat(admin, "downstream_cx_idle_timeout"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_peer_that_does_not_answer_pings_is_dropped() {
    for codec in CODECS {
        an_http2_peer_that_does_not_answer_pings_is_dropped_on(codec).await;
    }
}

async fn an_http2_peer_that_does_not_answer_pings_is_dropped_on(codec: &str) {
    let upstream = upstream().await;
    // The header timeout is far off: only the unanswered PING can close the connection
    // within the bound.
    let settings =
        "http2_keepalive: { interval: 200ms, timeout: 200ms }, request_headers_timeout: 60s";
    let proxy = Proxy::start(
        &config(upstream.local_addr(), &with_codec(settings, codec)),
        1,
    );
    let mut mute = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    mute.write_all(PREFACE_AND_SETTINGS).await.unwrap();
    // Its SETTINGS are never acknowledged nor its PINGs answered.
    let frames = frame_types(&read_until_closed(&mut mute).await);
    assert!(frames.contains(&PING), "{frames:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_retired_at_their_maximum_duration() {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(upstream.local_addr(), "max_connection_duration: 500ms"),
        1,
    );
    let admin = proxy.admin.unwrap();
    let bound = std::time::Duration::from_secs(20);

    // HTTP/1.1 in use: a response says `connection: close` once the connection is old.
    let stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let closed = tokio::time::timeout(bound, async {
        loop {
            let response = sender.send_request(get("/", &[])).await.unwrap();
            let close = response
                .headers()
                .get("connection")
                .is_some_and(|v| v == "close");
            text(response.into_body()).await;
            if close {
                return;
            }
            // Paced, not synchronised: any number of requests may come before the close.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "no connection: close");
    let _ = tokio::time::timeout(bound, connection).await;

    // HTTP/1.1 idle: closed at the deadline (idle_timeout is five minutes).
    let mut idle = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nhost: edge\r\n\r\n")
        .await
        .unwrap();
    let seen = read_until_closed(&mut idle).await;
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{seen:?}");

    // HTTP/2: GOAWAY at the deadline.
    let (mut sender, connection) = h2_client(proxy.addr()).await;
    let response = sender.send_request(get_h2("/", &[])).await.unwrap();
    assert_eq!(response.status(), 200);
    text(response.into_body()).await;
    tokio::time::timeout(bound, connection)
        .await
        .expect("the HTTP/2 connection is retired")
        .unwrap();

    assert_eq!(stat(admin, "downstream_cx_max_duration_reached"), 3);
}

/// An HTTP/2 frame: length, type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_or_settings_flood_ends_the_connection() {
    for codec in CODECS {
        a_ping_or_settings_flood_ends_the_connection_on(codec).await;
    }
}

async fn a_ping_or_settings_flood_ends_the_connection_on(codec: &str) {
    let upstream = upstream().await;
    let proxy = Proxy::start(&config(upstream.local_addr(), &with_codec("", codec)), 1);
    let admin = proxy.admin.unwrap();
    for kind in [PING, SETTINGS] {
        let mut flood = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
        let mut burst = PREFACE_AND_SETTINGS.to_vec();
        // Over the budget of 1000 in 10 seconds; each is a valid frame the codec answers.
        for i in 0..1100u64 {
            let payload = if kind == PING {
                i.to_be_bytes().to_vec()
            } else {
                Vec::new()
            };
            burst.extend(frame(kind, 0x0, 0, &payload));
        }
        let (mut read, mut write) = flood.split();
        // Written while the answers are read, so the proxy never waits on its writes.
        let (_, answers) = tokio::join!(async { write.write_all(&burst).await }, async {
            let mut seen = Vec::new();
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                read.read_to_end(&mut seen),
            )
            .await
            .expect("the proxy closes the connection");
            seen
        });
        let types = frame_types(&answers);
        assert!(
            types.iter().filter(|&&t| t == kind).count() <= 1001,
            "{kind}: more answers than the budget"
        );
    }
    assert_eq!(stat_settled(admin, "downstream_cx_h2_control_flood", 2), 2);
    assert_eq!(stat(admin, "downstream_cx_h2_flood"), 0);

    // A client that pings within reason is served.
    let (mut sender, _connection) = h2_client(proxy.addr()).await;
    let response = sender.send_request(get_h2("/", &[])).await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_ends_the_connection() {
    for codec in CODECS {
        a_continuation_flood_ends_the_connection_on(codec).await;
    }
}

async fn a_continuation_flood_ends_the_connection_on(codec: &str) {
    let upstream = upstream().await;
    let proxy = Proxy::start(&config(upstream.local_addr(), &with_codec("", codec)), 1);
    let admin = proxy.admin.unwrap();
    let mut flood = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let mut burst = PREFACE_AND_SETTINGS.to_vec();
    // HEADERS with END_STREAM but not END_HEADERS, then CONTINUATIONs that never end the
    // block, a byte each: the codec keeps at most a few before it gives up.
    burst.extend(frame(0x1, 0x1, 1, b"\x82\x86\x84"));
    for _ in 0..100 {
        burst.extend(frame(CONTINUATION, 0x0, 1, b"\x41"));
    }
    let _ = flood.write_all(&burst).await;
    let frames = read_until_closed(&mut flood).await;
    assert_eq!(
        goaway_code(&frames),
        Some(0xb),
        "{:?}",
        frame_types(&frames)
    );
    assert_eq!(
        stat_settled(admin, "downstream_cx_h2_continuation_flood", 1),
        1
    );
    assert_eq!(stat(admin, "downstream_cx_h2_flood"), 0);
    assert_eq!(upstream.requests(), 0);
}

/// A zero-window stall: the client sets its stream window to 0 and asks for a body it never
/// makes room for. The stream, and the upstream request behind it, end after
/// stream_idle_timeout; the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_never_opens_its_window_for_is_reset() {
    for codec in CODECS {
        a_stream_the_client_never_opens_its_window_for_is_reset_on(codec).await;
    }
}

async fn a_stream_the_client_never_opens_its_window_for_is_reset_on(codec: &str) {
    let upstream = upstream().await;
    let proxy = Proxy::start(
        &config(
            upstream.local_addr(),
            &with_codec("stream_idle_timeout: 1s", codec),
        ),
        1,
    );
    let admin = proxy.admin.unwrap();
    let mut stalled = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE (0x4) = 0.
    hello.extend(frame(SETTINGS, 0x0, 0, &[0, 4, 0, 0, 0, 0]));
    // GET / (:authority edge), x-noop-size: 100000; END_STREAM | END_HEADERS.
    hello.extend(frame(
        0x1,
        0x5,
        1,
        b"\x82\x86\x84\x41\x04edge\x00\x0bx-noop-size\x06100000",
    ));
    stalled.write_all(&hello).await.unwrap();
    let mut seen = Vec::new();
    let reset = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stalled.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed: {:?}", frame_types(&seen));
            seen.extend_from_slice(&buf[..n]);
            if frame_types(&seen).contains(&RST_STREAM) {
                return;
            }
        }
    })
    .await;
    assert!(reset.is_ok(), "no RST_STREAM: {:?}", frame_types(&seen));
    assert!(!frame_types(&seen).contains(&GOAWAY));
    assert_eq!(stat(admin, "downstream_rq_idle_timeout"), 1);
    // The request reached the upstream and was given up with the stream.
    assert_eq!(upstream.requests(), 1);

    // A stream that moves is not touched, however long it takes in all: an upload whose
    // frames come every 100 ms for three times the timeout (the upstream answers at its end,
    // so only the body moves meanwhile).
    let (mut sender, _connection) = h2_client(proxy.addr()).await;
    let (mut body, channel) =
        http_body_util::channel::Channel::<bytes::Bytes, std::convert::Infallible>::new(1);
    let request = http::Request::post("http://legate.test/")
        .body(channel)
        .unwrap();
    let response = tokio::spawn(sender.send_request(request));
    for _ in 0..30 {
        body.send_data(bytes::Bytes::from_static(&[7; 1000]))
            .await
            .unwrap();
        // Paced, not synchronised: the pace is what is tested.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    drop(body);
    let response = response.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-noop-request-bytes"], "30000");
    assert_eq!(stat(admin, "downstream_rq_idle_timeout"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_ends_the_connection() {
    for codec in CODECS {
        a_rapid_reset_flood_ends_the_connection_on(codec).await;
    }
}

async fn a_rapid_reset_flood_ends_the_connection_on(codec: &str) {
    let upstream = upstream().await;
    let proxy = Proxy::start(&config(upstream.local_addr(), &with_codec("", codec)), 1);
    let admin = proxy.admin.unwrap();
    let mut flood = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    // GET / with :authority edge, from HPACK's static table: 0x82 :method GET, 0x86 :scheme
    // http, 0x84 :path /, then :authority (index 1) with a literal value.
    let headers: &[u8] = b"\x82\x86\x84\x41\x04edge";
    let mut burst = PREFACE_AND_SETTINGS.to_vec();
    for i in 0..1000u32 {
        let stream = 2 * i + 1;
        // HEADERS with END_STREAM | END_HEADERS, then RST_STREAM CANCEL (0x8) at once.
        burst.extend(frame(0x1, 0x5, stream, headers));
        burst.extend(frame(0x3, 0x0, stream, &8u32.to_be_bytes()));
    }
    // The proxy may close mid-burst; what matters is how the connection ends.
    let _ = flood.write_all(&burst).await;
    let frames = read_until_closed(&mut flood).await;
    assert!(frame_types(&frames).contains(&GOAWAY));
    // GOAWAY's payload: last stream id, then the error code: ENHANCE_YOUR_CALM is 0xb.
    let goaway = goaway_code(&frames);
    assert_eq!(goaway, Some(0xb), "{:?}", frame_types(&frames));
    // Counted as the connection task ends, which may be just after the socket closes.
    assert_eq!(stat_settled(admin, "downstream_cx_h2_flood", 1), 1);
    assert!(
        upstream.requests() < 1000,
        "{} of 1000 reset streams reached the upstream",
        upstream.requests()
    );
}

/// The error code of the first GOAWAY in a server's frames.
fn goaway_code(mut bytes: &[u8]) -> Option<u32> {
    while bytes.len() >= 9 {
        let len =
            (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2]);
        let payload = bytes.get(9..9 + len)?;
        if bytes[3] == GOAWAY && payload.len() >= 8 {
            return Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
        }
        bytes = &bytes[9 + len..];
    }
    None
}
