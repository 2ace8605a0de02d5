//! Routing at the edge through the real binary: traffic splits, redirects, path rewrites,
//! regex and query matching, the chosen host's name as the upstream host (`auto_host_rewrite`).

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::collections::HashMap;

use common::*;
use testbed::NoopUpstream;

async fn upstream() -> testbed::NoopHandle {
    NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn served_by(r: &http::Response<hyper::body::Incoming>) -> String {
    r.headers()
        .get("x-noop-served-by")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The request line the upstream received, from its `x-noop-echo: headers` answer.
async fn request_line(r: http::Response<hyper::body::Incoming>) -> String {
    text(r.into_body())
        .await
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

fn two_clusters(a: &testbed::NoopHandle, b: &testbed::NoopHandle) -> String {
    format!(
        "clusters:\n  - name: v1\n    endpoints: [{}]\n  - name: v2\n    endpoints: [{}]\n",
        a.local_addr(),
        b.local_addr()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_clusters_split_by_weight_and_stick_by_key() {
    let (v1, v2) = (upstream().await, upstream().await);
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /sticky }}
        weighted_clusters: [{{ cluster: v1, weight: 50 }}, {{ cluster: v2, weight: 50 }}]
        hash_key: {{ header: x-user }}
      - match: {{ prefix: / }}
        weighted_clusters: [{{ cluster: v1, weight: 80 }}, {{ cluster: v2, weight: 20 }}]
{}"#,
        two_clusters(&v1, &v2)
    );
    let proxy = Proxy::start(&config, 2);
    let v1_addr = v1.local_addr().to_string();

    // 10,000 requests over four HTTP/2 connections.
    let total = 10_000u32;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let addr = proxy.addr();
        let v1_addr = v1_addr.clone();
        clients.push(tokio::spawn(async move {
            let (mut sender, _conn) = h2_client(addr).await;
            let mut to_v1 = 0u32;
            for _ in 0..total / 4 {
                let r = sender.send_request(get_h2("/", &[])).await.unwrap();
                assert_eq!(r.status(), 200);
                if served_by(&r) == v1_addr {
                    to_v1 += 1;
                }
                let _ = text(r.into_body()).await;
            }
            to_v1
        }));
    }
    let mut to_v1 = 0;
    for client in clients {
        to_v1 += client.await.unwrap();
    }
    // Chi-square with one degree of freedom against 80/20: 15.14 is the 0.01% tail (a split
    // off by two points, 82/18, lands near 25).
    let expected = [0.8 * f64::from(total), 0.2 * f64::from(total)];
    let got = [f64::from(to_v1), f64::from(total - to_v1)];
    let chi2: f64 = got
        .iter()
        .zip(expected)
        .map(|(g, e)| (g - e).powi(2) / e)
        .sum();
    assert!(chi2 < 15.14, "{to_v1} of {total} to v1: chi2 {chi2}");

    // A user keeps their side whichever worker and connection the request arrives on;
    // users are spread over both sides.
    let mut sides: HashMap<String, String> = HashMap::new();
    for round in 0..3 {
        for user in 0..60 {
            let user = format!("user-{user}");
            let r = send_h1(proxy.addr(), get("/sticky", &[("x-user", &user)])).await;
            let side = served_by(&r);
            if round == 0 {
                sides.insert(user, side);
            } else {
                assert_eq!(sides[&user], side, "{user} moved in round {round}");
            }
        }
    }
    let on_v1 = sides.values().filter(|s| **s == v1_addr).count();
    assert!((10..=50).contains(&on_v1), "{on_v1} of 60 users on v1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_answer_with_their_location() {
    let config = r#"
admin: { address: 127.0.0.1:0 }
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: { prefix: /secure }
        https_redirect: true
      - match: { prefix: /moved }
        redirect: { host: new.test, prefix_rewrite: /v2, status: 308 }
      - match: { path: /old-page }
        redirect: { path: /new-page, strip_query: true, status: 302 }
      - match: { prefix: /port }
        redirect: { scheme: https, port: 8443, status: 307 }
      - match: { prefix: / }
        direct_response: { status: 200 }
"#;
    let proxy = Proxy::start(config, 1);
    let location = |r: &http::Response<hyper::body::Incoming>| {
        r.headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let cases = [
        (
            "/secure/a?b=1",
            "legate.test",
            301,
            "https://legate.test/secure/a?b=1",
        ),
        (
            "/secure",
            "legate.test:80",
            301,
            "https://legate.test/secure",
        ),
        (
            "/moved/x/y?z",
            "legate.test",
            308,
            "http://new.test/v2/x/y?z",
        ),
        (
            "/old-page?utm=1",
            "legate.test:8080",
            302,
            "http://legate.test:8080/new-page",
        ),
        (
            "/port/p",
            "legate.test",
            307,
            "https://legate.test:8443/port/p",
        ),
    ];
    for (path, host, status, expected) in cases {
        let request = http::Request::get(path)
            .header("host", host)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let r = send_h1(proxy.addr(), request).await;
        assert_eq!(r.status(), status, "{path}");
        assert_eq!(location(&r).as_deref(), Some(expected), "{path}");
    }
    // HTTP/2 too: the authority is the host.
    let r = send_h2(proxy.addr(), get_h2("/secure/h2", &[])).await;
    assert_eq!(r.status(), 301);
    assert_eq!(
        location(&r).as_deref(),
        Some("https://legate.test/secure/h2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_reach_the_upstream_and_regex_and_query_routes_match() {
    let (v1, v2) = (upstream().await, upstream().await);
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /api/ }}
        cluster: v1
        prefix_rewrite: /v2/
      - match: {{ regex: "/users/[0-9]+/orders" }}
        cluster: v1
        regex_rewrite: {{ pattern: "^/users/([0-9]+)/orders$", substitution: "/orders/by-user/\\1" }}
      - match: {{ prefix: /, query_parameters: [{{ name: canary, exact: "1" }}] }}
        cluster: v2
      - match: {{ prefix: /, headers: [{{ name: user-agent, regex: ".*[Bb]ot.*" }}] }}
        direct_response: {{ status: 403, body: "no bots\n" }}
      - match: {{ prefix: / }}
        cluster: v1
{}"#,
        two_clusters(&v1, &v2)
    );
    let proxy = Proxy::start(&config, 1);
    let echo = [("x-noop-echo", "headers")];

    let r = send_h1(proxy.addr(), get("/api/items?page=2", &echo)).await;
    assert_eq!(request_line(r).await, "GET /v2/items?page=2 HTTP/1.1");
    let r = send_h2(proxy.addr(), get_h2("/api/items", &echo)).await;
    assert_eq!(request_line(r).await, "GET /v2/items HTTP/1.1");
    let r = send_h1(proxy.addr(), get("/users/42/orders", &echo)).await;
    assert_eq!(served_by(&r), v1.local_addr().to_string());
    assert_eq!(request_line(r).await, "GET /orders/by-user/42 HTTP/1.1");
    let r = send_h1(proxy.addr(), get("/users/x/orders", &echo)).await;
    assert_eq!(request_line(r).await, "GET /users/x/orders HTTP/1.1");

    let r = send_h1(proxy.addr(), get("/page?a=b&canary=1", &[])).await;
    assert_eq!(served_by(&r), v2.local_addr().to_string());
    let r = send_h1(proxy.addr(), get("/page?canary=0", &[])).await;
    assert_eq!(served_by(&r), v1.local_addr().to_string());
    let r = send_h1(proxy.addr(), get("/", &[("user-agent", "Googlebot/2.1")])).await;
    assert_eq!(r.status(), 403);
    let r = send_h1(proxy.addr(), get("/", &[("user-agent", "curl/8")])).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_host_rewrite_sends_the_chosen_hosts_name() {
    let named = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(
        &format!(
            r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /auto }}
        cluster: backend
        auto_host_rewrite: true
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{{ address: "{}", hostname: api.internal }}]
"#,
            named.local_addr()
        ),
        1,
    );
    let host_seen = |echoed: &str| {
        echoed
            .lines()
            .find_map(|l| l.strip_prefix("host: "))
            .map(str::to_owned)
    };
    let res = send_h1(proxy.addr(), get("/auto", &[("x-noop-echo", "headers")])).await;
    assert_eq!(res.status(), 200);
    let echoed = text(res.into_body()).await;
    assert_eq!(
        host_seen(&echoed).as_deref(),
        Some("api.internal"),
        "{echoed}"
    );
    // Other routes keep the client's host.
    let res = send_h1(proxy.addr(), get("/other", &[("x-noop-echo", "headers")])).await;
    let echoed = text(res.into_body()).await;
    assert_eq!(
        host_seen(&echoed).as_deref(),
        Some("legate.test"),
        "{echoed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_header_names_the_cluster_of_a_route_or_of_a_split_side() {
    let (v1, v2) = (upstream().await, upstream().await);
    let logs = ScratchDir::new();
    let log = logs.0.join("access.log");
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    access_log: {{ path: "{}", format: "flag=%RESPONSE_FLAGS% path=%REQ(:PATH)%\n" }}
    routes:
      - match: {{ prefix: /split }}
        weighted_clusters: [{{ cluster: v1, weight: 1 }}, {{ cluster_header: x-side, weight: 1 }}]
        random_value_header: x-pick
      - match: {{ prefix: /by-host }}
        cluster_header: ":authority"
      - match: {{ prefix: / }}
        cluster_header: x-cluster
        upgrades: [websocket]
{}  - {{ name: h2c, protocol: http2, endpoints: [{}] }}
"#,
        log.display(),
        two_clusters(&v1, &v2),
        v1.local_addr()
    );
    let proxy = Proxy::start(&config, 2);
    let (v1_addr, v2_addr) = (v1.local_addr().to_string(), v2.local_addr().to_string());

    // Each request goes where its header says, over HTTP/1.1 and HTTP/2.
    for (cluster, served) in [("v1", &v1_addr), ("v2", &v2_addr)] {
        let r = send_h1(proxy.addr(), get("/", &[("x-cluster", cluster)])).await;
        assert_eq!(r.status(), 200);
        assert_eq!(&served_by(&r), served);
        let r = send_h2(proxy.addr(), get_h2("/", &[("x-cluster", cluster)])).await;
        assert_eq!(r.status(), 200);
        assert_eq!(&served_by(&r), served);
    }
    // Only the first value counts, as in Envoy.
    let r = send_h1(
        proxy.addr(),
        get("/", &[("x-cluster", "v2"), ("x-cluster", "v1")]),
    )
    .await;
    assert_eq!(served_by(&r), v2_addr);

    // No header, or one naming no cluster: 503, flag NC, nothing sent upstream.
    for headers in [
        &[][..],
        &[("x-cluster", "v3")][..],
        &[("x-cluster", "V1")][..],
    ] {
        let r = send_h1(proxy.addr(), get("/missing", headers)).await;
        assert_eq!(r.status(), 503, "{headers:?}");
        assert_eq!(served_by(&r), "");
        assert_eq!(text(r.into_body()).await, "cluster not found\n");
    }
    let mut lines = String::new();
    eventually("three lines of flag NC", async || {
        lines = std::fs::read_to_string(&log).unwrap_or_default();
        lines.matches("flag=NC path=/missing\n").count() == 3
    })
    .await;

    // `:authority`: the request's host names the cluster (HTTP/1.1's host, HTTP/2's
    // authority).
    let by_host = |host: &'static str| {
        let mut request = get("/by-host", &[]);
        request
            .headers_mut()
            .insert("host", http::HeaderValue::from_static(host));
        request
    };
    let r = send_h1(proxy.addr(), by_host("v2")).await;
    assert_eq!(served_by(&r), v2_addr);
    let mut h2 = get_h2("/by-host", &[]);
    *h2.uri_mut() = "http://v1/by-host".parse().unwrap();
    let r = send_h2(proxy.addr(), h2).await;
    assert_eq!(r.status(), 200);
    assert_eq!(served_by(&r), v1_addr);
    let r = send_h1(proxy.addr(), by_host("v3")).await;
    assert_eq!(r.status(), 503);

    // Upgrades go over HTTP/1.1: one to a cluster speaking HTTP/2 is refused.
    let upgrade = |cluster: &'static str| {
        get(
            "/ws",
            &[
                ("x-cluster", cluster),
                ("connection", "upgrade"),
                ("upgrade", "websocket"),
            ],
        )
    };
    let r = send_h1(proxy.addr(), upgrade("h2c")).await;
    assert_eq!(r.status(), 403);
    assert_eq!(served_by(&r), "");
    // As Envoy's `upgrade_failed`: the connection stays open.
    assert!(r.headers().get("connection").is_none(), "{:?}", r.headers());
    assert_eq!(text(r.into_body()).await, "upgrade failed\n");
    // The same upgrade to an HTTP/1.1 cluster is relayed (this upstream declines it).
    let r = send_h1(proxy.addr(), upgrade("v1")).await;
    assert_eq!(served_by(&r), v1_addr);

    // A split's side named by a header: drawn by its weight (x-pick 1 is the second side),
    // then looked up.
    let side = |pick: &'static str, name: &'static str| {
        get("/split", &[("x-pick", pick), ("x-side", name)])
    };
    assert_eq!(
        served_by(&send_h1(proxy.addr(), side("0", "v2")).await),
        v1_addr
    );
    assert_eq!(
        served_by(&send_h1(proxy.addr(), side("1", "v2")).await),
        v2_addr
    );
    assert_eq!(
        served_by(&send_h1(proxy.addr(), side("1", "v1")).await),
        v1_addr
    );
    let r = send_h1(proxy.addr(), side("1", "nowhere")).await;
    assert_eq!(r.status(), 503);
    let r = send_h1(proxy.addr(), get("/split", &[("x-pick", "0")])).await;
    assert_eq!(served_by(&r), v1_addr);
}

/// The request line and header lines an `x-noop-echo: headers` answer lists.
async fn echoed_request(r: http::Response<hyper::body::Incoming>) -> Vec<String> {
    text(r.into_body())
        .await
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_redirects_are_followed_to_the_location_through_routes_and_filters_again() {
    let (old, new) = (upstream().await, upstream().await);
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - headers: {{}}
    routes:
      - match: {{ prefix: /old }}
        cluster: old
        internal_redirect: {{ redirect_response_codes: [302, 303], response_headers_to_copy: [x-carried] }}
      - match: {{ prefix: /new }}
        cluster: new
        # The redirected request is filtered again: what asked the old side for a
        # redirect is taken off before the new side sees it.
        filters: {{ headers: {{ request: {{ remove: [x-noop-status, x-noop-response-header] }} }} }}
clusters:
  - {{ name: old, endpoints: [{}] }}
  - {{ name: new, endpoints: [{}] }}
"#,
        old.local_addr(),
        new.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let new_addr = new.local_addr().to_string();
    let redirect = |method: &str, status: &str, location: &str| {
        http::Request::builder()
            .method(method)
            .uri("/old/page")
            .header("host", "legate.test")
            .header("x-noop-status", status)
            .header("x-noop-response-header", format!("location: {location}"))
            .header("x-noop-response-header", "x-carried: from-the-redirect")
            .header("x-noop-echo", "headers")
            .header("x-carried", "from-the-client")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };

    // A 302 to a location that routes: the client gets the new side's answer.
    let r = send_h1(
        proxy.addr(),
        redirect("GET", "302", "http://legate.test/new/place?q=1#frag"),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(served_by(&r), new_addr);
    let seen = echoed_request(r).await;
    assert_eq!(seen[0], "GET /new/place?q=1 HTTP/1.1", "{seen:?}");
    for line in [
        "host: legate.test",
        "x-envoy-original-url: http://legate.test/old/page",
        "x-carried: from-the-redirect",
    ] {
        assert!(seen.iter().any(|l| l == line), "{line}: {seen:?}");
    }
    assert!(
        !seen.iter().any(|l| l.starts_with("x-noop-status")),
        "{seen:?}"
    );

    // Over HTTP/2 too, the authority taken from the location.
    let mut h2 = redirect("GET", "302", "http://legate.test/new/h2");
    *h2.uri_mut() = "http://legate.test/old/page".parse().unwrap();
    h2.headers_mut().remove("host");
    let r = send_h2(proxy.addr(), h2).await;
    assert_eq!(r.status(), 200);
    assert_eq!(served_by(&r), new_addr);

    // A 303 after a POST (without a body) is followed with a GET.
    let r = send_h1(
        proxy.addr(),
        redirect("POST", "303", "http://legate.test/new/see"),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(echoed_request(r).await[0], "GET /new/see HTTP/1.1");

    // Passed to the client: a status the policy does not follow, another scheme, a relative
    // location, a location no route takes, and a request with a body (it is not held).
    for (method, status, location) in [
        ("GET", "301", "http://legate.test/new/a"),
        ("GET", "302", "https://legate.test/new/a"),
        ("GET", "302", "/new/a"),
        ("GET", "302", "http://legate.test/nowhere"),
    ] {
        let r = send_h1(proxy.addr(), redirect(method, status, location)).await;
        assert_eq!(r.status().as_str(), status, "{location}");
        assert_eq!(r.headers()["location"], location);
        assert_ne!(served_by(&r), new_addr);
    }
    let mut with_body = redirect("POST", "302", "http://legate.test/new/a");
    *with_body.body_mut() = http_body_util::Full::new(bytes::Bytes::from_static(b"form=1"));
    let r = send_h1(proxy.addr(), with_body).await;
    assert_eq!(r.status(), 302);

    // One redirect at most (the default): the new side's own redirect goes to the client.
    let twice = redirect("GET", "302", "http://legate.test/old/again");
    let r = send_h1(proxy.addr(), twice).await;
    assert_eq!(r.status(), 302, "the second redirect is the client's");
    assert_eq!(r.headers()["location"], "http://legate.test/old/again");
}
