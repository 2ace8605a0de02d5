//! Bounded per-connection buffers: slow clients and slow upstreams push back on the other side
//! instead of piling bytes up in the proxy. Each test moves 50 x 64 MiB through the real
//! binary at 1 MiB/s per connection and asserts the proxy's peak RSS stays within a bound
//! derived from `per_connection_buffer_limit_bytes`.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{PatternBody, Proxy, get, get_h2, h2_client, send_h1};
use http::Request;
use http_body_util::BodyExt;
use testbed::{NoopUpstream, pattern_bytes, pattern_sha256};

const CLIENTS: usize = 50;
const BODY: u64 = 64 << 20;
const RATE: u64 = 1 << 20;
const LIMIT: u64 = 32 << 10;
/// Allowance per client connection: the HTTP/1.1 read buffer and write queue on each side are
/// bounded by max(limit, 60 KiB head limit) downstream and the limit upstream, HTTP/2 stream
/// windows and send buffers by the limit; 4 x 64 KiB covers any mix, plus 64 KiB for the
/// codecs' own state and the chunk in flight.
const PER_CLIENT: u64 = 4 * (64 << 10) + (64 << 10);
/// The route timeout runs from the end of the client's upload, but the slow upstream still has
/// to read what the kernel holds for it then: its receive buffer grows with its bursty reads
/// (up to `tcp_rmem`'s 32 MiB here), which at `RATE` is more than the default 15 s.
const ROUTE_TIMEOUT: &str = "120s";
/// Allocator slack (per-thread arenas, fragmentation), independent of the byte counts.
const SLACK: u64 = 16 << 20;

fn config(upstream: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    per_connection_buffer_limit_bytes: {LIMIT}
    routes:
      - match: {{ prefix: /h2 }}
        cluster: over_h2
        timeout: {ROUTE_TIMEOUT}
      - match: {{ prefix: / }}
        cluster: over_h1
        timeout: {ROUTE_TIMEOUT}
clusters:
  - name: over_h1
    endpoints: [{upstream}]
    per_connection_buffer_limit_bytes: {LIMIT}
  - name: over_h2
    endpoints: [{upstream}]
    protocol: http2
    per_connection_buffer_limit_bytes: {LIMIT}
"#
    )
}

/// `VmRSS` or `VmHWM` (the peak) of a process, in bytes.
fn memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

fn assert_bounded(proxy: &Proxy, baseline: u64) {
    let peak = memory(proxy.pid(), "VmHWM:");
    let bound = baseline + CLIENTS as u64 * PER_CLIENT + SLACK;
    eprintln!(
        "proxy RSS: baseline {} KiB, peak {} KiB, bound {} KiB ({} clients x {} KiB in flight)",
        baseline >> 10,
        peak >> 10,
        bound >> 10,
        CLIENTS,
        BODY >> 10
    );
    assert!(
        peak <= bound,
        "peak RSS {peak} above the bound {bound}: the proxy queued bytes"
    );
}

/// Reads `body` at `RATE` bytes a second, checking every byte against the pattern.
async fn read_slowly(mut body: hyper::body::Incoming) -> u64 {
    let started = tokio::time::Instant::now();
    let mut offset = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("body frame").into_data() else {
            continue;
        };
        for chunk in data.chunks(64 << 10) {
            assert_eq!(
                chunk,
                &pattern_bytes(offset, chunk.len())[..],
                "body differs at {offset}"
            );
            offset += chunk.len() as u64;
        }
        let due = Duration::from_secs_f64(offset as f64 / RATE as f64);
        tokio::time::sleep_until(started + due).await;
    }
    offset
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_downloads_are_paced_by_the_client_not_buffered() {
    let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
    let proxy = Proxy::start(&config(upstream.local_addr()), 2);
    let addr = proxy.addr();
    let baseline = memory(proxy.pid(), "VmRSS:");
    let size = BODY.to_string();

    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let size = size.clone();
        // Half the clients speak HTTP/2, and half of each go to the HTTP/2 upstream cluster.
        let path = if i % 4 < 2 { "/h1" } else { "/h2" };
        let h2_client_side = i % 2 == 1;
        clients.push(tokio::spawn(async move {
            let headers = [("x-noop-size", size.as_str())];
            let res = if h2_client_side {
                let (mut sender, _conn) = h2_client(addr).await;
                sender.send_request(get_h2(path, &headers)).await.unwrap()
            } else {
                send_h1(addr, get(path, &headers)).await
            };
            assert_eq!(res.status(), 200);
            read_slowly(res.into_body()).await
        }));
    }
    for client in clients {
        assert_eq!(client.await.unwrap(), BODY, "every byte arrives");
    }
    assert_bounded(&proxy, baseline);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstream_readers_push_back_on_fast_uploads() {
    let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
    let proxy = Proxy::start(&config(upstream.local_addr()), 2);
    let addr = proxy.addr();
    let baseline = memory(proxy.pid(), "VmRSS:");
    let expected = pattern_sha256(BODY);

    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let path = if i % 4 < 2 { "/h1" } else { "/h2" };
        let h2_client_side = i % 2 == 1;
        clients.push(tokio::spawn(async move {
            let req = |uri: String| {
                Request::post(uri)
                    .header("host", "legate.test")
                    .header("x-noop-read-rate", RATE.to_string())
                    .body(PatternBody::new(BODY, true))
                    .unwrap()
            };
            let res = if h2_client_side {
                let (mut sender, _conn) = h2_client(addr).await;
                let uri = format!("http://legate.test{path}");
                sender.send_request(req(uri)).await.unwrap()
            } else {
                send_h1(addr, req(path.to_string())).await
            };
            assert_eq!(res.status(), 200, "{path}, HTTP/2 client: {h2_client_side}");
            let header = |name: &str| res.headers()[name].to_str().unwrap().to_string();
            (
                header("x-noop-request-bytes"),
                header("x-noop-request-sha256"),
            )
        }));
    }
    for client in clients {
        let (bytes, sha256) = client.await.unwrap();
        assert_eq!(bytes, BODY.to_string());
        assert_eq!(sha256, expected);
    }
    assert_bounded(&proxy, baseline);
}
