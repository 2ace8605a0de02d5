//! The `global_rate_limit` filter on the real binary: limits kept by a rate limit service and
//! shared by two proxies, the service's answer headers, rules by route, and a service that
//! is down (fail open, or closed as configured). The real envoyproxy/ratelimit on Redis where
//! both are installed; a small service written in the test covers the protocol everywhere.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use common::ratelimit::real_service;
use common::*;
use testbed::RateLimitService;

fn config(filter: &str, upstream: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - global_rate_limit:
{filter}
    routes:
      - match: {{ prefix: /users }}
        cluster: backend
        filters:
          global_rate_limit:
            domain: people
            rate_limits:
              - actions: [{{ request_headers: {{ header_name: x-user, descriptor_key: user }} }}]
      - match: {{ prefix: /free }}
        cluster: backend
        filters: {{ global_rate_limit: disabled }}
      - match: {{ prefix: /direct }}
        direct_response: {{ status: 200, body: "here" }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

async fn upstream() -> testbed::NoopHandle {
    testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A GET's status and the named response headers (empty when absent), and its body.
async fn call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    names: &[&str],
) -> (u16, Vec<String>, String) {
    let response = send_h1(addr, get(path, headers)).await;
    let status = response.status().as_u16();
    let values = (names.iter())
        .map(|n| {
            (response.headers().get(*n)).map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        })
        .collect();
    (status, values, text(response.into_body()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_the_limit_the_service_keeps() {
    let upstream = upstream().await;
    let rls = RateLimitService::start("127.0.0.1:0".parse().unwrap(), 5)
        .await
        .unwrap();
    let service = rls.local_addr();
    let filter = format!(
        r#"          service: {{ address: "{service}" }}
          domain: edge
          timeout: 5s
          x_ratelimit_headers: true
          rate_limits:
            - actions: [{{ generic_key: {{ descriptor_value: everyone }} }}]
"#
    );
    let yaml = config(&filter, upstream.local_addr());
    let first = Proxy::start(&yaml, 2);
    let second = Proxy::start(&yaml, 1);
    let names = [
        "x-envoy-ratelimited",
        "x-test-rls",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ];
    let mut allowed = 0;
    let mut refused = 0;
    for i in 0..12 {
        let proxy = if i % 2 == 0 { &first } else { &second };
        let (status, headers, body) = call(proxy.addr(), "/", &[], &names).await;
        match status {
            200 => {
                allowed += 1;
                assert_eq!(headers[0], "", "an allowed request is not marked");
                assert_eq!(
                    headers[1], "counted",
                    "the service's response headers are added"
                );
                assert_eq!(headers[2], "5, 5;w=60");
                assert_eq!(headers[3], (5 - allowed).to_string());
            }
            429 => {
                refused += 1;
                assert_eq!(headers[0], "true");
                assert_eq!(headers[1], "counted");
                assert_eq!((headers[3].as_str(), headers[4].as_str()), ("0", "60"));
                assert_eq!(body, "slow down", "the service's body");
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    // Five across both proxies, as the one count in the service says.
    assert_eq!((allowed, refused), (5, 7));
    let admin = first.admin.unwrap();
    let second_admin = second.admin.unwrap();
    assert_eq!(
        stat(admin, "http_ratelimit_ok") + stat(second_admin, "http_ratelimit_ok"),
        5
    );
    assert_eq!(
        stat(admin, "http_ratelimit_over_limit") + stat(second_admin, "http_ratelimit_over_limit"),
        7
    );
    assert!(
        rls.asked().iter().all(|(domain, lists)| domain == "edge"
            && *lists == [vec!["generic_key=everyone".to_owned()]])
    );

    // A route's own domain and rules: a descriptor per user; without the header its rule
    // makes none, so nothing is asked and the request goes on.
    rls.forget_calls();
    for _ in 0..5 {
        assert_eq!(
            call(first.addr(), "/users/1", &[("x-user", "ann")], &[])
                .await
                .0,
            200
        );
    }
    assert_eq!(
        call(first.addr(), "/users/1", &[("x-user", "ann")], &[])
            .await
            .0,
        429
    );
    // The service's request headers go upstream, set over the client's of the name.
    let (status, _, echoed) = call(
        first.addr(),
        "/users/1",
        &[
            ("x-user", "bob"),
            ("x-rate-limited-by", "client"),
            ("x-noop-echo", "headers"),
        ],
        &[],
    )
    .await;
    assert_eq!(status, 200);
    let echoed = echoed.to_ascii_lowercase();
    assert!(
        echoed.contains("x-rate-limited-by: testbed")
            && !echoed.contains("x-rate-limited-by: client"),
        "{echoed}"
    );
    assert_eq!(call(first.addr(), "/users/1", &[], &[]).await.0, 200);
    // A route with the filter off is never asked, nor one that answers itself (as Envoy, which
    // asks for routes to a cluster only).
    assert_eq!(call(first.addr(), "/free", &[], &[]).await.0, 200);
    assert_eq!(call(first.addr(), "/direct", &[], &[]).await.2, "here");
    let asked = rls.asked();
    assert_eq!(asked.len(), 7, "{asked:?}");
    assert_eq!(
        asked[6],
        ("people".to_owned(), vec![vec!["user=bob".to_owned()]])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_is_down_fails_open_or_closed_as_configured() {
    let upstream = upstream().await;
    let down = closed_port();
    let filter = |deny: bool| {
        format!(
            r#"          service: {{ address: "{}" }}
          domain: edge
          failure_mode_deny: {deny}
          status_on_error: 503
          rate_limits:
            - actions: [{{ remote_address: {{}} }}]
"#,
            down.addr
        )
    };
    let open = Proxy::start(&config(&filter(false), upstream.local_addr()), 1);
    for _ in 0..3 {
        assert_eq!(call(open.addr(), "/", &[], &[]).await.0, 200);
    }
    let admin = open.admin.unwrap();
    assert_eq!(stat(admin, "http_ratelimit_error"), 3);
    assert_eq!(stat(admin, "http_ratelimit_failure_mode_allowed"), 3);
    let closed = Proxy::start(&config(&filter(true), upstream.local_addr()), 1);
    assert_eq!(call(closed.addr(), "/", &[], &[]).await.0, 503);
    assert_eq!(
        stat(closed.admin.unwrap(), "http_ratelimit_failure_mode_allowed"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_a_limit_in_envoys_rate_limit_service_on_redis() {
    let service = match real_service(
        "domain: edge\ndescriptors:\n  - key: generic_key\n    value: everyone\n    rate_limit: { unit: hour, requests_per_unit: 4 }\n",
    ) {
        Ok(service) => service,
        Err(missing) => {
            eprintln!("SKIPPED: the real rate limit service cannot run here: {missing}");
            return;
        }
    };
    let upstream = upstream().await;
    let filter = format!(
        r#"          service: {{ address: "{}" }}
          domain: edge
          timeout: 5s
          failure_mode_deny: true
          rate_limits:
            - actions: [{{ generic_key: {{ descriptor_value: everyone }} }}]
"#,
        service.grpc
    );
    let yaml = config(&filter, upstream.local_addr());
    let first = Proxy::start(&yaml, 1);
    let second = Proxy::start(&yaml, 1);
    let mut statuses = Vec::new();
    for i in 0..10 {
        let proxy = if i % 2 == 0 { &first } else { &second };
        statuses.push(call(proxy.addr(), "/", &[], &[]).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429, 429, 429, 429, 429]);
}

/// The route table's own `rate_limits` (Envoy's `VirtualHost.rate_limits` and
/// `RouteAction.rate_limits`, Contour's form): a route's own replace its host's unless it
/// includes them, rules of another stage are another filter's, and a route's filter settings
/// can ignore the host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_tables_own_rules_apply_by_envoys_precedence() {
    let upstream = upstream().await;
    let rls = RateLimitService::start("127.0.0.1:0".parse().unwrap(), 100)
        .await
        .unwrap();
    let service = rls.local_addr();
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - global_rate_limit:
          service: {{ address: "{service}" }}
          domain: contour
          timeout: 5s
    virtual_hosts:
      - name: site
        domains: ["*"]
        rate_limits:
          - actions: [{{ generic_key: {{ descriptor_value: host }} }}]
        routes:
          - match: {{ prefix: /own }}
            cluster: backend
            rate_limits:
              - actions: [{{ generic_key: {{ descriptor_value: route }} }}]
              - actions: [{{ generic_key: {{ descriptor_value: later }} }}]
                stage: 1
          - match: {{ prefix: /both }}
            cluster: backend
            include_vh_rate_limits: true
            rate_limits:
              - actions: [{{ generic_key: {{ descriptor_value: route }} }}]
          - match: {{ prefix: /alone }}
            cluster: backend
            filters: {{ global_rate_limit: {{ vh_rate_limits: ignore }} }}
          - match: {{ prefix: /given }}
            cluster: backend
            rate_limits:
              - actions: [{{ generic_key: {{ descriptor_value: route }} }}]
            filters:
              global_rate_limit:
                domain: policy
                rate_limits:
                  - actions: [{{ generic_key: {{ descriptor_value: given }} }}]
          - match: {{ prefix: / }}
            cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        upstream.local_addr()
    );
    let proxy = Proxy::start(&yaml, 1);
    let asked_for = async |path: &str| {
        rls.forget_calls();
        assert_eq!(call(proxy.addr(), path, &[], &[]).await.0, 200, "{path}");
        rls.asked()
            .into_iter()
            .map(|(domain, lists)| {
                let values: Vec<String> = lists.into_iter().flatten().collect();
                format!("{domain}: {}", values.join(" "))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(asked_for("/own").await, ["contour: generic_key=route"]);
    assert_eq!(
        asked_for("/both").await,
        ["contour: generic_key=route generic_key=host"]
    );
    assert_eq!(asked_for("/alone").await, Vec::<String>::new());
    assert_eq!(asked_for("/given").await, ["policy: generic_key=given"]);
    assert_eq!(asked_for("/").await, ["contour: generic_key=host"]);
    // The route table's rules are in the dump, at their levels.
    let (status, dump) = admin_request(proxy.admin.unwrap(), "GET", "/config_dump");
    assert_eq!(status, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let host = &dump["listeners"][0]["virtual_hosts"][0];
    assert_eq!(
        host["rate_limits"][0]["actions"][0]["generic_key"]["descriptor_value"],
        "host"
    );
    assert_eq!(host["routes"][0]["rate_limits"][1]["stage"], 1);
    assert_eq!(host["routes"][1]["include_vh_rate_limits"], true);
}
