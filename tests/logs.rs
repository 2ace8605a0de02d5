//! Structured logs through the real binary: the process log as JSON lines
//! (`--log-format json`), and an access log as JSON objects (`json_format`), each line parsed
//! by a real JSON parser.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use serde_json::Value;
use testbed::NoopUpstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_and_access_logs_are_json_lines() {
    let backend = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = ScratchDir::new();
    let access = dir.0.join("access.json");
    let config = dir.write(
        "legate.yaml",
        &format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    access_log:
      path: "{}"
      json_format:
        method: "%METHOD%"
        path: "%PATH%"
        status: "%RESPONSE_CODE%"
        flags: "%RESPONSE_FLAGS%"
        upstream: "%UPSTREAM_HOST%"
        duration_ms: "%DURATION%"
        client: "%DOWNSTREAM_REMOTE_ADDRESS%"
    routes:
      - match: {{ prefix: /local }}
        direct_response: {{ status: 204 }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
            access.display(),
            backend.local_addr()
        ),
    );
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["--log-format", "json", "-c"])
            .arg(&config)
            .args(["--concurrency", "1"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Every line is one JSON object with a time, a level and a message; the events' fields
    // sit beside the message.
    let mut listening: Option<SocketAddr> = None;
    let mut lines = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("legate became ready");
        let event: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: not JSON: {line}"));
        for key in ["timestamp", "level", "message"] {
            assert!(event.get(key).is_some(), "no {key} in {line}");
        }
        if event["message"] == "listening" {
            listening = Some(event["addr"].as_str().unwrap().parse().unwrap());
        }
        let ready = event["message"] == "legate ready";
        lines.push(event);
        if ready {
            break;
        }
    }
    let addr = listening.expect("a listening line with its address");
    assert!(
        lines
            .iter()
            .any(|e| e["level"] == "INFO" && e["workers"] == 1)
    );

    let response = send_h1(addr, get("/api?x=1", &[])).await;
    assert_eq!(response.status(), 200);
    text(response.into_body()).await;
    assert_eq!(send_h1(addr, get("/local", &[])).await.status(), 204);

    eventually("the access log has both lines", async || {
        std::fs::read_to_string(&access).is_ok_and(|t| t.lines().count() >= 2)
    })
    .await;
    let logged = std::fs::read_to_string(&access).unwrap();
    let entries: Vec<Value> = logged
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect();
    let forwarded = &entries[0];
    assert_eq!(forwarded["method"], "GET");
    assert_eq!(forwarded["path"], "/api?x=1", "{forwarded}");
    assert_eq!(forwarded["status"], 200);
    assert_eq!(forwarded["flags"], Value::Null);
    assert_eq!(forwarded["upstream"], backend.local_addr().to_string());
    assert!(forwarded["duration_ms"].is_u64(), "{forwarded}");
    assert!(
        forwarded["client"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{forwarded}"
    );
    let local = &entries[1];
    assert_eq!(local["status"], 204);
    assert_eq!(local["upstream"], Value::Null);
    // The keys in the order the config gives them.
    assert!(logged.starts_with("{\"method\":"), "{logged}");
}

/// The proxy, stopped however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
