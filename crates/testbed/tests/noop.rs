//! The no-op upstream over real sockets, with hyper clients.

#[cfg(test)] // lets the helpers unwrap, like the tests themselves
mod support;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Frame;
use testbed::{NoopUpstream, pattern_bytes, pattern_sha256};
use tokio::sync::mpsc;

use support::*;

const MIB: usize = 1024 * 1024;

#[tokio::test]
async fn default_body_is_100_bytes_with_bookkeeping_headers() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let res = send(up.local_addr(), get("/").body(empty()).unwrap()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-length"), Some("100"));
    assert_eq!(
        header(&res, "x-noop-served-by"),
        Some(up.local_addr().to_string().as_str())
    );
    assert_eq!(header(&res, "x-noop-request-bytes"), Some("0"));
    assert_eq!(
        header(&res, "x-noop-request-sha256"),
        Some(pattern_sha256(0).as_str())
    );
    let body = text(res.into_body()).await;
    assert_eq!(body.len(), 100);
    assert!(body.ends_with('\n'));
    assert_eq!(up.connections(), 1);
    assert_eq!(up.requests(), 1);
    up.shutdown();
}

#[tokio::test]
async fn sized_body_is_the_pattern() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let req = get("/big").header("x-noop-size", MIB.to_string());
    let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
    assert_eq!(header(&res, "content-length"), Some("1048576"));
    assert_eq!(
        digest(res.into_body()).await,
        (MIB as u64, pattern_sha256(MIB as u64))
    );
    up.shutdown();
}

#[tokio::test]
async fn chunked_mode_has_no_content_length() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let req = get("/")
        .header("x-noop-size", "200000")
        .header("x-noop-chunked", "1");
    let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
    assert_eq!(header(&res, "content-length"), None);
    assert_eq!(header(&res, "transfer-encoding"), Some("chunked"));
    assert_eq!(
        digest(res.into_body()).await,
        (200_000, pattern_sha256(200_000))
    );

    // The default body can be chunked too.
    let req = get("/").header("x-noop-chunked", "true");
    let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
    assert_eq!(header(&res, "content-length"), None);
    assert_eq!(text(res.into_body()).await.len(), 100);
    up.shutdown();
}

#[tokio::test]
async fn request_body_is_measured_and_hashed() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let req = Request::post("/upload").body(full(pattern_bytes(0, MIB)));
    let res = send(up.local_addr(), req.unwrap()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-noop-request-bytes"), Some("1048576"));
    assert_eq!(
        header(&res, "x-noop-request-sha256"),
        Some(pattern_sha256(MIB as u64).as_str())
    );
    up.shutdown();
}

#[tokio::test]
async fn echo_headers_lists_the_request() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let req = get("/path?q=1")
        .header("host", "example.test")
        .header("x-noop-echo", "headers")
        .header("x-forwarded-for", "192.0.2.1")
        .header("x-test", "a")
        .header("x-test", "b");
    let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        header(&res, "content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let body = text(res.into_body()).await;
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(
        lines,
        [
            "GET /path?q=1 HTTP/1.1",
            "host: example.test",
            "x-noop-echo: headers",
            "x-forwarded-for: 192.0.2.1",
            "x-test: a",
            "x-test: b",
        ]
    );
    up.shutdown();
}

#[tokio::test]
async fn echo_body_round_trips_with_content_length() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let sent = pattern_bytes(3, 300_000);
    let req = Request::put("/echo")
        .header("x-noop-echo", "body")
        .header("x-noop-status", "201")
        .body(full(sent.clone()));
    let res = send(up.local_addr(), req.unwrap()).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(header(&res, "content-length"), Some("300000"));
    assert_eq!(header(&res, "x-noop-request-bytes"), None);
    assert_eq!(header(&res, "x-noop-request-sha256"), None);
    let got = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got, sent);
    up.shutdown();
}

/// The echo must stream: the first chunk comes back before the request body is finished.
#[tokio::test]
async fn echo_body_streams_frame_by_frame() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let req = Request::post("/echo")
        .header("x-noop-echo", "body")
        .body(ChannelBody(rx).boxed())
        .unwrap();
    let mut client = h1(up.local_addr()).await;
    tx.send(Bytes::from_static(b"first ")).await.unwrap();
    let res = tokio::time::timeout(LIMIT, client.send_request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(header(&res, "content-length"), None);
    let mut body = res.into_body();
    let first = tokio::time::timeout(LIMIT, body.frame())
        .await
        .expect("first chunk echoed before the request ended")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first ");
    tx.send(Bytes::from_static(b"second")).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "second");
    up.shutdown();
}

/// A request body fed chunk by chunk from the test; ends when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

#[tokio::test]
async fn delay_waits_before_the_head() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    for (value, at_least) in [
        ("60ms", Duration::from_millis(60)),
        ("30", Duration::from_millis(30)),
        ("5000us", Duration::from_micros(5000)),
    ] {
        let start = Instant::now();
        let req = get("/").header("x-noop-delay", value);
        let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(
            start.elapsed() >= at_least,
            "{value}: {:?}",
            start.elapsed()
        );
    }
    up.shutdown();
}

#[tokio::test]
async fn bad_headers_get_a_400_naming_them() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    for (name, value) in [
        ("x-noop-delay", &b"soon"[..]),
        ("x-noop-delay", b"1\xffms"),
        ("x-noop-status", b"42"),
        ("x-noop-status", b"1000"),
        ("x-noop-size", b"lots"),
        ("x-noop-chunked", b"maybe"),
        ("x-noop-echo", b"trailers"),
    ] {
        let req = Request::post("/")
            .header(name, http::HeaderValue::from_bytes(value).unwrap())
            .body(full("payload"))
            .unwrap();
        let res = send(up.local_addr(), req).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{name}");
        assert!(
            header(&res, "content-type")
                .unwrap()
                .starts_with("text/plain")
        );
        // The body was still read and reported.
        assert_eq!(header(&res, "x-noop-request-bytes"), Some("7"));
        let body = text(res.into_body()).await;
        assert!(body.contains(name), "{body}");
    }
    up.shutdown();
}

#[tokio::test]
async fn status_and_head() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let res = send(
        up.local_addr(),
        get("/")
            .header("x-noop-status", "503")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(text(res.into_body()).await.len(), 100);

    let res = send(
        up.local_addr(),
        get("/")
            .header("x-noop-status", "204")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(text(res.into_body()).await, "");

    let req = Request::builder()
        .method(Method::HEAD)
        .uri("/")
        .header("x-noop-size", "5000");
    let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
    assert_eq!(header(&res, "content-length"), Some("5000"));
    assert_eq!(text(res.into_body()).await, "");
    up.shutdown();
}

#[tokio::test]
async fn keep_alive_reuses_the_connection() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let mut client = h1(up.local_addr()).await;
    for _ in 0..3 {
        let res = client
            .send_request(get("/").body(empty()).unwrap())
            .await
            .unwrap();
        text(res.into_body()).await;
    }
    assert_eq!(up.connections(), 1);
    assert_eq!(up.requests(), 3);
    up.shutdown();
}

#[tokio::test]
async fn h2c_on_the_same_port() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let mut client = h2(up.local_addr()).await;

    let req = Request::post(format!("http://{}/up?x=1", up.local_addr()))
        .header("x-noop-size", "100000")
        .body(full(pattern_bytes(0, 70_000)))
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    assert_eq!(res.version(), Version::HTTP_2);
    assert_eq!(header(&res, "content-length"), Some("100000"));
    assert_eq!(header(&res, "x-noop-request-bytes"), Some("70000"));
    assert_eq!(
        header(&res, "x-noop-request-sha256"),
        Some(pattern_sha256(70_000).as_str())
    );
    assert_eq!(
        digest(res.into_body()).await,
        (100_000, pattern_sha256(100_000))
    );

    let req = Request::get(format!("http://{}/h?y", up.local_addr()))
        .header("x-noop-echo", "headers")
        .header("x-test", "h2")
        .body(empty())
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    let body = text(res.into_body()).await;
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[0], "GET /h?y HTTP/2.0");
    assert_eq!(lines[1], format!(":authority: {}", up.local_addr()));
    assert!(lines.contains(&"x-test: h2"), "{body}");

    let sent = pattern_bytes(0, 200_000);
    let req = Request::post(format!("http://{}/e", up.local_addr()))
        .header("x-noop-echo", "body")
        .body(full(sent.clone()))
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), sent);

    // Chunked mode over h2 just means no content-length.
    let req = Request::get(format!("http://{}/", up.local_addr()))
        .header("x-noop-chunked", "1")
        .header("x-noop-status", "204")
        .body(empty())
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&res, "content-length"), None);

    assert_eq!(up.connections(), 1);
    assert_eq!(up.requests(), 4);
    up.shutdown();
}

#[tokio::test]
async fn shutdown_closes_the_listener() {
    let up = NoopUpstream::bind(localhost()).await.unwrap();
    let addr = up.local_addr();
    send(addr, get("/").body(empty()).unwrap()).await;
    up.shutdown();
    up.shutdown(); // idempotent
    let deadline = Instant::now() + LIMIT;
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "listener still open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `start_in_thread` must work from inside a runtime (the proxy's async tests) ...
#[tokio::test]
async fn start_in_thread_from_async_code() {
    let up = NoopUpstream::start_in_thread(localhost()).unwrap();
    let req = get("/").header("x-noop-size", "1000");
    let res = send(up.local_addr(), req.body(empty()).unwrap()).await;
    assert_eq!(digest(res.into_body()).await, (1000, pattern_sha256(1000)));
    assert_eq!(up.requests(), 1);
    up.shutdown();
}

/// ... and from plain threads (the `demo` command, benchmarks).
#[test]
fn start_in_thread_without_a_runtime() {
    let up = NoopUpstream::start_in_thread(localhost()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let res = send(up.local_addr(), get("/").body(empty()).unwrap()).await;
        assert_eq!(res.status(), StatusCode::OK);
    });
    up.shutdown();
    // Binding a taken port reports the error instead of panicking in the thread.
    let taken = std::net::TcpListener::bind(localhost()).unwrap();
    assert!(NoopUpstream::start_in_thread(taken.local_addr().unwrap()).is_err());
}
