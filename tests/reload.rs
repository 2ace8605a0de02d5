//! Live configuration against the real binary: reloads by `POST /reload`, `SIGHUP` and a
//! watched file change routes, clusters, endpoints and listeners while clients keep sending.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

/// An upstream on 127.0.0.1 that answers every request with its name, counting the
/// connections it accepts.
struct Named {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Named {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn named(name: &'static str) -> Named {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&connections);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |_req: http::Request<Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(name),
                        )))
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Named {
        addr,
        connections,
        task,
    }
}

/// Two clusters, `one` and `two`; `/` goes to `target`.
fn two_clusters(one: SocketAddr, two: SocketAddr, target: &str) -> String {
    forward_config(&[one], &format!("  - name: two\n    endpoints: [{two}]\n"))
        .replace("  - name: backend", "  - name: one")
        .replace(
            "        cluster: backend",
            &format!("        cluster: {target}"),
        )
}

async fn body_of(response: http::Response<Incoming>) -> (StatusCode, String) {
    let status = response.status();
    (status, text(response.into_body()).await)
}

/// An HTTP/1.1 keep-alive connection to `addr`.
async fn h1_client(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// One request on a kept-alive HTTP/1.1 connection, once it is ready for it.
async fn send_on(
    c: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    req: http::Request<Full<Bytes>>,
) -> hyper::Result<http::Response<Incoming>> {
    c.ready().await?;
    c.send_request(req).await
}

fn reload(admin: SocketAddr) -> (u16, String) {
    admin_request(admin, "POST", "/reload")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_reloads_under_load_lose_no_request_and_the_next_request_follows() {
    let one = named("one").await;
    let two = named("two").await;
    let proxy = Proxy::start(&two_clusters(one.addr, two.addr, "one"), 2);
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();

    // Background load: keep-alive clients of both protocols at a fixed pace, counting
    // anything but a 200 from one of the two upstreams.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for h2 in [false, true] {
        let (stop, failures, sent) = (stop.clone(), failures.clone(), sent.clone());
        load.push(tokio::spawn(async move {
            let mut h1 = if h2 {
                None
            } else {
                Some(h1_client(addr).await)
            };
            let mut h2c = if h2 {
                Some(h2_client(addr).await.0)
            } else {
                None
            };
            while !stop.load(Ordering::Relaxed) {
                let response = match (&mut h1, &mut h2c) {
                    (Some(c), _) => send_on(c, get("/", &[])).await,
                    (_, Some(c)) => c.send_request(get_h2("/", &[])).await,
                    _ => unreachable!(),
                };
                sent.fetch_add(1, Ordering::Relaxed);
                match response {
                    Ok(r) => {
                        let (status, body) = body_of(r).await;
                        if status != StatusCode::OK || (body != "one" && body != "two") {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }

    // Connections opened before any reload, used once after each.
    let mut h1s = vec![h1_client(addr).await, h1_client(addr).await];
    let mut h2s = vec![h2_client(addr).await.0, h2_client(addr).await.0];
    for round in 0..50 {
        let target = if round % 2 == 0 { "two" } else { "one" };
        proxy.rewrite_config(&two_clusters(one.addr, two.addr, target));
        let (status, body) = reload(admin);
        assert_eq!(status, 200, "reload {round}: {body}");
        assert!(body.contains("applied by 2 of 2 workers"), "{body}");
        for c in &mut h1s {
            let (status, body) = body_of(send_on(c, get("/", &[])).await.unwrap()).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, target),
                "HTTP/1.1, reload {round}"
            );
        }
        for c in &mut h2s {
            let (status, body) = body_of(c.send_request(get_h2("/", &[])).await.unwrap()).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, target),
                "HTTP/2, reload {round}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert!(sent.load(Ordering::Relaxed) > 0);
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "failed requests; log:\n{}",
        proxy.log()
    );
    assert_eq!(stat(admin, "config_reload_total"), 50);
    assert_eq!(stat(admin, "config_generation"), 51);
    let prometheus = admin_request(admin, "GET", "/stats/prometheus").1;
    assert!(
        prometheus.contains("config_propagation_seconds_count 50"),
        "{prometheus}"
    );
    assert!(
        prometheus.contains("worker_config_generation{worker=\"1\"} 51"),
        "{prometheus}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_changes_nothing_and_says_where() {
    let one = named("one").await;
    let two = named("two").await;
    let good = two_clusters(one.addr, two.addr, "one");
    let proxy = Proxy::start(&good, 1);
    let admin = proxy.admin.unwrap();
    let version = |dump: &str| -> String {
        let dump: serde_json::Value = serde_json::from_str(dump).unwrap();
        dump["version_info"].as_str().unwrap().to_owned()
    };
    let before = version(&admin_request(admin, "GET", "/config_dump").1);

    proxy.rewrite_config(&good.replace("cluster: one", "cluster: three"));
    let (status, body) = reload(admin);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("listeners[0].routes[1].cluster"), "{body}");
    let (status, body) = body_of(send_h1(proxy.addr(), get("/", &[])).await).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "one"),
        "the old config serves"
    );

    let dump = admin_request(admin, "GET", "/config_dump").1;
    assert_eq!(
        version(&dump),
        before,
        "the last good version stays in force"
    );
    let parsed: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert!(
        parsed["reload"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("routes[1].cluster")),
        "{dump}"
    );
    let failures = admin_request(admin, "GET", "/stats?filter=config_reload_total").1;
    assert!(failures.contains(r#"result="failure"}: 1"#), "{failures}");

    // Settings the process is built around are refused by name.
    proxy.rewrite_config(&format!("concurrency: 3\n{good}"));
    let (status, body) = reload(admin);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("concurrency: cannot change while running"),
        "{body}"
    );

    // SIGHUP reloads the fixed file.
    proxy.rewrite_config(&two_clusters(one.addr, two.addr, "two"));
    let status = std::process::Command::new("kill")
        .args(["-HUP", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        stat_settled(admin, "config_generation", 2),
        2,
        "{}",
        proxy.log()
    );
    let (_, body) = body_of(send_h1(proxy.addr(), get("/", &[])).await).await;
    assert_eq!(body, "two");
    // The reload's outcome is recorded just after the new generation is counted.
    eventually("the reload's error cleared", async || {
        let parsed: serde_json::Value =
            serde_json::from_str(&admin_request(admin, "GET", "/config_dump").1).unwrap();
        parsed["reload"]["last_error"].is_null()
    })
    .await;
    let parsed: serde_json::Value =
        serde_json::from_str(&admin_request(admin, "GET", "/config_dump").1).unwrap();
    assert_ne!(parsed["version_info"].as_str().unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_is_reloaded_when_it_changes() {
    let one = named("one").await;
    let two = named("two").await;
    let proxy = Proxy::start(
        &format!("watch: true\n{}", two_clusters(one.addr, two.addr, "one")),
        1,
    );
    proxy.rewrite_config(&format!(
        "watch: true\n{}",
        two_clusters(one.addr, two.addr, "two")
    ));
    eventually("reloaded from the watched file", async || {
        body_of(send_h1(proxy.addr(), get("/", &[])).await).await.1 == "two"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_that_stay_keep_their_pooled_connections() {
    let one = named("one").await;
    let two = named("two").await;
    let proxy = Proxy::start(&forward_config(&[one.addr], ""), 1);
    let admin = proxy.admin.unwrap();
    let mut client = h1_client(proxy.addr()).await;
    for _ in 0..5 {
        let (_, body) = body_of(send_on(&mut client, get("/", &[])).await.unwrap()).await;
        assert_eq!(body, "one");
    }
    assert_eq!(one.connections.load(Ordering::Relaxed), 1);

    proxy.rewrite_config(&forward_config(&[one.addr, two.addr], ""));
    assert_eq!(reload(admin).0, 200);
    let mut seen_two = false;
    for _ in 0..20 {
        let (_, body) = body_of(send_on(&mut client, get("/", &[])).await.unwrap()).await;
        seen_two |= body == "two";
    }
    assert!(seen_two, "the new host gets requests");
    assert_eq!(
        one.connections.load(Ordering::Relaxed),
        1,
        "the host that stayed kept its pooled connection"
    );
    assert_eq!(stat(admin, "upstream_cx_total"), 2);

    // Only `two` left: `one` gets no more requests, and its idle connection is closed.
    proxy.rewrite_config(&forward_config(&[two.addr], ""));
    assert_eq!(reload(admin).0, 200);
    for _ in 0..5 {
        let (_, body) = body_of(send_on(&mut client, get("/", &[])).await.unwrap()).await;
        assert_eq!(body, "two");
    }
    let open = tokio::task::spawn_blocking(move || stat_settled(admin, "upstream_cx_active", 1))
        .await
        .unwrap();
    assert_eq!(open, 1, "the removed host's pooled connection was closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_are_added_and_removed_live() {
    let one = named("one").await;
    let base = format!("drain_timeout: 2s\n{}", forward_config(&[one.addr], ""));
    let extra = base.replace(
        "clusters:",
        r#"  - name: extra
    address: 127.0.0.1:0
    routes:
      - match: { prefix: / }
        direct_response: { status: 200, body: "extra" }
clusters:"#,
    );
    let proxy = Proxy::start(&base, 2);
    let admin = proxy.admin.unwrap();
    proxy.rewrite_config(&extra);
    assert_eq!(reload(admin).0, 200);
    let dump: serde_json::Value =
        serde_json::from_str(&admin_request(admin, "GET", "/config_dump").1).unwrap();
    let extra_addr: SocketAddr = dump["listeners"][1]["bound_address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        dump["listeners"][0]["bound_address"].as_str().unwrap(),
        proxy.addr().to_string(),
        "the kept listener kept its socket"
    );
    // Bound on every worker: several connections are all served.
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut c = h1_client(extra_addr).await;
        let (_, body) = body_of(send_on(&mut c, get("/", &[])).await.unwrap()).await;
        assert_eq!(body, "extra");
        clients.push(c);
    }

    // Removed: no new connections; the open ones are closed within the drain timeout.
    proxy.rewrite_config(&base);
    assert_eq!(reload(admin).0, 200);
    let refused = TcpStream::connect(extra_addr).await;
    assert!(
        refused.is_err(),
        "a removed listener refuses new connections"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    for c in &mut clients {
        loop {
            match send_on(c, get("/", &[])).await {
                Ok(r) => {
                    let _ = body_of(r).await;
                }
                Err(_) => break, // closed
            }
            assert!(
                Instant::now() < deadline,
                "the removed listener's connection stays open"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The main listener served throughout.
    let (_, body) = body_of(send_h1(proxy.addr(), get("/", &[])).await).await;
    assert_eq!(body, "one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_upgrade_refuses_no_connection_and_fails_no_request() {
    let one = named("one").await;
    let sockets = ScratchDir::new();
    let socket = sockets.0.join("legate.sock");
    // The listener on `address`; the admin server stays on a port of its own.
    let config = |address: &str| {
        forward_config(&[one.addr], "").replace(
            "    address: 127.0.0.1:0",
            &format!("    address: {address}"),
        )
    };
    let mut old = start_upgradable(&config("127.0.0.1:0"), &socket, false);
    let addr = old.addr();

    // Load: a new connection per request, so every accept during the upgrade is tested.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let ok = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, failures, ok) = (stop.clone(), failures.clone(), ok.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let outcome = async {
                    let mut c = h1_client(addr).await;
                    let r = send_on(&mut c, get("/", &[("connection", "close")]))
                        .await
                        .map_err(|e| e.to_string())?;
                    let (status, body) = body_of(r).await;
                    if status == StatusCode::OK && body == "one" {
                        Ok(())
                    } else {
                        Err(format!("{status} {body}"))
                    }
                };
                match tokio::time::timeout(Duration::from_secs(10), outcome).await {
                    Ok(Ok(())) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(e)) => failures.lock().unwrap().push(e),
                    Err(_) => failures.lock().unwrap().push("timed out".into()),
                }
            }
        }));
    }
    let wait_for_more = |n: u64| {
        let ok = ok.clone();
        async move {
            let target = ok.load(Ordering::Relaxed) + n;
            let deadline = Instant::now() + Duration::from_secs(20);
            while ok.load(Ordering::Relaxed) < target {
                assert!(Instant::now() < deadline, "the load stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_for_more(50).await;

    let new = start_upgradable(&config(&addr.to_string()), &socket, true);
    assert_eq!(new.addr(), addr, "the new process serves the same socket");
    let exited = tokio::task::spawn_blocking(move || {
        let status = old.wait(Duration::from_secs(30));
        (status, old.log())
    })
    .await
    .unwrap();
    assert!(
        exited.0.is_some_and(|s| s.success()),
        "the old process drains and exits; log:\n{}",
        exited.1
    );
    wait_for_more(50).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok.load(Ordering::Relaxed),
        &failures[..failures.len().min(5)]
    );
    // The new process can be upgraded in turn.
    assert!(socket.exists(), "{}", new.log());
}
