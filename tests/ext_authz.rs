//! External authorization through the real binary, against the testbed sidecar over real
//! sockets: allow with header changes, deny, per-route settings, failure modes, Unix sockets,
//! one connection per worker, reconnection, HTTP mode, request bodies, and TLS to the service.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::certs::{Ca, Leaf};
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use testbed::{AuthzRules, AuthzSidecar, SidecarAddr, SidecarMode};

async fn upstream() -> testbed::NoopHandle {
    testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// Alice gets in; anyone else gets the sidecar's 401.
fn alice_only() -> AuthzRules {
    AuthzRules {
        deny_body: "no entry\n".into(),
        deny_headers: vec![("www-authenticate".into(), "Bearer realm=\"test\"".into())],
        add_headers: vec![("x-authz-user".into(), "alice".into())],
        response_headers: vec![("x-authz-checked".into(), "yes".into())],
        ..alice_or_401()
    }
}

/// One listener with `ext_authz` (given as a YAML flow map) forwarding to `upstream`, with
/// extra routes before the catch-all.
fn config(authz: &str, upstream: SocketAddr, routes: &str) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - ext_authz: {authz}
    routes:
{routes}      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

async fn send(proxy: &Proxy, headers: &[(&str, &str)]) -> (StatusCode, http::HeaderMap, String) {
    let response = send_h1(proxy.addr(), get("/", headers)).await;
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, text(body).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_adds_headers_and_a_denial_is_the_sidecars_answer() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(alice_only()).await;
    let authz = format!(
        "{{ grpc: {{ address: {} }} }}",
        sidecar.local_addr().unwrap()
    );
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
    let admin = proxy.admin.unwrap();

    let (status, headers, body) =
        send(&proxy, &[("x-user", "alice"), ("x-noop-echo", "headers")]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.contains("x-authz-user: alice"),
        "upstream sees the added header:\n{body}"
    );
    assert_eq!(headers["x-authz-checked"], "yes");

    // A client naming the added header as hop-by-hop does not strip it: hop-by-hop headers
    // go before the filter adds its own.
    let (status, _, body) = send(
        &proxy,
        &[
            ("x-user", "alice"),
            ("x-noop-echo", "headers"),
            ("connection", "keep-alive, x-authz-user"),
            ("x-authz-user", "forged"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("x-authz-user: alice"), "{body}");
    assert!(!body.contains("forged"), "{body}");

    let (status, headers, body) = send(&proxy, &[("x-user", "mallory")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"test\"");
    assert_eq!(body, "no entry\n");
    assert_eq!(
        upstream.requests(),
        2,
        "a denied request never reaches the upstream"
    );

    assert_eq!(stat(admin, "ext_authz_ok"), 2);
    assert_eq!(stat(admin, "ext_authz_denied"), 1);
    assert_eq!(stat(admin, "ext_authz_error"), 0);
    let time = admin_request(admin, "GET", "/stats?filter=^ext_authz_time").1;
    assert!(time.contains("count=3"), "{time}");
    assert_eq!(sidecar.checks(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_can_turn_the_check_off_or_send_context() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(alice_only()).await;
    let authz = format!(
        "{{ grpc: {{ address: {} }} }}",
        sidecar.local_addr().unwrap()
    );
    let routes = "      - match: { prefix: /public }
        direct_response: { status: 200, body: \"public\\n\" }
        filters: { ext_authz: disabled }
      - match: { prefix: /tenant }
        cluster: backend
        filters: { ext_authz: { context_extensions: { tenant: blue, tier: gold } } }
";
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), routes), 1);

    let response = send_h1(proxy.addr(), get("/public", &[])).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(text(response.into_body()).await, "public\n");
    assert_eq!(sidecar.checks(), 0, "no check on a disabled route");

    let response = send_h1(
        proxy.addr(),
        get(
            "/tenant",
            &[("x-user", "alice"), ("x-noop-echo", "headers")],
        ),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = text(response.into_body()).await;
    assert!(
        echoed.contains("x-ext-authz-context: tenant=blue;tier=gold"),
        "the sidecar saw the route's context:\n{echoed}"
    );
    // The catch-all route is still checked.
    let (status, _, _) = send(&proxy, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// With `clear_route_cache`, an allow that changes the request's headers has the route
/// matched again: here the header the service adds picks a route of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_that_changes_headers_can_route_the_request_again() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(alice_only()).await;
    let routes = "      - match: { prefix: /, headers: [{ name: x-authz-user, exact: alice }] }
        direct_response: { status: 200, body: \"members\\n\" }
";
    for clear in [true, false] {
        let authz = format!(
            "{{ grpc: {{ address: {} }}, clear_route_cache: {clear} }}",
            sidecar.local_addr().unwrap()
        );
        let proxy = Proxy::start(&config(&authz, upstream.local_addr(), routes), 1);
        let before = upstream.requests();
        let (status, headers, body) = send(&proxy, &[("x-user", "alice")]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body == "members\n",
            clear,
            "clear_route_cache: {clear}: {body}"
        );
        // The response phase ran with the check's allow either way.
        assert_eq!(headers["x-authz-checked"], "yes");
        assert_eq!(upstream.requests() - before, u64::from(!clear));
        // A denial is not routed again.
        let (status, _, _) = send(&proxy, &[("x-user", "eve")]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_works_like_tcp() {
    let upstream = upstream().await;
    let dir = ScratchDir::new();
    let socket = dir.0.join("authz.sock");
    let sidecar = AuthzSidecar::start(
        SidecarAddr::Unix(socket.clone()),
        SidecarMode::Grpc,
        alice_only(),
    )
    .await
    .unwrap();
    let authz = format!("{{ grpc: {{ address: \"unix:{}\" }} }}", socket.display());
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
    let (status, _, body) = send(&proxy, &[("x-user", "alice"), ("x-noop-echo", "headers")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("x-authz-user: alice"), "{body}");
    let (status, _, _) = send(&proxy, &[("x-user", "bob")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(sidecar.checks(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_slow_sidecar_gets_the_failure_mode_within_the_timeout() {
    let upstream = upstream().await;
    // Nothing listens here.
    let reserved = closed_port();
    let dead = reserved.addr;
    let closed = Proxy::start(
        &config(
            &format!("{{ grpc: {{ address: {dead} }}, timeout: 100ms }}"),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    for _ in 0..3 {
        let started = Instant::now();
        let (status, _, _) = send(&closed, &[]).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "failure_mode_allow is off by default"
        );
        // Refused at once; 10 s is a margin for a busy machine, not a measurement.
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    let custom = Proxy::start(
        &config(
            &format!("{{ grpc: {{ address: {dead} }}, status_on_error: 503 }}"),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    assert_eq!(send(&custom, &[]).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(stat(closed.admin.unwrap(), "ext_authz_error"), 3);
    assert_eq!(upstream.requests(), 0);

    // A check that takes a minute: the answer comes after the 100ms timeout, long before.
    let slow = grpc_sidecar(AuthzRules {
        delay: Duration::from_secs(60),
        ..AuthzRules::default()
    })
    .await;
    let lenient = Proxy::start(
        &config(
            &format!(
                "{{ grpc: {{ address: {} }}, timeout: 100ms, failure_mode_allow: true }}",
                slow.local_addr().unwrap()
            ),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    let started = Instant::now();
    let (status, _, body) = send(&lenient, &[("x-noop-echo", "headers")]).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("x-legate-auth-failure-mode-allowed: true"),
        "the upstream learns the check failed:\n{body}"
    );
    assert!(
        took < Duration::from_secs(20),
        "answered after the 100ms timeout, not the 60 s check: {took:?}"
    );
    let admin = lenient.admin.unwrap();
    assert_eq!(stat(admin, "ext_authz_timeout"), 1);
    assert_eq!(stat(admin, "ext_authz_error"), 1);
    assert_eq!(stat(admin, "ext_authz_failure_mode_allowed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_requests_share_one_connection_per_worker() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(AuthzRules {
        delay: Duration::from_millis(20),
        ..AuthzRules::default()
    })
    .await;
    // Timing is not what this test is about: a generous timeout, so a busy machine answers
    // every check rather than failing some at the 200ms default.
    let authz = format!(
        "{{ grpc: {{ address: {} }}, timeout: 30s }}",
        sidecar.local_addr().unwrap()
    );
    let workers = 2;
    // Answered by the proxy: 1000 simultaneous upstream connects would test the upstream's
    // accept backlog, not the sidecar connection.
    let direct =
        "      - match: { prefix: / }\n        direct_response: { status: 200, body: \"ok\\n\" }\n";
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), direct), workers);
    // 20 HTTP/2 connections of 50 streams each, all at once.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let addr = proxy.addr();
        tasks.push(tokio::spawn(async move {
            let (sender, _conn) = h2_client::<Full<Bytes>>(addr).await;
            let mut streams = Vec::new();
            for _ in 0..50 {
                let mut sender = sender.clone();
                streams.push(tokio::spawn(async move {
                    sender
                        .send_request(get_h2("/", &[]))
                        .await
                        .map(|r| r.status())
                }));
            }
            let mut outcomes = Vec::new();
            for s in streams {
                outcomes.push(match s.await.unwrap() {
                    Ok(status) => status.to_string(),
                    Err(e) => e.to_string(),
                });
            }
            outcomes
        }));
    }
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks {
        for outcome in t.await.unwrap() {
            *outcomes.entry(outcome).or_default() += 1;
        }
    }
    assert_eq!(outcomes.get("200 OK"), Some(&1000), "{outcomes:?}");
    assert_eq!(sidecar.checks(), 1000);
    assert!(
        (1..=workers as u64).contains(&sidecar.connections()),
        "{} connections to the sidecar for {workers} workers",
        sidecar.connections()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_reconnects_when_the_sidecar_restarts() {
    let upstream = upstream().await;
    let first = grpc_sidecar(AuthzRules::default()).await;
    let addr = first.local_addr().unwrap();
    let authz = format!("{{ grpc: {{ address: {addr} }} }}");
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
    // Load in the background until the test has seen what it waits for.
    let target = proxy.addr();
    let statuses = Arc::new(Mutex::new(Vec::<StatusCode>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (statuses, stop) = (Arc::clone(&statuses), Arc::clone(&stop));
        async move {
            while !stop.load(Ordering::Relaxed) {
                let response = send_h1(target, get("/", &[])).await;
                statuses.lock().unwrap().push(response.status());
                text(response.into_body()).await;
            }
        }
    });
    // Each step waits for what the proxy answers, not for time to pass.
    let seen = |status: StatusCode, after: usize| {
        let statuses = Arc::clone(&statuses);
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let count = statuses.lock().unwrap()[after..]
                    .iter()
                    .filter(|s| **s == status)
                    .count();
                if count >= 10 {
                    return statuses.lock().unwrap().len();
                }
                assert!(Instant::now() < deadline, "never saw ten {status}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let up = seen(StatusCode::OK, 0).await;
    first.shutdown();
    let down = seen(StatusCode::FORBIDDEN, up).await;
    let second = AuthzSidecar::start(
        SidecarAddr::Tcp(addr),
        SidecarMode::Grpc,
        AuthzRules::default(),
    )
    .await
    .unwrap();
    seen(StatusCode::OK, down).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let statuses = statuses.lock().unwrap();
    let allowed_after = statuses
        .iter()
        .rev()
        .take_while(|s| **s == StatusCode::OK)
        .count();
    assert!(statuses.first() == Some(&StatusCode::OK));
    assert!(
        allowed_after >= 10,
        "served again after the restart: {allowed_after} at the end"
    );
    assert!(second.checks() > 10);
    assert_eq!(
        second.connections(),
        1,
        "one new connection, not one per request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_mode_sends_method_path_and_allowed_headers() {
    let upstream = upstream().await;
    let sidecar = AuthzSidecar::start(
        SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        SidecarMode::Http,
        alice_only(),
    )
    .await
    .unwrap();
    let authz = format!(
        "{{ http: {{ address: {}, path_prefix: /authz, allowed_headers: [x-user], allowed_upstream_headers: [x-authz-user, x-ext-authz-saw] }} }}",
        sidecar.local_addr().unwrap()
    );
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
    let response = send_h1(
        proxy.addr(),
        get(
            "/orders?id=7",
            &[("x-user", "alice"), ("x-noop-echo", "headers")],
        ),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = text(response.into_body()).await;
    assert!(echoed.contains("x-authz-user: alice"), "{echoed}");
    assert!(
        echoed.contains("x-ext-authz-saw: GET /authz/orders?id=7"),
        "{echoed}"
    );

    let (status, headers, body) = send(&proxy, &[("x-user", "eve")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"test\"");
    assert_eq!(body, "no entry\n");
    assert_eq!(upstream.requests(), 1);
    assert_eq!(stat(proxy.admin.unwrap(), "ext_authz_denied"), 1);
}

/// A 5xx from an HTTP service is its failure, not a denial: retried where the policy says,
/// then the failure mode's answer. A path override is every check's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_checks_that_fail_are_retried_then_get_the_failure_mode() {
    let upstream = upstream().await;
    let failing_twice = || async {
        AuthzSidecar::start(
            SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
            SidecarMode::Http,
            AuthzRules {
                failing_first: 2,
                ..alice_only()
            },
        )
        .await
        .unwrap()
    };
    let with_retries = |sidecar: &AuthzSidecar, retries: u32| {
        format!(
            "{{ http: {{ address: {}, path_override: /auth/check, allowed_headers: [x-user], allowed_upstream_headers: [x-ext-authz-saw], retry_policy: {{ retry_on: [5xx], num_retries: {retries}, retry_back_off: {{ base_interval: 5ms }} }} }}, timeout: 10s }}",
            sidecar.local_addr().unwrap()
        )
    };

    // Two retries outlast two failures.
    let sidecar = failing_twice().await;
    let proxy = Proxy::start(
        &config(&with_retries(&sidecar, 2), upstream.local_addr(), ""),
        1,
    );
    let response = send_h1(
        proxy.addr(),
        get(
            "/orders?id=7",
            &[("x-user", "alice"), ("x-noop-echo", "headers")],
        ),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = text(response.into_body()).await;
    assert!(
        echoed.contains("x-ext-authz-saw: GET /auth/check\n"),
        "{echoed}"
    );
    assert_eq!(sidecar.checks(), 3);
    drop(proxy);

    // One retry does not: the failure is an error (403, the default `status_on_error`), not
    // the service's 503 passed on.
    let sidecar = failing_twice().await;
    let proxy = Proxy::start(
        &config(&with_retries(&sidecar, 1), upstream.local_addr(), ""),
        1,
    );
    let (status, _, body) = send(&proxy, &[("x-user", "alice")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!body.contains("failing on purpose"), "{body}");
    assert_eq!(sidecar.checks(), 2);
    assert_eq!(stat(proxy.admin.unwrap(), "ext_authz_error"), 1);
    // The next check is the service's third: answered.
    let (status, _, _) = send(&proxy, &[("x-user", "alice")]).await;
    assert_eq!(status, StatusCode::OK);
    drop(proxy);

    // Without a policy, a failure is not tried again, and failure_mode_allow lets it through.
    let sidecar = failing_twice().await;
    let authz = format!(
        "{{ http: {{ address: {} }}, failure_mode_allow: true }}",
        sidecar.local_addr().unwrap()
    );
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
    let (status, _, body) = send(&proxy, &[("x-noop-echo", "headers")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("x-legate-auth-failure-mode-allowed: true"),
        "{body}"
    );
    assert_eq!(sidecar.checks(), 1);
}

/// HTTP mode's header lists, as Istio and Envoy Gateway write them: headers added to every
/// check, an allow's headers appended upstream and added to the client's response, and the
/// headers of a denial the client gets (with the challenge, as Envoy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_checks_carry_added_headers_and_answers_pass_the_listed_ones() {
    let upstream = upstream().await;
    let sidecar = AuthzSidecar::start(
        SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        SidecarMode::Http,
        AuthzRules {
            // Only checks the proxy added the key to are allowed.
            allow_if: Some(("x-check-key".into(), "s3cret".into())),
            add_headers: vec![("x-authz-user".into(), "alice".into())],
            deny_status: 401,
            deny_body: "no entry\n".into(),
            deny_headers: vec![
                ("www-authenticate".into(), "Basic realm=\"edge\"".into()),
                ("x-deny-reason".into(), "no key".into()),
                ("x-internal".into(), "not for clients".into()),
            ],
            ..AuthzRules::default()
        },
    )
    .await
    .unwrap();
    let with = |extra: &str| {
        format!(
            "{{ http: {{ address: {}, allowed_client_headers_on_success: [x-ext-authz-saw], allowed_upstream_headers_to_append: [x-authz-user], allowed_client_headers: [x-deny-reason]{extra} }} }}",
            sidecar.local_addr().unwrap()
        )
    };
    let proxy = Proxy::start(
        &config(
            &with(", headers_to_add: { X-Check-Key: s3cret }"),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    let (status, headers, body) = send(
        &proxy,
        &[
            ("x-check-key", "the client's own"),
            ("x-authz-user", "bob"),
            ("x-noop-echo", "headers"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // Appended after the client's value, not over it.
    let users: Vec<&str> = (body.lines())
        .filter_map(|l| l.strip_prefix("x-authz-user: "))
        .collect();
    assert_eq!(users, ["bob", "alice"], "{body}");
    assert_eq!(headers["x-ext-authz-saw"], "GET /");
    drop(proxy);

    // Without the added key the service denies: the client gets the listed header and the
    // challenge, not the others.
    let proxy = Proxy::start(&config(&with(""), upstream.local_addr(), ""), 1);
    let (status, headers, body) = send(&proxy, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body, "no entry\n");
    assert_eq!(headers["x-deny-reason"], "no key");
    assert_eq!(headers["www-authenticate"], "Basic realm=\"edge\"");
    assert!(headers.get("x-internal").is_none(), "{headers:?}");
}

/// gRPC checks retried on the status a failed call carries in its head (`unavailable`), as
/// Envoy's router reads a trailers-only answer; `5xx` does not cover a gRPC status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_checks_that_fail_are_retried_on_their_grpc_status() {
    let upstream = upstream().await;
    let failing_twice = || {
        grpc_sidecar(AuthzRules {
            failing_first: 2,
            ..alice_only()
        })
    };
    let with_retries = |sidecar: &testbed::AuthzSidecar, retry_on: &str, retries: u32| {
        format!(
            "{{ grpc: {{ address: {}, retry_policy: {{ retry_on: [{retry_on}], num_retries: {retries}, retry_back_off: {{ base_interval: 5ms, max_interval: 5s }} }} }}, timeout: 10s }}",
            sidecar.local_addr().unwrap()
        )
    };

    // Two retries outlast two UNAVAILABLE answers: allowed, with the allow's headers.
    let sidecar = failing_twice().await;
    let proxy = Proxy::start(
        &config(
            &with_retries(&sidecar, "unavailable", 2),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    let (status, headers, _) = send(&proxy, &[("x-user", "alice")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-authz-checked"], "yes");
    assert_eq!(sidecar.checks(), 3);
    // A denial is an answer, never retried.
    let (status, _, body) = send(&proxy, &[("x-user", "mallory")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body, "no entry\n");
    assert_eq!(sidecar.checks(), 4);
    drop(proxy);

    // `5xx` reads the HTTP status, 200 for a gRPC failure: no retry, the failure mode answers.
    let sidecar = failing_twice().await;
    let proxy = Proxy::start(
        &config(&with_retries(&sidecar, "5xx", 2), upstream.local_addr(), ""),
        1,
    );
    let (status, _, _) = send(&proxy, &[("x-user", "alice")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(sidecar.checks(), 1);
    assert_eq!(stat(proxy.admin.unwrap(), "ext_authz_error"), 1);
    drop(proxy);

    // Each gRPC try is bounded by the back-off's most (as Envoy's gRPC client): a service
    // slower than that is tried again, then the failure mode answers, within the timeout.
    let slow = grpc_sidecar(AuthzRules {
        delay: std::time::Duration::from_millis(400),
        ..alice_only()
    })
    .await;
    let proxy = Proxy::start(
        &config(
            &format!(
                "{{ grpc: {{ address: {}, retry_policy: {{ retry_on: [reset], num_retries: 2, retry_back_off: {{ base_interval: 5ms, max_interval: 50ms }} }} }}, timeout: 20s }}",
                slow.local_addr().unwrap()
            ),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    let (status, _, _) = send(&proxy, &[("x-user", "alice")]).await;
    // One try would have been allowed after 400 ms, well within the timeout.
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The calls came in (recorded as they arrive; the last may be given up first).
    eventually("the calls tried again", async || {
        slow.authorities().len() >= 2
    })
    .await;
    assert!(slow.authorities().len() <= 3);
    drop(proxy);

    // A service not there yet: `connect-failure` tries again, so a check made while it
    // starts is answered once it is up (within the timeout).
    let port = closed_port();
    let late = port.addr;
    let proxy = Proxy::start_with_env(
        &config(
            &format!(
                "{{ grpc: {{ address: {late}, retry_policy: {{ retry_on: [connect-failure], num_retries: 1000, retry_back_off: {{ base_interval: 5ms, max_interval: 1s }} }} }}, timeout: 20s }}"
            ),
            upstream.local_addr(),
            "",
        ),
        1,
        &[("RUST_LOG", "info,authz_client=debug")],
    );
    let asked = tokio::spawn({
        let addr = proxy.addr();
        async move {
            send_h1(addr, get("/", &[("x-user", "alice")]))
                .await
                .status()
        }
    });
    // Once a check has failed to connect and is being retried, the service comes up.
    assert!(
        proxy.wait_for_log(
            "retrying a failed check",
            std::time::Duration::from_secs(20)
        ),
        "{}",
        proxy.log()
    );
    drop(port);
    let sidecar = testbed::AuthzSidecar::start(
        testbed::SidecarAddr::Tcp(late),
        testbed::SidecarMode::Grpc,
        alice_only(),
    )
    .await
    .unwrap();
    assert_eq!(asked.await.unwrap(), StatusCode::OK);
    assert!(sidecar.checks() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_go_to_the_service_within_the_limit() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(AuthzRules::default()).await;
    let at = sidecar.local_addr().unwrap();
    let post = |len: usize| {
        Request::post("/")
            .header("host", "legate.test")
            .header("x-noop-echo", "headers")
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .unwrap()
    };
    let strict = Proxy::start(
        &config(
            &format!(
                "{{ grpc: {{ address: {at} }}, with_request_body: {{ max_request_bytes: 16KiB }} }}"
            ),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    let response = send_h1(strict.addr(), post(1000)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = text(response.into_body()).await;
    assert!(echoed.contains("x-ext-authz-body-bytes: 1000"), "{echoed}");
    assert!(echoed.contains("content-length: 1000"), "{echoed}");
    let response = send_h1(strict.addr(), post(20_000)).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let partial = Proxy::start(
        &config(
            &format!(
                "{{ grpc: {{ address: {at} }}, with_request_body: {{ max_request_bytes: 16KiB, allow_partial_message: true }} }}"
            ),
            upstream.local_addr(),
            "",
        ),
        1,
    );
    // The service sees the first 16 KiB; the upstream gets all of it.
    let request = |echo: &str| {
        Request::post("/")
            .header("host", "legate.test")
            .header("x-noop-echo", echo)
            .body(Full::new(testbed::pattern_bytes(0, 50_000)))
            .unwrap()
    };
    let response = send_h1(partial.addr(), request("headers")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = text(response.into_body()).await;
    assert!(echoed.contains("x-ext-authz-body-bytes: 16384"), "{echoed}");
    let response = send_h1(partial.addr(), request("body")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        digest(response.into_body()).await,
        (50_000, testbed::pattern_sha256(50_000)),
        "the body read ahead for the check goes upstream whole and in order"
    );
    assert_eq!(stat(partial.admin.unwrap(), "ext_authz_ok"), 2);
}

#[test]
fn a_bad_ext_authz_config_names_its_key() {
    let dir = ScratchDir::new();
    let config = dir.write(
        "legate.yaml",
        &config(
            "{ grpc: { address: 127.0.0.1:9191 }, http: { address: 127.0.0.1:9192 } }",
            "127.0.0.1:9".parse().unwrap(),
            "",
        ),
    );
    let out = std::process::Command::new(BIN)
        .args(["validate", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listeners[0].http_filters[0].ext_authz: expected exactly one of"),
        "{stderr}"
    );
}

/// Several services in one chain (Envoy Gateway's one per policy), named `ext_authz/NAME`:
/// each asked in chain order where its routes turn it on, each allow's headers its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_services_are_asked_in_order_where_routes_turn_them_on() {
    let upstream = upstream().await;
    let users = grpc_sidecar(alice_only()).await;
    let tenants = grpc_sidecar(AuthzRules {
        allow_if: Some(("x-tenant".into(), "blue".into())),
        deny_status: 403,
        deny_body: "wrong tenant\n".into(),
        add_headers: vec![("x-authz-tenant".into(), "blue".into())],
        response_headers: vec![("x-tenant-checked".into(), "yes".into())],
        ..AuthzRules::default()
    })
    .await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - ext_authz/users: {{ grpc: {{ address: {users} }} }}
      - ext_authz/tenants: {{ grpc: {{ address: {tenants} }} }}
    routes:
      - match: {{ prefix: /users-only }}
        cluster: backend
        filters: {{ ext_authz/tenants: disabled }}
      - match: {{ prefix: /tenants-only }}
        cluster: backend
        filters: {{ ext_authz/users: disabled }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#,
        users = users.local_addr().unwrap(),
        tenants = tenants.local_addr().unwrap(),
        upstream = upstream.local_addr(),
    );
    let proxy = Proxy::start(&config, 1);
    let ask = |path: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let addr = proxy.addr();
        async move {
            let response = send_h1(addr, get(path, &headers)).await;
            let (parts, body) = response.into_parts();
            (parts.status, parts.headers, text(body).await)
        }
    };

    let (status, headers, _) = ask("/users-only", vec![("x-user", "alice")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-authz-checked"], "yes");
    assert!(!headers.contains_key("x-tenant-checked"));
    assert_eq!((users.checks(), tenants.checks()), (1, 0));

    let (status, headers, _) = ask("/tenants-only", vec![("x-tenant", "blue")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-tenant-checked"], "yes");
    assert!(!headers.contains_key("x-authz-checked"));
    assert_eq!((users.checks(), tenants.checks()), (1, 1));

    // Both: each allow adds its own headers upstream and downstream.
    let (status, headers, body) = ask(
        "/",
        vec![
            ("x-user", "alice"),
            ("x-tenant", "blue"),
            ("x-noop-echo", "headers"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("x-authz-user: alice"), "{body}");
    assert!(body.contains("x-authz-tenant: blue"), "{body}");
    assert_eq!(headers["x-authz-checked"], "yes");
    assert_eq!(headers["x-tenant-checked"], "yes");
    assert_eq!((users.checks(), tenants.checks()), (2, 2));

    // The second denies after the first allowed; a denial by the first asks no further.
    let (status, _, body) = ask("/", vec![("x-user", "alice"), ("x-tenant", "red")]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::FORBIDDEN, "wrong tenant\n")
    );
    let (status, _, body) = ask("/", vec![("x-user", "mallory"), ("x-tenant", "blue")]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNAUTHORIZED, "no entry\n")
    );
    assert_eq!((users.checks(), tenants.checks()), (4, 3));
    assert_eq!(
        upstream.requests(),
        3,
        "denied requests never reach the upstream"
    );

    let dump = admin_request(proxy.admin.unwrap(), "GET", "/config_dump").1;
    assert!(dump.contains("ext_authz/tenants"), "{dump}");
}

/// gRPC checks send only the allowed headers, and the route's metadata in the namespaces the
/// filter names (Envoy Gateway's `route_metadata_context_namespaces: [envoy-gateway]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_checks_send_the_allowed_headers_and_the_routes_metadata() {
    let upstream = upstream().await;
    let sidecar = grpc_sidecar(AuthzRules::default()).await;
    let config = format!(
        r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - ext_authz:
          grpc: {{ address: {sidecar}, allowed_headers: [X-User, ":path"] }}
          route_metadata_context_namespaces: [envoy-gateway]
    routes:
      - match: {{ prefix: /tagged }}
        cluster: backend
        metadata:
          envoy-gateway: {{ kind: HTTPRoute, name: orders }}
          internal: {{ owner: payments }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#,
        sidecar = sidecar.local_addr().unwrap(),
        upstream = upstream.local_addr(),
    );
    let proxy = Proxy::start(&config, 1);
    let headers = [
        ("x-user", "alice"),
        ("cookie", "secret"),
        ("x-noop-echo", "headers"),
    ];
    let response = send_h1(proxy.addr(), get("/tagged", &headers)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = text(response.into_body()).await;
    assert!(
        echoed
            .lines()
            .any(|l| l.trim_end() == "x-ext-authz-headers: :path,x-user"),
        "only the allowed headers:\n{echoed}"
    );
    assert!(
        echoed.contains(
            "x-ext-authz-route-metadata: envoy-gateway.kind=HTTPRoute;envoy-gateway.name=orders"
        ),
        "only the namespace the filter names:\n{echoed}"
    );
    let response = send_h1(proxy.addr(), get("/plain", &headers)).await;
    let echoed = text(response.into_body()).await;
    assert!(!echoed.contains("x-ext-authz-route-metadata"), "{echoed}");
    assert_eq!(sidecar.checks(), 2);
}

/// Two filters of a type need names; a route must name a filter the chain has.
#[test]
fn filters_of_one_type_are_named_and_routes_name_them() {
    let validate = |yaml: &str| {
        let dir = ScratchDir::new();
        let path = dir.write("legate.yaml", yaml);
        let out = std::process::Command::new(BIN)
            .args(["validate", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{yaml}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let listener = |filters: &str, route_filters: &str| {
        format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    http_filters:\n{filters}    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200 }}\n        filters: {{ {route_filters} }}\n"
        )
    };
    let two = "      - ext_authz: { grpc: { address: 127.0.0.1:9191 } }\n      - ext_authz: { grpc: { address: 127.0.0.1:9192 } }\n";
    let stderr = validate(&listener(two, "ext_authz: disabled"));
    assert!(
        stderr.contains("http_filters[1].ext_authz: `ext_authz` is already in the chain"),
        "{stderr}"
    );
    let named = "      - ext_authz/a: { grpc: { address: 127.0.0.1:9191 } }\n";
    let stderr = validate(&listener(named, "ext_authz/b: disabled"));
    assert!(
        stderr.contains("routes[0].filters.ext_authz/b: the listener has no `ext_authz/b` filter"),
        "{stderr}"
    );
}

/// A service that names a framing header (`content-length`, `transfer-encoding`) or a
/// hop-by-hop one cannot desynchronise the client: the proxy frames its replies itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_cannot_set_framing_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let upstream = upstream().await;
    let framing = |value: &str| {
        vec![
            ("content-length".to_string(), value.to_string()),
            ("transfer-encoding".to_string(), "chunked".to_string()),
            ("connection".to_string(), "close".to_string()),
        ]
    };
    let sidecar = grpc_sidecar(AuthzRules {
        deny_body: "no entry\n".into(),
        deny_headers: framing("3"),
        add_headers: framing("1"),
        response_headers: framing("2"),
        ..alice_or_401()
    })
    .await;
    let authz = format!(
        "{{ grpc: {{ address: {} }} }}",
        sidecar.local_addr().unwrap()
    );
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);

    // Two denials pipelined on one connection: each is exactly its own 9-byte body.
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(
            b"GET / HTTP/1.1\r\nhost: legate.test\r\n\r\n\
              GET / HTTP/1.1\r\nhost: legate.test\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("the proxy closes after the second reply")
        .unwrap();
    let response = String::from_utf8_lossy(&response).to_ascii_lowercase();
    assert_eq!(response.matches("http/1.1 401").count(), 2, "{response}");
    assert_eq!(
        response.matches("content-length: 9\r\n").count(),
        2,
        "{response}"
    );
    assert_eq!(response.matches("no entry\n").count(), 2, "{response}");
    assert!(!response.contains("transfer-encoding"), "{response}");

    // An allow: the upstream gets the request as the client framed it, and the client the
    // whole response.
    let request = Request::post("/")
        .header("host", "legate.test")
        .header("x-user", "alice")
        .header("x-noop-echo", "body")
        .body(Full::new(Bytes::from_static(b"twelve bytes")))
        .unwrap();
    let response = send_h1(proxy.addr(), request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(text(response.into_body()).await, "twelve bytes");
}

/// A sidecar's TLS server config: `leaf`'s certificate, offering `alpn`.
fn sidecar_tls(leaf: &Leaf, alpn: &[u8]) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], leaf.key_der())
        .unwrap();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// The service over TLS, gRPC and HTTP, verified by the CA and name given: Alice gets in and
/// Eve gets the service's answer. A service whose certificate another CA signed is never
/// asked: the check fails, and `status_on_error` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_go_over_tls_to_a_service_the_proxy_verifies() {
    let upstream = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("authz ca");
    let leaf = ca.leaf(&["authz.test"]);
    let ca_file = dir.write("ca.pem", &ca.pem());
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    for (mode, alpn, key, extra) in [
        (SidecarMode::Grpc, b"h2".as_slice(), "grpc", ""),
        // HTTP mode sends only the headers allowed.
        (
            SidecarMode::Http,
            b"http/1.1".as_slice(),
            "http",
            ", allowed_headers: [x-user]",
        ),
    ] {
        let sidecar =
            AuthzSidecar::start_tls(any_port, mode, alice_only(), sidecar_tls(&leaf, alpn))
                .await
                .unwrap();
        let authz = format!(
            "{{ {key}: {{ address: {}, tls: {{ ca: \"{}\", server_name: authz.test }}{extra} }} }}",
            sidecar.local_addr().unwrap(),
            ca_file.display()
        );
        let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
        let (status, _, _) = send(&proxy, &[("x-user", "alice")]).await;
        assert_eq!(status, StatusCode::OK, "{key}: {}", proxy.log());
        let (status, _, body) = send(&proxy, &[("x-user", "eve")]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{key}");
        assert_eq!(body, "no entry\n");
        assert_eq!(sidecar.checks(), 2, "{key}");
        if key == "grpc" {
            // Called by the name it is verified by.
            assert_eq!(sidecar.authorities(), ["authz.test", "authz.test"]);
        }
    }

    let stranger = AuthzSidecar::start_tls(
        any_port,
        SidecarMode::Grpc,
        alice_only(),
        sidecar_tls(&Ca::new("another ca").leaf(&["authz.test"]), b"h2"),
    )
    .await
    .unwrap();
    let authz = format!(
        "{{ grpc: {{ address: {}, tls: {{ ca: \"{}\", server_name: authz.test }} }}, status_on_error: 503 }}",
        stranger.local_addr().unwrap(),
        ca_file.display()
    );
    let proxy = Proxy::start(&config(&authz, upstream.local_addr(), ""), 1);
    let (status, _, _) = send(&proxy, &[("x-user", "alice")]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(stranger.checks(), 0, "never asked");
    assert_eq!(stat(proxy.admin.unwrap(), "ext_authz_error"), 1);
}
