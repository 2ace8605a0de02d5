//! The access log through the real binary: one line per request, flags for local replies,
//! byte counts of streamed bodies, a custom format.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::Request;
use testbed::NoopUpstream;

fn wait_for_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_a_line_with_its_flag() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let closed = closed_port();
    let dead = closed.addr;
    let logs = ScratchDir::new();
    let default_log = logs.0.join("default.log");
    let custom_log = logs.0.join("custom.log");
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    access_log: {{ path: "{}" }}
    routes:
      - match: {{ prefix: /dead }}
        cluster: dead
      - match: {{ prefix: / }}
        cluster: backend
  - name: custom
    address: 127.0.0.1:0
    access_log:
      path: "{}"
      format: "%METHOD% %PATH% %RESPONSE_CODE% %RESPONSE_FLAGS% in=%BYTES_RECEIVED% out=%BYTES_SENT% %UPSTREAM_HOST%\n"
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
  - name: dead
    endpoints: [{dead}]
"#,
        default_log.display(),
        custom_log.display(),
        noop.local_addr()
    );
    let proxy = Proxy::start(&config, 2);

    let ok = send_h1(
        proxy.addr(),
        get("/hello?x=1", &[("x-request-id", "req-42")]),
    )
    .await;
    assert_eq!(ok.status(), 200);
    text(ok.into_body()).await;
    let dead_reply = send_h2(proxy.addr(), get_h2("/dead", &[])).await;
    assert_eq!(dead_reply.status(), 503);
    text(dead_reply.into_body()).await;

    let lines = wait_for_lines(&default_log, 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let hello = lines.iter().find(|l| l.contains("/hello")).unwrap();
    assert!(
        hello.contains("\"GET /hello?x=1 HTTP/1.1\" 200 - 0 100 "),
        "{hello}"
    );
    assert!(
        hello.ends_with(&format!("\"{}\" \"req-42\"", noop.local_addr())),
        "{hello}"
    );
    assert!(hello.starts_with("[20") && hello.contains("Z]"), "{hello}");
    let failed = lines.iter().find(|l| l.contains("/dead")).unwrap();
    assert!(failed.contains("\"GET /dead HTTP/2\" 503 UF "), "{failed}");

    // A chunked upload is counted as it streams; the custom format is followed.
    let upload = Request::post("/up")
        .header("host", "legate.test")
        .body(PatternBody::new(300_000, false))
        .unwrap();
    let response = send_h1(proxy.addrs[1], upload).await;
    assert_eq!(response.status(), 200);
    text(response.into_body()).await;
    let lines = wait_for_lines(&custom_log, 1);
    assert_eq!(
        lines,
        [format!(
            "POST /up 200 - in=300000 out=100 {}",
            noop.local_addr()
        )]
    );

    // A head the codec refuses is a request too: logged (and counted) with its status and
    // DPE, though it has no method or path to show.
    let before = stat(proxy.admin.unwrap(), "downstream_rq_xx");
    let mut stream = tokio::net::TcpStream::connect(proxy.addrs[1])
        .await
        .unwrap();
    use tokio::io::AsyncWriteExt;
    stream
        .write_all(b"GET /x HTTP/1.1\r\nbad header\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut stream).await;
    assert!(answer.starts_with(b"HTTP/1.1 400 "));
    let lines = wait_for_lines(&custom_log, 2);
    assert_eq!(lines[1], "- - 400 DPE in=0 out=12 -", "{lines:?}");
    assert_eq!(stat(proxy.admin.unwrap(), "downstream_rq_xx"), before + 1);
}

/// A logger's `filter` picks its lines by status, flags and what the request sent; a logger
/// without one writes every exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_picks_the_exchanges_a_logger_writes() {
    let noop = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let closed = closed_port();
    let logs = ScratchDir::new();
    let picked = logs.0.join("picked.log");
    let every = logs.0.join("every.log");
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    access_log:
      - path: "{picked}"
        format: "%PATH% %RESPONSE_CODE% %RESPONSE_FLAGS%\n"
        filter:
          or:
            - response_flags: [UF]
            - expression: "request.headers['x-debug'] == '1' && response.code < 300"
            - and:
                - status_code: {{ eq: 404 }}
                - header: {{ name: user-agent, prefix: probe }}
      - path: "{every}"
        format: "%PATH%\n"
    routes:
      - match: {{ prefix: /dead }}
        cluster: dead
      - match: {{ prefix: /missing }}
        direct_response: {{ status: 404 }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{backend}]
  - name: dead
    endpoints: [{dead}]
"#,
        picked = picked.display(),
        every = every.display(),
        backend = noop.local_addr(),
        dead = closed.addr,
    );
    // One worker: its lines reach each file in the order of the requests.
    let proxy = Proxy::start(&config, 1);
    for (path, headers, status) in [
        ("/quiet", vec![], 200),
        ("/debug", vec![("x-debug", "1")], 200),
        ("/dead", vec![], 503),
        ("/missing/browser", vec![("user-agent", "browser")], 404),
        ("/missing/probe", vec![("user-agent", "probe/1")], 404),
        ("/dead/debug", vec![("x-debug", "1")], 503),
    ] {
        let response = send_h1(proxy.addr(), get(path, &headers)).await;
        assert_eq!(response.status(), status, "{path}");
        text(response.into_body()).await;
    }
    let lines = wait_for_lines(&picked, 4);
    assert_eq!(
        lines,
        [
            "/debug 200 -",
            "/dead 503 UF",
            "/missing/probe 404 -",
            "/dead/debug 503 UF"
        ]
    );
    assert_eq!(wait_for_lines(&every, 6).len(), 6);
}

fn lines_in(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// A listener `name` answering everything itself, logging each request to `log`.
fn logging_listener(name: &str, log: &std::path::Path) -> String {
    format!(
        r#"  - name: {name}
    address: 127.0.0.1:0
    access_log: {{ path: "{}" }}
    routes:
      - match: {{ prefix: / }}
        direct_response: {{ status: 200, body: "ok\n" }}
"#,
        log.display()
    )
}

/// A proxy with [`logging_listener`] `main`.
fn logging_proxy(log: &std::path::Path) -> Proxy {
    Proxy::start(
        &format!(
            "admin: {{ address: 127.0.0.1:0 }}\nlisteners:\n{}",
            logging_listener("main", log)
        ),
        1,
    )
}

async fn requests(proxy: std::net::SocketAddr, n: usize) {
    for i in 0..n {
        let res = send_h1(proxy, get(&format!("/r{i}"), &[])).await;
        assert_eq!(res.status(), 200);
        text(res.into_body()).await;
    }
}

/// logrotate's `create` style: the file is renamed, then the proxy is told to reopen it
/// (`POST /reopen_logs`, or SIGUSR1 as Envoy): lines written before go to the renamed file,
/// later ones to a new file at the path, and none is lost, with requests going on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_logs_reopen_after_logrotate_renames_them_and_lose_no_line() {
    for by_signal in [false, true] {
        let dir = ScratchDir::new();
        let log = dir.0.join("access.log");
        let rotated = dir.0.join("access.log.1");
        let proxy = logging_proxy(&log);
        requests(proxy.addr(), 100).await;
        assert_eq!(wait_for_lines(&log, 100).len(), 100);
        std::fs::rename(&log, &rotated).unwrap();
        // Requests go on while the file is reopened.
        let during = tokio::spawn(requests(proxy.addr(), 100));
        if by_signal {
            let status = std::process::Command::new("kill")
                .args(["-USR1", &proxy.pid().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            assert!(
                proxy.wait_for_log("access log reopened", Duration::from_secs(20)),
                "{}",
                proxy.log()
            );
        } else {
            let (status, body) = admin_request(proxy.admin.unwrap(), "POST", "/reopen_logs");
            assert_eq!(status, 200, "{body}");
            assert!(body.contains("access.log: reopened"), "{body}");
        }
        tokio::time::timeout(Duration::from_secs(20), during)
            .await
            .unwrap()
            .unwrap();
        requests(proxy.addr(), 100).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while lines_in(&rotated) + lines_in(&log) < 300 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let (old, new) = (lines_in(&rotated), lines_in(&log));
        assert_eq!(old + new, 300, "signal: {by_signal}");
        assert!(old >= 100 && new >= 100, "{old} + {new}");
    }
}

/// logrotate's `copytruncate` style: the file is copied and emptied in place, and the proxy,
/// writing in append mode, goes on from its start (no hole of the old length before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_emptied_in_place_is_written_from_its_start() {
    let dir = ScratchDir::new();
    let log = dir.0.join("access.log");
    let proxy = logging_proxy(&log);
    requests(proxy.addr(), 20).await;
    assert_eq!(wait_for_lines(&log, 20).len(), 20);
    std::fs::copy(&log, dir.0.join("access.log.1")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    requests(proxy.addr(), 10).await;
    assert_eq!(wait_for_lines(&log, 10).len(), 10);
    let text = std::fs::read(&log).unwrap();
    assert!(!text.contains(&0), "a hole before the new lines");
    assert_eq!(lines_in(&dir.0.join("access.log.1")), 20);
}

/// A log that cannot be opened again (its folder is gone) keeps being written where it was,
/// and the answer says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_cannot_be_reopened_is_kept() {
    let dir = ScratchDir::new();
    let folder = dir.0.join("logs");
    std::fs::create_dir(&folder).unwrap();
    let log = folder.join("access.log");
    let proxy = logging_proxy(&log);
    requests(proxy.addr(), 5).await;
    assert_eq!(wait_for_lines(&log, 5).len(), 5);
    let moved = dir.0.join("moved");
    std::fs::rename(&folder, &moved).unwrap();
    let (status, body) = admin_request(proxy.admin.unwrap(), "POST", "/reopen_logs");
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("kept the file it had"), "{body}");
    requests(proxy.addr(), 5).await;
    assert_eq!(wait_for_lines(&moved.join("access.log"), 10).len(), 10);
}

/// A reload that changes the log files gives new connections new writers; connections from
/// before it keep theirs, which a reopen reaches too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_reaches_the_writers_of_connections_from_before_a_reload() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = ScratchDir::new();
    let log = dir.0.join("access.log");
    let other = dir.0.join("other.log");
    let config = |extra: &str| {
        format!(
            "admin: {{ address: 127.0.0.1:0 }}\nlisteners:\n{}{extra}",
            logging_listener("main", &log)
        )
    };
    let proxy = Proxy::start(&config(""), 1);
    let admin = proxy.admin.unwrap();
    let mut old = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let exchange = async |conn: &mut tokio::net::TcpStream, path: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nhost: legate.test\r\n\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.ends_with(b"ok\n") {
            let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed");
            answer.extend_from_slice(&buf[..n]);
        }
    };
    exchange(&mut old, "/before").await;
    proxy.rewrite_config(&config(&logging_listener("second", &other)));
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    assert_eq!(wait_for_lines(&log, 1).len(), 1);
    std::fs::rename(&log, dir.0.join("access.log.1")).unwrap();
    let (status, body) = admin_request(admin, "POST", "/reopen_logs");
    assert_eq!(status, 200, "{body}");
    // The connection from before the reload writes through the old writer.
    exchange(&mut old, "/after").await;
    let mut new = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    exchange(&mut new, "/new").await;
    let lines = wait_for_lines(&log, 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("/after")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("/new")), "{lines:?}");
    assert_eq!(lines_in(&dir.0.join("access.log.1")), 1);
}
