use super::super::*;

const MINIMAL: &str = r#"
listeners:
  - name: public
    address: 127.0.0.1:8080
    routes:
      - match: { prefix: /healthz }
        direct_response: { status: 200, body: "ok\n" }
      - match: { prefix: / }
        cluster: backend
clusters:
  - name: backend
    endpoints: [127.0.0.1:9000, "localhost:9001"]
"#;

fn error_of(yaml: &str) -> String {
    Config::from_yaml(yaml).unwrap_err().to_string()
}

#[test]
fn fills_in_defaults() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.concurrency, Concurrency::Auto);
    assert_eq!(config.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
    let cluster = &config.clusters[0];
    assert_eq!(cluster.protocol, UpstreamProtocol::Http1);
    assert_eq!(cluster.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
    assert_eq!(
        cluster.endpoints[1].address,
        EndpointAddress::Ip("127.0.0.1:9001".parse().unwrap())
    );
    assert_eq!(cluster.endpoints[1].weight, 1);
    match &config.listeners[0].route_config.routes[1].action {
        RouteAction::Forward(f) => {
            assert_eq!(f.cluster, ClusterTarget::Index(0));
            assert_eq!(f.timeout, DEFAULT_ROUTE_TIMEOUT);
        }
        other => panic!("expected a forward action, got {other:?}"),
    }
}

#[test]
fn path_normalization_is_on_unless_turned_off() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(
        config.listeners[0].http.path_normalization,
        PathNormalization::default()
    );
    assert!(PathNormalization::default().normalize && PathNormalization::default().merge_slashes);
    let with = |settings: &str| {
        MINIMAL.replace(
            "    routes:\n",
            &format!("    http: {{ path_normalization: {settings} }}\n    routes:\n"),
        )
    };
    let config =
        Config::from_yaml(&with("{ merge_slashes: false, escaped_slashes: reject }")).unwrap();
    let settings = config.listeners[0].http.path_normalization;
    assert!(settings.normalize && !settings.merge_slashes);
    assert_eq!(settings.escaped_slashes, EscapedSlashes::Reject);
    assert_eq!(
        error_of(&MINIMAL.replace("prefix: /healthz", "prefix: /a//b")),
        "listeners[0].routes[0].match.prefix: `/a//b` would never match: request paths are normalised first (http.path_normalization); write `/a/b`"
    );
    assert!(
        Config::from_yaml(
            &with("{ merge_slashes: false }").replace("prefix: /healthz", "prefix: /a//b")
        )
        .is_ok()
    );
    // A prefix may end in the start of a dotted name (`/.` guards `/.git`, `/.env`); a path
    // or a dot segment inside a prefix is still one that would never match.
    for prefix in ["/.", "/..", "/static/."] {
        let yaml = MINIMAL.replace("prefix: /healthz", &format!("prefix: {prefix}"));
        assert!(Config::from_yaml(&yaml).is_ok(), "{prefix}");
    }
    for refused in ["prefix: /a/./b", "prefix: /./", "path: /."] {
        let yaml = MINIMAL.replace("prefix: /healthz", refused);
        assert!(Config::from_yaml(&yaml).is_err(), "{refused}");
    }
    assert_eq!(
        error_of(&with("{ escaped_slashes: drop }")),
        "listeners[0].http.path_normalization.escaped_slashes: expected `keep`, `reject`, `unescape_and_redirect` or `unescape_and_forward`, found `drop`"
    );
}

#[test]
fn unknown_keys_name_their_path() {
    let yaml = MINIMAL.replace(
        "    address: 127.0.0.1:8080",
        "    address: 127.0.0.1:8080\n    colour: blue",
    );
    let err = error_of(&yaml);
    assert!(err.contains("listeners[0]"), "{err}");
    assert!(err.contains("unknown field `colour`"), "{err}");
}

#[test]
fn a_missing_cluster_is_named() {
    let err = error_of(&MINIMAL.replace("cluster: backend", "cluster: nowhere"));
    assert!(
        err.starts_with("listeners[0].routes[1].cluster: unknown cluster `nowhere`"),
        "{err}"
    );
    assert!(err.contains("defined clusters: backend"), "{err}");
}

#[test]
fn duplicate_names_are_refused() {
    let yaml = format!("{MINIMAL}  - name: backend\n    endpoints: [127.0.0.1:1]\n");
    assert!(error_of(&yaml).starts_with("clusters[1].name: duplicate cluster name `backend`"));
}

#[test]
fn a_bad_address_is_named() {
    let err = error_of(&MINIMAL.replace("127.0.0.1:9000", "example.com"));
    assert!(
        err.starts_with("clusters[0].endpoints[0]: expected `IP:PORT` or `NAME:PORT`"),
        "{err}"
    );
    let err = error_of(&MINIMAL.replace("127.0.0.1:8080", "127.0.0.1"));
    assert!(err.starts_with("listeners[0].address"), "{err}");
}

#[test]
fn a_bad_duration_is_named() {
    let yaml = MINIMAL.replace(
        "        cluster: backend",
        "        cluster: backend\n        timeout: 10 fortnights",
    );
    let err = error_of(&yaml);
    assert!(err.contains("listeners[0].routes[1].timeout"), "{err}");
    assert!(err.contains("unknown unit"), "{err}");
}

#[test]
fn a_route_needs_exactly_one_action() {
    let yaml = MINIMAL.replace(
        "        cluster: backend",
        "        cluster: backend\n        direct_response: { status: 204 }",
    );
    assert!(error_of(&yaml).contains("not both"));
}

#[test]
fn concurrency_takes_auto_or_a_count() {
    let yaml = format!("concurrency: 3\n{MINIMAL}");
    assert_eq!(Config::from_yaml(&yaml).unwrap().worker_count(), 3);
    assert!(error_of(&format!("concurrency: 0\n{MINIMAL}")).starts_with("concurrency:"));
    assert!(error_of(&format!("concurrency: lots\n{MINIMAL}")).starts_with("concurrency:"));
}

#[test]
fn host_patterns_are_parsed() {
    let yaml = MINIMAL.replace(
        "{ prefix: /healthz }",
        "{ prefix: /healthz, host: \"*.Example.com\" }",
    );
    let config = Config::from_yaml(&yaml).unwrap();
    assert_eq!(
        config.listeners[0].route_config.routes[0].matcher.host,
        HostMatch::Suffix(".example.com".into())
    );
}

#[test]
fn host_rewrite_must_be_an_authority() {
    let yaml = MINIMAL.replace(
        "        cluster: backend",
        "        cluster: backend\n        host_rewrite: \"a b\"",
    );
    assert!(error_of(&yaml).starts_with("listeners[0].routes[1].host_rewrite"));
    let yaml = MINIMAL.replace(
        "        cluster: backend",
        "        cluster: backend\n        host_rewrite: api.internal:8443",
    );
    assert!(Config::from_yaml(&yaml).is_ok());
}

#[test]
fn load_balancing_options_are_checked() {
    let with = |extra: &str| {
        MINIMAL.replace(
            "  - name: backend\n",
            &format!("  - name: backend\n{extra}"),
        )
    };
    let config = Config::from_yaml(&with(
        "    lb_policy: maglev\n    hash_key: { header: x-user }\n",
    ))
    .unwrap();
    assert_eq!(
        config.clusters[0].hash_key,
        Some(HashKey::Header("x-user".parse().unwrap()))
    );
    assert!(
        error_of(&with(
            "    lb_policy: maglev\n    maglev: { table_size: 65536 }\n"
        ))
        .starts_with("clusters[0].maglev: ")
    );
    assert!(
        error_of(&with(
            "    lb_policy: round_robin\n    ring_hash: { minimum_ring_size: 8 }\n"
        ))
        .starts_with("clusters[0].ring_hash: options for `ring_hash` given")
    );
    assert!(error_of(&with("    lb_policy: fastest\n")).starts_with("clusters[0].lb_policy"));
    assert!(
        error_of(&with("    hash_key: { source_ip: true }\n")).starts_with("clusters[0].hash_key")
    );
    let weighted = MINIMAL.replace(
        "[127.0.0.1:9000, \"localhost:9001\"]",
        "[127.0.0.1:9000, { address: 127.0.0.1:9001, weight: 3 }]",
    );
    assert_eq!(
        Config::from_yaml(&weighted).unwrap().clusters[0].endpoints[1].weight,
        3
    );
    let zero = MINIMAL.replace(
        "[127.0.0.1:9000, \"localhost:9001\"]",
        "[{ address: 127.0.0.1:9001, weight: 0 }]",
    );
    assert!(error_of(&zero).starts_with("clusters[0].endpoints[0].weight"));
}

#[test]
fn buffer_limits_default_to_32_kib_and_take_units() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.listeners[0].buffer_limit, 32 * 1024);
    assert_eq!(config.clusters[0].buffer_limit, 32 * 1024);

    let set = MINIMAL
        .replace(
            "    address: 127.0.0.1:8080\n",
            "    address: 127.0.0.1:8080\n    per_connection_buffer_limit_bytes: 1MiB\n",
        )
        .replace(
            "    endpoints: [127.0.0.1:9000, \"localhost:9001\"]\n",
            "    endpoints: [127.0.0.1:9000]\n    per_connection_buffer_limit_bytes: 65536\n",
        );
    let config = Config::from_yaml(&set).unwrap();
    assert_eq!(config.listeners[0].buffer_limit, 1 << 20);
    assert_eq!(config.clusters[0].buffer_limit, 65536);

    let tiny = MINIMAL.replace(
        "    address: 127.0.0.1:8080\n",
        "    address: 127.0.0.1:8080\n    per_connection_buffer_limit_bytes: 1KiB\n",
    );
    assert!(
        error_of(&tiny)
            .starts_with("listeners[0].per_connection_buffer_limit_bytes: expected 16KiB")
    );
    let unitless = MINIMAL.replace(
        "    endpoints: [127.0.0.1:9000, \"localhost:9001\"]\n",
        "    endpoints: [127.0.0.1:9000]\n    per_connection_buffer_limit_bytes: 32 parsecs\n",
    );
    assert!(error_of(&unitless).starts_with("clusters[0]"));
}

#[test]
fn control_plane_http_settings_are_checked() {
    let with_http = |http: &str| {
        MINIMAL.replace(
            "    address: 127.0.0.1:8080\n",
            &format!("    address: 127.0.0.1:8080\n    http: {{ {http} }}\n"),
        )
    };
    let config = Config::from_yaml(MINIMAL).unwrap();
    let http = &config.listeners[0].http;
    assert_eq!(
        http.headers_with_underscores_action,
        HeadersWithUnderscores::Allow
    );
    assert_eq!(http.server_header, ServerHeader::PassThrough);
    assert_eq!(http.initial_stream_window_size, None);
    assert!(!http.suppress_proxy_headers);

    let config = Config::from_yaml(&with_http(
        "headers_with_underscores_action: reject_request, server_name: edge, initial_stream_window_size: 65535",
    ))
    .unwrap();
    let http = &config.listeners[0].http;
    assert_eq!(
        http.headers_with_underscores_action,
        HeadersWithUnderscores::RejectRequest
    );
    assert_eq!(http.server_header, ServerHeader::Overwrite("edge".into()));
    assert_eq!(http.initial_stream_window_size, Some(65535));

    for (http, error) in [
        (
            "headers_with_underscores_action: drop",
            "listeners[0].http.headers_with_underscores_action: expected `allow`",
        ),
        (
            "initial_stream_window_size: 1024",
            "listeners[0].http.initial_stream_window_size: expected 65535 to 2147483647",
        ),
        (
            "initial_connection_window_size: 2147483648",
            "listeners[0].http.initial_connection_window_size: expected 65535",
        ),
        (
            "server_header_transformation: overwrite",
            "listeners[0].http.server_name: expected the name",
        ),
        (
            "server_header_transformation: pass_through, server_name: edge",
            "listeners[0].http.server_name: a name is never sent",
        ),
        (
            "server_name: \"a\\nb\"",
            "listeners[0].http.server_name: expected a header value",
        ),
        (
            "server_header_transformation: replace, server_name: edge",
            "listeners[0].http.server_header_transformation: expected",
        ),
    ] {
        let found = error_of(&with_http(http));
        assert!(found.starts_with(error), "{http}: {found}");
    }
    let zero = MINIMAL.replace(
        "    address: 127.0.0.1:8080\n",
        "    address: 127.0.0.1:8080\n    max_connections_to_accept_per_socket_event: 0\n",
    );
    assert!(error_of(&zero).starts_with(
        "listeners[0].max_connections_to_accept_per_socket_event: expected at least 1"
    ));
}

#[test]
fn header_rules_take_add_if_absent_and_the_order_of_levels_on_the_listener_only() {
    let yaml = |route_rules: &str| {
        format!(
            r#"
listeners:
  - name: public
    address: 127.0.0.1:8080
    http_filters:
      - headers: {{ most_specific_wins: false, response: {{ add_if_absent: {{ x-a: "1" }} }} }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
        filters: {{ headers: {route_rules} }}
clusters:
  - name: backend
    endpoints: [127.0.0.1:9000]
"#
        )
    };
    let config = Config::from_yaml(&yaml("{ request: { set: { x-b: \"2\" } } }")).unwrap();
    let HttpFilterConfig::Headers(rules) = &config.listeners[0].http_filters[0].config else {
        panic!("a headers filter");
    };
    assert!(!rules.most_specific_wins);
    assert_eq!(rules.response.add_if_absent[0].0, "x-a");
    let found = error_of(&yaml("{ most_specific_wins: true }"));
    assert!(
        found.starts_with("listeners[0].routes[0].filters.headers.most_specific_wins"),
        "{found}"
    );
}

/// MINIMAL with a `tls:` section (given indented) on its listener.
fn with_listener_tls(tls: &str) -> String {
    MINIMAL.replace(
        "    address: 127.0.0.1:8080\n",
        &format!("    address: 127.0.0.1:8080\n    tls:\n{tls}"),
    )
}

#[test]
fn tls_keys_are_checked_before_any_file_is_read() {
    let cert = "      certificates:\n        - { cert_chain: a.pem, private_key: a.key }\n";
    for (extra, expected) in [
        (
            "      alpn: [h3]\n",
            "listeners[0].tls.alpn[0]: expected `h2` or `http/1.1`, found `h3`",
        ),
        (
            "      min_version: \"1.1\"\n",
            "listeners[0].tls.min_version: expected \"1.2\" or \"1.3\"",
        ),
        (
            "      unknown_server_name: drop\n",
            "listeners[0].tls.unknown_server_name: expected `default` or `reject`",
        ),
        (
            "      handshake_timeout: 0s\n",
            "listeners[0].tls.handshake_timeout: expected a duration above zero",
        ),
        (
            "      session_cache_size: 20000000\n",
            "listeners[0].tls.session_cache_size: expected 0 to 10000000",
        ),
    ] {
        let err = error_of(&with_listener_tls(&format!("{cert}{extra}")));
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
    let two_defaults = "      certificates:\n        - { cert_chain: a.pem, private_key: a.key }\n        - { cert_chain: b.pem, private_key: b.key }\n";
    assert!(
        error_of(&with_listener_tls(two_defaults))
            .contains("at most one certificate may leave out `server_names`")
    );
    let bad_name = "      certificates:\n        - { cert_chain: a.pem, private_key: a.key, server_names: [\"a..b\"] }\n";
    assert!(
        error_of(&with_listener_tls(bad_name))
            .contains("listeners[0].tls.certificates[0].server_names[0]")
    );
    let twice = "      certificates:\n        - { cert_chain: a.pem, private_key: a.key, server_names: [a.test] }\n        - { cert_chain: b.pem, private_key: b.key, server_names: [A.test] }\n";
    assert!(error_of(&with_listener_tls(twice)).contains("already given to another certificate"));
    let none = "      certificates: []\n";
    assert!(error_of(&with_listener_tls(none)).contains("expected at least one certificate"));
    // Past the keys, the files are read: a missing one is named with its key path.
    let err = error_of(&with_listener_tls(cert));
    assert!(
        err.starts_with("listeners[0].tls: cannot read a.pem"),
        "{err}"
    );
    let cluster_tls = MINIMAL.replace(
        "    endpoints: [127.0.0.1:9000, \"localhost:9001\"]\n",
        "    endpoints: [127.0.0.1:9000]\n    tls: { server_name: \"not a name\" }\n",
    );
    assert!(
        error_of(&cluster_tls)
            .contains("clusters[0].tls.server_name: expected a DNS name or an IP address")
    );
}

#[test]
fn ext_authz_keys_are_checked() {
    let with_authz = |authz: &str| {
        MINIMAL.replace(
            "    address: 127.0.0.1:8080\n",
            &format!("    address: 127.0.0.1:8080\n    http_filters: [{{ ext_authz: {authz} }}]\n"),
        )
    };
    let config = Config::from_yaml(&with_authz(
        "{ grpc: { address: \"unix:/run/authz.sock\" } }",
    ))
    .expect("valid ext_authz");
    let Some(HttpFilterConfig::ExtAuthz(authz)) =
        config.listeners[0].http_filters.first().map(|f| &f.config)
    else {
        panic!("ext_authz is the chain's filter");
    };
    assert_eq!(authz.timeout, DEFAULT_AUTHZ_TIMEOUT);
    assert_eq!(authz.status_on_error, http::StatusCode::FORBIDDEN);
    assert!(!authz.failure_mode_allow);
    assert_eq!(
        authz.service,
        AuthzService::Grpc {
            endpoint: ServiceEndpoint::Unix("/run/authz.sock".into()),
            authority: None,
            tls: None,
            allowed_headers: None,
            retry_policy: None,
        }
    );
    let config = Config::from_yaml(&with_authz(
        "{ http: { address: 127.0.0.1:9191, path_override: /check, retry_policy: { retry_on: [5xx, reset] } } }",
    ))
    .expect("valid ext_authz");
    let Some(HttpFilterConfig::ExtAuthz(authz)) =
        config.listeners[0].http_filters.first().map(|f| &f.config)
    else {
        panic!("ext_authz is the chain's filter");
    };
    let AuthzService::Http {
        path_override,
        retry_policy: Some(retry),
        ..
    } = &authz.service
    else {
        panic!("an HTTP service with a retry policy: {:?}", authz.service);
    };
    assert_eq!(path_override.as_deref(), Some("/check"));
    assert!(retry.retry_on.server_error && retry.retry_on.reset && !retry.retry_on.connect_failure);
    // Envoy's defaults for a core retry policy: one retry, 1 s doubling up to 10 s.
    assert_eq!(retry.num_retries, 1);
    assert_eq!(
        retry.back_off.base_interval,
        DEFAULT_AUTHZ_RETRY_BASE_INTERVAL
    );
    assert_eq!(
        retry.back_off.max_interval,
        DEFAULT_AUTHZ_RETRY_BASE_INTERVAL * 10
    );
    for (authz, expected) in [
        (
            "{ timeout: 1s }",
            "listeners[0].http_filters[0].ext_authz: expected exactly one of",
        ),
        (
            "{ grpc: { address: \"unix:\" } }",
            "listeners[0].http_filters[0].ext_authz.grpc.address: expected a socket path",
        ),
        (
            "{ grpc: { address: nowhere } }",
            "listeners[0].http_filters[0].ext_authz.grpc.address: expected an address",
        ),
        (
            "{ grpc: { address: 127.0.0.1:9191 }, status_on_error: 99 }",
            "listeners[0].http_filters[0].ext_authz.status_on_error",
        ),
        (
            "{ grpc: { address: 127.0.0.1:9191 }, with_request_body: { max_request_bytes: 1MiB } }",
            "listeners[0].http_filters[0].ext_authz.with_request_body.max_request_bytes: expected 1 byte up to the listener's buffer limit (32768 bytes)",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, path_prefix: authz } }",
            "listeners[0].http_filters[0].ext_authz.http.path_prefix",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, allowed_headers: [\"bad header\"] } }",
            "listeners[0].http_filters[0].ext_authz.http.allowed_headers[0]",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, path_prefix: /a, path_override: /b } }",
            "ext_authz.http.path_override: `path_prefix` and `path_override` do not go together",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, path_override: check } }",
            "ext_authz.http.path_override: expected a path",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, retry_policy: { retry_on: [] } } }",
            "ext_authz.http.retry_policy.retry_on: expected at least one condition",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, retry_policy: { retry_on: [retriable-status-codes] } } }",
            "ext_authz.http.retry_policy.retry_on: `retriable-status-codes` and `retriable-headers` need lists",
        ),
        (
            "{ http: { address: 127.0.0.1:9191, retry_policy: { retry_on: [5xx], retry_back_off: { base_interval: 2s, max_interval: 1s } } } }",
            "ext_authz.http.retry_policy.retry_back_off.max_interval: expected at least base_interval",
        ),
    ] {
        let err = error_of(&with_authz(authz));
        assert!(err.contains(expected), "{authz}: {err}");
    }
    let route = MINIMAL.replace(
        "        cluster: backend\n",
        "        cluster: backend\n        filters: { ext_authz: off }\n",
    );
    let err = error_of(
        &with_authz("{ grpc: { address: 127.0.0.1:9191 } }").replace(
            "        cluster: backend\n",
            "        cluster: backend\n        filters: { ext_authz: off }\n",
        ),
    );
    assert!(
        err.contains("listeners[0].routes[1].filters.ext_authz: expected `disabled`"),
        "{err}"
    );
    // Without the filter in the chain, a route cannot set it.
    assert!(error_of(&route).contains(
        "listeners[0].routes[1].filters.ext_authz: the listener has no `ext_authz` filter"
    ));
    // Where the keys used to be, the error says where they went.
    let old = MINIMAL.replace(
        "    address: 127.0.0.1:8080\n",
        "    address: 127.0.0.1:8080\n    ext_authz: { grpc: { address: 127.0.0.1:1 } }\n",
    );
    assert!(error_of(&old).contains("listeners[0].ext_authz: ext_authz is a filter now"));
}

#[test]
fn filter_keys_are_checked() {
    let with_filters = |filters: &str| {
        MINIMAL.replace(
            "    address: 127.0.0.1:8080\n",
            &format!("    address: 127.0.0.1:8080\n    http_filters:\n{filters}"),
        )
    };
    let config = Config::from_yaml(&with_filters(
        "      - local_rate_limit: { token_bucket: { max_tokens: 10 }, key: { client_ip: true } }\n      - compression:\n      - headers: { response: { set: { x-a: b } } }\n",
    ))
    .expect("valid filters");
    let chain = &config.listeners[0].http_filters;
    let Some(HttpFilterConfig::LocalRateLimit(limit)) = chain.first().map(|f| &f.config) else {
        panic!("{chain:?}");
    };
    let bucket = limit.token_bucket.expect("a bucket");
    assert_eq!((bucket.max_tokens, bucket.tokens_per_fill), (10, 10));
    assert_eq!(bucket.fill_interval, std::time::Duration::from_secs(1));
    assert_eq!(limit.status, http::StatusCode::TOO_MANY_REQUESTS);
    let Some(HttpFilterConfig::Compression(compression)) = chain.get(1).map(|f| &f.config) else {
        panic!("{chain:?}");
    };
    assert_eq!(
        compression.encodings,
        [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip]
    );
    for (filters, expected) in [
        ("      - nope: {}\n", "unknown filter `nope`"),
        (
            "      - headers: {}\n      - headers: {}\n",
            "listeners[0].http_filters[1].headers: `headers` is already in the chain",
        ),
        (
            "      - local_rate_limit: { token_bucket: { max_tokens: 0 } }\n",
            "listeners[0].http_filters[0].local_rate_limit.token_bucket.max_tokens: expected 1",
        ),
        (
            "      - local_rate_limit: { scope: everywhere }\n",
            "listeners[0].http_filters[0].local_rate_limit.scope",
        ),
        (
            "      - local_rate_limit: { key: { header: x-a, client_ip: true } }\n",
            "listeners[0].http_filters[0].local_rate_limit.key: expected exactly one",
        ),
        (
            "      - local_rate_limit: { descriptors: [{ entries: [{ key: a }], token_bucket: { max_tokens: 1 } }] }\n",
            "listeners[0].http_filters[0].local_rate_limit: `descriptors` and `rate_limits` go together",
        ),
        (
            "      - local_rate_limit: { descriptors: [{ entries: [{ key: a }], token_bucket: { max_tokens: 1 } }, { entries: [{ key: a, value: '' }], token_bucket: { max_tokens: 2 } }], rate_limits: [{ actions: [{ remote_address: {} }] }] }\n",
            "listeners[0].http_filters[0].local_rate_limit.descriptors[1].entries: another descriptor has the same entries",
        ),
        (
            "      - local_rate_limit: { descriptors: [{ entries: [{ key: a }], token_bucket: { max_tokens: 1 } }], rate_limits: [{ actions: [{ remote_address: {}, generic_key: { descriptor_value: x } }] }] }\n",
            "listeners[0].http_filters[0].local_rate_limit.rate_limits[0].actions[0]: expected exactly one of",
        ),
        (
            "      - local_rate_limit: { descriptors: [{ entries: [{ key: a }], token_bucket: { max_tokens: 1 } }], rate_limits: [{ actions: [{ remote_address_match: { descriptor_value: x, ranges: [10.0.0.0/33] } }] }] }\n",
            "listeners[0].http_filters[0].local_rate_limit.rate_limits[0].actions[0].remote_address_match.ranges[0]: expected a CIDR range",
        ),
        (
            "      - local_rate_limit: { descriptors: [{ entries: [{ key: a }], token_bucket: { max_tokens: 1 } }], rate_limits: [{ actions: [{ remote_address_match: { descriptor_value: '%REQ(x)%', ranges: [10.0.0.0/8] } }] }] }\n",
            "remote_address_match.descriptor_value: `%REQ(x)%`: the only operator here is %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
        ),
        (
            "      - local_rate_limit: { descriptors: [{ entries: [{ key: a }], token_bucket: { max_tokens: 1 } }], rate_limits: [{ actions: [{ header_value_match: { descriptor_value: x, headers: [{ name: ':scheme', exact: https }] } }] }] }\n",
            "header_value_match.headers[0].name: expected a header name or :method, :path or :authority, found `:scheme`",
        ),
        (
            "      - local_rate_limit: { enabled: 120% }\n",
            "listeners[0].http_filters[0].local_rate_limit.enabled: expected a percentage",
        ),
        (
            "      - headers: { request: { set: { content-length: \"0\" } } }\n",
            "listeners[0].http_filters[0].headers.request.set.content-length: `content-length` frames or routes",
        ),
        (
            "      - headers: { request: { set: { x-up: \"%UPSTREAM_HOST%\" } } }\n",
            "listeners[0].http_filters[0].headers.request.set.x-up: %UPSTREAM_HOST% is known only",
        ),
        (
            "      - headers: { response: { add: { x-a: \"%NOPE%\" } } }\n",
            "unknown variable `%NOPE%`",
        ),
        (
            "      - compression: { encodings: [deflate] }\n",
            "listeners[0].http_filters[0].compression.encodings[0]: expected zstd, br or gzip",
        ),
        (
            "      - compression: { gzip_level: 10 }\n",
            "listeners[0].http_filters[0].compression.gzip_level: expected 1 to 9",
        ),
        (
            "      - headers: { request: { remove_matching: [{ regex: \"(\" }] } }\n",
            "listeners[0].http_filters[0].headers.request.remove_matching[0].regex: invalid regex",
        ),
        (
            "      - header_mutation: { response: { remove_matching: [{}] } }\n",
            "listeners[0].http_filters[0].header_mutation.response.remove_matching[0]: expected one of",
        ),
        (
            "      - buffer: {}\n",
            "listeners[0].http_filters[0].buffer.max_request_bytes: required",
        ),
        (
            "      - compression: { etag: keep }\n",
            "listeners[0].http_filters[0].compression.etag: expected weaken, remove or skip",
        ),
        (
            "      - cors: { allow_origins: [\"*\"], allow_credentials: true }\n",
            "listeners[0].http_filters[0].cors.allow_origins[0]: `*` cannot be used with",
        ),
        (
            "      - cors: { allow_origins: [app.test] }\n",
            "expected an origin `scheme://host[:port]`",
        ),
        (
            "      - cors: { allow_origins: [{ regex: \"(\" }] }\n",
            "listeners[0].http_filters[0].cors.allow_origins[0].regex: invalid regex",
        ),
        (
            "      - cors: { allow_origins: [{ ignore_case: true }] }\n",
            "listeners[0].http_filters[0].cors.allow_origins[0]: expected one of",
        ),
        (
            "      - cors: { allow_origins: [\"*\"], allow_methods: [\"*\", GET] }\n",
            "listeners[0].http_filters[0].cors.allow_methods: `*` (what the preflight asks for) stands alone",
        ),
        (
            "      - cors: { allow_origins: [{ exact: \"*\" }], allow_credentials: true }\n",
            "listeners[0].http_filters[0].cors.allow_origins[0]: this matcher allows every origin",
        ),
        (
            "      - cors: { allow_origins: [{ regex: \".*\", ignore_case: true }] }\n",
            "listeners[0].http_filters[0].cors.allow_origins[0].ignore_case: has no effect on a regex",
        ),
        (
            "      - health_check: {}\n",
            "listeners[0].http_filters[0].health_check: expected a `path` or `headers`",
        ),
        (
            "      - health_check: { path: ready }\n",
            "listeners[0].http_filters[0].health_check.path: expected a path starting with `/`",
        ),
        (
            "      - cors: { allow_origins: [\"*\"], preflight_status: 302 }\n",
            "listeners[0].http_filters[0].cors.preflight_status: expected a 2xx status",
        ),
    ] {
        let err = error_of(&with_filters(filters));
        assert!(err.contains(expected), "{filters}: {err}");
    }
    // A route's own rate limit needs a bucket.
    let route = with_filters("      - local_rate_limit: {}\n").replace(
        "        cluster: backend\n",
        "        cluster: backend\n        filters: { local_rate_limit: { scope: worker } }\n",
    );
    assert!(error_of(&route).contains(
        "listeners[0].routes[1].filters.local_rate_limit.token_bucket: a route's own limit needs"
    ));
}

#[test]
fn dns_names_and_their_settings() {
    let named = MINIMAL.replace("127.0.0.1:9000", "backend.internal:9000");
    let config = Config::from_yaml(&named).unwrap();
    let cluster = &config.clusters[0];
    assert!(cluster.has_names());
    assert_eq!(cluster.dns, DnsConfig::default());
    let tuned = named.replace(
        "\"localhost:9001\"]\n",
        "\"localhost:9001\"]\n    dns_refresh_rate: 30s\n    dns_min_refresh_rate: 2s\n    respect_dns_ttl: false\n    dns_lookup_family: all\n    dns_resolvers: [10.0.0.53, \"[::1]:5353\"]\n",
    );
    let dns = Config::from_yaml(&tuned).unwrap().clusters[0].dns.clone();
    assert_eq!(
        dns,
        DnsConfig {
            refresh_rate: Duration::from_secs(30),
            min_refresh_rate: Duration::from_secs(2),
            respect_ttl: false,
            lookup_family: DnsLookupFamily::All,
            resolvers: vec![
                "10.0.0.53:53".parse().unwrap(),
                "[::1]:5353".parse().unwrap()
            ],
            logical: false,
        }
    );
    // A logical DNS cluster has one endpoint, a name.
    let logical = |endpoints: &str| {
        MINIMAL.replace(
            "[127.0.0.1:9000, \"localhost:9001\"]\n",
            &format!("{endpoints}\n    logical_dns: true\n"),
        )
    };
    let config = Config::from_yaml(&logical("[\"localhost:9001\"]")).unwrap();
    assert!(config.clusters[0].dns.logical);
    for endpoints in ["[127.0.0.1:9000, \"localhost:9001\"]", "[127.0.0.1:9000]"] {
        let error = error_of(&logical(endpoints));
        assert!(error.contains("clusters[0].logical_dns"), "{error}");
    }
    let with = |key: &str| {
        error_of(&named.replace(
            "\"localhost:9001\"]\n",
            &format!("\"localhost:9001\"]\n    {key}\n"),
        ))
    };
    assert!(with("dns_lookup_family: v5").starts_with("clusters[0].dns_lookup_family"));
    assert!(with("dns_refresh_rate: 0s").starts_with("clusters[0].dns_refresh_rate"));
    assert!(
        with("dns_min_refresh_rate: 10s").starts_with("clusters[0].dns_min_refresh_rate"),
        "above the 5 s refresh rate"
    );
    assert!(with("dns_resolvers: [dns.internal]").starts_with("clusters[0].dns_resolvers[0]"));
    let twice = MINIMAL.replace("127.0.0.1:9000", "api.internal:80, API.internal:80");
    assert!(error_of(&twice).contains("api.internal:80 is listed twice"));
}

#[test]
fn a_weighted_clusters_header_rules_need_the_headers_filter() {
    let split = MINIMAL.replace(
        "        cluster: backend\n",
        "        weighted_clusters:\n          - { cluster: backend, weight: 1, headers: { request: { set: { x-side: a } } } }\n",
    );
    assert!(
        error_of(&split).contains(
            "listeners[0].routes[1].weighted_clusters[0].headers: the listener has no `headers` filter"
        ),
        "{}",
        error_of(&split)
    );
    let with_filter = split.replace(
        "    routes:\n",
        "    http_filters:\n      - headers: {}\n    routes:\n",
    );
    let config = Config::from_yaml(&with_filter).unwrap();
    let RouteAction::Forward(forward) = &config.listeners[0].route_config.routes[1].action else {
        panic!("a forward");
    };
    let rules = forward.split.as_ref().unwrap().clusters[0].headers.as_ref();
    assert_eq!(rules.unwrap().request.set[0].0, "x-side");
}

#[test]
fn auto_protocol_needs_tls_and_endpoints_check_their_localities() {
    let cluster = |extra: &str| {
        format!(
            "listeners: [{{ name: l, address: 127.0.0.1:0, routes: [{{ match: {{ prefix: / }}, cluster: c }}] }}]\nclusters: [{{ name: c, {extra} }}]\n"
        )
    };
    let error = error_of(&cluster("endpoints: [127.0.0.1:1], protocol: auto"));
    assert!(
        error.contains("clusters[0].protocol") && error.contains("needs `tls`"),
        "{error}"
    );
    // One locality at one priority has one weight.
    let error = error_of(&cluster(
        "endpoints: [{ address: 127.0.0.1:1, locality: a, locality_weight: 1 }, { address: 127.0.0.1:2, locality: a, locality_weight: 2 }]",
    ));
    assert!(error.contains("endpoints[1].locality_weight"), "{error}");
    let error = error_of(&cluster(
        "endpoints: [{ address: 127.0.0.1:1, health: sleepy }]",
    ));
    assert!(error.contains("endpoints[0].health"), "{error}");
    // Locality weights share a hashing policy's table (Envoy's thread-aware balancers).
    let maglev = Config::from_yaml(&cluster(
        "endpoints: [127.0.0.1:1], lb_policy: maglev, locality_weighted: true",
    ))
    .unwrap();
    assert!(maglev.clusters[0].lb_settings.locality_weighted);
    let error = error_of(&cluster(
        "endpoints: [127.0.0.1:1], healthy_panic_threshold: 101",
    ));
    assert!(
        error.contains("clusters[0].healthy_panic_threshold"),
        "{error}"
    );
    let config = Config::from_yaml(&cluster(
        "endpoints: [{ address: 127.0.0.1:1, priority: 1, locality: eu/a, locality_weight: 2, health: degraded }], locality_weighted: true, overprovisioning_factor: 100",
    ))
    .unwrap();
    let c = &config.clusters[0];
    assert_eq!(c.endpoints[0].priority, 1);
    assert_eq!(c.endpoints[0].locality.as_deref(), Some("eu/a"));
    assert_eq!(c.endpoints[0].health, EndpointHealth::Degraded);
    assert!(c.lb_settings.locality_weighted);
    assert_eq!(c.lb_settings.overprovisioning_factor, 100);
}

#[test]
fn zone_aware_routing_needs_a_local_cluster_that_exists_and_the_nodes_locality() {
    // `cluster` goes into the cluster `backend`, the last of MINIMAL.
    let with = |top: &str, cluster: &str| format!("{top}\n{MINIMAL}    {cluster}\n");
    let good = with(
        "node: { locality: { region: eu, zone: a } }\ncluster_manager: { local_cluster_name: backend }",
        "zone_aware: { routing_enabled: 90, min_cluster_size: 1, force_local_zone_min_size: 2 }",
    );
    let config = Config::from_yaml(&good).unwrap();
    let local = config.local_cluster.as_ref().unwrap();
    assert_eq!(
        (local.name.as_str(), local.locality.as_str()),
        ("backend", "eu/a/")
    );
    let zone = config.clusters[0].lb_settings.zone_aware;
    assert_eq!(zone.routing_enabled, 90);
    assert_eq!(zone.min_cluster_size, 1);
    assert_eq!(zone.force_local_zone_min_size, Some(2));

    let missing = error_of(&with(
        "node: { locality: { zone: a } }\ncluster_manager: { local_cluster_name: fleet }",
        "zone_aware: {}",
    ));
    assert!(missing.contains("no cluster is named `fleet`"), "{missing}");
    let no_locality = error_of(&with(
        "cluster_manager: { local_cluster_name: backend }",
        "zone_aware: {}",
    ));
    assert!(no_locality.contains("node.locality"), "{no_locality}");
    let both = error_of(&with("", "zone_aware: {}\n    locality_weighted: true"));
    assert!(both.contains("clusters[0].zone_aware"), "{both}");
    let over = error_of(&with("", "zone_aware: { routing_enabled: 101 }"));
    assert!(over.contains("routing_enabled"), "{over}");
}

#[test]
fn grpc_health_checks_need_an_http2_cluster_and_no_http_settings() {
    let with = |cluster: &str| format!("{MINIMAL}    {cluster}\n");
    let http1 = error_of(&with("health_check: { grpc: { service_name: orders } }"));
    assert!(http1.contains("clusters[0].health_check.grpc"), "{http1}");
    let config = Config::from_yaml(&with(
        "protocol: http2\n    health_check: { grpc: { service_name: orders }, request_headers_to_add: { x-probe: legate } }",
    ))
    .unwrap();
    let check = config.clusters[0].health_check.as_ref().unwrap();
    assert_eq!(check.grpc.as_ref().unwrap().service_name, "orders");
    assert_eq!(check.request_headers_to_add[0].0, "x-probe");
    let path = error_of(&with(
        "protocol: http2\n    health_check: { grpc: {}, path: /healthz }",
    ));
    assert!(path.contains("not a setting of a gRPC check"), "{path}");
}

#[test]
fn upstream_http2_streams_and_pings_are_checked_and_defaulted() {
    let with = |cluster: &str| format!("{MINIMAL}    {cluster}\n");
    let config = Config::from_yaml(&with(
        "protocol: http2\n    max_concurrent_streams: 100\n    http2_keepalive: { interval: 60s }",
    ))
    .unwrap();
    let cluster = &config.clusters[0];
    assert_eq!(cluster.max_concurrent_streams, Some(100));
    let ping = cluster.http2_keepalive.unwrap();
    // Envoy's defaults: a 20 s timeout (hyper's too), 15% jitter, no idle PING.
    assert_eq!(ping.interval, Some(std::time::Duration::from_secs(60)));
    assert_eq!(ping.timeout, std::time::Duration::from_secs(20));
    assert_eq!(ping.interval_jitter, 15.0);
    assert_eq!(ping.connection_idle_interval, None);
    // Envoy's default: a malformed message from a host closes its connection.
    assert!(!cluster.stream_error_on_invalid_http_message);
    for (cluster, error) in [
        (
            "protocol: http2\n    max_concurrent_streams: 0",
            "clusters[0].max_concurrent_streams",
        ),
        (
            "max_concurrent_streams: 10",
            "an HTTP/2 setting on a cluster of `protocol: http1`",
        ),
        (
            "http2_keepalive: { interval: 1s }",
            "clusters[0].http2_keepalive",
        ),
        (
            "stream_error_on_invalid_http_message: true",
            "clusters[0].stream_error_on_invalid_http_message",
        ),
        (
            "protocol: http2\n    http2_keepalive: { interval_jitter: 150 }",
            "clusters[0].http2_keepalive.interval_jitter",
        ),
        (
            "protocol: http2\n    http2_keepalive: { connection_idle_interval: 10ms }",
            "clusters[0].http2_keepalive.connection_idle_interval",
        ),
    ] {
        let message = error_of(&with(cluster));
        assert!(message.contains(error), "{cluster}: {message}");
    }
}

#[test]
fn slow_start_is_for_round_robin_and_least_request() {
    let with = |cluster: &str| format!("{MINIMAL}    {cluster}\n");
    let config = Config::from_yaml(&with("slow_start: { window: 30s, aggression: 2 }")).unwrap();
    let ramp = config.clusters[0].lb_settings.slow_start.unwrap();
    assert_eq!(ramp.window, std::time::Duration::from_secs(30));
    assert_eq!((ramp.aggression, ramp.min_weight_percent), (2.0, 10.0));
    let random = error_of(&with("lb_policy: random\n    slow_start: { window: 30s }"));
    assert!(random.contains("clusters[0].slow_start"), "{random}");
    let zero = error_of(&with("slow_start: { window: 0s }"));
    assert!(zero.contains("the window is zero"), "{zero}");
}

#[test]
fn an_endpoints_hostname_is_a_host_name() {
    let with = |endpoint: &str| MINIMAL.replace("[127.0.0.1:9000, \"localhost:9001\"]", endpoint);
    let config = Config::from_yaml(&with(
        "[{ address: 127.0.0.1:9000, hostname: api.internal }]",
    ))
    .unwrap();
    assert_eq!(
        config.clusters[0].endpoints[0].hostname.as_deref(),
        Some("api.internal")
    );
    let error = error_of(&with("[{ address: 127.0.0.1:9000, hostname: a b }]"));
    assert!(error.contains("endpoints[0].hostname"), "{error}");
}

#[test]
fn a_tcp_proxy_listener_relays_to_a_known_cluster_and_has_no_http() {
    let relay = |extra: &str| {
        format!(
            "listeners:\n  - name: db\n    address: 127.0.0.1:5432\n    tcp_proxy: {{ cluster: pg{extra} }}\nclusters:\n  - name: pg\n    endpoints: [127.0.0.1:5433]\n"
        )
    };
    let config = Config::from_yaml(&relay("")).unwrap();
    let tcp = config.listeners[0].tcp_proxy.as_ref().unwrap();
    assert_eq!(
        (tcp.cluster, tcp.idle_timeout, tcp.max_connect_attempts),
        (0, Some(Duration::from_secs(3600)), 1),
        "Envoy's defaults"
    );
    let config = Config::from_yaml(&relay(", idle_timeout: 0s")).unwrap();
    assert_eq!(
        config.listeners[0].tcp_proxy.as_ref().unwrap().idle_timeout,
        None
    );
    let err = error_of(&relay("").replace("cluster: pg", "cluster: nowhere"));
    assert!(
        err.starts_with("listeners[0].tcp_proxy.cluster: unknown cluster `nowhere`"),
        "{err}"
    );
    let err = error_of(&relay(", max_connect_attempts: 0"));
    assert!(
        err.contains("max_connect_attempts: expected at least 1"),
        "{err}"
    );
    let with_routes = relay("").replace(
        "    tcp_proxy:",
        "    routes: [{ match: { prefix: / }, cluster: pg }]\n    tcp_proxy:",
    );
    let err = error_of(&with_routes);
    assert!(
        err.starts_with("listeners[0].tcp_proxy: relays bytes, not HTTP"),
        "{err}"
    );
}

#[test]
fn local_reply_mappers_are_checked() {
    let with_replies = |mappers: &str| {
        MINIMAL.replace(
            "    address: 127.0.0.1:8080\n",
            &format!("    address: 127.0.0.1:8080\n    http: {{ local_reply: {{ mappers: [{mappers}] }} }}\n"),
        )
    };
    let config = Config::from_yaml(&with_replies(
        "{ filter: { status_code: { ge: 500 } }, status: 503, body: \"busy\\n\", headers: { set: { retry-after: \"5\" } } }",
    ))
    .expect("valid local_reply");
    let replies = config.listeners[0].http.local_reply.as_ref().unwrap();
    assert_eq!(replies.mappers.len(), 1);
    assert_eq!(
        replies.mappers[0].rewrite.status,
        Some(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(
        replies.mappers[0].rewrite.body.as_deref(),
        Some(&b"busy\n"[..])
    );
    for (mappers, expected) in [
        (
            "{ status: 503 }",
            "local_reply.mappers[0].filter: expected the filter that picks the replies",
        ),
        (
            "{ filter: { status_code: { eq: 404 } }, status: 99 }",
            "local_reply.mappers[0].status: expected a status from 200 to 599, found 99",
        ),
        (
            "{ filter: { status_code: { eq: 404 } }, headers: { remove: [server] } }",
            "local_reply.mappers[0].headers: a reply's headers are set or added",
        ),
        (
            "{ filter: { status_code: { eq: 404 } }, body_format: x }",
            "unknown field `body_format`",
        ),
    ] {
        let err = error_of(&with_replies(mappers));
        assert!(err.contains(expected), "{mappers}: {err}");
    }
}

#[test]
fn custom_response_rules_are_checked() {
    let with_rules = |rules: &str| {
        MINIMAL.replace(
            "    address: 127.0.0.1:8080\n",
            &format!("    address: 127.0.0.1:8080\n    http_filters: [{{ custom_response: {{ rules: [{rules}] }} }}]\n"),
        )
    };
    Config::from_yaml(&with_rules(
        "{ when: { or: [{ status: { prefix: \"5\" } }, { not: { header: { name: x-ok, present: true } } }] }, body: oops }",
    ))
    .expect("valid custom_response");
    for (rules, expected) in [
        (
            "{ body: x }",
            "custom_response.rules[0].when: expected the responses it picks",
        ),
        (
            "{ when: { status: { exact: \"404\" }, header: { name: x, exact: y } } }",
            "custom_response.rules[0].when: expected one of `status`, `header`, `local_reply`, `and`, `or` or `not`",
        ),
        (
            "{ when: { and: [] } }",
            "custom_response.rules[0].when.and: expected at least one match",
        ),
        (
            "{ when: { status: { exact: \"404\" } }, status: 700 }",
            "custom_response.rules[0].status: expected a status from 200 to 599",
        ),
    ] {
        let err = error_of(&with_rules(rules));
        assert!(err.contains(expected), "{rules}: {err}");
    }
}

#[test]
fn a_cluster_named_by_a_request_header_is_looked_up_by_name() {
    let with = |route: &str| {
        MINIMAL.replace(
            "      - match: { prefix: / }\n        cluster: backend\n",
            &format!("      - match: {{ prefix: / }}\n{route}"),
        ) + "  - name: canary\n    endpoints: [127.0.0.1:9002]\n"
    };
    let config = Config::from_yaml(&with(
        "        cluster_header: X-Cluster\n        request_mirror_policies: [{ cluster_header: x-mirror }]\n",
    ))
    .unwrap();
    let routes = &config.listeners[0].route_config;
    let RouteAction::Forward(forward) = &routes.routes[1].action else {
        panic!("a forward");
    };
    assert_eq!(
        forward.cluster,
        ClusterTarget::Header(http::HeaderName::from_static("x-cluster"))
    );
    assert_eq!(
        forward.cluster_not_found_status,
        http::StatusCode::SERVICE_UNAVAILABLE
    );
    let config_404 = Config::from_yaml(&with(
        "        cluster_header: x-cluster\n        cluster_not_found_status: 404\n",
    ))
    .unwrap();
    let dump = serde_yaml::to_string(&config_404.listeners[0].route_config).unwrap();
    assert!(dump.contains("cluster_not_found_status: 404"), "{dump}");
    assert_eq!(routes.cluster_named(b"canary"), Some(1));
    assert_eq!(routes.cluster_named(b"backend"), Some(0));
    assert_eq!(routes.cluster_named(b"nowhere"), None);
    let dump = serde_yaml::to_string(&config.listeners[0].route_config).unwrap();
    assert!(dump.contains("cluster_header: x-cluster"), "{dump}");
    assert!(dump.contains("cluster_header: x-mirror"), "{dump}");

    // A side of a split named by a header, beside one named in the config.
    let config = Config::from_yaml(&with(
        "        weighted_clusters:\n          - { cluster: backend, weight: 1 }\n          - { cluster_header: x-side, weight: 3 }\n",
    ))
    .unwrap();
    let routes = &config.listeners[0].route_config;
    let RouteAction::Forward(forward) = &routes.routes[1].action else {
        panic!("a forward");
    };
    let split = forward.split.as_ref().unwrap();
    assert_eq!(split.clusters[0].target, ClusterTarget::Index(0));
    assert_eq!(
        split.clusters[1].target,
        ClusterTarget::Header(http::HeaderName::from_static("x-side"))
    );
    // Dumped as written: the header on the side, none on the route itself.
    let split_first = Config::from_yaml(&with(
        "        weighted_clusters:\n          - { cluster_header: x-side, weight: 3 }\n          - { cluster: backend, weight: 1 }\n",
    ))
    .unwrap();
    let dump = serde_yaml::to_value(&split_first.listeners[0].route_config).unwrap();
    let route = &dump["routes"][1];
    assert!(route.get("cluster_header").is_none(), "{route:?}");
    assert_eq!(route["weighted_clusters"][0]["cluster_header"], "x-side");
    // Without a header anywhere, no names are kept.
    let plain = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(
        plain.listeners[0].route_config.cluster_named(b"backend"),
        None
    );

    for (route, needle) in [
        (
            "        cluster: backend\n        cluster_header: x-cluster\n",
            "routes[1]: expected one action: `cluster` or `cluster_header`, not both",
        ),
        (
            "        cluster_header: \"bad header\"\n",
            "routes[1].cluster_header: expected a header name, found `bad header`",
        ),
        (
            "        weighted_clusters: [{ cluster: backend, cluster_header: x-side, weight: 1 }]\n",
            "weighted_clusters[0]: expected `cluster` or `cluster_header`, not both",
        ),
        (
            "        cluster_header: \":path\"\n",
            "routes[1].cluster_header: expected a header name, found `:path`",
        ),
        (
            "        cluster_header: x-cluster\n        cluster_not_found_status: 200\n",
            "routes[1].cluster_not_found_status: expected a 4xx or 5xx status, found 200",
        ),
        (
            "        cluster: backend\n        request_mirror_policies: [{ }]\n",
            "request_mirror_policies[0].cluster: unknown cluster ``",
        ),
    ] {
        let error = error_of(&with(route));
        assert!(error.contains(needle), "{needle}: {error}");
    }
}

#[test]
fn internal_redirects_take_envoys_defaults_and_refuse_what_cannot_be_followed() {
    let with = |policy: &str| {
        MINIMAL.replace(
            "        cluster: backend\n",
            &format!("        cluster: backend\n        internal_redirect: {policy}\n"),
        )
    };
    let config = Config::from_yaml(&with("{}")).unwrap();
    let RouteAction::Forward(forward) = &config.listeners[0].route_config.routes[1].action else {
        panic!("a forward");
    };
    let policy = forward.internal_redirect.as_deref().unwrap();
    assert_eq!(policy.max_internal_redirects, 1);
    assert_eq!(policy.redirect_response_codes, [302]);
    assert!(!policy.allow_cross_scheme_redirect && !policy.previous_routes);
    for (policy, needle) in [
        (
            "{ redirect_response_codes: [302, 304] }",
            "internal_redirect.redirect_response_codes: expected 301, 302, 303, 307 or 308, found 304",
        ),
        (
            "{ response_headers_to_copy: [Host] }",
            "internal_redirect.response_headers_to_copy: `Host` may not be copied onto a request",
        ),
        ("{ max: 2 }", "unknown field `max`"),
    ] {
        let error = error_of(&with(policy));
        assert!(error.contains(needle), "{needle}: {error}");
    }
    let direct = MINIMAL.replace(
        "        direct_response: { status: 200, body: \"ok\\n\" }\n",
        "        direct_response: { status: 200, body: \"ok\\n\" }\n        internal_redirect: {}\n",
    );
    assert!(error_of(&direct).contains("apply only to routes with a"));
}

#[test]
fn a_checks_added_headers_are_literal_and_not_its_own_framing() {
    let with = |extra: &str| {
        MINIMAL.replace(
            "    routes:\n",
            &format!(
                "    http_filters:\n      - ext_authz: {{ http: {{ address: 127.0.0.1:9191{extra} }} }}\n    routes:\n"
            ),
        )
    };
    assert!(Config::from_yaml(&with(", headers_to_add: { x-key: s3cret }")).is_ok());
    for (extra, needle) in [
        (
            ", headers_to_add: { Content-Length: \"0\" }",
            "headers_to_add.Content-Length",
        ),
        (
            ", headers_to_add: { x-ip: \"%DOWNSTREAM_REMOTE_ADDRESS%\" }",
            "literal values only",
        ),
    ] {
        let error = error_of(&with(extra));
        assert!(error.contains(needle), "{needle}: {error}");
    }
    // An empty list of a denial's headers for the client is no list: all go.
    let config = Config::from_yaml(&with(", allowed_client_headers: []")).unwrap();
    let Some(HttpFilterConfig::ExtAuthz(authz)) =
        config.listeners[0].http_filters.first().map(|f| &f.config)
    else {
        panic!("ext_authz is the chain's filter");
    };
    let AuthzService::Http { header_lists, .. } = &authz.service else {
        panic!("HTTP mode");
    };
    assert_eq!(header_lists.allowed_client_headers, None);
}

#[test]
fn connect_routes_are_checked() {
    let with = |route: &str, protocol: &str| {
        format!(
            "listeners:\n  - name: public\n    address: 127.0.0.1:8080\n    routes:\n      - {route}\nclusters:\n  - name: backend\n    protocol: {protocol}\n    endpoints: [127.0.0.1:9000]\n"
        )
    };
    let config = Config::from_yaml(&with(
        "{ match: { connect: true }, cluster: backend, connect: terminate }",
        "http1",
    ))
    .unwrap();
    let route = &config.listeners[0].route_config.routes[0];
    assert_eq!(route.matcher.path, PathMatch::Connect);
    match &route.action {
        RouteAction::Forward(f) => assert_eq!(f.connect, Some(ConnectMode::Terminate)),
        other => panic!("expected a forward action, got {other:?}"),
    }
    // Written back as it was read.
    let dumped = serde_json::to_value(&route.matcher).unwrap();
    assert_eq!(dumped["connect"], true);
    // A terminated CONNECT speaks TCP to an HTTP/2 cluster's hosts; a forwarded one cannot.
    Config::from_yaml(&with(
        "{ match: { connect: true }, cluster: backend, connect: terminate }",
        "http2",
    ))
    .unwrap();
    let error = error_of(&with(
        "{ match: { connect: true }, cluster: backend, connect: forward }",
        "http2",
    ));
    assert!(
        error.contains("routes[0].connect") && error.contains("HTTP/2"),
        "{error}"
    );
    let error = error_of(&with(
        "{ match: { connect: true, prefix: / }, cluster: backend }",
        "http1",
    ));
    assert!(
        error.contains("CONNECT requests, which have no path"),
        "{error}"
    );
    let error = error_of(&with(
        "{ match: { prefix: / }, cluster: backend, upgrades: [CONNECT] }",
        "http1",
    ));
    assert!(error.contains("connect: terminate"), "{error}");
    let error = error_of(&with(
        "{ match: { connect: true }, direct_response: { status: 200 }, connect: forward }",
        "http1",
    ));
    assert!(error.contains("`connect`"), "{error}");
}

#[test]
fn a_clusters_hash_policy_is_checked() {
    let with = |cluster: &str| {
        format!(
            "listeners:\n  - name: public\n    address: 127.0.0.1:8080\n    routes:\n      - {{ match: {{ prefix: / }}, cluster: backend }}\nclusters:\n  - name: backend\n    endpoints: [127.0.0.1:9000]\n    {cluster}\n"
        )
    };
    let config = Config::from_yaml(&with(
        "lb_policy: ring_hash\n    hash_policy: [{ header: x-tenant }]",
    ))
    .unwrap();
    let policy = config.clusters[0].hash_policy.as_ref().unwrap();
    assert_eq!(policy.0.len(), 1);
    let error = error_of(&with("hash_policy: [{ header: x-tenant }]"));
    assert!(
        error.contains("clusters[0].hash_policy") && error.contains("`ring_hash` and `maglev`"),
        "{error}"
    );
    let error = error_of(&with(
        "lb_policy: maglev\n    hash_key: { header: x-a }\n    hash_policy: [{ header: x-b }]",
    ));
    assert!(error.contains("keep one"), "{error}");
}

#[test]
fn preconnect_ratios_are_from_1_to_3_and_predictive_needs_a_policy_that_can_tell() {
    let with = |cluster: &str| format!("{MINIMAL}    {cluster}\n");
    let config = Config::from_yaml(&with(
        "preconnect: { per_upstream_ratio: 1.5, predictive_ratio: 2 }",
    ))
    .unwrap();
    assert_eq!(
        config.clusters[0].preconnect,
        Some(Preconnect {
            per_upstream_ratio: 1.5,
            predictive_ratio: 2.0
        })
    );
    // Both at 1: nothing opened ahead.
    let config = Config::from_yaml(&with("preconnect: { per_upstream_ratio: 1 }")).unwrap();
    assert_eq!(config.clusters[0].preconnect, None);
    assert_eq!(
        Config::from_yaml(MINIMAL).unwrap().clusters[0].preconnect,
        None
    );
    for (cluster, error) in [
        (
            "preconnect: { per_upstream_ratio: 0.5 }",
            "clusters[0].preconnect.per_upstream_ratio",
        ),
        (
            "preconnect: { predictive_ratio: 3.5 }",
            "clusters[0].preconnect.predictive_ratio",
        ),
        (
            "lb_policy: least_request\n    preconnect: { predictive_ratio: 2 }",
            "the least_request policy cannot tell its next picks",
        ),
        ("preconnect: { ratio: 2 }", "unknown field `ratio`"),
    ] {
        let message = error_of(&with(cluster));
        assert!(message.contains(error), "{cluster}: {message}");
    }
}
