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
