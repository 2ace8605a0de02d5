//! HTTP/3 through the real binary: a TLS listener with `http3` serves QUIC on the UDP port of
//! its number, with the same routes, clusters and access log as over TCP, and advertises it
//! with `alt-svc` on its TCP responses. The client is aioquic's (tests/h3client/client.py,
//! installed by tests/run.sh); the machine's curl (7.88, Debian 12) has no HTTP/3.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certs::Ca;
use common::*;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use testbed::{NoopUpstream, pattern_sha256};

/// What the client reports of one exchange.
#[derive(Debug)]
struct Exchange {
    status: Option<u16>,
    headers: Vec<(String, String)>,
    body_bytes: u64,
    body_sha256: String,
    sent_sha256: String,
    #[allow(dead_code)]
    trailers: Vec<(String, String)>,
    error: Option<String>,
    goaway: bool,
    /// The streams the proxy let the client open at first.
    max_streams: u64,
    /// The DNS names of the certificate the proxy served.
    server_cert_names: Vec<String>,
    /// The body, where the request asked for it (`report_body`).
    body_text: Option<String>,
    /// With `--ticket`: whether the proxy took the 0-RTT data, and what its ticket allows.
    early_data_accepted: Option<bool>,
    ticket_max_early_data: Option<u64>,
}

impl Exchange {
    fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter().find(|(n, _)| n == name)).map(|(_, v)| v.as_str())
    }
}

fn pairs(value: &Value) -> Vec<(String, String)> {
    (value.as_array().unwrap().iter())
        .map(|p| {
            let p = p.as_array().unwrap();
            (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Sends `requests` at once on one HTTP/3 connection to `addr` with aioquic's client.
fn h3_exchanges(addr: SocketAddr, requests: Value) -> Vec<Exchange> {
    h3_exchanges_within(addr, requests, 60)
}

/// As [`h3_exchanges`]; exchanges not over within `seconds` are reported as timed out.
fn h3_exchanges_within(addr: SocketAddr, requests: Value, seconds: u32) -> Vec<Exchange> {
    h3_run(addr, requests, seconds, 0)
}

/// As [`h3_exchanges_within`], then waiting up to `linger` seconds for the server to close the
/// connection before telling whether it sent GOAWAY.
fn h3_run(addr: SocketAddr, requests: Value, seconds: u32, linger: u32) -> Vec<Exchange> {
    match h3_try(addr, "legate.test", requests, seconds, linger) {
        Ok(exchanges) => exchanges,
        Err(stderr) => panic!("HTTP/3 client failed: {stderr}"),
    }
}

/// One connection asking for `server_name`, as [`h3_run`]; `Err` with the client's error
/// output when it could not connect or failed otherwise.
fn h3_try(
    addr: SocketAddr,
    server_name: &str,
    requests: Value,
    seconds: u32,
    linger: u32,
) -> Result<Vec<Exchange>, String> {
    let more = ["--linger".to_owned(), linger.to_string()];
    h3_reports(h3_spawn(addr, server_name, requests, seconds, &more))
}

/// The client started on `requests`, with `more` arguments; its reports come from
/// [`h3_reports`].
fn h3_spawn(
    addr: SocketAddr,
    server_name: &str,
    requests: Value,
    seconds: u32,
    more: &[String],
) -> std::process::Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3client/client.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(addr.to_string())
        .args(["--server-name", server_name])
        .args(["--timeout", &seconds.to_string()])
        .args(more)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let input = serde_json::to_vec(&requests).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    child
}

/// What the client reports once it is done; `Err` with its error output when it could not
/// connect or failed otherwise.
fn h3_reports(child: std::process::Child) -> Result<Vec<Exchange>, String> {
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("No module named 'aioquic'"),
        "aioquic is missing: tests/run.sh installs it (python3 -m pip install aioquic)"
    );
    if !output.status.success() {
        return Err(stderr.into_owned());
    }
    let reports: Value = serde_json::from_slice(&output.stdout).unwrap();
    Ok((reports.as_array().unwrap().iter())
        .map(|r| Exchange {
            status: r["status"].as_u64().map(|s| s as u16),
            headers: pairs(&r["headers"]),
            body_bytes: r["body_bytes"].as_u64().unwrap(),
            body_sha256: r["body_sha256"].as_str().unwrap().to_owned(),
            sent_sha256: r["sent_sha256"].as_str().unwrap().to_owned(),
            trailers: pairs(&r["trailers"]),
            error: r["error"].as_str().map(str::to_owned),
            goaway: r["goaway"].as_bool().unwrap(),
            max_streams: r["max_streams"].as_u64().unwrap(),
            server_cert_names: (r["server_cert_names"].as_array().unwrap().iter())
                .map(|n| n.as_str().unwrap().to_owned())
                .collect(),
            body_text: r["body_text"].as_str().map(str::to_owned),
            early_data_accepted: r["early_data_accepted"].as_bool(),
            ticket_max_early_data: r["ticket_max_early_data"].as_u64(),
        })
        .collect())
}

/// A TLS listener serving HTTP/3 beside TCP, in front of `upstream`, with an access log; and
/// the roots its certificate chains to.
fn config(dir: &ScratchDir, upstream: SocketAddr, http3: &str) -> (String, rustls::RootCertStore) {
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["legate.test"]).write(dir, "legate");
    let log = dir.0.join("access.log");
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: edge
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert_chain: "{cert}", private_key: "{key}" }}]
    http3: {http3}
    access_log:
      path: "{log}"
      format: "%PROTOCOL% %METHOD% %PATH% %RESPONSE_CODE% in=%BYTES_RECEIVED% out=%BYTES_SENT%\n"
    routes:
      - match: {{ path: /direct }}
        direct_response: {{ status: 201, body: "made here\n" }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#,
        log = log.display()
    );
    (yaml, ca.roots())
}

/// A proxy serving HTTP/3 (the listener's `http3` setting as given) in front of a no-op
/// upstream, with what a test may need of it.
struct Edge {
    _upstream: testbed::NoopHandle,
    /// Holds the certificates and the access log (`access.log`).
    dir: ScratchDir,
    yaml: String,
    roots: rustls::RootCertStore,
    proxy: Proxy,
}

impl Edge {
    async fn start(http3: &str, workers: usize) -> Edge {
        let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let dir = ScratchDir::new();
        let (yaml, roots) = config(&dir, upstream.local_addr(), http3);
        let proxy = Proxy::start(&yaml, workers);
        Edge {
            _upstream: upstream,
            dir,
            yaml,
            roots,
            proxy,
        }
    }
}

/// One HTTPS request over TCP: the response's `alt-svc`, if any (the route answers 201).
async fn alt_svc_over_tcp(addr: SocketAddr, roots: rustls::RootCertStore) -> Option<String> {
    let response = get_over_tcp(addr, roots).await;
    assert_eq!(response.status(), 201);
    (response.headers().get("alt-svc")).map(|v| v.to_str().unwrap().to_owned())
}

/// One HTTPS request over TCP: its status.
async fn status_over_tcp(addr: SocketAddr, roots: rustls::RootCertStore) -> u16 {
    get_over_tcp(addr, roots).await.status().as_u16()
}

/// `GET /direct` over HTTPS (HTTP/1.1 on TCP).
async fn get_over_tcp(
    addr: SocketAddr,
    roots: rustls::RootCertStore,
) -> http::Response<hyper::body::Incoming> {
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("legate.test").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get("/direct")
        .header("host", "legate.test")
        // Let in where an authorization sidecar asks (filters_act_on_http3_as_on_tcp).
        .header("x-user", "alice")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    sender.send_request(request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_http3_take_the_same_path_as_over_tcp() {
    let Edge {
        dir, roots, proxy, ..
    } = Edge::start("{}", 2).await;
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();

    // TCP responses say where HTTP/3 is: the same port number, for a day by default.
    let alt_svc = alt_svc_over_tcp(addr, roots).await;
    assert_eq!(
        alt_svc.as_deref(),
        Some(format!("h3=\":{}\"; ma=86400", addr.port()).as_str())
    );

    let upload = 3 << 20;
    let requests = json!([
        {"method": "GET", "path": "/small", "headers": [["x-noop-size", "1000"]]},
        {"method": "GET", "path": "/large", "headers": [["x-noop-size", (5u64 << 20).to_string()]]},
        {"method": "POST", "path": "/upload", "body_bytes": upload},
        // Without content-length: aioquic's client takes one on a HEAD response for a body
        // it must receive (RFC 9114 section 4.1.2 allows it), and closes the connection.
        {"method": "HEAD", "path": "/head", "headers": [["x-noop-size", "1000"], ["x-noop-chunked", "1"]]},
        {"method": "GET", "path": "/direct"},
        {"method": "POST", "path": "/trailers", "body_bytes": 1000,
         "headers": [["x-noop-echo", "body"]], "trailers": [["x-checksum", "abc"]]},
    ]);
    let exchanges = tokio::task::spawn_blocking(move || h3_exchanges(addr, requests))
        .await
        .unwrap();
    for exchange in &exchanges {
        assert_eq!(exchange.error, None, "{exchange:?}");
    }
    let [small, large, upload_ex, head, direct, echoed] = &exchanges[..] else {
        panic!("six exchanges: {exchanges:?}");
    };

    assert_eq!(small.status, Some(200));
    assert_eq!(small.body_bytes, 1000);
    assert_eq!(small.body_sha256, pattern_sha256(1000));
    assert_eq!(
        small.header("alt-svc"),
        None,
        "not advertised over HTTP/3 itself"
    );

    assert_eq!(large.status, Some(200));
    assert_eq!(large.body_bytes, 5 << 20);
    assert_eq!(large.body_sha256, pattern_sha256(5 << 20));

    // The upstream got the body whole, in order.
    assert_eq!(upload_ex.status, Some(200));
    assert_eq!(upload_ex.header("x-noop-request-bytes"), Some("3145728"));
    assert_eq!(
        upload_ex.header("x-noop-request-sha256"),
        Some(upload_ex.sent_sha256.as_str())
    );

    assert_eq!(head.status, Some(200));
    assert_eq!(head.body_bytes, 0, "no body for HEAD");

    assert_eq!(direct.status, Some(201));
    assert_eq!(direct.body_bytes, 10);

    // A body ended by trailers is whole: the upstream echoed it back.
    assert_eq!(echoed.status, Some(200));
    assert_eq!(echoed.body_bytes, 1000);
    assert_eq!(echoed.body_sha256, echoed.sent_sha256);

    assert_eq!(stat_settled(admin, "downstream_cx_http3_total", 1), 1);
    // The client closed it when done.
    assert_eq!(stat_settled(admin, "downstream_cx_http3_close", 1), 1);
    assert_eq!(stat(admin, "downstream_cx_http3_active"), 0);
    let (_, reasons) = admin_request(admin, "GET", "/stats?filter=downstream_cx_http3_close");
    let closed_by_client =
        "downstream_cx_http3_close{listener=\"edge\",reason=\"peer_application_close\"}: 1";
    assert!(reasons.lines().any(|l| l == closed_by_client), "{reasons}");
    let log_path = dir.0.join("access.log");
    eventually("every HTTP/3 request logged as such", async || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.lines().filter(|l| l.starts_with("HTTP/3 ")).count() == 6
    })
    .await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains(&format!("HTTP/3 POST /upload 200 in={upload} ")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_on_one_connection_are_all_answered() {
    let Edge { proxy, .. } = Edge::start("{}", 1).await;
    let addr = proxy.addr();
    let requests: Vec<Value> = (0..200)
        .map(|i| {
            json!({"method": if i % 4 == 0 { "POST" } else { "GET" },
                   "path": format!("/{i}"),
                   "headers": [["x-noop-size", (i * 100).to_string()]],
                   "body_bytes": if i % 4 == 0 { 20_000 } else { 0 }})
        })
        .collect();
    let exchanges = tokio::task::spawn_blocking(move || h3_exchanges(addr, Value::Array(requests)))
        .await
        .unwrap();
    assert_eq!(exchanges.len(), 200);
    for (i, exchange) in exchanges.iter().enumerate() {
        assert_eq!(exchange.error, None, "{i}: {exchange:?}");
        assert_eq!(exchange.status, Some(200), "{i}");
        assert_eq!(exchange.body_bytes, i as u64 * 100, "{i}");
        assert_eq!(exchange.body_sha256, pattern_sha256(i as u64 * 100), "{i}");
        if i % 4 == 0 {
            assert_eq!(exchange.header("x-noop-request-bytes"), Some("20000"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alt_svc_can_be_left_out() {
    let Edge { roots, proxy, .. } = Edge::start("{ alt_svc_max_age: 0s }", 1).await;
    assert_eq!(alt_svc_over_tcp(proxy.addr(), roots).await, None);
    // HTTP/3 itself still serves.
    let exchanges = tokio::task::spawn_blocking({
        let addr = proxy.addr();
        move || h3_exchanges(addr, json!([{"method": "GET", "path": "/direct"}]))
    })
    .await
    .unwrap();
    assert_eq!(exchanges[0].status, Some(201));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_http3_on_its_tls_port() {
    let mut proxy = start_demo();
    let tls = proxy.addrs[1];
    let exchanges = tokio::task::spawn_blocking(move || {
        h3_exchanges(
            tls,
            json!([{"method": "GET", "path": "/hello", "headers": [["x-noop-size", "10"]]}]),
        )
    })
    .await
    .unwrap();
    assert_eq!(exchanges[0].status, Some(200), "{exchanges:?}");
    assert_eq!(exchanges[0].body_bytes, 10);
    proxy.terminate();
    assert!(
        proxy
            .wait(std::time::Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_says_goaway_and_finishes_the_requests_in_flight() {
    let held = HeldUpstream::start().await;
    let dir = ScratchDir::new();
    let (yaml, _) = config(&dir, held.addr, "{}");
    let mut proxy = Proxy::start(&yaml, 2);
    let addr = proxy.addr();
    let client = tokio::task::spawn_blocking(move || {
        h3_run(addr, json!([{"method": "GET", "path": "/held"}]), 60, 20)
    });
    held.wait_for_requests(1).await;
    proxy.terminate();
    assert!(
        proxy.wait_for_log("draining", std::time::Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
    held.release();
    let exchanges = client.await.unwrap();
    assert_eq!(exchanges[0].error, None, "{exchanges:?}");
    assert_eq!(
        exchanges[0].status,
        Some(200),
        "the request in flight is answered"
    );
    assert!(exchanges[0].goaway, "told GOAWAY: {exchanges:?}");
    assert!(
        proxy
            .wait(std::time::Duration::from_secs(20))
            .is_some_and(|s| s.success())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_http3_load_fails_no_request() {
    let Edge {
        dir, yaml, proxy, ..
    } = Edge::start("{}", 2).await;
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();
    // 300 requests over about 3 s on one connection, with reloads among them.
    let requests: Vec<Value> = (0..300)
        .map(|i| {
            json!({"method": "GET", "path": format!("/r{i}"), "delay_ms": i * 10,
                        "headers": [["x-noop-size", "2000"]]})
        })
        .collect();
    let client = tokio::task::spawn_blocking(move || h3_exchanges(addr, Value::Array(requests)));
    let log_path = dir.0.join("access.log");
    for round in 0..3 {
        // A route added each round: a new generation for the listener, its sockets kept.
        let changed = yaml.replace(
            "      - match: { path: /direct }",
            &format!(
                "      - match: {{ path: /added{round} }}\n        direct_response: {{ status: 204 }}\n      - match: {{ path: /direct }}"
            ),
        );
        eventually("requests under way", async || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.lines().count() > 60 * (round + 1)
        })
        .await;
        proxy.rewrite_config(&changed);
        let (status, body) = admin_request(admin, "POST", "/reload");
        assert_eq!(status, 200, "{body}");
    }
    let exchanges = client.await.unwrap();
    assert_eq!(exchanges.len(), 300);
    for (i, exchange) in exchanges.iter().enumerate() {
        assert_eq!(exchange.error, None, "{i}: {exchange:?}");
        assert_eq!(exchange.status, Some(200), "{i}");
        assert_eq!(exchange.body_bytes, 2000, "{i}");
    }
    assert_eq!(
        stat(admin, "downstream_cx_http3_total"),
        1,
        "one connection throughout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_over_the_limit_are_answered_431() {
    let Edge { proxy, .. } = Edge::start("{}", 1).await;
    let addr = proxy.addr();
    // 70 KiB of headers, over the 60 KiB default (aioquic takes no single value that long).
    let big: Vec<Value> = (0..35)
        .map(|i| json!([format!("x-big-{i}"), "a".repeat(2048)]))
        .collect();
    let exchanges = tokio::task::spawn_blocking(move || {
        h3_exchanges(
            addr,
            json!([
                {"method": "GET", "path": "/big", "headers": big},
                {"method": "GET", "path": "/after", "delay_ms": 200},
            ]),
        )
    })
    .await
    .unwrap();
    assert_eq!(exchanges[0].status, Some(431), "{:?}", exchanges[0].status);
    assert_eq!(exchanges[1].status, Some(200), "the connection goes on");
}

/// Packets reach the worker that owns their connection by its connection ID, not by their
/// source address: a client whose address changes (a NAT rebinding) keeps its connection, on
/// any of the workers. (Where the kernel refuses the steering program, migration is off and
/// such a client must connect again: the proxy logs a warning at start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_address_changes_keeps_its_connection() {
    let Edge { proxy, .. } = Edge::start("{}", 4).await;
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();
    // Each rebinding picks a new source port, which the kernel's address hash would send to
    // any of the four workers.
    let requests: Vec<Value> = (0..8)
        .map(|i| {
            json!({"method": "GET", "path": format!("/moved{i}"), "delay_ms": i * 150,
                        "rebind": i > 0, "headers": [["x-noop-size", "500"]]})
        })
        .collect();
    let exchanges =
        tokio::task::spawn_blocking(move || h3_exchanges_within(addr, Value::Array(requests), 20))
            .await
            .unwrap();
    for (i, exchange) in exchanges.iter().enumerate() {
        assert_eq!(exchange.error, None, "{i}: {exchange:?}");
        assert_eq!(exchange.status, Some(200), "{i}");
    }
    assert_eq!(
        stat(admin, "downstream_cx_http3_total"),
        1,
        "one connection throughout"
    );
    assert!(
        !proxy.log().contains("cannot be steered"),
        "{}",
        proxy.log()
    );
}

/// The listener's filters act on HTTP/3 requests as on the others: external authorization,
/// the local rate limit (one bucket for TCP and UDP clients) and compression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_act_on_http3_as_on_tcp() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let sidecar = grpc_sidecar(alice_or_401()).await;
    let dir = ScratchDir::new();
    let (yaml, roots) = config(&dir, upstream.local_addr(), "{}");
    let filters = format!(
        r#"    http_filters:
      - ext_authz: {{ grpc: {{ address: {} }} }}
      - local_rate_limit: {{ token_bucket: {{ max_tokens: 4, fill_interval: 1h }} }}
      - compression: {{ encodings: [gzip] }}
    routes:"#,
        sidecar.local_addr().unwrap()
    );
    let yaml = yaml.replacen("    routes:", &filters, 1);
    let proxy = Proxy::start(&yaml, 1);
    let addr = proxy.addr();
    let alice = json!(["x-user", "alice"]);
    let text = json!(["x-noop-response-header", "content-type: text/plain"]);
    let exchanges = tokio::task::spawn_blocking(move || {
        h3_exchanges(
            addr,
            json!([
                {"method": "GET", "path": "/who"},
                {"method": "GET", "path": "/text", "delay_ms": 100,
                 "headers": [alice, text, ["x-noop-size", "20000"], ["accept-encoding", "gzip"]]},
                {"method": "GET", "path": "/a", "delay_ms": 200, "headers": [alice]},
                {"method": "GET", "path": "/b", "delay_ms": 300, "headers": [alice]},
                {"method": "GET", "path": "/c", "delay_ms": 400, "headers": [alice]},
            ]),
        )
    })
    .await
    .unwrap();
    let [refused, compressed, second, third, fourth] = &exchanges[..] else {
        panic!("{exchanges:?}");
    };
    assert_eq!(
        refused.status,
        Some(401),
        "the sidecar refuses without x-user"
    );
    assert_eq!(compressed.status, Some(200));
    assert_eq!(compressed.header("content-encoding"), Some("gzip"));
    assert!(compressed.body_bytes < 20000, "{compressed:?}");
    // The refused request took no token (authorization comes first); these took the rest.
    assert_eq!(second.status, Some(200));
    assert_eq!(third.status, Some(200));
    assert_eq!(fourth.status, Some(200));
    let over_tcp = status_over_tcp(addr, roots).await;
    assert_eq!(over_tcp, 429, "one bucket for both transports");
}

/// A binary upgrade hands the UDP sockets over with the TCP ones: the new process serves
/// HTTP/3 on the same socket group, in the same order, so connection IDs keep steering
/// packets to the right worker after the old process is gone (new sockets joining the group
/// would have taken other places in it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_upgrade_hands_over_the_http3_sockets() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = ScratchDir::new();
    let sockets = ScratchDir::new();
    let socket = sockets.0.join("legate.sock");
    let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
    let mut old = start_upgradable(&yaml, &socket, false);
    let addr = old.addr();
    // A new connection each time, each sending requests after its handshake.
    let connections = move |count: usize| {
        tokio::task::spawn_blocking(move || {
            (0..count)
                .map(|i| {
                    let requests = json!([
                        {"method": "GET", "path": format!("/c{i}"), "headers": [["x-noop-size", "100"]]},
                        {"method": "GET", "path": format!("/c{i}/again"), "delay_ms": 50},
                    ]);
                    h3_exchanges_within(addr, requests, 10)
                })
                .collect::<Vec<_>>()
        })
    };
    for exchanges in connections(3).await.unwrap() {
        assert!(
            exchanges.iter().all(|e| e.status == Some(200)),
            "{exchanges:?}"
        );
    }
    let upgraded = yaml.replace("    address: 127.0.0.1:0", &format!("    address: {addr}"));
    let new = start_upgradable(&upgraded, &socket, true);
    assert_eq!(new.addr(), addr);
    let exited = tokio::task::spawn_blocking(move || {
        let status = old.wait(std::time::Duration::from_secs(30));
        (status, old.log())
    })
    .await
    .unwrap();
    assert!(exited.0.is_some_and(|s| s.success()), "{}", exited.1);
    for exchanges in connections(12).await.unwrap() {
        assert!(
            exchanges.iter().all(|e| e.status == Some(200)),
            "{exchanges:?}\n{}",
            new.log()
        );
    }
}

/// Malformed HTTP/3 on a request stream, as frames' bytes: each ends its stream or its
/// connection with an error, and the proxy serves the next connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http3_ends_the_stream_or_connection_and_nothing_else() {
    let Edge { proxy, .. } = Edge::start("{}", 2).await;
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();
    let cases = [
        ("DATA before HEADERS", "0003616263"),
        ("HEADERS that QPACK cannot decode", "0104ffffffff"),
        ("a reserved frame type and no HEADERS", "21026869"),
        ("HEADERS declaring 1 GiB, then the end", "01bfffffff00"),
        ("PUSH_PROMISE from a client", "050100"),
        ("the stream's end before anything", ""),
        ("a frame length past the stream's end", "0140"),
    ];
    for (what, hex) in cases {
        let exchanges = tokio::task::spawn_blocking(move || {
            h3_exchanges_within(
                addr,
                json!([
                    {"method": "GET", "path": "/bad", "raw_hex": hex},
                    {"method": "GET", "path": "/direct", "delay_ms": 300},
                ]),
                10,
            )
        })
        .await
        .unwrap();
        assert_eq!(exchanges[0].status, None, "{what}: {:?}", exchanges[0]);
        assert!(exchanges[0].error.is_some(), "{what}: {:?}", exchanges[0]);
        // The same connection goes on after a stream error; after a connection error, the
        // next connection is served.
        let next = if exchanges[1].status == Some(201) {
            Some(201)
        } else {
            let again = tokio::task::spawn_blocking(move || {
                h3_exchanges(addr, json!([{"method": "GET", "path": "/direct"}]))
            })
            .await
            .unwrap();
            again[0].status
        };
        assert_eq!(next, Some(201), "{what}: served after it");
    }
    // Five of them break HTTP/3 for the whole connection, which the proxy closes.
    let broke = "downstream_cx_http3_close{listener=\"edge\",reason=\"http3_error\"}: 5";
    eventually("connection errors counted", async || {
        let (_, text) = admin_request(admin, "GET", "/stats?filter=downstream_cx_http3_close");
        text.lines().any(|l| l == broke)
    })
    .await;
    assert_eq!(stat(admin, "downstream_cx_http3_active"), 0);
}

/// A client opening more streams than `max_concurrent_streams` is held back by QUIC's stream
/// credit, not refused: all of its requests are answered, never more than the limit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_limit_wait_for_credit() {
    let held = HeldUpstream::start().await;
    let dir = ScratchDir::new();
    let (yaml, _) = config(&dir, held.addr, "{}");
    let yaml = yaml.replacen(
        "    http3: {}",
        "    http3: {}\n    http: { max_concurrent_streams: 20 }",
        1,
    );
    let proxy = Proxy::start(&yaml, 1);
    let addr = proxy.addr();
    let requests: Vec<Value> = (0..100)
        .map(|i| json!({"method": "GET", "path": format!("/s{i}")}))
        .collect();
    let client = tokio::task::spawn_blocking(move || h3_exchanges(addr, Value::Array(requests)));
    // The upstream holds every request until the limit's worth have come.
    held.wait_for_requests(20).await;
    held.release();
    let exchanges = client.await.unwrap();
    assert_eq!(exchanges.len(), 100);
    for (i, exchange) in exchanges.iter().enumerate() {
        assert_eq!(exchange.status, Some(200), "{i}: {exchange:?}");
        assert_eq!(exchange.max_streams, 20, "the credit QUIC gave the client");
    }
}

/// Under the overload manager's first action (keep-alive off), a new QUIC client must prove
/// its address with a Retry before the proxy spends a handshake on it; one that does is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pressure_new_clients_prove_their_address_first() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = ScratchDir::new();
    let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
    // A plain listener to hold connections open on, and connection pressure at 8 of 10.
    let plain = "  - name: plain\n    address: 127.0.0.1:0\n    routes:\n      - match: { prefix: / }\n        direct_response: { status: 200 }\nclusters:";
    let yaml = yaml.replacen("clusters:", plain, 1)
        + "overload: { connection_limit: 10, memory_limit: 64GiB, interval: 20ms }\n";
    let proxy = Proxy::start(&yaml, 1);
    let (addr, admin) = (proxy.addr(), proxy.admin.unwrap());
    let client = |path: &'static str| {
        tokio::task::spawn_blocking(move || {
            h3_exchanges(addr, json!([{"method": "GET", "path": path}]))
        })
    };
    assert_eq!(client("/calm").await.unwrap()[0].status, Some(200));
    assert_eq!(
        stat(admin, "downstream_cx_http3_retry"),
        0,
        "no Retry when calm"
    );
    let held: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(proxy.addrs[1]).unwrap())
        .collect();
    eventually("keep-alive is off", async || {
        admin_request(admin, "GET", "/ready")
            .1
            .contains("disable_keepalive")
    })
    .await;
    assert_eq!(client("/pressed").await.unwrap()[0].status, Some(200));
    // One Retry (another if the client sent its first packet again before the Retry came).
    assert!(
        stat(admin, "downstream_cx_http3_retry") >= 1,
        "a Retry, then served"
    );
    drop(held);
}

/// A listener serving QUIC alone (`quic_only`), with a chain per name: each connection gets
/// the certificate and the routes of the chain its SNI picks; a name no chain takes gets no
/// handshake. A TCP listener shares the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_only_listener_serves_the_chain_its_sni_picks() {
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let (a_cert, a_key) = ca.leaf(&["a.test"]).write(&dir, "a");
    let (b_cert, b_key) = ca.leaf(&["*.b.test"]).write(&dir, "b");
    let chain = |name: &str, names: &str, cert: &str, key: &str, status: u16| {
        format!(
            "      - name: {name}\n        match: {{ server_names: [\"{names}\"] }}\n        tls: {{ certificates: [{{ cert_chain: \"{cert}\", private_key: \"{key}\" }}] }}\n        routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: {status} }} }}]\n"
        )
    };
    // The TCP listener first, on any port; then the QUIC one on the port it got.
    let tcp = "  - name: tcp\n    address: 127.0.0.1:0\n    routes: [{ match: { prefix: / }, direct_response: { status: 204 } }]\n";
    let yaml = format!("admin: {{ address: 127.0.0.1:0 }}\nlisteners:\n{tcp}");
    let proxy = Proxy::start(&yaml, 2);
    let port = proxy.addr().port();
    let quic = format!(
        "  - name: quic\n    address: 127.0.0.1:{port}\n    http3: {{ quic_only: true }}\n    chains:\n{}{}",
        chain("a", "a.test", &a_cert, &a_key, 200),
        chain("b", "*.b.test", &b_cert, &b_key, 202),
    );
    let admin = proxy.admin.unwrap();
    proxy.rewrite_config(&format!("{yaml}{quic}"));
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    let addr = proxy.addr();
    let ask = move |name: &'static str| {
        tokio::task::spawn_blocking(move || {
            h3_try(addr, name, json!([{"method": "GET", "path": "/"}]), 30, 0)
        })
    };
    let a = ask("a.test").await.unwrap().unwrap();
    assert_eq!(a[0].status, Some(200), "{a:?}");
    assert_eq!(a[0].server_cert_names, ["a.test"]);
    let b = ask("x.b.test").await.unwrap().unwrap();
    assert_eq!(b[0].status, Some(202), "{b:?}");
    assert_eq!(b[0].server_cert_names, ["*.b.test"]);
    // No chain for the name: no certificate, no connection.
    assert!(ask("c.test").await.unwrap().is_err());
    assert!(stat(admin, "downstream_cx_http3_handshake_error") >= 1);
    // TCP on the same port number is the other listener's.
    let plain = send_h1(addr, get("/", &[])).await;
    assert_eq!(plain.status(), 204);
}

/// Envoy Gateway's HTTP/3 as it sends it: a UDP listener (`quic_options`, a chain per SNI with
/// a QUIC transport socket and an HTTP/3 connection manager) on the port of its TCP listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_planes_quic_listener_serves_http3_beside_its_tcp_listener() {
    use common::xds::{bootstrap, listener_address, route_config};
    use testbed::ManagementServer;
    use testbed::resources::{self, QuicChain};
    use testbed::xds::{any, type_url};

    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["www.example.com"]).write(&dir, "www");
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let tcp = resources::listener("gw", "127.0.0.1:0".parse().unwrap(), "gw-routes");
    server.set(type_url::LISTENER, vec![("gw".into(), any(&tcp))]);
    server.set(
        type_url::ROUTE,
        vec![route_config("gw-routes", &[("/", "")])],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 2);
    let tcp_addr = listener_address(&proxy, "gw").await;
    let quic = resources::quic_listener(
        "gw-quic",
        tcp_addr,
        &[QuicChain {
            server_names: &["www.example.com"],
            cert_file: &cert,
            key_file: &key,
            routes: "gw-routes",
        }],
    );
    server.set(
        type_url::LISTENER,
        vec![("gw".into(), any(&tcp)), ("gw-quic".into(), any(&quic))],
    );
    let quic_addr = listener_address(&proxy, "gw-quic").await;
    assert_eq!(quic_addr, tcp_addr, "one port number, two protocols");
    let exchanges = tokio::task::spawn_blocking(move || {
        h3_try(
            quic_addr,
            "www.example.com",
            json!([{"method": "GET", "path": "/x"}]),
            30,
            0,
        )
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(exchanges[0].status, Some(204), "{exchanges:?}");
    assert_eq!(exchanges[0].server_cert_names, ["www.example.com"]);
    assert_eq!(send_h1(tcp_addr, get("/x", &[])).await.status(), 204);
    server.shutdown().await;
}

/// `http.idle_timeout` ends an HTTP/3 connection that has had no request for that long, with
/// GOAWAY, as it does an HTTP/2 one (QUIC's own idle timeout needs silence, which a client's
/// pings would never give); a request taking longer than it is not cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_requests_for_the_idle_timeout_is_sent_goaway() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = ScratchDir::new();
    let (yaml, _) = config(&dir, upstream.local_addr(), "{ idle_timeout: 60s }");
    let yaml = yaml.replacen(
        "    http3: { idle_timeout: 60s }\n",
        "    http3: { idle_timeout: 60s }\n    http: { idle_timeout: 3s }\n",
        1,
    );
    let proxy = Proxy::start(&yaml, 1);
    let (addr, admin) = (proxy.addr(), proxy.admin.unwrap());
    // The upstream answers after 4 s: longer than the idle timeout, with the request in flight.
    let exchanges = tokio::task::spawn_blocking(move || {
        let slow = json!([{"method": "GET", "path": "/slow", "headers": [["x-noop-delay", "4s"]]}]);
        h3_run(addr, slow, 30, 20)
    })
    .await
    .unwrap();
    assert_eq!(exchanges[0].status, Some(200), "{exchanges:?}");
    assert!(exchanges[0].goaway, "GOAWAY once idle: {exchanges:?}");
    assert_eq!(stat(admin, "downstream_cx_idle_timeout"), 1);
}

/// `VmHWM` (the peak resident memory) of a process, in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Clients that stop reading large responses hold the proxy to what QUIC's windows and its
/// own bounded buffers allow: the upstream is pushed back rather than read into memory. The
/// stall lasts while another client moves a large body through the same worker (so an
/// unbounded proxy has the time to read every stalled response), and every byte still
/// arrives once the clients read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_hold_the_proxy_to_bounded_memory() {
    bounded(async {
        use testbed::h3_client::{H3Client, Windows};
        let read_to_end = async |stream: &mut testbed::h3_client::H3Stream| {
            testbed::h3_client::read_to_end(stream).await.unwrap()
        };
        const STALLED: usize = 8;
        const BODY: u64 = 16 << 20;
        let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let dir = ScratchDir::new();
        let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
        let yaml = yaml.replacen(
            "    http3: {}\n",
            "    http3: {}\n    per_connection_buffer_limit_bytes: 32768\n",
            1,
        );
        let proxy = Proxy::start(&yaml, 1);
        let addr = proxy.addr();
        let request = || {
            http::Request::get("https://legate.test/big")
                .header("x-noop-size", BODY.to_string())
                .body(())
                .unwrap()
        };
        // A first exchange, so the baseline includes the worker's QUIC and TLS state.
        let control = H3Client::new(addr, "legate.test", None).unwrap();
        let mut sender = control.connect().await.unwrap();
        let mut warm = sender.send_request(request()).await.unwrap();
        testbed::h3_client::finish(&mut warm).await.unwrap();
        assert_eq!(warm.recv_response().await.unwrap().status(), 200);
        assert_eq!(read_to_end(&mut warm).await, BODY);
        let baseline = peak_memory(proxy.pid());

        let windows = Windows {
            stream: 64 << 10,
            connection: 128 << 10,
        };
        let stalled_client = H3Client::new(addr, "legate.test", Some(windows)).unwrap();
        let mut stalled = Vec::new();
        for _ in 0..STALLED {
            let mut sender = stalled_client.connect().await.unwrap();
            let mut stream = sender.send_request(request()).await.unwrap();
            testbed::h3_client::finish(&mut stream).await.unwrap();
            assert_eq!(stream.recv_response().await.unwrap().status(), 200);
            stalled.push((sender, stream));
        }
        // The clock: a full body through the same worker, read at once.
        let mut clock = sender.send_request(request()).await.unwrap();
        testbed::h3_client::finish(&mut clock).await.unwrap();
        assert_eq!(clock.recv_response().await.unwrap().status(), 200);
        assert_eq!(read_to_end(&mut clock).await, BODY);
        let peak = peak_memory(proxy.pid());
        // Per stalled client: QUIC's send window and the stream pipe (the buffer limit, 64 KiB at
        // least, each), the upstream connection's read buffer, the codecs' state; and the
        // allocator's slack.
        let bound = baseline + STALLED as u64 * (5 * (64 << 10)) + (16 << 20);
        assert!(
            peak <= bound,
            "peak RSS {} KiB above {} KiB (baseline {} KiB): the proxy read stalled responses into memory",
            peak >> 10,
            bound >> 10,
            baseline >> 10
        );
        for (_sender, mut stream) in stalled {
            assert_eq!(read_to_end(&mut stream).await, BODY, "every byte arrives");
        }
        stalled_client.close().await;
        control.close().await;
    })
    .await;
}

/// A client opening streams and cancelling each at once (HTTP/2's rapid reset, over QUIC):
/// QUIC gives a new stream only once the proxy is done with an old one, so at most
/// `max_concurrent_streams` are ever being served, memory stays bounded, and the connection
/// still serves a request afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_and_cancelled_in_a_flood_stay_bounded() {
    bounded(async {
        use testbed::h3_client::{H3Client, cancel};
        const FLOOD: usize = 3000;
        let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let dir = ScratchDir::new();
        let (yaml, _) = config(
            &dir,
            upstream.local_addr(),
            "{ max_concurrent_streams: 20 }",
        );
        let proxy = Proxy::start(&yaml, 1);
        let client = H3Client::new(proxy.addr(), "legate.test", None).unwrap();
        let mut sender = client.connect().await.unwrap();
        let request = |path: &str| {
            http::Request::get(format!("https://legate.test{path}"))
                .header("x-noop-size", "1048576")
                .body(())
                .unwrap()
        };
        let mut first = sender.send_request(request("/first")).await.unwrap();
        testbed::h3_client::finish(&mut first).await.unwrap();
        assert_eq!(first.recv_response().await.unwrap().status(), 200);
        testbed::h3_client::read_to_end(&mut first).await.unwrap();
        let baseline = peak_memory(proxy.pid());
        for i in 0..FLOOD {
            let mut stream = sender
                .send_request(request(&format!("/flood/{i}")))
                .await
                .unwrap();
            cancel(&mut stream);
        }
        let mut last = sender.send_request(request("/last")).await.unwrap();
        testbed::h3_client::finish(&mut last).await.unwrap();
        assert_eq!(last.recv_response().await.unwrap().status(), 200);
        assert_eq!(
            testbed::h3_client::read_to_end(&mut last).await.unwrap(),
            1 << 20
        );
        let peak = peak_memory(proxy.pid());
        // 20 streams' worth of bounded buffers at most, and the allocator's slack.
        let bound = baseline + 20 * (5 * (64 << 10)) + (16 << 20);
        assert!(
            peak <= bound,
            "peak RSS {} KiB above {} KiB (baseline {} KiB)",
            peak >> 10,
            bound >> 10,
            baseline >> 10
        );
        client.close().await;
    })
    .await;
}

/// Bodies from 0 bytes to 64 MiB, both ways, arrive whole (by digest); with
/// `expect: 100-continue`, the client is told to go on (100) before it sends a byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_0_bytes_to_64_mib_arrive_whole_both_ways() {
    bounded(async {
        use testbed::h3_client::{H3Client, read_digest, send_pattern};
        let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let dir = ScratchDir::new();
        let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
        let proxy = Proxy::start(&yaml, 2);
        let client = H3Client::new(proxy.addr(), "legate.test", None).unwrap();
        let mut sender = client.connect().await.unwrap();
        for size in [0u64, 64 << 20] {
            let get = http::Request::get("https://legate.test/down")
                .header("x-noop-size", size.to_string())
                .body(())
                .unwrap();
            let mut stream = sender.send_request(get).await.unwrap();
            testbed::h3_client::finish(&mut stream).await.unwrap();
            assert_eq!(stream.recv_response().await.unwrap().status(), 200);
            let (length, digest) = read_digest(&mut stream).await.unwrap();
            assert_eq!((length, digest), (size, pattern_sha256(size)), "GET {size}");
            for expect in [false, true] {
                let mut post = http::Request::post("https://legate.test/up")
                    .header("x-noop-size", "0")
                    .header("content-length", size.to_string());
                if expect {
                    post = post.header("expect", "100-continue");
                }
                let mut stream = sender.send_request(post.body(()).unwrap()).await.unwrap();
                if expect && size > 0 {
                    let go_on = stream.recv_response().await.unwrap();
                    assert_eq!(go_on.status(), 100, "before the body");
                }
                send_pattern(&mut stream, size).await.unwrap();
                let response = stream.recv_response().await.unwrap();
                assert_eq!(response.status(), 200, "POST {size}, expect {expect}");
                let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
                assert_eq!(header("x-noop-request-bytes"), size.to_string());
                assert_eq!(header("x-noop-request-sha256"), pattern_sha256(size));
                read_digest(&mut stream).await.unwrap();
            }
        }
        client.close().await;
    })
    .await;
}

/// A response that needs nothing more of the request's body ends the body's side of the
/// stream: the client is asked to stop sending, with no error code of HTTP/3's, which says
/// the response stands whole (RFC 9114 sections 4.1 and 9), and the connection serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_response_did_not_need_is_stopped_and_the_connection_serves_on() {
    bounded(async {
        use testbed::h3_client::{H3Client, read_to_end};
        let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let dir = ScratchDir::new();
        let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
        let proxy = Proxy::start(&yaml, 1);
        let client = H3Client::new(proxy.addr(), "legate.test", None).unwrap();
        let mut sender = client.connect().await.unwrap();
        // A GET whose stream the client leaves open: the answer does not wait for its end.
        let request = http::Request::get("https://legate.test/open")
            .header("x-noop-size", "100")
            .body(())
            .unwrap();
        let mut stream = sender.send_request(request).await.unwrap();
        assert_eq!(stream.recv_response().await.unwrap().status(), 200);
        assert_eq!(read_to_end(&mut stream).await.unwrap(), 100);
        let deadline = Instant::now() + Duration::from_secs(30);
        let stopped = loop {
            match stream.send_data(bytes::Bytes::from_static(b"x")).await {
                Ok(()) => {
                    assert!(
                        Instant::now() < deadline,
                        "the client was never told to stop"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(error) => break error,
            }
        };
        assert!(
            testbed::h3_client::not_wanted(&stopped),
            "stopped with {stopped:?}"
        );
        let request = http::Request::get("https://legate.test/next")
            .body(())
            .unwrap();
        let mut next = sender.send_request(request).await.unwrap();
        testbed::h3_client::finish(&mut next).await.unwrap();
        assert_eq!(next.recv_response().await.unwrap().status(), 200);
        client.close().await;
    })
    .await;
}

/// A flood of small datagrams at the QUIC port (junk, and short-header packets naming
/// connection IDs the proxy never gave) is dropped without state: a client's requests on the
/// same port go on being answered and memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_small_datagrams_is_dropped_and_clients_are_served() {
    bounded(async {
        use testbed::h3_client::{H3Client, read_to_end};
        const DATAGRAMS: usize = 50_000;
        let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let dir = ScratchDir::new();
        let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
        let proxy = Proxy::start(&yaml, 1);
        let addr = proxy.addr();
        let client = H3Client::new(addr, "legate.test", None).unwrap();
        let mut sender = client.connect().await.unwrap();
        let baseline = peak_memory(proxy.pid());
        let flood = std::thread::spawn(move || {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut sent = 0;
            for i in 0..DATAGRAMS {
                // A short header (0x40 | bits), an 8-byte connection ID, a few bytes; or junk.
                let len = 1 + (i % 40);
                let packet: Vec<u8> = (0..len)
                    .map(|j| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        if j == 0 && i % 2 == 0 {
                            0x40 | (state as u8 & 0x3f)
                        } else {
                            state as u8
                        }
                    })
                    .collect();
                if socket.send_to(&packet, addr).is_ok() {
                    sent += 1;
                }
            }
            sent
        });
        let mut answered = 0;
        while !flood.is_finished() || answered == 0 {
            let request = http::Request::get("https://legate.test/during")
                .body(())
                .unwrap();
            let mut stream = sender.send_request(request).await.unwrap();
            testbed::h3_client::finish(&mut stream).await.unwrap();
            assert_eq!(stream.recv_response().await.unwrap().status(), 200);
            read_to_end(&mut stream).await.unwrap();
            answered += 1;
        }
        assert!(flood.join().unwrap() > DATAGRAMS / 2, "the flood was sent");
        // A new connection too.
        let mut fresh = client.connect().await.unwrap();
        let request = http::Request::get("https://legate.test/after")
            .body(())
            .unwrap();
        let mut stream = fresh.send_request(request).await.unwrap();
        testbed::h3_client::finish(&mut stream).await.unwrap();
        assert_eq!(stream.recv_response().await.unwrap().status(), 200);
        let peak = peak_memory(proxy.pid());
        assert!(
            peak <= baseline + (16 << 20),
            "peak RSS {} KiB, baseline {} KiB: the flood left state behind",
            peak >> 10,
            baseline >> 10
        );
        client.close().await;
    })
    .await;
}

/// 0-RTT with `http3: { early_data: true }`. A client resuming its session sends requests
/// with its first flight; a relay holds back the packets that would end its handshake, so
/// the proxy reads them as it would a replayed first flight. GET is served, with
/// `early-data: 1` for the upstream; POST is answered 425 Too Early. Once the handshake
/// ends, POST on the same connection is served, and GET goes without the header. Without
/// the setting, the proxy's session tickets allow no early data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_serves_safe_methods_alone_and_only_when_asked() {
    bounded(async {
        use testbed::h3_client::{H3Client, H3Sender, H3Stream};
        use testbed::quic_hold::HandshakeHold;

        /// A request's status, and its body as text.
        async fn exchange(sender: &mut H3Sender, method: &str, path: &str) -> (u16, String) {
            let request = http::Request::builder()
                .method(method)
                .uri(format!("https://legate.test{path}"))
                .header("x-noop-echo", "headers")
                .body(())
                .unwrap();
            let mut stream: H3Stream = sender.send_request(request).await.unwrap();
            if method == "POST" {
                testbed::h3_client::send_body(&mut stream, bytes::Bytes::from_static(b"x"))
                    .await
                    .unwrap();
            }
            testbed::h3_client::finish(&mut stream).await.unwrap();
            let status = stream.recv_response().await.unwrap().status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = stream.recv_data().await.unwrap() {
                use bytes::Buf;
                body.extend_from_slice(chunk.chunk());
            }
            (status, String::from_utf8(body).unwrap())
        }

        /// The first ticket the client is given, once it is.
        async fn first_ticket(client: &H3Client) -> u32 {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                if let Some(first) = client.tickets().first() {
                    return *first;
                }
                assert!(tokio::time::Instant::now() < deadline, "no session ticket");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }

        let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let dir = ScratchDir::new();
        let (yaml, _) = config(&dir, upstream.local_addr(), "{ early_data: true }");
        // A handshake not finished in 2 s ends the connection, 0-RTT or not.
        let yaml = yaml.replacen(
            "      certificates: [",
            "      handshake_timeout: 2s\n      certificates: [",
            1,
        );
        let proxy = Proxy::start(&yaml, 1);
        let admin = proxy.admin.unwrap();
        let hold = HandshakeHold::start(proxy.addr()).await.unwrap();
        let client = H3Client::resuming(hold.addr(), "legate.test").unwrap();
        // A full handshake first: it leaves the client a session that allows early data.
        let mut first = client.connect().await.unwrap();
        assert_eq!(exchange(&mut first, "GET", "/full").await.0, 200);
        assert_eq!(first_ticket(&client).await, u32::MAX, "0-RTT allowed");
        assert_eq!(stat(admin, "downstream_rq_early_data"), 0);

        // Both requests go before the client can have heard from the proxy: in 0-RTT.
        hold.hold();
        let (mut early, accepted) = client.connect_early().await.unwrap().expect("0-RTT keys");
        let requests = ["GET", "POST"].map(|method| {
            let mut sender = early.clone();
            tokio::spawn(async move { exchange(&mut sender, method, "/early").await })
        });
        eventually("both requests read in early data", async || {
            stat(admin, "downstream_rq_early_data") == 2
        })
        .await;
        hold.release_server();
        let [get, post] = requests;
        let (status, seen) = get.await.unwrap();
        assert_eq!(status, 200);
        assert!(seen.contains("early-data: 1"), "upstream saw: {seen}");
        let (status, _) = post.await.unwrap();
        assert_eq!(status, 425, "an unsafe method in early data");
        // Both were read while the proxy's packets were held: its handshake could not have
        // ended, as the client had heard nothing to finish it with.
        assert_eq!(stat(admin, "downstream_rq_too_early"), 1);

        hold.release();
        assert!(accepted.await, "the proxy took the early data");
        let (status, seen) = exchange(&mut early, "POST", "/late").await;
        assert_eq!(status, 200, "after the handshake: {seen}");
        let (status, seen) = exchange(&mut early, "GET", "/late").await;
        assert_eq!(status, 200);
        assert!(!seen.contains("early-data"), "upstream saw: {seen}");
        assert_eq!(stat(admin, "downstream_rq_early_data"), 2);
        client.close().await;
        eventually("the connection closed", async || {
            stat(admin, "downstream_cx_http3_active") == 0
        })
        .await;

        // The first flight recorded and sent again, from elsewhere: its session was resumed
        // once already, so the copy resumes nothing and its 0-RTT requests are never read.
        // The proxy answers it with a full handshake, which the copy never finishes. (A
        // copy that reaches the old connection while it drains is dropped there: sent again.)
        let upstream_before = upstream.requests();
        let mut replays = Vec::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while stat(admin, "downstream_cx_http3_handshake_error") == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the copy never got a handshake"
            );
            replays.push(hold.replay().await.unwrap());
            for _ in 0..100 {
                if stat(admin, "downstream_cx_http3_handshake_error") > 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        assert_eq!(
            stat(admin, "downstream_rq_early_data"),
            2,
            "no request of the copy read"
        );
        assert_eq!(
            upstream.requests(),
            upstream_before,
            "nothing of the copy forwarded"
        );
        let log_path = dir.0.join("access.log");
        eventually("the 425 logged", async || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.contains("HTTP/3 POST /early 425 ")
        })
        .await;

        // Off unless asked for: the proxy's tickets allow no early data.
        let (yaml, _) = config(&dir, upstream.local_addr(), "{}");
        let proxy = Proxy::start(&yaml, 1);
        let client = H3Client::resuming(proxy.addr(), "legate.test").unwrap();
        let mut sender = client.connect().await.unwrap();
        assert_eq!(exchange(&mut sender, "GET", "/full").await.0, 200);
        assert_eq!(first_ticket(&client).await, 0, "0-RTT off");
        assert!(client.connect_early().await.unwrap().is_none());
        client.close().await;
    })
    .await;
}

/// aioquic's 0-RTT, as quinn's: it resumes the session its first connection saved and sends
/// GET and POST at once, in early data (the relay holds the proxy's packets until both are
/// read). GET is served with `early-data: 1`, POST answered 425.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aioquic_sends_early_data_and_gets_the_same_answers() {
    bounded(async {
    use testbed::quic_hold::HandshakeHold;
    let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = ScratchDir::new();
    let (yaml, _) = config(&dir, upstream.local_addr(), "{ early_data: true }");
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    let hold = HandshakeHold::start(proxy.addr()).await.unwrap();
    let relay = hold.addr();
    let ticket = [
        "--ticket".to_owned(),
        dir.0.join("ticket").display().to_string(),
    ];
    let first = {
        let ticket = ticket.clone();
        tokio::task::spawn_blocking(move || {
            let get = json!([{"method": "GET", "path": "/full"}]);
            h3_reports(h3_spawn(relay, "legate.test", get, 30, &ticket))
        })
        .await
        .unwrap()
        .unwrap()
    };
    assert_eq!(first[0].status, Some(200), "{first:?}");
    assert_eq!(first[0].ticket_max_early_data, Some(u64::from(u32::MAX)));

    hold.hold();
    let requests = json!([
        {"method": "GET", "path": "/early", "headers": [["x-noop-echo", "headers"]], "report_body": true},
        {"method": "POST", "path": "/early", "body_bytes": 10},
    ]);
    let child = h3_spawn(relay, "legate.test", requests, 30, &ticket);
    eventually("both requests read in early data", async || {
        stat(admin, "downstream_rq_early_data") == 2
    })
    .await;
    hold.release_server();
    let early = tokio::task::spawn_blocking(move || h3_reports(child))
        .await
        .unwrap()
        .unwrap();
    hold.release();
    assert_eq!(early[0].early_data_accepted, Some(true), "{early:?}");
    assert_eq!(early[0].status, Some(200), "{early:?}");
    let seen = early[0].body_text.as_deref().unwrap_or_default();
    assert!(seen.contains("early-data: 1"), "upstream saw: {seen}");
    assert_eq!(early[1].status, Some(425), "{early:?}");
    assert_eq!(stat(admin, "downstream_rq_too_early"), 1);
    })
    .await;
}

/// `work` within a limit: a client of quinn's that waits on the proxy forever fails the test
/// rather than hanging the run.
async fn bounded(work: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(std::time::Duration::from_secs(180), work)
        .await
        .expect("the test's exchanges finished within 180 s");
}
