//! Connections opened ahead of the requests that will use them (a cluster's `preconnect`,
//! Envoy's `preconnect_policy`): per host over HTTP/1.1, HTTP/2 and relays, and across the
//! cluster to the hosts the next picks go to.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use common::*;

const LIMIT: Duration = Duration::from_secs(20);

/// A proxy with one worker, `/` to cluster `backend` over `protocol` with `extra` settings.
fn proxy(endpoints: &[SocketAddr], protocol: &str, extra: &str) -> Proxy {
    let endpoints = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>();
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
        timeout: 20s
clusters:
  - name: backend
    endpoints: [{endpoints}]
    protocol: {protocol}
    {extra}
"#,
            endpoints = endpoints.join(", ")
        ),
        1,
    )
}

fn held_request(
    proxy: SocketAddr,
) -> tokio::task::JoinHandle<hyper::Response<hyper::body::Incoming>> {
    tokio::spawn(async move { send_h1(proxy, get("/", &[])).await })
}

async fn answered(request: tokio::task::JoinHandle<hyper::Response<hyper::body::Incoming>>) {
    let res = tokio::time::timeout(LIMIT, request).await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    text(res.into_body()).await;
}

/// Two requests held in flight, one after the other, to one host: how many connections the
/// host has accepted once the second has arrived and nothing more is opened.
async fn connections_for_two_held(protocol: &str, extra: &str, expected: [usize; 2]) {
    let upstream = HeldUpstream::start().await;
    let proxy = proxy(&[upstream.addr], protocol, extra);
    let admin = proxy.admin.unwrap();
    let first = held_request(proxy.addr());
    upstream.wait_for_requests(1).await;
    eventually("the first request's connections", async || {
        upstream.accepted() == expected[0]
    })
    .await;
    let second = held_request(proxy.addr());
    upstream.wait_for_requests(2).await;
    eventually("the second request's connections", async || {
        upstream.accepted() == expected[1]
    })
    .await;
    eventually("counted as opened", async || {
        stat(admin, "upstream_cx_total") == expected[1] as i64
    })
    .await;
    upstream.release();
    answered(first).await;
    answered(second).await;
    assert_eq!(upstream.accepted(), expected[1], "{protocol} {extra:?}");
}

/// HTTP/1.1 carries one request per connection: at ratio 2, each request in flight has one
/// more opened beside it (Envoy's example: "2 connections will be established"), and the
/// second request takes the one opened ahead for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_requests_get_connections_opened_beside_them_at_the_per_upstream_ratio() {
    connections_for_two_held("http1", "preconnect: { per_upstream_ratio: 2 }", [2, 4]).await;
    // Without it, each request opens what it needs and nothing more.
    connections_for_two_held("http1", "", [1, 2]).await;
}

/// An HTTP/2 connection carries `max_concurrent_streams` requests: with one stream each, a
/// request in flight at ratio 2 gets another connection beside its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_are_opened_ahead_by_the_streams_they_carry() {
    connections_for_two_held(
        "http2",
        "max_concurrent_streams: 1\n    preconnect: { per_upstream_ratio: 2 }",
        [2, 4],
    )
    .await;
    connections_for_two_held("http2", "max_concurrent_streams: 1", [1, 2]).await;
    // Without a stream limit one connection carries them all: ratio 2 wants nothing more.
    connections_for_two_held("http2", "preconnect: { per_upstream_ratio: 2 }", [1, 1]).await;
}

/// A host that greets each connection with its number, in the order accepted.
async fn numbering_host() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let _ = stream.write_all(&[b'0' + n as u8]).await;
                // Held open until the relay closes it.
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
    });
    (addr, accepted)
}

/// A relay listener to `host`, whose cluster opens connections ahead at ratio 2, with
/// `extra` cluster settings.
fn relay_proxy(host: SocketAddr, extra: &str) -> Proxy {
    Proxy::start(
        &format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: relay
    address: 127.0.0.1:0
    tcp_proxy: {{ cluster: greeter }}
clusters:
  - name: greeter
    endpoints: [{host}]
    preconnect: {{ per_upstream_ratio: 2 }}
    {extra}
"#
        ),
        1,
    )
}

/// A relay takes a connection opened ahead for it, with what the host sent meanwhile (its
/// greeting) waiting there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_takes_a_connection_opened_ahead_with_the_hosts_greeting() {
    let (host, accepted) = numbering_host().await;
    let proxy = relay_proxy(host, "");
    let greeting = async |client: &mut TcpStream| {
        let mut byte = [0u8; 1];
        tokio::time::timeout(LIMIT, client.read_exact(&mut byte))
            .await
            .expect("greeted")
            .unwrap();
        byte[0] - b'0'
    };
    let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
    let one = greeting(&mut first).await;
    let admin = proxy.admin.unwrap();
    // Counted once the proxy holds it for the next relay.
    eventually("one connection opened ahead", async || {
        stat(admin, "upstream_cx_total") == 2
    })
    .await;
    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    let two = greeting(&mut second).await;
    // The second relay got the other of the first two connections, not a new one.
    let mut got = [one, two];
    got.sort_unstable();
    assert_eq!(got, [1, 2]);
    // Two relays at ratio 2: two more opened ahead, and no more.
    eventually("two more opened ahead", async || {
        accepted.load(Ordering::SeqCst) == 4
    })
    .await;
    assert_eq!(stat(admin, "upstream_cx_total"), 4);
}

/// Across the cluster, at predictive ratio 2 over round robin: the first request opens a
/// connection to the host the next pick goes to as well as its own, and the next request
/// goes there and finds it (Envoy's example for a round-robin HTTP/2 cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_picks_host_gets_a_connection_ahead_at_the_predictive_ratio() {
    let hosts = [HeldUpstream::start().await, HeldUpstream::start().await];
    let addrs = [hosts[0].addr, hosts[1].addr];
    for (extra, ahead) in [("preconnect: { predictive_ratio: 2 }", true), ("", false)] {
        let proxy = proxy(&addrs, "http2", extra);
        hosts.iter().for_each(HeldUpstream::release);
        let before: Vec<usize> = hosts.iter().map(HeldUpstream::accepted).collect();
        let opened = |i: usize| hosts[i].accepted() - before[i];
        answered(held_request(proxy.addr())).await;
        if ahead {
            eventually("a connection to each host", async || {
                opened(0) == 1 && opened(1) == 1
            })
            .await;
            eventually("both held by the proxy", async || {
                stat(proxy.admin.unwrap(), "upstream_cx_total") == 2
            })
            .await;
        } else {
            assert_eq!(opened(0) + opened(1), 1, "only the host picked");
        }
        // Round robin sends the next requests to each host in turn: on the connections
        // there, none opened for them.
        let arrived: Vec<usize> = hosts.iter().map(HeldUpstream::arrived).collect();
        for _ in 0..4 {
            answered(held_request(proxy.addr())).await;
        }
        for (i, host) in hosts.iter().enumerate() {
            assert_eq!(host.arrived() - arrived[i], 2, "{extra:?}");
            assert_eq!(opened(i), 1, "{extra:?}: host {i}");
        }
    }
}

/// A relay connection opened ahead and left unused closes at the cluster's `idle_timeout`,
/// giving its slot back, with no relay coming to look at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_connection_opened_ahead_closes_unused_at_the_idle_timeout() {
    let (host, accepted) = numbering_host().await;
    let proxy = relay_proxy(host, "idle_timeout: 300ms");
    let admin = proxy.admin.unwrap();
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut byte = [0u8; 1];
    tokio::time::timeout(LIMIT, client.read_exact(&mut byte))
        .await
        .expect("greeted")
        .unwrap();
    eventually("the connection opened ahead closed unused", async || {
        stat(admin, "upstream_cx_idle_timeout") == 1
    })
    .await;
    eventually("only the relay's open", async || {
        stat(admin, "upstream_cx_active") == 1
    })
    .await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // The relay itself is not the pool's to time out.
    client.write_all(b"x").await.unwrap();
    assert_eq!(stat(admin, "upstream_cx_total"), 2);
}
