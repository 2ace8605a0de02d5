//! The `ext_proc` filter on the real binary with a real gRPC processor (tonic, in
//! `testbed::ExtProcessor`): headers and bodies changed both ways, the processor's own answers,
//! a route matched again, header changes that Envoy's rules refuse, and a processor that
//! hangs, fails, answers out of turn or is down (failure closed, or open by route). Streamed
//! bodies go through it chunk by chunk as they come.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use testbed::ExtProcessor;

fn config(processor: SocketAddr, upstream: SocketAddr, extra: &str) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - ext_proc:
          service: {{ address: "{processor}" }}
          message_timeout: 500ms
          processing_mode: {{ request_body: buffered, response_body: buffered }}
{extra}
    routes:
      - match: {{ prefix: /rerouted }}
        direct_response: {{ status: 200, body: "rerouted here" }}
      - match: {{ prefix: /skip }}
        cluster: backend
        filters: {{ ext_proc: disabled }}
      - match: {{ prefix: /open }}
        cluster: backend
        filters: {{ ext_proc: {{ failure_mode_allow: true }} }}
      - match: {{ prefix: /headers-only }}
        cluster: backend
        filters: {{ ext_proc: {{ processing_mode: {{ response_headers: skip }} }} }}
      - match: {{ prefix: /streamed-direct }}
        direct_response: {{ status: 200, body: "direct" }}
        filters: {{ ext_proc: {{ processing_mode: {{ request_body: streamed }} }} }}
      - match: {{ prefix: /streamed }}
        cluster: backend
        filters: {{ ext_proc: {{ processing_mode: {{ request_body: streamed, response_body: streamed }} }} }}
      - match: {{ prefix: /open-streamed }}
        cluster: backend
        filters: {{ ext_proc: {{ processing_mode: {{ request_body: streamed }}, failure_mode_allow: true }} }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

async fn upstream() -> testbed::NoopHandle {
    testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn processor() -> ExtProcessor {
    ExtProcessor::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn post(path: &str, headers: &[(&str, &str)], body: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::post(path).header("host", "edge.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// Status, the named response headers (empty when absent), and the body.
async fn call(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
    names: &[&str],
) -> (u16, Vec<String>, String) {
    let response = send_h1(addr, req).await;
    let status = response.status().as_u16();
    let values = (names.iter())
        .map(|n| {
            (response.headers().get(*n)).map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        })
        .collect();
    (status, values, text(response.into_body()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_bodies_are_processed_both_ways() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(processor.local_addr(), upstream.local_addr(), ""),
        1,
    );
    let admin = proxy.admin.unwrap();

    // The request body reaches the upstream in capitals (its length set anew), and the
    // upstream's echo of it comes back with the processor's suffix.
    let req = post("/echo", &[("x-noop-echo", "body")], "hello processor");
    let (status, headers, body) = call(proxy.addr(), req, &["x-processed-response"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "HELLO PROCESSOR [processed]");
    assert_eq!(headers[0], "yes");
    assert_eq!(
        processor.lines(),
        [
            "request_headers eos=false",
            "request_body 15 eos=true",
            "response_headers eos=false",
            "response_body 15 eos=true",
        ]
    );

    // What the upstream saw of the request head: the processor's header added, the one it
    // removed gone, and its `host` and `x-envoy-*` changes refused (Envoy's default rules).
    processor.forget();
    let req = get("/look", &[("x-noop-echo", "headers"), ("x-remove-me", "1")]);
    let (status, _, echoed) = call(proxy.addr(), req, &[]).await;
    assert_eq!(status, 200);
    let lower = echoed.to_ascii_lowercase();
    assert!(lower.contains("x-processed-request: yes"), "{echoed}");
    assert!(!lower.contains("x-remove-me"), "{echoed}");
    assert!(!lower.contains("forged"), "{echoed}");
    assert!(echoed.ends_with(" [processed]"), "{echoed}");
    // A request without a body: its headers say so, and no body message follows.
    assert_eq!(processor.lines()[0], "request_headers eos=true");
    assert!(
        !processor
            .lines()
            .iter()
            .any(|l| l.starts_with("request_body"))
    );
    let seen = processor.request_headers().pop().unwrap();
    let value = |name: &str| seen.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(value(":method").as_deref(), Some("GET"));
    assert_eq!(value(":path").as_deref(), Some("/look"));
    assert_eq!(value(":scheme").as_deref(), Some("http"));
    assert_eq!(value("x-remove-me").as_deref(), Some("1"));
    assert_eq!(stat(admin, "http_ext_proc_rejected_header_mutations"), 4);

    // Over HTTP/2 alike.
    let req = Request::post(format!("http://{}/h2", proxy.addr()))
        .header("x-noop-echo", "body")
        .body(Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let response = send_h2(proxy.addr(), req).await;
    assert_eq!(response.status(), 200);
    assert_eq!(text(response.into_body()).await, "OVER H2 [processed]");

    // A route's processing mode takes the place of the listener's whole, as in Envoy: what
    // it does not say is the default (the request headers, no bodies).
    processor.forget();
    let req = post("/headers-only", &[("x-noop-echo", "body")], "abc");
    let (status, headers, body) = call(proxy.addr(), req, &["x-processed-response"]).await;
    assert_eq!(
        (status, body.as_str(), headers[0].as_str()),
        (200, "abc", "")
    );
    assert_eq!(processor.lines(), ["request_headers eos=false"]);

    // A route with the filter off: the processor hears nothing.
    processor.forget();
    let (status, _, _) = call(proxy.addr(), get("/skip", &[]), &[]).await;
    assert_eq!(status, 200);
    assert!(processor.lines().is_empty());

    assert_eq!(stat(admin, "http_ext_proc_streams_started"), 4);
    assert_eq!(stat(admin, "http_ext_proc_stream_msgs_sent"), 12);
    assert_eq!(stat(admin, "http_ext_proc_stream_msgs_received"), 12);
    assert_eq!(stat(admin, "http_ext_proc_streams_failed"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processor_answers_reroutes_and_replaces() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(processor.local_addr(), upstream.local_addr(), ""),
        1,
    );
    let admin = proxy.admin.unwrap();

    // Its own answer, and the request never reaches the upstream.
    let (status, headers, body) =
        call(proxy.addr(), get("/immediate", &[]), &["x-processor"]).await;
    assert_eq!(
        (status, headers[0].as_str(), body.as_str()),
        (403, "denied", "denied by the processor")
    );
    assert_eq!(stat(admin, "http_ext_proc_immediate_responses"), 1);
    assert_eq!(processor.lines(), ["request_headers eos=true"]);

    // A new `:path` and the route matched again: the direct response of `/rerouted`, whose
    // answer is processed as any other.
    let (status, headers, body) = call(
        proxy.addr(),
        get("/reroute", &[]),
        &["x-processed-response"],
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "rerouted here [processed]"));
    assert_eq!(headers[0], "yes");

    // The body replaced in the answer to the headers: the client's is not sent.
    processor.forget();
    let req = post("/replace", &[("x-noop-echo", "body")], "original");
    let (status, _, body) = call(proxy.addr(), req, &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "replaced by the processor [processed]")
    );
    assert!(
        !processor
            .lines()
            .iter()
            .any(|l| l.starts_with("request_body"))
    );

    // `:status` set by the processor.
    let (status, _, _) = call(proxy.addr(), get("/created", &[]), &[]).await;
    assert_eq!(status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_processor_fails_the_exchange_or_lets_it_on() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(
            processor.local_addr(),
            upstream.local_addr(),
            "          max_body_bytes: 1KiB\n",
        ),
        1,
    );
    let admin = proxy.admin.unwrap();

    // No answer within the message timeout: 504, as Envoy; an error status, an answer out of
    // turn: `status_on_error` (500).
    for (path, want) in [("/hang", 504), ("/error", 500), ("/spurious", 500)] {
        let (status, _, body) = call(proxy.addr(), get(path, &[]), &[]).await;
        assert_eq!(status, want, "{path}: {body}");
    }
    assert_eq!(stat(admin, "http_ext_proc_message_timeouts"), 1);
    assert_eq!(stat(admin, "http_ext_proc_spurious_msgs_received"), 1);
    assert_eq!(stat(admin, "http_ext_proc_streams_failed"), 1);

    // A processor that ends the stream with OK has finished: the exchange goes on as it is.
    let (status, headers, _) =
        call(proxy.addr(), get("/done", &[]), &["x-processed-response"]).await;
    assert_eq!((status, headers[0].as_str()), (200, ""));
    assert_eq!(stat(admin, "http_ext_proc_failure_mode_allowed"), 0);

    // Where the route allows failures, the same hang lets the request on, unprocessed.
    let (status, headers, _) = call(
        proxy.addr(),
        get("/open/hang", &[]),
        &["x-processed-response"],
    )
    .await;
    assert_eq!((status, headers[0].as_str()), (200, ""));
    assert_eq!(stat(admin, "http_ext_proc_failure_mode_allowed"), 1);

    // A buffered body over the limit is refused before the processor sees it.
    processor.forget();
    let big: &'static str = Box::leak("x".repeat(4096).into_boxed_str());
    let (status, _, _) = call(proxy.addr(), post("/big", &[], big), &[]).await;
    assert_eq!(status, 413);
    assert!(
        !processor
            .lines()
            .iter()
            .any(|l| l.starts_with("request_body"))
    );

    // A processor that is not there: closed, or open where the route allows it.
    let closed = closed_port();
    let down = Proxy::start(&config(closed.addr, upstream.local_addr(), ""), 1);
    let (status, _, _) = call(down.addr(), get("/", &[]), &[]).await;
    assert_eq!(status, 500);
    let (status, _, _) = call(down.addr(), get("/open", &[]), &[]).await;
    assert_eq!(status, 200);
    let down_admin = down.admin.unwrap();
    assert_eq!(stat(down_admin, "http_ext_proc_failure_mode_allowed"), 1);
}

/// Two processors in a chain: the second reads the body the first put in place (Envoy
/// Gateway makes one filter per processor). A route cleared by the answer to the headers
/// still has its body sent before the new route is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_processor_reads_the_first_ones_body_and_a_reroute_keeps_the_body() {
    let upstream = upstream().await;
    let processor = processor().await;
    let second = format!(
        r#"      - ext_proc/second:
          service: {{ address: "{}" }}
          processing_mode: {{ request_headers: skip, response_headers: skip, request_body: buffered }}
"#,
        processor.local_addr()
    );
    let yaml = config(processor.local_addr(), upstream.local_addr(), &second);
    let proxy = Proxy::start(&yaml, 1);

    // The first replaces the body in its answer to the headers; the second puts it in capitals.
    let req = post("/replace", &[("x-noop-echo", "body")], "original");
    let (status, _, body) = call(proxy.addr(), req, &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "REPLACED BY THE PROCESSOR [processed]")
    );
    assert!(
        processor
            .lines()
            .contains(&"request_body 25 eos=true".to_owned()),
        "{:?}",
        processor.lines()
    );

    // A new `:path` and the route matched again, after the body went to the processor.
    processor.forget();
    let req = post("/reroute", &[], "with a body");
    let (status, _, body) = call(proxy.addr(), req, &[]).await;
    assert_eq!((status, body.as_str()), (200, "rerouted here [processed]"));
    let lines = processor.lines();
    assert_eq!(
        &lines[..2],
        ["request_headers eos=false", "request_body 11 eos=true"],
        "{lines:?}"
    );
}

/// A request body sent as the test hands it chunks: chunked on HTTP/1.1.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
}

/// The sizes of the body messages of one kind the processor saw, and whether the last said
/// the body ended.
fn body_messages(lines: &[String], kind: &str) -> (Vec<usize>, bool) {
    let mut sizes = Vec::new();
    let mut ended = false;
    for line in lines {
        let Some(rest) = line.strip_prefix(kind) else {
            continue;
        };
        let (size, eos) = rest.trim().split_once(' ').unwrap();
        sizes.push(size.parse().unwrap());
        ended = eos == "eos=true";
    }
    (sizes, ended)
}

/// `streamed`: each chunk goes to the processor as it comes (the first is answered before
/// the client sends the second), and on, changed, as its answer comes; the response's
/// chunks alike. The lengths may change, so the bodies go on without `content-length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_bodies_go_through_the_processor_chunk_by_chunk() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(processor.local_addr(), upstream.local_addr(), ""),
        1,
    );
    let admin = proxy.admin.unwrap();

    let (chunks, rx) = tokio::sync::mpsc::channel(1);
    let req = Request::post("/streamed/echo")
        .header("host", "edge.test")
        .header("x-noop-echo", "body")
        .body(ChannelBody(rx))
        .unwrap();
    let addr = proxy.addr();
    let response = tokio::spawn(async move { send_h1(addr, req).await });
    chunks.send(Bytes::from_static(b"first ")).await.unwrap();
    eventually(
        "the first chunk answered before the second is sent",
        async || {
            processor
                .lines()
                .contains(&"request_body 6 eos=false".to_owned())
        },
    )
    .await;
    chunks
        .send(Bytes::from_static(b"and second"))
        .await
        .unwrap();
    drop(chunks);
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("content-length").is_none());
    assert_eq!(response.headers()["x-processed-response"], "yes");
    let body = text(response.into_body()).await;
    // Each of the response's chunks has the processor's suffix; the upstream echoed the
    // request as the processor changed it.
    assert_eq!(
        body.replace(" [processed]", ""),
        "FIRST AND SECOND",
        "{body}"
    );
    assert!(body.ends_with(" [processed]"), "{body}");
    let lines = processor.lines();
    let (request, request_ended) = body_messages(&lines, "request_body");
    assert_eq!(
        (request.iter().sum::<usize>(), request_ended),
        (16, true),
        "{lines:?}"
    );
    assert!(request.len() >= 2, "{lines:?}");
    let (response, response_ended) = body_messages(&lines, "response_body");
    assert_eq!(
        (response.iter().sum::<usize>(), response_ended),
        (16, true),
        "{lines:?}"
    );
    assert_eq!(
        body.matches(" [processed]").count(),
        response.len(),
        "{lines:?}"
    );
    assert_eq!(stat(admin, "http_ext_proc_streams_started"), 1);
    assert_eq!(
        stat(admin, "http_ext_proc_stream_msgs_sent"),
        stat(admin, "http_ext_proc_stream_msgs_received")
    );
    assert_eq!(stat_settled(admin, "http_ext_proc_streams_closed", 1), 1);

    // Over HTTP/2 alike.
    let req = Request::post(format!("http://{}/streamed/h2", proxy.addr()))
        .header("x-noop-echo", "body")
        .body(Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let response = send_h2(proxy.addr(), req).await;
    assert_eq!(response.status(), 200);
    let body = text(response.into_body()).await;
    assert_eq!(body.replace(" [processed]", ""), "OVER H2", "{body}");
}

/// A processor that answers the client itself in the middle of a streamed body, or does not
/// answer a chunk in time: before the response has begun, the exchange ends with its answer,
/// or 504; where the route lets failures through, the body goes on unprocessed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_stopped_by_the_processor() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(processor.local_addr(), upstream.local_addr(), ""),
        1,
    );
    let admin = proxy.admin.unwrap();
    // The upstream reads the whole body before it answers (its default), so the response has
    // not begun when the processor stops the body.
    let req = post("/streamed/body-immediate", &[], "abc");
    let (status, headers, body) = call(proxy.addr(), req, &["x-processor"]).await;
    assert_eq!(
        (status, headers[0].as_str(), body.as_str()),
        (403, "denied", "denied by the processor")
    );
    assert_eq!(stat(admin, "http_ext_proc_immediate_responses"), 1);

    let req = post("/streamed/body-hang", &[], "abc");
    let (status, _, _) = call(proxy.addr(), req, &[]).await;
    assert_eq!(status, 504);
    assert_eq!(stat(admin, "http_ext_proc_message_timeouts"), 1);

    // Once the response has begun (an upstream that echoes the body as it comes answers at
    // once), a chunk not answered in time resets the exchange, as in Envoy: the response
    // ends in an error, never in a short body taken as whole.
    let req = post("/streamed/body-hang", &[("x-noop-echo", "body")], "abc");
    let response = send_h1(proxy.addr(), req).await;
    assert_eq!(response.status(), 200);
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(stat(admin, "http_ext_proc_message_timeouts"), 2);

    let req = post(
        "/open-streamed/body-hang",
        &[("x-noop-echo", "body")],
        "abc",
    );
    let (status, headers, body) = call(proxy.addr(), req, &["x-processed-response"]).await;
    assert_eq!((status, body.as_str()), (200, "abc"));
    // After the failure nothing more goes to the processor: the response is not processed.
    assert_eq!(headers[0], "");
    assert_eq!(stat(admin, "http_ext_proc_failure_mode_allowed"), 1);
}

/// A route that answers without reading the request body (a direct response) while the body
/// still streams through the processor: the response's headers go to the processor on the
/// same stream beside the body's chunks, and the exchange does not wait for a body nobody
/// reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_processed_while_the_request_body_still_streams() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(processor.local_addr(), upstream.local_addr(), ""),
        1,
    );
    // Over HTTP/2, where the proxy can answer a stream whose body it stops reading.
    let req = Request::post(format!("http://{}/streamed-direct", proxy.addr()))
        .body(PatternBody::new(4 << 20, false))
        .unwrap();
    let response = send_h2(proxy.addr(), req).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-processed-response"], "yes");
    assert_eq!(text(response.into_body()).await, "direct");
    let lines = processor.lines();
    assert!(
        lines.contains(&"response_headers eos=false".to_owned()),
        "{lines:?}"
    );
    // The body was not all read: the processor saw its start, not its end.
    let (sizes, ended) = body_messages(&lines, "request_body");
    assert!(!sizes.is_empty() && !ended, "{lines:?}");
    assert!(sizes.iter().sum::<usize>() < 4 << 20, "{lines:?}");
}

/// Many exchanges at once on the worker's one connection to the processor: every one succeeds,
/// and each stream ends as a gRPC call ends (the processor sees the half close) and counts as
/// closed, none as failed. (That the stream is then read to the processor's status rather than
/// reset shows under load: benches/auth_filters/run.sh, where reset streams used to exhaust the
/// h2 crate's allowance and close the connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_cleanly_so_the_processor_connection_lasts() {
    let upstream = upstream().await;
    let processor = processor().await;
    let proxy = Proxy::start(
        &config(processor.local_addr(), upstream.local_addr(), ""),
        1,
    );
    let admin = proxy.admin.unwrap();
    const CLIENTS: usize = 32;
    const EACH: usize = 80;
    let addr = proxy.addr();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(async move {
                let (mut client, _conn) = h2_client(addr).await;
                for n in 0..EACH {
                    let req = Request::get(format!("http://{addr}/c{c}/n{n}"))
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let response = client.send_request(req).await.unwrap();
                    assert_eq!(response.status(), 200, "client {c}, exchange {n}");
                    text(response.into_body()).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let exchanges = (CLIENTS * EACH) as i64;
    assert_eq!(stat(admin, "http_ext_proc_streams_failed"), 0);
    assert_eq!(stat(admin, "http_ext_proc_streams_started"), exchanges);
    assert_eq!(
        stat_settled(admin, "http_ext_proc_streams_closed", exchanges),
        exchanges
    );
    // The processor saw every stream end with a half close, and none fail.
    eventually("every stream ended by the processor", async || {
        processor.stream_ends().0 == exchanges as u64
    })
    .await;
    assert_eq!(processor.stream_ends().1, 0);
}
