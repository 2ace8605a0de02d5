//! Failures mapped to statuses: connect failure 503, timeout 504, reset or bad response 502,
//! malformed request 400. Each local reply carries a short body and logs its response flag.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::Full;
use hyper::body::Body;
use testbed::{FailingOrigin, FailureMode, NoopUpstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failure_is_503_uf() {
    let closed = closed_port();
    let proxy = Proxy::start(&forward_config(&[closed.addr], ""), 1);
    let response = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(response.status(), 503);
    assert_eq!(
        text(response.into_body()).await,
        "upstream connect failure\n"
    );
    assert!(
        proxy.wait_for_log("flag=UF", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_is_504_ut_at_the_route_timeout() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "").replace(
        "        cluster: backend",
        "        cluster: backend\n        timeout: 300ms",
    );
    let proxy = Proxy::start(&config, 1);
    let started = Instant::now();
    let response = send_h1(proxy.addr(), get("/", &[("x-noop-delay", "60s")])).await;
    assert_eq!(response.status(), 504);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the 300ms timeout, not the 60 s upstream, ended it"
    );
    assert_eq!(
        text(response.into_body()).await,
        "upstream request timeout\n"
    );
    assert!(
        proxy.wait_for_log("flag=UT", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
    // The same request within the timeout succeeds.
    let response = send_h1(proxy.addr(), get("/", &[("x-noop-delay", "10ms")])).await;
    assert_eq!(response.status(), 200);
}

/// Writes a request head with `content-length: 4000`, then `parts` 1000-byte pieces `gap`
/// apart; returns the status line of the answer.
fn paced_upload(addr: SocketAddr, parts: usize, gap: Duration) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 4000\r\n\r\n")
        .unwrap();
    for _ in 0..parts {
        std::thread::sleep(gap);
        stream.write_all(&[b'x'; 1000]).unwrap();
    }
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_timeout_runs_from_the_end_of_the_request_body() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "").replace(
        "        cluster: backend",
        "        cluster: backend\n        timeout: 3s",
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();
    // An upload that keeps moving may take longer than the timeout (4 x 1 s, each gap a
    // third of the timeout: room for a busy machine)...
    let moving = tokio::task::spawn_blocking(move || paced_upload(addr, 4, Duration::from_secs(1)));
    assert_eq!(moving.await.unwrap(), "HTTP/1.1 200");
    // ...one that stalls for longer is cut off.
    let started = Instant::now();
    let stalled = tokio::task::spawn_blocking(move || paced_upload(addr, 1, Duration::ZERO));
    assert_eq!(stalled.await.unwrap(), "HTTP/1.1 504");
    assert!(started.elapsed() < Duration::from_secs(30), "cut off late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_hangs_up_is_502_ur() {
    let origin = FailingOrigin::bind(
        "127.0.0.1:0".parse().unwrap(),
        FailureMode::CloseWithoutResponse,
    )
    .await
    .unwrap();
    let proxy = Proxy::start(&forward_config(&[origin.local_addr()], ""), 1);
    let response = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(response.status(), 502);
    assert_eq!(
        text(response.into_body()).await,
        "upstream connection reset\n"
    );
    assert!(
        proxy.wait_for_log("flag=UR", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
    // HTTP/2 clients get the same answer.
    let response = send_h2(proxy.addr(), get_h2("/", &[])).await;
    assert_eq!(response.status(), 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_response_is_502_upe() {
    let origin = FailingOrigin::bind("127.0.0.1:0".parse().unwrap(), FailureMode::GarbageResponse)
        .await
        .unwrap();
    let proxy = Proxy::start(&forward_config(&[origin.local_addr()], ""), 1);
    let response = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(response.status(), 502);
    assert_eq!(
        text(response.into_body()).await,
        "upstream protocol error\n"
    );
    assert!(
        proxy.wait_for_log("flag=UPE", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrouted_requests_get_404_nr() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = forward_config(&[noop.local_addr()], "").replace("prefix: /", "prefix: /api");
    let proxy = Proxy::start(&config, 1);
    let response = send_h1(proxy.addr(), get("/elsewhere", &[])).await;
    assert_eq!(response.status(), 404);
    assert!(
        proxy.wait_for_log("flag=NR", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
    assert_eq!(noop.requests(), 0);
}

/// `local_reply` rewrites the proxy's own replies (Envoy's `local_reply_config`): the first
/// mapper whose filter holds sets status, body and headers; upstream answers are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_replies_are_rewritten_by_the_first_matching_mapper() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let closed = closed_port();
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http:
      local_reply:
        mappers:
          - filter: {{ and: [{{ response_flags: [UF] }}, {{ header: {{ name: x-tag, exact: api }} }}] }}
            status: 502
            body: "the service is down\n"
            headers: {{ set: {{ x-mapped: "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%" }} }}
          - filter: {{ and: [{{ status_code: {{ eq: 404 }} }}, {{ header: {{ name: x-tag, exact: api }} }}] }}
            body: "no such API\n"
          - filter: {{ and: [{{ response_flags: [UF] }}, {{ header: {{ name: x-tag, exact: login }} }}] }}
            status: 401
          - filter: {{ status_code: {{ ge: 400 }} }}
            headers: {{ add: {{ x-local: "yes" }} }}
    routes:
      - match: {{ prefix: /down }}
        cluster: gone
      - match: {{ prefix: /teapot }}
        direct_response: {{ status: 418, body: "short and stout\n" }}
      - match: {{ prefix: /up }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
  - name: gone
    endpoints: [{}]
"#,
        noop.local_addr(),
        closed.addr
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();

    // A connect failure (503, UF) of the API's request (its header read though the request
    // went upstream): the first mapper, its header formatted for the exchange.
    let res = send_h1(addr, get("/down", &[("x-tag", "api")])).await;
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()["x-mapped"], "127.0.0.1");
    assert_eq!(res.headers()["content-type"], "text/plain");
    assert!(
        res.headers().get("x-local").is_none(),
        "only the first match applies"
    );
    assert_eq!(text(res.into_body()).await, "the service is down\n");
    // Another request's: the third.
    let res = send_h1(addr, get("/down", &[])).await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["x-local"], "yes");
    // No route (404): the second mapper for the API's requests; the status stays.
    let res = send_h1(addr, get("/nowhere", &[("x-tag", "api")])).await;
    assert_eq!(res.status(), 404);
    assert_eq!(text(res.into_body()).await, "no such API\n");
    // Another 404, and a direct response: the third, which only adds a header.
    let res = send_h1(addr, get("/nowhere", &[])).await;
    assert_eq!(res.status(), 404);
    assert_eq!(res.headers()["x-local"], "yes");
    let res = send_h1(addr, get("/teapot", &[])).await;
    assert_eq!(res.status(), 418);
    assert_eq!(res.headers()["x-local"], "yes");
    assert_eq!(text(res.into_body()).await, "short and stout\n");
    // An upstream's answer is not a local reply, whatever its status.
    let res = send_h1(addr, get("/up", &[("x-noop-status", "404")])).await;
    assert_eq!(res.status(), 404);
    assert!(res.headers().get("x-local").is_none());
    // A reply no mapper picks is as the proxy made it.
    let res = send_h1(addr, get("/up", &[])).await;
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("x-local").is_none());

    // A gRPC call's local replies, after the mappers, are trailers-only answers: the mapped
    // 502 is UNAVAILABLE with the mapped body as its message, a 404 is UNIMPLEMENTED.
    let grpc_call = |path: &str, tag: Option<&str>| {
        let mut call = Request::post(format!("http://legate.test{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(tag) = tag {
            call = call.header("x-tag", tag);
        }
        call.body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            .unwrap()
    };
    let res = send_h2(addr, grpc_call("/down", Some("api"))).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    assert_eq!(res.headers()["grpc-status"], "14");
    assert_eq!(res.headers()["grpc-message"], "the service is down");
    assert_eq!(res.headers()["x-mapped"], "127.0.0.1");
    assert!(
        res.body().is_end_stream(),
        "trailers-only: the head ends the stream"
    );
    // The mapped status picks the gRPC status: 401 is UNAUTHENTICATED.
    let res = send_h2(addr, grpc_call("/down", Some("login"))).await;
    assert_eq!(res.headers()["grpc-status"], "16");
    assert_eq!(res.headers()["grpc-message"], "upstream connect failure");
    let res = send_h2(addr, grpc_call("/nowhere", None)).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "12");
    assert_eq!(res.headers()["grpc-message"], "no route");
    assert_eq!(res.headers()["x-local"], "yes", "mapped by its 404");
    // An upstream's gRPC answer is its own.
    let res = send_h2(addr, grpc_call("/up", Some("api"))).await;
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("grpc-status").is_none());
}

/// Writes raw bytes to the proxy and returns everything it answers before closing.
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_and_never_reach_the_upstream() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(&forward_config(&[noop.local_addr()], ""), 1);
    let addr = proxy.addr();
    // (A request with both content-length and chunked is not here: the codec drops the
    // content-length, reads it chunked and closes afterwards, as RFC 9112 section 6.3 allows.)
    let malformed: [&[u8]; 8] = [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\ncontent-length: abc\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\n\r\n",
    ];
    for request in malformed {
        let answer = tokio::task::spawn_blocking(move || raw_exchange(addr, request))
            .await
            .unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{:?} got {answer:?}",
            String::from_utf8_lossy(request)
        );
    }
    assert_eq!(
        noop.requests(),
        0,
        "a malformed request reached the upstream"
    );
    // The proxy is still fine.
    let response = send_h1(addr, get("/", &[])).await;
    assert_eq!(response.status(), 200);
}

/// A request body fed by the test: frames arrive when sent, and it never ends on its own.
struct StalledBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for StalledBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
}

/// An upstream that answers `/early` with 413 before reading the body, and `/ok` with 200.
async fn early_answering_upstream() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let reply: &[u8] = if head.starts_with("POST /early") {
                            b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                        };
                        if socket.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_still_uploading_is_not_reused() {
    let upstream = early_answering_upstream().await;
    let proxy = Proxy::start(&forward_config(&[upstream], ""), 1);

    // The upstream answers 413 while the upload is still open, and the upload never ends.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(bytes::Bytes::from_static(b"first part"))
        .await
        .unwrap();
    let request = http::Request::post("/early")
        .header("host", "legate.test")
        .header("content-length", "1000000")
        .body(StalledBody(rx))
        .unwrap();
    let response = send_h1(proxy.addr(), request).await;
    assert_eq!(response.status(), 413);

    // The next request must not queue behind that upload.
    let started = Instant::now();
    let response = send_h1(proxy.addr(), get("/ok", &[])).await;
    assert_eq!(response.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?} (queued behind the upload, it would wait the 15 s route timeout)",
        started.elapsed()
    );
    drop(tx);
}
