//! WebSocket through the real binary: a real client (tokio-tungstenite) and a real echo server,
//! over HTTP/1.1 `Upgrade` and HTTP/2 extended CONNECT; large and fragmented messages, the
//! close handshake, the idle timeout, and routes or upstreams that do not upgrade.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{Method, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tokio_tungstenite::{WebSocketStream, client_async};

/// A WebSocket server echoing every message until the client closes.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    // tungstenite answers pings and closes itself.
                    let echoed = message.is_text() || message.is_binary();
                    if echoed && ws.send(message).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn config(echo: SocketAddr, noop: SocketAddr, http: &str) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http: {{ {http} }}
    routes:
      - match: {{ prefix: /ws }}
        cluster: echo
        upgrades: [websocket]
      - match: {{ prefix: /declines }}
        cluster: noop
        upgrades: [websocket]
      - match: {{ prefix: /dead }}
        cluster: dead
        upgrades: [websocket]
      - match: {{ prefix: / }}
        cluster: noop
clusters:
  - name: echo
    endpoints: [{echo}]
  - name: noop
    endpoints: [{noop}]
  - name: dead
    endpoints: [127.0.0.1:1]
"#
    )
}

async fn start(http: &str) -> (Proxy, testbed::NoopHandle) {
    let noop = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let echo = echo_server().await;
    (
        Proxy::start(&config(echo, noop.local_addr(), http), 2),
        noop,
    )
}

async fn connect(proxy: &Proxy, path: &str) -> WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let (ws, response) = client_async(format!("ws://legate.test{path}"), stream)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws
}

/// A WebSocket to `/ws` over HTTP/2 extended CONNECT (RFC 8441): a 200 without the HTTP/1.1
/// handshake's headers, then the stream is the tunnel.
async fn connect_h2(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>> {
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri("http://legate.test/ws")
        .header("sec-websocket-version", "13")
        .body(Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response.headers().contains_key("sec-websocket-accept"));
    let stream = hyper::upgrade::on(&mut response).await.unwrap();
    WebSocketStream::from_raw_socket(TokioIo::new(stream), Role::Client, None).await
}

/// Sends a few messages, large and fragmented among them, and checks each echo.
async fn exchange<S>(ws: &mut WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    // 3 MiB: far over the 32 KiB buffer limit, so it moves under backpressure.
    let large = testbed::pattern_bytes(7, 3 << 20);
    ws.send(Message::Binary(large.clone())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Binary(large),
        "the large message came back whole"
    );
    // One message in three frames: the server sees (and echoes) it whole.
    for (i, part) in ["frag", "mented ", "message"].into_iter().enumerate() {
        let opcode = if i == 0 { Data::Text } else { Data::Continue };
        let frame = Frame::message(Bytes::from(part), OpCode::Data(opcode), i == 2);
        ws.send(Message::Frame(frame)).await.unwrap();
    }
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("fragmented message")
    );
}

async fn close<S>(mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.close(Some(CloseFrame {
        code: 1000.into(),
        reason: Utf8Bytes::from_static("bye"),
    }))
    .await
    .unwrap();
    // The server's close comes back through the proxy, then the stream ends.
    loop {
        match ws.next().await {
            Some(Ok(Message::Close(frame))) => {
                assert_eq!(frame.unwrap().code, 1000.into());
            }
            Some(Ok(other)) => panic!("unexpected {other:?}"),
            Some(Err(_)) | None => break,
        }
    }
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_messages_flow_both_ways_over_http1() {
    let (proxy, _noop) = start("").await;
    let mut ws = connect(&proxy, "/ws").await;
    exchange(&mut ws).await;
    let admin = proxy.admin.unwrap();
    assert_eq!(stat(admin, "downstream_cx_upgrades_active"), 1);
    close(ws).await;
    eventually("the relay ends after the close handshake", || {
        stat(admin, "downstream_cx_upgrades_active") == 0
    });
    assert_eq!(stat(admin, "downstream_cx_upgrades_total"), 1);
    // Several at once, each on its own upstream connection.
    let mut sockets = Vec::new();
    for _ in 0..5 {
        sockets.push(connect(&proxy, "/ws").await);
    }
    for ws in &mut sockets {
        ws.send(Message::text("many")).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("many"));
    }
    assert_eq!(stat(admin, "downstream_cx_upgrades_active"), 5);
}

/// With a filter chain: hop-by-hop headers are stripped before the filters run, and the
/// upgrade's own (`Connection: upgrade`, `Upgrade`) must survive that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_through_a_filter_chain() {
    let noop = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let echo = echo_server().await;
    let yaml = config(echo, noop.local_addr(), "").replace(
        "    routes:\n",
        "    http_filters:\n      - headers: { request: { set: { x-through: filters } } }\n    routes:\n",
    );
    let proxy = Proxy::start(&yaml, 1);
    let mut ws = connect(&proxy, "/ws").await;
    exchange(&mut ws).await;
    close(ws).await;
}

/// The HTTP/2 codecs a listener may serve with: each serves WebSockets alike.
const CODECS: [&str; 2] = ["hyper", "legate"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_over_http2_extended_connect() {
    for codec in CODECS {
        websocket_over_http2_extended_connect_on(codec).await;
    }
}

async fn websocket_over_http2_extended_connect_on(codec: &str) {
    let (proxy, _noop) = start(&format!("http2_codec: {codec}")).await;
    let (mut sender, _conn) = h2_client::<Empty<Bytes>>(proxy.addr()).await;
    let mut ws = connect_h2(&mut sender).await;
    exchange(&mut ws).await;
    close(ws).await;
    let admin = proxy.admin.unwrap();
    eventually("the stream's relay ends", || {
        stat(admin, "downstream_cx_upgrades_active") == 0
    });
    assert_eq!(stat(admin, "downstream_cx_upgrades_total"), 1);
    // Extended CONNECT to a route without upgrades is refused, not tunnelled.
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri("http://legate.test/plain")
        .header("sec-websocket-version", "13")
        .body(Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let refused = sender.send_request(req).await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
}

/// An HTTP/2 WebSocket quiet for longer than stream_idle_timeout still works: that timer is
/// for streams, the tunnel has its own idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_http2_websocket_outlives_the_stream_idle_timeout() {
    for codec in CODECS {
        a_quiet_http2_websocket_outlives_the_stream_idle_timeout_on(codec).await;
    }
}

async fn a_quiet_http2_websocket_outlives_the_stream_idle_timeout_on(codec: &str) {
    let (proxy, _noop) = start(&format!("stream_idle_timeout: 200ms, http2_codec: {codec}")).await;
    let (mut sender, _conn) = h2_client::<Empty<Bytes>>(proxy.addr()).await;
    let mut ws = connect_h2(&mut sender).await;
    ws.send(Message::text("before")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("before"));
    // Quiet for five times the stream idle timeout: the quiet is what is tested.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    exchange(&mut ws).await;
    close(ws).await;
    assert_eq!(stat(proxy.admin.unwrap(), "downstream_rq_idle_timeout"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_a_route_does_not_allow_or_an_upstream_declines_are_plain_requests() {
    let (proxy, _noop) = start("").await;
    let upgrade = [
        ("connection", "upgrade"),
        ("upgrade", "websocket"),
        ("x-noop-echo", "headers"),
    ];
    // A route without `upgrades`: the upstream gets a plain request, its answer is relayed.
    let plain = send_h1(proxy.addr(), get("/plain", &upgrade)).await;
    assert_eq!(plain.status(), StatusCode::OK);
    let seen = text(plain.into_body()).await;
    assert!(!seen.contains("upgrade:"), "{seen}");
    // An upstream that answers 200 to the upgrade: the client gets the 200.
    let declined = send_h1(proxy.addr(), get("/declines", &upgrade)).await;
    assert_eq!(declined.status(), StatusCode::OK);
    assert_eq!(
        stat(proxy.admin.unwrap(), "downstream_rq_upgrade_failed"),
        1
    );
    // An upstream that cannot be reached: the client gets 503, and the failure is counted.
    let unreachable = send_h1(proxy.addr(), get("/dead", &upgrade)).await;
    assert_eq!(unreachable.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        stat(proxy.admin.unwrap(), "downstream_rq_upgrade_failed"),
        2
    );
    assert_eq!(
        stat(proxy.admin.unwrap(), "downstream_cx_upgrades_total"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_is_closed_at_the_idle_timeout() {
    let (proxy, _noop) = start("idle_timeout: 1s").await;
    let mut ws = connect(&proxy, "/ws").await;
    ws.send(Message::text("once")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("once"));
    // Nothing more is sent: the proxy ends the relay, and the stream ends here.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the idle connection was not closed");
    let admin = proxy.admin.unwrap();
    // Counted by the proxy around the moment the client sees the end: wait for them.
    eventually("the idle timeout is counted", || {
        stat(admin, "downstream_cx_idle_timeout") == 1
    });
    eventually("the relay is no longer active", || {
        stat(admin, "downstream_cx_upgrades_active") == 0
    });
}
