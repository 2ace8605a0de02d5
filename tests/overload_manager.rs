//! The overload manager through the real binary: as open connections or resident memory
//! near their limits, responses stop keeping connections alive, then new connections are
//! refused, then new requests get 503 with `x-legate-overloaded`; `/ready` says which, and
//! every action ends again when the pressure falls.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use common::*;
use testbed::NoopUpstream;

fn ready(admin: SocketAddr) -> (u16, String) {
    admin_request(admin, "GET", "/ready")
}

/// Polls `/ready` (for up to 20 s) until `check` holds, and returns what it last said.
fn ready_until(admin: SocketAddr, what: &str, check: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, body) = ready(admin);
        if check(status, &body) {
            return (status, body);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}; /ready said {status} {body:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `overload_action_applied_total{action="ACTION"}`.
fn applied(admin: SocketAddr, action: &str) -> i64 {
    let (_, text) = admin_request(admin, "GET", "/stats?filter=overload_action_applied_total");
    text.lines()
        .filter(|l| !l.contains("worker=") && l.contains(&format!("action=\"{action}\"")))
        .filter_map(|l| l.rsplit(": ").next()?.parse::<i64>().ok())
        .sum()
}

/// An idle HTTP/1.1 connection the proxy has accepted (a first request proves it).
fn open_connection(proxy: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(proxy).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    stream
}

/// One keep-alive GET on `stream`: the response head, lower-cased.
fn exchange(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: legate\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    // The body is "ok\n".
    let mut body = [0u8; 3];
    let _ = stream.read_exact(&mut body);
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

fn config(upstream: SocketAddr, overload: &str) -> String {
    forward_config(&[upstream], "") + &format!("overload: {{ {overload} }}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_pressure_turns_the_actions_on_in_order_and_off_again() {
    let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
    let settings = "connection_limit: 10, memory_limit: 64GiB, interval: 20ms";
    let proxy = Proxy::start(&config(upstream.local_addr(), settings), 1);
    let admin = proxy.admin.unwrap();
    assert_eq!(ready(admin), (200, "LIVE\n".to_string()));

    // 8 of 10: responses close their connections.
    let mut open: Vec<TcpStream> = (0..8).map(|_| open_connection(proxy.addr())).collect();
    let (status, body) = ready_until(admin, "keep-alive is off", |_, b| {
        b.contains("disable_keepalive")
    });
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("connections at 80%"), "{body}");
    let head = exchange(&mut open[0]);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(applied(admin, "disable_keepalive") >= 1);
    // The proxy closes it: 7 of 10, below where keep-alive went off less the margin.
    let mut rest = Vec::new();
    let _ = open[0].read_to_end(&mut rest);
    open.remove(0);
    ready_until(admin, "the closed connection is counted out", |s, b| {
        s == 200 && b == "LIVE\n"
    });

    // 9 of 10 (the closed one replaced, and one more): new connections are refused.
    open.push(open_connection(proxy.addr()));
    open.push(open_connection(proxy.addr()));
    let (_, body) = ready_until(admin, "connections are refused", |s, _| s == 503);
    assert!(
        body.starts_with("OVERLOADED\n")
            && body.contains("disable_keepalive, refuse_connections")
            && !body.contains("shed_requests"),
        "{body}"
    );
    let mut refused = TcpStream::connect(proxy.addr()).unwrap();
    refused
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let _ = refused.write_all(b"GET /healthz HTTP/1.1\r\nhost: legate\r\n\r\n");
    let mut answer = Vec::new();
    let _ = refused.read_to_end(&mut answer);
    assert!(answer.is_empty(), "a refused connection was answered");
    assert_eq!(stat_settled_labelled(admin, "refuse_connections", 1), 1);

    // Back to 8: refusing ends (below 85%), keep-alive stays off (above 75%).
    open.truncate(8);
    let (_, body) = ready_until(admin, "connections are taken again", |s, _| s == 200);
    assert!(
        body.contains("disable_keepalive") && !body.contains("refuse_connections"),
        "{body}"
    );
    // Down to 6: nothing is in force, and connections are kept alive again.
    open.truncate(6);
    ready_until(admin, "the overload eased", |s, b| {
        s == 200 && b == "LIVE\n"
    });
    let head = exchange(&mut open[0]);
    assert!(!head.contains("connection: close"), "{head}");
    assert_eq!(applied(admin, "shed_requests"), 0);
}

/// A listener with `bypass_overload_manager` (a health-check port) is left alone by every
/// action: its connections are taken, kept alive and served while the other listener's are
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_bypasses_the_overload_manager_keeps_serving() {
    let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
    let health = "  - name: health\n    address: 127.0.0.1:0\n    bypass_overload_manager: true\n    routes:\n      - match: { path: /healthz }\n        direct_response: { status: 200, body: \"ok\\n\" }\n";
    let base = config(
        upstream.local_addr(),
        "connection_limit: 10, memory_limit: 64GiB, interval: 20ms",
    );
    let yaml = base.replacen("clusters:\n", &format!("{health}clusters:\n"), 1);
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    let (main, health) = (proxy.addrs[0], proxy.addrs[1]);

    let _open: Vec<TcpStream> = (0..9).map(|_| open_connection(main)).collect();
    ready_until(admin, "connections are refused", |s, _| s == 503);
    let mut refused = open_connection(main);
    let _ = refused.write_all(b"GET /healthz HTTP/1.1\r\nhost: legate\r\n\r\n");
    let mut answer = Vec::new();
    let _ = refused.read_to_end(&mut answer);
    assert!(answer.is_empty(), "a refused connection was answered");

    // 10 of 10 with it: requests would be shed too, but not this listener's.
    let mut kept = open_connection(health);
    for _ in 0..2 {
        let head = exchange(&mut kept);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        assert!(!head.contains("x-legate-overloaded"), "{head}");
    }
}

fn stat_settled_labelled(admin: SocketAddr, action: &str, expected: i64) -> i64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let value = applied(admin, action);
        if value == expected || std::time::Instant::now() > deadline {
            return value;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn resident_bytes(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_drive_memory_up_until_requests_are_shed() {
    let held = HeldUpstream::start().await;
    let yaml = |limit: u64| {
        config(
            held.addr,
            &format!("memory_limit: {limit}, connection_limit: 100000, interval: 20ms"),
        )
    };
    let proxy = Proxy::start(&yaml(64 << 30), 1);
    let admin = proxy.admin.unwrap();
    // A reload first, so that the measured baseline includes what one costs.
    proxy.rewrite_config(&yaml(63 << 30));
    assert_eq!(admin_request(admin, "POST", "/reload").0, 200);
    // The limit puts the proxy at about 60% of it: below every action, and far enough below
    // that what the allocator keeps after the uploads does not hold an action on.
    let limit = resident_bytes(proxy.pid()) * 100 / 60;
    proxy.rewrite_config(&yaml(limit));
    assert_eq!(admin_request(admin, "POST", "/reload").0, 200);
    ready_until(admin, "the new limit is measured against", |s, b| {
        s == 200 && b == "LIVE\n"
    });

    // Connections opened before the pressure: uploads keep coming on them after new
    // connections are refused.
    let mut idle: Vec<TcpStream> = (0..400).map(|_| open_connection(proxy.addr())).collect();
    let accepted = stat_settled(admin, "downstream_cx_active", 400);
    assert_eq!(accepted, 400);
    let mut uploads = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let mut shedding = false;
    while idle.len() > 1 && !shedding {
        let mut upload = idle.pop().unwrap();
        upload
            .write_all(b"POST /upload HTTP/1.1\r\nhost: legate\r\ncontent-length: 1048576\r\n\r\n")
            .unwrap();
        upload.write_all(&[b'x'; 32 * 1024]).unwrap();
        uploads.push(upload);
        // The upload reaches the upstream, or the proxy has started shedding (and answered
        // it with a 503).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let actions = loop {
            let (_, body) = ready(admin);
            let actions = body.lines().nth(1).unwrap_or("").to_string();
            if held.arrived() >= uploads.len() || actions.contains("shed_requests") {
                break actions;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "upload {} went nowhere",
                uploads.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        if seen.last() != Some(&actions) {
            seen.push(actions.clone());
        }
        shedding = actions.contains("shed_requests");
    }
    assert!(shedding, "never shed; /ready went through {seen:?}");
    eprintln!(
        "shedding after {} uploads; /ready went through {seen:?}",
        uploads.len()
    );
    // Each step came after the one before it.
    let order = ["disable_keepalive", "refuse_connections", "shed_requests"];
    let rank = |s: &String| order.iter().filter(|a| s.contains(*a)).count();
    assert!(
        seen.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])),
        "{seen:?}"
    );
    assert!(seen.last().unwrap().contains("memory at"), "{seen:?}");

    // A new request is shed, at once and said to be.
    let head = exchange(&mut idle[0]);
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(head.contains("x-legate-overloaded: true"), "{head}");
    assert!(applied(admin, "shed_requests") >= 1);
    assert_eq!(ready(admin).0, 503);

    // The uploads end: memory falls, and every action ends.
    held.release();
    drop(uploads);
    drop(idle);
    ready_until(admin, "the overload eased", |s, b| {
        s == 200 && b == "LIVE\n"
    });
    let head = exchange(&mut open_connection(proxy.addr()));
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
}

/// `server_descriptors_in_use` (and its share of the limit) when it has counted at least
/// `at_least`: (in use, percent of the limit, the limit), read from one scrape.
fn descriptors_when(admin: SocketAddr, at_least: i64) -> (i64, i64, i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, text) = admin_request(admin, "GET", "/stats?filter=descriptor");
        let value = |key: &str| {
            text.lines()
                .find(|l| l.starts_with(key) && !l.contains("worker="))
                .and_then(|l| l.rsplit(": ").next()?.parse::<i64>().ok())
                .unwrap_or(-2)
        };
        let found = (
            value("server_descriptors_in_use:"),
            value("overload_resource_pressure_percent{resource=\"descriptors\"}:"),
            value("server_descriptor_limit:"),
        );
        // The gauges are set one after the other: a scrape in between reads a count and the
        // share of the one before.
        if found.0 >= at_least && found.1 == found.0 * 100 / found.2.max(1) {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never counted {at_least} descriptors: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The overload manager counts every descriptor the process holds against the open-file
/// limit: a request in flight holds its client's and its upstream connection's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_of_clients_and_upstream_connections_are_counted_against_the_limit() {
    let held = HeldUpstream::start().await;
    let yaml = config(held.addr, "memory_limit: 64GiB, interval: 10ms");
    let proxy = Proxy::start_with_open_files(&yaml, 2, 1024);
    let (addr, admin) = (proxy.addr(), proxy.admin.unwrap());
    let (before, _, limit) = descriptors_when(admin, 1);
    assert_eq!(limit, 1024);

    const REQUESTS: usize = 100;
    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| {
            tokio::spawn(async move {
                let response = send_h1(addr, get("/", &[])).await;
                (response.status(), text(response.into_body()).await)
            })
        })
        .collect();
    held.wait_for_requests(REQUESTS).await;
    assert_eq!(held.accepted(), REQUESTS);
    // Each request in flight: its client's connection and its own upstream connection.
    let (during, percent, _) = descriptors_when(admin, before + 2 * REQUESTS as i64);
    assert_eq!(percent, during * 100 / 1024);
    let (_, ready) = ready(admin);
    assert_eq!(
        ready, "LIVE\n",
        "{during} of 1024 descriptors is not overload"
    );
    held.release();
    for request in requests {
        let (status, body) = request.await.unwrap();
        assert_eq!((status.as_u16(), body.as_str()), (200, "released\n"));
    }
}

/// Idle keep-alive clients are kept while descriptors have headroom (300 clients of a
/// 512-descriptor process: a limit of half the descriptors on client connections, the old
/// default, closed some at 205), and keep-alive ends once the descriptors in use pass 80%.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_are_kept_until_descriptors_run_short() {
    let upstream = NoopUpstream::start_in_thread("127.0.0.1:0".parse().unwrap()).unwrap();
    let yaml = config(upstream.local_addr(), "memory_limit: 64GiB, interval: 10ms");
    let proxy = Proxy::start_with_open_files(&yaml, 2, 512);
    let admin = proxy.admin.unwrap();
    let (before, _, _) = descriptors_when(admin, 1);

    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..300 {
        let mut stream = open_connection(proxy.addr());
        let head = exchange(&mut stream);
        assert!(
            head.starts_with("http/1.1 200") && !head.contains("connection: close"),
            "client {}: {head}",
            idle.len()
        );
        idle.push(stream);
    }
    // Counted, and still kept alive: each of them is served again on its connection.
    let (counted, _, _) = descriptors_when(admin, before + 300);
    for (i, stream) in idle.iter_mut().enumerate() {
        let head = exchange(stream);
        assert!(
            head.starts_with("http/1.1 200") && !head.contains("connection: close"),
            "client {i} with {counted} of 512 descriptors in use: {head}"
        );
    }
    assert_eq!(applied(admin, "disable_keepalive"), 0);

    // Past 80% of the descriptors (410 of 512), keep-alive ends.
    let more = (410 - counted).max(0) as usize + 10;
    for _ in 0..more {
        idle.push(open_connection(proxy.addr()));
    }
    let (_, body) = ready_until(admin, "keep-alive is off", |_, b| {
        b.contains("disable_keepalive")
    });
    assert!(body.contains("descriptors at"), "{body}");
    let head = exchange(&mut idle[0]);
    assert!(head.contains("connection: close"), "{head}");
}
