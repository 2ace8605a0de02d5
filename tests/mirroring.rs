//! Request mirroring through the real binary: the mirror cluster gets a copy of each request
//! (method, path, headers, body; host suffixed `-shadow`), drawn by the policy's fraction,
//! while a slow, dead or overwhelmed mirror changes nothing for the client.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use testbed::NoopUpstream;

/// What a mirror received of one request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Copy {
    method: String,
    path: String,
    host: String,
    request_id: String,
    body_sha256: String,
    body_len: usize,
}

/// An upstream that records each request it receives, body read whole, and answers 200.
struct Recorder {
    addr: SocketAddr,
    copies: Arc<Mutex<Vec<Copy>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let copies = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let copies = Arc::clone(&copies);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let copies = Arc::clone(&copies);
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let copies = Arc::clone(&copies);
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = body.collect().await.unwrap().to_bytes();
                                let header = |name: &str| {
                                    parts
                                        .headers
                                        .get(name)
                                        .map(|v| v.to_str().unwrap().to_string())
                                        .unwrap_or_default()
                                };
                                copies.lock().unwrap().push(Copy {
                                    method: parts.method.to_string(),
                                    path: parts.uri.to_string(),
                                    host: header("host"),
                                    request_id: header("x-request-id"),
                                    body_sha256: hex(&Sha256::digest(&body)),
                                    body_len: body.len(),
                                });
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                                    "mirror's answer\n",
                                ))))
                            }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Recorder { addr, copies, task }
    }

    fn copies(&self) -> Vec<Copy> {
        let mut copies = self.copies.lock().unwrap().clone();
        copies.sort();
        copies
    }

    async fn wait_for(&self, n: usize) {
        eventually("reached by the copies", async || {
            self.copies.lock().unwrap().len() >= n
        })
        .await;
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A body of `len` bytes of a pattern, with its SHA-256.
fn body_of(len: usize) -> (Bytes, String) {
    let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let sha = hex(&Sha256::digest(&body));
    (Bytes::from(body), sha)
}

/// The primary's answer: 200, and the SHA-256 of the body it received.
async fn primary_saw(response: Response<Incoming>) -> String {
    assert_eq!(response.status(), 200);
    let sha = response.headers()["x-noop-request-sha256"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = text(response.into_body()).await;
    sha
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_gets_each_request_with_its_body() {
    let primary = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mirror = Recorder::start().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /quarter }}
        cluster: primary
        request_mirror_policies: [{{ cluster: shadow, fraction: 25% }}]
      - match: {{ prefix: /plain-host }}
        cluster: primary
        request_mirror_policies: [{{ cluster: shadow, disable_shadow_host_suffix_append: true }}]
      - match: {{ prefix: / }}
        cluster: primary
        prefix_rewrite: /v2/
        request_mirror_policies: [{{ cluster: shadow }}]
clusters:
  - name: primary
    endpoints: [{}]
  - name: shadow
    endpoints: [{}]
"#,
        primary.local_addr(),
        mirror.addr
    );
    let proxy = Proxy::start(&config, 2);
    let addr = proxy.addr();

    // GETs and POSTs over HTTP/1.1 and HTTP/2, bodies within the mirror's buffer limit (a
    // bigger one may be given up, by design).
    let mut expected = Vec::new();
    let (mut h2, _conn) = h2_client(addr).await;
    for (i, len) in [0usize, 1, 1000, 16_384, 30_000].into_iter().enumerate() {
        let (body, sha) = body_of(len);
        let method = if len == 0 { "GET" } else { "POST" };
        let id = format!("request-{i}");
        let h1_request = Request::builder()
            .method(method)
            .uri(format!("/h1/{i}?q=1"))
            .header("host", "legate.test:8080")
            .header("x-request-id", &id)
            .body(Full::new(body.clone()))
            .unwrap();
        assert_eq!(primary_saw(send_h1(addr, h1_request).await).await, sha);
        let h2_id = format!("{id}-h2");
        let h2_request = Request::builder()
            .method(method)
            .uri(format!("http://legate.test/h2/{i}"))
            .header("x-request-id", &h2_id)
            .body(Full::new(body))
            .unwrap();
        h2.ready().await.unwrap();
        let response = h2.send_request(h2_request).await.unwrap();
        assert_eq!(primary_saw(response).await, sha);
        for (path, host, id) in [
            (format!("/v2/h1/{i}?q=1"), "legate.test-shadow:8080", id),
            (format!("/v2/h2/{i}"), "legate.test-shadow", h2_id),
        ] {
            expected.push(Copy {
                method: method.to_string(),
                path,
                host: host.to_string(),
                request_id: id,
                body_sha256: sha.clone(),
                body_len: len,
            });
        }
    }
    let response = send_h1(addr, get("/plain-host", &[])).await;
    let _ = primary_saw(response).await;
    mirror.wait_for(expected.len() + 1).await;
    let mut copies = mirror.copies();
    let plain = copies.iter().position(|c| c.path == "/plain-host").unwrap();
    assert_eq!(copies.remove(plain).host, "legate.test");
    expected.sort();
    assert_eq!(copies, expected);
    let admin = proxy.admin.unwrap();
    let sent = expected.len() as i64 + 1;
    assert_eq!(stat_settled(admin, "upstream_rq_shadow", sent), sent);
    // Every copy done, answer read: none failed.
    assert_eq!(stat_settled(admin, "upstream_rq_active", 0), 0);
    assert_eq!(stat(admin, "upstream_rq_shadow_failed"), 0);

    // A quarter of the requests, drawn per request: 2,000 requests, 500 expected, the
    // standard deviation 19.4; 400 to 600 is more than five of them either way.
    let before = mirror.copies.lock().unwrap().len();
    for _ in 0..2_000 {
        h2.ready().await.unwrap();
        let response = h2.send_request(get_h2("/quarter", &[])).await.unwrap();
        assert_eq!(response.status(), 200);
        let _ = text(response.into_body()).await;
    }
    // Counted as each copy starts, before its original is sent: final once the answers are in.
    let drawn = stat(admin, "upstream_rq_shadow") - sent;
    assert!((400..=600).contains(&drawn), "{drawn} of 2,000 mirrored");
    mirror.wait_for(before + drawn as usize).await;
}

/// A mirror that accepts connections and never reads from them: its copies wait forever,
/// and a copy's body backs up behind it.
async fn deaf_mirror() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // A small receive buffer, inherited by the accepted connections: the copy's body backs up
    // into the proxy after a few kilobytes instead of a few megabytes.
    socket.set_recv_buffer_size(4096).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(64).unwrap();
    socket.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(socket.into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_dead_mirror_changes_nothing_for_the_client() {
    let primary = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (deaf, deaf_task) = deaf_mirror().await;
    let closed = closed_port();
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /slow }}
        cluster: primary
        timeout: 300s                  # the copies wait on the deaf mirror for the whole test
        request_mirror_policies: [{{ cluster: deaf }}]
      - match: {{ prefix: /dead }}
        cluster: primary
        request_mirror_policies: [{{ cluster: dead }}]
clusters:
  - name: primary
    endpoints: [{}]
  - name: deaf
    endpoints: [{deaf}]
    per_connection_buffer_limit_bytes: 16KiB
  - name: dead
    endpoints: [{}]
"#,
        primary.local_addr(),
        closed.addr
    );
    let proxy = Proxy::start(&config, 2);
    let admin = proxy.admin.unwrap();

    // The mirror never answers: every client still gets its answer (the test would hang
    // here if a client waited on its copy).
    for i in 0..10 {
        let response = send_h1(proxy.addr(), get(&format!("/slow/{i}"), &[])).await;
        let _ = primary_saw(response).await;
    }
    // A 4 MiB upload: the primary gets all of it; its copy falls more than the deaf cluster's
    // 16 KiB behind and is given up.
    let (body, sha) = body_of(4 << 20);
    let upload = Request::post("/slow/upload")
        .header("host", "legate.test")
        .body(Full::new(body))
        .unwrap();
    assert_eq!(primary_saw(send_h1(proxy.addr(), upload).await).await, sha);
    // Within the 300 s timeout: given up by the feed, not timed out.
    assert_eq!(stat_settled(admin, "upstream_rq_shadow_failed", 1), 1);
    // The other ten copies are still waiting for their answer (the primary has none open).
    assert_eq!(stat(admin, "upstream_rq_shadow"), 11);
    assert_eq!(stat_settled(admin, "upstream_rq_active", 10), 10);

    // The mirror cannot be reached: every client gets its answer; every copy fails.
    let (mut h2, _conn) = h2_client(proxy.addr()).await;
    for i in 0..10 {
        h2.ready().await.unwrap();
        let response = h2
            .send_request(get_h2(&format!("/dead/{i}"), &[]))
            .await
            .unwrap();
        let _ = primary_saw(response).await;
    }
    assert_eq!(stat_settled(admin, "upstream_rq_shadow_failed", 11), 11);
    assert_eq!(stat(admin, "upstream_rq_shadow"), 21);
    deaf_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_named_by_a_request_header_gets_copies_only_of_requests_naming_one() {
    let primary = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mirror = Recorder::start().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: primary
        request_mirror_policies: [{{ cluster_header: x-mirror }}]
clusters:
  - name: primary
    endpoints: [{}]
  - name: shadow
    endpoints: [{}]
"#,
        primary.local_addr(),
        mirror.addr
    );
    let proxy = Proxy::start(&config, 2);
    for (path, named) in [
        ("/first", Some("shadow")),
        ("/nowhere", Some("no-such-cluster")),
        ("/unnamed", None),
        ("/last", Some("shadow")),
    ] {
        let headers: Vec<(&str, &str)> = named.iter().map(|n| ("x-mirror", *n)).collect();
        let response = send_h1(proxy.addr(), get(path, &headers)).await;
        // The original goes to its own cluster whatever the copy does.
        let _ = primary_saw(response).await;
    }
    mirror.wait_for(2).await;
    let admin = proxy.admin.unwrap();
    // Counted as each copy is started: two, the others never were.
    assert_eq!(stat_settled(admin, "upstream_rq_shadow", 2), 2);
    let paths: Vec<String> = mirror.copies().into_iter().map(|c| c.path).collect();
    assert_eq!(paths, ["/first", "/last"]);
}
