//! `tcp_proxy` listeners through the real binary: bytes relayed both ways with half-close,
//! server-first protocols, TLS termination then TCP, connect failures, the idle timeout, and
//! a relay from the management server. The upstreams are echo servers on 127.0.0.1.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(20);

/// An echo server: each connection gets `greeting` first, then every byte back; its end of
/// the stream is closed once the client has closed its own (half-close passed on).
async fn echo(greeting: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if stream.write_all(greeting).await.is_err() {
                    return;
                }
                let (mut read, mut write) = stream.split();
                if tokio::io::copy(&mut read, &mut write).await.is_ok() {
                    let _ = write.shutdown().await;
                }
            });
        }
    });
    addr
}

fn relay_config(listener_extra: &str, upstream: SocketAddr, tcp_extra: &str) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: relay
    address: 127.0.0.1:0
{listener_extra}    tcp_proxy: {{ cluster: echo{tcp_extra} }}
clusters:
  - name: echo
    endpoints: [{upstream}]
"#
    )
}

/// Writes `total` bytes of a pattern while reading what comes back, closes its write side,
/// and returns everything read until the other side closed.
async fn send_and_collect<S: AsyncRead + AsyncWrite>(stream: S, total: usize) -> Vec<u8> {
    let (mut read, mut write) = tokio::io::split(stream);
    let writer = async move {
        let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        while sent < total {
            let n = chunk.len().min(total - sent);
            write.write_all(&chunk[..n]).await.unwrap();
            sent += n;
        }
        write.shutdown().await.unwrap();
    };
    let reader = async move {
        let mut back = Vec::with_capacity(total);
        read.read_to_end(&mut back).await.unwrap();
        back
    };
    let ((), back) = tokio::time::timeout(LIMIT, async { tokio::join!(writer, reader) })
        .await
        .expect("the relay finishes");
    back
}

fn pattern(total: usize) -> Vec<u8> {
    (0..total).map(|i| ((i % 65536) % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_64_mib_both_ways_and_passes_half_close_on() {
    let upstream = echo(b"").await;
    let proxy = Proxy::start(&relay_config("", upstream, ""), 2);
    let total = 64 << 20;
    let stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let back = send_and_collect(stream, total).await;
    assert_eq!(back.len(), total);
    assert!(back == pattern(total), "the bytes came back as sent");
    let admin = proxy.admin.unwrap();
    eventually("the relay counted", async || {
        stat(admin, "tcp_proxy_downstream_rx_bytes_total") == total as i64
            && stat(admin, "tcp_proxy_downstream_tx_bytes_total") == total as i64
    })
    .await;
    assert_eq!(stat(admin, "tcp_proxy_cx_total"), 1);
    let dump: serde_json::Value =
        serde_json::from_str(&admin_request(admin, "GET", "/config_dump").1).unwrap();
    assert_eq!(
        dump["listeners"][0]["tcp_proxy"],
        serde_json::json!({ "cluster": "echo", "idle_timeout": "3600s", "max_connect_attempts": 1 })
    );
}

/// A protocol whose server speaks first (SMTP, MySQL) gets its greeting to a client that
/// has sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_speaks_first_is_heard_at_once() {
    let upstream = echo(b"220 ready\r\n").await;
    let proxy = Proxy::start(&relay_config("", upstream, ""), 1);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut greeting = [0u8; 11];
    tokio::time::timeout(LIMIT, stream.read_exact(&mut greeting))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&greeting, b"220 ready\r\n");
    stream.write_all(b"EHLO x\r\n").await.unwrap();
    let mut echoed = [0u8; 8];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"EHLO x\r\n");
}

/// Nothing to connect to: the client's connection is closed, each attempt counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_refuses_closes_the_client_after_the_attempts() {
    let closed = closed_port();
    let proxy = Proxy::start(
        &relay_config("", closed.addr, ", max_connect_attempts: 3"),
        1,
    );
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(LIMIT, stream.read(&mut buf))
        .await
        .expect("closed, not held");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let admin = proxy.admin.unwrap();
    eventually("the failure counted", async || {
        stat(admin, "tcp_proxy_cx_no_upstream") == 1
    })
    .await;
    assert_eq!(stat(admin, "upstream_cx_connect_fail"), 3);
    assert_eq!(stat(admin, "tcp_proxy_cx_total"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_relay_is_closed_at_its_idle_timeout() {
    let upstream = echo(b"").await;
    let proxy = Proxy::start(&relay_config("", upstream, ", idle_timeout: 300ms"), 1);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    stream.read_exact(&mut back).await.unwrap();
    // Then nothing: the proxy closes both sides.
    let mut rest = Vec::new();
    tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest))
        .await
        .expect("closed at the idle timeout")
        .unwrap();
    assert!(rest.is_empty());
    let admin = proxy.admin.unwrap();
    eventually("the idle timeout counted", async || {
        stat(admin, "tcp_proxy_idle_timeout") == 1
    })
    .await;
}

/// TLS in, TCP out: the listener terminates TLS (offering no ALPN) and relays the clear bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_terminated_then_the_bytes_relayed() {
    let upstream = echo(b"").await;
    let dir = ScratchDir::new();
    let pair = rcgen::generate_simple_self_signed(vec!["relay.test".to_string()]).unwrap();
    let cert = dir.write("relay.pem", &pair.cert.pem());
    let key = dir.write("relay.key", &pair.signing_key.serialize_pem());
    let tls = format!(
        "    tls:\n      certificates:\n        - {{ cert_chain: {}, private_key: {} }}\n",
        cert.display(),
        key.display()
    );
    let proxy = Proxy::start(&relay_config(&tls, upstream, ""), 1);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pair.cert.der().clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("relay.test").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), None, "no HTTP offered");
    let back = send_and_collect(stream, 1 << 20).await;
    assert!(back == pattern(1 << 20));
}

/// Envoy's `tcp_proxy` network filter from a management server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_proxy_listener_from_the_management_server() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
    use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier,
    };
    use testbed::xds::{any, type_url};

    let upstream = echo(b"hello\n").await;
    let server = testbed::ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut l = testbed::resources::listener("tcp", "127.0.0.1:0".parse().unwrap(), "unused");
    l.filter_chains[0].filters = vec![Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(filter::ConfigType::TypedConfig(any(&TcpProxy {
            stat_prefix: "tcp".into(),
            cluster_specifier: Some(ClusterSpecifier::Cluster("echo".into())),
            ..Default::default()
        }))),
    }];
    server.set(type_url::LISTENER, vec![("tcp".into(), any(&l))]);
    let cluster = testbed::resources::eds_cluster("echo", LbPolicy::RoundRobin);
    server.set(type_url::CLUSTER, vec![("echo".into(), any(&cluster))]);
    let endpoints = testbed::resources::assignment("echo", &[upstream]);
    server.set(type_url::ENDPOINT, vec![("echo".into(), any(&endpoints))]);
    let proxy = Proxy::start(
        &format!(
            "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{}\" }} }}\n",
            server.local_addr()
        ),
        1,
    );
    let mut addr: Option<SocketAddr> = None;
    eventually("the listener in force", async || {
        let dump: serde_json::Value =
            serde_json::from_str(&admin_request(proxy.admin.unwrap(), "GET", "/config_dump").1)
                .unwrap();
        addr = (dump["listeners"].as_array().unwrap().iter())
            .find(|l| l["name"] == "tcp")
            .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
        addr.is_some()
    })
    .await;
    let mut stream = TcpStream::connect(addr.unwrap()).await.unwrap();
    let mut greeting = [0u8; 6];
    tokio::time::timeout(LIMIT, stream.read_exact(&mut greeting))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&greeting, b"hello\n");
    assert!(server.requests().iter().all(|r| !r.is_nack()));
    server.shutdown().await;
}

/// A shutdown leaves relays running until `drain_timeout`, then closes them and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_relays_after_the_drain_timeout() {
    let upstream = echo(b"").await;
    let yaml = format!("drain_timeout: 2s\n{}", relay_config("", upstream, ""));
    let mut proxy = Proxy::start(&yaml, 1);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    stream.read_exact(&mut back).await.unwrap();
    proxy.terminate();
    assert!(proxy.wait_for_log("draining", LIMIT), "{}", proxy.log());
    // Still relayed while the drain runs.
    stream.write_all(b"pong").await.unwrap();
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"pong");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "closed at the drain timeout");
    let status = proxy.wait(LIMIT).expect("the process exits");
    assert!(status.success(), "{status:?}\n{}", proxy.log());
}

/// The upstream closes its side first (a server that says goodbye and then reads the rest):
/// the client gets the end, and what it sends after still reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_closing_first_leaves_the_other_way_open() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (received, got) = tokio::sync::oneshot::channel::<usize>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(b"bye\n").await.unwrap();
        stream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.unwrap();
        let _ = received.send(rest.len());
    });
    let proxy = Proxy::start(&relay_config("", upstream, ""), 1);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut from_upstream = Vec::new();
    tokio::time::timeout(LIMIT, stream.read_to_end(&mut from_upstream))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(from_upstream, b"bye\n");
    let total = 1 << 20;
    stream.write_all(&pattern(total)).await.unwrap();
    stream.shutdown().await.unwrap();
    let got = tokio::time::timeout(LIMIT, got).await.unwrap().unwrap();
    assert_eq!(
        got, total,
        "every byte sent after the upstream's end reached it"
    );
}

/// A binary upgrade: the new process takes the socket and relays new connections; a relay of
/// the old one goes on through the drain, and is closed at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_upgrade_keeps_relays_until_the_drain_timeout() {
    let upstream = echo(b"").await;
    let sockets = ScratchDir::new();
    let socket = sockets.0.join("legate.sock");
    let config = |address: &str| {
        format!("drain_timeout: 5s\n{}", relay_config("", upstream, "")).replace(
            "    address: 127.0.0.1:0",
            &format!("    address: {address}"),
        )
    };
    let mut old = start_upgradable(&config("127.0.0.1:0"), &socket, false);
    let addr = old.addr();
    let mut kept = TcpStream::connect(addr).await.unwrap();
    let mut back = [0u8; 4];
    kept.write_all(b"ping").await.unwrap();
    kept.read_exact(&mut back).await.unwrap();

    let new = start_upgradable(&config(&addr.to_string()), &socket, true);
    assert_eq!(new.addr(), addr, "the new process serves the same socket");
    assert!(old.wait_for_log("draining", LIMIT), "{}", old.log());
    // The old relay still carries bytes while the old process drains.
    kept.write_all(b"pong").await.unwrap();
    kept.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"pong");
    // At the drain timeout the old relay is closed, and the old process exits.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(LIMIT, kept.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "closed at the drain timeout");
    let status = tokio::task::spawn_blocking(move || (old.wait(LIMIT), old.log()))
        .await
        .unwrap();
    assert!(status.0.is_some_and(|s| s.success()), "{}", status.1);
    // The old process is gone: this connection is the new one's.
    let mut fresh = TcpStream::connect(addr).await.unwrap();
    fresh.write_all(b"new!").await.unwrap();
    fresh.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"new!");
}

/// `weighted_clusters`: each connection goes to one cluster drawn by weight; a weight of 0
/// gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_clusters_share_connections_by_weight() {
    let (a, b, c) = (echo(b"a").await, echo(b"b").await, echo(b"c").await);
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: relay
    address: 127.0.0.1:0
    tcp_proxy:
      weighted_clusters:
        - {{ cluster: a, weight: 1 }}
        - {{ cluster: b, weight: 1 }}
        - {{ cluster: c, weight: 0 }}
clusters:
  - {{ name: a, endpoints: [{a}] }}
  - {{ name: b, endpoints: [{b}] }}
  - {{ name: c, endpoints: [{c}] }}
"#
    );
    let proxy = Proxy::start(&yaml, 1);
    let mut seen = std::collections::BTreeMap::<u8, usize>::new();
    for _ in 0..64 {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut greeting = [0u8; 1];
        stream.read_exact(&mut greeting).await.unwrap();
        *seen.entry(greeting[0]).or_default() += 1;
    }
    // Each of 64 draws is a or b; all 64 the same would be a 1-in-2^63 chance.
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        [b'a', b'b'],
        "{seen:?}"
    );
}

/// The access log has one line per relayed connection when it ends: the bytes each way, the
/// host, and `UF` for a connection no attempt could take somewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_relayed_connection_is_one_access_log_line() {
    let upstream = echo(b"hi").await;
    let closed = closed_port();
    let logs = ScratchDir::new();
    let log = logs.0.join("relay.log");
    let format = "%UPSTREAM_HOST% %BYTES_RECEIVED% %BYTES_SENT% %RESPONSE_FLAGS% %PROTOCOL% %RESPONSE_CODE% %DOWNSTREAM_REMOTE_ADDRESS%\n";
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: relay
    address: 127.0.0.1:0
    access_log: {{ path: "{path}", format: "{format}" }}
    tcp_proxy: {{ cluster: echo }}
  - name: nowhere
    address: 127.0.0.1:0
    access_log: {{ path: "{path}", format: "{format}" }}
    tcp_proxy: {{ cluster: dead }}
clusters:
  - {{ name: echo, endpoints: [{upstream}] }}
  - {{ name: dead, endpoints: [{closed}] }}
"#,
        closed = closed.addr,
        path = log.display(),
        format = format.replace('\n', "\\n"),
    );
    let proxy = Proxy::start(&yaml, 1);
    let stream = TcpStream::connect(proxy.addrs[0]).await.unwrap();
    let client = stream.local_addr().unwrap();
    let back = send_and_collect(stream, 1000).await;
    assert_eq!(back.len(), 1002, "the greeting and the bytes echoed");
    let mut refused = TcpStream::connect(proxy.addrs[1]).await.unwrap();
    let refused_client = refused.local_addr().unwrap();
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(LIMIT, refused.read(&mut buf))
        .await
        .expect("closed, not held");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // Lines are found by the client's address: the test's connections are the only ones
    // these ephemeral listeners expect, but nothing stops a stray connection to their ports.
    let line_of = |text: &str, peer: SocketAddr| {
        text.lines()
            .find(|line| line.ends_with(&format!(" {peer}")))
            .map(str::to_owned)
    };
    eventually("both lines written", async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        line_of(&text, client).is_some() && line_of(&text, refused_client).is_some()
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        line_of(&text, client).unwrap(),
        format!("{upstream} 1000 1002 - - 0 {client}")
    );
    assert_eq!(
        line_of(&text, refused_client).unwrap(),
        format!("- 0 0 UF - 0 {refused_client}")
    );
}

/// `hash_policy: source_ip` keeps one client on one host of a ring hash cluster; without it
/// such a cluster picks at random.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_policy_source_ip_keeps_a_client_on_one_host() {
    let hosts = [
        echo(b"a").await,
        echo(b"b").await,
        echo(b"c").await,
        echo(b"d").await,
    ];
    let endpoints = hosts.map(|h| h.to_string()).join(", ");
    let yaml = |hash: &str| {
        format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: relay
    address: 127.0.0.1:0
    tcp_proxy: {{ cluster: ring{hash} }}
clusters:
  - name: ring
    endpoints: [{endpoints}]
    lb_policy: ring_hash
"#
        )
    };
    async fn hosts_reached(proxy: &Proxy) -> std::collections::BTreeSet<u8> {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..24 {
            let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
            let mut greeting = [0u8; 1];
            tokio::time::timeout(LIMIT, stream.read_exact(&mut greeting))
                .await
                .unwrap()
                .unwrap();
            seen.insert(greeting[0]);
        }
        seen
    }
    let hashed = Proxy::start(&yaml(", hash_policy: source_ip"), 1);
    let seen = hosts_reached(&hashed).await;
    assert_eq!(seen.len(), 1, "one client, one host: {seen:?}");
    let dump: serde_json::Value =
        serde_json::from_str(&admin_request(hashed.admin.unwrap(), "GET", "/config_dump").1)
            .unwrap();
    assert_eq!(
        dump["listeners"][0]["tcp_proxy"]["hash_policy"],
        "source_ip"
    );
    // 24 random picks of 4 hosts all the same: a 1-in-4^23 chance.
    let random = Proxy::start(&yaml(""), 1);
    let seen = hosts_reached(&random).await;
    assert!(seen.len() > 1, "no hash, random picks: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_close_when_their_host_fails_its_checks_where_the_cluster_says() {
    for close in [true, false] {
        let upstream = echo(b"").await;
        // The host's checks go to another port, so they can fail while the echo serves on.
        let checked =
            testbed::NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
        let config = format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: relay
    address: 127.0.0.1:0
    tcp_proxy: {{ cluster: echo }}
clusters:
  - name: echo
    endpoints: [{{ address: "{upstream}", health_check: {{ port: {} }} }}]
    close_connections_on_host_health_failure: {close}
    health_check: {{ path: /healthz, interval: 100ms, jitter: 0s, timeout: 500ms, unhealthy_threshold: 1, healthy_threshold: 1 }}
"#,
            checked.local_addr().port()
        );
        let proxy = Proxy::start(&config, 1);
        let admin = proxy.admin.unwrap();
        eventually("a passing check", async || {
            stat(admin, "health_check_success") >= 1
        })
        .await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"before").await.unwrap();
        let mut echoed = [0u8; 6];
        tokio::time::timeout(LIMIT, client.read_exact(&mut echoed))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&echoed, b"before");
        checked.shutdown();
        eventually("the host failed its checks", async || {
            stat(admin, "health_check_failure") >= 1 && stat(admin, "membership_healthy") == 0
        })
        .await;
        if close {
            // Closed by the proxy: nothing else would end it.
            let mut rest = Vec::new();
            let read = tokio::time::timeout(LIMIT, client.read_to_end(&mut rest)).await;
            assert!(read.is_ok(), "the relay was closed");
        } else {
            client.write_all(b"after").await.unwrap();
            let mut echoed = [0u8; 5];
            tokio::time::timeout(LIMIT, client.read_exact(&mut echoed))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&echoed, b"after");
        }
    }
}

/// A connection from `from` (a loopback address) to `addr`, and what it reads until the
/// relay closes it after it sent `hi` and closed its side.
async fn exchange_from(from: &str, addr: SocketAddr) -> Vec<u8> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    // A denied connection may be closed before this is written: the write may fail.
    let _ = stream.write_all(b"hi").await;
    let _ = stream.shutdown().await;
    let mut back = Vec::new();
    let _ = tokio::time::timeout(LIMIT, stream.read_to_end(&mut back))
        .await
        .expect("the relay closes");
    back
}

/// Network RBAC before the relay (Envoy Gateway's TCPRoute authorization): a connection its
/// rules deny is closed before any upstream is connected; others are relayed. Shadow rules
/// count only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_rules_decide_which_connections_are_relayed() {
    let upstream = echo(b"hello\n").await;
    let rbac = r#", rbac: { rules: { matchers: [{ name: lab, action: deny, match: { source_ip: [127.0.0.2/32] } }], on_no_match: allow }, shadow_rules: { matchers: [{ name: tight, action: allow, match: { source_ip: [127.0.0.1/32] } }], on_no_match: deny } }"#;
    let proxy = Proxy::start(&relay_config("", upstream, rbac), 1);
    let admin = proxy.admin.unwrap();
    assert_eq!(exchange_from("127.0.0.1", proxy.addr()).await, b"hello\nhi");
    // Denied: nothing at all, not even the server's greeting, and no upstream connection.
    assert_eq!(exchange_from("127.0.0.2", proxy.addr()).await, b"");
    assert_eq!(exchange_from("127.0.0.3", proxy.addr()).await, b"hello\nhi");
    assert_eq!(stat(admin, "tcp_rbac_allowed"), 2);
    assert_eq!(stat(admin, "tcp_rbac_denied"), 1);
    assert_eq!(stat(admin, "tcp_rbac_shadow_allowed"), 1);
    assert_eq!(stat(admin, "tcp_rbac_shadow_denied"), 2);
    assert_eq!(stat(admin, "tcp_proxy_cx_total"), 2);

    // Rules that read a request are refused at load: a relayed connection has none.
    let bad = r#", rbac: { rules: { matchers: [{ name: p, action: deny, match: { path: { prefix: /x } } }] } }"#;
    let dir = ScratchDir::new();
    let path = dir.write("bad.yaml", &relay_config("", upstream, bad));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_legate"))
        .args(["validate", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tcp_proxy.rbac.rules") && stderr.contains("the path"),
        "{stderr}"
    );
}

/// Envoy Gateway's form from xDS: a network `rbac` filter in the matcher form before the
/// `tcp_proxy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_rbac_from_the_management_server() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
    use envoy_types::pb::envoy::config::core::v3::CidrRange;
    use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
    use envoy_types::pb::envoy::config::rbac::v3::{Action, rbac::Action as RbacAction};
    use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac;
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier,
    };
    use envoy_types::pb::envoy::extensions::matching::common_inputs::network::v3::SourceIpInput;
    use envoy_types::pb::envoy::extensions::matching::input_matchers::ip::v3::Ip;
    use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
    use envoy_types::pb::xds::r#type::matcher::v3::Matcher;
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::{
        FieldMatcher, Predicate, predicate,
    };
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::{
        MatcherList, MatcherType, OnMatch, on_match,
    };
    use testbed::xds::{any, type_url};

    let action = |name: &str, deny: bool| OnMatch {
        on_match: Some(on_match::OnMatch::Action(TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(any(&Action {
                name: if deny { "DENY" } else { "ALLOW" }.into(),
                action: if deny {
                    RbacAction::Deny
                } else {
                    RbacAction::Allow
                } as i32,
            })),
        })),
        ..Default::default()
    };
    let rbac = Rbac {
        stat_prefix: "tcp-10080".into(),
        matcher: Some(Matcher {
            matcher_type: Some(MatcherType::MatcherList(MatcherList {
                matchers: vec![FieldMatcher {
                    predicate: Some(Predicate {
                        match_type: Some(predicate::MatchType::SinglePredicate(
                            predicate::SinglePredicate {
                                input: Some(TypedExtensionConfig {
                                    name: "client_ip".into(),
                                    typed_config: Some(any(&SourceIpInput::default())),
                                }),
                                matcher: Some(predicate::single_predicate::Matcher::CustomMatch(
                                    TypedExtensionConfig {
                                        name: "ip_matcher".into(),
                                        typed_config: Some(any(&Ip {
                                            cidr_ranges: vec![CidrRange {
                                                address_prefix: "127.0.0.2".into(),
                                                prefix_len: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 32 }),
                                            }],
                                            stat_prefix: "client_ip".into(),
                                        })),
                                    },
                                )),
                            },
                        )),
                    }),
                    on_match: Some(action("deny-lab", true)),
                }],
            })),
            on_no_match: Some(Box::new(action("default", false))),
        }),
        ..Default::default()
    };
    let upstream = echo(b"hello\n").await;
    let server = testbed::ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut l = testbed::resources::listener("tcp", "127.0.0.1:0".parse().unwrap(), "unused");
    l.filter_chains[0].filters = vec![
        Filter {
            name: "envoy.filters.network.rbac".into(),
            config_type: Some(filter::ConfigType::TypedConfig(any(&rbac))),
        },
        Filter {
            name: "envoy.filters.network.tcp_proxy".into(),
            config_type: Some(filter::ConfigType::TypedConfig(any(&TcpProxy {
                stat_prefix: "tcp".into(),
                cluster_specifier: Some(ClusterSpecifier::Cluster("echo".into())),
                ..Default::default()
            }))),
        },
    ];
    server.set(type_url::LISTENER, vec![("tcp".into(), any(&l))]);
    let cluster = testbed::resources::eds_cluster("echo", LbPolicy::RoundRobin);
    server.set(type_url::CLUSTER, vec![("echo".into(), any(&cluster))]);
    let endpoints = testbed::resources::assignment("echo", &[upstream]);
    server.set(type_url::ENDPOINT, vec![("echo".into(), any(&endpoints))]);
    let proxy = Proxy::start(
        &format!(
            "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{}\" }} }}\n",
            server.local_addr()
        ),
        1,
    );
    let mut addr: Option<SocketAddr> = None;
    eventually("the listener in force", async || {
        let dump: serde_json::Value =
            serde_json::from_str(&admin_request(proxy.admin.unwrap(), "GET", "/config_dump").1)
                .unwrap();
        addr = (dump["listeners"].as_array().unwrap().iter())
            .find(|l| l["name"] == "tcp")
            .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
        addr.is_some()
    })
    .await;
    let addr = addr.unwrap();
    assert_eq!(exchange_from("127.0.0.1", addr).await, b"hello\nhi");
    assert_eq!(exchange_from("127.0.0.2", addr).await, b"");
    assert!(server.requests().iter().all(|r| !r.is_nack()));
    server.shutdown().await;
}
