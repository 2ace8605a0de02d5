//! Distributed tracing through the real binary, against the testbed's OTLP collector over real
//! sockets: W3C trace context from the client to the authorization service and the upstream,
//! spans with the right parents over gRPC and HTTP, sampling by the caller, by rate and forced
//! by header, and a slow or absent collector costing requests nothing while its losses are
//! counted.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::certs::{Ca, Leaf};
use common::*;
use http::StatusCode;
use testbed::{CollectorMode, OtlpCollector, ReceivedSpan};

const PATIENCE: Duration = Duration::from_secs(20);
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";
const SAMPLED_BY_CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn upstream() -> testbed::NoopHandle {
    testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn collector() -> OtlpCollector {
    OtlpCollector::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A traced listener forwarding to `upstream`; `tracing` and `filters` are YAML flow maps /
/// lists written into the config as they are.
fn config(tracing: &str, filters: &str, upstream: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
tracing: {tracing}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters: [{filters}]
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

/// The headers the upstream received, from its `x-noop-echo: headers` answer.
fn echoed(body: &str) -> BTreeMap<String, String> {
    body.lines()
        .skip(1)
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_owned()))
        .collect()
}

/// `traceparent`'s fields: (version, trace id, parent id, flags).
fn fields(traceparent: &str) -> (String, String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(traceparent.len(), 55, "{traceparent}");
    (
        parts[0].into(),
        parts[1].into(),
        parts[2].into(),
        parts[3].into(),
    )
}

async fn get_echo(proxy: &Proxy, headers: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut all = vec![("x-noop-echo", "headers")];
    all.extend_from_slice(headers);
    let response = send_h1(proxy.addr(), get("/items/7?x=1", &all)).await;
    assert_eq!(response.status(), StatusCode::OK);
    echoed(&text(response.into_body()).await)
}

/// `tracing_spans_total{outcome="OUTCOME"}` from the admin server.
fn spans_stat(admin: SocketAddr, outcome: &str) -> i64 {
    let (_, text) = admin_request(admin, "GET", "/stats?filter=tracing_spans_total");
    let needle = format!("outcome=\"{outcome}\"");
    text.lines()
        .filter(|l| l.contains(&needle) && !l.contains("worker="))
        .filter_map(|l| l.rsplit(": ").next()?.parse::<i64>().ok())
        .sum()
}

fn span<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span `{name}` in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_goes_from_the_client_through_the_check_to_the_upstream() {
    let upstream = upstream().await;
    let collector = collector().await;
    let sidecar = grpc_sidecar(testbed::AuthzRules::default()).await;
    let tracing = format!(
        "{{ otlp: {{ endpoint: \"{}\" }}, service_name: edge-test, random_sampling: 0 }}",
        collector.grpc_endpoint()
    );
    let authz = format!(
        "ext_authz: {{ grpc: {{ address: {} }} }}",
        sidecar.local_addr().unwrap()
    );
    let proxy = Proxy::start(&config(&tracing, &authz, upstream.local_addr()), 1);

    // The caller sampled its trace: the proxy follows, and its spans join the trace.
    let caller = format!("00-{TRACE}-{CALLER}-01");
    let seen = get_echo(
        &proxy,
        &[("traceparent", &caller), ("tracestate", "vendor=opaque")],
    )
    .await;
    let (version, trace, try_span, flags) = fields(&seen["traceparent"]);
    assert_eq!(
        (version.as_str(), trace.as_str(), flags.as_str()),
        ("00", TRACE, "01")
    );
    assert_ne!(try_span, CALLER, "the upstream's caller is the proxy");
    assert_eq!(seen["tracestate"], "vendor=opaque");
    let (_, check_trace, check_span, check_flags) = fields(&seen["x-ext-authz-traceparent"]);
    assert_eq!((check_trace.as_str(), check_flags.as_str()), (TRACE, "01"));

    assert!(
        collector.wait_for(PATIENCE, |spans| spans.len() >= 3).await,
        "three spans arrive: {:#?}",
        collector.spans()
    );
    let spans = collector.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert!(
        spans
            .iter()
            .all(|s| s.trace_id == TRACE && s.protocol == "grpc")
    );
    assert!(spans.iter().all(|s| s.service_name == "edge-test"));
    assert!(spans.iter().all(|s| s.trace_state == "vendor=opaque"));

    let ingress = span(&spans, "ingress");
    assert_eq!(ingress.parent_span_id, CALLER);
    assert_eq!(ingress.kind, 2, "server");
    assert_eq!(ingress.attributes["http.status_code"], "200");
    assert_eq!(ingress.attributes["http.method"], "GET");
    assert_eq!(ingress.attributes["http.url"], "legate.test/items/7?x=1");
    assert_eq!(ingress.attributes["upstream_cluster"], "backend");
    assert_eq!(
        ingress.attributes["upstream_address"],
        upstream.local_addr().to_string()
    );
    assert_eq!(
        ingress.attributes["guid:x-request-id"], seen["x-request-id"],
        "the span names the request id the upstream saw"
    );
    assert_eq!(ingress.status_code, 0);

    let check = span(
        &spans,
        "async envoy.service.auth.v3.Authorization.Check egress",
    );
    assert_eq!(
        check.span_id, check_span,
        "the service's caller is the check's span"
    );
    assert_eq!(check.parent_span_id, ingress.span_id);
    assert_eq!(check.kind, 3, "client");
    assert_eq!(check.attributes["ext_authz_status"], "ext_authz_ok");

    let upstream_try = span(&spans, "router backend egress");
    assert_eq!(
        upstream_try.span_id, try_span,
        "the upstream's caller is the try's span"
    );
    assert_eq!(upstream_try.parent_span_id, ingress.span_id);
    assert_eq!(upstream_try.kind, 3);
    assert_eq!(upstream_try.attributes["http.status_code"], "200");
    assert!(upstream_try.start_unix_nano >= ingress.start_unix_nano);
    assert!(upstream_try.end_unix_nano <= ingress.end_unix_nano);

    // HTTP/2 from the client: the same chain.
    let other = "0af7651916cd43dd8448eb211c80319c";
    let request = get_h2(
        "/h2",
        &[
            ("traceparent", &format!("00-{other}-b7ad6b7169203331-01")),
            ("x-noop-echo", "headers"),
        ],
    );
    let response = send_h2(proxy.addr(), request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = echoed(&text(response.into_body()).await);
    let (_, trace, try_span, _) = fields(&seen["traceparent"]);
    assert_eq!(trace, other);
    assert!(collector.wait_for(PATIENCE, |spans| spans.len() >= 6).await);
    let spans: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == other)
        .collect();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let ingress = span(&spans, "ingress");
    assert_eq!(ingress.parent_span_id, "b7ad6b7169203331");
    assert_eq!(ingress.attributes["http.protocol"], "HTTP/2.0");
    assert_eq!(span(&spans, "router backend egress").span_id, try_span);

    let admin = proxy.admin.unwrap();
    assert_eq!(spans_stat(admin, "sampled"), 6);
    eventually("every sampled span counted exported", async || {
        spans_stat(admin, "exported") == 6
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsampled_requests_carry_the_proxy_hop_and_a_header_forces_a_trace() {
    let upstream = upstream().await;
    let collector = collector().await;
    let sidecar = testbed::AuthzSidecar::start(
        testbed::SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        testbed::SidecarMode::Http,
        testbed::AuthzRules::default(),
    )
    .await
    .unwrap();
    // Over OTLP/HTTP this time, and the check in ext_authz's HTTP mode.
    let tracing = format!(
        "{{ otlp: {{ endpoint: \"{}\", protocol: http }}, random_sampling: 0 }}",
        collector.http_endpoint()
    );
    let authz = format!(
        "ext_authz: {{ http: {{ address: {}, allowed_upstream_headers: [x-ext-authz-traceparent] }} }}",
        sidecar.local_addr().unwrap()
    );
    let mut proxy = Proxy::start(&config(&tracing, &authz, upstream.local_addr()), 1);
    let admin = proxy.admin.unwrap();

    // The caller did not sample: the upstream sees the same trace, not sampled, with the
    // proxy's hop as its caller.
    let seen = get_echo(
        &proxy,
        &[("traceparent", &format!("00-{TRACE}-{CALLER}-00"))],
    )
    .await;
    let (_, trace, hop, flags) = fields(&seen["traceparent"]);
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE, "00"));
    assert_ne!(hop, CALLER);
    assert_eq!(
        seen["x-ext-authz-traceparent"], seen["traceparent"],
        "the service too sees the proxy hop as its caller"
    );

    // No context at all, or one that is not valid: a new trace, not sampled at 0%, and the
    // client's tracestate does not go on with it.
    for mut headers in [
        vec![],
        vec![
            ("traceparent", SAMPLED_BY_CALLER),
            ("traceparent", SAMPLED_BY_CALLER),
        ],
        vec![(
            "traceparent",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        )],
        vec![(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        )],
    ] {
        headers.push(("tracestate", "vendor=stale"));
        let seen = get_echo(&proxy, &headers).await;
        assert!(!seen.contains_key("tracestate"), "{seen:?}");
        let (version, trace, hop, flags) = fields(&seen["traceparent"]);
        assert_eq!((version.as_str(), flags.as_str()), ("00", "00"));
        assert_ne!(trace, "0".repeat(32));
        assert_ne!(trace, TRACE);
        assert_ne!(hop, "0".repeat(16));
    }

    // The force header samples a request from an internal address.
    let seen = get_echo(&proxy, &[("x-legate-force-trace", "1")]).await;
    let (_, forced, _, flags) = fields(&seen["traceparent"]);
    assert_eq!(flags, "01");
    let (_, _, check_span, _) = fields(&seen["x-ext-authz-traceparent"]);
    eventually("the forced request's spans recorded", async || {
        spans_stat(admin, "sampled") >= 3
    })
    .await;
    assert_eq!(spans_stat(admin, "sampled"), 3);
    // Stopped, the proxy sends every span it holds before it exits: those of the forced
    // request only, since no earlier request was sampled.
    proxy.terminate();
    assert!(proxy.wait(PATIENCE).is_some_and(|s| s.success()));
    let spans = collector.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert!(
        spans
            .iter()
            .all(|s| s.trace_id == forced && s.protocol == "http")
    );
    let ingress = span(&spans, "ingress");
    assert_eq!(ingress.parent_span_id, "", "a root span");
    let check = span(&spans, "async ext_authz egress");
    assert_eq!(check.span_id, check_span);
    assert_eq!(check.parent_span_id, ingress.span_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_full_sampling_every_request_without_a_decision_is_traced() {
    let upstream = upstream().await;
    let collector = collector().await;
    let tracing = format!(
        "{{ otlp: {{ endpoint: \"{}\" }}, random_sampling: 100 }}",
        collector.grpc_endpoint()
    );
    let mut proxy = Proxy::start(&config(&tracing, "", upstream.local_addr()), 2);
    for _ in 0..20 {
        let response = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
        text(response.into_body()).await;
    }
    // A caller inside that decided against it is followed, even at 100%.
    let seen = get_echo(
        &proxy,
        &[("traceparent", &format!("00-{TRACE}-{CALLER}-00"))],
    )
    .await;
    assert!(seen["traceparent"].ends_with("-00"));
    let admin = proxy.admin.unwrap();
    eventually("every span recorded", async || {
        spans_stat(admin, "sampled") >= 40
    })
    .await;

    // A stopping proxy sends what it holds before it exits: every span is there after.
    proxy.terminate();
    assert!(proxy.wait(PATIENCE).is_some_and(|s| s.success()));
    let spans = collector.spans();
    assert_eq!(spans.len(), 40, "{spans:#?}");
    let roots: Vec<_> = spans.iter().filter(|s| s.name == "ingress").collect();
    assert_eq!(roots.len(), 20);
    let traces: std::collections::BTreeSet<_> = roots.iter().map(|s| &s.trace_id).collect();
    assert_eq!(traces.len(), 20, "a trace each");
    assert!(roots.iter().all(|s| s.parent_span_id.is_empty()));
    assert!(!spans.iter().any(|s| s.trace_id == TRACE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_costs_requests_nothing_and_drops_are_counted() {
    let upstream = upstream().await;
    let collector = collector().await;
    collector.set_mode(CollectorMode::Stall);
    let tracing = format!(
        "{{ otlp: {{ endpoint: \"{}\", timeout: 120s }}, random_sampling: 100, \
         max_queued_spans: 8, max_export_batch: 4 }}",
        collector.grpc_endpoint()
    );
    let proxy = Proxy::start(&config(&tracing, "", upstream.local_addr()), 1);
    let admin = proxy.admin.unwrap();

    let requests = 60;
    for _ in 0..requests {
        let response = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
        text(response.into_body()).await;
    }
    // Two spans a request; the exporter holds one batch at the stalled collector and the
    // queue eight spans more: the rest are dropped, and counted.
    eventually("every sampled span counted", async || {
        spans_stat(admin, "sampled") == 2 * requests
    })
    .await;
    eventually("spans dropped", async || spans_stat(admin, "dropped") > 0).await;
    let (_, prometheus) = admin_request(admin, "GET", "/stats/prometheus");
    assert!(
        prometheus.contains("tracing_spans_total{outcome=\"dropped\"}"),
        "{prometheus}"
    );

    // Once the collector takes spans, what was queued arrives; the dropped never do.
    collector.set_mode(CollectorMode::Accept);
    eventually("the queue delivered", async || {
        let exported = spans_stat(admin, "exported");
        let dropped = spans_stat(admin, "dropped");
        exported + dropped == 2 * requests
    })
    .await;
    let dropped = spans_stat(admin, "dropped");
    assert!(dropped >= 2 * requests - 8 - 2 * 4 - 8, "dropped {dropped}");
    assert_eq!(collector.spans().len() as i64, 2 * requests - dropped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_collector_is_counted_and_logged_and_requests_go_on() {
    let upstream = upstream().await;
    let closed = closed_port();
    let tracing = format!(
        "{{ otlp: {{ endpoint: \"http://{}\", timeout: 2s }}, random_sampling: 100 }}",
        closed.addr
    );
    let proxy = Proxy::start(&config(&tracing, "", upstream.local_addr()), 1);
    let admin = proxy.admin.unwrap();
    for _ in 0..5 {
        let response = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
        text(response.into_body()).await;
    }
    eventually("failed exports counted", async || {
        spans_stat(admin, "failed") == 10
    })
    .await;
    assert!(
        proxy.wait_for_log("span export failed", PATIENCE),
        "{}",
        proxy.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_starts_with_a_reload() {
    let upstream = upstream().await;
    let collector = collector().await;
    let plain = forward_config(&[upstream.local_addr()], "");
    let proxy = Proxy::start(&plain, 1);
    let admin = proxy.admin.unwrap();
    // Untraced: a client's context goes on untouched.
    let caller = format!("00-{TRACE}-{CALLER}-01");
    let seen = get_echo(&proxy, &[("traceparent", &caller)]).await;
    assert_eq!(seen["traceparent"], caller);

    let traced = plain.replacen(
        "admin:",
        &format!(
            "tracing: {{ otlp: {{ endpoint: \"{}\" }} }}\nadmin:",
            collector.grpc_endpoint()
        ),
        1,
    );
    proxy.rewrite_config(&traced);
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    let seen = get_echo(&proxy, &[("traceparent", &caller)]).await;
    let (_, trace, hop, flags) = fields(&seen["traceparent"]);
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE, "01"));
    assert_ne!(hop, CALLER);
    assert!(collector.wait_for(PATIENCE, |spans| spans.len() >= 2).await);
    assert_eq!(span(&collector.spans(), "ingress").parent_span_id, CALLER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_try_is_a_span_and_a_timed_out_one_is_abandoned() {
    let upstream = upstream().await;
    let collector = collector().await;
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
tracing: {{ otlp: {{ endpoint: "{}" }}, random_sampling: 100 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /retried }}
        cluster: backend
        retry_policy: {{ retry_on: [5xx], num_retries: 1 }}
      - match: {{ prefix: /slow }}
        cluster: backend
        timeout: 300ms
clusters:
  - name: backend
    endpoints: [{}]
"#,
        collector.grpc_endpoint(),
        upstream.local_addr()
    );
    let mut proxy = Proxy::start(&yaml, 1);

    // Every try answers 503: two tries, each its own span under the request's.
    let response = send_h1(proxy.addr(), get("/retried", &[("x-noop-status", "503")])).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    text(response.into_body()).await;
    // The upstream is slower than the route's timeout: 504, and a try without an answer.
    let response = send_h1(proxy.addr(), get("/slow", &[("x-noop-delay", "10s")])).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    text(response.into_body()).await;
    proxy.terminate();
    assert!(proxy.wait(PATIENCE).is_some_and(|s| s.success()));

    let spans = collector.spans();
    assert_eq!(spans.len(), 5, "{spans:#?}");
    let ingress_of = |path: &str| {
        spans
            .iter()
            .find(|s| s.name == "ingress" && s.attributes["http.url"].ends_with(path))
            .unwrap_or_else(|| panic!("no ingress span for {path}: {spans:#?}"))
    };
    let retried = ingress_of("/retried");
    assert_eq!(retried.attributes["http.status_code"], "503");
    assert_eq!(retried.status_code, 2, "a 5xx is an error");
    let tries: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id == retried.span_id)
        .collect();
    assert_eq!(tries.len(), 2, "{spans:#?}");
    assert!(tries.iter().all(|t| t.name == "router backend egress"
        && t.attributes["http.status_code"] == "503"
        && t.status_code == 2));
    assert_ne!(tries[0].span_id, tries[1].span_id);

    let slow = ingress_of("/slow");
    assert_eq!(slow.attributes["http.status_code"], "504");
    assert_eq!(slow.attributes["response_flags"], "UT");
    let abandoned = spans
        .iter()
        .find(|s| s.parent_span_id == slow.span_id)
        .expect("the slow try's span");
    assert_eq!(abandoned.status_code, 2);
    assert!(!abandoned.attributes.contains_key("http.status_code"));
    assert_eq!(abandoned.attributes["error"], "true");
}

/// A collector's TLS server config: `leaf`'s certificate, `h2` and `http/1.1` offered.
fn collector_tls(leaf: &Leaf) -> std::sync::Arc<rustls::ServerConfig> {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], leaf.key_der())
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    std::sync::Arc::new(config)
}

/// Spans reach collectors behind TLS, over gRPC and over HTTP, each verified by the CA and
/// name given; a collector whose certificate another CA signed gets nothing, and the proxy
/// counts its exports as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_collector_over_tls_it_verifies() {
    let upstream = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("collector ca");
    let server = collector_tls(&ca.leaf(&["collector.test"]));
    let ca_file = dir.write("ca.pem", &ca.pem());
    let any_port = "127.0.0.1:0".parse().unwrap();
    for protocol in ["grpc", "http"] {
        let collector = OtlpCollector::start_tls(any_port, server.clone())
            .await
            .unwrap();
        let endpoint = match protocol {
            "grpc" => format!("https://{}", collector.local_addr()),
            _ => format!("https://{}/v1/traces", collector.local_addr()),
        };
        let tracing = format!(
            "{{ otlp: {{ endpoint: \"{endpoint}\", protocol: {protocol}, tls: {{ ca: \"{}\", server_name: collector.test }} }}, random_sampling: 100 }}",
            ca_file.display()
        );
        let proxy = Proxy::start(&config(&tracing, "", upstream.local_addr()), 1);
        let response = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            collector
                .wait_for(PATIENCE, |spans| spans.iter().any(|s| s.name == "ingress"))
                .await,
            "{protocol}: {}",
            proxy.log()
        );
    }

    let stranger = OtlpCollector::start_tls(
        any_port,
        collector_tls(&Ca::new("another ca").leaf(&["collector.test"])),
    )
    .await
    .unwrap();
    let tracing = format!(
        "{{ otlp: {{ endpoint: \"https://{}\", timeout: 2s, tls: {{ ca: \"{}\", server_name: collector.test }} }}, random_sampling: 100 }}",
        stranger.local_addr(),
        ca_file.display()
    );
    let proxy = Proxy::start(&config(&tracing, "", upstream.local_addr()), 1);
    let response = send_h1(proxy.addr(), get("/", &[])).await;
    assert_eq!(response.status(), StatusCode::OK);
    let admin = proxy.admin.unwrap();
    eventually("the unverified collector's exports failed", async || {
        spans_stat(admin, "failed") >= 2
    })
    .await;
    assert_eq!(stranger.exports(), 0, "nothing reached it");
}

/// Span names by format (`operation`, `upstream_operation`) and a route's own tracing: the
/// listener samples nothing, the route everything with its own tags and names; the request
/// span's name reads the path as the client sent it before the route's rewrite, the try's
/// the path as it went and its cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_trace_by_their_own_shares_and_spans_are_named_by_format() {
    let upstream = upstream().await;
    let collector = collector().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
tracing: {{ otlp: {{ endpoint: "{}" }}, random_sampling: 0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    tracing:
      operation: "%REQ(:AUTHORITY)%%PATH(NQ:ORIG)%"
      upstream_operation: "%UPSTREAM_CLUSTER%%PATH(NQ:PATH)%"
      custom_tags: [{{ tag: level, literal: listener }}, {{ tag: zone, literal: a }}]
    routes:
      - match: {{ prefix: /traced/ }}
        prefix_rewrite: /v2/
        cluster: backend
        tracing:
          random_sampling: 100
          custom_tags: [{{ tag: level, literal: route }}]
      - match: {{ prefix: /custom }}
        cluster: backend
        tracing:
          operation: "custom-%REQ(x-custom)%"
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        collector.grpc_endpoint(),
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    for path in ["/traced/items?page=2", "/custom?q=1", "/plain"] {
        let response = send_h1(proxy.addr(), get(path, &[("x-custom", "abc")])).await;
        assert_eq!(response.status(), StatusCode::OK);
        text(response.into_body()).await;
    }
    let admin = proxy.admin.unwrap();
    eventually("the routes' spans recorded", async || {
        spans_stat(admin, "exported") >= 4
    })
    .await;
    let spans = collector.spans();
    let names: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "backend/v2/items",
            "backend/custom",
            "custom-abc",
            "legate.test/traced/items"
        ]
        .into_iter()
        .collect(),
        "{spans:#?}"
    );
    assert_eq!(spans.len(), 4, "{spans:#?}");
    assert_eq!(spans_stat(admin, "sampled"), 4, "/plain is not sampled");
    let server = span(&spans, "legate.test/traced/items");
    assert_eq!(server.attributes["level"], "route");
    assert_eq!(server.attributes["zone"], "a");
    let child = span(&spans, "backend/v2/items");
    assert_eq!(child.parent_span_id, server.span_id);
    assert_eq!(child.trace_id, server.trace_id);
}

/// Envoy's route decorators on a traced listener: the decorator names the request span and,
/// propagating, is told to the client; a client's `x-envoy-decorator-operation` names it
/// instead and goes no further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decorators_name_request_spans() {
    let upstream = upstream().await;
    let collector = collector().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
tracing: {{ otlp: {{ endpoint: "{}" }}, random_sampling: 100 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /decorated }}
        cluster: backend
        decorator: {{ operation: checkout }}
      - match: {{ prefix: /quiet }}
        cluster: backend
        decorator: {{ operation: quiet, propagate: false }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        collector.grpc_endpoint(),
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();
    let res = send_h1(addr, get("/decorated", &[])).await;
    assert_eq!(res.headers()["x-envoy-decorator-operation"], "checkout");
    let res = send_h1(addr, get("/quiet", &[])).await;
    assert!(res.headers().get("x-envoy-decorator-operation").is_none());
    let asked = [
        ("x-envoy-decorator-operation", "from-client"),
        ("x-noop-echo", "headers"),
    ];
    let res = send_h1(addr, get("/decorated/own", &asked)).await;
    assert!(
        res.headers().get("x-envoy-decorator-operation").is_none(),
        "the client's name wins, and is not told back"
    );
    let seen = echoed(&text(res.into_body()).await);
    assert!(
        !seen.contains_key("x-envoy-decorator-operation"),
        "{seen:?}"
    );
    let admin = proxy.admin.unwrap();
    eventually("the spans recorded", async || {
        spans_stat(admin, "exported") >= 6
    })
    .await;
    let spans = collector.spans();
    let servers: Vec<(&str, &str)> = spans
        .iter()
        .filter(|s| s.kind == 2)
        .map(|s| (s.name.as_str(), s.attributes["http.url"].as_str()))
        .collect();
    assert_eq!(
        servers,
        [
            ("checkout", "legate.test/decorated"),
            ("quiet", "legate.test/quiet"),
            ("from-client", "legate.test/decorated/own"),
        ],
        "{spans:#?}"
    );
}
