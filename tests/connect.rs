//! CONNECT tunnels through the real binary, over HTTP/1.1 and HTTP/2: terminated (a TCP
//! connection to the cluster's host, then bytes relayed to a real echo server), forwarded (the
//! CONNECT goes on to an upstream proxy, whose 2xx opens the tunnel and whose refusal reaches
//! the client as it is), and refused (no `connect` on the route, no route, a dead host, a
//! target that is no authority).

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http::{Method, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP server echoing every byte until the client closes.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    addr
}

/// An upstream HTTP/1.1 proxy: it records each request head; a CONNECT to `refuse.test` gets
/// a 407 with a body, one to `see.fwd.test` a 303, any other a 200 and then an echo of the
/// tunnel's bytes.
async fn connect_proxy() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let refuse = head.starts_with("CONNECT refuse.test");
                let redirect = head.starts_with("CONNECT see.fwd.test");
                seen.lock().unwrap().push(head);
                if redirect {
                    let answer = "HTTP/1.1 303 See Other\r\nlocation: http://elsewhere.test/\r\ncontent-length: 0\r\n\r\n";
                    let _ = stream.write_all(answer.as_bytes()).await;
                    return;
                }
                if refuse {
                    let answer = "HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 6\r\n\r\ndenied";
                    let _ = stream.write_all(answer.as_bytes()).await;
                    return;
                }
                if stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.is_ok() {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                }
            });
        }
    });
    (addr, heads)
}

/// Reads a head up to its blank line, byte by byte (what follows is the tunnel's).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A TCP server that writes `tag` to each connection and closes it.
async fn tagging_server(tag: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.write_all(tag).await;
            });
        }
    });
    addr
}

fn config(
    echo: SocketAddr,
    upstream_proxy: SocketAddr,
    (a, b): (SocketAddr, SocketAddr),
    codec: &str,
) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http: {{ strip_host_port: any, http2_codec: {codec} }}
    routes:
      - match: {{ connect: true, host: "*.term.test" }}
        cluster: echo
        connect: terminate
      - match: {{ connect: true, host: dead.test }}
        cluster: dead
        connect: terminate
      - match: {{ connect: true, host: "*.fwd.test" }}
        cluster: upstream_proxy
        connect: forward
        regex_rewrite: {{ pattern: "^/(.*)", substitution: "/v1/\\1" }}
        internal_redirect: {{ redirect_response_codes: [303] }}
      - match: {{ connect: true, host: refuse.test }}
        cluster: upstream_proxy
        connect: forward
      - match: {{ connect: true, host: closed.test }}
        cluster: echo
      - match: {{ connect: true, host: who.test }}
        cluster: who
        connect: terminate
      - match: {{ connect: true, host: gone.test }}
        direct_response: {{ status: 503, body: "no backend\n" }}
      - match: {{ prefix: / }}
        direct_response: {{ status: 200, body: "a path route\n" }}
clusters:
  - name: echo
    endpoints: [{echo}]
  - name: upstream_proxy
    protocol: downstream
    endpoints: [{upstream_proxy}]
  - name: dead
    endpoints: [127.0.0.1:1]
  - name: who
    endpoints: [{a}, {b}]
    lb_policy: ring_hash
    hash_key: {{ header: x-user }}
"#
    )
}

/// The HTTP/2 codecs a listener may serve with: each serves tunnels alike.
const CODECS: [&str; 2] = ["hyper", "legate"];

/// The proxy, its HTTP/2 served by `codec`, and the heads its upstream proxy got.
async fn start(codec: &str) -> (Proxy, Arc<Mutex<Vec<String>>>) {
    let echo = echo_server().await;
    let (upstream_proxy, heads) = connect_proxy().await;
    let (a, b) = (tagging_server(b"A").await, tagging_server(b"B").await);
    (
        Proxy::start(&config(echo, upstream_proxy, (a, b), codec), 2),
        heads,
    )
}

/// Sends `CONNECT target` on a new HTTP/1.1 connection, with `early` right behind the head;
/// the answer's head and the connection.
async fn connect_h1(proxy: &Proxy, target: &str, early: &[u8]) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n").into_bytes();
    request.extend_from_slice(early);
    stream.write_all(&request).await.unwrap();
    let head = read_head(&mut stream).await;
    (head, stream)
}

/// `CONNECT target` as an HTTP/2 request (no :path, no :scheme).
fn connect_request(target: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .method(Method::CONNECT)
        .uri(target)
        .body(Empty::new())
        .unwrap()
}

/// Sends `CONNECT target` on an HTTP/2 connection: answered 200, its stream is the tunnel.
async fn tunnel_h2(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    target: &str,
) -> TokioIo<hyper::upgrade::Upgraded> {
    let mut response = sender.send_request(connect_request(target)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "CONNECT {target}");
    TokioIo::new(hyper::upgrade::on(&mut response).await.unwrap())
}

/// Writes `len` bytes through the tunnel while reading them back, and checks they are the
/// same: more than the proxy's buffers hold, so both directions move under backpressure.
async fn echoes<S: AsyncRead + AsyncWrite + Unpin>(tunnel: S, offset: u64, len: usize) {
    let sent = testbed::pattern_bytes(offset, len);
    let (mut read, mut write) = tokio::io::split(tunnel);
    let writing = {
        let sent = sent.clone();
        async move {
            write.write_all(&sent).await.unwrap();
            write
        }
    };
    let reading = async {
        let mut back = vec![0u8; len];
        read.read_exact(&mut back).await.unwrap();
        back
    };
    let (_write, back) = tokio::join!(writing, reading);
    assert!(back == sent[..], "the tunnel echoed {len} bytes unchanged");
}

#[tokio::test]
async fn a_terminated_connect_relays_bytes_to_the_clusters_host() {
    for codec in CODECS {
        a_terminated_connect_relays_bytes_to_the_clusters_host_on(codec).await;
    }
}

async fn a_terminated_connect_relays_bytes_to_the_clusters_host_on(codec: &str) {
    let (proxy, _) = start(codec).await;
    // HTTP/1.1, with bytes sent right behind the CONNECT: they are the tunnel's first.
    let (head, mut stream) = connect_h1(&proxy, "db.term.test:5432", b"early ").await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        !lower.contains("content-length") && !lower.contains("transfer-encoding"),
        "a 2xx to CONNECT frames no body: {head}"
    );
    let mut early = [0u8; 6];
    stream.read_exact(&mut early).await.unwrap();
    assert_eq!(&early, b"early ");
    echoes(stream, 3, 1 << 20).await;

    // HTTP/2: a CONNECT stream (no :path, no :scheme) becomes the tunnel once answered.
    let (mut sender, _conn) = h2_client::<Empty<Bytes>>(proxy.addr()).await;
    let tunnel = tunnel_h2(&mut sender, "db.term.test:5432").await;
    echoes(tunnel, 5, 256 << 10).await;
    // The client's END_STREAM is the host's end of input, and the host's close the stream's end.
    let mut tunnel = tunnel_h2(&mut sender, "db.term.test:5432").await;
    tunnel.write_all(b"last words").await.unwrap();
    tunnel.shutdown().await.unwrap();
    let mut back = Vec::new();
    let ended = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tunnel.read_to_end(&mut back),
    );
    ended.await.expect("the stream ends").unwrap();
    assert_eq!(back, b"last words");
    // A client gone mid-tunnel (its connection closed): its relay ends too.
    let (mut gone, gone_conn) = h2_client::<Empty<Bytes>>(proxy.addr()).await;
    let mut tunnel = tunnel_h2(&mut gone, "db.term.test:5432").await;
    tunnel.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).await.unwrap();
    let admin = proxy.admin.unwrap();
    assert!(stat(admin, "downstream_cx_upgrades_active") >= 1);
    // The connection goes first: no RST_STREAM can come from the client.
    gone_conn.abort();
    let _ = gone_conn.await;
    drop((tunnel, gone));
    eventually("every relay ends once its client has gone", async || {
        stat(admin, "downstream_cx_upgrades_active") == 0
    })
    .await;
    // A client that reset its stream while the relay waited for its window (it reads nothing,
    // with a 16-byte window): the relay ends too.
    let stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut stingy, stingy_conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(16)
            .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .unwrap();
    let stingy_conn = tokio::spawn(stingy_conn);
    let mut tunnel = tunnel_h2(&mut stingy, "db.term.test:5432").await;
    // The host echoes it all and closes; the client's side has ended, so only the relay's
    // write to the client is left, and it waits for window.
    tunnel.write_all(&[b'x'; 4096]).await.unwrap();
    tunnel.shutdown().await.unwrap();
    eventually("the relay is running", async || {
        stat(admin, "downstream_cx_upgrades_active") == 1
    })
    .await;
    drop(tunnel);
    eventually(
        "the relay ends once its client reset the stream",
        async || stat(admin, "downstream_cx_upgrades_active") == 0,
    )
    .await;
    stingy_conn.abort();

    assert!(stat(admin, "downstream_cx_upgrades_total") >= 2);
    // A request with a path does not take a CONNECT route.
    let response = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(text(response.into_body()).await, "a path route\n");
}

/// A terminated CONNECT's host is picked by the cluster's hash key, read from its headers.
#[tokio::test]
async fn a_terminated_connect_is_hashed_by_its_headers() {
    let (proxy, _) = start("hyper").await;
    let tag_for = async |user: &str| {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let request =
            format!("CONNECT who.test:1 HTTP/1.1\r\nhost: who.test:1\r\nx-user: {user}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let head = read_head(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        let mut tag = [0u8; 1];
        stream.read_exact(&mut tag).await.unwrap();
        tag[0]
    };
    let mut tags = std::collections::BTreeSet::new();
    for user in 0..16 {
        let user = format!("user-{user}");
        let first = tag_for(&user).await;
        for _ in 0..3 {
            assert_eq!(tag_for(&user).await, first, "{user} stays on one host");
        }
        tags.insert(first);
    }
    // Sixteen users all on one of two hosts: 1 in 2^15.
    assert_eq!(tags.len(), 2, "users spread over both hosts");
}

#[tokio::test]
async fn a_forwarded_connect_goes_upstream_and_its_answer_opens_the_tunnel() {
    for codec in CODECS {
        a_forwarded_connect_goes_upstream_and_its_answer_opens_the_tunnel_on(codec).await;
    }
}

async fn a_forwarded_connect_goes_upstream_and_its_answer_opens_the_tunnel_on(codec: &str) {
    let (proxy, heads) = start(codec).await;
    let (head, stream) = connect_h1(&proxy, "api.fwd.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    echoes(stream, 7, 256 << 10).await;
    let upstream_head = heads.lock().unwrap()[0].clone();
    assert!(
        upstream_head.starts_with("CONNECT api.fwd.test:443 HTTP/1.1\r\n"),
        "the upstream got the CONNECT with its authority, its port kept though the listener \
         strips ports, and no path rewritten into it: {upstream_head}"
    );
    assert!(
        upstream_head
            .to_ascii_lowercase()
            .contains("host: api.fwd.test:443\r\n"),
        "{upstream_head}"
    );

    // From HTTP/2: sent on as an HTTP/1.1 CONNECT.
    let (mut sender, _conn) = h2_client::<Empty<Bytes>>(proxy.addr()).await;
    let tunnel = tunnel_h2(&mut sender, "web.fwd.test:443").await;
    echoes(tunnel, 9, 64 << 10).await;
    let upstream_head = heads.lock().unwrap()[1].to_ascii_lowercase();
    assert!(
        upstream_head.starts_with("connect web.fwd.test:443 http/1.1\r\n")
            && upstream_head.contains("host: web.fwd.test:443\r\n"),
        "an HTTP/1.1 CONNECT with its host, though the cluster speaks the client's HTTP/2: \
         {upstream_head}"
    );

    // The upstream's refusal is the client's answer, body and all; no tunnel opens.
    let (head, mut stream) = connect_h1(&proxy, "refuse.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 407 "), "{head}");
    let mut body = Vec::new();
    stream.read_to_end(&mut body).await.unwrap();
    assert_eq!(
        body, b"denied",
        "the answer, then the connection closes: what the client sends next is no request"
    );
    assert_eq!(heads.lock().unwrap().len(), 3);

    // A redirect answering a CONNECT is the client's, though the route follows 303s.
    let (head, _) = connect_h1(&proxy, "see.fwd.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 303 "), "{head}");
    assert_eq!(heads.lock().unwrap().len(), 4, "nothing was sent elsewhere");
}

#[tokio::test]
async fn connects_a_route_does_not_take_are_refused() {
    for codec in CODECS {
        connects_a_route_does_not_take_are_refused_on(codec).await;
    }
}

async fn connects_a_route_does_not_take_are_refused_on(codec: &str) {
    let (proxy, _) = start(codec).await;
    let admin = proxy.admin.unwrap();
    // A route matching CONNECT without `connect`: 403, as Envoy's upgrade_failed.
    let (head, _) = connect_h1(&proxy, "closed.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close\r\n"),
        "the connection closes after a CONNECT that opened no tunnel, and says so: {head}"
    );
    // No CONNECT route for the host: path routes never take a CONNECT.
    let (head, _) = connect_h1(&proxy, "elsewhere.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    // The host cannot be reached: 503, flagged UF.
    let (head, _) = connect_h1(&proxy, "dead.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(stat(admin, "downstream_rq_upgrade_failed") >= 1);
    // A route answering by itself answers a CONNECT so too, unless with a 2xx.
    let (head, mut stream) = connect_h1(&proxy, "gone.test:443", b"").await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    let mut body = Vec::new();
    stream.read_to_end(&mut body).await.unwrap();
    assert_eq!(body, b"no backend\n");
    // What follows a CONNECT's head is the tunnel's: one declaring a body is refused.
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"CONNECT db.term.test:5432 HTTP/1.1\r\nhost: db.term.test:5432\r\ncontent-length: 4\r\n\r\nbody")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    // Over HTTP/2, refusals are the stream's answer.
    let (mut sender, _conn) = h2_client::<Empty<Bytes>>(proxy.addr()).await;
    for (target, status) in [
        ("closed.test:443", 403),
        ("elsewhere.test:443", 404),
        ("dead.test:443", 503),
    ] {
        let response = sender.send_request(connect_request(target)).await.unwrap();
        assert_eq!(response.status(), status, "{target}");
    }
    // A CONNECT's target is an authority; any other request's is a path.
    let (head, _) = connect_h1(&proxy, "/not-an-authority", b"").await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"GET db.term.test:5432 HTTP/1.1\r\nhost: db.term.test\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
}
