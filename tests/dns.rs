//! DNS endpoints against the real binary: a cluster named `backend.test:PORT`, resolved
//! through a DNS server in the test whose answers change while requests flow.
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use testbed::{DnsServer, NoopHandle, NoopUpstream};

/// Two upstreams on one port, on 127.0.0.2 and 127.0.0.3: the two answers a name can have.
async fn two_hosts() -> (NoopHandle, NoopHandle) {
    let first = NoopUpstream::bind("127.0.0.2:0".parse().unwrap())
        .await
        .unwrap();
    let port = first.local_addr().port();
    let second = NoopUpstream::bind(SocketAddr::new([127, 0, 0, 3].into(), port))
        .await
        .unwrap();
    (first, second)
}

fn ip(addr: SocketAddr) -> IpAddr {
    addr.ip()
}

/// `backend` is `backend.test:PORT`, resolved through `dns`; `extra` adds clusters.
fn config(dns: SocketAddr, port: u16, extra: &str) -> String {
    forward_config(
        &[format!("backend.test:{port}")],
        &format!(
            "    dns_resolvers: [{dns}]\n    dns_refresh_rate: 200ms\n    dns_min_refresh_rate: 100ms\n{extra}"
        ),
    )
}

/// Who answered one request: the upstream's address, or the status if it was not a 200.
async fn served_by(proxy: &Proxy) -> Result<String, u16> {
    let response = send_h1(proxy.addr(), get("/", &[])).await;
    if response.status() != 200 {
        return Err(response.status().as_u16());
    }
    Ok(response.headers()["x-noop-served-by"]
        .to_str()
        .unwrap()
        .to_string())
}

/// Sends requests until `done` holds for who served one (at most 20 s).
async fn until(proxy: &Proxy, what: &str, done: impl Fn(&Result<String, u16>) -> bool) {
    eventually(what, async || done(&served_by(proxy).await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_follows_the_dns_answer() {
    let (first, second) = two_hosts().await;
    let dns = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    dns.set("backend.test", &[ip(first.local_addr())]);
    // A slow first answer: the proxy waits for it before it serves, rather than answering
    // 503 until it comes.
    dns.set_delay(Duration::from_secs(1));
    let proxy = Proxy::start(&config(dns.local_addr(), first.local_addr().port(), ""), 2);
    let admin = proxy.admin.unwrap();
    assert_eq!(served_by(&proxy).await, Ok(first.local_addr().to_string()));
    dns.set_delay(Duration::ZERO);

    dns.set("backend.test", &[ip(second.local_addr())]);
    until(&proxy, "moved to the new address", |a| {
        *a == Ok(second.local_addr().to_string())
    })
    .await;
    // The old address left the host set: every request now goes to the new one.
    for _ in 0..20 {
        assert_eq!(served_by(&proxy).await, Ok(second.local_addr().to_string()));
    }
    let (_, clusters) = admin_request(admin, "GET", "/clusters");
    assert!(
        clusters.contains(&second.local_addr().to_string())
            && !clusters.contains(&first.local_addr().to_string()),
        "{clusters}"
    );

    // A server failure keeps the last answer.
    let failures = stat(admin, "update_failure");
    dns.set_failing(true);
    eventually("counting failed lookups", async || {
        stat(admin, "update_failure") >= failures + 2
    })
    .await;
    for _ in 0..10 {
        assert_eq!(served_by(&proxy).await, Ok(second.local_addr().to_string()));
    }
    // So does a partial one: A fails while AAAA says "no address" (not an empty answer).
    dns.set_failing(false);
    dns.set_failing_a(true);
    let partial = stat(admin, "update_failure");
    eventually("counting partly failed lookups", async || {
        stat(admin, "update_failure") >= partial + 2
    })
    .await;
    for _ in 0..10 {
        assert_eq!(served_by(&proxy).await, Ok(second.local_addr().to_string()));
    }

    // Both addresses: both serve.
    dns.set_failing_a(false);
    dns.set(
        "backend.test",
        &[ip(first.local_addr()), ip(second.local_addr())],
    );
    until(&proxy, "back on the first address", |a| {
        *a == Ok(first.local_addr().to_string())
    })
    .await;

    // The name is gone (NXDOMAIN): its hosts leave, and requests get 503.
    dns.remove("backend.test");
    until(&proxy, "refused without hosts", |a| *a == Err(503)).await;
    // Every lookup ends answered or failed (read in this order: they only grow).
    let answered = stat(admin, "update_success");
    let attempts = stat(admin, "update_attempt");
    assert!(attempts >= answered + failures + 2, "{attempts} {answered}");
    assert!(dns.queries() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_a_name_waits_for_its_answer() {
    let (first, _second) = two_hosts().await;
    let dns = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    dns.set("backend.test", &[ip(first.local_addr())]);
    dns.set_delay(Duration::from_secs(1));
    let proxy = Proxy::start(&forward_config(&[first.local_addr()], ""), 1);
    let admin = proxy.admin.unwrap();
    // A second cluster reached by name, and a route to it.
    let yaml = forward_config(
        &[first.local_addr()],
        &format!(
            "  - name: named\n    endpoints: [backend.test:{}]\n    dns_resolvers: [{}]\n",
            first.local_addr().port(),
            dns.local_addr()
        ),
    )
    .replace(
        "      - match: { prefix: / }",
        "      - match: { prefix: /named }\n        cluster: named\n      - match: { prefix: / }",
    );
    proxy.rewrite_config(&yaml);
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    // The first request after the reload finds the name resolved.
    let response = send_h1(proxy.addr(), get("/named", &[])).await;
    assert_eq!(response.status(), 200, "{}", proxy.log());
    assert!(dns.queries() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_swaps_names_leaves_no_gap() {
    let (first, second) = two_hosts().await;
    let port = first.local_addr().port();
    let dns = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    dns.set("blue.test", &[ip(first.local_addr())]);
    dns.set("green.test", &[ip(second.local_addr())]);
    let blue = config(dns.local_addr(), port, "").replace("backend.test", "blue.test");
    let proxy = Proxy::start(&blue, 2);
    let admin = proxy.admin.unwrap();
    assert_eq!(served_by(&proxy).await, Ok(first.local_addr().to_string()));

    // Requests keep flowing while a reload swaps the name for one whose answer is slow.
    dns.set_delay(Duration::from_secs(1));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = proxy.addr();
    let client = tokio::spawn({
        let stop = std::sync::Arc::clone(&stop);
        async move {
            let (mut sent, mut failed) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let response = send_h1(addr, get("/", &[])).await;
                sent += 1;
                if response.status() != 200 {
                    failed.push(response.status());
                }
            }
            (sent, failed)
        }
    });
    proxy.rewrite_config(&blue.replace("blue.test", "green.test"));
    let (status, body) =
        tokio::task::spawn_blocking(move || admin_request(admin, "POST", "/reload"))
            .await
            .unwrap();
    assert_eq!(status, 200, "{body}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sent, failed) = client.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of {sent} failed, the first with {:?}",
        failed.len(),
        failed.first()
    );
    assert!(sent > 1, "the client sent while the reload waited");
    // The reload returned once green had answered: blue's host is gone.
    for _ in 0..10 {
        assert_eq!(served_by(&proxy).await, Ok(second.local_addr().to_string()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_dns_server_leaves_the_proxy_serving_what_it_can() {
    let (first, _second) = two_hosts().await;
    // Nothing answers on this UDP port.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let extra = format!("  - name: fixed\n    endpoints: [{}]\n", first.local_addr());
    let yaml = config(
        silent.local_addr().unwrap(),
        first.local_addr().port(),
        &extra,
    )
    .replace(
        "      - match: { prefix: / }",
        "      - match: { prefix: /fixed }\n        cluster: fixed\n      - match: { prefix: / }",
    );
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    // The name has no host: 503, and the failure is logged and counted; the rest of the
    // config serves.
    assert_eq!(served_by(&proxy).await, Err(503));
    let response = send_h1(proxy.addr(), get("/fixed", &[])).await;
    assert_eq!(response.status(), 200);
    assert!(
        proxy.wait_for_log("DNS lookup failed", Duration::from_secs(20)),
        "{}",
        proxy.log()
    );
    assert!(stat(admin, "update_failure") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_kept_for_its_ttl_unless_told_otherwise() {
    let (first, _second) = two_hosts().await;
    let port = first.local_addr().port();
    let cached = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let uncached = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    for dns in [&cached, &uncached] {
        dns.set("backend.test", &[ip(first.local_addr())]);
        dns.set_ttl(3600);
    }
    let extra = format!(
        "  - name: uncached\n    endpoints: [backend.test:{port}]\n    dns_resolvers: [{}]\n    dns_refresh_rate: 100ms\n    respect_dns_ttl: false\n",
        uncached.local_addr()
    );
    let proxy = Proxy::start(&config(cached.local_addr(), port, &extra), 1);
    assert_eq!(served_by(&proxy).await, Ok(first.local_addr().to_string()));
    let asked = cached.queries();
    // While the cluster that ignores TTLs asks again and again, the other one, refreshed
    // every 200 ms too, uses its answer for the hour it is valid.
    let start = uncached.queries();
    eventually("asking for the uncached name again", async || {
        uncached.queries() >= start + 5
    })
    .await;
    assert_eq!(cached.queries(), asked, "{}", proxy.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logical_dns_cluster_connects_to_the_first_address_and_keeps_its_connections() {
    let (first, second) = two_hosts().await;
    let (first_addr, second_addr) = (first.local_addr(), second.local_addr());
    let dns = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    dns.set("backend.test", &[ip(first_addr), ip(second_addr)]);
    let proxy = Proxy::start(
        &config(
            dns.local_addr(),
            first_addr.port(),
            "    logical_dns: true\n",
        ),
        1,
    );
    let admin = proxy.admin.unwrap();
    // One host, reached at the first address: a strict cluster would share the two.
    for _ in 0..10 {
        assert_eq!(served_by(&proxy).await, Ok(first_addr.to_string()));
    }
    let (_, clusters) = admin_request(admin, "GET", "/clusters");
    let clusters: serde_json::Value = serde_json::from_str(&clusters).unwrap();
    assert_eq!(
        clusters["clusters"][0]["hosts"].as_array().unwrap().len(),
        1
    );

    // The answer changes: new connections go to the new first address, while the one already
    // open stays in use (Envoy never drains a logical host's connections). Lookups are made
    // one after the other, each answer applied before the next asked: four queries after the
    // change, a whole lookup has given the new answer.
    let asked = dns.queries();
    dns.set("backend.test", &[ip(second_addr), ip(first_addr)]);
    eventually("the new answer given", async || dns.queries() >= asked + 4).await;
    // A slow request takes the kept connection; one sent while it is in flight needs a new
    // connection, which goes to the new first address.
    let slow = tokio::spawn({
        let proxy = proxy.addr();
        async move { send_h1(proxy, get("/", &[("x-noop-delay", "2s")])).await }
    });
    eventually("the slow request in flight", async || {
        stat(admin, "upstream_rq_active") == 1
    })
    .await;
    assert_eq!(served_by(&proxy).await, Ok(second_addr.to_string()));
    let slow = slow.await.unwrap();
    assert_eq!(
        slow.headers()["x-noop-served-by"],
        first_addr.to_string().as_str()
    );
    let (_, clusters) = admin_request(admin, "GET", "/clusters");
    let clusters: serde_json::Value = serde_json::from_str(&clusters).unwrap();
    assert_eq!(
        clusters["clusters"][0]["hosts"].as_array().unwrap().len(),
        1
    );
}
