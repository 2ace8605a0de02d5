//! Who the client is, through the real binary: the PROXY protocol (v1 and v2, IPv4 and IPv6,
//! before TLS too) from a raw client, malformed headers refused, and `use_remote_address` with
//! `xff_num_trusted_hops` on the examples of Envoy's documentation. The client's address is
//! read back from the upstream (`x-forwarded-for`, a header the `headers` filter fills with
//! `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`) and from the access log.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use testbed::NoopUpstream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// A v2 PROXY header (`PROXY` command, TCP) from `source` to `destination`, with a TLV.
fn v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut addresses = Vec::new();
    let family = match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            addresses.extend_from_slice(&s.ip().octets());
            addresses.extend_from_slice(&d.ip().octets());
            0x11
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            addresses.extend_from_slice(&s.ip().octets());
            addresses.extend_from_slice(&d.ip().octets());
            0x21
        }
        _ => panic!("mixed families"),
    };
    addresses.extend_from_slice(&source.port().to_be_bytes());
    addresses.extend_from_slice(&destination.port().to_be_bytes());
    // A TLV the proxy does not know (an AWS VPC endpoint id): skipped.
    addresses.extend_from_slice(&[0xEA, 0, 5, 0x01, b'v', b'p', b'c', b'e']);
    let mut header = V2_SIGNATURE.to_vec();
    header.extend_from_slice(&[0x21, family]);
    header.extend_from_slice(&u16::try_from(addresses.len()).unwrap().to_be_bytes());
    header.extend_from_slice(&addresses);
    header
}

fn v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let family = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {family} {} {} {} {}\r\n",
        source.ip(),
        destination.ip(),
        source.port(),
        destination.port()
    )
    .into_bytes()
}

/// One HTTP/1.1 request on `io`.
async fn request_on<T>(io: T, req: Request<Full<Bytes>>) -> Response<Incoming>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender.send_request(req).await.unwrap()
}

/// A connection to `addr` that starts with `preamble`.
async fn connect_with(addr: SocketAddr, preamble: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(preamble).await.unwrap();
    stream
}

/// The value of `name` in an `x-noop-echo: headers` answer (empty when absent).
async fn echoed(response: Response<Incoming>, name: &str) -> String {
    echoed_all(response, &[name]).await.remove(0)
}

async fn echoed_all(response: Response<Incoming>, names: &[&str]) -> Vec<String> {
    assert_eq!(response.status(), 200);
    let body = text(response.into_body()).await;
    names
        .iter()
        .map(|name| {
            body.lines()
                .find_map(|line| line.strip_prefix(&format!("{name}: ")))
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn echo_get(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut all = vec![("x-noop-echo", "headers")];
    all.extend_from_slice(headers);
    get(path, &all)
}

async fn upstream() -> testbed::NoopHandle {
    NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_headers_name_the_client() {
    let backend = upstream().await;
    let logs = ScratchDir::new();
    let log = logs.0.join("access.log");
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: behind-nlb
    address: 127.0.0.1:0
    proxy_protocol: {{}}
    access_log:
      path: "{}"
      format: "%PATH% %DOWNSTREAM_REMOTE_ADDRESS%\n"
    http_filters:
      - headers: {{ request: {{ set: {{ x-client: "%DOWNSTREAM_REMOTE_ADDRESS%" }} }} }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        log.display(),
        backend.local_addr()
    );
    let proxy = Proxy::start(&config, 2);
    let at = proxy.addr();
    let here: SocketAddr = "10.0.0.1:8080".parse().unwrap();
    let here6: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "/v1-ipv4",
            v1("203.0.113.9:56324".parse().unwrap(), here),
            "203.0.113.9:56324",
        ),
        (
            "/v1-ipv6",
            v1("[2001:db8::9]:1234".parse().unwrap(), here6),
            "[2001:db8::9]:1234",
        ),
        (
            "/v2-ipv4",
            v2("198.51.100.7:4242".parse().unwrap(), here),
            "198.51.100.7:4242",
        ),
        (
            "/v2-ipv6",
            v2("[2001:db8::5]:5555".parse().unwrap(), here6),
            "[2001:db8::5]:5555",
        ),
    ];
    for (path, header, client) in &cases {
        let ip = client.rsplit_once(':').unwrap().0.trim_matches(['[', ']']);
        // Two requests on the connection: the address holds for its life.
        let stream = connect_with(at, header).await;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        for _ in 0..2 {
            // The connection is ready again once hyper has seen the last response's end.
            sender.ready().await.unwrap();
            let response = sender.send_request(echo_get(path, &[])).await.unwrap();
            let seen = echoed_all(response, &["x-forwarded-for", "x-client"]).await;
            assert_eq!(seen, [ip.to_string(), client.to_string()], "{path}");
        }
    }
    // HTTP/2 with prior knowledge after the header.
    let stream = connect_with(at, &v2("192.0.2.44:1000".parse().unwrap(), here)).await;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(get_h2("/v2-h2", &[("x-noop-echo", "headers")]))
        .await
        .unwrap();
    assert_eq!(echoed(response, "x-forwarded-for").await, "192.0.2.44");
    // A header without an address (v1 UNKNOWN, v2 LOCAL): the peer stands.
    let unknown = connect_with(at, b"PROXY UNKNOWN\r\n").await;
    let response = request_on(unknown, echo_get("/unknown", &[])).await;
    assert_eq!(echoed(response, "x-forwarded-for").await, "127.0.0.1");
    let mut local = V2_SIGNATURE.to_vec();
    local.extend_from_slice(&[0x20, 0x00, 0, 0]);
    let local = connect_with(at, &local).await;
    let response = request_on(local, echo_get("/local", &[])).await;
    assert_eq!(echoed(response, "x-forwarded-for").await, "127.0.0.1");

    // The access log names the same clients.
    eventually("the access log has every request", async || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 11)
    })
    .await;
    let logged = std::fs::read_to_string(&log).unwrap();
    for (path, _, client) in &cases {
        assert_eq!(
            logged.matches(&format!("{path} {client}\n")).count(),
            2,
            "{path} in:\n{logged}"
        );
    }
    assert!(logged.contains("/v2-h2 192.0.2.44:1000\n"), "{logged}");
    assert!(logged.contains("/unknown 127.0.0.1:"), "{logged}");
    assert_eq!(
        stat(proxy.admin.unwrap(), "downstream_cx_proxy_proto_error"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_protocol_header_comes_before_tls() {
    let backend = upstream().await;
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = ScratchDir::new();
    let cert_path = dir.write("edge.pem", &cert.cert.pem());
    let key_path = dir.write("edge.key", &cert.signing_key.serialize_pem());
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: tls
    address: 127.0.0.1:0
    proxy_protocol: {{ versions: [v2] }}
    tls:
      certificates: [{{ cert_chain: "{}", private_key: "{}" }}]
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        cert_path.display(),
        key_path.display(),
        backend.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();

    let header = v2(
        "[2001:db8::77]:2000".parse().unwrap(),
        "[2001:db8::1]:443".parse().unwrap(),
    );
    let stream = connect_with(proxy.addr(), &header).await;
    let stream = connector.connect(name.clone(), stream).await.unwrap();
    let response = request_on(stream, echo_get("/", &[])).await;
    let seen = echoed_all(response, &["x-forwarded-for", "x-forwarded-proto"]).await;
    assert_eq!(seen, ["2001:db8::77", "https"]);

    // Without the header, the handshake never starts: the connection is closed.
    let stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let failed = tokio::time::timeout(
        Duration::from_secs(20),
        connector.connect(name.clone(), stream),
    )
    .await
    .unwrap();
    assert!(failed.is_err());
    // A v1 header where only v2 is accepted: refused too.
    let stream = connect_with(
        proxy.addr(),
        &v1(
            "192.0.2.1:1".parse().unwrap(),
            "192.0.2.2:2".parse().unwrap(),
        ),
    )
    .await;
    assert!(connector.connect(name, stream).await.is_err());
    assert_eq!(
        stat_settled(proxy.admin.unwrap(), "downstream_cx_proxy_proto_error", 2),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_headers_are_refused_and_an_optional_header_may_be_left_out() {
    let backend = upstream().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: required
    address: 127.0.0.1:0
    proxy_protocol: {{ versions: [v1, v2], required: true }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
  - name: optional
    address: 127.0.0.1:0
    proxy_protocol: {{ required: false }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        backend.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let (required, optional) = (proxy.addrs[0], proxy.addrs[1]);
    let mut bad_family = V2_SIGNATURE.to_vec();
    bad_family.extend_from_slice(&[0x21, 0x71, 0, 0]);
    let mut too_long = V2_SIGNATURE.to_vec();
    too_long.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
    let refused: Vec<(&str, Vec<u8>)> = vec![
        ("no header", b"GET / HTTP/1.1\r\nhost: a\r\n\r\n".to_vec()),
        (
            "bad address",
            b"PROXY TCP4 300.1.2.3 10.0.0.1 1 2\r\n".to_vec(),
        ),
        (
            "bad port",
            b"PROXY TCP4 192.0.2.1 10.0.0.1 99999 2\r\n".to_vec(),
        ),
        (
            "LF only",
            b"PROXY TCP4 192.0.2.1 10.0.0.1 1 2\nGET /".to_vec(),
        ),
        ("v1 too long", [&b"PROXY TCP4 "[..], &[b'1'; 200]].concat()),
        ("bad v2 family", bad_family),
        ("v2 too long", too_long),
    ];
    for (what, bytes) in &refused {
        let mut stream = connect_with(required, bytes).await;
        let answer = tokio::time::timeout(Duration::from_secs(20), read_until_closed(&mut stream))
            .await
            .unwrap();
        assert!(
            answer.is_empty(),
            "{what}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    let admin = proxy.admin.unwrap();
    let expected = refused.len() as i64;
    assert_eq!(
        stat_settled(admin, "downstream_cx_proxy_proto_error", expected),
        expected
    );

    // Where the header is optional, a client without one is served with every byte it sent,
    // also when its first bytes could have begun a header, sent one at a time.
    let response = send_h1(optional, echo_get("/plain", &[])).await;
    assert_eq!(echoed(response, "x-forwarded-for").await, "127.0.0.1");
    let request =
        b"PROPFIND /dav HTTP/1.1\r\nhost: a\r\nx-noop-echo: headers\r\nconnection: close\r\n\r\n";
    let mut stream = TcpStream::connect(optional).await.unwrap();
    stream.set_nodelay(true).unwrap();
    for byte in request {
        stream.write_all(&[*byte]).await.unwrap();
        stream.flush().await.unwrap();
    }
    let answer = String::from_utf8(read_until_closed(&mut stream).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("PROPFIND /dav HTTP/1.1"), "{answer}");
    // And a header is still read when one comes.
    let header = v1(
        "192.0.2.200:7".parse().unwrap(),
        "192.0.2.1:80".parse().unwrap(),
    );
    let response = request_on(connect_with(optional, &header).await, echo_get("/", &[])).await;
    assert_eq!(echoed(response, "x-forwarded-for").await, "192.0.2.200");
    assert_eq!(stat(admin, "downstream_cx_proxy_proto_error"), expected);
}

/// The rows of the x-forwarded-for table in Envoy's documentation (examples 1 to 4), with
/// the downstream address set by a PROXY header, and what happens when too few proxies are in
/// front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_hops_pick_the_client_as_envoy_does() {
    let backend = upstream().await;
    let listener = |name: &str, use_remote_address: bool, hops: u32| {
        format!(
            r#"  - name: {name}
    address: 127.0.0.1:0
    proxy_protocol: {{}}
    http: {{ use_remote_address: {use_remote_address}, xff_num_trusted_hops: {hops} }}
    http_filters:
      - headers: {{ request: {{ set: {{ x-client: "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%" }} }} }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
"#
        )
    };
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}\nlisteners:\n{}{}{}{}clusters:\n  - name: backend\n    endpoints: [{}]\n",
        listener("edge", true, 0),
        listener("internal", false, 0),
        listener("edge-behind-two", true, 2),
        listener("internal-behind-two", false, 2),
        backend.local_addr()
    );
    let proxy = Proxy::start(&config, 2);
    let [edge, internal, edge2, internal2] = proxy.addrs[..] else {
        panic!("four listeners");
    };
    let from = |ip: &str| {
        v1(
            format!("{ip}:40000").parse().unwrap(),
            "10.0.0.1:80".parse().unwrap(),
        )
    };
    let ask = async |at: SocketAddr, peer: &str, xff: Option<&str>, proto: Option<&str>| {
        let mut headers = Vec::new();
        if let Some(xff) = xff {
            headers.push(("x-forwarded-for", xff));
        }
        if let Some(proto) = proto {
            headers.push(("x-forwarded-proto", proto));
        }
        let stream = connect_with(at, &from(peer)).await;
        let response = request_on(stream, echo_get("/", &headers)).await;
        echoed_all(
            response,
            &["x-client", "x-forwarded-for", "x-forwarded-proto"],
        )
        .await
    };
    let three = "203.0.113.128, 203.0.113.10, 203.0.113.1";
    let four = "203.0.113.128, 203.0.113.10, 203.0.113.1, 192.0.2.5";

    // 1: an edge proxy with nothing trusted in front: the peer, appended.
    assert_eq!(
        ask(edge, "192.0.2.5", Some(three), Some("https")).await,
        ["192.0.2.5", four, "http"]
    );
    // 2: an internal proxy behind that edge: the last entry; the header goes on as it came.
    // No proxy is trusted, so x-forwarded-proto is the listener's own.
    assert_eq!(
        ask(internal, "10.11.12.13", Some(four), Some("https")).await,
        ["192.0.2.5", four, "http"]
    );
    // 3: an edge proxy behind two trusted proxies: the second entry from the right of the
    // header as it came; their x-forwarded-proto is believed.
    assert_eq!(
        ask(edge2, "192.0.2.5", Some(three), Some("https")).await,
        ["203.0.113.10", four, "https"]
    );
    // 4: an internal proxy behind the edge of 3.
    assert_eq!(
        ask(internal2, "10.11.12.13", Some(four), Some("https")).await,
        ["203.0.113.10", four, "https"]
    );
    assert_eq!(
        ask(internal2, "10.11.12.13", Some(four), None).await,
        ["203.0.113.10", four, "http"]
    );
    // Fewer entries than trusted hops, or one that is no address: the peer is the client.
    assert_eq!(
        ask(edge2, "192.0.2.5", Some("203.0.113.1"), None).await,
        ["192.0.2.5", "203.0.113.1, 192.0.2.5", "http"]
    );
    assert_eq!(
        ask(internal, "10.11.12.13", None, None).await,
        ["10.11.12.13", "", "http"]
    );
    assert_eq!(
        ask(internal, "10.11.12.13", Some("unknown"), None).await,
        ["10.11.12.13", "unknown", "http"]
    );
}
