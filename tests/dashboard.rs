//! The admin dashboard in a real browser: headless Chromium (Debian's `chromium`) loads `/`,
//! runs its script against the live endpoints, and the page it draws has the workers'
//! bars, the latency histograms with their mean and quantiles marked, the cluster's hosts and
//! the config's version; a screenshot of it is taken too.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use common::*;
use hyper_util::rt::TokioIo;
use testbed::NoopUpstream;

/// Runs headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=...`): its stdout.
fn chromium(url: &str, args: &[&str], profile: &Path) -> String {
    let binary = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("Chromium is needed (Debian: apt-get install chromium)");
    let out = Command::new(binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1200",
            // Timers run in virtual time: the page polls, draws, and is dumped after this.
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `data-*` values of the elements whose opening tag contains `marker`.
fn attribute_values(dom: &str, marker: &str, attribute: &str) -> Vec<String> {
    dom.match_indices(marker)
        .filter_map(|(at, _)| {
            let tag_end = dom[at..].find('>')? + at;
            let tag_start = dom[..at].rfind('<')?;
            let tag = &dom[tag_start..tag_end];
            let key = format!("{attribute}=\"");
            let from = tag.find(&key)? + key.len();
            let to = tag[from..].find('"')? + from;
            Some(tag[from..to].to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_workers_latency_clusters_and_config() {
    let backend = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(&forward_config(&[backend.local_addr()], ""), 2);
    let admin = proxy.admin.unwrap();
    for _ in 0..50 {
        let r = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(r.status(), 200);
        text(r.into_body()).await;
    }
    // Each exchange is counted once it is done, a moment after the client has its answer:
    // the page must find all fifty in both histograms.
    eventually("both latency histograms count 50", async || {
        let (_, json) = admin_request(admin, "GET", "/stats?format=json");
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        ["downstream_rq_time", "upstream_rq_time"]
            .iter()
            .all(|name| {
                json["stats"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|family| family["name"] == *name)
                    .flat_map(|family| family["series"].as_array().into_iter().flatten())
                    .map(|series| series["count"].as_u64().unwrap_or(0))
                    .sum::<u64>()
                    == 50
            })
    })
    .await;
    // Three connections left open: they show in the workers' bars.
    let mut open = Vec::new();
    for _ in 0..3 {
        let stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake::<
            _,
            http_body_util::Full<bytes::Bytes>,
        >(TokioIo::new(stream))
        .await
        .unwrap();
        tokio::spawn(conn);
        open.push(sender);
    }
    assert_eq!(stat_settled(admin, "downstream_cx_active", 3), 3);

    let (status, dump) = admin_request(admin, "GET", "/config_dump");
    assert_eq!(status, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let version = dump["version_info"].as_str().unwrap().to_string();

    let scratch = ScratchDir::new();
    let url = format!("http://{admin}/");
    let dom = chromium(&url, &["--dump-dom"], &scratch.0.join("profile-dom"));
    assert!(
        dom.contains("data-ready=\"true\""),
        "the script did not finish:\n{dom}"
    );
    assert!(
        dom.contains(&format!("<code id=\"config-version\">{version}</code>")),
        "{dom}"
    );
    // A bar per worker; their lengths say the open connections.
    let bars = attribute_values(&dom, "bar worker-bar", "data-value");
    assert_eq!(bars.len(), 2, "{dom}");
    let open_total: f64 = bars.iter().map(|v| v.parse::<f64>().unwrap()).sum();
    assert_eq!(open_total, 3.0);
    // The two latency histograms, each with 50 requests, the mean and four quantiles marked.
    let histograms = attribute_values(&dom, "class=\"histogram\"", "data-name");
    assert!(
        histograms.contains(&"downstream_rq_time".to_string()),
        "{dom}"
    );
    assert!(
        histograms.contains(&"upstream_rq_time".to_string()),
        "{dom}"
    );
    let counts = attribute_values(&dom, "class=\"histogram\"", "data-count");
    assert!(counts.iter().all(|c| c == "50"), "{counts:?}");
    let marks = attribute_values(&dom, "class=\"marker\"", "data-quantile");
    for quantile in ["mean", "0.5", "0.9", "0.99", "0.999"] {
        assert_eq!(
            marks.iter().filter(|m| *m == quantile).count(),
            2,
            "{quantile} in {marks:?}"
        );
    }
    // The cluster's host, healthy, and its breaker's headroom.
    let host: SocketAddr = backend.local_addr();
    let hosts = attribute_values(&dom, "class=\"host\"", "data-address");
    assert_eq!(hosts, [host.to_string()]);
    assert_eq!(
        attribute_values(&dom, "class=\"host\"", "data-state"),
        ["healthy"]
    );
    assert_eq!(
        attribute_values(&dom, "muted headroom", "data-cluster"),
        ["backend"]
    );

    // And a picture of it.
    let png = scratch.0.join("dashboard.png");
    chromium(
        &url,
        &[&format!("--screenshot={}", png.display())],
        &scratch.0.join("profile-png"),
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        bytes.len() > 20_000,
        "{} bytes: an empty page?",
        bytes.len()
    );
    drop(open);
}
