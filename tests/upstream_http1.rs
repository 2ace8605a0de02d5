//! The upstream side of HTTP/1.1 on real sockets, against scripted upstreams: response heads
//! split anywhere, interim responses, chunk extensions and trailers, bodies delimited by the
//! close, oversized heads, upstreams that close early or while idle, and request bodies sent
//! chunked with their trailers.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const BOUND: Duration = Duration::from_secs(20);

/// What the scripted upstream does with each request head it reads on a connection.
#[derive(Clone, Copy)]
enum Script {
    /// Writes `reply` whole, and keeps the connection.
    Reply(&'static [u8]),
    /// Writes `reply` a byte at a time, and keeps the connection.
    ByteByByte(&'static [u8]),
    /// Writes `reply`, then closes the connection.
    ReplyAndClose(&'static [u8]),
}

/// A scripted upstream: counts connections, reports each request it reads (head and what
/// followed it within the same reads, once the head's body is in) and the closes it makes.
struct Upstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: mpsc::UnboundedReceiver<Vec<u8>>,
    closed: mpsc::UnboundedReceiver<()>,
}

impl Upstream {
    async fn start(script: Script) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let counter = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let requests = requests_tx.clone();
                let closed = closed_tx.clone();
                tokio::spawn(serve(socket, script, requests, closed));
            }
        });
        Upstream {
            addr,
            connections,
            requests,
            closed,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Reads request heads (and a body, by its length or to its last chunk) and answers each.
async fn serve(
    mut socket: TcpStream,
    script: Script,
    requests: mpsc::UnboundedSender<Vec<u8>>,
    closed: mpsc::UnboundedSender<()>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        let whole = if let Some(len) = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
        {
            end + 4 + len.trim().parse::<usize>().unwrap()
        } else if head.contains("transfer-encoding: chunked") {
            // Up to the last chunk and its trailer section.
            find_chunked_end(&buf[end + 4..]).map_or(usize::MAX, |len| end + 4 + len)
        } else {
            end + 4
        };
        if buf.len() < whole {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        }
        let request: Vec<u8> = buf.drain(..whole).collect();
        let _ = requests.send(request);
        match script {
            Script::Reply(reply) => {
                if socket.write_all(reply).await.is_err() {
                    return;
                }
            }
            Script::ByteByByte(reply) => {
                let _ = socket.set_nodelay(true);
                for byte in reply {
                    if socket.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    socket.flush().await.unwrap();
                }
            }
            Script::ReplyAndClose(reply) => {
                let _ = socket.write_all(reply).await;
                drop(socket);
                let _ = closed.send(());
                return;
            }
        }
    }
}

/// The length of a chunked body at the front of `body`, once its last chunk and trailer
/// section are all there.
fn find_chunked_end(body: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line_end = at + body[at..].windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[at..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailer fields, then an empty line.
            let end = body[at..].windows(2).position(|w| w == b"\r\n")?;
            if end == 0 {
                return Some(at + 2);
            }
            let rest = at + body[at..].windows(4).position(|w| w == b"\r\n\r\n")?;
            return Some(rest + 4);
        }
        at += size + 2;
        if at > body.len() {
            return None;
        }
    }
}

/// One request over a fresh client connection; what the proxy sends back until it closes.
async fn exchange(proxy: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    String::from_utf8_lossy(&read_until_closed(&mut stream).await).into_owned()
}

const GET_CLOSE: &[u8] = b"GET /x HTTP/1.1\r\nhost: legate.test\r\nconnection: close\r\n\r\n";

fn proxy_for(upstream: &Upstream) -> Proxy {
    Proxy::start(&forward_config(&[upstream.addr], ""), 1)
}

/// What a client gets for one GET through a proxy in front of an upstream following `script`.
async fn answer_to_get(script: Script) -> String {
    let upstream = Upstream::start(script).await;
    let proxy = proxy_for(&upstream);
    exchange(proxy.addr(), GET_CLOSE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_sent_a_byte_at_a_time_is_relayed() {
    let answer = answer_to_get(Script::ByteByByte(
        b"HTTP/1.1 200 OK\r\nx-split: yes\r\ncontent-length: 5\r\n\r\nhello",
    ))
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("x-split: yes\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_responses_are_skipped_for_the_final_one() {
    let answer = answer_to_get(Script::Reply(
        b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
    )).await;
    assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_responses_lose_their_extensions_and_keep_their_trailers() {
    let answer = answer_to_get(Script::Reply(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: 42\r\n\r\n",
    )).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(!answer.contains("name=value"), "{answer}");
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    let decoded: String = body
        .split("\r\n")
        .collect::<Vec<_>>()
        .chunks(2)
        .take_while(|pair| pair[0] != "0")
        .map(|pair| pair[1])
        .collect();
    assert_eq!(decoded, "hello world");
    assert!(body.contains("\r\n0\r\nx-checksum: 42\r\n\r\n"), "{body:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_delimited_by_the_close_is_relayed_whole_on_a_connection_not_reused() {
    let mut upstream = Upstream::start(Script::ReplyAndClose(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it, to the end",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    for _ in 0..2 {
        let answer = exchange(proxy.addr(), GET_CLOSE).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        // Re-framed for the client (chunked), with every byte.
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(body.contains("all of it, to the end"), "{body:?}");
        upstream.closed.recv().await.unwrap();
    }
    assert_eq!(upstream.connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_reused_and_one_the_upstream_closed_while_idle_is_replaced() {
    // Kept: three requests, one connection.
    let upstream = Upstream::start(Script::Reply(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    for _ in 0..3 {
        let response = send_h1(proxy.addr(), get("/x", &[])).await;
        assert_eq!(response.status(), 200);
        assert_eq!(text(response.into_body()).await, "ok");
    }
    assert_eq!(upstream.connections(), 1);
    drop(proxy);

    // Closed by the upstream after each answer (which said nothing of it): the pooled
    // connection is found closed when the next request would use it, and that request goes
    // on a new connection instead of failing.
    let mut upstream = Upstream::start(Script::ReplyAndClose(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    for _ in 0..3 {
        let response = send_h1(proxy.addr(), get("/x", &[])).await;
        assert_eq!(response.status(), 200);
        assert_eq!(text(response.into_body()).await, "ok");
        upstream.closed.recv().await.unwrap();
    }
    assert_eq!(upstream.connections(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_response_head_is_502() {
    static HEAD: std::sync::LazyLock<&'static [u8]> = std::sync::LazyLock::new(|| {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..90 {
            head.extend(format!("x-big-{i}: {}\r\n", "v".repeat(1000)).bytes());
        }
        head.extend(b"content-length: 0\r\n\r\n");
        head.leak()
    });
    let answer = answer_to_get(Script::Reply(&HEAD)).await;
    assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_mid_body_cuts_the_clients_response_short() {
    let upstream = Upstream::start(Script::ReplyAndClose(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    let answer = exchange(
        proxy.addr(),
        b"GET /x HTTP/1.1\r\nhost: legate.test\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("content-length: 100\r\n"), "{answer}");
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    // The client sees the connection close before the length it was promised.
    assert_eq!(body, "only ten b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_upload_reaches_the_upstream_chunked_with_its_declared_trailers() {
    let mut upstream = Upstream::start(Script::Reply(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    // Declared: x-sum (sent) and authorization (never sent as a trailer); x-undeclared is
    // not declared (not sent).
    let answer = exchange(
        proxy.addr(),
        b"POST /up HTTP/1.1\r\nhost: legate.test\r\nconnection: close\r\ntrailer: x-sum, authorization\r\ntransfer-encoding: chunked\r\n\r\n4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nx-sum: 7\r\nauthorization: secret\r\nx-undeclared: 1\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let request = tokio::time::timeout(BOUND, upstream.requests.recv())
        .await
        .unwrap()
        .unwrap();
    let request = String::from_utf8(request).unwrap();
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_lowercase().contains("transfer-encoding: chunked"),
        "{head}"
    );
    assert_eq!(body, "4\r\nabcd\r\n3\r\nefg\r\n0\r\nx-sum: 7\r\n\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_known_length_reaches_the_upstream_with_it() {
    let mut upstream = Upstream::start(Script::Reply(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    // The body arrives in two writes; the upstream gets it whole, with its length.
    stream
        .write_all(b"PUT /up HTTP/1.1\r\nhost: legate.test\r\nconnection: close\r\ncontent-length: 11\r\n\r\nhello")
        .await
        .unwrap();
    stream.write_all(b" world").await.unwrap();
    let answer = String::from_utf8_lossy(&read_until_closed(&mut stream).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let request = tokio::time::timeout(BOUND, upstream.requests.recv())
        .await
        .unwrap()
        .unwrap();
    let request = String::from_utf8(request).unwrap();
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    assert!(head.to_lowercase().contains("content-length: 11"), "{head}");
    assert!(!head.to_lowercase().contains("transfer-encoding"), "{head}");
    assert_eq!(body, "hello world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_of_protocols_nobody_asked_for_is_502_and_the_connection_dropped() {
    let upstream = Upstream::start(Script::Reply(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: something\r\nconnection: upgrade\r\n\r\n",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    for _ in 0..2 {
        let answer = exchange(proxy.addr(), GET_CLOSE).await;
        assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
    }
    // Never pooled: each request had a connection of its own.
    assert_eq!(upstream.connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_the_upstream_closes_is_closed_at_once() {
    // The answer keeps the connection; the upstream closes it right after.
    let mut upstream = Upstream::start(Script::ReplyAndClose(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    let admin = proxy.admin.unwrap();
    let response = send_h1(proxy.addr(), get("/x", &[])).await;
    assert_eq!(text(response.into_body()).await, "ok");
    upstream.closed.recv().await.unwrap();
    // No request comes to find it closed: the proxy notices by itself, and the connection
    // (and its max_connections slot) is given up.
    let open = tokio::task::spawn_blocking(move || stat_settled(admin, "upstream_cx_active", 0))
        .await
        .unwrap();
    assert_eq!(open, 0);
}

/// RFC 9110 section 8.6: repeated Content-Length fields, or a list of the same value, go on
/// as one field with one value, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_content_lengths_go_on_as_one_field_both_ways() {
    let mut upstream = Upstream::start(Script::Reply(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2, 2\r\n\r\nok",
    ))
    .await;
    let proxy = proxy_for(&upstream);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"PUT /up HTTP/1.1\r\nhost: legate.test\r\nconnection: close\r\ncontent-length: 5\r\ncontent-length: 5, 5\r\n\r\nhello")
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&read_until_closed(&mut stream).await).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert_eq!(
        head.to_lowercase().matches("content-length").count(),
        1,
        "{head}"
    );
    assert!(
        head.to_lowercase().contains("content-length: 2\r\n")
            || head.to_lowercase().ends_with("content-length: 2"),
        "{head}"
    );
    assert_eq!(body, "ok");
    let request = tokio::time::timeout(BOUND, upstream.requests.recv())
        .await
        .unwrap()
        .unwrap();
    let request = String::from_utf8(request).unwrap();
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    let lengths: Vec<&str> = head
        .lines()
        .filter(|l| l.to_lowercase().starts_with("content-length:"))
        .collect();
    assert_eq!(lengths.len(), 1, "{head}");
    assert_eq!(lengths[0].split_once(':').unwrap().1.trim(), "5", "{head}");
    assert_eq!(body, "hello");
}
