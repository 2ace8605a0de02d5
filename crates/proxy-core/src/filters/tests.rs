//! The chain's order, short-circuit and per-route settings, and what a chain that does nothing
//! costs: tried on real filters built from config, with made-up requests.

use http::{HeaderValue, Method, Request, Response, StatusCode};

use super::*;

#[global_allocator]
static GLOBAL: alloc_meter::Counting = alloc_meter::Counting;

use super::testing::{Setup, setup, setup_hosts};

/// What a request through the chain came to: the response head the client would get.
struct Outcome {
    /// `Some(status)` when a filter answered.
    answered: Option<StatusCode>,
    response: http::response::Parts,
    upstream_saw: http::HeaderMap,
}

impl Setup {
    fn send(&self, path: &str, headers: &[(&str, &str)]) -> Outcome {
        self.send_method(Method::GET, path, headers)
    }

    fn send_method(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Outcome {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .body(RequestBody::empty())
            .unwrap();
        for (name, value) in headers {
            req.headers_mut().append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        // A `host` among the headers picks the virtual host, as a client's would.
        let host = req.headers().get(http::header::HOST).cloned();
        let host = host.unwrap_or_else(|| TEST_HOST.clone());
        let matched = crate::router::RouteTable::new(self.config.listeners[0].route_config.clone())
            .find(
                host.to_str().unwrap(),
                req.uri().path(),
                req.uri().query(),
                req.headers(),
            );
        let exchange = Exchange {
            conn: &self.conn,
            client: &self.client,
            host: Some(&host),
            virtual_host: matched.virtual_host,
            route: matched.route,
            weighted_cluster: matched.weighted,
            trace: None,
        };
        let mut state = FilterState::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let flow = runtime
            .block_on(self.chain.on_request(&mut req, &exchange, &mut state))
            .unwrap();
        let (answered, response) = match flow {
            Flow::Continue | Flow::ClearRoute => {
                (None, Response::new(ResponseBody::local(Bytes::new())))
            }
            Flow::Respond(reply) => {
                let status = reply.status;
                let mut response = Response::new(ResponseBody::local(Bytes::new()));
                *response.status_mut() = status;
                *response.headers_mut() = reply.headers;
                (Some(status), response)
            }
        };
        let mut response = response;
        let info = ResponseInfo {
            upstream: None,
            head_request: false,
            upgraded: false,
            grpc_request: false,
        };
        let body =
            runtime.block_on(
                self.chain
                    .on_response(&mut response, &exchange, &info, &mut state),
            );
        assert!(body.is_none());
        let (head, _) = response.into_parts();
        Outcome {
            answered,
            response: head,
            upstream_saw: req.headers().clone(),
        }
    }
}

/// The host every test request asks for.
static TEST_HOST: HeaderValue = HeaderValue::from_static("legate.test");

const ONE_ROUTE: &str = "      - match: { prefix: / }\n        direct_response: { status: 200 }";

#[test]
fn filters_run_in_order_and_a_local_answer_skips_the_rest() {
    let s = setup(
        "      - cors: { allow_origins: [\"https://app.test\"] }
      - local_rate_limit: { token_bucket: { max_tokens: 1, fill_interval: 1h } }
      - headers: { request: { set: { x-seen: yes } }, response: { set: { x-after: yes } } }",
        ONE_ROUTE,
    );
    let origin = [("origin", "https://app.test")];
    let first = s.send("/", &origin);
    assert_eq!(first.answered, None);
    assert_eq!(
        first.upstream_saw["x-seen"], "yes",
        "headers ran after the limit let it on"
    );
    assert_eq!(first.response.headers["x-after"], "yes");
    assert_eq!(
        first.response.headers["access-control-allow-origin"],
        "https://app.test"
    );

    let second = s.send("/", &origin);
    assert_eq!(second.answered, Some(StatusCode::TOO_MANY_REQUESTS));
    assert!(
        !second.upstream_saw.contains_key("x-seen"),
        "headers never ran"
    );
    assert!(
        !second.response.headers.contains_key("x-after"),
        "a filter after the one that answered sees no response either"
    );
    assert_eq!(
        second.response.headers["access-control-allow-origin"], "https://app.test",
        "a filter before it does"
    );
    assert_eq!(second.response.headers["x-ratelimit-remaining"], "0");
    assert_eq!(second.response.headers["retry-after"], "3600");
}

#[test]
fn routes_turn_filters_off_or_bring_their_own_settings() {
    let s = setup(
        "      - local_rate_limit: { token_bucket: { max_tokens: 1, fill_interval: 1h } }
      - headers: { response: { set: { x-tier: default } } }",
        "      - match: { prefix: /free }
        direct_response: { status: 200 }
        filters: { local_rate_limit: disabled, headers: disabled }
      - match: { prefix: /own }
        direct_response: { status: 200 }
        filters:
          local_rate_limit: { token_bucket: { max_tokens: 2, fill_interval: 1h } }
          headers: { response: { set: { x-tier: own } } }
      - match: { prefix: / }
        direct_response: { status: 200 }",
    );
    for _ in 0..5 {
        let free = s.send("/free", &[]);
        assert_eq!(free.answered, None);
        assert!(!free.response.headers.contains_key("x-tier"));
    }
    let own: Vec<_> = (0..3).map(|_| s.send("/own", &[]).answered).collect();
    assert_eq!(own, [None, None, Some(StatusCode::TOO_MANY_REQUESTS)]);
    let first = s.send("/own", &[]);
    assert_eq!(first.answered, Some(StatusCode::TOO_MANY_REQUESTS));
    let listener: Vec<_> = (0..2).map(|_| s.send("/other", &[]).answered).collect();
    assert_eq!(
        listener,
        [None, Some(StatusCode::TOO_MANY_REQUESTS)],
        "its own bucket"
    );
    // A route's header rules come after the listener's: its `set` wins.
    let s = setup(
        "      - headers: { response: { set: { x-tier: default } } }",
        "      - match: { prefix: / }
        direct_response: { status: 200 }
        filters: { headers: { response: { set: { x-tier: own } } } }",
    );
    assert_eq!(s.send("/", &[]).response.headers["x-tier"], "own");
}

#[test]
fn virtual_hosts_set_filters_for_their_routes_and_routes_over_them() {
    let s = setup_hosts(
        "      - local_rate_limit: { token_bucket: { max_tokens: 1, fill_interval: 1h } }
      - headers: { response: { add: { x-level: listener } } }",
        "      - name: api
        domains: [api.test]
        filters:
          local_rate_limit: { token_bucket: { max_tokens: 3, fill_interval: 1h } }
          headers: { response: { add: { x-level: host } } }
        routes:
          - match: { prefix: /a }
            direct_response: { status: 200 }
          - match: { prefix: /own }
            direct_response: { status: 200 }
            filters:
              local_rate_limit: { token_bucket: { max_tokens: 1, fill_interval: 1h } }
              headers: { response: { add: { x-level: route } } }
          - match: { prefix: / }
            direct_response: { status: 200 }
      - name: open
        domains: [open.test]
        filters: { local_rate_limit: disabled, headers: disabled }
        routes:
          - match: { prefix: /own }
            direct_response: { status: 200 }
            filters: { headers: { response: { add: { x-level: route } } } }
          - match: { prefix: / }
            direct_response: { status: 200 }
      - name: rest
        domains: [\"*\"]
        routes:
          - match: { prefix: / }
            direct_response: { status: 200 }",
    );
    let levels = |o: &Outcome| -> Vec<String> {
        o.response
            .headers
            .get_all("x-level")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    let api = [("host", "api.test")];
    // The host's bucket is one for all its routes without their own: 3 across /a and /.
    let shared: Vec<_> = ["/a", "/", "/a", "/"]
        .iter()
        .map(|p| s.send(p, &api).answered)
        .collect();
    assert_eq!(
        shared,
        [None, None, None, Some(StatusCode::TOO_MANY_REQUESTS)]
    );
    let own = s.send("/own", &api);
    assert_eq!(own.answered, None, "the route's own bucket");
    assert_eq!(levels(&own), ["listener", "host", "route"]);
    assert_eq!(
        s.send("/own", &api).answered,
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    // `disabled` on a host turns the filter off for its routes, unless a route brings
    // settings of its own.
    let open = [("host", "open.test")];
    for _ in 0..3 {
        let reply = s.send("/", &open);
        assert_eq!(reply.answered, None);
        assert!(levels(&reply).is_empty());
    }
    assert_eq!(levels(&s.send("/own", &open)), ["route"]);
    // Other hosts get the listener's.
    let rest = [("host", "www.test")];
    assert_eq!(levels(&s.send("/", &rest)), ["listener"]);
    assert_eq!(
        s.send("/", &rest).answered,
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
}

#[test]
fn header_variables_are_filled_in() {
    let s = setup(
        "      - headers:
          request:
            set: { x-client: \"%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%\", x-id: \"id=%REQ_ID%\" }
            add: { x-via: legate }
            remove: [x-secret]
          response:
            set: { x-addr: \"%DOWNSTREAM_REMOTE_ADDRESS%\", x-id: \"%REQ_ID%\", x-up: \"%UPSTREAM_HOST%\" }",
        ONE_ROUTE,
    );
    let out = s.send(
        "/",
        &[
            ("x-secret", "1"),
            ("x-via", "edge"),
            ("x-request-id", "abc"),
        ],
    );
    let seen = &out.upstream_saw;
    assert_eq!(seen["x-client"], "192.0.2.7");
    assert_eq!(seen["x-id"], "id=abc");
    assert!(!seen.contains_key("x-secret"));
    let via: Vec<_> = seen.get_all("x-via").iter().collect();
    assert_eq!(via, ["edge", "legate"]);
    assert_eq!(out.response.headers["x-addr"], "192.0.2.7:4321");
    // Not remembered by this test's driver, and no upstream: left out rather than empty.
    assert!(!out.response.headers.contains_key("x-id"));
    assert!(!out.response.headers.contains_key("x-up"));
}

#[test]
fn cors_preflights_are_answered_and_other_origins_pass_untouched() {
    let s = setup(
        "      - cors:
          allow_origins: [\"https://*.example.com\"]
          allow_methods: [GET, PUT]
          expose_headers: [x-request-id]
          max_age: 10m
          allow_credentials: true",
        ONE_ROUTE,
    );
    let preflight = [
        ("origin", "https://app.example.com"),
        ("access-control-request-method", "PUT"),
    ];
    let answer = s.send_method(Method::OPTIONS, "/", &preflight);
    assert_eq!(answer.answered, Some(StatusCode::NO_CONTENT));
    let headers = &answer.response.headers;
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert_eq!(headers["access-control-allow-methods"], "GET, PUT");
    assert_eq!(headers["access-control-max-age"], "600");
    assert_eq!(headers["access-control-allow-credentials"], "true");
    // From an origin not allowed, the preflight goes on as an ordinary request.
    let other = [
        ("origin", "https://evil.test"),
        ("access-control-request-method", "PUT"),
    ];
    assert_eq!(s.send_method(Method::OPTIONS, "/", &other).answered, None);
    let mut req_out = s.send("/", &preflight);
    // A preflight must be an OPTIONS: a GET with the same headers is a simple request.
    assert_eq!(req_out.answered, None);
    assert_eq!(
        req_out.response.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert_eq!(
        req_out.response.headers["access-control-expose-headers"],
        "x-request-id"
    );
    assert_eq!(
        req_out.response.headers["access-control-allow-credentials"],
        "true"
    );
    req_out = s.send("/", &[("origin", "https://evil.test")]);
    assert!(
        !req_out
            .response
            .headers
            .contains_key("access-control-allow-origin")
    );
    // Still marked as depending on the origin, so a cache keeps it from allowed origins.
    assert_eq!(req_out.response.headers["vary"], "origin");
    assert!(
        !s.send("/", &[("origin", "https://example.com")])
            .response
            .headers
            .contains_key("access-control-allow-origin")
    );
}

#[test]
fn a_chain_of_filters_that_do_nothing_does_not_allocate() {
    // Each filter is in the chain but has nothing to do for this request: no bucket, no
    // rules, a type compression does not touch, no Origin (and any origin allowed: a list of
    // origins puts `vary: origin` on every response, which is something to do).
    let s = setup(
        "      - local_rate_limit: {}
      - headers: {}
      - cors: { allow_origins: [\"*\"] }
      - compression: {}",
        ONE_ROUTE,
    );
    let exchange = Exchange {
        conn: &s.conn,
        client: &s.client,
        host: Some(&TEST_HOST),
        virtual_host: Some(0),
        route: Some(0),
        weighted_cluster: None,
        trace: None,
    };
    let info = ResponseInfo {
        upstream: None,
        head_request: false,
        upgraded: false,
        grpc_request: false,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut req = Request::get("/").body(RequestBody::empty()).unwrap();
    let mut head = Response::new(ResponseBody::local(Bytes::new()));
    let mut run = || {
        let mut state = FilterState::default();
        let flow = runtime.block_on(s.chain.on_request(&mut req, &exchange, &mut state));
        assert!(matches!(flow, Ok(Flow::Continue)));
        assert!(
            runtime
                .block_on(s.chain.on_response(&mut head, &exchange, &info, &mut state))
                .is_none()
        );
    };
    run();
    let before = alloc_meter::allocations();
    for _ in 0..100 {
        run();
    }
    assert_eq!(alloc_meter::allocations() - before, 0);
    // The meter works: the same loop over a filter with something to do allocates (a header
    // value per request).
    let s = setup(
        "      - headers: { request: { set: { x-client: \"%DOWNSTREAM_REMOTE_ADDRESS%\" } } }",
        ONE_ROUTE,
    );
    let exchange = Exchange {
        conn: &s.conn,
        client: &s.client,
        host: Some(&TEST_HOST),
        virtual_host: Some(0),
        route: Some(0),
        weighted_cluster: None,
        trace: None,
    };
    let before = alloc_meter::allocations();
    for _ in 0..100 {
        let mut state = FilterState::default();
        let flow = runtime.block_on(s.chain.on_request(&mut req, &exchange, &mut state));
        assert!(matches!(flow, Ok(Flow::Continue)));
    }
    assert!(alloc_meter::allocations() - before >= 100);
}

/// Descriptor buckets are taken slowest first; the first empty one refuses the request and
/// leaves the rest untouched; the default bucket is taken too unless told otherwise.
#[test]
fn descriptor_buckets_are_taken_slowest_first_and_stop_at_the_first_empty_one() {
    let s = setup(
        "      - local_rate_limit:
          token_bucket: { max_tokens: 3, fill_interval: 1h }
          x_ratelimit_headers: always
          descriptors:
            - { entries: [{ key: fast }], token_bucket: { max_tokens: 5, fill_interval: 1s } }
            - { entries: [{ key: slow, value: yes }], token_bucket: { max_tokens: 1, fill_interval: 1h } }
          rate_limits:
            - actions: [{ generic_key: { descriptor_key: fast, descriptor_value: any } }]
            - actions: [{ header_value_match: { descriptor_key: slow, descriptor_value: yes, headers: [{ name: x-slow, present: true }] } }]",
        ONE_ROUTE,
    );
    let limit_and_left = |o: &Outcome| {
        let h = &o.response.headers;
        (
            o.answered,
            h["x-ratelimit-limit"].to_str().unwrap().to_owned(),
            h["x-ratelimit-remaining"].to_str().unwrap().to_owned(),
        )
    };
    let slow = [("x-slow", "1")];
    // The slow bucket first: its headers; the fast one and the default give a token each.
    assert_eq!(
        limit_and_left(&s.send("/", &slow)),
        (None, "1".into(), "0".into())
    );
    // Refused by the slow bucket: the fast one and the default are not touched.
    let refused = s.send("/", &slow);
    assert_eq!(
        limit_and_left(&refused),
        (Some(StatusCode::TOO_MANY_REQUESTS), "1".into(), "0".into())
    );
    // The fast bucket alone: 5 - 2 = 3 left; the default has 3 - 2 = 1.
    assert_eq!(
        limit_and_left(&s.send("/", &[])),
        (None, "5".into(), "3".into())
    );
    assert_eq!(
        limit_and_left(&s.send("/", &[])),
        (None, "5".into(), "2".into())
    );
    // The default bucket is empty now.
    assert_eq!(
        limit_and_left(&s.send("/", &[])),
        (Some(StatusCode::TOO_MANY_REQUESTS), "3".into(), "0".into())
    );
}

/// The client's address in descriptors: `remote_address`, its network, and a match on
/// ranges (the test client is 192.0.2.7). A request a rule describes with the descriptor's
/// entry takes from its bucket (7), others from the default one (3).
#[test]
fn descriptors_name_the_client_by_address_and_network() {
    for (action, entry, found) in [
        (
            "remote_address: {}",
            "{ key: remote_address, value: 192.0.2.7 }",
            true,
        ),
        (
            "remote_address: {}",
            "{ key: remote_address, value: 192.0.2.8 }",
            false,
        ),
        (
            "masked_remote_address: { v4_prefix_mask_len: 24 }",
            "{ key: masked_remote_address, value: 192.0.2.0/24 }",
            true,
        ),
        (
            "remote_address_match: { descriptor_key: in, descriptor_value: x, ranges: [192.0.2.0/24], invert: true }",
            "{ key: in }",
            false,
        ),
        (
            "remote_address_match: { descriptor_key: in, descriptor_value: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%!', ranges: [10.0.0.0/8, 192.0.2.0/28] }",
            "{ key: in, value: 192.0.2.7! }",
            true,
        ),
    ] {
        let s = setup(
            &format!(
                "      - local_rate_limit:
          token_bucket: {{ max_tokens: 3, fill_interval: 1h }}
          x_ratelimit_headers: always
          descriptors: [{{ entries: [{entry}], token_bucket: {{ max_tokens: 7, fill_interval: 1h }} }}]
          rate_limits: [{{ actions: [{{ {action} }}] }}]"
            ),
            ONE_ROUTE,
        );
        let sent = s.send("/", &[]);
        let expected = if found { "7" } else { "3" };
        assert_eq!(
            sent.response.headers["x-ratelimit-limit"], expected,
            "{action} {entry}"
        );
    }
}
